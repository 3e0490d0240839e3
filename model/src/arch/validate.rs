//! Checks a file's tensors against the configuration before any graph runs: every tensor an
//! architecture reads must exist with exactly the shape the configuration implies (a norm weight
//! of a size that divides the expected one would otherwise broadcast and produce garbage), and
//! vectors must be stored as f32.

use ggml_graph::DType;

use super::WeightTable;
use crate::config::{Architecture, ModelConfig};
use crate::error::ModelError;

/// Whether a tensor must be present.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    Required,
    Optional,
}

/// Dims without trailing 1s past the first (GGUF writers differ in how many they store).
fn trimmed(dims: &[usize]) -> &[usize] {
    let mut n = dims.len();
    while n > 1 && dims[n - 1] == 1 {
        n -= 1;
    }
    &dims[..n]
}

fn check(
    weights: &WeightTable,
    name: &str,
    expected: &[usize],
    need: Need,
) -> Result<(), ModelError> {
    let Some((dtype, dims)) = weights.get(name) else {
        return match need {
            Need::Required => Err(ModelError::MissingTensor(name.to_owned())),
            Need::Optional => Ok(()),
        };
    };
    if trimmed(dims) != trimmed(expected) {
        return Err(ModelError::BadTensor {
            name: name.to_owned(),
            reason: format!("expected {expected:?} for {name}, found {dims:?}"),
        });
    }
    // Norm weights, biases and rope factors are element-wise operands: the backends read them
    // as f32, as llama.cpp's quantizer always stores them.
    if expected.len() == 1 && dtype != DType::F32 {
        return Err(ModelError::BadTensor {
            name: name.to_owned(),
            reason: format!("expected type F32 for {name}, found {dtype}"),
        });
    }
    Ok(())
}

/// Checks every tensor `cfg`'s architecture reads: presence, shape and, for vectors, type.
pub fn validate_weights(cfg: &ModelConfig, weights: &WeightTable) -> Result<(), ModelError> {
    use Need::{Optional, Required};
    let (e, v) = (cfg.n_embd, cfg.n_vocab);
    let q = cfg.n_head * cfg.head_dim;
    let k = cfg.n_head_kv * cfg.head_dim;
    let kv_v = cfg.n_head_kv * cfg.head_dim_v;
    let o = cfg.n_head * cfg.head_dim_v;
    check(weights, "token_embd.weight", &[e, v], Required)?;
    if cfg.arch.is_embedding() {
        return validate_encoder(cfg, weights);
    }
    check(weights, "output_norm.weight", &[e], Required)?;
    check(weights, "output.weight", &[e, v], Optional)?;
    check(weights, "rope_freqs.weight", &[cfg.n_rot / 2], Optional)?;
    check(
        weights,
        "rope_factors_long.weight",
        &[cfg.n_rot / 2],
        Optional,
    )?;
    check(
        weights,
        "rope_factors_short.weight",
        &[cfg.n_rot / 2],
        Optional,
    )?;
    let phi3 = cfg.arch == Architecture::Phi3;
    let gpt_oss = cfg.arch == Architecture::GptOss;
    let olmo2 = cfg.arch == Architecture::Olmo2;
    // OLMo 2 has no norms before attention and the feed-forward.
    let pre_norm = if olmo2 { Optional } else { Required };
    let qk_norm = matches!(
        cfg.arch,
        Architecture::Qwen3 | Architecture::Qwen3Moe | Architecture::Gemma3
    );
    let post_norms = matches!(cfg.arch, Architecture::Gemma2 | Architecture::Gemma3);
    let qkv_bias = if cfg.arch == Architecture::Qwen2 {
        Required
    } else {
        Optional
    };
    for il in 0..cfg.n_layer {
        let t = |s: &str| format!("blk.{il}.{s}");
        check(weights, &t("attn_norm.weight"), &[e], pre_norm)?;
        // Phi-3 files fuse q, k and v into one matrix (llama.cpp also reads separate ones).
        let fused = phi3 && weights.contains(&t("attn_qkv.weight"));
        let sep = if fused { Optional } else { Required };
        check(weights, &t("attn_qkv.weight"), &[e, q + k + kv_v], Optional)?;
        check(weights, &t("attn_q.weight"), &[e, q], sep)?;
        check(weights, &t("attn_k.weight"), &[e, k], sep)?;
        check(weights, &t("attn_v.weight"), &[e, kv_v], sep)?;
        check(weights, &t("attn_q.bias"), &[q], qkv_bias)?;
        check(weights, &t("attn_k.bias"), &[k], qkv_bias)?;
        check(weights, &t("attn_v.bias"), &[kv_v], qkv_bias)?;
        check(weights, &t("attn_output.weight"), &[o, e], Required)?;
        check(weights, &t("attn_output.bias"), &[e], Optional)?;
        if gpt_oss {
            // Its pre-FFN norm is named after the attention; every head has a sink.
            check(weights, &t("post_attention_norm.weight"), &[e], Required)?;
            check(weights, &t("attn_sinks.weight"), &[cfg.n_head], Required)?;
        } else {
            check(weights, &t("ffn_norm.weight"), &[e], pre_norm)?;
        }
        if let Some(m) = cfg.moe {
            // The router and the expert stacks, one matrix per expert along the last dim.
            let (x, f) = (m.n_expert, m.n_ff_exp);
            check(weights, &t("ffn_gate_inp.weight"), &[e, x], Required)?;
            check(weights, &t("ffn_gate_exps.weight"), &[e, f, x], Required)?;
            check(weights, &t("ffn_up_exps.weight"), &[e, f, x], Required)?;
            check(weights, &t("ffn_down_exps.weight"), &[f, e, x], Required)?;
            // gpt-oss's biases: the router's, and one row per expert.
            check(weights, &t("ffn_gate_inp.bias"), &[x], Optional)?;
            check(weights, &t("ffn_gate_exps.bias"), &[f, x], Optional)?;
            check(weights, &t("ffn_up_exps.bias"), &[f, x], Optional)?;
            check(weights, &t("ffn_down_exps.bias"), &[e, x], Optional)?;
        } else if phi3 {
            // Gate and up in one matrix, the gate first.
            check(weights, &t("ffn_up.weight"), &[e, 2 * cfg.n_ff], Required)?;
            check(weights, &t("ffn_down.weight"), &[cfg.n_ff, e], Required)?;
        } else {
            check(weights, &t("ffn_gate.weight"), &[e, cfg.n_ff], Required)?;
            check(weights, &t("ffn_up.weight"), &[e, cfg.n_ff], Required)?;
            check(weights, &t("ffn_down.weight"), &[cfg.n_ff, e], Required)?;
            for b in ["ffn_gate.bias", "ffn_up.bias"] {
                check(weights, &t(b), &[cfg.n_ff], Optional)?;
            }
            check(weights, &t("ffn_down.bias"), &[e], Optional)?;
        }
        if qk_norm {
            check(weights, &t("attn_q_norm.weight"), &[cfg.head_dim], Required)?;
            check(weights, &t("attn_k_norm.weight"), &[cfg.head_dim], Required)?;
        }
        if olmo2 {
            check(weights, &t("attn_q_norm.weight"), &[q], Required)?;
            check(weights, &t("attn_k_norm.weight"), &[k], Required)?;
        }
        if post_norms || olmo2 {
            check(weights, &t("post_attention_norm.weight"), &[e], Required)?;
            check(weights, &t("post_ffw_norm.weight"), &[e], Required)?;
        }
    }
    Ok(())
}

