//! Gemma 3 270M end to end on the CPU against llama.cpp: last-position logits, 64-token greedy
//! continuations (`data/gemma3_greedy.json`) and perplexity (`data/gemma3_perplexity.json`),
//! all made by `scripts/make_goldens.py` from llama.cpp.
//!
//! On CPUs with AVX-512 VNNI (the goldens were made by llama.cpp's AVX-512 build) every kernel
//! sums in the order of the llama.cpp kernel that computes the same op (8-bit activation
//! rounding, f16 GELU table, rms_norm, rope, attention through f16 like the non-flash path,
//! Q5_0/Q8_0 tiles, Q4_K's repacked gemm/gemv, Q6_K's vec_dot and tiled matmul): the forward
//! pass is bit for bit llama.cpp's (checked layer by layer, prefill and decode; see
//! `data/README.md`), so the logits must match exactly and the greedy runs must agree for all
//! 64 steps, near-ties included ([`engine_tie`] is 0 there).
//!
//! Elsewhere (AVX2, portable) the kernels sum in other orders: the model amplifies last-bit
//! differences (an 8-bit activation rounding flips a few layers later) to logit differences of
//! up to ~0.9, runs may part at a near-tie (seen at llama.cpp gaps up to 0.44) and perplexities
//! differ by up to ~0.6%. Greedy runs are then compared up to the first step where llama.cpp's
//! top-2 logit gap is below 0.5. The test prints the counts for the 0.1 rule too.

mod common;

use std::path::PathBuf;

use rocmforge_model::arch::{KvType, LogitsMode};
use rocmforge_model::perplexity::{perplexity, PplOptions};
use rocmforge_model::sampling::argmax;
use rocmforge_model::session::{Session, SessionOptions};
use rocmforge_model::text::TextModel;
use serial_test::serial;

use common::{check_top_k, gaps, golden, u32s};

/// The project's near-tie rule (reported).
const NEAR_TIE: f64 = 0.1;

/// True when this CPU runs the kernels that follow llama.cpp's AVX-512 build bit for bit.
fn exact_path() -> bool {
    ggml_graph::quant::detected() == ggml_graph::quant::Simd::Avx512
}

/// The near-tie rule asserted (see the module docs): none on the exact path; 0.5 elsewhere,
/// where which steps part depends on every last-bit difference in the sums (equally valid
/// orders parted at llama.cpp gaps of 0.26, 0.37, 0.44 and, portable, 0.44).
fn engine_tie() -> f64 {
    if exact_path() {
        0.0
    } else {
        0.5
    }
}

/// Largest accepted |ours - llama.cpp| over the reference's top logits: float noise on the exact
/// path (measured 0), else the ~0.9 that other summation orders reach (a wrong position, mask
/// or rope base moves logits by several units).
fn logit_tol() -> f32 {
    if exact_path() {
        1e-4
    } else {
        1.5
    }
}

/// Largest accepted perplexity difference from llama.cpp, relative: exact on the exact path
/// (12.2238 both), else the ~0.6% that summation order alone moves it (AVX2 vs AVX-512).
fn ppl_tol() -> f64 {
    if exact_path() {
        1e-5
    } else {
        0.01
    }
}

/// Largest accepted |logit diff| between one batch and chunks of 8 of a 16-token prompt: every
/// matmul result then takes the same float steps in both (the kernels' orders depend on the
/// column count only through whole groups of four and the 8-column threshold, as llama.cpp's),
/// so the paths agree exactly.
const PATH_TOL: f32 = 1e-3;
/// Token by token, every matmul has one column and sums in llama.cpp's decode order, which
/// differs from its prefill order (Q4_K: groups of four columns vs single columns; Q5_K and
/// Q6_K: 8+ columns vs fewer): an 8-bit activation rounding flipped by one of them moves logits
/// by up to ~1.0 (measured max 0.92, KL 7e-3), while a wrong position, mask or cache slot
/// changes the next-token distribution itself. Bounds on KL(one batch || token by token) and on
/// max |logit diff|.
const TOKEN_PATH_KL: f64 = 0.05;
const TOKEN_PATH_MAX: f32 = 1.5;

