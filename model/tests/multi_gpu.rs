//! A model split by layer over two GPUs against the same model on one GPU: a synthetic llama
//! decodes 64 greedy tokens with its layers on two GPUs (even split, a `--tensor-split 3,1` with
//! the head on the first GPU, and half the layers on the CPU), and the batching engine runs
//! several prompts over two GPUs; each must give the one-GPU tokens up to the first near-tie
//! (top-2 logit gap below [`TIE`]) and logits close to the one-GPU logits.
//!
//! The same with a tensor split (`--split-mode tensor`: heads and feed-forward columns divided
//! between the GPUs) on synthetic llama, qwen2 (biases) and gemma3 (head size 256, extra norms)
//! models whose head groups fill whole Q4_K blocks, plus perplexity within 0.2% of one GPU's.
//!
//! A tensor split sums the GPUs' partial results by NCCL/RCCL all-reduces where the library
//! loads (it must say so in its device plan), and by peer copies to the main GPU when told to.
//!
//! Where every GPU gets heads and feed-forward columns, the tensor split runs as ranks (a
//! scheduler per GPU, no copies between them, decode steps replayed from captured graphs with the
//! all-reduces inside); the tiny llama and the peer-copy case take the one-scheduler path.
//!
//! A model file of a real shape (`ROCMFORGE_TP_MODEL`, e.g. `rocmforge synth --preset
//! llama3-8b`) runs in both split modes against one GPU too, where the variable is set.
//!
//! "Two GPUs" is every visible GPU (`CUDA_VISIBLE_DEVICES`/`HIP_VISIBLE_DEVICES` limit them):
//! the same tests prove four GPUs on a 4-GPU machine. Skipped (with the reason printed) below
//! two GPUs, even where `ROCMFORGE_REQUIRE_GPU=1`; `ROCMFORGE_REQUIRE_GPUS=2` makes a missing
//! second GPU a failure.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rocmforge_model::arch::LogitsMode;
use rocmforge_model::batch::{BatchEngine, EngineOptions, Event, Request};
use rocmforge_model::gpus::{GpuSelection, SplitMode};
use rocmforge_model::perplexity::{perplexity, PplOptions};
use rocmforge_model::placement::DeviceChoice;
use rocmforge_model::sampling::argmax;
use rocmforge_model::session::{Model, Session, SessionOptions};
use serial_test::serial;

/// Greedy steps are compared until the one-GPU top-2 gap first falls below this.
const TIE: f32 = 0.05;
/// Tokens decoded per run.
const STEPS: usize = 64;
/// Largest |logit difference| allowed between one and two GPUs (the same kernels on the same
/// activations: differences come only from launch grouping at the split, far below this).
const LOGIT_TOL: f32 = 0.02;

fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("multi-gpu");
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn synth(arch: &str) -> Model {
    let path = scratch_dir().join(format!("synth-{arch}.gguf"));
    rocmforge_model::synth::write_model(arch, &path, 7).expect("write synthetic model");
    Model::load(&path, |_, _| {}).expect("load")
}

/// Two GPUs with built kernels, or `false` after printing why the test skips.
#[cfg(feature = "hip")]
fn have_two_gpus() -> bool {
    if hip_ffi::testing::or_skip(ggml_graph::hip::HipDevice::new(0)).is_none() {
        return false;
    }
    hip_ffi::testing::need_gpus(ggml_graph::hip::device_count(), 2).is_some()
}

#[cfg(not(feature = "hip"))]
fn have_two_gpus() -> bool {
    hip_ffi::testing::skip::<()>("built without the `hip` feature").is_some()
}

/// Every visible GPU.
#[cfg(feature = "hip")]
fn all_gpus() -> Vec<usize> {
    (0..ggml_graph::hip::device_count()).collect()
}

#[cfg(not(feature = "hip"))]
fn all_gpus() -> Vec<usize> {
    vec![0, 1]
}

/// `shares` for the first GPUs, 1 for each further one.
fn shares(first: &[f64]) -> Vec<f64> {
    let n = all_gpus().len().max(first.len());
    (0..n)
        .map(|k| first.get(k).copied().unwrap_or(1.0))
        .collect()
}