/// The tensors of the embedding encoders (`bert`, `nomic-bert`): token types (any count),
/// learned positions (BERT), layer norms with biases, separate biased or fused q/k/v
/// projections, a GELU (BERT) or SwiGLU (Nomic) feed-forward; no output norm or head.
fn validate_encoder(cfg: &ModelConfig, weights: &WeightTable) -> Result<(), ModelError> {
    use Need::{Optional, Required};
    let e = cfg.n_embd;
    let q = cfg.n_head * cfg.head_dim;
    let k = cfg.n_head_kv * cfg.head_dim;
    let kv_v = cfg.n_head_kv * cfg.head_dim_v;
    let o = cfg.n_head * cfg.head_dim_v;
    let bert = cfg.arch == Architecture::Bert;
    if let Some((_, dims)) = weights.get("token_types.weight") {
        let n_types = dims.get(1).copied().unwrap_or(1);
        check(weights, "token_types.weight", &[e, n_types], Optional)?;
    }
    if bert {
        check(
            weights,
            "position_embd.weight",
            &[e, cfg.n_ctx_train],
            Required,
        )?;
    }
    let norm = |name: &str| -> Result<(), ModelError> {
        check(weights, &format!("{name}.weight"), &[e], Required)?;
        check(weights, &format!("{name}.bias"), &[e], Required)
    };
    norm("token_embd_norm")?;
    for il in 0..cfg.n_layer {
        let t = |s: &str| format!("blk.{il}.{s}");
        let fused = weights.contains(&t("attn_qkv.weight"));
        let sep = if fused { Optional } else { Required };
        check(weights, &t("attn_qkv.weight"), &[e, q + k + kv_v], Optional)?;
        check(weights, &t("attn_qkv.bias"), &[q + k + kv_v], Optional)?;
        for (name, n) in [("attn_q", q), ("attn_k", k), ("attn_v", kv_v)] {
            check(weights, &t(&format!("{name}.weight")), &[e, n], sep)?;
            check(weights, &t(&format!("{name}.bias")), &[n], Optional)?;
        }
        check(weights, &t("attn_output.weight"), &[o, e], Required)?;
        check(weights, &t("attn_output.bias"), &[e], Optional)?;
        norm(&t("attn_output_norm"))?;
        check(weights, &t("ffn_up.weight"), &[e, cfg.n_ff], Required)?;
        check(weights, &t("ffn_up.bias"), &[cfg.n_ff], Optional)?;
        let gate = if bert { Optional } else { Required };
        check(weights, &t("ffn_gate.weight"), &[e, cfg.n_ff], gate)?;
        check(weights, &t("ffn_down.weight"), &[cfg.n_ff, e], Required)?;
        check(weights, &t("ffn_down.bias"), &[e], Optional)?;
        norm(&t("layer_output_norm"))?;
    }
    Ok(())
}
