//! Gemma 3: embeddings scaled by sqrt(n_embd), per-head q/k RMS norms, norms after attention and
//! after the feed-forward as well as before, a GELU-gated feed-forward, tied output, and
//! sliding-window attention on five of every six layers (with their own rope base, see
//! [`crate::config`]). Norm weights in GGUF files already include Gemma's `+1`.

use ggml_graph::{Act, TensorId};

use super::Builder;
use crate::error::ModelError;

/// Builds the Gemma 3 plan; returns the last hidden state before the output norm.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    blocks(b, true)
}

/// The Gemma 2/3 block stack; `qk_norm` selects Gemma 3's per-head q/k norms. Soft-capping
/// (Gemma 2) comes from the configuration, applied by the shared attention and output code.
pub(crate) fn blocks(b: &mut Builder<'_>, qk_norm: bool) -> Result<TensorId, ModelError> {
    let mut x = b.embed()?;
    for il in 0..b.cfg.n_layer {
        let h = b.rms_norm(x, &format!("blk.{il}.attn_norm.weight"))?;
        b.tag(h, "attn_norm", il)?;
        let a = b.self_attention(il, h, qk_norm)?;
        let a = b.keep_needed_rows(il, a)?;
        x = b.keep_needed_rows(il, x)?;
        let a = b.rms_norm(a, &format!("blk.{il}.post_attention_norm.weight"))?;
        b.tag(a, "attn_post_norm", il)?;
        let x1 = b.g.add(a, x)?;
        b.tag(x1, "sa_out", il)?;
        let h = b.rms_norm(x1, &format!("blk.{il}.ffn_norm.weight"))?;
        b.tag(h, "ffn_norm", il)?;
        let f = b.gated_ffn(il, h, Act::Gelu)?;
        let f = b.rms_norm(f, &format!("blk.{il}.post_ffw_norm.weight"))?;
        b.tag(f, "ffn_post_norm", il)?;
        x = b.g.add(f, x1)?;
        b.tag(x, "l_out", il)?;
    }
    Ok(x)
}
