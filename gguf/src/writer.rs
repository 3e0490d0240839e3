//! A streaming GGUF v3 writer: declare metadata and tensor infos, then stream each tensor's
//! bytes in declaration order; nothing but the header is held in memory.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::reader::{self, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS, MAX_TENSOR_NAME_LEN};
use crate::types::GgmlType;
use crate::value::{ArrayValue, MetadataValue};

/// The GGUF version this writer produces.
pub const WRITE_VERSION: u32 = 3;

#[derive(Debug)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    size: u64,
    offset: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum State {
    Declaring,
    Data { next: usize },
}

/// Writes a GGUF v3 file in two phases: declare (`set_*`, [`add_tensor_info`]), then
/// [`write_header`] and one [`write_tensor_data`] per tensor in declaration order, then
/// [`finish`].
///
/// [`add_tensor_info`]: GgufWriter::add_tensor_info
/// [`write_header`]: GgufWriter::write_header
/// [`write_tensor_data`]: GgufWriter::write_tensor_data
/// [`finish`]: GgufWriter::finish
pub struct GgufWriter<W: Write> {
    sink: W,
    path: PathBuf,
    metadata: Metadata,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
    data_size: u64,
    written: u64,
    state: State,
}

impl<W: Write> std::fmt::Debug for GgufWriter<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufWriter")
            .field("path", &self.path)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .field("state", &self.state)
            .finish()
    }
}

impl GgufWriter<BufWriter<File>> {
    /// Creates (truncates) `path` and writes to it through a buffer.
    pub fn create(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let f = File::create(path).map_err(|e| GgufError::io(path, e))?;
        let mut w = GgufWriter::new(BufWriter::with_capacity(1 << 20, f));
        w.path = path.to_owned();
        Ok(w)
    }
}

impl<W: Write> GgufWriter<W> {
    /// A writer over any byte sink.
    pub fn new(sink: W) -> Self {
        GgufWriter {
            sink,
            path: PathBuf::new(),
            metadata: Metadata::new(),
            tensors: Vec::new(),
            names: HashSet::new(),
            data_size: 0,
            written: 0,
            state: State::Declaring,
        }
    }

    fn declaring(&self, what: &str) -> Result<()> {
        if self.state == State::Declaring {
            Ok(())
        } else {
            Err(GgufError::Writer(format!("{what} after write_header")))
        }
    }

    /// The data section alignment in effect (`general.alignment` if set, else 32).
    pub fn alignment(&self) -> Result<u64> {
        match self.metadata.get(ALIGNMENT_KEY) {
            None => Ok(DEFAULT_ALIGNMENT),
            Some(MetadataValue::U32(a)) if a.is_power_of_two() => Ok(u64::from(*a)),
            Some(v) => Err(GgufError::Writer(format!(
                "{ALIGNMENT_KEY} must be a power-of-two uint32, found {} {v}",
                v.type_description()
            ))),
        }
    }

    /// Sets a metadata key (replacing an earlier value of the same key in place).
    pub fn set(&mut self, key: impl Into<String>, value: impl Into<MetadataValue>) -> Result<()> {
        self.declaring("metadata")?;
        let key = key.into();
        let value = value.into();
        if key == ALIGNMENT_KEY && !self.tensors.is_empty() {
            return Err(GgufError::Writer(format!(
                "{ALIGNMENT_KEY} must be set before the first tensor"
            )));
        }
        if key == ALIGNMENT_KEY && !matches!(value, MetadataValue::U32(a) if a.is_power_of_two()) {
            return Err(GgufError::Writer(format!(
                "{ALIGNMENT_KEY} must be a power-of-two uint32, found {} {value}",
                value.type_description()
            )));
        }
        self.metadata.set(key, value);
        Ok(())
    }

    /// Copies every key of `metadata`.
    pub fn set_all(&mut self, metadata: &Metadata) -> Result<()> {
        for (k, v) in metadata.iter() {
            self.set(k, v.clone())?;
        }
        Ok(())
    }

