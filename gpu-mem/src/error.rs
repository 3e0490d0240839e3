//! gpu-mem's error type.

/// Result alias for gpu-mem.
pub type Result<T, E = GpuError> = std::result::Result<T, E>;

/// Everything that can go wrong in gpu-mem.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum GpuError {
    /// A driver or BLAS call failed, or no GPU provider could be loaded.
    #[error(transparent)]
    Ffi(#[from] hip_ffi::Error),
    /// The allocation would exceed the memory budget; no driver call was made.
    #[error("allocation of {requested} bytes ({tag}) exceeds the budget: {used} of {limit} bytes in use")]
    BudgetExceeded {
        /// What the allocation was for.
        tag: String,
        /// Bytes asked for.
        requested: u64,
        /// Bytes the budget had in use.
        used: u64,
        /// The budget's limit in bytes.
        limit: u64,
    },
    /// A range outside its parent, or offset arithmetic that overflowed.
    #[error("range {start}..{end} is out of bounds for a length of {len}")]
    OutOfBounds {
        /// First element (or byte) of the range.
        start: u64,
        /// One past its last.
        end: u64,
        /// Length of the parent.
        len: u64,
    },
    /// Element counts of source and destination differ.
    #[error("length mismatch: source has {src} elements, destination {dst}")]
    LengthMismatch {
        /// Elements in the source.
        src: usize,
        /// Elements in the destination.
        dst: usize,
    },
    /// Two objects belong to different devices.
    #[error("{what} belongs to device {found}, expected device {expected}")]
    WrongDevice {
        /// The object on the wrong device.
        what: &'static str,
        /// The device the operation runs on.
        expected: i32,
        /// The device the object belongs to.
        found: i32,
    },
    /// An argument out of its domain (zero alignment, size overflow, ...).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Errors recorded by `Drop` implementations, reported by a later check.
    #[error("errors recorded while releasing GPU resources: {0:?}")]
    Deferred(Vec<String>),
    /// The host allocator (test memory) failed.
    #[error("host allocation of {0} bytes failed")]
    HostAlloc(u64),
    /// The driver had no memory left for an allocation the budget allowed.
    #[error("out of memory: the driver could not allocate {requested} bytes ({tag}): {source}")]
    DriverOutOfMemory {
        /// What the allocation is for.
        tag: String,
        /// Bytes asked for.
        requested: u64,
        /// The driver's status.
        source: hip_ffi::Error,
    },
    /// A cooperative launch whose blocks cannot all be resident at once; nothing was queued.
    #[error(
        "{kernel}: a cooperative grid of {blocks} blocks cannot be resident at once: at most \
         {per_sm} per multiprocessor on {multiprocessors} multiprocessors{}",
        if *.per_sm == 0 {
            " (not even one block fits: too many threads, or more dynamic shared memory than \
             the kernel was allowed with Function::set_max_dynamic_shared)"
        } else {
            ""
        }
    )]
    CooperativeGridTooLarge {
        /// The kernel's name.
        kernel: String,
        /// Blocks in the grid.
        blocks: u64,
        /// Blocks of this shape that fit on one multiprocessor.
        per_sm: u32,
        /// Multiprocessors (compute units) of the device.
        multiprocessors: u32,
    },
}

impl GpuError {
    /// True when retrying after freeing cached memory could help (the budget, the driver or the
    /// host allocator refused an allocation).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            GpuError::BudgetExceeded { .. }
            | GpuError::HostAlloc(_)
            | GpuError::DriverOutOfMemory { .. } => true,
            GpuError::Ffi(hip_ffi::Error::Hip(e)) => e.is_out_of_memory(),
            _ => false,
        }
    }
}

/// A failed driver allocation of `bytes` for `tag`: an out-of-memory status names what was
/// asked for, any other passes as it is.
pub(crate) fn alloc_err(tag: &str, bytes: u64, e: hip_ffi::Error) -> GpuError {
    match e.as_hip() {
        Some(h) if h.is_out_of_memory() => GpuError::DriverOutOfMemory {
            tag: tag.to_owned(),
            requested: bytes,
            source: e,
        },
        _ => GpuError::Ffi(e),
    }
}

/// `start + len` checked against `bound`, as a typed error.
pub(crate) fn check_range(start: u64, len: u64, bound: u64) -> Result<u64> {
    let end = start.checked_add(len).ok_or(GpuError::OutOfBounds {
        start,
        end: u64::MAX,
        len: bound,
    })?;
    if end > bound {
        return Err(GpuError::OutOfBounds {
            start,
            end,
            len: bound,
        });
    }
    Ok(end)
}

/// Rounds `v` up to a multiple of `align` (a power of two), checked.
pub(crate) fn align_up(v: u64, align: u64) -> Result<u64> {
    if align == 0 || !align.is_power_of_two() {
        return Err(GpuError::InvalidArgument(format!(
            "alignment {align} is not a power of two"
        )));
    }
    v.checked_add(align - 1)
        .map(|x| x & !(align - 1))
        .ok_or_else(|| GpuError::InvalidArgument(format!("{v} rounded up to {align} overflows")))
}

#[cfg(test)]
mod tests {
    use hip_ffi::error::code;
    use hip_ffi::HipError;

    use super::{alloc_err, GpuError};

    fn hip(code: i32) -> hip_ffi::Error {
        hip_ffi::Error::Hip(HipError {
            call: "hipMalloc",
            code,
            native: None,
            message: "from the test".into(),
        })
    }

    #[test]
    fn a_driver_out_of_memory_names_what_was_asked_for() {
        let e = alloc_err("weights", 3 << 40, hip(code::OUT_OF_MEMORY));
        assert!(e.is_out_of_memory());
        let msg = e.to_string();
        assert!(msg.contains("3298534883328 bytes (weights)"), "{msg}");
        assert!(std::error::Error::source(&e).is_some(), "{e:?}");
        // Any other driver failure stays what it was.
        let other = alloc_err("weights", 8, hip(code::INVALID_VALUE));
        assert_eq!(other, GpuError::Ffi(hip(code::INVALID_VALUE)));
        assert!(!other.is_out_of_memory());
        assert!(GpuError::HostAlloc(1 << 50).is_out_of_memory());
    }
}
