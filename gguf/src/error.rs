//! The crate's single error type: every failure names the byte offset, key or tensor involved.

use std::path::PathBuf;

use crate::types::GgmlType;

/// Result alias used throughout the crate.
pub type Result<T, E = GgufError> = std::result::Result<T, E>;

/// Everything that can go wrong reading, writing or converting GGUF data.
///
/// Parse errors carry `offset`: the byte offset in the file where the offending field starts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, mapped, read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file involved (empty when writing to a non-file sink).
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("offset 0: not a GGUF file (magic {found:02x?}, expected \"GGUF\")")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// A GGUF version this reader does not handle (only 2 and 3 are supported).
    #[error("offset 4: unsupported GGUF version {version} (supported: 2, 3)")]
    UnsupportedVersion {
        /// The version field as read (little-endian).
        version: u32,
    },
    /// The file is a big-endian GGUF, which this reader refuses.
    #[error("offset 4: big-endian GGUF (version {version}) is not supported; convert it to little-endian")]
    BigEndian {
        /// The byte-swapped version number.
        version: u32,
    },
    /// The file ends before a field that it declares.
    #[error(
        "offset {offset}: the file is truncated (or corrupt): {what} needs {needed} bytes, only {available} left"
    )]
    Truncated {
        /// Where the field starts.
        offset: u64,
        /// Which field was being read.
        what: &'static str,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the file from `offset`.
        available: u64,
    },
    /// A count or length exceeds a hard cap or what the rest of the file could possibly hold.
    #[error("offset {offset}: {what} {value} exceeds the limit {limit}")]
    TooLarge {
        /// Where the count or length is stored.
        offset: u64,
        /// What the number counts.
        what: &'static str,
        /// The number found.
        value: u64,
        /// The largest accepted value at this point.
        limit: u64,
    },
    /// A string is not valid UTF-8.
    #[error("offset {offset}: string is not valid UTF-8")]
    InvalidUtf8 {
        /// Where the string's bytes start.
        offset: u64,
    },
    /// A metadata value type id outside the GGUF specification.
    #[error("offset {offset}: unknown metadata value type {type_id}")]
    UnknownValueType {
        /// Where the type id is stored.
        offset: u64,
        /// The id found.
        type_id: u32,
    },
    /// A boolean byte other than 0 or 1.
    #[error("offset {offset}: invalid bool byte {value}")]
    InvalidBool {
        /// Where the byte is stored.
        offset: u64,
        /// The byte found.
        value: u8,
    },
    /// Arrays nested deeper than the cap.
    #[error("offset {offset}: arrays nested deeper than {limit}")]
    NestingTooDeep {
        /// Where the innermost array starts.
        offset: u64,
        /// The cap.
        limit: usize,
    },
    /// The same metadata key appears twice.
    #[error("offset {offset}: duplicate metadata key `{key}`")]
    DuplicateKey {
        /// Where the second occurrence starts.
        offset: u64,
        /// The key.
        key: String,
    },
    /// `general.alignment` is not a non-zero power of two stored as u32.
    #[error("offset {offset}: general.alignment must be a power-of-two u32, found {found}")]
    BadAlignment {
        /// Where the value is stored.
        offset: u64,
        /// A description of the value found.
        found: String,
    },
    /// Two tensors share a name.
    #[error("offset {offset}: duplicate tensor name `{name}`")]
    DuplicateTensor {
        /// Where the second tensor info starts.
        offset: u64,
        /// The name.
        name: String,
    },
    /// A tensor type id that ggml does not define (or no longer supports).
    #[error("offset {offset}: tensor `{name}` has unknown ggml type id {type_id}")]
    UnknownTensorType {
        /// Where the type id is stored.
        offset: u64,
        /// The tensor.
        name: String,
        /// The id found.
        type_id: u32,
    },
    /// A tensor's shape is invalid (too many dims, zero/overflowing sizes, partial blocks).
    #[error("offset {offset}: tensor `{name}`: {reason}")]
    BadShape {
        /// Where the tensor info starts.
        offset: u64,
        /// The tensor.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor's bytes do not lie inside the data section or are misaligned.
    #[error(
        "offset {offset}: tensor `{name}` data [{start}, {end}) relative to the data section \
         (at {data_offset}, {data_len} bytes): {reason}"
    )]
    TensorOutOfBounds {
        /// Where the tensor info starts.
        offset: u64,
        /// The tensor.
        name: String,
        /// Start of its data, relative to the data section.
        start: u64,
        /// End of its data, relative to the data section.
        end: u64,
        /// File offset of the data section.
        data_offset: u64,
        /// Length of the data section.
        data_len: u64,
        /// Why it was rejected.
        reason: &'static str,
    },
    /// A metadata key is absent.
    #[error("metadata key `{key}` is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata key holds a different type than the caller asked for.
    #[error("metadata key `{key}`: expected {expected}, found {found}")]
    WrongType {
        /// The key.
        key: String,
        /// The type asked for.
        expected: &'static str,
        /// The type stored.
        found: String,
    },
    /// No tensor with this name.
    #[error("tensor `{name}` not found")]
    MissingTensor {
        /// The name.
        name: String,
    },
    /// A conversion got buffers whose sizes do not match the type's block layout.
    #[error("{ty}: {reason}")]
    SizeMismatch {
        /// The ggml type involved.
        ty: GgmlType,
        /// What did not match.
        reason: String,
    },
    /// The type has no converter for the requested direction.
    #[error("{ty}: {what} is not supported for this type")]
    Unsupported {
        /// The ggml type.
        ty: GgmlType,
        /// `"quantization"` or `"dequantization"`.
        what: &'static str,
    },
    /// The writer was used out of order or given inconsistent input.
    #[error("writer: {0}")]
    Writer(String),
}

impl GgufError {
    /// Wraps an I/O error with the file it concerns.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        GgufError::Io {
            path: path.into(),
            source,
        }
    }
}