fn one_gpu() -> SessionOptions {
    SessionOptions {
        n_ctx: 256,
        n_batch: 64,
        n_threads: 2,
        device: DeviceChoice::Gpu,
        gpus: GpuSelection {
            split_mode: Some(SplitMode::None),
            ..GpuSelection::default()
        },
        ..SessionOptions::default()
    }
}

fn two_gpus(sel: GpuSelection, ngl: Option<usize>) -> SessionOptions {
    SessionOptions {
        gpus: GpuSelection {
            split_mode: Some(SplitMode::Layer),
            devices: Some(all_gpus()),
            ..sel
        },
        n_gpu_layers: ngl,
        ..one_gpu()
    }
}

struct Run {
    tokens: Vec<u32>,
    gaps: Vec<f32>,
    logits: Vec<Vec<f32>>,
}

fn top2_gap(l: &[f32]) -> f32 {
    let (mut a, mut b) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
    for &x in l {
        if x > a {
            b = a;
            a = x;
        } else if x > b {
            b = x;
        }
    }
    a - b
}

fn greedy(s: &mut Session, prompt: &[u32]) -> Run {
    s.reset();
    let mut logits = s.eval(prompt, LogitsMode::Last).expect("prompt");
    let mut run = Run {
        tokens: Vec::new(),
        gaps: Vec::new(),
        logits: Vec::new(),
    };
    for _ in 0..STEPS {
        let t = argmax(&logits);
        run.tokens.push(t);
        run.gaps.push(top2_gap(&logits));
        run.logits.push(std::mem::take(&mut logits));
        logits = s.eval(&[t], LogitsMode::Last).expect("decode");
    }
    run
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// `got` equals `want` up to the first near-tie, with logits within [`LOGIT_TOL`] while the
/// inputs are the same.
fn compare(what: &str, want: &Run, got: &Run) {
    compare_within(what, want, got, LOGIT_TOL);
}

/// [`compare`] with logits within `tol`.
fn compare_within(what: &str, want: &Run, got: &Run, tol: f32) {
    let equal = want
        .tokens
        .iter()
        .zip(&got.tokens)
        .take_while(|(a, b)| a == b)
        .count();
    let limit = want
        .gaps
        .iter()
        .position(|&g| g < TIE)
        .unwrap_or(want.tokens.len());
    let same_inputs = (equal + 1).min(want.logits.len());
    let worst = (0..same_inputs)
        .map(|i| max_diff(&want.logits[i], &got.logits[i]))
        .fold(0.0, f32::max);
    println!("{what}: tokens equal for {equal}/{STEPS} (near-tie limit {limit}); max |logit diff| {worst}");
    assert!(worst <= tol, "{what}: logits differ by {worst}");
    assert!(
        equal >= limit,
        "{what}: differs at step {equal} before the first near-tie at {limit}\n1 GPU  {:?}\n2 GPUs {:?}",
        want.tokens,
        got.tokens
    );
}

fn prompt(m: &Model) -> Vec<u32> {
    let n = m.config().n_vocab as u32;
    [1u32, 17, 345, 2, 99, 1000, 7, 512]
        .iter()
        .map(|t| t % n)
        .collect()
}

#[test]
#[serial]
fn synthetic_llama_on_two_gpus_equals_one_gpu() {
    if !have_two_gpus() {
        return;
    }
    let m = synth("llama");
    let n_layer = m.config().n_layer;
    let p = prompt(&m);
    let mut one = Session::new(&m, &one_gpu()).expect("one-GPU session");
    println!("{}", one.device_plan());
    assert!(one.device_plan().gpus.is_empty());
    let want = greedy(&mut one, &p);
    // Whole-prompt logits (what perplexity reads) from one GPU.
    one.reset();
    let all_one = one.eval(&p, LogitsMode::All).expect("all logits");
    drop(one);

    let cases = [
        ("even split", GpuSelection::default(), None),
        (
            "--tensor-split 3,1(,1..) --main-gpu 0",
            GpuSelection {
                tensor_split: Some(shares(&[3.0, 1.0])),
                main_gpu: Some(0),
                ..GpuSelection::default()
            },
            None,
        ),
        (
            "half the layers on the CPU",
            GpuSelection::default(),
            Some(n_layer / 2),
        ),
    ];
    let n_gpus = all_gpus().len();
    for (what, sel, ngl) in cases {
        let mut two = Session::new(&m, &two_gpus(sel, ngl)).expect("two-GPU session");
        let plan = two.device_plan().clone();
        println!("{what}: {plan}");
        assert_eq!(plan.gpus.len(), n_gpus, "{what}: {plan}");
        // An even split of the 2-layer model gives two GPUs a layer; a 3:1 split or one layer
        // on the GPUs may leave the second GPU without one (as llama.cpp's rounding does).
        let used = plan.gpus.iter().filter(|g| !g.layers.is_empty()).count();
        if what == "even split" {
            assert_eq!(used, n_layer.min(n_gpus), "{what}: {plan}");
        } else {
            assert!(used >= 1, "{what}: {plan}");
        }
        for w in plan.gpus.windows(2) {
            assert_eq!(
                w[0].layers.end, w[1].layers.start,
                "{what}: consecutive layers"
            );
        }
        let gpu_layers: usize = plan.gpus.iter().map(|g| g.layers.len()).sum();
        assert_eq!(gpu_layers, ngl.unwrap_or(n_layer), "{what}: {plan}");
        let got = greedy(&mut two, &p);
        compare(what, &want, &got);
        let mem = two.device_memory().expect("GPU memory");
        println!("{what}: {mem}");
        if used == 2 {
            assert!(mem.copies > 0, "{what}: activations cross between the GPUs");
        }
        if ngl.is_none() {
            two.reset();
            let all_two = two.eval(&p, LogitsMode::All).expect("all logits");
            let d = max_diff(&all_one, &all_two);
            assert!(d <= LOGIT_TOL, "{what}: whole-prompt logits differ by {d}");
        }
    }
}

fn engine_tokens(
    m: &Model,
    session: SessionOptions,
    prompts: &[Vec<u32>],
    n: usize,
) -> Vec<Vec<u32>> {
    let opts = EngineOptions {
        session,
        max_seqs: 4,
        n_ctx_per_seq: 128,
        block_size: 16,
        step_tokens: 64,
        ..EngineOptions::default()
    };
    let e = BatchEngine::start(Arc::new(m.clone()), opts).expect("engine");
    println!("engine: {}", e.device_plan());
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            e.submit_channel(Request::greedy(p.clone(), n))
                .expect("submit")
                .1
        })
        .collect();
    rxs.iter()
        .enumerate()
        .map(|(i, rx)| {
            let mut toks = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(300)).expect("event") {
                    Event::Token { id, .. } => toks.push(id),
                    Event::Done { .. } => break toks,
                    Event::Error(err) => panic!("prompt {i}: {err}"),
                }
            }
        })
        .collect()
}

