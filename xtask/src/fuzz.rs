//! `cargo xtask fuzz [SECONDS]`: runs every cargo-fuzz target for a bounded time each (the gguf
//! reader; above it, model configuration from mutated metadata and the tokenizers), installing
//! cargo-fuzz first when it is missing; `cargo xtask fuzz --runs N` runs a campaign of N
//! executions per target, one target at a time, and reports libFuzzer's counts. Stable toolchains run them through `RUSTC_BOOTSTRAP=1`
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
                // Found by a campaign: an extra token spelled like a byte token.
                (
                    "spm-byte-text",
                    b"\x02<0x6C>\n\x00]bt\x00Hello \xff\xff\xbbAwheo   t ".to_vec(),
                ),
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

/// What `cargo xtask fuzz` was asked for.
pub enum Mode {
    /// Each target for this many seconds (CI).
    Seconds(u64),
    /// A campaign: each named target (all when empty) in turn until libFuzzer has made this many
    /// executions, built with `sanitizer`.
    Runs {
        /// Executions per target.
        runs: u64,
        /// cargo-fuzz's `--sanitizer` (address, none, ...).
        sanitizer: String,
        /// Targets to run; empty: all.
        targets: Vec<String>,
    },
}

/// Parses the arguments of `cargo xtask fuzz`: `[SECONDS]` or
/// `--runs N [--sanitizer S] [TARGET...]`.
pub fn parse_args(rest: &[String]) -> Result<Mode> {
    let number = |flag: &str, s: Option<&String>| -> Result<u64> {
        let s = s.ok_or_else(|| format!("fuzz: {flag} needs a number"))?;
        s.parse()
            .map_err(|_| format!("fuzz: {flag} must be a number, got `{s}`"))
    };
    if rest.first().map(String::as_str) != Some("--runs") {
        return match rest {
            [] => Ok(Mode::Seconds(CI_SECONDS)),
            [s] => number("SECONDS", Some(s)).map(Mode::Seconds),
            _ => Err(format!(
                "fuzz: unexpected arguments {rest:?}\n{CAMPAIGN_USAGE}"
            )),
        };
    }
    let runs = number("--runs", rest.get(1))?;
    if runs == 0 {
        return Err("fuzz: --runs must be at least 1".into());
    }
    let mut sanitizer = "address".to_owned();
    let mut targets = Vec::new();
    let mut it = rest[2..].iter();
    while let Some(a) = it.next() {
        if a == "--sanitizer" {
            sanitizer = it
                .next()
                .ok_or_else(|| "fuzz: --sanitizer needs a value".to_owned())?
                .clone();
        } else if TARGETS.iter().any(|t| t.name == a.as_str()) {
            targets.push(a.clone());
        } else {
            return Err(format!("fuzz: unknown target `{a}`\n{CAMPAIGN_USAGE}"));
        }
    }
    Ok(Mode::Runs {
        runs,
        sanitizer,
        targets,
    })
}

const CAMPAIGN_USAGE: &str = "usage: cargo xtask fuzz [SECONDS]
       cargo xtask fuzz --runs N [--sanitizer address|none] [reader|model_config|tokenizer ...]";

/// One cargo-fuzz target.
struct Target {
    dir: &'static str,
    name: &'static str,
    corpus: &'static str,
    extra: &'static [&'static str],
}

/// Inputs of the targets above the reader are sequences of edits: let them be long from the
/// start.
const EDIT_ARGS: &[&str] = &["-max_len=256", "-len_control=0"];

const TARGETS: [Target; 3] = [
    Target {
        dir: FUZZ_DIR,
        name: "reader",
        corpus: CORPUS,
        extra: &[],
    },
    Target {
        dir: MODEL_FUZZ_DIR,
        name: "model_config",
        corpus: "model/fuzz/corpus/model_config",
        extra: EDIT_ARGS,
    },
    Target {
        dir: MODEL_FUZZ_DIR,
        name: "tokenizer",
        corpus: "model/fuzz/corpus/tokenizer",
        extra: EDIT_ARGS,
    },
];

