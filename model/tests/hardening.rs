//! Hostile model files and arguments (issue 38): a tiny synthetic model, mutated with the `gguf`
//! writer, must be refused before any large allocation or forward pass with a typed error that
//! names the key or tensor; perplexity must stream; `--no-mmap` must survive the file changing.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use gguf::{GgufFile, Metadata, MetadataValue, TensorToWrite};
use rocmforge_model::arch::LogitsMode;
use rocmforge_model::error::ModelError;
use rocmforge_model::perplexity::{perplexity, PplOptions};
use rocmforge_model::session::{LoadOptions, Model, Session, SessionOptions};
use rocmforge_model::text::TextModel;

/// A file name no other test of this process uses (they run in parallel).
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hardening");
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(format!("{name}-{}-{n}.gguf", std::process::id()))
}

/// The bytes of a tiny synthetic model of `arch`.
fn tiny(arch: &str) -> Vec<u8> {
    let path = scratch(&format!("tiny-{arch}"));
    rocmforge_model::synth::write_model(arch, &path, 5).expect("write synthetic model");
    let bytes = std::fs::read(&path).expect("read back");
    let _ = std::fs::remove_file(&path);
    bytes
}

/// An owned copy of one tensor for rewriting.
struct T {
    name: String,
    dims: Vec<u64>,
    ty: gguf::GgmlType,
    data: Vec<u8>,
}

/// `bytes` rewritten after `edit` changed its metadata and tensors.
fn mutate(bytes: &[u8], edit: impl FnOnce(&mut Metadata, &mut Vec<T>)) -> Vec<u8> {
    let f = GgufFile::from_bytes(bytes.to_vec()).expect("parse");
    let mut md = f.metadata().clone();
    let mut ts: Vec<T> = f
        .tensors()
        .iter()
        .map(|t| T {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ty: t.ggml_type,
            data: f.tensor_data(t).to_vec(),
        })
        .collect();
    edit(&mut md, &mut ts);
    let tw: Vec<TensorToWrite<'_>> = ts
        .iter()
        .map(|t| TensorToWrite {
            name: &t.name,
            dims: &t.dims,
            ty: t.ty,
            data: &t.data,
        })
        .collect();
    gguf::write_to_vec(&md, &tw).expect("write mutated file")
}

fn load(bytes: Vec<u8>) -> Result<TextModel, ModelError> {
    let file = GgufFile::from_bytes(bytes)?;
    TextModel::from_model(Model::from_file(Arc::new(file))?)
}

fn load_err(bytes: Vec<u8>) -> ModelError {
    match load(bytes) {
        Ok(_) => panic!("the mutated model loaded"),
        Err(e) => e,
    }
}

