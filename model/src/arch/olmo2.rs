//! OLMo 2: no norms before attention or the feed-forward; RMS norms over the whole query and
//! key vectors (before rope, see [`Builder::self_attention`]), on the attention output and on
//! the feed-forward output before each residual add; SwiGLU, split-half rope, untied output.

use ggml_graph::{Act, TensorId};

use super::Builder;
use crate::error::ModelError;

/// Builds the OLMo 2 plan; returns the last hidden state before the output norm.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    let mut x = b.embed()?;
    for il in 0..b.cfg.n_layer {
        let a = b.self_attention(il, x, false)?;
        let a = b.keep_needed_rows(il, a)?;
        x = b.keep_needed_rows(il, x)?;
        let a = b.rms_norm(a, &format!("blk.{il}.post_attention_norm.weight"))?;
        b.tag(a, "attn_post_norm", il)?;
        let x1 = b.g.add(a, x)?;
        b.tag(x1, "ffn_inp", il)?;
        let f = b.gated_ffn(il, x1, Act::Silu)?;
        let f = b.rms_norm(f, &format!("blk.{il}.post_ffw_norm.weight"))?;
        b.tag(f, "ffn_post_norm", il)?;
        x = b.g.add(f, x1)?;
        b.tag(x, "l_out", il)?;
    }
    Ok(x)
}