fn load() -> Option<TextModel> {
    let Some(path) = std::env::var_os("ROCMFORGE_TEST_MODEL") else {
        println!("skipped: ROCMFORGE_TEST_MODEL not set");
        return None;
    };
    Some(TextModel::load(&path, |_, _| {}).expect("load the test model"))
}

fn session(tm: &TextModel, n_ctx: usize) -> Session {
    let opts = SessionOptions {
        n_ctx,
        n_threads: 2,
        ..SessionOptions::default()
    };
    Session::new(tm.model(), &opts).expect("session")
}

#[test]
#[serial]
fn greedy_and_logits_match_llama_cpp() {
    let Some(tm) = load() else { return };
    let g = golden("gemma3_greedy.json");
    let prompts = g["prompts"].as_array().expect("prompts");
    assert!(prompts.len() >= 8, "need at least 8 prompts");
    let mut s = session(&tm, 512);
    let mut full = 0;
    let mut full_01 = 0;
    let mut agree_01 = 0;
    let mut compared_tokens = 0;
    let mut worst_logit = 0f32;
    for p in prompts {
        let text = p["text"].as_str().expect("text");
        let ids = u32s(&p["prompt_ids"]);
        let special = p["parse_special"].as_bool().unwrap_or(false);
        assert_eq!(
            tm.tokenizer().encode(text, true, special),
            ids,
            "prompt ids of {text:?}"
        );
        let want = u32s(&p["greedy"]);
        let gaps = gaps(p);
        s.reset();
        let mut logits = s.eval(&ids, LogitsMode::Last).expect("prompt eval");
        worst_logit = worst_logit.max(check_top_k(&format!("{text:?}"), p, &logits, logit_tol()));
        let tie = |t: f64| gaps.iter().position(|&gap| gap < t).unwrap_or(want.len());
        let (limit, limit_01) = (tie(engine_tie()), tie(NEAR_TIE));
        let mut first_diff = None;
        for (step, &w) in want.iter().enumerate() {
            let got = argmax(&logits);
            if got != w {
                first_diff = Some(step);
                break;
            }
            if step + 1 < want.len() {
                logits = s.eval(&[got], LogitsMode::Last).expect("decode");
            }
        }
        let equal = first_diff.unwrap_or(want.len());
        assert!(
            equal >= limit,
            "{text:?}: greedy differs at step {equal} (llama.cpp gap {}), before the first \
             step with a gap under {} ({limit})",
            gaps[equal],
            engine_tie()
        );
        compared_tokens += limit;
        full += usize::from(limit == want.len());
        full_01 += usize::from(equal >= limit_01 && limit_01 == want.len());
        agree_01 += usize::from(equal >= limit_01);
        println!(
            "{:<36} equal for {equal:>2}/{} steps; gap<{} at {limit:>2}, gap<{NEAR_TIE} at {limit_01:>2}{}",
            format!("{text:?}").chars().take(36).collect::<String>(),
            want.len(),
            engine_tie(),
            first_diff.map(|d| format!(", parted at llama.cpp gap {}", gaps[d])).unwrap_or_default()
        );
    }
    println!(
        "greedy: {compared_tokens} tokens compared equal over {} prompts, {full} compared in \
         full (gap rule {}); with the {NEAR_TIE} rule {agree_01} prompts agree up to \
         the tie, {full_01} over all 64 tokens; max |logit diff| over reference top-k: \
         {worst_logit:.4}",
        prompts.len(),
        engine_tie()
    );
}