#[test]
#[serial]
fn batch_engine_on_two_gpus_equals_one_gpu() {
    if !have_two_gpus() {
        return;
    }
    let m = synth("llama");
    let base = prompt(&m);
    let prompts: Vec<Vec<u32>> = (0..4u32)
        .map(|i| {
            let mut p = base.clone();
            p.push((i * 31 + 5) % m.config().n_vocab as u32);
            p
        })
        .collect();
    let n = 16;
    let want = engine_tokens(&m, one_gpu(), &prompts, n);
    let got = engine_tokens(&m, two_gpus(GpuSelection::default(), None), &prompts, n);
    // Each prompt's own greedy tokens, checked against its one-GPU session run for near-ties.
    for (i, p) in prompts.iter().enumerate() {
        if want[i] == got[i] {
            continue;
        }
        let mut s = Session::new(&m, &one_gpu()).expect("session");
        let run = greedy(&mut s, p);
        let equal = want[i]
            .iter()
            .zip(&got[i])
            .take_while(|(a, b)| a == b)
            .count();
        assert!(
            run.gaps[equal] < TIE,
            "prompt {i}: two GPUs differ at step {equal} (gap {})\n1 GPU  {:?}\n2 GPUs {:?}",
            run.gaps[equal],
            want[i],
            got[i]
        );
    }
}

/// Largest |logit difference| allowed between one GPU and a tensor split: the partial sums of
/// the split products add in another order than the whole products' (float rounding only; seen
/// on H200s: 0.031 with two GPUs, 0.053 with four).
const TENSOR_LOGIT_TOL: f32 = 0.1;