    /// Declares a tensor; its data must later be written in the same order.
    pub fn add_tensor_info(&mut self, name: &str, dims: &[u64], ty: GgmlType) -> Result<()> {
        self.declaring("add_tensor_info")?;
        if name.len() as u64 > MAX_TENSOR_NAME_LEN {
            return Err(GgufError::Writer(format!(
                "tensor name `{name}` is too long"
            )));
        }
        if dims.len() > MAX_DIMS as usize {
            return Err(GgufError::Writer(format!(
                "tensor `{name}` has {} dimensions (max {MAX_DIMS})",
                dims.len()
            )));
        }
        if self.names.contains(name) {
            return Err(GgufError::Writer(format!("duplicate tensor name `{name}`")));
        }
        let size = reader::tensor_size(dims, ty)
            .map_err(|r| GgufError::Writer(format!("tensor `{name}`: {r}")))?;
        let align = self.alignment()?;
        let offset = self.data_size;
        self.data_size = offset
            .checked_add(size)
            .map(|end| end.div_ceil(align) * align)
            .ok_or_else(|| GgufError::Writer("data section size overflows".into()))?;
        self.names.insert(name.to_owned());
        self.tensors.push(PendingTensor {
            name: name.to_owned(),
            dims: dims.to_vec(),
            ty,
            size,
            offset,
        });
        Ok(())
    }

