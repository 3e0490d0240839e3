//! Tensor descriptions read from a GGUF header.

use crate::types::GgmlType;

/// One tensor's name, shape, type and location.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name (`"blk.0.attn_q.weight"`).
    pub name: String,
    /// Shape in ggml order: `dims[0]` is the innermost (contiguous) dimension, `ne[0]`.
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Byte offset of the data, relative to the start of the data section.
    pub offset: u64,
    /// Byte size of the data.
    pub size: u64,
    /// File offset where this tensor's info record starts (for error messages).
    pub info_offset: u64,
}

impl TensorInfo {
    /// Total number of elements (1 for a zero-dimensional tensor).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }

    /// Length of one row (`ne[0]`).
    pub fn row_len(&self) -> u64 {
        self.dims.first().copied().unwrap_or(1)
    }

    /// Number of rows (the product of every dimension but the first).
    pub fn n_rows(&self) -> u64 {
        self.dims.iter().skip(1).product()
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> u64 {
        self.ggml_type.row_bytes(self.row_len()).unwrap_or(0)
    }

    /// `ne[i]`, or 1 past the stored dimensions (ggml pads shapes to four dimensions with 1).
    pub fn ne(&self, i: usize) -> u64 {
        self.dims.get(i).copied().unwrap_or(1)
    }

    /// The shape written as `[ne0, ne1, ...]`.
    pub fn shape_string(&self) -> String {
        let parts: Vec<String> = self.dims.iter().map(u64::to_string).collect();
        format!("[{}]", parts.join(", "))
    }
}