/// A synthetic `arch` model (Q4_K_M) of 4 layers whose KV-head groups fill whole 256-value
/// blocks of the attention output (8B-like: 4 query heads of 128 per KV head; gemma3: 2 of
/// 256), with a KV head for each GPU (at least 2), so a tensor split divides heads as on the
/// real shapes; a feed-forward width of 11 blocks splits unevenly.
fn synth_split_shape(arch: &str) -> Model {
    let kv = all_gpus().len().max(2) as u64;
    let path = scratch_dir().join(format!("synth-tp-{arch}-{kv}.gguf"));
    let mut o = rocmforge_model::synth::SynthOptions::parse(arch, "tiny", "q4_k_m", 11)
        .expect("synth options");
    o.shape.n_embd = 512 * kv;
    o.shape.n_layer = 4;
    o.shape.n_ff = 2816;
    if arch == "gemma3" {
        (o.shape.n_head, o.shape.n_head_kv, o.shape.head_dim) = (2 * kv, kv, 256);
    } else {
        (o.shape.n_head, o.shape.n_head_kv, o.shape.head_dim) = (4 * kv, kv, 128);
    }
    rocmforge_model::synth::write(&o, None, &path).expect("write synthetic model");
    Model::load(&path, |_, _| {}).expect("load")
}

/// Whether the platform's collective library (NCCL or RCCL) loads here.
fn have_collectives() -> bool {
    let opts = hip_ffi::NcclOptions::default();
    [hip_ffi::Platform::Nvidia, hip_ffi::Platform::Amd]
        .into_iter()
        .any(|p| hip_ffi::Nccl::load(p, &opts).is_ok())
}

fn tensor_gpus(sel: GpuSelection) -> SessionOptions {
    SessionOptions {
        gpus: GpuSelection {
            split_mode: Some(SplitMode::Tensor),
            devices: Some(all_gpus()),
            ..sel
        },
        ..one_gpu()
    }
}

/// Perplexity of `s` over `tokens` in windows of `n_ctx`.
fn ppl_of(s: &mut Session, tokens: &[u32], n_ctx: usize) -> f64 {
    let opts = PplOptions {
        n_ctx,
        max_chunks: None,
        bos: None,
    };
    perplexity(s, tokens, &opts, |_, _, _| {})
        .expect("perplexity")
        .ppl
}

/// `len` tokens of a fixed pseudo-random stream whose period is `period` (0: none).
fn token_stream(n_vocab: usize, len: usize, period: usize) -> Vec<u32> {
    (0..len as u64)
        .map(|i| if period == 0 { i } else { i % period as u64 })
        .map(|i| ((i * 2654435761 + 12345) % n_vocab as u64) as u32)
        .collect()
}

/// Perplexity of a fixed pseudo-random token stream in windows of 64.
fn ppl(s: &mut Session, n_vocab: usize) -> f64 {
    ppl_of(s, &token_stream(n_vocab, 256, 0), 64)
}

