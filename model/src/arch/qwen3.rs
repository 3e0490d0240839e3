//! Qwen3: the llama block with per-head RMS norms on queries and keys (before rope), no q/k/v
//! biases, and split-half (NeoX) rope.

use ggml_graph::TensorId;

use super::Builder;
use crate::error::ModelError;

/// Builds the Qwen3 plan.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    super::llama::blocks(b, true)
}
