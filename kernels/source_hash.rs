//! The hash of the HIP kernel sources, shared by `kernels/build.rs` and `cargo xtask kernels`
//! (both include this file as a module).

use std::fs;
use std::path::{Path, PathBuf};

/// FNV-1a over the HIP sources (paths relative to `dir` and bytes, sorted by path; parts of a
/// module in subfolders, such as `stack/*.h`, count too). `cargo xtask kernels` writes it into the
/// manifest and `kernels/build.rs` compares, so stale code objects are never embedded.
pub fn source_hash(dir: &Path) -> String {
    let mut names = Vec::new();
    collect(dir, &mut names);
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
            .strip_prefix(dir)
            .unwrap_or(&p)
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join("/");
        eat(name.as_bytes());
        eat(&fs::read(&p).unwrap_or_default());
    }
    format!("{h:016x}")
}

/// Every file under `dir`, subfolders included.
fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for p in fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        if p.is_dir() {
            collect(&p, out);
        } else if p.is_file() {
            out.push(p);
        }
    }
}
