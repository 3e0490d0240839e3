//! Synthetic llama, mistral, qwen2, qwen3 and gemma2 models (random weights at small real shapes,
//! written by `rocmforge_model::synth`) against llama.cpp's logits on the same files (`data/synth_*.json`),
//! including llama files with YaRN rope scaling and with `rope_freqs` factors, and a Gemma 2 file
//! with soft-capped attention scores and logits and a 4-token sliding window.
//!
//! The files are regenerated bit for bit from their recorded recipe (checked by sha256), then
//! each prompt runs through our execution plan for that architecture; the reference's top logits
//! and its greedy tokens (up to the first near-tie) must match.

mod common;

use std::path::PathBuf;

use rocmforge_model::arch::LogitsMode;
use rocmforge_model::sampling::argmax;
use rocmforge_model::session::{Model, Session, SessionOptions};
use serial_test::serial;
use sha2::{Digest, Sha256};

use common::{check_top_k, gaps, golden, u32s};

/// |ours - llama.cpp| allowed on the reference's top logits. With activations rounded exactly as
/// ggml rounds them (8 bits for quantized weights, f16 for F16 weights) the quantized files agree
/// to ~1e-5 and the F16 one to ~2e-4; a wrong rope mode, bias, norm, rope scaling or soft-cap
/// moves logits by 0.08 to several units.
const LOGIT_TOL: f32 = 0.005;
/// Greedy steps are compared until llama.cpp's top-2 gap first falls below this (well above
/// the largest logit difference, so a flip can only mean a real error).
const TIE: f64 = 0.01;

fn check(name: &str, vocabs: &std::path::Path) {
    let g = golden(&format!("synth_{name}.json"));
    let (opts, vocab) = rocmforge_model::synth::golden_spec(name).expect("known golden");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("synth-logits");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("synth-{name}.gguf"));
    rocmforge_model::synth::write(&opts, Some(&vocabs.join(vocab)), &path)
        .expect("write synthetic model");
    let sha = format!(
        "{:x}",
        Sha256::digest(std::fs::read(&path).expect("read back"))
    );
    assert_eq!(
        Some(sha.as_str()),
        g["model_sha256"].as_str(),
        "{name}: file differs"
    );
    let m = Model::load(&path, |_, _| {}).expect("load");
    let opts = SessionOptions {
        n_ctx: 256,
        n_threads: 2,
        ..SessionOptions::default()
    };
    let mut s = Session::new(&m, &opts).expect("session");
    let mut worst = 0f32;
    let mut compared = 0;
    for p in g["prompts"].as_array().expect("prompts") {
        let ids = u32s(&p["prompt_ids"]);
        s.reset();
        let mut logits = s.eval(&ids, LogitsMode::Last).expect("eval");
        worst = worst.max(check_top_k(name, p, &logits, LOGIT_TOL));
        let want = u32s(&p["greedy"]);
        let gaps = gaps(p);
        let limit = gaps.iter().position(|&x| x < TIE).unwrap_or(want.len());
        for (step, &w) in want.iter().enumerate().take(limit) {
            assert_eq!(argmax(&logits), w, "{name}: greedy step {step}");
            compared += 1;
            logits = s.eval(&[w], LogitsMode::Last).expect("decode");
        }
    }
    println!("{name}: max |logit diff| over reference top-k {worst:.5}, {compared} greedy tokens compared");
    let _ = std::fs::remove_file(&path);
    if let Some(ctl) = control(name) {
        // The same file without the feature under test, through our engine: it must land far
        // from llama.cpp's logits, or matching them would not show the feature works.
        let cpath = dir.join(format!("synth-{name}-control.gguf"));
        rocmforge_model::synth::write(&ctl, Some(&vocabs.join(vocab)), &cpath)
            .expect("write control");
        let cm = Model::load(&cpath, |_, _| {}).expect("load control");
        let mut cs = Session::new(&cm, &opts).expect("control session");
        let mut dist = 0f32;
        for p in g["prompts"].as_array().expect("prompts") {
            cs.reset();
            let logits = cs
                .eval(&u32s(&p["prompt_ids"]), LogitsMode::Last)
                .expect("eval");
            for pair in p["top_k"].as_array().expect("top_k") {
                let id = pair[0].as_u64().expect("id") as usize;
                let want = pair[1].as_f64().expect("logit") as f32;
                dist = dist.max((logits[id] - want).abs());
            }
        }
        println!("{name}: without the feature the logits differ by up to {dist:.5}");
        assert!(
            dist > 4.0 * worst.max(2e-3),
            "{name}: the feature moves logits by {dist}, not clearly more than our error {worst}"
        );
        let _ = std::fs::remove_file(&cpath);
    }
}

/// The options of golden `name` without the feature it exists to test (YaRN, rope_freqs,
/// soft-capping: Gemma 2's defaults of 50 and 30 are far above this model's magnitudes).
fn control(name: &str) -> Option<rocmforge_model::synth::SynthOptions> {
    let (mut o, _) = rocmforge_model::synth::golden_spec(name)?;
    match name {
        "llama-yarn" => o.extras.yarn = None,
        "llama-rope-freqs" => o.extras.rope_freqs = false,
        "gemma2" => o.extras.softcap = None,
        _ => return None,
    }
    Some(o)
}

fn vocab_dir() -> Option<PathBuf> {
    let d = std::env::var_os("ROCMFORGE_VOCAB_DIR").map(PathBuf::from);
    if d.is_none() {
        println!("skipped: ROCMFORGE_VOCAB_DIR not set (run `cargo xtask fetch-vocabs`)");
    }
    d
}

#[test]
#[serial]
fn synth_llama_matches_llama_cpp() {
    let Some(v) = vocab_dir() else { return };
    check("llama", &v);
}

#[test]
#[serial]
fn synth_mistral_matches_llama_cpp() {
    let Some(v) = vocab_dir() else { return };
    check("mistral", &v);
}

#[test]
#[serial]
fn synth_qwen2_matches_llama_cpp() {
    let Some(v) = vocab_dir() else { return };
    check("qwen2", &v);
}

#[test]
#[serial]
fn synth_qwen3_matches_llama_cpp() {
    let Some(v) = vocab_dir() else { return };
    check("qwen3", &v);
}

#[test]
#[serial]
fn synth_llama_yarn_matches_llama_cpp() {
    let Some(v) = vocab_dir() else { return };
    check("llama-yarn", &v);
}

#[test]
#[serial]
fn synth_llama_rope_freqs_matches_llama_cpp() {
    let Some(v) = vocab_dir() else { return };
    check("llama-rope-freqs", &v);
}

#[test]
#[serial]
fn synth_gemma2_softcap_matches_llama_cpp() {
    let Some(v) = vocab_dir() else { return };
    check("gemma2", &v);
}
