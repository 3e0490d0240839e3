//! Tokenizer throughput: encodes about 1 MB of plain English text (the perplexity sample,
//! repeated; once as one line, once with its newlines) with the vocabulary of the GGUF named by
//! `ROCMFORGE_TEST_MODEL` or the first argument, and prints MB/s.
//!
//! `ROCMFORGE_TEST_MODEL=~/.cache/rocmforge/models/gemma-3-270m-q4_k_m.gguf cargo bench -p rocmforge-model --bench tokenizer`

use std::time::Instant;

use rocmforge_model::tokenizer::Tokenizer;

const TARGET_BYTES: usize = 1 << 20;
const RUNS: usize = 5;

fn main() {
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("ROCMFORGE_TEST_MODEL").map(Into::into));
    let Some(path) = path else {
        println!("skipped: set ROCMFORGE_TEST_MODEL or pass a GGUF path");
        return;
    };
    let file = gguf::GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let tok = Tokenizer::from_gguf(&file).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let sample = include_str!("../tests/data/perplexity.txt");
    let mut text = String::with_capacity(TARGET_BYTES + sample.len());
    while text.len() < TARGET_BYTES {
        text.push_str(sample);
        text.push(' ');
    }
    let one_line = text.replace('\n', " ");
    for (name, t, special) in [
        ("one line, plain", &one_line, false),
        ("one line, parse_special", &one_line, true),
        ("with newlines, parse_special", &text, true),
    ] {
        let mut best = f64::INFINITY;
        let mut n_tokens = 0;
        for _ in 0..RUNS {
            let t0 = Instant::now();
            n_tokens = std::hint::black_box(tok.encode(t, true, special)).len();
            best = best.min(t0.elapsed().as_secs_f64());
        }
        println!(
            "{name:<30} {:>8} bytes -> {n_tokens:>7} tokens  best of {RUNS}: {:>8.3} s  {:>7.2} MB/s",
            t.len(),
            best,
            t.len() as f64 / best / 1e6
        );
    }
}
