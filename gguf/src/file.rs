//! An opened GGUF file: validated header plus zero-copy access to tensor bytes over a memory map.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{GgufError, Result};
use crate::metadata::Metadata;
use crate::reader;
use crate::tensor::TensorInfo;
use crate::value::{ArrayValue, MetadataValue};

/// 64 bytes aligned to 64, the storage of a file read into memory: tensor data then sits at
/// the same alignment as in a mapping (offsets are multiples of `general.alignment`), which the
/// SIMD kernels reading it in place rely on.
#[repr(C, align(64))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Line([u8; 64]);

enum Bytes {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
    Read { lines: Vec<Line>, len: usize },
}

impl Bytes {
    fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Mapped(m) => m,
            Bytes::Owned(v) => v,
            Bytes::Read { lines, len } => &bytemuck::cast_slice::<Line, u8>(lines)[..*len],
        }
    }
}

/// Opens `path` for reading after checking that it is a regular file: opening a FIFO would
/// block until a writer appears, and a directory would fail later with a misleading error.
fn open_regular(path: &Path) -> Result<File> {
    let meta = std::fs::metadata(path).map_err(|e| GgufError::io(path, e))?;
    if !meta.is_file() {
        let what = if meta.is_dir() {
            "a directory"
        } else {
            "not a regular file (a FIFO, socket or device)"
        };
        return Err(GgufError::io(
            path,
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("is {what}; give the path of a GGUF model file"),
            ),
        ));
    }
    File::open(path).map_err(|e| GgufError::io(path, e))
}

/// A parsed GGUF file. Tensor data stays in the mapping until asked for.
pub struct GgufFile {
    bytes: Bytes,
    path: Option<PathBuf>,
    version: u32,
    alignment: u64,
    data_offset: u64,
    metadata: Metadata,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("alignment", &self.alignment)
            .field("data_offset", &self.data_offset)
            .field("n_metadata", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Maps `path` and parses its header; tensor bytes are not read.
    ///
    /// The file must not change while the value lives: truncating it makes later reads of the
    /// mapping fail with SIGBUS, rewriting it changes the tensor bytes underneath. Use
    /// [`GgufFile::read`] where that cannot be promised.
    ///
    /// ```
    /// use rocmforge_gguf::{dequantize_to_vec, write_to_vec, GgmlType, GgufFile, Metadata, TensorToWrite};
    ///
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // A file to open: one f32 tensor of 4 values.
    /// let values = [1.0f32, -2.0, 0.5, 4.0];
    /// let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    /// let t = TensorToWrite { name: "t", dims: &[4], ty: GgmlType::F32, data: &data };
    /// let path = std::env::temp_dir().join(format!("gguf-open-doc-{}.gguf", std::process::id()));
    /// std::fs::write(&path, write_to_vec(&Metadata::new(), &[t])?)?;
    ///
    /// let file = GgufFile::open(&path)?;
    /// for info in file.tensors() {
    ///     let values = dequantize_to_vec(info.ggml_type, file.tensor_data(info))?;
    ///     println!("{} {:?} {:?}: first value {}", info.name, info.dims, info.ggml_type, values[0]);
    /// }
    /// assert_eq!(dequantize_to_vec(GgmlType::F32, file.tensor_data(file.require_tensor("t")?))?, values);
    /// # drop(file);
    /// # std::fs::remove_file(&path)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        let path = path.as_ref();
        let file = open_regular(path)?;
        // SAFETY: the mapping is read-only and private to this value. The one hazard, another
        // process truncating or rewriting the file while it is mapped, is outside what a
        // library can prevent; it is the same contract every mmap-based model loader has (the
        // doc comment above states it, and `read` avoids it).
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| GgufError::io(path, e))?;
        let mut f = Self::from_backing(Bytes::Mapped(map))?;
        f.path = Some(path.to_owned());
        tracing::debug!(
            path = %path.display(),
            tensors = f.tensors.len(),
            metadata = f.metadata.len(),
            "opened GGUF"
        );
        Ok(f)
    }

    /// Reads the whole file at `path` into memory and parses its header: later changes to the
    /// file do not reach this value (llama.cpp's `--no-mmap`). Running out of memory for the
    /// copy is an error, not an abort.
    pub fn read(path: impl AsRef<Path>) -> Result<Self> {
        use std::io::Read as _;
        let path = path.as_ref();
        let mut file = open_regular(path)?;
        let len = file.metadata().map_err(|e| GgufError::io(path, e))?.len();
        let len = usize::try_from(len).map_err(|_| {
            GgufError::io(
                path,
                std::io::Error::other("file too large for this platform"),
            )
        })?;
        let n_lines = len.div_ceil(64);
        let mut lines: Vec<Line> = Vec::new();
        lines.try_reserve_exact(n_lines).map_err(|_| {
            GgufError::io(
                path,
                std::io::Error::new(
                    std::io::ErrorKind::OutOfMemory,
                    format!("cannot allocate {len} bytes to read the file into memory"),
                ),
            )
        })?;
        lines.resize(n_lines, Line([0; 64]));
        file.read_exact(&mut bytemuck::cast_slice_mut::<Line, u8>(&mut lines)[..len])
            .map_err(|e| GgufError::io(path, e))?;
        let mut f = Self::from_backing(Bytes::Read { lines, len })?;
        f.path = Some(path.to_owned());
        tracing::debug!(
            path = %path.display(),
            tensors = f.tensors.len(),
            metadata = f.metadata.len(),
            "opened GGUF"
        );
        Ok(f)
    }

    /// Parses a GGUF file held in memory.
    pub fn from_bytes(bytes: impl Into<Vec<u8>>) -> Result<Self> {
        Self::from_backing(Bytes::Owned(bytes.into()))
    }

    fn from_backing(bytes: Bytes) -> Result<Self> {
        let h = reader::parse(bytes.as_slice())?;
        Ok(GgufFile {
            bytes,
            path: None,
            version: h.version,
            alignment: h.alignment,
            data_offset: h.data_offset,
            metadata: h.metadata,
            tensors: h.tensors,
            tensor_index: h.tensor_index,
        })
    }

    /// The path given to [`GgufFile::open`], if any.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Data section alignment (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// File offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// Total file size in bytes.
    pub fn file_size(&self) -> u64 {
        self.bytes.as_slice().len() as u64
    }

    /// The whole file's bytes.
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.as_slice()
    }

    /// All metadata, in file order.
    pub fn metadata(&self) -> &Metadata {
        &self.metadata
    }

    /// All tensor infos, in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The tensor called `name`, or a `MissingTensor` error.
    pub fn require_tensor(&self, name: &str) -> Result<&TensorInfo> {
        self.tensor(name).ok_or_else(|| GgufError::MissingTensor {
            name: name.to_owned(),
        })
    }

    /// The raw bytes of a tensor of this file (zero-copy). Ranges were validated at open; an
    /// info that does not belong to this file and lies outside it yields an empty slice.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let start = self.data_offset.saturating_add(info.offset);
        let end = start.saturating_add(info.size);
        match (usize::try_from(start), usize::try_from(end)) {
            (Ok(s), Ok(e)) => self.bytes.as_slice().get(s..e).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// The tensor called `name` dequantized to f32 (parallel over blocks).
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>> {
        let info = self.require_tensor(name)?;
        let n = usize::try_from(info.n_elements()).map_err(|_| GgufError::SizeMismatch {
            ty: info.ggml_type,
            reason: format!("tensor `{name}` has too many elements for this platform"),
        })?;
        let mut out = vec![0f32; n];
        crate::quants::dequantize(info.ggml_type, self.tensor_data(info), &mut out)?;
        Ok(out)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.metadata.get_str("general.architecture")
    }

    /// `{arch}.{suffix}`, e.g. `llama.block_count` for `arch_key("block_count")`.
    pub fn arch_key(&self, suffix: &str) -> Result<String> {
        Ok(format!("{}.{suffix}", self.architecture()?))
    }

    /// The value at `{arch}.{suffix}`, if present.
    pub fn arch_get(&self, suffix: &str) -> Result<Option<&MetadataValue>> {
        Ok(self.metadata.get(&self.arch_key(suffix)?))
    }
}

