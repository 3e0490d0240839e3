//! The one rule for GPU tests that find no GPU, shared by every crate's tests (feature
//! `testing`, not part of the normal API): print `skipped: <reason>` and return, unless
//! `ROCMFORGE_REQUIRE_GPU=1` (set by the GPU machine's runner) makes a missing GPU a failure.

use std::fmt::Display;

/// Set to `1` where a GPU must be present: a test that would skip for want of one fails instead.
pub const REQUIRE_GPU_VAR: &str = "ROCMFORGE_REQUIRE_GPU";

/// True where a missing GPU fails tests instead of skipping them.
pub fn gpu_required() -> bool {
    std::env::var(REQUIRE_GPU_VAR).is_ok_and(|v| v == "1")
}

/// Skips the calling test for want of a GPU (or of something the GPU test needs, such as built
/// kernels): prints `skipped: <reason>` and returns `None`.
///
/// # Panics
/// When [`gpu_required`]: a required GPU that is missing is a failure, not a skip.
#[track_caller]
pub fn skip<T>(reason: impl Display) -> Option<T> {
    skip_unless(gpu_required(), reason)
}

#[track_caller]
fn skip_unless<T>(required: bool, reason: impl Display) -> Option<T> {
    assert!(!required, "{REQUIRE_GPU_VAR}=1 but {reason}");
    println!("skipped: {reason}");
    None
}

/// Set to a count `N` where that many GPUs must be present: a multi-GPU test that would skip
/// for want of devices (it needs at most `N`) fails instead.
pub const REQUIRE_GPUS_VAR: &str = "ROCMFORGE_REQUIRE_GPUS";

/// GPUs that tests must find ([`REQUIRE_GPUS_VAR`]; 0 when unset or unreadable).
pub fn gpus_required() -> usize {
    std::env::var(REQUIRE_GPUS_VAR)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// For a test that needs `need` GPUs where `have` exist: `Some(())` to go on, or `None` after
/// printing `skipped: ...`. A machine with fewer GPUs skips even where one GPU is required
/// ([`REQUIRE_GPU_VAR`]), unless [`REQUIRE_GPUS_VAR`] asks for at least `need`.
///
/// # Panics
/// When `have < need <= gpus_required()`.
#[track_caller]
pub fn need_gpus(have: usize, need: usize) -> Option<()> {
    if have >= need {
        return Some(());
    }
    skip_unless(
        need <= gpus_required(),
        format_args!("needs {need} GPUs, {have} present"),
    )
}

/// The value of `r`, or [`skip`] with its error as the reason.
#[track_caller]
pub fn or_skip<T, E: Display>(r: Result<T, E>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => skip(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_unless_the_gpu_is_required() {
        assert_eq!(skip_unless::<u32>(false, "no GPU (test)"), None);
        let failed = std::panic::catch_unwind(|| skip_unless::<()>(true, "no GPU (test)"));
        let why = failed.expect_err("a required GPU that is missing fails");
        let text = why.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(text, "ROCMFORGE_REQUIRE_GPU=1 but no GPU (test)");
        if !gpu_required() {
            assert_eq!(or_skip::<u32, _>(Err("no GPU (test)")), None);
        }
        assert_eq!(or_skip::<u32, &str>(Ok(7)), Some(7));
        assert_eq!(need_gpus(2, 2), Some(()));
        if gpus_required() < 2 {
            assert_eq!(need_gpus(1, 2), None);
        }
    }
}
