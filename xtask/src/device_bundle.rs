//! `cargo xtask device-bundle`: builds the GPU crates' test and benchmark executables in release
//! mode and copies them, with a runner script, into the git-ignored `.device/` folder that the GPU
//! machine receives (it has no Rust toolchain).
//!
//! The executables embed the NVIDIA code objects only ([`device_kernels_dir`]): the GPU machines
//! are NVIDIA, and the AMD objects of fourteen targets would double what travels.
//!
//! The bundle also holds the model's whole-model GPU tests (`model/tests/gpu_model.rs`), its
//! two-GPU tests (`model/tests/multi_gpu.rs`) and the release `rocmforge` binary.
//!
//! On a machine with two or more GPUs the script also sets `ROCMFORGE_REQUIRE_GPUS=2` (the
//! two-GPU tests must run there, not skip) and runs `rocmforge` split over the GPUs by layer.
//! `NCCL_NVLS_ENABLE=0` is always set (NVLink multicast is forbidden on those machines).
//!
//! On the GPU machine run `bash .device/run.sh` from the repository root: every test binary runs
//! serially with `ROCMFORGE_REQUIRE_GPU=1`, which turns each "skipped: no GPU" into a failure, then
//! the transfer benchmarks run, then `rocmforge` writes a synthetic Gemma-3-270M-shaped model and
//! generates and benchmarks on the GPU (whole and half offload) and the CPU.
//! `ROCMFORGE_TEST_MODEL` (a model file on that machine) adds the real-model GPU test.

use std::fs;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::layers::package_name;
use crate::{workspace_root, Result};

/// Crates (directories; [`package_name`] gives each one's package) whose tests and benchmarks
/// need the GPU.
const CRATES: &[&str] = &["hip-ffi", "gpu-mem"];
/// GPU test executables of crates whose other tests do not need a GPU: `(crate, cargo target
/// arguments)`. The whole-model GPU tests, the kernels' GPU tests (not their unit tests, which
/// check the sources in the checkout and run in CI) and the HIP backend's op-by-op checks against
/// the CPU (unit tests behind ggml-graph's `hip`).
const GPU_TEST_TARGETS: &[(&str, &[&str])] = &[
    ("model", &["--test", "gpu_model", "--test", "multi_gpu"]),
    ("kernels", &["--test", "gpu_ops", "--test", "gpu_quant"]),
    ("ggml-graph", &["--lib", "--features", "hip"]),
];

/// `cargo xtask device-bundle [--model PATH]`.
pub fn run(args: &[String]) -> Result<()> {
    let model = match args {
        [] => std::env::var_os("ROCMFORGE_TEST_MODEL").map(PathBuf::from),
        [flag, path] if flag == "--model" => Some(PathBuf::from(path)),
        _ => return Err("usage: cargo xtask device-bundle [--model PATH]".into()),
    };
    let root = workspace_root();
    let out = root.join(".device");
    let bin_dir = out.join("bin");
    if bin_dir.exists() {
        fs::remove_dir_all(&bin_dir).map_err(|e| format!("{}: {e}", bin_dir.display()))?;
    }
    fs::create_dir_all(&bin_dir).map_err(|e| format!("{}: {e}", bin_dir.display()))?;

    prepare_device_kernels()?;
    let mut tests = Vec::new();
    for (what, sub) in [("test", "test"), ("bench", "bench")] {
        let mut cmd = cargo();
        cmd.args([sub, "--no-run", "--message-format=json"]);
        if sub == "test" {
            // `cargo bench` is optimised already (bench profile) and refuses `--release`.
            cmd.arg("--release");
        }
        for c in CRATES {
            cmd.args(["-p", &package_name(c)]);
        }
        for exe in built_executables(&mut cmd, what)? {
            let name = exe
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| format!("odd executable path {}", exe.display()))?;
            tests.push(copy_exe(&exe, &bin_dir.join(format!("{what}-{name}")))?);
        }
    }
    for (krate, extra) in GPU_TEST_TARGETS {
        let mut cmd = cargo();
        cmd.args([
            "test",
            "--no-run",
            "--release",
            "--message-format=json",
            "-p",
            &package_name(krate),
        ]);
        cmd.args(*extra);
        for exe in built_executables(&mut cmd, "test")? {
            let name = exe
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .ok_or_else(|| format!("odd executable path {}", exe.display()))?;
            tests.push(copy_exe(
                &exe,
                &bin_dir.join(format!("test-{krate}-{name}")),
            )?);
        }
    }
    let mut cmd = cargo();
    cmd.args([
        "build",
        "--release",
        "--message-format=json",
        "-p",
        "rocmforge-server",
        "--bin",
        "rocmforge",
    ]);
    for exe in built_executables(&mut cmd, "bin")? {
        tests.push(copy_exe(&exe, &bin_dir.join("rocmforge"))?);
    }
    if let Some(model) = model {
        let table = out.join("model-tensors.tsv");
        write_tensor_table(&model, &table)?;
        println!(
            "device-bundle: tensor table of {} -> {}",
            model.display(),
            table.display()
        );
    }
    let script = out.join("run.sh");
    fs::write(&script, RUN_SCRIPT).map_err(|e| format!("{}: {e}", script.display()))?;
    let total: u64 = tests
        .iter()
        .filter_map(|p| fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    println!(
        "device-bundle: {} executables ({:.1} MiB as carried) in {}; on the GPU machine run `bash .device/run.sh`",
        tests.len(),
        total as f64 / (1 << 20) as f64,
        out.display()
    );
    Ok(())
}

