//! Host time of sampling one row of logits, the batching engine's per-sequence cost after
//! every step: rows of Llama 3's 128,256 entries (a smooth random spread of logits with a few
//! strong tokens, as a model's rows look), for the sampler settings a server sees: greedy,
//! greedy with repetition penalties, llama.cpp's defaults (top-k 40, top-p 0.95, min-p 0.05),
//! the defaults with penalties, min-p alone (no top-k) and the full vocabulary (no filter).
//!
//! `cargo bench -p rocmforge-model --bench sampling` (`SAMPLING_ROWS=64`, `SAMPLING_RUNS=5` set
//! the rows per run and the runs; the best run is printed, in microseconds per row).

use std::time::Instant;

use rocmforge_model::sampling::{Rng, Sampler, SamplerConfig};

const N_VOCAB: usize = 128_256;

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
        .max(1)
}

/// A row of logits: most entries spread over [-12, 4), a handful of strong tokens above.
fn row(rng: &mut Rng) -> Vec<f32> {
    let mut r: Vec<f32> = (0..N_VOCAB)
        .map(|_| (rng.next_f64() * 16.0 - 12.0) as f32)
        .collect();
    for i in 0..8 {
        let t = (rng.next_u64() % N_VOCAB as u64) as usize;
        r[t] = 8.0 + i as f32 * 0.5 + rng.next_f64() as f32;
    }
    r
}

fn main() {
    let n_rows = env_usize("SAMPLING_ROWS", 64);
    let runs = env_usize("SAMPLING_RUNS", 5);
    let mut rng = Rng::new(7);
    let rows: Vec<Vec<f32>> = (0..n_rows).map(|_| row(&mut rng)).collect();
    let penalties = SamplerConfig {
        repeat_penalty: 1.1,
        frequency_penalty: 0.1,
        presence_penalty: 0.1,
        ..SamplerConfig::default()
    };
    let settings = [
        ("greedy", SamplerConfig::greedy()),
        (
            "greedy + penalties (64 recent)",
            SamplerConfig {
                temperature: 0.0,
                ..penalties.clone()
            },
        ),
        ("top-k 40, top-p 0.95, min-p 0.05", SamplerConfig::default()),
        ("the same + penalties (64 recent)", penalties),
        (
            "min-p 0.05 alone (top-k 0)",
            SamplerConfig {
                top_k: 0,
                top_p: 1.0,
                ..SamplerConfig::default()
            },
        ),
        (
            "full vocabulary (top-k 0, top-p 1, min-p 0)",
            SamplerConfig {
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                ..SamplerConfig::default()
            },
        ),
    ];
    println!("{n_rows} rows of {N_VOCAB} logits; best of {runs} runs");
    println!("{:<46} {:>10}", "setting", "us/row");
    for (name, cfg) in settings {
        let mut s = Sampler::new(cfg);
        // A full penalty window of distinct recent tokens.
        for _ in 0..64 {
            s.accept((rng.next_u64() % N_VOCAB as u64) as u32);
        }
        let mut best = f64::INFINITY;
        for _ in 0..runs {
            let t = Instant::now();
            for r in &rows {
                std::hint::black_box(s.sample(r));
            }
            best = best.min(t.elapsed().as_secs_f64() * 1e6 / n_rows as f64);
        }
        println!("{name:<46} {best:>10.1}");
    }
}