macro_rules! forward {
    ($($name:ident -> $t:ty;)*) => {
        impl GgufFile {$(
            #[doc = concat!("Shorthand for `self.metadata().", stringify!($name), "(key)`.")]
            pub fn $name(&self, key: &str) -> Result<$t> {
                self.metadata.$name(key)
            }
        )*}
    };
}

forward! {
    get_u8 -> u8; get_u8_opt -> Option<u8>;
    get_u32 -> u32; get_u32_opt -> Option<u32>;
    get_i32 -> i32; get_i32_opt -> Option<i32>;
    get_u64 -> u64; get_u64_opt -> Option<u64>;
    get_i64 -> i64; get_i64_opt -> Option<i64>;
    get_f32 -> f32; get_f32_opt -> Option<f32>;
    get_f64 -> f64; get_f64_opt -> Option<f64>;
    get_bool -> bool; get_bool_opt -> Option<bool>;
    get_str -> &str; get_str_opt -> Option<&str>;
    get_array -> &ArrayValue;
    get_str_array -> &[String]; get_str_array_opt -> Option<&[String]>;
    get_f32_array -> &[f32]; get_f32_array_opt -> Option<&[f32]>;
    get_i32_array -> &[i32]; get_i32_array_opt -> Option<&[i32]>;
    get_u32_array -> &[u32]; get_u32_array_opt -> Option<&[u32]>;
    get_u8_array -> &[u8]; get_u8_array_opt -> Option<&[u8]>;
    get_i64_array -> &[i64]; get_i64_array_opt -> Option<&[i64]>;
    get_u64_array -> &[u64]; get_u64_array_opt -> Option<&[u64]>;
    get_bool_array -> &[bool]; get_bool_array_opt -> Option<&[bool]>;
}

macro_rules! forward_arch {
    ($($name:ident => $get:ident -> $t:ty;)*) => {
        impl GgufFile {$(
            #[doc = concat!("`", stringify!($get), "` of `{arch}.{suffix}`.")]
            pub fn $name(&self, suffix: &str) -> Result<$t> {
                self.metadata.$get(&self.arch_key(suffix)?)
            }
        )*}
    };
}

forward_arch! {
    arch_u32 => get_u32 -> u32; arch_u32_opt => get_u32_opt -> Option<u32>;
    arch_u64 => get_u64 -> u64; arch_u64_opt => get_u64_opt -> Option<u64>;
    arch_i32 => get_i32 -> i32; arch_i32_opt => get_i32_opt -> Option<i32>;
    arch_f32 => get_f32 -> f32; arch_f32_opt => get_f32_opt -> Option<f32>;
    arch_bool => get_bool -> bool; arch_bool_opt => get_bool_opt -> Option<bool>;
    arch_str => get_str -> &str; arch_str_opt => get_str_opt -> Option<&str>;
    arch_i32_array_opt => get_i32_array_opt -> Option<&[i32]>;
    arch_u32_array_opt => get_u32_array_opt -> Option<&[u32]>;
    arch_f32_array_opt => get_f32_array_opt -> Option<&[f32]>;
}
