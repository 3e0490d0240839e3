//! hip-ffi's error type: failed calls carry the HIP status code (native codes mapped), the call
//! name and the vendor's message; loading failures list every file name that was tried.

use std::fmt;

/// Result alias for hip-ffi.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// HIP status codes hip-ffi's callers test for (values of `hipError_t`).
pub mod code {
    use crate::sys::hip::hipError_t as h;

    /// `hipSuccess`.
    pub const SUCCESS: i32 = h::hipSuccess as i32;
    /// `hipErrorInvalidValue`: an argument out of range.
    pub const INVALID_VALUE: i32 = h::hipErrorInvalidValue as i32;
    /// `hipErrorOutOfMemory`: the allocation did not fit.
    pub const OUT_OF_MEMORY: i32 = h::hipErrorOutOfMemory as i32;
    /// `hipErrorNotInitialized`: the runtime could not start.
    pub const NOT_INITIALIZED: i32 = h::hipErrorNotInitialized as i32;
    /// `hipErrorNoDevice`: the driver sees no GPU.
    pub const NO_DEVICE: i32 = h::hipErrorNoDevice as i32;
    /// `hipErrorInvalidDevice`: a device index out of range.
    pub const INVALID_DEVICE: i32 = h::hipErrorInvalidDevice as i32;
    /// `hipErrorNotReady`: queried work has not finished (not a failure).
    pub const NOT_READY: i32 = h::hipErrorNotReady as i32;
    /// `hipErrorNotSupported`: the device or runtime lacks the feature.
    pub const NOT_SUPPORTED: i32 = h::hipErrorNotSupported as i32;
    /// `hipErrorCooperativeLaunchTooLarge`: more blocks than can be co-resident.
    pub const COOPERATIVE_LAUNCH_TOO_LARGE: i32 = h::hipErrorCooperativeLaunchTooLarge as i32;
    /// `hipErrorUnknown`.
    pub const UNKNOWN: i32 = h::hipErrorUnknown as i32;
}

/// A HIP-shaped call that returned an error status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HipError {
    /// The HIP API call this stands for (`hipMalloc`, ...).
    pub call: &'static str,
    /// The status as a `hipError_t` value (NVIDIA codes are mapped to HIP's).
    pub code: i32,
    /// The platform's own status code when it is not HIP (a `CUresult` on NVIDIA).
    pub native: Option<(&'static str, i32)>,
    /// The platform's description of the status.
    pub message: String,
}

impl HipError {
    /// True for `hipErrorNotReady` (a query that found work still pending).
    pub fn is_not_ready(&self) -> bool {
        self.code == code::NOT_READY
    }

    /// True for `hipErrorOutOfMemory`.
    pub fn is_out_of_memory(&self) -> bool {
        self.code == code::OUT_OF_MEMORY
    }
}

impl fmt::Display for HipError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} (hipError_t {}",
            self.call, self.message, self.code
        )?;
        if let Some((kind, n)) = self.native {
            write!(f, ", {kind} {n}")?;
        }
        f.write_str(")")
    }
}

/// A BLAS call that returned an error status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlasError {
    /// The hipBLAS call this stands for (`hipblasGemmEx`, ...).
    pub call: &'static str,
    /// The status as a `hipblasStatus_t` value (cuBLAS codes are mapped).
    pub status: i32,
    /// The cuBLAS status on NVIDIA.
    pub native: Option<i32>,
    /// Description of the status.
    pub message: String,
}

impl fmt::Display for BlasError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} (hipblasStatus_t {}",
            self.call, self.message, self.status
        )?;
        if let Some(n) = self.native {
            write!(f, ", cublasStatus_t {n}")?;
        }
        f.write_str(")")
    }
}

/// A vendor library that could not be loaded: every candidate and why it failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// What was being loaded ("HIP runtime", "cuBLAS", ...).
    pub what: &'static str,
    /// `(candidate, reason)` for each file name tried, in order.
    pub tried: Vec<(String, String)>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "could not load the {}; tried", self.what)?;
        if self.tried.is_empty() {
            f.write_str(" nothing")?;
        }
        for (i, (name, why)) in self.tried.iter().enumerate() {
            let sep = if i == 0 { " " } else { "; " };
            write!(f, "{sep}{name} ({why})")?;
        }
        Ok(())
    }
}

/// A collective-library (NCCL/RCCL) call that returned an error status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclError {
    /// The call (`ncclAllReduce`, ...).
    pub call: &'static str,
    /// The `ncclResult_t` value.
    pub code: u32,
    /// The library's description of the status.
    pub message: String,
}

impl fmt::Display for NcclError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {} (ncclResult_t {})",
            self.call, self.message, self.code
        )
    }
}

impl std::error::Error for NcclError {}
impl std::error::Error for HipError {}
impl std::error::Error for BlasError {}
impl std::error::Error for LoadError {}

/// Everything that can go wrong in hip-ffi.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A HIP (or mapped CUDA driver) call failed.
    #[error(transparent)]
    Hip(#[from] HipError),
    /// A hipBLAS (or cuBLAS) call failed.
    #[error(transparent)]
    Blas(#[from] BlasError),
    /// A vendor library could not be opened or lacks a symbol.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// An NCCL or RCCL call failed, or the library is missing.
    #[error(transparent)]
    Nccl(#[from] NcclError),
    /// No provider offers a usable GPU; the reason says what each one found.
    #[error("no usable GPU: {0}")]
    NoGpu(String),
    /// `ROCMFORGE_PLATFORM` holds something other than amd, nvidia or cpu.
    #[error("ROCMFORGE_PLATFORM={0:?} is not one of amd, nvidia, cpu")]
    BadPlatformVar(String),
    /// An argument the driver would reject or misread (too large for its integer type, ...).
    #[error("invalid argument to {call}: {what}")]
    InvalidArgument {
        /// The API call the argument was for.
        call: &'static str,
        /// What is wrong with it.
        what: String,
    },
    /// The platform lacks a feature (graph capture on an old runtime, ...).
    #[error("{what} is not supported by the {platform} provider")]
    Unsupported {
        /// The missing feature.
        what: &'static str,
        /// The provider (`amd` or `nvidia`).
        platform: &'static str,
    },
}

impl Error {
    /// The HIP error, if this is one.
    pub fn as_hip(&self) -> Option<&HipError> {
        match self {
            Error::Hip(e) => Some(e),
            _ => None,
        }
    }
}

/// `v` as the C `int` a call takes, or [`Error::InvalidArgument`] naming the call and value.
pub(crate) fn c_int(call: &'static str, what: &str, v: i64) -> Result<i32> {
    i32::try_from(v).map_err(|_| Error::InvalidArgument {
        call,
        what: format!("{what} = {v} does not fit a C int"),
    })
}