    fn put(&mut self, bytes: &[u8]) -> Result<()> {
        self.sink
            .write_all(bytes)
            .map_err(|e| GgufError::io(&self.path, e))?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad(&mut self, align: u64) -> Result<()> {
        let pad = (self.written.div_ceil(align) * align - self.written) as usize;
        const ZEROS: [u8; 64] = [0; 64];
        let mut left = pad;
        while left > 0 {
            let n = left.min(ZEROS.len());
            self.put(&ZEROS[..n])?;
            left -= n;
        }
        Ok(())
    }

    /// Writes the header: magic, version, counts, metadata, tensor infos and the padding up to
    /// the data section.
    pub fn write_header(&mut self) -> Result<()> {
        self.declaring("write_header")?;
        let align = self.alignment()?;
        let mut h = Vec::with_capacity(4096);
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&WRITE_VERSION.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in self.metadata.iter() {
            encode_str(&mut h, k);
            h.extend_from_slice(&(v.value_type() as u32).to_le_bytes());
            encode_value(&mut h, v);
        }
        for t in &self.tensors {
            encode_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&(t.ty as u32).to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        self.put(&h)?;
        self.pad(align)?;
        self.state = State::Data { next: 0 };
        Ok(())
    }

    /// Writes the next declared tensor's bytes; `name` must be that tensor and `data` exactly
    /// its size.
    pub fn write_tensor_data(&mut self, name: &str, data: &[u8]) -> Result<()> {
        let State::Data { next } = self.state else {
            return Err(GgufError::Writer(
                "write_tensor_data before write_header".into(),
            ));
        };
        let Some(t) = self.tensors.get(next) else {
            return Err(GgufError::Writer(format!(
                "tensor `{name}` was not declared"
            )));
        };
        if t.name != name {
            return Err(GgufError::Writer(format!(
                "expected data for tensor `{}` (declaration order), got `{name}`",
                t.name
            )));
        }
        if t.size != data.len() as u64 {
            return Err(GgufError::Writer(format!(
                "tensor `{name}`: {} bytes given, {} expected for {} {:?}",
                data.len(),
                t.size,
                t.ty,
                t.dims
            )));
        }
        let align = self.alignment()?;
        self.put(data)?;
        self.pad(align)?;
        self.state = State::Data { next: next + 1 };
        Ok(())
    }

    /// Checks every declared tensor was written, flushes and returns the sink.
    pub fn finish(mut self) -> Result<W> {
        if self.state == State::Declaring {
            self.write_header()?;
        }
        if let State::Data { next } = self.state {
            if next != self.tensors.len() {
                return Err(GgufError::Writer(format!(
                    "finish with {} of {} tensors written",
                    next,
                    self.tensors.len()
                )));
            }
        }
        self.sink
            .flush()
            .map_err(|e| GgufError::io(&self.path, e))?;
        Ok(self.sink)
    }
}

/// A tensor for [`write_to_vec`]/[`write_file`]: name, ggml-order dims, type and bytes.
#[derive(Clone, Copy, Debug)]
pub struct TensorToWrite<'a> {
    /// Tensor name.
    pub name: &'a str,
    /// Dimensions, `ne[0]` first.
    pub dims: &'a [u64],
    /// Element type.
    pub ty: GgmlType,
    /// The encoded bytes.
    pub data: &'a [u8],
}

fn write_all<W: Write>(
    mut w: GgufWriter<W>,
    metadata: &Metadata,
    tensors: &[TensorToWrite<'_>],
) -> Result<W> {
    w.set_all(metadata)?;
    for t in tensors {
        w.add_tensor_info(t.name, t.dims, t.ty)?;
    }
    w.write_header()?;
    for t in tensors {
        w.write_tensor_data(t.name, t.data)?;
    }
    w.finish()
}

/// Encodes a whole GGUF file in memory.
pub fn write_to_vec(metadata: &Metadata, tensors: &[TensorToWrite<'_>]) -> Result<Vec<u8>> {
    write_all(GgufWriter::new(Vec::new()), metadata, tensors)
}

/// Writes a whole GGUF file to `path`.
pub fn write_file(
    path: impl AsRef<Path>,
    metadata: &Metadata,
    tensors: &[TensorToWrite<'_>],
) -> Result<()> {
    write_all(GgufWriter::create(path)?, metadata, tensors).map(|_| ())
}

fn encode_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends the encoding of `v` (without its type id) to `out`.
pub fn encode_value(out: &mut Vec<u8>, v: &MetadataValue) {
    match v {
        MetadataValue::U8(x) => out.push(*x),
        MetadataValue::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::Bool(x) => out.push(u8::from(*x)),
        MetadataValue::String(s) => encode_str(out, s),
        MetadataValue::Array(a) => encode_array(out, a),
        MetadataValue::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        MetadataValue::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn encode_array(out: &mut Vec<u8>, a: &ArrayValue) {
    out.extend_from_slice(&(a.element_type() as u32).to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! nums {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        ArrayValue::U8(v) => out.extend_from_slice(v),
        ArrayValue::I8(v) => nums!(v),
        ArrayValue::U16(v) => nums!(v),
        ArrayValue::I16(v) => nums!(v),
        ArrayValue::U32(v) => nums!(v),
        ArrayValue::I32(v) => nums!(v),
        ArrayValue::F32(v) => nums!(v),
        ArrayValue::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
        ArrayValue::String(v) => {
            for s in v {
                encode_str(out, s);
            }
        }
        ArrayValue::Array(v) => {
            for inner in v {
                encode_array(out, inner);
            }
        }
        ArrayValue::U64(v) => nums!(v),
        ArrayValue::I64(v) => nums!(v),
        ArrayValue::F64(v) => nums!(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn misuse_is_a_typed_error() {
        let mut w = GgufWriter::new(Vec::new());
        w.add_tensor_info("a", &[32], GgmlType::Q8_0)
            .expect("declare");
        assert!(
            w.add_tensor_info("a", &[32], GgmlType::Q8_0).is_err(),
            "duplicate name"
        );
        assert!(
            w.add_tensor_info("b", &[31], GgmlType::Q8_0).is_err(),
            "partial block"
        );
        assert!(
            w.add_tensor_info("c", &[1, 1, 1, 1, 1], GgmlType::F32)
                .is_err(),
            "5 dims"
        );
        assert!(
            w.set(ALIGNMENT_KEY, 64u32).is_err(),
            "alignment after tensors"
        );
        assert!(
            w.write_tensor_data("a", &[0; 34]).is_err(),
            "data before header"
        );
        w.write_header().expect("header");
        assert!(w.set("k", 1u32).is_err(), "metadata after header");
        assert!(w.write_tensor_data("a", &[0; 33]).is_err(), "wrong size");
        assert!(w.write_tensor_data("x", &[0; 34]).is_err(), "wrong name");
        w.write_tensor_data("a", &[0; 34]).expect("data");
        let bytes = w.finish().expect("finish");
        let f = crate::GgufFile::from_bytes(bytes).expect("read back");
        assert_eq!(f.tensors()[0].size, 34);

        let mut w = GgufWriter::new(Vec::new());
        assert!(w.set(ALIGNMENT_KEY, 24u32).is_err(), "non power of two");
        w.add_tensor_info("a", &[4], GgmlType::F32)
            .expect("declare");
        w.write_header().expect("header");
        assert!(w.finish().is_err(), "tensor never written");
    }
}
