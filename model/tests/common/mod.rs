//! Reading llama.cpp goldens (`tests/data`, made by `scripts/make_goldens.py`) and checking our
//! logits against them, shared by the model tests that compare with llama.cpp.

use std::path::PathBuf;

/// A golden JSON file of `tests/data`.
pub fn golden(file: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(file);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

/// A JSON array of token ids.
pub fn u32s(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

/// llama.cpp's top-2 logit gap at each greedy step of a golden prompt.
pub fn gaps(prompt: &serde_json::Value) -> Vec<f64> {
    prompt["gap"]
        .as_array()
        .expect("gaps")
        .iter()
        .map(|x| x.as_f64().expect("gap"))
        .collect()
}

/// Asserts that every logit of llama.cpp's top-k for `prompt` is within `tol` of ours and returns
/// the largest difference.
pub fn check_top_k(what: &str, prompt: &serde_json::Value, logits: &[f32], tol: f32) -> f32 {
    let mut worst = 0f32;
    for pair in prompt["top_k"].as_array().expect("top_k") {
        let id = pair[0].as_u64().expect("id") as usize;
        let want = pair[1].as_f64().expect("logit") as f32;
        let d = (logits[id] - want).abs();
        worst = worst.max(d);
        assert!(
            d < tol,
            "{what}: logit of token {id}: ours {} llama.cpp {want}",
            logits[id]
        );
    }
    worst
}
