//! The newer families (Phi-3, gpt-oss, OLMo 2, Granite) on tiny synthetic files (`rocmforge_model::synth::family_spec`,
//! built-in vocabulary) against llama.cpp's CPU path on the same files
//! (`data/family_*.json`, from `scripts/family_goldens.sh`): the file regenerates bit for bit,
//! our top-20 logits after each prompt are within 1e-3 of llama.cpp's and the greedy tokens
//! are equal up to llama.cpp's first near-tie.
//!
//! With `ROCMFORGE_SYNTH_OUT` set the files are written there (for the goldens script).

mod common;
mod engine_support;

use std::path::PathBuf;

use rocmforge_model::arch::LogitsMode;
use rocmforge_model::placement::DeviceChoice;
use rocmforge_model::sampling::argmax;
use rocmforge_model::session::{Model, Session, SessionOptions};
use serial_test::serial;
use sha2::{Digest, Sha256};

use common::{check_top_k, gaps, golden, u32s};
use engine_support::{greedy_alone, greedy_together};

/// |ours - llama.cpp| allowed on the reference's top 20 logits.
const LOGIT_TOL: f32 = 1e-3;
/// Greedy steps are compared until llama.cpp's top-2 gap first falls below this: twice the
/// logit tolerance, so a flip above it can only mean a real difference (Granite's logits are
/// divided by 8, so its gaps are small).
const TIE: f64 = 2.0 * LOGIT_TOL as f64;

fn check(name: &str) {
    let opts = rocmforge_model::synth::family_spec(name).expect("known family");
    let dir = std::env::var_os("ROCMFORGE_SYNTH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("family-logits"));
    std::fs::create_dir_all(&dir).expect("output folder");
    let path = dir.join(format!("family-{name}.gguf"));
    rocmforge_model::synth::write(&opts, None, &path).expect("write synthetic model");
    let sha = format!(
        "{:x}",
        Sha256::digest(std::fs::read(&path).expect("read back"))
    );
    let g = golden(&format!("family_{name}.json"));
    assert_eq!(
        Some(sha.as_str()),
        g["model_sha256"].as_str(),
        "{name}: the synthetic file differs from the one the reference was made on"
    );
    let m = Model::load(&path, |_, _| {}).expect("load");
    let sopts = SessionOptions {
        n_ctx: g["n_ctx"].as_u64().expect("n_ctx") as usize,
        n_threads: 2,
        device: DeviceChoice::Cpu,
        ..SessionOptions::default()
    };
    let mut s = Session::new(&m, &sopts).expect("session");
    let (mut worst, mut compared) = (0f32, 0);
    for p in g["prompts"].as_array().expect("prompts") {
        s.reset();
        let mut logits = s
            .eval(&u32s(&p["prompt_ids"]), LogitsMode::Last)
            .expect("eval");
        worst = worst.max(check_top_k(name, p, &logits, LOGIT_TOL));
        let want = u32s(&p["greedy"]);
        let limit = gaps(p).iter().position(|&x| x < TIE).unwrap_or(want.len());
        for (step, &w) in want.iter().enumerate().take(limit) {
            assert_eq!(argmax(&logits), w, "{name}: greedy step {step}");
            compared += 1;
            logits = s.eval(&[w], LogitsMode::Last).expect("decode");
        }
    }
    println!("{name}: max |logit diff| over llama.cpp's top 20 {worst:.6}, {compared} greedy tokens compared");
    assert!(
        compared >= 8,
        "{name}: only {compared} greedy tokens before a near-tie"
    );
}

#[test]
#[serial]
fn phi3_matches_llama_cpp() {
    check("phi3");
}

#[test]
#[serial]
fn phi3_long_rope_factors_match_llama_cpp() {
    check("phi3-long");
}

#[test]
#[serial]
fn gpt_oss_matches_llama_cpp() {
    check("gpt-oss");
}

#[test]
#[serial]
fn olmo2_matches_llama_cpp() {
    check("olmo2");
}

#[test]
#[serial]
fn granite_matches_llama_cpp() {
    check("granite");
}

/// The paged attention of the batching engine (sinks and windows over block tables, LongRoPE
/// factors picked by the per-sequence context) gives each request the tokens it gets alone.
#[test]
#[serial]
fn families_in_the_batching_engine_give_the_tokens_of_each_alone() {
    use rocmforge_model::batch::{BatchEngine, EngineOptions};
    for name in ["phi3", "gpt-oss"] {
        let opts = rocmforge_model::synth::family_spec(name).expect("known family");
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("family-engine");
        std::fs::create_dir_all(&dir).expect("output folder");
        let path = dir.join(format!("family-{name}.gguf"));
        rocmforge_model::synth::write(&opts, None, &path).expect("write synthetic model");
        let tm = rocmforge_model::text::TextModel::load(&path, |_, _| {}).expect("load");
        let sopts = SessionOptions {
            n_ctx: 128,
            n_batch: 32,
            n_threads: 2,
            device: DeviceChoice::Cpu,
            ..SessionOptions::default()
        };
        let prompts: Vec<Vec<u32>> = [(1u32, 5usize), (2, 23), (3, 40)]
            .iter()
            .map(|&(seed, n)| {
                (0..n as u32)
                    .map(|i| (seed * 31 + i * 7) % 250 + 3)
                    .collect()
            })
            .collect();
        let n = 10;
        let want: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| greedy_alone(&tm, &sopts, p, n))
            .collect();
        let eopts = EngineOptions {
            session: sopts.clone(),
            max_seqs: 3,
            n_ctx_per_seq: 128,
            block_size: 16,
            kv_blocks: None,
            host_kv_limit: None,
            step_tokens: 32,
            prefix_cache: false,
            exact: true,
            ..EngineOptions::default()
        };
        let e = BatchEngine::start(std::sync::Arc::new(tm.model().clone()), eopts).expect("engine");
        assert_eq!(greedy_together(&e, &prompts, n, name), want, "{name}");
    }
}