fn set(bytes: &[u8], key: &str, v: MetadataValue) -> Vec<u8> {
    mutate(bytes, |md, _| md.set(key, v))
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn sizes_from_metadata_are_bounded_before_any_allocation() {
    let base = tiny("llama");
    let cases = [
        ("llama.block_count", MetadataValue::U64(1 << 40)),
        ("llama.block_count", MetadataValue::U32(0)),
        ("llama.context_length", MetadataValue::U64(u64::MAX)),
        ("llama.context_length", MetadataValue::U32(u32::MAX)),
        ("llama.embedding_length", MetadataValue::U32(1 << 30)),
        ("llama.feed_forward_length", MetadataValue::U64(1 << 50)),
        ("llama.attention.head_count", MetadataValue::U32(0)),
        ("llama.attention.head_count_kv", MetadataValue::U32(100_000)),
        ("llama.attention.key_length", MetadataValue::U32(1 << 20)),
        (
            "llama.rope.scaling.original_context_length",
            MetadataValue::U64(1 << 40),
        ),
    ];
    for (key, v) in cases {
        let shown = format!("{v:?}");
        let e = load_err(set(&base, key, v));
        let msg = e.to_string();
        assert!(
            matches!(&e, ModelError::InFile { .. } | ModelError::BadKey { .. }),
            "{key} = {shown}: {e:?}"
        );
        assert!(msg.contains(key), "{key} = {shown}: {msg}");
        assert!(msg.contains("supported range"), "{key} = {shown}: {msg}");
    }
}

#[test]
fn numeric_hyperparameters_must_be_finite_and_in_range() {
    let base = tiny("gemma3");
    let cases = [
        ("gemma3.attention.layer_norm_rms_epsilon", f32::NAN),
        ("gemma3.attention.layer_norm_rms_epsilon", -1e-6),
        ("gemma3.attention.layer_norm_rms_epsilon", 0.0),
        ("gemma3.rope.freq_base", f32::NAN),
        ("gemma3.rope.freq_base", -10_000.0),
        ("gemma3.rope.freq_base", f32::INFINITY),
        ("gemma3.rope.freq_base_swa", 0.0),
        ("gemma3.rope.scaling.factor", f32::NAN),
        ("gemma3.rope.scaling.attn_factor", -1.0),
        ("gemma3.final_logit_softcapping", -3.0),
    ];
    for (key, v) in cases {
        let e = load_err(set(&base, key, MetadataValue::F32(v)));
        let msg = e.to_string();
        assert!(msg.contains(key), "{key} = {v}: {msg}");
    }
    let e = load_err(set(
        &base,
        "gemma3.attention.sliding_window",
        MetadataValue::U32(0),
    ));
    assert!(e.to_string().contains("attention.sliding_window"), "{e}");
}

#[test]
fn a_wrong_typed_architecture_key_is_not_reported_missing() {
    let e = load_err(set(
        &tiny("llama"),
        "general.architecture",
        MetadataValue::U32(7),
    ));
    let msg = e.to_string();
    assert!(msg.contains("general.architecture"), "{msg}");
    assert!(!msg.contains("missing"), "{msg}");
    // Named once, with what it holds and what it must hold.
    assert_eq!(msg.matches("general.architecture").count(), 1, "{msg}");
    assert!(
        msg.contains("expected a string") && msg.contains("uint32"),
        "{msg}"
    );
}

#[test]
fn every_tensor_is_checked_against_the_configuration() {
    let base = tiny("gemma3");
    // A norm of a size that divides the expected one would broadcast silently.
    let short_norm = mutate(&base, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "blk.1.attn_norm.weight")
            .expect("norm");
        t.dims = vec![64];
        t.data = f32_bytes(&[1.0; 64]);
    });
    let e = load_err(short_norm);
    let msg = e.to_string();
    assert!(
        msg.contains("expected [256] for blk.1.attn_norm.weight, found [64]"),
        "{msg}"
    );
    // Vectors must be f32.
    let f16_norm = mutate(&base, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "output_norm.weight")
            .expect("norm");
        t.ty = gguf::GgmlType::F16;
        t.data.truncate(t.data.len() / 2);
    });
    let msg = load_err(f16_norm).to_string();
    assert!(
        msg.contains("expected type F32 for output_norm.weight"),
        "{msg}"
    );
    // A matrix with the wrong inner size.
    let bad_ffn = mutate(&base, |_, ts| {
        let t = ts
            .iter_mut()
            .find(|t| t.name == "blk.0.ffn_down.weight")
            .expect("ffn_down");
        t.dims.reverse();
    });
    let msg = load_err(bad_ffn).to_string();
    assert!(msg.contains("blk.0.ffn_down.weight"), "{msg}");
    // A layer the block count promises but the file lacks.
    let missing = mutate(&base, |_, ts| {
        ts.retain(|t| !t.name.starts_with("blk.1.post_ffw_norm"));
    });
    let e = load_err(missing);
    assert!(e.to_string().contains("blk.1.post_ffw_norm.weight"), "{e}");
}

#[test]
fn the_vocabulary_must_match_the_embedding_rows() {
    let short = mutate(&tiny("llama"), |md, _| {
        for key in ["tokenizer.ggml.tokens", "tokenizer.ggml.token_type"] {
            let v = match md.get(key).cloned() {
                Some(MetadataValue::Array(gguf::ArrayValue::String(mut v))) => {
                    v.pop();
                    MetadataValue::Array(gguf::ArrayValue::String(v))
                }
                Some(MetadataValue::Array(gguf::ArrayValue::I32(mut v))) => {
                    v.pop();
                    MetadataValue::Array(gguf::ArrayValue::I32(v))
                }
                other => panic!("{key}: {other:?}"),
            };
            md.set(key, v);
        }
        // Keep the special ids inside the shorter vocabulary.
        md.set("tokenizer.ggml.bos_token_id", MetadataValue::U32(1));
        md.set("tokenizer.ggml.eos_token_id", MetadataValue::U32(2));
    });
    let msg = load_err(short).to_string();
    assert!(msg.contains("token_embd.weight"), "{msg}");
    assert!(msg.contains("vocabulary"), "{msg}");
}

#[test]
fn special_token_ids_must_be_in_the_vocabulary() {
    let base = tiny("llama");
    for key in [
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.padding_token_id",
    ] {
        let e = load_err(set(&base, key, MetadataValue::U32(1_000_000)));
        let msg = e.to_string();
        assert!(msg.contains(key), "{msg}");
        assert!(msg.contains("outside the vocabulary"), "{msg}");
    }
}

