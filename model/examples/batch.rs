//! Sends several prompts through the batching engine at once (as a server does) and prints each
//! completion with its finish reason and the engine's counters.
//!
//! `cargo run -p rocmforge-model --release --example batch -- [MODEL.gguf] ["PROMPT" ...]`
//!
//! Without a model file it writes a tiny synthetic Qwen2 to the temporary directory.

use std::path::PathBuf;
use std::sync::Arc;

use rocmforge_model::batch::{BatchEngine, EngineOptions, Event, Request};
use rocmforge_model::text::TextModel;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (path, synthetic) = match args.next() {
        Some(p) => (PathBuf::from(p), false),
        None => {
            let p =
                std::env::temp_dir().join(format!("rocmforge-batch-{}.gguf", std::process::id()));
            rocmforge_model::synth::write_model("qwen2", &p, 2)?;
            (p, true)
        }
    };
    let mut prompts: Vec<String> = args.collect();
    if prompts.is_empty() {
        prompts = [
            "Once upon a time",
            "The three primary colours are",
            "fn main() {",
        ]
        .map(String::from)
        .to_vec();
    }

    let tm = TextModel::load(&path, |_done, _total| {})?;
    if synthetic {
        std::fs::remove_file(&path)?;
    }
    let opts = EngineOptions {
        max_seqs: prompts.len(),
        n_ctx_per_seq: 512.min(tm.model().config().n_ctx_train),
        ..Default::default()
    };
    let engine = BatchEngine::start(Arc::new(tm.model().clone()), opts)?;
    let eog = tm.tokenizer().eog_ids();
    let mut streams = Vec::new();
    for p in &prompts {
        let mut req = Request::greedy(tm.encode(p, true)?, 24);
        if !synthetic {
            req.stop_tokens = eog.clone();
        }
        streams.push(engine.submit_channel(req)?.1);
    }
    // The engine decodes all of them together; each channel holds one request's events.
    for (p, events) in prompts.iter().zip(streams) {
        let mut text = String::new();
        for event in events.iter() {
            match event {
                Event::Token { text: piece, .. } => text.push_str(&piece),
                Event::Done {
                    reason,
                    usage,
                    text: rest,
                } => {
                    text.push_str(&rest);
                    println!(
                        "{p:?} -> {text:?} ({reason:?}, {} prompt + {} generated tokens)",
                        usage.prompt_tokens, usage.completion_tokens
                    );
                    break;
                }
                Event::Error(e) => return Err(e.into()),
            }
        }
    }
    let s = engine.stats();
    println!(
        "{} steps, {} prompt and {} generated tokens, {} preemptions",
        s.steps, s.prompt_tokens, s.generated_tokens, s.preemptions
    );
    engine.shutdown();
    Ok(())
}