#[test]
#[serial]
fn synthetic_models_in_a_tensor_split_equal_one_gpu() {
    if !have_two_gpus() {
        return;
    }
    let models = [
        ("llama", synth_split_shape("llama")),
        ("qwen2", synth_split_shape("qwen2")),
        ("gemma3", synth_split_shape("gemma3")),
        // Two query heads of 64 per KV head: half a Q4_K block, so one GPU takes all heads
        // and the other only feed-forward columns (two GPUs only: more would get nothing).
        ("tiny llama", synth("llama")),
    ];
    for (name, m) in &models {
        if *name == "tiny llama" && all_gpus().len() > 2 {
            continue;
        }
        let p = prompt(m);
        let n_vocab = m.config().n_vocab;
        let mut one = Session::new(m, &one_gpu()).expect("one-GPU session");
        let want = greedy(&mut one, &p);
        one.reset();
        let all_one = one.eval(&p, LogitsMode::All).expect("all logits");
        one.reset();
        let ppl_one = ppl(&mut one, n_vocab);
        drop(one);
        let cases = [
            ("even", GpuSelection::default()),
            (
                "--tensor-split 3,1(,1..) --main-gpu 1",
                GpuSelection {
                    tensor_split: Some(shares(&[3.0, 1.0])),
                    main_gpu: Some(1),
                    ..GpuSelection::default()
                },
            ),
            (
                "even, NCCL/RCCL for every all-reduce",
                GpuSelection {
                    collectives: ggml_graph::CollectiveOptions {
                        all_reduce: ggml_graph::AllReduceKind::Nccl,
                        ..Default::default()
                    },
                    ..GpuSelection::default()
                },
            ),
            (
                "even, peer copies",
                GpuSelection {
                    collectives: ggml_graph::CollectiveOptions {
                        off: true,
                        ..Default::default()
                    },
                    ..GpuSelection::default()
                },
            ),
        ];
        for (how, sel) in cases {
            let what = format!("{name}, tensor split {how}");
            let off = sel.collectives.off;
            let sel_off = |reason: &str| {
                assert_eq!(off, reason.contains("collectives off"), "{reason}");
                off
            };
            let mut two = Session::new(m, &tensor_gpus(sel)).expect("tensor-split session");
            let plan = two.device_plan().clone();
            println!("{what}: {plan}");
            assert_eq!(plan.gpus.len(), all_gpus().len(), "{what}: {plan}");
            assert!(plan.reason.contains("split mode tensor"), "{what}: {plan}");
            // Ranks where every GPU gets heads (evenly, not the tiny llama) and a collective
            // sums.
            let ranked = plan.reason.contains("ranks");
            if how.starts_with("even") {
                assert_eq!(
                    ranked,
                    *name != "tiny llama" && !off && have_collectives(),
                    "{what}: {plan}"
                );
            }
            let collective = !sel_off(&plan.reason) && have_collectives();
            assert_eq!(
                plan.reason.contains("all-reduce"),
                collective,
                "{what}: {plan}"
            );
            for g in &plan.gpus {
                assert_eq!(g.layers.len(), m.config().n_layer, "{what}: {plan}");
                assert!(g.estimate.weights > 0, "{what}: {plan}");
            }
            let got = greedy(&mut two, &p);
            compare_within(&what, &want, &got, TENSOR_LOGIT_TOL);
            let mem = two.device_memory().expect("GPU memory");
            println!("{what}: {mem}");
            if ranked {
                assert_eq!(mem.copies, 0, "{what}: ranks copy nothing between GPUs");
                assert!(
                    two.has_gpu_graph(),
                    "{what}: decode steps replay a captured graph with the all-reduces inside"
                );
            } else {
                assert!(
                    mem.copies > 0,
                    "{what}: partial results cross between the GPUs"
                );
            }
            two.reset();
            let all_two = two.eval(&p, LogitsMode::All).expect("all logits");
            let d = max_diff(&all_one, &all_two);
            assert!(
                d <= TENSOR_LOGIT_TOL,
                "{what}: whole-prompt logits differ by {d}"
            );
            two.reset();
            let ppl_two = ppl(&mut two, n_vocab);
            let rel = (ppl_two - ppl_one).abs() / ppl_one;
            println!("{what}: perplexity {ppl_two:.4} vs {ppl_one:.4} on one GPU ({rel:.2e})");
            assert!(rel <= 0.002, "{what}: perplexity {ppl_two} vs {ppl_one}");
        }
    }
}

#[test]
#[serial]
fn a_tensor_split_refuses_what_it_cannot_cut() {
    if !have_two_gpus() {
        return;
    }
    let path = scratch_dir().join("synth-tp-moe.gguf");
    let o = rocmforge_model::synth::SynthOptions::parse("mixtral", "tiny-moe", "q8_0", 3)
        .expect("synth options");
    rocmforge_model::synth::write(&o, None, &path).expect("write");
    let m = Model::load(&path, |_, _| {}).expect("load");
    let e = Session::new(&m, &tensor_gpus(GpuSelection::default()))
        .expect_err("a mixture of experts in a tensor split")
        .to_string();
    assert!(e.contains("mixture-of-experts"), "{e}");
}

