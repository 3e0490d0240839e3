//! Our tokenizer against llama.cpp's own vocabulary tests: the `ggml-vocab-*.gguf` files with
//! their `.inp` (texts separated by `\n__ggml_vocab_test__\n`) and `.out` (one line of ids per
//! text) from the llama-cpp-python sdist, fetched by `cargo xtask fetch-vocabs` into the folder
//! named by `ROCMFORGE_VOCAB_DIR`. Texts are encoded as llama.cpp's test does: no BOS/EOS,
//! special tokens not parsed.

use std::path::{Path, PathBuf};

use rocmforge_model::tokenizer::Tokenizer;

/// Every vocabulary of llama.cpp's test set that has `.inp`/`.out` cases (`cargo xtask
/// fetch-vocabs` extracts them all).
/// One list, one name a line, shared by the tokenizer test and `cargo xtask fetch-vocabs`.
const VOCAB_LIST: &str = include_str!("data/llama_cpp_vocabs.txt");

fn vocab_names() -> impl Iterator<Item = &'static str> {
    VOCAB_LIST.lines().map(str::trim).filter(|l| !l.is_empty())
}

fn vocab_dir() -> Option<PathBuf> {
    match std::env::var_os("ROCMFORGE_VOCAB_DIR") {
        Some(d) => Some(PathBuf::from(d)),
        None => {
            println!("skipped: ROCMFORGE_VOCAB_DIR not set (run `cargo xtask fetch-vocabs`)");
            None
        }
    }
}

fn read_cases(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let base = dir.join(format!("ggml-vocab-{name}.gguf"));
    let inp = std::fs::read_to_string(base.with_extension("gguf.inp"))
        .unwrap_or_else(|e| panic!("{}.inp: {e}", base.display()));
    let out = std::fs::read_to_string(base.with_extension("gguf.out"))
        .unwrap_or_else(|e| panic!("{}.out: {e}", base.display()));
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(n) => {
                texts.push(inp[pos..pos + n].to_owned());
                pos += n + sep.len();
            }
            None => {
                texts.push(inp[pos..].to_owned());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| {
                    t.parse()
                        .unwrap_or_else(|e| panic!("bad id `{t}` in {name}.out: {e}"))
                })
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{name}: .inp and .out disagree on the number of tests"
    );
    texts.into_iter().zip(ids).collect()
}

#[test]
fn llama_cpp_vocab_tests() {
    let Some(dir) = vocab_dir() else { return };
    let mut failures = Vec::new();
    let mut checked = 0;
    let only = std::env::var("ROCMFORGE_VOCAB_ONLY").ok();
    for name in vocab_names() {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let path = dir.join(format!("ggml-vocab-{name}.gguf"));
        let file =
            gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (text, want) in read_cases(&dir, name) {
            let got = tok.encode(&text, false, false);
            checked += 1;
            if got != want {
                failures.push(format!("{name}: {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
    }
    assert!(
        only.is_some() || checked > 500,
        "only {checked} cases found"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn llama_cpp_vocab_round_trip() {
    // Every case's expected ids detokenize back to the input for the BPE vocabularies
    // (byte-level, so lossless) — checks pieces and the byte table.
    let Some(dir) = vocab_dir() else { return };
    for name in ["llama-bpe", "qwen2"] {
        let file =
            gguf::GgufFile::open(dir.join(format!("ggml-vocab-{name}.gguf"))).expect("open vocab");
        let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
        for (text, ids) in read_cases(&dir, name) {
            let bytes: Vec<u8> = ids.iter().flat_map(|&i| tok.token_to_piece(i)).collect();
            assert_eq!(String::from_utf8_lossy(&bytes), text, "{name}");
        }
    }
}

#[test]
fn default_pre_tokenizer_equals_llama_cpp() {
    // llama.cpp's test set has no vocabulary with the `default` pre-tokenizer: the golden was
    // made on the gpt-2 vocabulary with `tokenizer.ggml.pre` rewritten to "default"
    // (`scripts/make_goldens.py bpe-default`).
    let Some(dir) = vocab_dir() else { return };
    let file = gguf::GgufFile::open(dir.join("ggml-vocab-gpt-2.gguf")).expect("open vocab");
    let mut parts =
        rocmforge_model::tokenizer::VocabParts::from_metadata(file.metadata()).expect("vocab");
    parts.pre = Some("default".to_owned());
    let tok = Tokenizer::from_parts(parts).expect("tokenizer");
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bpe_default_pre.json");
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&p).expect("golden")).expect("golden JSON");
    let mut bad = Vec::new();
    let cases = g["cases"].as_array().expect("cases");
    for c in cases {
        let text = c["text"].as_str().expect("text");
        let want: Vec<u32> = c["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        let got = tok.encode(text, false, false);
        if got != want {
            bad.push(format!("{text:?}\n  want {want:?}\n  got  {got:?}"));
        }
    }
    assert!(cases.len() > 50);
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}