#[test]
#[serial]
fn perplexity_within_one_percent_of_llama_cpp() {
    let Some(tm) = load() else { return };
    let g = golden("gemma3_perplexity.json");
    let n_ctx = g["n_ctx"].as_u64().expect("n_ctx") as usize;
    let want = g["ppl"].as_f64().expect("ppl");
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(g["text"].as_str().expect("text file"));
    let text = std::fs::read_to_string(&path).expect("perplexity text");
    let tokens = tm.tokenizer().encode(&text, true, false);
    let mut s = session(&tm, n_ctx);
    let opts = PplOptions {
        n_ctx,
        max_chunks: None,
        bos: tm.bos_for_chunks(),
    };
    let r = perplexity(&mut s, &tokens, &opts, |_, _, _| {}).expect("perplexity");
    if let Some(n) = g["n_chunks"].as_u64() {
        assert_eq!(r.chunks as u64, n, "number of windows");
    }
    let rel = (r.ppl - want).abs() / want;
    println!(
        "perplexity: ours {:.4}, llama.cpp {want:.4} ({:+.3}%), {} windows of {n_ctx}",
        r.ppl,
        (r.ppl - want) / want * 100.0,
        r.chunks
    );
    // llama-perplexity with flash attention off (the path our CPU attention follows). A
    // systematic error (before the numerics fixes: -0.84% against the flash-attention
    // reference, of which 0.31% was flash attention) shows as more than the bound.
    assert!(
        rel < ppl_tol(),
        "perplexity {} vs llama.cpp {want} (bound {})",
        r.ppl,
        ppl_tol()
    );
}

#[test]
#[serial]
fn chunked_prefill_equals_one_batch() {
    let Some(tm) = load() else { return };
    let ids = tm
        .encode(
            "The quick brown fox jumps over the lazy dog. It was a sunny day",
            true,
        )
        .expect("encode");
    assert_eq!(ids.len(), 16, "two whole chunks of 8");
    let whole = session(&tm, 64).eval(&ids, LogitsMode::Last).expect("eval");
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch: 8,
        n_threads: 2,
        ..SessionOptions::default()
    };
    let mut s = Session::new(tm.model(), &opts).expect("session");
    let chunked = s.eval(&ids, LogitsMode::Last).expect("eval");
    let mut one_by_one = session(&tm, 64);
    let mut last = Vec::new();
    for &t in &ids {
        last = one_by_one.eval(&[t], LogitsMode::Last).expect("eval");
    }
    assert_eq!(argmax(&whole), argmax(&chunked));
    assert_eq!(argmax(&whole), argmax(&last));
    let (_, chunk_max) = path_diff(&whole, &chunked);
    let (tok_kl, tok_max) = path_diff(&whole, &last);
    println!(
        "vs one batch: chunks of 8 max |logit diff| {chunk_max:.4}; token by token KL \
         {tok_kl:.2e}, max |logit diff| {tok_max:.4}"
    );
    assert!(chunk_max < PATH_TOL, "chunks of 8: {chunk_max}");
    assert!(
        tok_kl < TOKEN_PATH_KL && tok_max < TOKEN_PATH_MAX,
        "token by token: KL {tok_kl} max |logit diff| {tok_max}"
    );
}

/// KL(softmax(a) || softmax(b)) and max |a - b| of two logit rows.
fn path_diff(a: &[f32], b: &[f32]) -> (f64, f32) {
    let log_softmax = |x: &[f32]| -> Vec<f64> {
        let m = x.iter().fold(f32::MIN, |m, &v| m.max(v)) as f64;
        let lse = x.iter().map(|&v| (v as f64 - m).exp()).sum::<f64>().ln() + m;
        x.iter().map(|&v| v as f64 - lse).collect()
    };
    let (la, lb) = (log_softmax(a), log_softmax(b));
    let kl = la.iter().zip(&lb).map(|(&p, &q)| p.exp() * (p - q)).sum();
    let max = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    (kl, max)
}

#[test]
#[serial]
fn same_seed_same_text_and_context_limit() {
    let Some(tm) = load() else { return };
    let run = |seed: u64| {
        let mut s = session(&tm, 48);
        let mut sampler =
            rocmforge_model::sampling::Sampler::new(rocmforge_model::sampling::SamplerConfig {
                temperature: 1.0,
                seed,
                ..Default::default()
            });
        let ids = tm.encode("Once upon a time", true).expect("encode");
        let opts = rocmforge_model::generate::GenerateOptions {
            max_tokens: 100,
            stop_strings: Vec::new(),
            ignore_eog: true,
        };
        rocmforge_model::generate::generate(&mut s, &tm, &mut sampler, &ids, &opts, |_| {})
            .expect("generate")
    };
    let a = run(7);
    let b = run(7);
    assert_eq!(a.tokens, b.tokens);
    // 48 positions: the prompt plus generated tokens stop at the context size.
    assert_eq!(a.stop, rocmforge_model::generate::StopReason::ContextFull);
    assert_eq!(a.prompt_tokens + a.tokens.len(), 48 + 1);
    let mut s = session(&tm, 8);
    let err = s.eval(&[2; 9], LogitsMode::Last).unwrap_err();
    assert!(
        matches!(err, rocmforge_model::ModelError::ContextFull { .. }),
        "{err}"
    );
    let err = s.eval(&[u32::MAX], LogitsMode::Last).unwrap_err();
    assert!(
        matches!(err, rocmforge_model::ModelError::BadToken { .. }),
        "{err}"
    );
}

