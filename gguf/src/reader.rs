//! The GGUF header parser: a bounds-checked cursor over the file bytes that validates every
//! count, length and offset against the file size before allocating.
//!
//! Format: <https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>. Layout: magic `GGUF`,
//! u32 version, u64 tensor count, u64 metadata count, metadata key/values, tensor infos, padding
//! to `general.alignment` (default 32), then the data section that tensor offsets are relative to.

use std::collections::HashMap;

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::tensor::TensorInfo;
use crate::types::GgmlType;
use crate::value::{ArrayValue, MetadataValue, ValueType};

/// Longest string accepted anywhere in the header (chat templates are the largest real ones,
/// at a few hundred KiB).
pub const MAX_STRING_LEN: u64 = 64 << 20;
/// Most elements accepted in one metadata array (vocabularies reach a few hundred thousand).
pub const MAX_ARRAY_LEN: u64 = 1 << 28;
/// Deepest array nesting accepted.
pub const MAX_NESTING_DEPTH: usize = 8;
/// Most dimensions a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: u32 = 4;
/// Longest tensor name accepted.
pub const MAX_TENSOR_NAME_LEN: u64 = 4096;
/// Alignment of the data section when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";

/// Everything the header holds, with offsets resolved and validated.
#[derive(Debug)]
pub(crate) struct Header {
    pub version: u32,
    pub alignment: u64,
    pub data_offset: u64,
    pub metadata: Metadata,
    pub tensors: Vec<TensorInfo>,
    pub tensor_index: HashMap<String, usize>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn offset(&self) -> u64 {
        self.pos as u64
    }

    fn remaining(&self) -> u64 {
        (self.buf.len() - self.pos) as u64
    }

    fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                offset: self.offset(),
                what,
                needed: n,
                available: self.remaining(),
            });
        }
        // n <= remaining, which fits in usize.
        let n = n as usize;
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N]> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &'static str) -> Result<u32> {
        self.array::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &'static str) -> Result<u64> {
        self.array::<8>(what).map(u64::from_le_bytes)
    }

    /// A count that the rest of the file must be able to hold at `min_each` bytes per item.
    fn count(&mut self, what: &'static str, min_each: u64, cap: u64) -> Result<u64> {
        let offset = self.offset();
        let n = self.u64(what)?;
        if n > cap {
            return Err(GgufError::TooLarge {
                offset,
                what,
                value: n,
                limit: cap,
            });
        }
        // Within the cap but more than the rest of the file can hold: the file is cut short (or
        // the count is corrupt), which the message must say rather than "exceeds the limit".
        let fits = self.remaining() / min_each.max(1);
        if n > fits {
            return Err(GgufError::Truncated {
                offset,
                what,
                needed: n.saturating_mul(min_each.max(1)),
                available: self.remaining(),
            });
        }
        Ok(n)
    }

    fn string(&mut self, what: &'static str, cap: u64) -> Result<String> {
        let offset = self.offset();
        let len = self.u64(what)?;
        if len > cap {
            return Err(GgufError::TooLarge {
                offset,
                what,
                value: len,
                limit: cap,
            });
        }
        let start = self.offset();
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::InvalidUtf8 { offset: start }),
        }
    }

    fn value_type(&mut self) -> Result<ValueType> {
        let offset = self.offset();
        let id = self.u32("value type")?;
        ValueType::from_id(id).ok_or(GgufError::UnknownValueType {
            offset,
            type_id: id,
        })
    }

    fn bool(&mut self) -> Result<bool> {
        let offset = self.offset();
        match self.array::<1>("bool")?[0] {
            0 => Ok(false),
            1 => Ok(true),
            value => Err(GgufError::InvalidBool { offset, value }),
        }
    }

    fn value(&mut self, ty: ValueType, depth: usize) -> Result<MetadataValue> {
        Ok(match ty {
            ValueType::U8 => MetadataValue::U8(self.array::<1>("uint8")?[0]),
            ValueType::I8 => MetadataValue::I8(i8::from_le_bytes(self.array::<1>("int8")?)),
            ValueType::U16 => MetadataValue::U16(u16::from_le_bytes(self.array("uint16")?)),
            ValueType::I16 => MetadataValue::I16(i16::from_le_bytes(self.array("int16")?)),
            ValueType::U32 => MetadataValue::U32(self.u32("uint32")?),
            ValueType::I32 => MetadataValue::I32(i32::from_le_bytes(self.array("int32")?)),
            ValueType::F32 => MetadataValue::F32(f32::from_le_bytes(self.array("float32")?)),
            ValueType::Bool => MetadataValue::Bool(self.bool()?),
            ValueType::String => MetadataValue::String(self.string("string", MAX_STRING_LEN)?),
            ValueType::Array => MetadataValue::Array(self.array_value(depth + 1)?),
            ValueType::U64 => MetadataValue::U64(self.u64("uint64")?),
            ValueType::I64 => MetadataValue::I64(i64::from_le_bytes(self.array("int64")?)),
            ValueType::F64 => MetadataValue::F64(f64::from_le_bytes(self.array("float64")?)),
        })
    }

    fn array_value(&mut self, depth: usize) -> Result<ArrayValue> {
        if depth > MAX_NESTING_DEPTH {
            return Err(GgufError::NestingTooDeep {
                offset: self.offset(),
                limit: MAX_NESTING_DEPTH,
            });
        }
        let ty = self.value_type()?;
        let n = self.count("array length", ty.min_encoded_size() as u64, MAX_ARRAY_LEN)?;
        // n fits: it is bounded by the remaining file bytes.
        let n = n as usize;
        macro_rules! fixed {
            ($variant:ident, $t:ty) => {{
                const W: usize = std::mem::size_of::<$t>();
                let bytes = self.take((n * W) as u64, "array elements")?;
                ArrayValue::$variant(
                    bytes
                        .chunks_exact(W)
                        .map(|c| {
                            let mut a = [0u8; W];
                            a.copy_from_slice(c);
                            <$t>::from_le_bytes(a)
                        })
                        .collect(),
                )
            }};
        }
        Ok(match ty {
            ValueType::U8 => fixed!(U8, u8),
            ValueType::I8 => fixed!(I8, i8),
            ValueType::U16 => fixed!(U16, u16),
            ValueType::I16 => fixed!(I16, i16),
            ValueType::U32 => fixed!(U32, u32),
            ValueType::I32 => fixed!(I32, i32),
            ValueType::F32 => fixed!(F32, f32),
            ValueType::U64 => fixed!(U64, u64),
            ValueType::I64 => fixed!(I64, i64),
            ValueType::F64 => fixed!(F64, f64),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool()?);
                }
                ArrayValue::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string("string", MAX_STRING_LEN)?);
                }
                ArrayValue::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(depth + 1)?);
                }
                ArrayValue::Array(v)
            }
        })
    }
}

