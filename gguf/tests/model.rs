//! Tests on the real model file (env `ROCMFORGE_TEST_MODEL`, Gemma 3 270M Q4_K_M in CI):
//! metadata, tensor list and dequantized tensors of every type present equal gguf-py's.

mod common;

use std::collections::BTreeMap;

use common::*;
use rocmforge_gguf::{GgmlType, GgufFile};

fn model() -> Option<GgufFile> {
    let Some(path) = std::env::var_os("ROCMFORGE_TEST_MODEL") else {
        println!("skipped: ROCMFORGE_TEST_MODEL not set");
        return None;
    };
    Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("open {path:?}: {e}")))
}

#[test]
fn model_typed_getters_and_layout() {
    let Some(f) = model() else { return };
    assert!(f.version() == 2 || f.version() == 3);
    let arch = f.architecture().expect("architecture");
    let blocks = f.arch_u32("block_count").expect("block_count");
    assert!(blocks > 0);
    assert!(f.arch_u32("embedding_length").is_ok());
    let tokens = f.get_str_array("tokenizer.ggml.tokens").expect("tokens");
    assert!(!tokens.is_empty());
    // The wrong type names the key, the expectation and what is there.
    let e = f
        .get_u32("general.architecture")
        .expect_err("string is not u32")
        .to_string();
    assert!(
        e.contains("general.architecture") && e.contains("uint32") && e.contains("string"),
        "{e}"
    );
    assert!(f
        .get_u32_opt("no.such.key")
        .expect("absent is fine")
        .is_none());
    // Tensors tile the data section in order, each aligned.
    for t in f.tensors() {
        assert_eq!(t.offset % f.alignment(), 0, "{}", t.name);
        assert_eq!(f.tensor_data(t).len() as u64, t.size, "{}", t.name);
    }
    println!("{arch}: {blocks} blocks, {} tensors", f.tensors().len());
    let mut out = Vec::new();
    rocmforge_gguf::dump::write_info(&f, &mut out).expect("write_info");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(text.contains("token_embd.weight") && text.contains("general.architecture"));
}

#[test]
fn model_metadata_tensors_and_data_equal_gguf_py() {
    let Some(f) = model() else { return };
    if !python_oracle_available() {
        return;
    }
    let path = f
        .path()
        .expect("opened from a path")
        .to_str()
        .expect("utf-8 path")
        .to_owned();
    let dir = scratch("model");
    // Up to two tensors of each type present (the smallest, and the largest below 8 MiB so the
    // parallel path runs while the test stays quick), dequantized by both.
    let mut by_type: BTreeMap<GgmlType, Vec<&rocmforge_gguf::TensorInfo>> = BTreeMap::new();
    for t in f.tensors() {
        by_type.entry(t.ggml_type).or_default().push(t);
    }
    let mut names = Vec::new();
    for ts in by_type.values_mut() {
        ts.sort_by_key(|t| t.size);
        names.push(ts[0].name.clone());
        if let Some(big) = ts
            .iter()
            .rev()
            .find(|t| t.size < 8 << 20 && t.name != ts[0].name)
        {
            names.push(big.name.clone());
        }
    }
    let py = dir.join("py.txt");
    let mut args = vec![
        "dump",
        path.as_str(),
        py.to_str().expect("utf-8"),
        dir.to_str().expect("utf-8"),
    ];
    args.extend(names.iter().map(String::as_str));
    run_oracle(&args);
    let theirs = std::fs::read_to_string(&py).expect("read dump");
    let ours = rocmforge_gguf::dump::canonical_listing(&f);
    let (a, b): (Vec<&str>, Vec<&str>) = (ours.lines().collect(), theirs.lines().collect());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            x == y,
            "listing line {i} differs:\n ours:    {}\n gguf-py: {}",
            &x[..x.len().min(300)],
            &y[..y.len().min(300)]
        );
    }
    assert_eq!(a.len(), b.len());
    for name in &names {
        let ours = f.tensor_f32(name).expect("dequantize");
        assert_bits_eq(name, &ours, &read_f32(&dir.join(format!("{name}.f32"))));
    }
    println!(
        "compared {} tensors of types {:?}",
        names.len(),
        by_type.keys().collect::<Vec<_>>()
    );
}
