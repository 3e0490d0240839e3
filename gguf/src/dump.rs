//! Human-readable and canonical listings of a GGUF file (metadata and tensor table), like
//! gguf-py's `gguf-dump`.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::{self, Write};

use crate::file::GgufFile;
use crate::value::{ArrayValue, MetadataValue};

/// `s` with control characters (terminal escape sequences, carriage returns, ...) written as
/// `\u{1b}`-style escapes, so that printing text from a file cannot drive the terminal.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if c.is_control() {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// Writes the file's header facts, every metadata key (arrays abbreviated) and a tensor table
/// (index, name, type, shape in ggml order, bytes, offset relative to the data section). Text
/// from the file goes through [`printable`].
pub fn write_info(file: &GgufFile, w: &mut impl Write) -> io::Result<()> {
    if let Some(p) = file.path() {
        writeln!(w, "file: {}", printable(&p.display().to_string()))?;
    }
    writeln!(
        w,
        "GGUF v{}, {} bytes, alignment {}, data section at {}",
        file.version(),
        file.file_size(),
        file.alignment(),
        file.data_offset()
    )?;
    let md = file.metadata();
    writeln!(w, "\nmetadata: {} keys", md.len())?;
    for (i, (k, v)) in md.iter().enumerate() {
        let count = match v {
            MetadataValue::Array(a) => a.len(),
            _ => 1,
        };
        let mut shown = printable(&v.to_string()).into_owned();
        if shown.len() > 200 {
            let cut = (0..=200)
                .rev()
                .find(|&c| shown.is_char_boundary(c))
                .unwrap_or(0);
            shown.truncate(cut);
            shown.push_str("...");
        }
        writeln!(
            w,
            "{:5}: {:<16} {:>8} | {} = {shown}",
            i + 1,
            v.type_description(),
            count,
            printable(k)
        )?;
    }
    let tensors = file.tensors();
    let total: u64 = tensors.iter().map(|t| t.size).sum();
    writeln!(w, "\ntensors: {} ({} bytes)", tensors.len(), total)?;
    let name_w = tensors
        .iter()
        .map(|t| printable(&t.name).chars().count())
        .max()
        .unwrap_or(4)
        .max(4);
    writeln!(
        w,
        "{:>5}  {:<name_w$}  {:<8} {:<24} {:>12} {:>12}",
        "#", "name", "type", "shape", "bytes", "offset"
    )?;
    for (i, t) in tensors.iter().enumerate() {
        writeln!(
            w,
            "{:5}  {:<name_w$}  {:<8} {:<24} {:>12} {:>12}",
            i,
            printable(&t.name),
            t.ggml_type.name(),
            t.shape_string(),
            t.size,
            t.offset
        )?;
    }
    Ok(())
}

/// A lossless, canonical text listing: one line per metadata key (floats as bit patterns,
/// strings as hex), header facts, and one line per tensor with its absolute data offset. The
/// tests compare it with the same listing produced from gguf-py's reader (`tests/oracle.py`).
pub fn canonical_listing(file: &GgufFile) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "version\t{}", file.version());
    for (k, v) in file.metadata().iter() {
        let _ = writeln!(s, "kv\t{k}\t{}", canonical_value(v));
    }
    let _ = writeln!(s, "alignment\t{}", file.alignment());
    let _ = writeln!(s, "data_offset\t{}", file.data_offset());
    for t in file.tensors() {
        let dims: Vec<String> = t.dims.iter().map(u64::to_string).collect();
        let _ = writeln!(
            s,
            "tensor\t{}\t{}\t{}\t{}\t{}",
            t.name,
            t.ggml_type as u32,
            dims.join(","),
            t.size,
            file.data_offset() + t.offset
        );
    }
    s
}

/// One value in the canonical notation of [`canonical_listing`].
pub fn canonical_value(v: &MetadataValue) -> String {
    let ty = v.value_type() as u32;
    match v {
        MetadataValue::U8(x) => format!("{ty}:{x}"),
        MetadataValue::I8(x) => format!("{ty}:{x}"),
        MetadataValue::U16(x) => format!("{ty}:{x}"),
        MetadataValue::I16(x) => format!("{ty}:{x}"),
        MetadataValue::U32(x) => format!("{ty}:{x}"),
        MetadataValue::I32(x) => format!("{ty}:{x}"),
        MetadataValue::U64(x) => format!("{ty}:{x}"),
        MetadataValue::I64(x) => format!("{ty}:{x}"),
        MetadataValue::F32(x) => format!("f32:{:08x}", x.to_bits()),
        MetadataValue::F64(x) => format!("f64:{:016x}", x.to_bits()),
        MetadataValue::Bool(x) => format!("bool:{}", u8::from(*x)),
        MetadataValue::String(x) => format!("str:{}", hex(x.as_bytes())),
        MetadataValue::Array(a) => canonical_array(a),
    }
}

fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(2 * b.len());
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

fn canonical_array(a: &ArrayValue) -> String {
    fn join<T>(v: &[T], f: impl Fn(&T) -> String) -> String {
        v.iter().map(f).collect::<Vec<_>>().join(",")
    }
    let items = match a {
        ArrayValue::U8(v) => join(v, |x| canonical_value(&MetadataValue::U8(*x))),
        ArrayValue::I8(v) => join(v, |x| canonical_value(&MetadataValue::I8(*x))),
        ArrayValue::U16(v) => join(v, |x| canonical_value(&MetadataValue::U16(*x))),
        ArrayValue::I16(v) => join(v, |x| canonical_value(&MetadataValue::I16(*x))),
        ArrayValue::U32(v) => join(v, |x| canonical_value(&MetadataValue::U32(*x))),
        ArrayValue::I32(v) => join(v, |x| canonical_value(&MetadataValue::I32(*x))),
        ArrayValue::U64(v) => join(v, |x| canonical_value(&MetadataValue::U64(*x))),
        ArrayValue::I64(v) => join(v, |x| canonical_value(&MetadataValue::I64(*x))),
        ArrayValue::F32(v) => join(v, |x| canonical_value(&MetadataValue::F32(*x))),
        ArrayValue::F64(v) => join(v, |x| canonical_value(&MetadataValue::F64(*x))),
        ArrayValue::Bool(v) => join(v, |x| canonical_value(&MetadataValue::Bool(*x))),
        ArrayValue::String(v) => join(v, |x| format!("str:{}", hex(x.as_bytes()))),
        ArrayValue::Array(v) => join(v, canonical_array),
    };
    format!("arr{}({})[{items}]", a.element_type() as u32, a.len())
}
