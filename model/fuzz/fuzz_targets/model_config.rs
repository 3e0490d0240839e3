//! Fuzz target: a small synthetic model (llama, qwen2 or gemma3; a micro Q8_0 shape or a
//! one-layer Q4_K_M shape; a 32-token vocabulary) with metadata and tensor shapes mutated as the input says, through
//! parsing, configuration, tensor validation, the tokenizer and chat template, the worst-case
//! graph of a session at the asked context (`0`: the model's trained maximum, as `-c 0`) with
//! its memory plan, and, for models small enough to run in well under a millisecond, a session
//! and one token. Every mutation must end in a typed error or in finite work: no panic, no
//! overflow (the profile keeps overflow checks on), no allocation beyond libFuzzer's malloc
//! limit.

#![no_main]

use std::borrow::Cow;
use std::sync::{Arc, OnceLock};

use gguf::{ArrayValue, GgmlType, GgufFile, Metadata, MetadataValue, TensorToWrite};
use libfuzzer_sys::fuzz_target;
use model::arch::{build_forward, BatchSpec, KvCacheSpec, KvType, LogitsMode};
use model::session::{Model, Session, SessionOptions};
use model::synth::{Arch, FileType, Shape, SynthOptions};
use model::text::TextModel;

struct Tensor {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    data: Cow<'static, [u8]>,
}

struct Base {
    arch: &'static str,
    md: Metadata,
    tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)>,
}

const ARCHS: [&str; 3] = ["llama", "qwen2", "gemma3"];

/// The micro shape (Q8_0 rows of 64) and the smallest shape with whole Q4_K blocks.
fn shape(k_quants: bool) -> (Shape, FileType) {
    let s = |n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff| Shape {
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_ctx: 128,
        rope_base: 10000.0,
        eps: 1e-5,
        experts: None,
    };
    if k_quants {
        (s(256, 1, 2, 1, 128, 256), FileType::Q4KM)
    } else {
        (s(64, 2, 4, 2, 16, 64), FileType::All(GgmlType::Q8_0))
    }
}

/// Bases `0..3` are the micro shapes of [`ARCHS`], `3..6` the Q4_K_M ones.
fn bases() -> &'static [Base] {
    static BASES: OnceLock<Vec<Base>> = OnceLock::new();
    BASES.get_or_init(|| {
        [false, true]
            .iter()
            .flat_map(|&k| ARCHS.iter().map(move |&a| (a, k)))
            .map(|(arch, k_quants)| {
                let path = std::env::temp_dir().join(format!(
                    "rocmforge-fuzz-{arch}-{k_quants}-{}.gguf",
                    std::process::id()
                ));
                let (shape, ftype) = shape(k_quants);
                let o = SynthOptions {
                    arch: Arch::parse(arch).expect("known architecture"),
                    preset: "fuzz".into(),
                    shape,
                    ftype,
                    seed: 1,
                    extras: Default::default(),
                };
                model::synth::write(&o, None, &path).expect("write synthetic model");
                let f = GgufFile::read(&path).expect("read synthetic model");
                let _ = std::fs::remove_file(&path);
                let tensors = f
                    .tensors()
                    .iter()
                    .map(|t| {
                        let mut data = f.tensor_data(t).to_vec();
                        let mut dims = t.dims.clone();
                        if VOCAB_ROWS.contains(&t.name.as_str()) {
                            // Rows are contiguous: the first ones are a smaller table.
                            let row = data.len() / dims[1] as usize;
                            dims[1] = SMALL_VOCAB.len() as u64;
                            data.truncate(row * SMALL_VOCAB.len());
                        }
                        (t.name.clone(), dims, t.ggml_type, data)
                    })
                    .collect();
                Base {
                    arch,
                    md: with_small_vocab(arch, f.metadata()),
                    tensors,
                }
            })
            .collect()
    })
}

/// The tensors with one row per token.
const VOCAB_ROWS: [&str; 2] = ["token_embd.weight", "output.weight"];

/// A SentencePiece vocabulary of 32 tokens (unknown, BOS, EOS, pieces) instead of synth's
/// byte-level one of 259: building the tokenizer, writing and checking the tables and the
/// output head of every execution cost an eighth as much. The tokenizer target covers both
/// tokenizers in depth.
const SMALL_VOCAB: [&str; 32] = [
    "<unk>",
    "<s>",
    "</s>",
    "\u{2581}",
    "\u{2581}the",
    "he",
    "in",
    "er",
    "a",
    "b",
    "c",
    "d",
    "e",
    "f",
    "g",
    "h",
    "i",
    "j",
    "k",
    "l",
    "m",
    "n",
    "o",
    "p",
    "q",
    "r",
    "s",
    "t",
    "u",
    "v",
    "w",
    "\u{2581}a",
];

