//! gpt-oss: pre-norm blocks whose attention has biased q/k/v/output projections, one sink
//! logit per head (`attn_sinks`) and a sliding window on every other layer, split-half YaRN
//! rope, and a mixture-of-experts feed-forward (normalized by `post_attention_norm`) with a
//! biased router, softmax over the chosen experts' logits, per-expert biases and a clamped
//! SwiGLU (see [`crate::config::Moe`]).

use ggml_graph::{Act, TensorId};

use super::Builder;
use crate::error::ModelError;

/// Builds the gpt-oss plan; returns the last hidden state before the output norm.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let mut x = b.embed()?;
    for il in 0..b.cfg.n_layer {
        let h = b.rms_norm(x, &format!("blk.{il}.attn_norm.weight"))?;
        b.tag(h, "attn_norm", il)?;
        let a = b.self_attention(il, h, false)?;
        let a = b.keep_needed_rows(il, a)?;
        x = b.keep_needed_rows(il, x)?;
        let x1 = b.g.add(a, x)?;
        b.tag(x1, "ffn_inp", il)?;
        let h = b.rms_norm(x1, &format!("blk.{il}.post_attention_norm.weight"))?;
        b.tag(h, "attn_post_norm", il)?;
        // The activation is the configuration's clamped SwiGLU; `Act` is unused by it.
        let f = b.ffn(il, h, Act::Silu)?;
        x = b.g.add(f, x1)?;
        b.tag(x, "l_out", il)?;
    }
    Ok(x)
}
