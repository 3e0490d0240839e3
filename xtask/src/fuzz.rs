//! `cargo xtask fuzz [SECONDS]`: runs the gguf reader's cargo-fuzz target for a bounded time,
//! installing cargo-fuzz first when it is missing. Stable toolchains run it through
//! `RUSTC_BOOTSTRAP=1` (cargo-fuzz passes nightly-only sanitizer flags).

use std::process::Command;

use crate::{cargo, run_cmd, Result};

/// How long `cargo xtask test` fuzzes the reader.
pub const CI_SECONDS: u64 = 60;

const FUZZ_DIR: &str = "gguf/fuzz";
const CORPUS: &str = "gguf/fuzz/corpus/reader";

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

/// Seeds the corpus with small valid files and fuzzes the reader for `seconds`; a crash fails.
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
                "gguf",
                "--example",
                "make-fuzz-seeds",
            ])
            .arg(CORPUS),
    )?;
    let mut cmd: Command = cargo();
    cmd.args([
        "fuzz",
        "run",
        "--fuzz-dir",
        FUZZ_DIR,
        "reader",
        CORPUS,
        "--",
    ])
    .arg(format!("-max_total_time={seconds}"))
    .env("RUSTC_BOOTSTRAP", "1");
    run_cmd(&mut cmd)
}