/// Runs what `cargo xtask fuzz` was asked for.
pub fn run(mode: Mode) -> Result<()> {
    // The reader's seeds are built by a workspace example: only when the reader runs, so that
    // a campaign of the other targets takes no lock on the workspace's build directory.
    let reader = match &mode {
        Mode::Seconds(_) => true,
        Mode::Runs { targets, .. } => targets.is_empty() || targets.iter().any(|t| t == "reader"),
    };
    prepare(reader)?;
    match mode {
        Mode::Seconds(seconds) => {
            for t in &TARGETS {
                let limit = format!("-max_total_time={seconds}");
                fuzz(t, "address", &limit).map(drop)?;
            }
            Ok(())
        }
        Mode::Runs {
            runs,
            sanitizer,
            targets,
        } => {
            let chosen = TARGETS
                .iter()
                .filter(|t| targets.is_empty() || targets.iter().any(|n| n == t.name));
            let mut summary = Vec::new();
            for t in chosen {
                let started = std::time::Instant::now();
                let r = fuzz(t, &sanitizer, &format!("-runs={runs}"));
                let line = match &r {
                    Ok(done) => format!(
                        "{}: {} executions in {} s (libFuzzer's count), no crash",
                        t.name, done.runs, done.seconds
                    ),
                    Err(e) => format!("{}: FAILED after {:?}: {e}", t.name, started.elapsed()),
                };
                eprintln!("fuzz campaign: {line}");
                summary.push(line);
                if r.is_err() {
                    break;
                }
            }
            eprintln!("fuzz campaign summary (sanitizer {sanitizer}, --runs {runs}):");
            for l in &summary {
                eprintln!("  {l}");
            }
            if summary.iter().any(|l| l.contains("FAILED")) {
                Err("a fuzz target failed (see above)".into())
            } else {
                Ok(())
            }
        }
    }
}

/// Installs cargo-fuzz when missing and writes the targets' seeds (the reader's with
/// `reader`).
fn prepare(reader: bool) -> Result<()> {
    if !cargo_fuzz_installed() {
        // About a minute of compilation on a 2-core machine.
        run_cmd(cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    if reader {
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
    }
    let root = crate::workspace_root();
    for (target, seeds) in model_seeds() {
        let dir = root.join(format!("{MODEL_FUZZ_DIR}/corpus/{target}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (name, bytes) in seeds {
            let p = dir.join(format!("seed-{name}"));
            std::fs::write(&p, bytes).map_err(|e| format!("{}: {e}", p.display()))?;
        }
    }
    Ok(())
}

/// libFuzzer's own account of a finished run.
struct Done {
    runs: u64,
    seconds: u64,
}

/// libFuzzer's closing line, `Done 123 runs in 4 second(s)`.
fn parse_done(line: &str) -> Option<Done> {
    let rest = line.trim().strip_prefix("Done ")?;
    let (runs, rest) = rest.split_once(" runs in ")?;
    let (seconds, _) = rest.split_once(' ')?;
    Some(Done {
        runs: runs.parse().ok()?,
        seconds: seconds.parse().ok()?,
    })
}

/// Runs one target with debug assertions (overflow checks) on until `limit` (a libFuzzer
/// `-max_total_time=` or `-runs=` flag), passing its output through; a crash fails.
fn fuzz(t: &Target, sanitizer: &str, limit: &str) -> Result<Done> {
    use std::io::BufRead as _;

    let mut cmd: Command = cargo();
    cmd.args([
        "fuzz",
        "run",
        "--debug-assertions",
        "--sanitizer",
        sanitizer,
        "--fuzz-dir",
        t.dir,
    ]);
    if sanitizer != "address" {
        // Beside CI's AddressSanitizer build, not over it.
        cmd.arg("--target-dir").arg(format!(
            "target/fuzz-{sanitizer}-{}",
            t.dir.replace('/', "-")
        ));
    }
    cmd.args([t.name, t.corpus, "--"])
        .arg(limit)
        .args(t.extra)
        .env("RUSTC_BOOTSTRAP", "1");
    eprintln!("+ {}", crate::describe(&cmd));
    let mut child = cmd
        .current_dir(crate::workspace_root())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start cargo fuzz: {e}"))?;
    let mut done = None;
    if let Some(err) = child.stderr.take() {
        for line in std::io::BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            eprintln!("{line}");
            done = parse_done(&line).or(done);
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo fuzz: {e}"))?;
    match done {
        Some(d) if status.success() => Ok(d),
        _ => Err(format!("`cargo fuzz run {}` failed with {status}", t.name)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Result<Mode> {
        parse_args(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn libfuzzer_done_lines_are_read() {
        let d = parse_done("Done 10000000 runs in 3021 second(s)").expect("done line");
        assert_eq!((d.runs, d.seconds), (10_000_000, 3021));
        assert!(parse_done("#1000\tpulse  cov: 12 ft: 3 corp: 1/1b exec/s: 9").is_none());
    }

    #[test]
    fn campaign_arguments() {
        assert!(matches!(args(&[]), Ok(Mode::Seconds(CI_SECONDS))));
        assert!(matches!(args(&["5"]), Ok(Mode::Seconds(5))));
        match args(&["--runs", "100", "--sanitizer", "none", "tokenizer"]) {
            Ok(Mode::Runs {
                runs,
                sanitizer,
                targets,
            }) => {
                assert_eq!((runs, sanitizer.as_str()), (100, "none"));
                assert_eq!(targets, ["tokenizer"]);
            }
            _ => panic!("not a campaign"),
        }
        assert!(args(&["--runs", "0"]).is_err());
        assert!(args(&["--runs", "10", "nosuch"]).is_err());
        assert!(args(&["x"]).is_err());
    }
}
