//! Gemma 3's SentencePiece vocabulary against llama.cpp's ids for a varied text set
//! (`data/gemma3_tokenizer.json`, made by `scripts/make_goldens.py gemma`), plus its special
//! ids and detokenization.

use std::path::PathBuf;

use rocmforge_model::tokenizer::{Kind, StreamDecoder, Tokenizer};

fn model() -> Option<Tokenizer> {
    let Some(path) = std::env::var_os("ROCMFORGE_TEST_MODEL") else {
        println!("skipped: ROCMFORGE_TEST_MODEL not set");
        return None;
    };
    let file = gguf::GgufFile::open(&path).expect("open test model");
    Some(Tokenizer::from_gguf(&file).expect("tokenizer from the test model"))
}

fn golden() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/gemma3_tokenizer.json");
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).expect("golden JSON")
}

fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .expect("id array")
        .iter()
        .map(|x| x.as_u64().expect("id") as u32)
        .collect()
}

#[test]
fn gemma_ids_equal_llama_cpp() {
    let Some(tok) = model() else { return };
    let g = golden();
    let cases = g["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20);
    let mut bad = Vec::new();
    for c in cases {
        let text = c["text"].as_str().expect("text");
        for (key, add, special) in [
            ("plain", false, false),
            ("bos", true, false),
            ("bos_special", true, true),
        ] {
            let want = ids(&c[key]);
            let got = tok.encode(text, add, special);
            if got != want {
                bad.push(format!("{key} {text:?}\n  want {want:?}\n  got  {got:?}"));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn gemma_specials_and_round_trip() {
    let Some(tok) = model() else { return };
    assert_eq!(tok.kind(), Kind::Spm);
    assert_eq!(tok.n_vocab(), 262_144);
    assert_eq!(tok.bos(), Some(2));
    assert_eq!(tok.eog_ids(), vec![1, 106, 212]);
    assert!(tok.is_eog(106) && !tok.is_eog(2));
    let sot = tok.token_id("<start_of_turn>").expect("<start_of_turn>");
    assert_eq!(tok.token_to_piece(sot), b"<start_of_turn>");
    for c in golden()["cases"].as_array().expect("cases") {
        let text = c["text"].as_str().expect("text");
        if text.contains('<') {
            continue;
        }
        let ids = tok.encode(text, true, false);
        assert_eq!(tok.decode(&ids), text);
        // Streaming the pieces gives the same text, never half a character.
        let mut d = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids[1..] {
            streamed.push_str(&d.push(&tok.token_to_piece(id)));
        }
        streamed.push_str(&d.finish());
        assert_eq!(streamed, text);
    }
}
