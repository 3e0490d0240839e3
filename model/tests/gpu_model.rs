//! Whole-model runs on the GPU against the CPU: synthetic llama, qwen2 and gemma3 models (and the
//! real Gemma 3 270M when `ROCMFORGE_TEST_MODEL` is set) decode 64 greedy tokens fully on the
//! GPU, with half the layers on the GPU (`-ngl n_layer/2`) and under a forced small memory
//! budget, and must produce the CPU's tokens.
//!
//! Greedy runs are compared up to the first step where the CPU's top-2 logit gap is under
//! [`TIE`] (past such a step either token is right, see `gemma_model.rs`). Random-weight models
//! have near-ties early, so the GPU also decodes the CPU's 64 tokens (teacher forcing): its
//! greedy choice must equal the CPU's at every step without a near-tie, and its last-position
//! logits must stay within a bound of the CPU's at every step.
//! Without a GPU (or without built kernels) each GPU test prints why it skipped;
//! `ROCMFORGE_REQUIRE_GPU=1` turns that into a failure.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use model::arch::LogitsMode;
use model::placement::DeviceChoice;
use model::sampling::argmax;
use model::session::{DeviceMemory, Model, Session, SessionOptions};
use serial_test::serial;

/// Greedy steps are compared until the CPU's top-2 gap first falls below this.
const TIE: f32 = 0.1;
/// Tokens decoded per run.
const STEPS: usize = 64;
/// |GPU - CPU| allowed on the logits of the synthetic models (order 1; the GPU quantizes
/// activations to 8 bits per 32 values, the CPU per its own blocks: 0.01 to 0.02 seen on an
/// H200; a wrong rope, norm or cache row moves them by far more).
const SYNTH_TOL: f32 = 0.1;

/// A folder for the files the tests write (created here: on a GPU machine the test binary runs
/// without the build tree it was compiled in).
fn scratch_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("gpu-model");
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn synth(arch: &str) -> Model {
    let path = scratch_dir().join(format!("synth-{arch}.gguf"));
    model::synth::write_model(arch, &path, 7).expect("write synthetic model");
    Model::load(&path, |_, _| {}).expect("load")
}

fn opts(device: DeviceChoice, ngl: Option<usize>, limit: Option<u64>) -> SessionOptions {
    SessionOptions {
        n_ctx: 256,
        n_batch: 64,
        n_threads: 2,
        device,
        n_gpu_layers: ngl,
        gpu_mem_limit: limit,
        ..SessionOptions::default()
    }
}

/// True when a GPU with built kernels is there; otherwise prints why (or panics when the GPU
/// is required).
#[cfg(feature = "hip")]
fn have_gpu() -> bool {
    match ggml_graph::hip::HipDevice::new(0) {
        Ok(_) => true,
        Err(e) => {
            if std::env::var("ROCMFORGE_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("ROCMFORGE_REQUIRE_GPU=1 but no HIP device: {e}");
            }
            println!("skipped: {e}");
            false
        }
    }
}

#[cfg(not(feature = "hip"))]
fn have_gpu() -> bool {
    if std::env::var("ROCMFORGE_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("ROCMFORGE_REQUIRE_GPU=1 but the `hip` feature is off");
    }
    println!("skipped: built without the `hip` feature");
    false
}

/// A greedy run: tokens, the top-2 gap at each step and the logits each token was chosen from.
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

fn greedy(s: &mut Session, prompt: &[u32], steps: usize) -> Run {
    s.reset();
    let mut logits = s.eval(prompt, LogitsMode::Last).expect("prompt");
    let mut run = Run {
        tokens: Vec::new(),
        gaps: Vec::new(),
        logits: Vec::new(),
    };
    for _ in 0..steps {
        let t = argmax(&logits);
        run.tokens.push(t);
        run.gaps.push(top2_gap(&logits));
        run.logits.push(std::mem::take(&mut logits));
        if s.n_past() >= s.n_ctx() {
            break;
        }
        logits = s.eval(&[t], LogitsMode::Last).expect("decode");
    }
    run
}

/// Last-position logits after the prompt and after each of `tokens` but the last.
fn forced(s: &mut Session, prompt: &[u32], tokens: &[u32]) -> Vec<Vec<f32>> {
    s.reset();
    let mut out = vec![s.eval(prompt, LogitsMode::Last).expect("prompt")];
    for &t in &tokens[..tokens.len().saturating_sub(1)] {
        out.push(s.eval(&[t], LogitsMode::Last).expect("decode"));
    }
    out
}

