//! `cargo xtask fetch-vocabs`: extracts llama.cpp's tokenizer test vocabularies (GGUF files
//! with `.inp`/`.out` expected ids) from the llama-cpp-python sdist on PyPI into the cache.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::{pypi, Result};

const PACKAGE: &str = "llama-cpp-python";
/// The release whose vendored llama.cpp (0c1e57098) is the project's reference.
const VERSION: &str = "0.3.36";
const SDIST_SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// Vocabularies the tokenizer tests use: every one of llama.cpp's test set that comes with
/// `.inp`/`.out` cases.
/// One list, one name a line, shared by the tokenizer test and `cargo xtask fetch-vocabs`.
const VOCAB_LIST: &str = include_str!("../../model/tests/data/llama_cpp_vocabs.txt");

fn vocab_names() -> impl Iterator<Item = &'static str> {
    VOCAB_LIST.lines().map(str::trim).filter(|l| !l.is_empty())
}
const SUFFIXES: &[&str] = &["", ".inp", ".out"];

/// `$ROCMFORGE_VOCAB_DIR`, else the `vocabs` folder beside the model cache.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ROCMFORGE_VOCAB_DIR") {
        return PathBuf::from(dir);
    }
    let models = crate::fetch_model::cache_dir();
    models
        .parent()
        .map(|p| p.join("vocabs"))
        .unwrap_or_else(|| models.join("vocabs"))
}

fn wanted() -> Vec<String> {
    vocab_names()
        .flat_map(|v| {
            SUFFIXES
                .iter()
                .map(move |s| format!("ggml-vocab-{v}.gguf{s}"))
        })
        .collect()
}

/// Makes sure the vocabularies are in the cache and returns the folder.
pub fn run() -> Result<PathBuf> {
    let dir = cache_dir();
    let names = wanted();
    if names.iter().all(|n| dir.join(n).is_file()) {
        eprintln!("vocabularies already present: {}", dir.display());
        return Ok(dir);
    }
    fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let sdist = download_sdist()?;
    let digest = format!("{:x}", Sha256::digest(&sdist));
    if digest != SDIST_SHA256 {
        return Err(format!(
            "{PACKAGE} {VERSION} sdist has sha256 {digest}, expected {SDIST_SHA256}"
        ));
    }
    extract(&sdist, &dir, &names)?;
    eprintln!("vocabularies ready: {}", dir.display());
    Ok(dir)
}

/// Resolves a file URL from the JSON API (absolute, or relative to the JSON document).
fn resolve(meta_url: &str, url: &str) -> String {
    if url.contains("://") {
        return url.to_owned();
    }
    let (scheme_host, mut path) = match meta_url.find("://").and_then(|i| {
        meta_url[i + 3..]
            .find('/')
            .map(|j| (&meta_url[..i + 3 + j], &meta_url[i + 3 + j..]))
    }) {
        Some((sh, p)) => (sh, p.to_owned()),
        None => return url.to_owned(),
    };
    if url.starts_with('/') {
        return format!("{scheme_host}{url}");
    }
    // Drop the document name, then apply each `..`.
    path.truncate(path.rfind('/').map_or(0, |i| i + 1));
    let mut rest = url;
    while let Some(r) = rest.strip_prefix("../") {
        let trimmed = path.trim_end_matches('/');
        path.truncate(trimmed.rfind('/').map_or(0, |i| i + 1));
        rest = r;
    }
    format!("{scheme_host}{path}{rest}")
}

fn download_sdist() -> Result<Vec<u8>> {
    eprintln!("looking up {PACKAGE} {VERSION} on PyPI");
    let (meta_url, meta) = pypi::package_json(PACKAGE)?;
    let url = meta["releases"][VERSION]
        .as_array()
        .and_then(|files| {
            files
                .iter()
                .find(|f| f["packagetype"] == "sdist")
                .and_then(|f| f["url"].as_str())
        })
        .ok_or_else(|| format!("{meta_url}: no sdist listed for {VERSION}"))?;
    let url = resolve(&meta_url, url);
    eprintln!("downloading {url}");
    pypi::download(&url)
}

/// Copies the wanted `vendor/llama.cpp/models/` members of the tar.gz into `dir`.
fn extract(sdist: &[u8], dir: &Path, names: &[String]) -> Result<()> {
    let gz = flate2::read::GzDecoder::new(io::Cursor::new(sdist));
    let mut archive = tar::Archive::new(gz);
    let mut found = 0;
    let entries = archive
        .entries()
        .map_err(|e| format!("sdist: not a tar.gz: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("sdist: {e}"))?;
        let path = entry
            .path()
            .map_err(|e| format!("sdist: bad member name: {e}"))?
            .into_owned();
        let Some(file) = path.file_name().and_then(|f| f.to_str()) else {
            continue;
        };
        let in_models = path
            .parent()
            .is_some_and(|p| p.ends_with("vendor/llama.cpp/models"));
        if !in_models || !names.iter().any(|n| n == file) {
            continue;
        }
        let dest = dir.join(file);
        let partial = dir.join(format!("{file}.partial"));
        let mut out =
            fs::File::create(&partial).map_err(|e| format!("{}: {e}", partial.display()))?;
        io::copy(&mut entry, &mut out).map_err(|e| format!("{}: {e}", partial.display()))?;
        fs::rename(&partial, &dest).map_err(|e| format!("{}: {e}", dest.display()))?;
        found += 1;
    }
    if found != names.len() {
        return Err(format!(
            "sdist held {found} of the {} vocabulary files expected",
            names.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::resolve;

    #[test]
    fn resolves_relative_urls() {
        let m = "https://pypi.org/pypi/llama-cpp-python/json";
        assert_eq!(
            resolve(m, "../../packages/ab/x.tar.gz"),
            "https://pypi.org/packages/ab/x.tar.gz"
        );
        assert_eq!(resolve(m, "/p/x"), "https://pypi.org/p/x");
        assert_eq!(resolve(m, "https://h/x"), "https://h/x");
    }
}