/// Copies an executable into the bundle without its debug sections when `strip` is there (the
/// GPU machine takes 64 MiB per call; line tables triple the size), then compresses it with `xz`
/// when that is there (a third of the size again, so the whole bundle travels in one call); the
/// runner script unpacks `*.xz` on the GPU machine. Returns the file written.
fn copy_exe(exe: &Path, dst: &Path) -> Result<PathBuf> {
    let stripped = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(dst)
        .arg(exe)
        .status()
        .is_ok_and(|s| s.success());
    if !stripped {
        fs::copy(exe, dst).map_err(|e| format!("{} -> {}: {e}", exe.display(), dst.display()))?;
    }
    let compressed = Command::new("xz")
        .args(["-6", "-T0", "-f"])
        .arg(dst)
        .status()
        .is_ok_and(|s| s.success());
    let mut xz = dst.as_os_str().to_owned();
    xz.push(".xz");
    let xz = PathBuf::from(xz);
    Ok(if compressed && xz.exists() {
        xz
    } else {
        dst.to_path_buf()
    })
}

fn cargo() -> Command {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.env("ROCMFORGE_KERNELS_DIR", device_kernels_dir());
    cmd
}

/// `target/device-kernels`: what `cargo xtask kernels` wrote, less the AMD code objects, which
/// the GPU machines (NVIDIA) never load and which would double the carried executables' size.
fn device_kernels_dir() -> PathBuf {
    workspace_root().join("target/device-kernels")
}

/// Fills [`device_kernels_dir`] from the kernel output folder (an empty manifest when none was
/// built, so the executables say "kernels not built" as they would have).
fn prepare_device_kernels() -> Result<()> {
    let src = crate::kernels::out_dir();
    let dst = device_kernels_dir();
    if dst.exists() {
        fs::remove_dir_all(&dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    }
    fs::create_dir_all(&dst).map_err(|e| format!("{}: {e}", dst.display()))?;
    let manifest = fs::read_to_string(src.join("manifest.txt")).unwrap_or_default();
    let mut kept = String::new();
    for line in manifest.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            [_, "amd", _, _] => continue,
            [_, _, _, file] => {
                fs::copy(src.join(file), dst.join(file))
                    .map_err(|e| format!("{}: {e}", src.join(file).display()))?;
            }
            _ => {}
        }
        kept.push_str(line);
        kept.push('\n');
    }
    let m = dst.join("manifest.txt");
    fs::write(&m, kept).map_err(|e| format!("{}: {e}", m.display()))
}

/// Runs a `cargo ... --message-format=json` build and returns the executables it produced
/// (for `bench`, only benchmark targets: the library's bench harness has nothing to run).
fn built_executables(cmd: &mut Command, what: &str) -> Result<Vec<PathBuf>> {
    let mut child = cmd
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("could not start cargo: {e}"))?;
    let stdout = child.stdout.take().ok_or("cargo gave no stdout")?;
    let mut exes = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.map_err(|e| format!("reading cargo output: {e}"))?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        let is_bench = msg["target"]["kind"]
            .as_array()
            .is_some_and(|k| k.iter().any(|x| x == "bench"));
        // `cargo test --test X` also builds the package's binaries for the test to run.
        let is_test_harness = msg["profile"]["test"] == true;
        if msg["reason"] == "compiler-artifact"
            && (what != "bench" || is_bench)
            && (what != "test" || is_test_harness)
        {
            if let Some(exe) = msg["executable"].as_str() {
                exes.push(PathBuf::from(exe));
            }
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build of the GPU tests failed with {status}"));
    }
    Ok(exes)
}

/// Writes `name<TAB>ggml type<TAB>byte size` per tensor of a GGUF (read with the Python `gguf`
/// oracle, so xtask needs no GGUF parser), for GPU tests that upload the real tensor table with
/// synthesized contents where the 253 MB model cannot travel.
fn write_tensor_table(model: &Path, out: &Path) -> Result<()> {
    // A string continuation (`\` at line end) would eat the loop body's indentation.
    const SCRIPT: &str = r#"
import sys, gguf
r = gguf.GGUFReader(sys.argv[1])
for t in r.tensors:
    print(f"{t.name}\t{t.tensor_type.name}\t{int(t.n_bytes)}")
"#;
    let o = Command::new("python3")
        .arg("-c")
        .arg(SCRIPT)
        .arg(model)
        .output()
        .map_err(|e| format!("could not start python3: {e}"))?;
    if !o.status.success() {
        return Err(format!(
            "reading the tensor table of {} failed: {}",
            model.display(),
            String::from_utf8_lossy(&o.stderr)
        ));
    }
    fs::write(out, &o.stdout).map_err(|e| format!("{}: {e}", out.display()))
}