/// The GPU decoding the CPU's tokens: same greedy choice wherever the CPU has no near-tie, and
/// logits within `tol`. Returns the largest logit difference.
fn check_forced(what: &str, s: &mut Session, prompt: &[u32], cpu: &Run, tol: f32) -> f32 {
    let got = forced(s, prompt, &cpu.tokens);
    let mut worst = 0f32;
    let mut checked = 0;
    for (i, l) in got.iter().enumerate() {
        let d = max_abs_diff(&cpu.logits[i], l);
        worst = worst.max(d);
        assert!(d <= tol, "{what}: step {i}: logits differ by {d} (> {tol})");
        // When every logit moved by at most d, a gap over 2d cannot close.
        if cpu.gaps[i] >= TIE.max(2.0 * d) {
            checked += 1;
            assert_eq!(
                argmax(l),
                cpu.tokens[i],
                "{what}: step {i}: GPU picks another token (CPU gap {})",
                cpu.gaps[i]
            );
        }
    }
    println!(
        "{what}: teacher-forced {} steps, greedy choice equal at all {checked} without a near-tie; \
         max |logit diff| {worst:.5}",
        got.len()
    );
    worst
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Checks the free-running `gpu` against `cpu` up to the first near-tie; returns (steps
/// compared, prompt logits diff, worst step diff).
fn compare(what: &str, cpu: &Run, gpu: &Run, logit_tol: f32) -> (usize, f32, f32) {
    let equal = cpu
        .tokens
        .iter()
        .zip(&gpu.tokens)
        .take_while(|(a, b)| a == b)
        .count();
    // Inputs are equal up to and including the first differing step.
    let same_inputs = (equal + 1).min(cpu.logits.len()).min(gpu.logits.len());
    let diffs: Vec<f32> = (0..same_inputs)
        .map(|i| max_abs_diff(&cpu.logits[i], &gpu.logits[i]))
        .collect();
    // A near-tie: a gap under TIE, or one that logits this far apart may close.
    let limit = (0..same_inputs)
        .position(|i| cpu.gaps[i] < TIE.max(2.0 * diffs[i]))
        .unwrap_or(cpu.tokens.len());
    let first = diffs[0];
    let worst = diffs.iter().copied().fold(0.0, f32::max);
    println!(
        "{what}: tokens equal for {equal}/{} steps (near-tie limit {limit}); max |logit diff| \
         prompt {first:.5}, over {same_inputs} steps with equal inputs {worst:.5}",
        cpu.tokens.len()
    );
    assert!(
        equal >= limit,
        "{what}: GPU greedy differs from the CPU at step {equal} (CPU gap {}), before the first \
         near-tie at step {limit}\ncpu {:?}\ngpu {:?}",
        cpu.gaps[equal],
        cpu.tokens,
        gpu.tokens
    );
    assert!(
        worst <= logit_tol,
        "{what}: logits differ by {worst} (> {logit_tol})"
    );
    (limit, first, worst)
}

/// A GPU session that records the memory reported after its first forward pass.
fn gpu_session(m: &Model, o: &SessionOptions) -> (Session, Arc<Mutex<Option<DeviceMemory>>>) {
    let mut s = Session::new(m, o).expect("GPU session");
    let seen = Arc::new(Mutex::new(None));
    let sink = seen.clone();
    s.on_first_pass(Box::new(move |mem| {
        *sink.lock().expect("lock") = Some(*mem);
    }));
    println!("{}", s.device_plan());
    (s, seen)
}

fn check_model(name: &str, m: &Model, prompt: &[u32], logit_tol: f32) {
    let n_layer = m.config().n_layer;
    let mut cpu = Session::new(m, &opts(DeviceChoice::Cpu, None, None)).expect("CPU session");
    assert!(!cpu.device_plan().uses_gpu());
    let want = greedy(&mut cpu, prompt, STEPS);

    // Everything on the GPU (the default fit on an otherwise idle GPU).
    let (mut full, seen) = gpu_session(m, &opts(DeviceChoice::Gpu, None, None));
    let plan = full.device_plan().clone();
    assert_eq!(plan.split.gpu_layers(), n_layer, "{name}: {plan}");
    assert!(plan.split.output_on_gpu(), "{name}: {plan}");
    let got = greedy(&mut full, prompt, STEPS);
    compare(&format!("{name} all on GPU"), &want, &got, logit_tol);
    check_forced(
        &format!("{name} all on GPU"),
        &mut full,
        prompt,
        &want,
        logit_tol,
    );
    let mem = seen
        .lock()
        .expect("lock")
        .expect("first-pass memory report");
    println!("{name}: {mem}");
    assert!(mem.weights > 0 && mem.kv > 0 && mem.allocated >= mem.weights + mem.kv);
    drop(full);

    // Half the layers (the last ones) on the GPU.
    let half = n_layer / 2;
    let (mut part, _) = gpu_session(m, &opts(DeviceChoice::Gpu, Some(half), None));
    let pplan = part.device_plan().clone();
    assert_eq!(pplan.split.gpu_layers(), half);
    assert!(!pplan.split.output_on_gpu());
    let got = greedy(&mut part, prompt, STEPS);
    let what = format!("{name} -ngl {half} of {n_layer}");
    compare(&what, &want, &got, logit_tol);
    check_forced(&what, &mut part, prompt, &want, logit_tol);
    drop(part);

    // A budget between the estimates for one layer and for all of them: auto picks a split.
    let one = opts(DeviceChoice::Auto, Some(1), None);
    let e1 = Session::new(m, &one)
        .expect("one-layer session")
        .device_plan()
        .estimate
        .total();
    let e_all = plan.estimate.total();
    let e_layers = Session::new(m, &opts(DeviceChoice::Auto, Some(n_layer), None))
        .expect("all-layer session")
        .device_plan()
        .estimate
        .total();
    let limit = e1 + (e_layers - e1) / 2;
    let (mut capped, _) = gpu_session(m, &opts(DeviceChoice::Auto, None, Some(limit)));
    let cplan = capped.device_plan().clone();
    println!("{name}: cap {limit} (one layer {e1}, all layers {e_layers}, all {e_all}): {cplan}");
    assert!(
        cplan.uses_gpu() && cplan.split.gpu_layers() < n_layer && !cplan.split.output_on_gpu(),
        "{name}: a cap of {limit} bytes should give a partial offload: {cplan}"
    );
    assert!(cplan.estimate.total() <= limit);
    let got = greedy(&mut capped, prompt, STEPS);
    compare(&format!("{name} capped"), &want, &got, logit_tol);
    check_forced(
        &format!("{name} capped"),
        &mut capped,
        prompt,
        &want,
        logit_tol,
    );
}

fn synth_prompt(m: &Model) -> Vec<u32> {
    let n = m.config().n_vocab as u32;
    [1u32, 17, 345, 2, 99, 1000, 7, 512]
        .iter()
        .map(|t| t % n)
        .collect()
}

#[test]
#[serial]
fn synthetic_llama_on_gpu_equals_cpu() {
    if !have_gpu() {
        return;
    }
    let m = synth("llama");
    check_model("llama", &m, &synth_prompt(&m), SYNTH_TOL);
}

#[test]
#[serial]
fn synthetic_qwen2_on_gpu_equals_cpu() {
    if !have_gpu() {
        return;
    }
    let m = synth("qwen2");
    check_model("qwen2", &m, &synth_prompt(&m), SYNTH_TOL);
}

#[test]
#[serial]
fn synthetic_gemma3_on_gpu_equals_cpu() {
    if !have_gpu() {
        return;
    }
    let m = synth("gemma3");
    check_model("gemma3", &m, &synth_prompt(&m), SYNTH_TOL);
}

#[test]
#[serial]
fn gemma3_270m_on_gpu_equals_cpu() {
    let Ok(path) = std::env::var("ROCMFORGE_TEST_MODEL") else {
        println!("skipped: ROCMFORGE_TEST_MODEL not set");
        return;
    };
    if !have_gpu() {
        return;
    }
    let tm = model::text::TextModel::load(&path, |_, _| {}).expect("load the test model");
    let prompt = tm
        .encode(
            "The capital of France is Paris. The capital of Germany is",
            true,
        )
        .expect("encode");
    // Gemma 3 270M amplifies the rounding of 8-bit activations: the GPU quantizes them per 32
    // values (Q8_1), the CPU per the weight type's blocks (Q8_K per 256 for K-quants), which
    // moves its logits by 1.4 to 2.0 (H100, H200); the same effect put our CPU 1.18 away from
    // llama.cpp's before their summation orders were matched. The perplexity test below is the
    // tight whole-model check for this model.
    check_model("gemma3-270m", tm.model(), &prompt, 3.0);
}

/// Perplexity of the real model on the GPU against the CPU's (which is within 1% of llama.cpp's,
/// see gemma_model.rs) over short windows: 8 tokens (every product through the 8-bit mat-vec
/// path, the flash attention kernel) and 16 (f16 operands through gemmEx, the tensor-core
/// attention). H200: 278.635 vs 278.673 and 69.534 vs 69.755.
///
/// Over 128-token windows the GPU's gemmEx path reads lower than the CPU (H200: 11.859 vs 12.178):
/// its f16 activations are finer than the CPU's 8-bit ones, and the difference grows with the
/// context. The CPU running a copy of the model whose weights are the same dequantized values in
/// f16 (so it also multiplies f16 activations by f16 weights) reads 11.861 on 20 such windows, so
/// the GPU is held to that copy there.
#[test]
#[serial]
fn gemma3_270m_gpu_perplexity_matches_the_cpu() {
    let Ok(path) = std::env::var("ROCMFORGE_TEST_MODEL") else {
        println!("skipped: ROCMFORGE_TEST_MODEL not set");
        return;
    };
    if !have_gpu() {
        return;
    }
    // Embedded so the test binary runs on a GPU machine without the source tree.
    let text = include_str!("data/perplexity.txt");
    let tm = model::text::TextModel::load(&path, |_, _| {}).expect("load the test model");
    let tokens = tm.tokenizer().encode(text, true, false);
    let bos = tm.bos_for_chunks();
    for n_ctx in [8usize, 16] {
        let gpu = window_ppl(tm.model(), DeviceChoice::Gpu, &tokens, n_ctx, 150, bos);
        let cpu = window_ppl(tm.model(), DeviceChoice::Cpu, &tokens, n_ctx, 150, bos);
        // Both quantize differently (Q8_1 vs Q8_0/Q8_K, f16 operands vs 8-bit); a wrong kernel,
        // mask or cache row moves this by far more than 1%.
        check_ppl(n_ctx, "CPU", &gpu, &cpu, 1.0);
    }

    let n_ctx = 128;
    let gpu = window_ppl(tm.model(), DeviceChoice::Gpu, &tokens, n_ctx, 20, bos);
    let f16_path = scratch_dir().join("gemma-dequant-f16.gguf");
    write_dequantized_f16_copy(&path, &f16_path);
    let f16_model = Model::load(&f16_path, |_, _| {}).expect("load the f16 copy");
    let cpu = window_ppl(&f16_model, DeviceChoice::Cpu, &tokens, n_ctx, 20, bos);
    let _ = std::fs::remove_file(&f16_path);
    check_ppl(n_ctx, "CPU on the f16 copy", &gpu, &cpu, 0.5);
}

/// Perplexity over windows of `n_ctx` tokens (each one batch), at most `max_chunks` of them.
fn window_ppl(
    m: &Model,
    device: DeviceChoice,
    tokens: &[u32],
    n_ctx: usize,
    max_chunks: usize,
    bos: Option<u32>,
) -> model::perplexity::PplResult {
    let ppl_opts = model::perplexity::PplOptions {
        n_ctx,
        max_chunks: Some(max_chunks),
        bos,
    };
    let o = SessionOptions {
        n_ctx,
        n_batch: n_ctx,
        ..opts(device, None, None)
    };
    let mut s = Session::new(m, &o).expect("session");
    model::perplexity::perplexity(&mut s, tokens, &ppl_opts, |_, _, _| {}).expect("perplexity")
}

/// The GPU's perplexity within `bound_pct` percent of the reference's, over the same windows.
fn check_ppl(
    n_ctx: usize,
    reference: &str,
    gpu: &model::perplexity::PplResult,
    want: &model::perplexity::PplResult,
    bound_pct: f64,
) {
    let rel = (gpu.ppl - want.ppl) / want.ppl * 100.0;
    println!(
        "perplexity, {} windows of {n_ctx}: GPU {:.4}, {reference} {:.4} ({rel:+.3}%)",
        gpu.chunks, gpu.ppl, want.ppl
    );
    assert_eq!(gpu.chunks, want.chunks);
    assert!(
        rel.abs() < bound_pct,
        "n_ctx {n_ctx}: GPU {:.4} vs {reference} {:.4}",
        gpu.ppl,
        want.ppl
    );
}

/// Writes `src` again with every quantized matrix dequantized and rounded to f16 (what the GPU's
/// prefill path multiplies), everything else unchanged.
fn write_dequantized_f16_copy(src: &str, dst: &std::path::Path) {
    let file = gguf::GgufFile::open(src).expect("open the test model");
    let data: Vec<Vec<u8>> = file
        .tensors()
        .iter()
        .map(|t| {
            let raw = file.tensor_data(t);
            if t.ggml_type.is_quantized() && t.dims.len() >= 2 {
                let vals = gguf::dequantize_to_vec(t.ggml_type, raw).expect("dequantize");
                vals.iter()
                    .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                    .collect()
            } else {
                raw.to_vec()
            }
        })
        .collect();
    let tensors: Vec<gguf::TensorToWrite<'_>> = file
        .tensors()
        .iter()
        .zip(&data)
        .map(|(t, d)| gguf::TensorToWrite {
            name: &t.name,
            dims: &t.dims,
            ty: if t.ggml_type.is_quantized() && t.dims.len() >= 2 {
                gguf::GgmlType::F16
            } else {
                t.ggml_type
            },
            data: d,
        })
        .collect();
    gguf::write_file(dst, file.metadata(), &tensors).expect("write the f16 copy");
}

/// Runs everywhere: the device choice without a GPU, and `--device cpu` always on the CPU.
#[test]
#[serial]
fn cpu_choice_and_missing_gpu_fall_back_to_the_cpu() {
    let m = synth("llama");
    let s = Session::new(&m, &opts(DeviceChoice::Cpu, None, None)).expect("CPU session");
    assert!(!s.device_plan().uses_gpu());
    assert!(s.device_memory().is_none());
    let s = Session::new(&m, &opts(DeviceChoice::Cpu, Some(99), None)).expect("CPU session");
    assert!(!s.device_plan().uses_gpu(), "--device cpu wins over -ngl");
    let auto = Session::new(&m, &opts(DeviceChoice::Auto, Some(0), None)).expect("session");
    assert!(
        !auto.device_plan().uses_gpu(),
        "-ngl 0 keeps everything on the CPU"
    );
    if !gpu_present() {
        let auto = Session::new(&m, &opts(DeviceChoice::Auto, None, None)).expect("session");
        assert!(!auto.device_plan().uses_gpu());
        println!("auto without a GPU: {}", auto.device_plan());
        assert!(
            Session::new(&m, &opts(DeviceChoice::Gpu, None, None)).is_err(),
            "--device gpu must fail without a GPU"
        );
    }
}

#[cfg(feature = "hip")]
fn gpu_present() -> bool {
    ggml_graph::hip::HipDevice::new(0).is_ok()
}

#[cfg(not(feature = "hip"))]
fn gpu_present() -> bool {
    false
}

/// Decode steps replayed from captured GPU graphs give the same logits, bit for bit, as plain
/// launches, across KV buckets (256, 512, then the 600-position context).
#[test]
#[serial]
fn captured_decode_graphs_equal_plain_launches() {
    if !have_gpu() {
        return;
    }
    let m = synth("gemma3");
    let o = SessionOptions {
        n_ctx: 600,
        ..opts(DeviceChoice::Gpu, None, None)
    };
    let n_vocab = m.config().n_vocab as u32;
    let prompt = synth_prompt(&m);
    let steps = 600 - prompt.len();
    let run = |capture: bool| -> (Vec<Vec<f32>>, usize) {
        let mut s = Session::new(&m, &o).expect("gpu session");
        s.set_gpu_graphs(capture);
        let mut out = vec![s.eval(&prompt, LogitsMode::Last).expect("prompt")];
        let mut captured = 0;
        for i in 0..steps {
            let t = (i as u32 * 7919 + 13) % n_vocab;
            out.push(s.eval(&[t], LogitsMode::Last).expect("decode"));
            captured += usize::from(s.has_gpu_graph());
        }
        (out, captured)
    };
    let (plain, plain_captured) = run(false);
    let (replayed, captured) = run(true);
    assert_eq!(plain_captured, 0, "capture off yet a graph was captured");
    // Each bucket's first step runs plain; every later one should replay.
    assert!(
        captured + 8 >= steps,
        "only {captured} of {steps} decode steps held a captured graph"
    );
    assert_eq!(plain.len(), replayed.len());
    for (i, (a, b)) in plain.iter().zip(&replayed).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "step {i}: replayed logits differ from plain launches");
    }
}