/// Parses and validates the header of a whole GGUF file held in `buf`.
pub(crate) fn parse(buf: &[u8]) -> Result<Header> {
    let mut c = Cursor { buf, pos: 0 };
    let magic = c.array::<4>("magic")?;
    if &magic != b"GGUF" {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    match version {
        2 | 3 => {}
        v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
            return Err(GgufError::BigEndian {
                version: v.swap_bytes(),
            })
        }
        v => return Err(GgufError::UnsupportedVersion { version: v }),
    }
    // A tensor info takes at least 8 (name length) + 4 (n_dims) + 4 (type) + 8 (offset) bytes;
    // a key/value at least 8 (key length) + 4 (type) + 1 (value).
    let n_tensors = c.count("tensor count", 24, u64::MAX)?;
    let n_kv = c.count("metadata count", 13, u64::MAX)?;

    let mut metadata = Metadata::default();
    let mut alignment = DEFAULT_ALIGNMENT;
    for _ in 0..n_kv {
        let key_offset = c.offset();
        let key = c.string("metadata key", MAX_STRING_LEN)?;
        let ty = c.value_type()?;
        let value_offset = c.offset();
        let value = c.value(ty, 0)?;
        if key == ALIGNMENT_KEY {
            alignment = match value {
                MetadataValue::U32(a) if a.is_power_of_two() => u64::from(a),
                ref v => {
                    return Err(GgufError::BadAlignment {
                        offset: value_offset,
                        found: format!("{} {v}", v.type_description()),
                    })
                }
            };
        }
        if !metadata.insert(key.clone(), value) {
            return Err(GgufError::DuplicateKey {
                offset: key_offset,
                key,
            });
        }
    }

    // n_tensors is bounded by the file size, so this allocation is too.
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut tensor_index = HashMap::with_capacity(n_tensors as usize);
    for i in 0..n_tensors as usize {
        let info_offset = c.offset();
        let name = c.string("tensor name", MAX_TENSOR_NAME_LEN)?;
        let dims_offset = c.offset();
        let n_dims = c.u32("tensor n_dims")?;
        if n_dims > MAX_DIMS {
            return Err(GgufError::TooLarge {
                offset: dims_offset,
                what: "tensor n_dims",
                value: n_dims.into(),
                limit: MAX_DIMS.into(),
            });
        }
        let mut dims = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            dims.push(c.u64("tensor dimension")?);
        }
        let type_offset = c.offset();
        let type_id = c.u32("tensor type")?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            offset: type_offset,
            name: name.clone(),
            type_id,
        })?;
        let offset = c.u64("tensor offset")?;
        let size = tensor_size(&dims, ggml_type).map_err(|reason| GgufError::BadShape {
            offset: info_offset,
            name: name.clone(),
            reason,
        })?;
        if tensor_index.insert(name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor {
                offset: info_offset,
                name,
            });
        }
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset,
            size,
            info_offset,
        });
    }

    let end_of_infos = c.offset();
    let data_offset = end_of_infos.div_ceil(alignment) * alignment;
    let file_len = buf.len() as u64;
    let data_len = file_len.saturating_sub(data_offset);
    for t in &tensors {
        let reason = if t.offset % alignment != 0 {
            Some("offset is not a multiple of the alignment")
        } else {
            match t.offset.checked_add(t.size) {
                Some(end) if end <= data_len => None,
                _ => Some("range extends past the end of the file (is the file truncated?)"),
            }
        };
        if let Some(reason) = reason {
            return Err(GgufError::TensorOutOfBounds {
                offset: t.info_offset,
                name: t.name.clone(),
                start: t.offset,
                end: t.offset.saturating_add(t.size),
                data_offset,
                data_len,
                reason,
            });
        }
    }
    Ok(Header {
        version,
        alignment,
        data_offset,
        metadata,
        tensors,
        tensor_index,
    })
}

/// Byte size of a tensor, checking the element count and the block multiple.
pub(crate) fn tensor_size(dims: &[u64], ty: GgmlType) -> Result<u64, String> {
    let mut n: u64 = 1;
    for &d in dims {
        if d > i64::MAX as u64 {
            return Err(format!("dimension {d} exceeds i64::MAX"));
        }
        n = n
            .checked_mul(d)
            .filter(|&n| n <= i64::MAX as u64)
            .ok_or_else(|| format!("element count of shape {dims:?} overflows"))?;
    }
    let ne0 = dims.first().copied().unwrap_or(1);
    let row = ty.row_bytes(ne0).ok_or_else(|| {
        format!(
            "row length {ne0} is not a multiple of {ty}'s block size {}",
            ty.block_size()
        )
    })?;
    if n == 0 {
        return Ok(0);
    }
    // n != 0 and n <= i64::MAX, so the product of the outer dimensions cannot overflow.
    let rows: u64 = dims.iter().skip(1).product();
    row.checked_mul(rows)
        .ok_or_else(|| format!("byte size of shape {dims:?} overflows"))
}