/// `md` with its tokenizer replaced by [`SMALL_VOCAB`].
fn with_small_vocab(arch: &str, md: &Metadata) -> Metadata {
    let mut out = Metadata::new();
    for (k, v) in md.iter() {
        if !k.starts_with("tokenizer.") {
            out.set(k, v.clone());
        }
    }
    let n = SMALL_VOCAB.len();
    let types: Vec<i32> = (0..n)
        .map(|i| match i {
            0 => 2,
            1 | 2 => 3,
            _ => 1,
        })
        .collect();
    let scores: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    out.set("tokenizer.ggml.model", "llama");
    out.set(
        "tokenizer.ggml.tokens",
        MetadataValue::Array(ArrayValue::String(
            SMALL_VOCAB.iter().map(|t| (*t).to_owned()).collect(),
        )),
    );
    out.set(
        "tokenizer.ggml.token_type",
        MetadataValue::Array(ArrayValue::I32(types)),
    );
    out.set(
        "tokenizer.ggml.scores",
        MetadataValue::Array(ArrayValue::F32(scores)),
    );
    out.set("tokenizer.ggml.unknown_token_id", MetadataValue::U32(0));
    out.set("tokenizer.ggml.bos_token_id", MetadataValue::U32(1));
    out.set("tokenizer.ggml.eos_token_id", MetadataValue::U32(2));
    out.set(full_key(arch, "vocab_size"), MetadataValue::U32(n as u32));
    out
}

/// Size keys the configuration reads (after the `{arch}.` prefix) and token id keys.
const INT_KEYS: [&str; 16] = [
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "rope.dimension_count",
    "attention.sliding_window",
    "attention.sliding_window_pattern",
    "vocab_size",
    "rope.scaling.original_context_length",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.padding_token_id",
];

const FLOAT_KEYS: [&str; 7] = [
    "attention.layer_norm_rms_epsilon",
    "rope.freq_base",
    "rope.freq_base_swa",
    "rope.scaling.factor",
    "rope.scaling.attn_factor",
    "final_logit_softcapping",
    "attn_logit_softcapping",
];

const TYPES: [GgmlType; 8] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q5_0,
    GgmlType::Q4_K,
    GgmlType::Q6_K,
];

/// Largest tensor the harness itself builds: the point is the loader's checks, not the
/// harness's memory.
const MAX_TENSOR_BYTES: u64 = 1 << 20;

fn full_key(arch: &str, k: &str) -> String {
    if k.starts_with("tokenizer.") || k.starts_with("general.") {
        k.to_owned()
    } else {
        format!("{arch}.{k}")
    }
}

fn int_value(kind: u8, v: u64) -> MetadataValue {
    match kind % 6 {
        0 | 1 => MetadataValue::U32(v as u32),
        2 => MetadataValue::U64(v),
        3 => MetadataValue::I32(v as i32),
        4 => MetadataValue::F32(f32::from_bits(v as u32)),
        _ => MetadataValue::String(format!("{v}")),
    }
}

fn without(md: &Metadata, key: &str) -> Metadata {
    let mut out = Metadata::new();
    for (k, v) in md.iter() {
        if k != key {
            out.set(k, v.clone());
        }
    }
    out
}

/// Resizes a tensor's data to what its dims and type need; false when that is not a whole
/// number of blocks or too large for the harness.
fn fit(t: &mut Tensor) -> bool {
    let Some(&row) = t.dims.first() else {
        return false;
    };
    let Some(row_bytes) = t.ty.row_bytes(row) else {
        return false;
    };
    let bytes = t
        .dims
        .iter()
        .skip(1)
        .try_fold(row_bytes, |acc, &d| acc.checked_mul(d));
    match bytes {
        Some(b) if b <= MAX_TENSOR_BYTES => {
            t.data.to_mut().resize(b as usize, 0);
            true
        }
        _ => false,
    }
}

/// Prompt batch of the session the target builds.
const N_BATCH: usize = 4;

/// The largest model the target runs a token through: every one of the micro and Q4_K_M bases
/// and what small edits make of them, while a mutated model of some thousand rows or a long
/// context only goes as far as its graph and memory plan.
const RUN_MAX_WEIGHT_BYTES: usize = 1 << 19;
const RUN_MAX_CTX: usize = 64;

