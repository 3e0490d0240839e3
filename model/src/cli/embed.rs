//! `rocmforge embed`: the embedding of a text (as llama.cpp's `llama-embedding`), pooled as the
//! model's `{arch}.pooling_type` asks, unit length, printed as a JSON array.

use std::sync::Arc;

use clap::Args;

use super::run::prompt_text;
use super::{ModelArgs, PromptArgs};
use crate::batch::{BatchEngine, EngineOptions, Pooling};
use crate::error::ModelError;

/// The options of `rocmforge embed`.
#[derive(Args, Debug)]
pub struct EmbedArgs {
    #[command(flatten)]
    m: ModelArgs,
    #[command(flatten)]
    prompt: PromptArgs,
    /// How the tokens' vectors are pooled: none (one vector per token), mean, cls (the first
    /// token) or last; default: the model's `pooling_type`, else mean.
    #[arg(long)]
    pooling: Option<Pooling>,
}

/// The embedding of `tokens` through a one-sequence batch engine: one vector, or with
/// [`Pooling::None`] one per token.
fn embed_tokens(
    a: &EmbedArgs,
    tm: &crate::text::TextModel,
    tokens: Vec<u32>,
    pooling: Pooling,
) -> Result<Vec<Vec<f32>>, ModelError> {
    let model = Arc::new(tm.model().clone());
    let n = tokens.len();
    let n_ctx_train = model.config().n_ctx_train;
    if n > n_ctx_train {
        return Err(ModelError::ContextFull {
            needed: n,
            n_ctx: n_ctx_train,
        });
    }
    let mut session = a.m.session_options(tm)?;
    session.n_ctx = 0;
    let opts = EngineOptions {
        session,
        max_seqs: 1,
        n_ctx_per_seq: n,
        // The whole text is one pass: an encoder sees all of it at once.
        step_tokens: n,
        prefix_cache: false,
        ..EngineOptions::default()
    };
    let e = BatchEngine::start(model, opts)?;
    let d = tm.model().config().n_embd;
    let v = e.embed(tokens, pooling)?;
    Ok(v.chunks_exact(d).map(<[f32]>::to_vec).collect())
}

pub(super) fn embed(a: &EmbedArgs) -> Result<(), ModelError> {
    let tm = a.m.load()?;
    let text = prompt_text(&a.prompt)?;
    let tokens = tm.tokenizer().encode(&text, true, true);
    if tokens.is_empty() {
        return Err(ModelError::InvalidArgument("the text is empty".into()));
    }
    let pooling = match a.pooling {
        Some(p) => p,
        None => Pooling::of_model(tm.model())?.unwrap_or_default(),
    };
    let vectors = embed_tokens(a, &tm, tokens, pooling)?;
    let json = if pooling == Pooling::None {
        serde_json::to_string(&vectors)
    } else {
        serde_json::to_string(&vectors[0])
    }
    .map_err(|e| ModelError::InvalidArgument(format!("embedding to JSON: {e}")))?;
    println!("{json}");
    Ok(())
}
