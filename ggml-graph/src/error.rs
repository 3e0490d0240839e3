//! The crate's error type: every failure names the tensor or op involved and what was expected.

use crate::tensor::TensorId;
use gguf::GgmlType;

/// Errors from graph building, planning and execution.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GraphError {
    /// An op got operands whose shapes or types it cannot combine.
    #[error("{op}: {msg}")]
    Shape {
        /// The op being built.
        op: &'static str,
        /// What was wrong, with the offending shapes.
        msg: String,
    },
    /// A tensor id that does not belong to this graph.
    #[error("tensor id {0:?} does not belong to this graph")]
    BadId(TensorId),
    /// The backend cannot run this op with these types.
    #[error("{backend}: op {op} is not supported for {detail}")]
    Unsupported {
        /// Backend name.
        backend: &'static str,
        /// Op name.
        op: &'static str,
        /// Types or layout that were not supported.
        detail: String,
    },
    /// A weight leaf had no bytes bound to it at run time.
    #[error("weight `{0}` is not bound")]
    UnboundWeight(String),
    /// Bound bytes or input data have the wrong size for the declared tensor.
    #[error("`{name}` ({dtype} {ne:?}): expected {expected} bytes, got {got}")]
    Size {
        /// Tensor name.
        name: String,
        /// Declared type.
        dtype: GgmlType,
        /// Declared shape.
        ne: [usize; 4],
        /// Bytes the shape needs.
        expected: usize,
        /// Bytes provided.
        got: usize,
    },
    /// Host memory for a buffer could not be allocated (the request is refused, never an abort).
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// What the buffer is for (`arena`, a persistent tensor's name, ...).
        what: String,
        /// Bytes asked for.
        bytes: usize,
    },
    /// A weight was bound with a type or shape that differs from the graph's declaration.
    #[error("`{name}`: bound as {bound}, graph declares {declared}")]
    Mismatch {
        /// Tensor name.
        name: String,
        /// What was bound or stored.
        bound: String,
        /// What the graph declares.
        declared: String,
    },
    /// An input leaf was not given data for this run.
    #[error("input `{0}` was not set for this run")]
    MissingInput(String),
    /// A tensor that was not marked as an output (or not yet computed) was read back.
    #[error("tensor `{0}` is not an output of the last run")]
    NotOutput(String),
    /// Tensor data was not aligned for its element type (e.g. f32 weights at an odd offset).
    #[error("`{0}`: data is not aligned for its element type")]
    Misaligned(String),
    /// A device call failed (open, allocation, copy, kernel launch, BLAS, synchronization).
    /// [`GraphError::is_out_of_memory`] tells a lack of memory from other failures.
    #[error("{backend}: {op}: device error: {source}")]
    Device {
        /// Backend name.
        backend: &'static str,
        /// The op or step that failed (a kernel name, `alloc`, `write`...).
        op: &'static str,
        /// The device layer's error (for the HIP backend a `gpu_mem::GpuError` or a
        /// `hip_ffi::Error` where one was the cause).
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

impl GraphError {
    /// True when memory ran out (a host buffer could not be allocated, a device's budget refused
    /// an allocation, or its driver had none left), as opposed to a failed launch, copy or check:
    /// fewer GPU layers, a smaller batch or a shorter context may then succeed where a retry as
    /// is would not.
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            GraphError::OutOfMemory { .. } => true,
            GraphError::Device { source, .. } => device_out_of_memory(source.as_ref()),
            _ => false,
        }
    }
}

/// Whether a device layer's error (or any error it was caused by) is a lack of memory.
#[cfg(feature = "hip")]
fn device_out_of_memory(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(e) = cause {
        let oom = e
            .downcast_ref::<gpu_mem::GpuError>()
            .is_some_and(gpu_mem::GpuError::is_out_of_memory)
            || e.downcast_ref::<hip_ffi::Error>()
                .and_then(hip_ffi::Error::as_hip)
                .is_some_and(hip_ffi::HipError::is_out_of_memory);
        if oom {
            return true;
        }
        cause = e.source();
    }
    false
}

/// Without a GPU backend no device allocates.
#[cfg(not(feature = "hip"))]
fn device_out_of_memory(_: &(dyn std::error::Error + 'static)) -> bool {
    false
}

/// Result alias for this crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

pub(crate) fn shape_err(op: &'static str, msg: impl Into<String>) -> GraphError {
    GraphError::Shape {
        op,
        msg: msg.into(),
    }
}

#[cfg(test)]
mod host_tests {
    use super::GraphError;

    #[test]
    fn a_refused_host_allocation_is_out_of_memory() {
        let e = GraphError::OutOfMemory {
            what: "arena".into(),
            bytes: 1 << 40,
        };
        assert!(e.is_out_of_memory());
        assert!(
            e.to_string().contains("1099511627776 bytes for arena"),
            "{e}"
        );
    }
}

#[cfg(all(test, feature = "hip"))]
mod tests {
    use gpu_mem::GpuError;
    use hip_ffi::error::code;
    use hip_ffi::HipError;

    use super::GraphError;
    use crate::hip::gpu_err;

    fn hip(call: &'static str, code: i32) -> hip_ffi::Error {
        hip_ffi::Error::Hip(HipError {
            call,
            code,
            native: None,
            message: "from the test".into(),
        })
    }

    #[test]
    fn device_errors_keep_their_source() {
        let budget = GpuError::BudgetExceeded {
            tag: "hip-backend scratch".into(),
            requested: 1 << 30,
            used: 1 << 20,
            limit: 1 << 29,
        };
        let e = gpu_err("scratch", budget.clone());
        let src = std::error::Error::source(&e).expect("a source");
        assert_eq!(src.downcast_ref::<GpuError>(), Some(&budget));
        assert!(e.to_string().contains("exceeds the budget"), "{e}");
    }

    #[test]
    fn out_of_memory_is_told_from_other_device_failures() {
        let budget = GpuError::BudgetExceeded {
            tag: "w".into(),
            requested: 10,
            used: 5,
            limit: 12,
        };
        assert!(gpu_err("alloc", budget).is_out_of_memory());
        let oom = hip("hipMalloc", code::OUT_OF_MEMORY);
        assert!(gpu_err("alloc", GpuError::Ffi(oom.clone())).is_out_of_memory());
        assert!(gpu_err("open", oom).is_out_of_memory());
        // A failed launch, a refused argument and the backend's own checks are not.
        let launch = hip("hipModuleLaunchKernel", code::INVALID_VALUE);
        assert!(!gpu_err("rms_norm", GpuError::Ffi(launch.clone())).is_out_of_memory());
        assert!(!gpu_err("rms_norm", launch).is_out_of_memory());
        let bad = GpuError::InvalidArgument("argument 0 is I32".into());
        assert!(!gpu_err("rms_norm", bad).is_out_of_memory());
        assert!(!gpu_err("scratch", "scratch would grow during graph capture").is_out_of_memory());
        assert!(!GraphError::MissingInput("tokens".into()).is_out_of_memory());
        // The driver's own refusal names what was asked for.
        let driver = GpuError::DriverOutOfMemory {
            tag: "graph buffer".into(),
            requested: 1 << 40,
            source: hip("hipMalloc", code::OUT_OF_MEMORY),
        };
        let e = gpu_err("alloc", driver);
        assert!(e.is_out_of_memory());
        assert!(
            e.to_string().contains("1099511627776 bytes (graph buffer)"),
            "{e}"
        );
    }
}
