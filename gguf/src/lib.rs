#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
//!
//! Specification: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>.
//!
//! ## Design choices
//! - The type table ([`GgmlType`]) is the single source of block sizes for every other crate.
//! - Files are memory-mapped ([`GgufFile::open`]; the file must not change while mapped) or read
//!   into an aligned buffer ([`GgufFile::read`]); tensor bytes are borrowed from it, never copied.
//! - Every count, length and offset is checked against the file size before anything is
//!   allocated; errors are one enum ([`GgufError`]) that names the byte offset.
//! - Dequantization is bit-identical to the `gguf` Python package (tests compare f32 bit
//!   patterns); block layouts are exposed as Pod structs for other kernels.
//!
//! Entry points: [`GgufFile::open`] (read), [`GgufWriter`] (write), [`dequantize`] /
//! [`dequantize_row`] / [`quantize`] (convert), [`dump::write_info`] (a `gguf-dump`-style
//! listing; `cargo run -p rocmforge-gguf --example gguf-info FILE`).
//!
//! Verification: `tests/oracle.rs` and `tests/model.rs` compare against the `gguf` Python
//! package through `tests/oracle.py`; `tests/hardening.rs` covers truncated and corrupted
//! files; `tests/roundtrip.rs` is a proptest; `fuzz/` holds the cargo-fuzz reader target
//! (`cargo xtask fuzz`); `cargo bench -p rocmforge-gguf` measures opening and dequantization.

pub mod dump;
pub mod error;
pub mod file;
pub mod metadata;
pub mod quants;
mod reader;
pub mod tensor;
pub mod types;
pub mod value;
pub mod writer;

pub use error::{GgufError, Result};
pub use file::GgufFile;
pub use metadata::Metadata;
pub use quants::{
    can_quantize, dequantize, dequantize_row, dequantize_to_vec, quantize, quantize_row,
};
pub use reader::{
    ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_ARRAY_LEN, MAX_DIMS, MAX_NESTING_DEPTH, MAX_STRING_LEN,
    MAX_TENSOR_NAME_LEN,
};
pub use tensor::TensorInfo;
pub use types::{GgmlType, QK_K};
pub use value::{ArrayValue, MetadataValue, ValueType};
pub use writer::{write_file, write_to_vec, GgufWriter, TensorToWrite};