/// Greedy tokens with a q8_0 KV cache equal those with the f16 cache up to the first step where
/// the f16 run's two best logits are within [`Q8_TIE`] (a q8_0 cache moves Gemma's logits by
/// a few tenths; llama.cpp's `-ctk q8_0 -ctv q8_0` rounds the same rows the same way).
#[test]
#[serial]
fn q8_0_kv_greedy_equals_f16_until_a_near_tie() {
    const Q8_TIE: f32 = 0.5;
    let Some(tm) = load() else {
        return;
    };
    let greedy = |kv: KvType, prompt: &[u32], n: usize| {
        let opts = SessionOptions {
            n_ctx: 128,
            n_threads: 2,
            kv_type: kv,
            ..SessionOptions::default()
        };
        let mut s = Session::new(tm.model(), &opts).expect("session");
        assert_eq!(s.device_plan().kv.dtype, kv);
        let mut logits = s.eval(prompt, LogitsMode::Last).expect("prompt");
        let (mut toks, mut gaps) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let t = argmax(&logits);
            let mut sorted = logits.clone();
            sorted.sort_unstable_by(|a, b| b.total_cmp(a));
            gaps.push(sorted[0] - sorted[1]);
            toks.push(t);
            logits = s.eval(&[t], LogitsMode::Last).expect("step");
        }
        (toks, gaps)
    };
    let mut compared = 0;
    for text in [
        "The capital of France is",
        "def fibonacci(n):\n",
        "Once upon a time, in a small village by the sea,",
    ] {
        let prompt = tm.encode(text, true).expect("encode");
        let (f16, gaps) = greedy(KvType::F16, &prompt, 24);
        let (q8, _) = greedy(KvType::Q8_0, &prompt, 24);
        let n = gaps.iter().position(|&g| g < Q8_TIE).unwrap_or(gaps.len());
        assert_eq!(
            q8[..n],
            f16[..n],
            "{text:?}: q8_0 KV parts from f16 before a near-tie"
        );
        compared += n;
    }
    println!("{compared} greedy steps compared (q8_0 vs f16 KV)");
    assert!(compared >= 5, "too few steps before a near-tie: {compared}");
}

/// The placement's weight accounting on the real file: every tensor counted once, each of the
/// 18 layers non-empty, and the whole model fits a GiB.
#[test]
fn placement_counts_every_weight_of_the_real_file() {
    use rocmforge_model::placement::{fit_layers, weights_by_layer, Needs};
    let Some(path) = std::env::var_os("ROCMFORGE_TEST_MODEL") else {
        println!("skipped: ROCMFORGE_TEST_MODEL not set");
        return;
    };
    let file = gguf::GgufFile::open(&path).expect("open the test model");
    let sizes = file.tensors().iter().map(|t| (t.name.as_str(), t.size));
    let (layers, other) = weights_by_layer(sizes, 18);
    let total: u64 = file.tensors().iter().map(|t| t.size).sum();
    assert_eq!(layers.len(), 18, "Gemma 3 270M has 18 layers");
    assert!(layers.iter().all(|&l| l > 0));
    assert_eq!(layers.iter().sum::<u64>() + other, total);
    // Tensor data is the file minus its header, less at most the data-section padding.
    let data = file.file_size() - file.data_offset();
    assert!(
        total <= data && data - total < 32 * file.tensors().len() as u64,
        "{total} vs {data}"
    );
    let n = Needs {
        layer_weights: layers,
        other_weights: other,
        ..Needs::default()
    };
    assert_eq!(fit_layers(&n, 1 << 30), 19);
}
