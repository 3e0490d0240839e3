//! The embedding encoders (BERT, Nomic BERT) on tiny synthetic files
//! (`rocmforge_model::synth::embed_spec`, BGE's WordPiece vocabulary from `ROCMFORGE_VOCAB_DIR`)
//! against llama.cpp's `llama-embedding` on the same files (`data/embed_*.json`, from
//! `scripts/embed_goldens.sh`): the file regenerates bit for bit, and the unit-length
//! embeddings of each prompt through the batch engine (what `rocmforge embed` and the server
//! run) are within 1e-3 of llama.cpp's in every component, for every pooling and for the one
//! the file names.
//!
//! With `ROCMFORGE_SYNTH_OUT` set the files are written there (for the goldens script).

use std::path::PathBuf;
use std::sync::Arc;

use rocmforge_model::batch::{BatchEngine, EngineOptions, Pooling};
use rocmforge_model::placement::DeviceChoice;
use rocmforge_model::session::{Model, SessionOptions};
use rocmforge_model::text::TextModel;
use serial_test::serial;
use sha2::{Digest, Sha256};

fn golden(file: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/{file}"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

/// |ours - llama.cpp| allowed on each component of a unit-length embedding.
const TOL: f32 = 1e-3;

fn floats(v: &serde_json::Value) -> Vec<f32> {
    match v.as_array() {
        Some(a) => a.iter().flat_map(floats).collect(),
        None => vec![v.as_f64().expect("number") as f32],
    }
}

fn check(name: &str) {
    let Some(vocabs) = std::env::var_os("ROCMFORGE_VOCAB_DIR").map(PathBuf::from) else {
        println!("skipped: ROCMFORGE_VOCAB_DIR not set (run `cargo xtask fetch-vocabs`)");
        return;
    };
    let (opts, vocab) = rocmforge_model::synth::embed_spec(name).expect("known encoder");
    let dir = std::env::var_os("ROCMFORGE_SYNTH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("embed-models"));
    std::fs::create_dir_all(&dir).expect("output folder");
    let path = dir.join(format!("embed-{name}.gguf"));
    rocmforge_model::synth::write(&opts, Some(&vocabs.join(vocab)), &path)
        .expect("write synthetic model");
    let sha = format!(
        "{:x}",
        Sha256::digest(std::fs::read(&path).expect("read back"))
    );
    let g = golden(&format!("embed_{name}.json"));
    assert_eq!(
        Some(sha.as_str()),
        g["model_sha256"].as_str(),
        "{name}: the synthetic file differs from the one the reference was made on"
    );
    let tm = TextModel::from_model(Model::load(&path, |_, _| {}).expect("load")).expect("text");
    let own = Pooling::of_model(tm.model()).expect("pooling type");
    let want_own: Pooling = g["pooling_type"]
        .as_str()
        .expect("pooling")
        .parse()
        .expect("name");
    assert_eq!(own, Some(want_own), "{name}: the file's pooling type");
    let session = SessionOptions {
        n_threads: 2,
        device: DeviceChoice::Cpu,
        ..SessionOptions::default()
    };
    let e = BatchEngine::start(
        Arc::new(tm.model().clone()),
        EngineOptions {
            session,
            max_seqs: 1,
            n_ctx_per_seq: 64,
            step_tokens: 64,
            prefix_cache: false,
            ..EngineOptions::default()
        },
    )
    .expect("engine");
    let mut worst = 0f32;
    let mut compared = 0;
    for p in g["prompts"].as_array().expect("prompts") {
        let text = p["text"].as_str().expect("text");
        let ids = tm.tokenizer().encode(text, true, true);
        for (pooling, want) in p["embeddings"].as_object().expect("embeddings") {
            let got = e
                .embed(ids.clone(), pooling.parse().expect("pooling name"))
                .expect("embed");
            let want = floats(want);
            assert_eq!(got.len(), want.len(), "{name} `{text}` {pooling}: length");
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                let d = (a - b).abs();
                assert!(
                    d <= TOL,
                    "{name} `{text}` {pooling}: component {i}: {a} vs llama.cpp {b}"
                );
                worst = worst.max(d);
            }
            compared += 1;
        }
    }
    println!("{name}: {compared} embeddings, max |diff| from llama.cpp {worst:.2e}");
    assert!(compared >= 4, "{name}: only {compared} embeddings compared");
}

#[test]
#[serial]
fn bert_matches_llama_embedding() {
    check("bert");
}

#[test]
#[serial]
fn nomic_bert_matches_llama_embedding() {
    check("nomic-bert");
}