#[test]
fn the_base_model_still_loads_and_runs() {
    for arch in ["llama", "qwen2", "qwen3", "gemma2", "gemma3"] {
        let tm = load(tiny(arch)).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let opts = SessionOptions {
            n_ctx: 16,
            n_threads: 1,
            ..SessionOptions::default()
        };
        let mut s = Session::new(tm.model(), &opts).expect("session");
        let logits = s.eval(&[1, 2, 3], LogitsMode::Last).expect("eval");
        assert!(logits.iter().all(|l| l.is_finite()), "{arch}");
    }
}

#[test]
fn thread_counts_are_capped() {
    let tm = load(tiny("llama")).expect("load");
    let opts = SessionOptions {
        n_ctx: 16,
        n_threads: 100_000,
        ..SessionOptions::default()
    };
    let e = Session::new(tm.model(), &opts).expect_err("100000 threads");
    assert!(matches!(e, ModelError::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("threads"), "{e}");
}

fn ppl_session(tm: &TextModel, n_batch: usize) -> Session {
    let opts = SessionOptions {
        n_ctx: 32,
        n_batch,
        n_threads: 1,
        ..SessionOptions::default()
    };
    Session::new(tm.model(), &opts).expect("session")
}

#[test]
fn perplexity_streams_in_batches_with_the_same_result() {
    let tm = load(tiny("llama")).expect("load");
    let n_vocab = tm.model().config().n_vocab as u32;
    let tokens: Vec<u32> = (0..100u32).map(|i| (i * 7 + 3) % n_vocab).collect();
    let opts = PplOptions {
        n_ctx: 32,
        max_chunks: None,
        bos: None,
    };
    let whole = perplexity(&mut ppl_session(&tm, 32), &tokens, &opts, |_, _, _| {})
        .expect("one batch per window");
    let parts = perplexity(&mut ppl_session(&tm, 5), &tokens, &opts, |_, _, _| {})
        .expect("5-token batches");
    assert_eq!((whole.chunks, whole.scored), (3, 3 * 15));
    assert_eq!((parts.chunks, parts.scored), (whole.chunks, whole.scored));
    assert!(
        (whole.nll - parts.nll).abs() < 1e-4,
        "{} vs {}",
        whole.nll,
        parts.nll
    );
}

#[test]
fn perplexity_arguments_are_explained() {
    let tm = load(tiny("llama")).expect("load");
    let tokens: Vec<u32> = (0..100u32).collect();
    let mut s = ppl_session(&tm, 32);
    let run = |s: &mut Session, n_ctx, max_chunks| {
        let o = PplOptions {
            n_ctx,
            max_chunks,
            bos: None,
        };
        perplexity(s, &tokens, &o, |_, _, _| {}).expect_err("bad arguments")
    };
    let e = run(&mut s, 32, Some(0));
    assert!(matches!(e, ModelError::InvalidArgument(_)), "{e:?}");
    assert!(e.to_string().contains("--chunks 0"), "{e}");
    let e = run(&mut s, 3, None);
    assert!(e.to_string().contains("at least 4 tokens"), "{e}");
    let e = run(&mut s, 64, None);
    assert!(
        e.to_string().contains("exceeds the session's context"),
        "{e}"
    );
}

fn write_tmp(name: &str, bytes: &[u8]) -> PathBuf {
    let p = scratch(name);
    std::fs::write(&p, bytes).expect("write model");
    p
}

fn logits_of(path: &Path, mmap: bool, truncate_after_load: bool) -> Vec<f32> {
    let m = Model::load_with(path, &LoadOptions { mmap }, |_, _| {}).expect("load");
    if truncate_after_load {
        // What a concurrent rewrite does; with the file read into memory it changes nothing.
        std::fs::File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_len(0))
            .expect("truncate");
    }
    let opts = SessionOptions {
        n_ctx: 16,
        n_threads: 1,
        ..SessionOptions::default()
    };
    let mut s = Session::new(&m, &opts).expect("session");
    s.eval(&[1, 2, 3], LogitsMode::Last).expect("eval")
}

#[test]
fn no_mmap_reads_the_file_into_memory() {
    let bytes = tiny("gemma3");
    let path = write_tmp("mmap", &bytes);
    let mapped = logits_of(&path, true, false);
    let path2 = write_tmp("no-mmap", &bytes);
    let read = logits_of(&path2, false, true);
    assert_eq!(mapped, read);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&path2);
}

