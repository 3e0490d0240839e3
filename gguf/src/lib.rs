//! `gguf`: a pure-Rust GGUF reader and writer with the full ggml tensor type table; the bottom
//! layer of rocmforge, usable alone and free of any GPU dependency.
//!
//! Design choices:
//! - The type table ([`GgmlType`]) is the single source of block sizes for every other crate.

pub mod types;

pub use types::{GgmlType, QK_K};
