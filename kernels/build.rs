//! Embeds the code objects that `cargo xtask kernels` wrote, when they are there and match the
//! current HIP sources; otherwise the crate builds without them and reports so at run time.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

mod source_hash;
use source_hash::source_hash;

fn main() {
    println!("cargo:rustc-check-cfg=cfg(rocmforge_kernels)");
    println!("cargo:rerun-if-env-changed=ROCMFORGE_KERNELS_DIR");
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let hip = manifest.join("hip");
    let out_dir = env::var_os("ROCMFORGE_KERNELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("out"));
    println!("cargo:rerun-if-changed={}", hip.display());
    // A missing path would rerun this script on every build, so watch the nearest existing one.
    let watch = if out_dir.exists() {
        out_dir.clone()
    } else {
        out_dir.parent().unwrap_or(&manifest).to_path_buf()
    };
    println!("cargo:rerun-if-changed={}", watch.display());

    let mut code = String::from("pub(crate) static IMAGES: &[EmbeddedImage] = &[\n");
    let mut stamp_note = String::new();
    let manifest_txt = fs::read_to_string(out_dir.join("manifest.txt")).unwrap_or_default();
    let mut found = false;
    let expected = source_hash(&hip);
    for line in manifest_txt.lines() {
        // Lines: `stamp <hex>` once, then `<module> <target> <archs> <file>`.
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["stamp", hex] if *hex != expected => {
                stamp_note = format!(
                    "kernels in {} were built from other sources (stamp {hex}, sources {expected}): \
                     run `cargo xtask kernels`",
                    out_dir.display()
                );
            }
            [module, target, archs, file] => {
                let path = out_dir.join(file);
                if !path.is_file() {
                    continue;
                }
                println!("cargo:rerun-if-changed={}", path.display());
                let _ = writeln!(
                    code,
                    "    EmbeddedImage {{ module: {module:?}, target: {target:?}, archs: {archs:?}, bytes: include_bytes!({:?}) }},",
                    path.display().to_string()
                );
                found = true;
            }
            _ => {}
        }
    }
    code.push_str("];\n");
    if !stamp_note.is_empty() {
        println!("cargo:warning={stamp_note}");
        found = false;
        code = String::from("pub(crate) static IMAGES: &[EmbeddedImage] = &[];\n");
    }
    let _ = writeln!(code, "pub(crate) const STALE_NOTE: &str = {stamp_note:?};");
    if found {
        println!("cargo:rustc-cfg=rocmforge_kernels");
    }
    let dest = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("embedded.rs");
    fs::write(&dest, code).expect("write embedded.rs into OUT_DIR");
}
