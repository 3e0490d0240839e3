//! The hash of the HIP kernel sources, shared by `kernels/build.rs` and `cargo xtask kernels`
//! (both include this file as a module).

use std::fs;
use std::path::{Path, PathBuf};

/// FNV-1a over the HIP sources (names and bytes, sorted by name). `cargo xtask kernels` writes it
/// into the manifest and `kernels/build.rs` compares, so stale code objects are never embedded.
pub fn source_hash(dir: &Path) -> String {
    let mut names: Vec<PathBuf> = fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path())
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for p in names {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        eat(name.as_bytes());
        eat(&fs::read(&p).unwrap_or_default());
    }
    format!("{h:016x}")
}
