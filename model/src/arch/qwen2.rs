//! Qwen2: the llama block with biases on the q, k and v projections (read from the file's
//! `attn_{q,k,v}.bias` tensors) and split-half (NeoX) rope.

use ggml_graph::TensorId;

use super::Builder;
use crate::error::ModelError;

/// Builds the Qwen2 plan; the biases are required here, unlike in llama files.
pub fn build(b: &mut Builder<'_>) -> Result<TensorId, ModelError> {
    for il in 0..b.cfg.n_layer {
        for p in ["attn_q", "attn_k", "attn_v"] {
            let name = format!("blk.{il}.{p}.bias");
            if b.weight_opt(&name)?.is_none() {
                return Err(ModelError::MissingTensor(name));
            }
        }
    }
    super::llama::blocks(b, false)
}
