//! The synthetic models behind `data/synth_*.json` regenerate bit for bit through the library
//! API (`rocmforge_model::synth::golden_spec` + `rocmforge_model::synth::write`): the sha256 llama.cpp's goldens
//! were computed on must match before anyone compares logits against them.
//!
//! To (re)write the files for `scripts/make_goldens.py synth`:
//! `ROCMFORGE_VOCAB_DIR=~/.cache/rocmforge/vocabs ROCMFORGE_SYNTH_OUT=/tmp/synth cargo test -p rocmforge-model --test synth_goldens`

use std::path::PathBuf;

use sha2::{Digest, Sha256};

fn golden(name: &str) -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/synth_{name}.json"));
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

#[test]
fn synthetic_files_regenerate_identically() {
    let Some(vocabs) = std::env::var_os("ROCMFORGE_VOCAB_DIR").map(PathBuf::from) else {
        println!("skipped: ROCMFORGE_VOCAB_DIR not set (run `cargo xtask fetch-vocabs`)");
        return;
    };
    let out = std::env::var_os("ROCMFORGE_SYNTH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("synth"));
    std::fs::create_dir_all(&out).expect("output folder");
    // Write all four first, so a changed writer still leaves the files for make_goldens.py.
    let mut shas = Vec::new();
    for name in rocmforge_model::synth::GOLDEN_NAMES {
        let (opts, vocab) = rocmforge_model::synth::golden_spec(name).expect("known golden");
        let path = out.join(format!("synth-{name}.gguf"));
        rocmforge_model::synth::write(&opts, Some(&vocabs.join(vocab)), &path)
            .expect("write synthetic model");
        let bytes = std::fs::read(&path).expect("read back");
        let sha = format!("{:x}", Sha256::digest(&bytes));
        println!("{}: {sha}", path.display());
        shas.push((name, sha));
    }
    for (name, sha) in shas {
        let g = golden(name);
        assert_eq!(
            Some(sha.as_str()),
            g["model_sha256"].as_str(),
            "{name}: synthetic file differs from the one the goldens were made on"
        );
    }
}