const RUN_SCRIPT: &str = r#"#!/usr/bin/env bash
# Runs every GPU test and benchmark of the bundle; made by `cargo xtask device-bundle`.
set -u
cd "$(dirname "$0")/.."
# The executables travel xz-compressed; unpacked next to the carried tree, which may be read-only.
bin=${TMPDIR:-/tmp}/rocmforge-bundle
rm -rf "$bin" && mkdir -p "$bin"
for f in .device/bin/*; do
  case "$f" in
    *.xz) xz -dc "$f" > "$bin/$(basename "${f%.xz}")" ;;
    *) cp "$f" "$bin/" ;;
  esac
done
chmod +x "$bin"/*
export ROCMFORGE_REQUIRE_GPU=1
export RUST_BACKTRACE=1
# NVLink multicast is forbidden on the multi-GPU machines; NCCL reads this in every process.
export NCCL_NVLS_ENABLE=0
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "${ngpu:-0}" -ge 2 ]; then
  export ROCMFORGE_REQUIRE_GPUS=2
fi
if [ -f .device/model-tensors.tsv ]; then
  export ROCMFORGE_TENSOR_TABLE="$PWD/.device/model-tensors.tsv"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.max,pcie.link.width.max --format=csv 2>/dev/null
fail=0
for t in "$bin"/test-*; do
  echo "=== $t"
  if ! "$t" --test-threads=1; then
    echo "FAILED: $t"
    fail=1
  fi
done
# ROCMFORGE_MEMCHECK=1: every test binary again under compute-sanitizer's memcheck (NVIDIA).
# Driver calls that fail are not counted: some tests provoke refusals on purpose (a grid too large
# for a cooperative launch, a missing symbol, too much shared memory) and check the typed error,
# and the sanitizer refuses batched stream memory operations, which the code then replaces.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "${ROCMFORGE_MEMCHECK:-0}" = 1 ]; then
  if [ -x "$sanitizer" ]; then
    for t in "$bin"/test-*; do
      echo "=== memcheck $t"
      "$sanitizer" --tool memcheck --report-api-errors no --error-exitcode 3 "$t" --test-threads=1 -q \
        || { echo "FAILED: memcheck $t"; fail=1; }
    done
  else
    echo "ROCMFORGE_MEMCHECK=1 but compute-sanitizer was not found"
    fail=1
  fi
fi
for b in "$bin"/bench-*; do
  echo "=== $b"
  "$b" --bench || fail=1
done
# Whole-model runs: a synthetic Gemma-3-270M-shaped model (Q4_K_M mix, byte-level vocabulary).
rf=$bin/rocmforge
if [ -x "$rf" ]; then
  m=${TMPDIR:-/tmp}/rocmforge-synth-gemma3-270m.gguf
  [ -f "$m" ] || "$rf" synth --arch gemma3 --preset gemma3-270m --out "$m" || fail=1
  echo "=== rocmforge generate (GPU)"
  "$rf" generate -m "$m" --device gpu -p "hello" -n 32 --temp 0 --stats || fail=1
  echo "=== rocmforge generate (auto under a 650 MiB GPU cap, about 595 MiB of it the runtime context: a partial offload)"
  "$rf" generate -m "$m" --gpu-mem-limit 650M -p "hello" -n 16 --temp 0 || fail=1
  for dev in "--device gpu" "--device gpu -ngl 9" "--device cpu"; do
    echo "=== rocmforge bench $dev"
    "$rf" bench -m "$m" $dev -p 512 -n 128 -r 3 --bandwidth || fail=1
  done
  if [ "${ngpu:-0}" -ge 2 ]; then
    echo "=== rocmforge devices (peer access, collectives)"
    "$rf" devices || fail=1
    for split in "--split-mode layer" "--devices 0,1 --tensor-split 3,1 --main-gpu 0" "--split-mode layer -ngl 9"; do
      echo "=== rocmforge generate $split"
      "$rf" generate -m "$m" --device gpu $split -p "hello" -n 32 --temp 0 --stats || fail=1
      echo "=== rocmforge bench $split"
      "$rf" bench -m "$m" --device gpu $split -p 512 -n 128 -r 3 || fail=1
    done
    for split in "--split-mode none" "--split-mode layer"; do
      echo "=== rocmforge perplexity $split"
      "$rf" perplexity -m "$m" --device gpu $split -f README.md --chunks 4 -c 256 || fail=1
    done
  fi
fi
echo "device run: $([ $fail = 0 ] && echo ALL PASSED || echo FAILURES)"
exit $fail
"#;
