//! Generates text with the library API alone (no CLI): load a GGUF model, encode a prompt,
//! generate greedily or with a seed, and stream the text as it becomes final.
//!
//! `cargo run -p rocmforge-model --release --example generate -- [MODEL.gguf] ["PROMPT"] [SEED]`
//!
//! Without a model file it writes a tiny synthetic Llama to the temporary directory and uses
//! that (random weights: the text is noise, the path through the library is the real one).

use std::io::Write;
use std::path::PathBuf;

use rocmforge_model::generate::{generate, GenerateOptions};
use rocmforge_model::sampling::{Sampler, SamplerConfig};
use rocmforge_model::session::{Session, SessionOptions};
use rocmforge_model::text::TextModel;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (path, synthetic) = match args.next() {
        Some(p) => (PathBuf::from(p), false),
        None => {
            let p =
                std::env::temp_dir().join(format!("rocmforge-example-{}.gguf", std::process::id()));
            rocmforge_model::synth::write_model("llama", &p, 1)?;
            (p, true)
        }
    };
    let prompt_text = args
        .next()
        .unwrap_or_else(|| "The capital of France is".to_owned());
    let sampling = match args.next() {
        Some(seed) => SamplerConfig {
            seed: seed.parse().map_err(|e| format!("SEED {seed:?}: {e}"))?,
            ..SamplerConfig::default()
        },
        None => SamplerConfig::greedy(),
    };

    let tm = TextModel::load(&path, |_done, _total| {})?;
    if synthetic {
        std::fs::remove_file(&path)?;
    }
    let opts = SessionOptions {
        n_ctx: 1024.min(tm.model().config().n_ctx_train),
        ..Default::default()
    };
    let mut session = Session::new(tm.model(), &opts)?;
    let prompt = tm.encode(&prompt_text, true)?;
    let mut sampler = Sampler::new(sampling);
    let gen_opts = GenerateOptions {
        max_tokens: 32,
        // A synthetic model's end tokens mean nothing.
        ignore_eog: synthetic,
        ..Default::default()
    };
    print!("{prompt_text}");
    let g = generate(
        &mut session,
        &tm,
        &mut sampler,
        &prompt,
        &gen_opts,
        |text| {
            print!("{text}");
            let _ = std::io::stdout().flush();
        },
    )?;
    println!();
    eprintln!(
        "{} prompt tokens, {} generated ({:.1} tokens/s), stopped: {:?}",
        g.prompt_tokens,
        g.tokens.len(),
        g.tokens.len() as f64 / g.gen_s.max(1e-9),
        g.stop
    );
    Ok(())
}
