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
    #[error("{backend}: {op}: device error: {detail}")]
    Device {
        /// Backend name.
        backend: &'static str,
        /// The op or step that failed (a kernel name, `alloc`, `write`...).
        op: &'static str,
        /// The device layer's message.
        detail: String,
    },
}

/// Result alias for this crate.
pub type Result<T, E = GraphError> = std::result::Result<T, E>;

pub(crate) fn shape_err(op: &'static str, msg: impl Into<String>) -> GraphError {
    GraphError::Shape {
        op,
        msg: msg.into(),
    }
}
