//! Helpers for GPU tests: a shared device fixture that skips with a printed reason when there is
//! no GPU (or fails when `ROCMFORGE_REQUIRE_GPU=1`, as on the GPU machine), and a leak check.

use std::sync::OnceLock;

use crate::device::Device;

/// Set to `1` where a GPU must be present: a missing GPU then fails the test instead of skipping.
pub const REQUIRE_GPU_VAR: &str = "ROCMFORGE_REQUIRE_GPU";

static FIXTURE: OnceLock<std::result::Result<Device, String>> = OnceLock::new();

/// The shared test device, or `None` after printing `skipped: <reason>`.
///
/// # Panics
/// When no GPU is usable and `ROCMFORGE_REQUIRE_GPU=1`: a required GPU that is missing is a
/// failure, not a skip.
pub fn gpu_or_skip() -> Option<Device> {
    let r = FIXTURE.get_or_init(|| Device::open(0).map_err(|e| e.to_string()));
    match r {
        Ok(d) => Some(d.clone()),
        Err(why) => {
            let required = std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| v == "1");
            assert!(!required, "{REQUIRE_GPU_VAR}=1 but no GPU is usable: {why}");
            println!("skipped: no GPU ({why})");
            None
        }
    }
}

/// Free memory may drift by this much across a test (driver-internal caches, BLAS workspaces).
pub const LEAK_TOLERANCE_BYTES: u64 = 64 << 20;

/// Runs `test` on the shared device, then checks that every tracked allocation it made is gone,
/// the device's free memory is back within [`LEAK_TOLERANCE_BYTES`], and no `Drop` recorded an
/// error. Prints `skipped: <reason>` and returns `false` without a GPU.
///
/// # Panics
/// On a leak, a recorded error, or a failure inside `test`.
pub fn with_gpu(test: impl FnOnce(&Device)) -> bool {
    let Some(dev) = gpu_or_skip() else {
        return false;
    };
    let live_before = dev.tracker().live_count();
    let (free_before, _) = dev.mem_info().expect("memory info before the test");
    test(&dev);
    let report = dev.leak_report();
    assert_eq!(
        report.entries.len(),
        live_before,
        "tracked allocations leaked: {report}"
    );
    let (free_after, _) = dev.mem_info().expect("memory info after the test");
    assert!(
        free_after + LEAK_TOLERANCE_BYTES >= free_before,
        "device free memory fell from {free_before} to {free_after} bytes"
    );
    let errors = dev.take_errors();
    assert!(errors.is_empty(), "errors recorded in Drop: {errors:?}");
    true
}

/// A model's tensor table, `(name, bytes)` per tensor, for upload tests and benchmarks: from the
/// GGUF at `ROCMFORGE_TEST_MODEL`, else from the TSV at `ROCMFORGE_TENSOR_TABLE` (written by
/// `cargo xtask device-bundle` where the model cannot travel). `Err` says why there is none.
pub fn tensor_table() -> std::result::Result<(String, Vec<(String, u64)>), String> {
    if let Ok(path) = std::env::var("ROCMFORGE_TEST_MODEL") {
        let file = gguf::GgufFile::open(&path).map_err(|e| format!("{path}: {e}"))?;
        let t = file
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), t.size))
            .collect();
        return Ok((path, t));
    }
    let path = std::env::var("ROCMFORGE_TENSOR_TABLE")
        .map_err(|_| "neither ROCMFORGE_TEST_MODEL nor ROCMFORGE_TENSOR_TABLE is set".to_owned())?;
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    let mut v = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let cols: Vec<&str> = line.split('\t').collect();
        let [name, _ty, bytes] = cols[..] else {
            return Err(format!("{path}:{}: expected name, type, bytes", i + 1));
        };
        let bytes = bytes
            .trim()
            .parse::<u64>()
            .map_err(|e| format!("{path}:{}: {e}", i + 1))?;
        v.push((name.to_owned(), bytes));
    }
    Ok((path, v))
}

/// Deterministic stand-in contents for tensor `index` (distinct per tensor and offset).
pub fn synthetic_tensor(index: usize, bytes: u64) -> Vec<u8> {
    let seed = (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (0..bytes)
        .map(|i| ((i.wrapping_mul(31) ^ seed ^ (i >> 8)) & 0xff) as u8)
        .collect()
}