#[test]
#[serial]
fn batch_engine_in_a_tensor_split_equals_one_gpu() {
    if !have_two_gpus() {
        return;
    }
    for arch in ["llama", "gemma3"] {
        let m = synth_split_shape(arch);
        let base = prompt(&m);
        let prompts: Vec<Vec<u32>> = (0..4u32)
            .map(|i| {
                let mut p = base.clone();
                p.push((i * 31 + 5) % m.config().n_vocab as u32);
                p
            })
            .collect();
        let n = 16;
        let want = engine_tokens(&m, one_gpu(), &prompts, n);
        let got = engine_tokens(&m, tensor_gpus(GpuSelection::default()), &prompts, n);
        for (i, p) in prompts.iter().enumerate() {
            if want[i] == got[i] {
                continue;
            }
            let mut s = Session::new(&m, &one_gpu()).expect("session");
            let run = greedy(&mut s, p);
            let equal = want[i]
                .iter()
                .zip(&got[i])
                .take_while(|(a, b)| a == b)
                .count();
            assert!(
                run.gaps[equal] < TIE,
                "{arch} prompt {i}: the tensor split differs at step {equal} (gap {})\n1 GPU  {:?}\n2 GPUs {:?}",
                run.gaps[equal],
                want[i],
                got[i]
            );
        }
    }
}

/// Perplexity as `rocmforge perplexity -c 512` measures it (sessions of batch 512), over a
/// text-like stream (an 11-token sentence repeated) in two windows of 512: a model of a real shape scores its later
/// windows' tokens from a long context, where the splits' sums must hold.
fn text_ppl(s: &mut Session, n_vocab: usize) -> f64 {
    ppl_of(s, &token_stream(n_vocab, 1024, 11), 512)
}

/// Largest |logit difference| allowed for a model file of a real shape against one GPU running
/// the same per-op kernels: 32 layers of random weights amplify the partial sums' rounding (0.51
/// seen on four H200s against the persistent decode kernel); a wrong sum moves logits by units.
const FILE_LOGIT_TOL: f32 = 0.5;

/// A model of a real shape (the Llama-3-8B shape: `rocmforge synth --preset llama3-8b`) named by
/// `ROCMFORGE_TP_MODEL`: both split modes over every visible GPU give one GPU's greedy tokens up
/// to the first near-tie and its perplexity within 0.2%.
#[test]
#[serial]
fn a_model_file_in_both_splits_equals_one_gpu() {
    if !have_two_gpus() {
        return;
    }
    let Some(path) = std::env::var_os("ROCMFORGE_TP_MODEL") else {
        println!("skipped: ROCMFORGE_TP_MODEL not set");
        return;
    };
    let m = Model::load(&path, |_, _| {}).expect("load ROCMFORGE_TP_MODEL");
    let p = prompt(&m);
    let n_vocab = m.config().n_vocab;
    // The splits run per-op kernels: one GPU runs them too (no persistent decode kernel).
    let per_op = SessionOptions {
        gpu_stack: false,
        n_ctx: 512,
        n_batch: 512,
        ..one_gpu()
    };
    let mut one = Session::new(&m, &per_op).expect("one-GPU session");
    let want = greedy(&mut one, &p);
    one.reset();
    let ppl_one = text_ppl(&mut one, n_vocab);
    drop(one);
    let n = all_gpus().len();
    for (how, opts) in [
        ("tensor split", tensor_gpus(GpuSelection::default())),
        ("layer split", two_gpus(GpuSelection::default(), None)),
    ] {
        let what = format!("{} on {n} GPUs, {how}", path.to_string_lossy());
        let opts = SessionOptions {
            gpu_stack: false,
            n_ctx: 512,
            n_batch: 512,
            ..opts
        };
        let mut s = Session::new(&m, &opts).expect("split session");
        let plan = s.device_plan().clone();
        println!("{what}: {plan}");
        assert_eq!(plan.gpus.len(), n, "{what}: {plan}");
        let got = greedy(&mut s, &p);
        compare_within(&what, &want, &got, FILE_LOGIT_TOL);
        s.reset();
        let ppl_s = text_ppl(&mut s, n_vocab);
        let rel = (ppl_s - ppl_one).abs() / ppl_one;
        println!("{what}: perplexity {ppl_s:.4} vs {ppl_one:.4} on one GPU ({rel:.2e})");
        assert!(rel <= 0.002, "{what}: perplexity {ppl_s} vs {ppl_one}");
    }
}
