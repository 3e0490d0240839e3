//! Qwen3 and Qwen3-MoE: the llama block with per-head RMS norms on queries and keys (before
//! rope), no q/k/v biases, and split-half (NeoX) rope; Qwen3-MoE's feed-forward is a mixture of
//! experts.

use ggml_graph::TensorId;

use super::Builder;
use crate::error::ModelError;

/// Builds the Qwen3 (and Qwen3-MoE) plan.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    super::llama::blocks(b, true)
}
