//! Gemma 2: Gemma 3's block (embeddings scaled by sqrt(n_embd), norms before and after
//! attention and the feed-forward, GELU-gated feed-forward, tied output) without the q/k norms,
//! with every other layer on a sliding window and soft-capped attention scores and logits
//! (`{arch}.attn_logit_softcapping`, `{arch}.final_logit_softcapping`; see [`crate::config`]).

use ggml_graph::TensorId;

use super::Builder;
use crate::error::ModelError;

/// Builds the Gemma 2 plan; returns the last hidden state before the output norm.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    super::gemma3::blocks(b, false)
}