#[test]
fn a_directory_is_not_a_model() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let e = Model::load(&dir, |_, _| {}).expect_err("a directory");
    assert!(e.to_string().contains("is a directory"), "{e}");
}

/// A FIFO would block the loader forever and a device would be read as a file: both are
/// refused by their kind, before anything opens them.
#[cfg(unix)]
#[test]
fn a_fifo_or_a_device_is_not_a_model() {
    let fifo = scratch("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("run mkfifo");
    assert!(made.success(), "mkfifo {}", fifo.display());
    for path in [fifo.as_path(), Path::new("/dev/zero")] {
        let e = Model::load(path, |_, _| {}).expect_err("not a regular file");
        let msg = e.to_string();
        assert!(msg.contains("not a regular file"), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
    }
    let _ = std::fs::remove_file(&fifo);
}

/// Resident memory of this process in bytes (Linux).
#[cfg(target_os = "linux")]
fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// `-c 0` on a file whose trained context is 4M positions: the 4 GiB KV cache of the tiny
/// model is either refused as out of memory (naming the cache) or taken lazily, so a token costs
/// the rows it writes, not gigabytes of zeroing before the first one.
#[cfg(target_os = "linux")]
#[test]
fn a_long_trained_context_costs_memory_only_as_it_is_used() {
    let tm = load(set(
        &tiny("llama"),
        "llama.context_length",
        MetadataValue::U32(1 << 22),
    ))
    .expect("loads");
    let opts = SessionOptions {
        n_ctx: 0,
        n_batch: 8,
        n_threads: 1,
        device: rocmforge_model::placement::DeviceChoice::Cpu,
        ..SessionOptions::default()
    };
    let before = rss();
    match Session::new(tm.model(), &opts) {
        Ok(mut s) => {
            assert_eq!(s.n_ctx(), 1 << 22);
            s.eval(&[1, 2, 3], LogitsMode::Last).expect("a few tokens");
            let grown = rss().saturating_sub(before);
            assert!(grown < 1 << 30, "{grown} bytes resident for 3 tokens");
        }
        Err(e) => {
            assert!(e.is_out_of_memory(), "{e:?}");
            assert!(e.to_string().contains("cache_"), "{e}");
        }
    }
}

#[test]
fn kv_cache_estimates_saturate_instead_of_wrapping() {
    let tm = load(tiny("llama")).expect("loads");
    let cfg = tm.model().config();
    let huge = rocmforge_model::arch::KvCacheSpec {
        dtype: rocmforge_model::arch::KvType::F32,
        n_ctx: usize::MAX / 2,
    };
    assert_eq!(huge.bytes(cfg), usize::MAX);
    let small = rocmforge_model::arch::KvCacheSpec {
        dtype: rocmforge_model::arch::KvType::F16,
        n_ctx: 16,
    };
    let per_pos = cfg.n_head_kv * (cfg.head_dim + cfg.head_dim_v) * 2;
    assert_eq!(small.bytes(cfg), cfg.n_layer * per_pos * 16);
}

fn merges(v: &[&str]) -> MetadataValue {
    MetadataValue::Array(gguf::ArrayValue::String(
        v.iter().map(|m| (*m).to_owned()).collect(),
    ))
}

#[test]
fn a_bpe_vocabulary_without_merges_is_refused() {
    let none = mutate(&tiny("llama"), |md, _| {
        let mut out = Metadata::new();
        for (k, v) in md.iter() {
            if k != "tokenizer.ggml.merges" {
                out.set(k, v.clone());
            }
        }
        *md = out;
    });
    let e = load_err(none);
    assert!(matches!(e, ModelError::Tokenizer(_)), "{e:?}");
    let msg = e.to_string();
    assert!(msg.contains("tokenizer.ggml.merges is missing"), "{msg}");
    assert!(msg.contains("`gpt2`"), "{msg}");
}

#[test]
fn malformed_merges_are_skipped_as_llama_cpp_skips_them() {
    let base = tiny("llama");
    // Entries without a separating space (as llama.cpp, they never match), around the one
    // real merge: it must still apply, at its own rank.
    let odd = set(
        &base,
        "tokenizer.ggml.merges",
        merges(&["Ġt", "", " ", "Ġ t", "\u{1b}[2J"]),
    );
    let tm = load(odd).expect("malformed merges are skipped, not fatal");
    let merged = tm.tokenizer().encode(" t", false, false);
    let original = load(base).expect("base");
    assert_eq!(merged, original.tokenizer().encode(" t", false, false));
    assert_eq!(merged.len(), 1, "{merged:?}");
}
