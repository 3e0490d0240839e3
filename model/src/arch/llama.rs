//! Llama 2/3 and Mistral: pre-norm blocks of RMS norm, rotary attention (adjacent-pair rope,
//! optional `rope_freqs` factors for Llama 3.1) and a SwiGLU feed-forward, dense or (Mixtral) a
//! mixture of experts.

use ggml_graph::{Act, TensorId};

use super::Builder;
use crate::error::ModelError;

/// The llama-family block stack, shared by Qwen2 (biases come from the file) and Qwen3 (with
/// `qk_norm`). Returns the last hidden state `[n_embd, n_tok]`, before the output norm.
pub(crate) fn blocks(b: &mut Builder<'_>, qk_norm: bool) -> Result<TensorId, ModelError> {
    let mut x = b.embed()?;
    for il in 0..b.cfg.n_layer {
        let h = b.rms_norm(x, &format!("blk.{il}.attn_norm.weight"))?;
        let a = b.self_attention(il, h, qk_norm)?;
        let a = b.keep_needed_rows(il, a)?;
        x = b.keep_needed_rows(il, x)?;
        let x1 = b.g.add(a, x)?;
        let h = b.rms_norm(x1, &format!("blk.{il}.ffn_norm.weight"))?;
        let f = b.ffn(il, h, Act::Silu)?;
        x = b.g.add(f, x1)?;
    }
    Ok(x)
}

/// Builds the llama plan.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    blocks(b, false)
}
