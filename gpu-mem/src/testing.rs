//! Helpers for GPU tests (feature `testing`, for dev-dependencies): a shared device fixture that
//! skips with a printed reason when there is no GPU, or fails where `ROCMFORGE_REQUIRE_GPU=1`
//! (by `hip-ffi`'s one rule, re-exported here), and a leak check.

use std::sync::OnceLock;

use crate::device::Device;

pub use hip_ffi::testing::{
    gpu_required, gpus_required, need_gpus, or_skip, skip, REQUIRE_GPUS_VAR, REQUIRE_GPU_VAR,
};

static FIXTURE: OnceLock<std::result::Result<Device, String>> = OnceLock::new();

/// The shared test device, or `None` after printing `skipped: <reason>`.
///
/// # Panics
/// When no GPU is usable and `ROCMFORGE_REQUIRE_GPU=1`: a required GPU that is missing is a
/// failure, not a skip.
#[track_caller]
pub fn gpu_or_skip() -> Option<Device> {
    let r = FIXTURE.get_or_init(|| Device::open(0).map_err(|e| e.to_string()));
    match r {
        Ok(d) => Some(d.clone()),
        Err(why) => skip(format_args!("no GPU ({why})")),
    }
}

/// The first `n` devices (the shared fixture as device 0), or `None` after printing why the
/// test skips: no GPU (by [`skip`]'s rule) or fewer than `n` (by [`need_gpus`]'s).
#[track_caller]
pub fn gpus_or_skip(n: usize) -> Option<Vec<Device>> {
    let first = gpu_or_skip()?;
    let have = match crate::device::devices() {
        Ok(list) => list.len(),
        Err(e) => return skip(format_args!("no GPU list ({e})")),
    };
    need_gpus(have, n)?;
    let mut out = vec![first];
    for i in 1..n {
        match Device::open(i as i32) {
            Ok(d) => out.push(d),
            Err(e) => return skip(format_args!("GPU {i} does not open ({e})")),
        }
    }
    Some(out)
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
