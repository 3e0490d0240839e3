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
    }
}