fn run(data: &[u8]) -> Option<()> {
    let (&first, edits) = data.split_first()?;
    let all = bases();
    let base = &all[first as usize % all.len()];
    let arch = base.arch;
    let mut md = base.md.clone();
    let mut tensors: Vec<Tensor> = base
        .tensors
        .iter()
        .map(|(name, dims, ty, data)| Tensor {
            name: name.clone(),
            dims: dims.clone(),
            ty: *ty,
            data: Cow::Borrowed(data.as_slice()),
        })
        .collect();
    let mut n_ctx = 8usize;
    let mut kv_type = KvType::F16;
    let mut token = 1u32;
    for e in edits.chunks_exact(10) {
        let (op, sel) = (e[0], e[1] as usize);
        let mut v8 = [0u8; 8];
        v8.copy_from_slice(&e[2..10]);
        let v = u64::from_le_bytes(v8);
        match op % 9 {
            0 => {
                let k = full_key(arch, INT_KEYS[sel % INT_KEYS.len()]);
                // Mostly small values, where the interesting boundaries are.
                let v = if op & 0x80 == 0 { v % 4097 } else { v };
                md.set(k, int_value(op >> 4, v));
            }
            1 => {
                let k = full_key(arch, FLOAT_KEYS[sel % FLOAT_KEYS.len()]);
                md.set(k, MetadataValue::F32(f32::from_bits(v as u32)));
            }
            2 => {
                let keys: Vec<String> = md.keys().map(str::to_owned).collect();
                if let Some(k) = keys.get(sel % keys.len().max(1)) {
                    md = without(&md, k);
                }
            }
            3 => {
                let n = tensors.len().max(1);
                if let Some(t) = tensors.get_mut(sel % n) {
                    let d = (v as usize) % 4;
                    let new = (v >> 8) % 4097;
                    if d < t.dims.len() {
                        t.dims[d] = new;
                    } else {
                        t.dims.push(new);
                    }
                    if !fit(t) {
                        return None;
                    }
                }
            }
            4 => {
                let n = tensors.len().max(1);
                if let Some(t) = tensors.get_mut(sel % n) {
                    t.ty = TYPES[v as usize % TYPES.len()];
                    if !fit(t) {
                        return None;
                    }
                }
            }
            5 => {
                if !tensors.is_empty() {
                    let i = sel % tensors.len();
                    tensors.remove(i);
                }
            }
            6 => {
                let s = ["none", "linear", "yarn", "longrope"][v as usize % 4];
                md.set(full_key(arch, "rope.scaling.type"), s);
            }
            7 => {
                // Sliding-window pattern as a per-layer list of the input's bits.
                let bits: Vec<bool> = (0..(sel % 8)).map(|i| v >> i & 1 == 1).collect();
                md.set(
                    full_key(arch, "attention.sliding_window_pattern"),
                    MetadataValue::Array(ArrayValue::Bool(bits)),
                );
            }
            _ => {
                // 0 is the model's trained context, as `-c 0`.
                n_ctx = v as usize % 65;
                kv_type = if sel & 1 == 0 {
                    KvType::F16
                } else {
                    KvType::F32
                };
                token = (v >> 32) as u32;
            }
        }
    }
    let tw: Vec<TensorToWrite<'_>> = tensors
        .iter()
        .map(|t| TensorToWrite {
            name: &t.name,
            dims: &t.dims,
            ty: t.ty,
            data: &t.data,
        })
        .collect();
    let bytes = gguf::write_to_vec(&md, &tw).ok()?;
    let file = GgufFile::from_bytes(bytes).ok()?;
    let tm = TextModel::from_model(Model::from_file(Arc::new(file)).ok()?).ok()?;
    let model = tm.model();
    let cfg = model.config();
    let n_vocab = cfg.n_vocab as u32;
    let _ = tm.piece(token % n_vocab);

    let n_ctx = if n_ctx == 0 { cfg.n_ctx_train } else { n_ctx };
    if n_ctx == 0 || n_ctx > cfg.n_ctx_train {
        return None;
    }
    let weight_bytes: usize = tensors.iter().map(|t| t.data.len()).sum();
    if n_ctx > RUN_MAX_CTX || weight_bytes > RUN_MAX_WEIGHT_BYTES {
        // What a session at this context would build and plan, without its memory: the
        // worst-case prompt batch at the end of the context and a decode step at the last
        // position (a session that runs builds and plans the same two itself).
        let kv = KvCacheSpec {
            dtype: kv_type,
            n_ctx,
        };
        let n_batch = N_BATCH.min(n_ctx);
        for (n_tok, n_past) in [(n_batch, n_ctx - n_batch), (1, n_ctx - 1)] {
            let batch = BatchSpec {
                n_tok,
                n_past,
                logits: LogitsMode::Last,
            };
            let mut g = build_forward(cfg, model.weights(), &kv, batch).ok()?.graph;
            ggml_graph::opt::optimize(&mut g);
            let _ = ggml_graph::plan::plan(&g).peak;
        }
        let _ = kv.bytes(cfg);
        return None;
    }
    let opts = SessionOptions {
        n_ctx,
        kv_type,
        n_batch: N_BATCH,
        n_threads: 1,
        ..SessionOptions::default()
    };
    let mut session = Session::new(model, &opts).ok()?;
    let logits = session.eval(&[token % n_vocab], LogitsMode::Last).ok()?;
    assert_eq!(logits.len(), n_vocab as usize);
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let ran = run(data);
    // The unedited bases must load and run: otherwise every edit would end early and the
    // target would test nothing.
    if data.len() == 1 {
        assert!(ran.is_some(), "base {} did not run a token", data[0]);
    }
});
