//! Phi-3: the llama block with one fused q/k/v projection (`attn_qkv`), one fused gate/up
//! projection (`ffn_up`, gate in the first half), split-half (NeoX) rope with LongRoPE's long
//! or short frequency factors (`rope_factors_{long,short}`), queries scaled before attention,
//! and no sliding window (llama.cpp ignores Phi-3's `sliding_window` key).

use ggml_graph::TensorId;

use super::Builder;
use crate::error::ModelError;

/// Builds the Phi-3 plan; the fused projections and rope factors are read from the file by the
/// shared attention and feed-forward code.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    super::llama::blocks(b, false)
}
