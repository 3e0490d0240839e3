//! The whole CPU stack on files written by our own tools: `model::synth` writes a GGUF through
//! the `gguf` writer and quantizers, `gguf` maps it back, `model` builds each architecture's
//! graph and `ggml-graph` runs it. Checks invariants that hold for any weights: prompt chunking
//! and token-by-token decoding give the logits of one batch, an f32 KV cache agrees with f16,
//! sessions are deterministic and bad input gives typed errors.

use std::path::PathBuf;

use model::arch::{KvType, LogitsMode};
use model::session::{Model, Session, SessionOptions};
use model::ModelError;

fn synth(arch: &str) -> Model {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pipeline");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("{arch}.gguf"));
    let opts = model::synth::SynthOptions::parse(arch, "tiny", "q8_0", 3).expect("options");
    model::synth::write(&opts, None, &path).expect("write synthetic model");
    Model::load(&path, |_, _| {}).expect("load synthetic model")
}

fn session(m: &Model, n_batch: usize, kv: KvType) -> Session {
    let opts = SessionOptions {
        n_ctx: 64,
        n_batch,
        n_threads: 2,
        kv_type: kv,
        ..SessionOptions::default()
    };
    Session::new(m, &opts).expect("session")
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn check_arch(arch: &str) {
    let m = synth(arch);
    let n_vocab = m.config().n_vocab;
    let prompt: Vec<u32> = (0..23u32).map(|i| (i * 37 + 5) % n_vocab as u32).collect();

    let whole = session(&m, 512, KvType::F16)
        .eval(&prompt, LogitsMode::Last)
        .expect("one batch");
    assert_eq!(whole.len(), n_vocab);
    assert!(
        whole.iter().all(|x| x.is_finite()),
        "{arch}: non-finite logits"
    );

    let chunked = session(&m, 4, KvType::F16)
        .eval(&prompt, LogitsMode::Last)
        .expect("chunks");
    // Logits handed to a closure are the ones `eval` returns, in chunks and step by step.
    let handed = session(&m, 4, KvType::F16)
        .eval_with(&prompt, LogitsMode::Last, <[f32]>::to_vec)
        .expect("chunks, handed over");
    assert_eq!(handed, chunked, "{arch}: eval_with against eval in chunks");
    let mut s = session(&m, 512, KvType::F16);
    let mut h = session(&m, 512, KvType::F16);
    let mut stepwise = Vec::new();
    for &t in &prompt {
        stepwise = s.eval(&[t], LogitsMode::Last).expect("step");
        let seen = h
            .eval_with(&[t], LogitsMode::Last, <[f32]>::to_vec)
            .expect("step, handed over");
        assert_eq!(
            seen, stepwise,
            "{arch}: eval_with against eval, token by token"
        );
    }
    let f32kv = session(&m, 512, KvType::F32)
        .eval(&prompt, LogitsMode::Last)
        .expect("f32 kv");
    let all = session(&m, 512, KvType::F16)
        .eval(&prompt, LogitsMode::All)
        .expect("all logits");
    assert_eq!(all.len(), prompt.len() * n_vocab);

    let scale = whole.iter().fold(0f32, |a, x| a.max(x.abs())).max(1e-3);
    for (what, other, tol) in [
        ("chunks of 4", &chunked, 0.05),
        ("token by token", &stepwise, 0.05),
        ("f32 KV cache", &f32kv, 0.02),
        (
            "all-position logits",
            &all[(prompt.len() - 1) * n_vocab..].to_vec(),
            1e-5,
        ),
    ] {
        let d = max_diff(&whole, other) / scale;
        assert!(
            d < tol,
            "{arch}: {what} differs from one batch by {d} (relative)"
        );
    }
    // A different history must change the result (the cache is really read).
    let mut other_prompt = prompt.clone();
    other_prompt[0] = (other_prompt[0] + 1) % n_vocab as u32;
    let moved = session(&m, 512, KvType::F16)
        .eval(&other_prompt, LogitsMode::Last)
        .expect("eval");
    assert!(
        max_diff(&whole, &moved) > 1e-4,
        "{arch}: first token has no effect"
    );

    let mut s = session(&m, 512, KvType::F16);
    assert!(matches!(
        s.eval(&vec![1; 65], LogitsMode::Last),
        Err(ModelError::ContextFull { .. })
    ));
    assert!(matches!(
        s.eval(&[n_vocab as u32], LogitsMode::Last),
        Err(ModelError::BadToken { .. })
    ));
    assert!(matches!(
        s.eval(&[], LogitsMode::Last),
        Err(ModelError::InvalidArgument(_))
    ));
}

#[test]
fn llama_pipeline() {
    check_arch("llama");
}

#[test]
fn qwen2_pipeline() {
    check_arch("qwen2");
}

#[test]
fn qwen3_pipeline() {
    check_arch("qwen3");
}

#[test]
fn gemma3_pipeline() {
    check_arch("gemma3");
}

#[test]
fn context_beyond_the_model_maximum_is_refused() {
    let m = synth("llama");
    let opts = SessionOptions {
        n_ctx: m.config().n_ctx_train + 1,
        ..SessionOptions::default()
    };
    assert!(matches!(
        Session::new(&m, &opts),
        Err(ModelError::InvalidArgument(_))
    ));
}

/// A damaged model file (cut short, or with a tensor dropped) fails to load with an error that
/// names the file and what was wrong, at any cut.
#[test]
fn damaged_files_are_refused_with_the_file_named() {
    synth("llama");
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pipeline/llama.gguf");
    let bytes = std::fs::read(&path).expect("read the synthetic model");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pipeline-damaged");
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = gguf::GgufFile::open(&path).expect("open");
    // The file may end in alignment padding; the last byte that matters ends the last tensor.
    let data_end = file.data_offset()
        + file
            .tensors()
            .iter()
            .map(|t| t.offset + t.size)
            .max()
            .expect("tensors");
    let data_end = usize::try_from(data_end).expect("size");
    let cut = dir.join("cut.gguf");
    for len in [0, 3, 8, 100, bytes.len() / 3, data_end - 1] {
        std::fs::write(&cut, &bytes[..len]).expect("write the cut file");
        let Err(err) = Model::load(&cut, |_, _| {}) else {
            panic!("a file cut at {len} bytes must not load");
        };
        let msg = err.to_string();
        assert!(
            matches!(err, ModelError::InFile { .. }) && msg.contains("cut.gguf"),
            "cut at {len}: {msg}"
        );
    }

    // The same metadata and every tensor but one: the missing tensor is named.
    let kept: Vec<_> = file
        .tensors()
        .iter()
        .filter(|t| t.name != "blk.0.attn_q.weight")
        .map(|t| gguf::TensorToWrite {
            name: &t.name,
            dims: &t.dims,
            ty: t.ggml_type,
            data: file.tensor_data(t),
        })
        .collect();
    let dropped = dir.join("dropped.gguf");
    gguf::write_file(&dropped, file.metadata(), &kept).expect("write");
    let Err(err) = Model::load(&dropped, |_, _| {}) else {
        panic!("a model without blk.0.attn_q.weight must not load");
    };
    let msg = err.to_string();
    assert!(
        msg.contains("dropped.gguf") && msg.contains("blk.0.attn_q.weight"),
        "{msg}"
    );
}

/// Token pieces for the generation loop: every id is one letter, none ends a turn.
struct Letters;

impl model::generate::Vocab for Letters {
    fn piece(&self, id: u32) -> Vec<u8> {
        vec![b'a' + (id % 26) as u8]
    }
    fn is_eog(&self, _: u32) -> bool {
        false
    }
}

#[test]
fn generate_takes_the_greedy_tokens_of_eval() {
    use model::generate::{generate, GenerateOptions, StopReason};
    use model::sampling::{argmax, Sampler, SamplerConfig};
    let m = synth("llama");
    let prompt = [3u32, 17, 5, 9];
    let opts = GenerateOptions {
        max_tokens: 6,
        ..GenerateOptions::default()
    };
    let mut s = session(&m, 512, KvType::F16);
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let mut text = String::new();
    let g = generate(&mut s, &Letters, &mut sampler, &prompt, &opts, |t| {
        text.push_str(t)
    })
    .expect("generate");
    let mut r = session(&m, 512, KvType::F16);
    let mut logits = r.eval(&prompt, LogitsMode::Last).expect("prompt");
    let mut want = Vec::new();
    for _ in 0..opts.max_tokens {
        let t = argmax(&logits);
        want.push(t);
        logits = r.eval(&[t], LogitsMode::Last).expect("step");
    }
    assert_eq!(g.tokens, want);
    assert_eq!(g.stop, StopReason::Length);
    assert_eq!(text.len(), want.len());
    assert_eq!(s.n_past(), prompt.len() + want.len() - 1);
    // No token asked for: the prompt is evaluated and nothing is sampled.
    let none = GenerateOptions::default();
    let mut s = session(&m, 512, KvType::F16);
    let g = generate(&mut s, &Letters, &mut sampler, &prompt, &none, |_| {}).expect("none");
    assert!(g.tokens.is_empty());
    assert_eq!(s.n_past(), prompt.len());
}
