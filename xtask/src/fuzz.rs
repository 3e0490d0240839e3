//! `cargo xtask fuzz [SECONDS]`: runs every cargo-fuzz target for a bounded time each (the gguf
//! reader; above it, model configuration from mutated metadata and the tokenizers), installing
//! cargo-fuzz first when it is missing. Stable toolchains run them through `RUSTC_BOOTSTRAP=1`
//! (cargo-fuzz passes nightly-only sanitizer flags).

use std::process::Command;

use crate::{cargo, run_cmd, Result};

/// How long `cargo xtask test` fuzzes each target.
pub const CI_SECONDS: u64 = 60;

const FUZZ_DIR: &str = "gguf/fuzz";
const CORPUS: &str = "gguf/fuzz/corpus/reader";
const MODEL_FUZZ_DIR: &str = "model/fuzz";

/// One edit of the model target's input.
fn edit(op: u8, sel: u8, v: u64) -> Vec<u8> {
    [&[op, sel][..], &v.to_le_bytes()].concat()
}

/// A named seed input.
type Seed = (&'static str, Vec<u8>);

/// Seeds of the targets above the reader: `(target, [(file name, bytes)])`. The model target's
/// first byte picks llama, qwen2 or gemma3 unchanged (0..3: micro Q8_0 shapes, 3..6: Q4_K_M);
/// the tokenizer's picks SPM or BPE.
fn model_seeds() -> [(&'static str, Vec<Seed>); 2] {
    [
        (
            "model_config",
            vec![
                ("llama", vec![0]),
                ("qwen2", vec![1]),
                ("gemma3", vec![2]),
                ("llama-q4k", vec![3]),
                ("qwen2-q4k", vec![4]),
                ("gemma3-q4k", vec![5]),
                // The model's trained context (`-c 0`) of 2^24 positions: planned, not run.
                (
                    "llama-ctx0",
                    [&[0u8][..], &edit(0x80, 1, 1 << 24), &edit(8, 0, 0)].concat(),
                ),
                // Edits are 10 bytes: op, selector, u64 value (see the target).
                (
                    "gemma3-edits",
                    [&[2u8][..], &edit(8, 0, 16), &edit(1, 0, 0x7fc0_0000)].concat(),
                ),
                (
                    "llama-dims",
                    [&[0u8][..], &edit(3, 5, 64 << 8), &edit(0, 0, 3)].concat(),
                ),
                (
                    "qwen2-keys",
                    [&[1u8][..], &edit(0, 1, 1 << 20), &edit(6, 0, 2)].concat(),
                ),
            ],
        ),
        (
            "tokenizer",
            vec![
                (
                    "spm",
                    b"\x00Hello world, the in  er\n\xc3\xa9 \xe6\x97\xa5".to_vec(),
                ),
                (
                    "bpe",
                    b"\x01Hello world, the in  er\n\n<|endoftext|>".to_vec(),
                ),
                ("spm-extra", b"\x02ab\nthe\n\x00abthe the".to_vec()),
            ],
        ),
    ]
}

fn cargo_fuzz_installed() -> bool {
    cargo()
        .args(["fuzz", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// Parses the optional SECONDS argument of `cargo xtask fuzz`.
pub fn seconds_arg(rest: &[String]) -> Result<u64> {
    match rest.first() {
        None => Ok(CI_SECONDS),
        Some(s) => s
            .parse()
            .map_err(|_| format!("fuzz: SECONDS must be a number, got `{s}`")),
    }
}

/// Seeds the corpora and fuzzes each target for `seconds`; a crash fails.
pub fn run(seconds: u64) -> Result<()> {
    if !cargo_fuzz_installed() {
        // About a minute of compilation on a 2-core machine.
        run_cmd(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    run_cmd(
        cargo()
            .args([
                "run",
                "-q",
                "--profile",
                "ci",
                "-p",
                "rocmforge-gguf",
                "--example",
                "make-fuzz-seeds",
            ])
            .arg(CORPUS),
    )?;
    fuzz(FUZZ_DIR, "reader", CORPUS, seconds, &[])?;
    let root = crate::workspace_root();
    for (target, seeds) in model_seeds() {
        let corpus = format!("{MODEL_FUZZ_DIR}/corpus/{target}");
        let dir = root.join(&corpus);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (name, bytes) in seeds {
            let p = dir.join(format!("seed-{name}"));
            std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))?;
        }
        // Inputs are sequences of edits: let them be long from the start.
        fuzz(
            MODEL_FUZZ_DIR,
            target,
            &corpus,
            seconds,
            &["-max_len=256", "-len_control=0"],
        )?;
    }
    Ok(())
}

/// Runs one target for `seconds` with debug assertions (overflow checks) on.
fn fuzz(dir: &str, target: &str, corpus: &str, seconds: u64, extra: &[&str]) -> Result<()> {
    let mut cmd: Command = cargo();
    cmd.args([
        "fuzz",
        "run",
        "--debug-assertions",
        "--fuzz-dir",
        dir,
        target,
        corpus,
        "--",
    ])
    .arg(format!("-max_total_time={seconds}"))
    .args(extra)
    .env("RUSTC_BOOTSTRAP", "1");
    run_cmd(&mut cmd)
}
