//! Granite (3.x dense): the llama block with the configuration's scales: embeddings times
//! `embedding_scale` (see [`Builder::embed`]), scores times `attention.scale`, the attention
//! and feed-forward outputs times `residual_scale` before each residual add, and the logits
//! divided by `logit_scale` (see [`crate::config::ModelConfig`]).

use ggml_graph::{Act, TensorId};

use super::Builder;
use crate::error::ModelError;

/// Builds the Granite plan; returns the last hidden state before the output norm.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let rs = b.cfg.residual_scale;
    let mut x = b.embed()?;
    for il in 0..b.cfg.n_layer {
        let h = b.rms_norm(x, &format!("blk.{il}.attn_norm.weight"))?;
        let a = b.self_attention(il, h, false)?;
        let mut a = b.keep_needed_rows(il, a)?;
        x = b.keep_needed_rows(il, x)?;
        if let Some(s) = rs {
            a = b.g.scale(a, s)?;
        }
        let x1 = b.g.add(a, x)?;
        b.tag(x1, "ffn_inp", il)?;
        let h = b.rms_norm(x1, &format!("blk.{il}.ffn_norm.weight"))?;
        let mut f = b.ffn(il, h, Act::Silu)?;
        if let Some(s) = rs {
            f = b.g.scale(f, s)?;
        }
        x = b.g.add(f, x1)?;
        b.tag(x, "l_out", il)?;
    }
    Ok(x)
}
