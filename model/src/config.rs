//! Typed model configuration read from GGUF metadata keys (`{arch}.block_count`, ...), with an
//! error naming the key when a required one is missing or out of range.
//!
//! Every size is checked against the documented maximum below before anything is sized from it,
//! and every numeric hyper-parameter against the range in which it means something (a negative
//! epsilon or a NaN rope base would otherwise run and produce garbage).

use gguf::Metadata;

use crate::error::ModelError;

/// Largest `block_count` accepted (the largest published models have about 130 layers).
pub const MAX_LAYERS: usize = 1024;
/// Largest `embedding_length` (published models reach 25600).
pub const MAX_EMBD: usize = 1 << 16;
/// Largest `feed_forward_length` (published dense models reach about 75000).
pub const MAX_FF: usize = 1 << 20;
/// Most query or key/value heads (published models have at most 128).
pub const MAX_HEADS: usize = 1024;
/// Largest per-head size (published models use at most 256; MLA latents 576).
pub const MAX_HEAD_DIM: usize = 4096;
/// Longest trained context, sliding window or original YaRN context (16 Mi positions; the
/// longest published context is 10 M).
pub const MAX_CONTEXT: usize = 1 << 24;
/// Largest vocabulary (embedding rows); published vocabularies stay below 300 000.
pub const MAX_VOCAB: usize = 1 << 22;
/// Most experts per mixture-of-experts layer (llama.cpp's `LLAMA_MAX_EXPERTS`; published models
/// have at most 512).
pub const MAX_EXPERTS: usize = 512;

/// The architectures this crate has execution plans for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Architecture {
    /// `llama`: Llama 2/3 and Mistral (which GGUF files also store as `llama`).
    Llama,
    /// `qwen2`: llama-like with q/k/v biases.
    Qwen2,
    /// `qwen3`: llama-like with per-head q/k RMS norms.
    Qwen3,
    /// `qwen3moe`: Qwen3 attention with a mixture-of-experts feed-forward in every layer.
    Qwen3Moe,
    /// `gemma2`: post-norms, GELU-gated FFN, every other layer sliding-window, soft-capped
    /// attention scores and logits.
    Gemma2,
    /// `gemma3`: q/k norms, post-norms, GELU-gated FFN, sliding-window layers.
    Gemma3,
    /// `phi3`: fused q/k/v and gate/up projections, LongRoPE frequency factors.
    Phi3,
    /// `gpt-oss`: biased projections, attention sinks, every other layer on a sliding window,
    /// YaRN rope, and a mixture of experts with a biased router, softmax over the chosen
    /// experts' logits and a clamped SwiGLU (MXFP4 experts in the published files).
    GptOss,
    /// `olmo2`: no pre-norms; RMS norms over the whole query and key vectors, after attention
    /// and after the feed-forward.
    Olmo2,
    /// `granite`: the llama block with scaled embeddings, attention scores, residual branches
    /// and logits (`{arch}.embedding_scale`, `attention.scale`, `residual_scale`,
    /// `logit_scale`).
    Granite,
    /// `bert`: an encoder for embeddings: learned absolute positions and token types, layer
    /// norms with biases after each block, a GELU feed-forward, attention over the whole text
    /// (not causal) and no output head.
    Bert,
    /// `nomic-bert`: the BERT block with one fused q/k/v projection, split-half rope instead
    /// of learned positions and a SwiGLU feed-forward.
    NomicBert,
}

impl Architecture {
    /// The architecture named by `general.architecture`.
    pub fn from_name(name: &str) -> Result<Self, ModelError> {
        match name {
            "llama" => Ok(Self::Llama),
            "qwen2" => Ok(Self::Qwen2),
            "qwen3" => Ok(Self::Qwen3),
            "qwen3moe" => Ok(Self::Qwen3Moe),
            "gemma2" => Ok(Self::Gemma2),
            "gemma3" => Ok(Self::Gemma3),
            "phi3" => Ok(Self::Phi3),
            "gpt-oss" => Ok(Self::GptOss),
            "olmo2" => Ok(Self::Olmo2),
            "granite" => Ok(Self::Granite),
            "bert" => Ok(Self::Bert),
            "nomic-bert" => Ok(Self::NomicBert),
            other => Err(ModelError::UnsupportedArchitecture(other.to_owned())),
        }
    }

    /// The GGUF key prefix.
    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
            Self::Phi3 => "phi3",
            Self::GptOss => "gpt-oss",
            Self::Olmo2 => "olmo2",
            Self::Granite => "granite",
            Self::Bert => "bert",
            Self::NomicBert => "nomic-bert",
        }
    }

    /// How this architecture rotates query/key pairs, as llama.cpp's `llama_model_rope_type`
    /// decides: llama uses adjacent pairs, the Qwen and Gemma families split each head in halves.
    pub fn rope_mode(self) -> RopeMode {
        match self {
            Self::Llama | Self::Granite => RopeMode::Normal,
            Self::Qwen2
            | Self::Qwen3
            | Self::Qwen3Moe
            | Self::Gemma2
            | Self::Gemma3
            | Self::Phi3
            | Self::GptOss
            | Self::Olmo2
            | Self::Bert
            | Self::NomicBert => RopeMode::Neox,
        }
    }

    /// True for the encoders that make embeddings: they attend over the whole text at once
    /// (no KV cache, not causal) and have no output head.
    pub fn is_embedding(self) -> bool {
        matches!(self, Self::Bert | Self::NomicBert)
    }
}

/// Rotary embedding pairing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeMode {
    /// Rotate dims (2i, 2i+1).
    Normal,
    /// Rotate dims (i, i + n_rot/2).
    Neox,
}

/// Per-layer attention settings (they differ between Gemma's local and global layers).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// `Some(w)`: a query at position p sees keys in `(p - w, p]`; `None`: full causal.
    pub window: Option<usize>,
    /// RoPE base frequency.
    pub rope_base: f32,
    /// RoPE position scale (1 / linear scaling factor).
    pub rope_freq_scale: f32,
}

/// Hyper-parameters of a model, everything the execution plans need.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    /// Architecture.
    pub arch: Architecture,
    /// Vocabulary size (rows of `token_embd`).
    pub n_vocab: usize,
    /// Hidden size.
    pub n_embd: usize,
    /// Number of transformer blocks.
    pub n_layer: usize,
    /// FFN inner size.
    pub n_ff: usize,
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads (grouped-query attention when fewer than `n_head`).
    pub n_head_kv: usize,
    /// Per-head size of queries and keys.
    pub head_dim: usize,
    /// Per-head size of values.
    pub head_dim_v: usize,
    /// Rotated dims per head.
    pub n_rot: usize,
    /// RMS norm epsilon (the layer norms' for the BERT encoders).
    pub rms_eps: f32,
    /// Trained context length.
    pub n_ctx_train: usize,
    /// RoPE pairing.
    pub rope_mode: RopeMode,
    /// Softmax scale applied to q·k.
    pub attn_scale: f32,
    /// Attention settings per layer.
    pub layers: Vec<LayerAttention>,
    /// Multiplier applied to token embeddings (Gemma: sqrt(n_embd)).
    pub embd_scale: f32,
    /// YaRN settings shared by every layer (`ext_factor` 0 when the file does not use YaRN).
    pub yarn: Yarn,
    /// Gemma 2 style `cap * tanh(x / cap)` on attention scores (`None`: off).
    pub attn_softcap: Option<f32>,
    /// Same on the final logits.
    pub final_softcap: Option<f32>,
    /// The mixture-of-experts feed-forward (`None`: a dense one).
    pub moe: Option<Moe>,
    /// Granite: multiplier of the attention and feed-forward outputs before each residual add.
    pub residual_scale: Option<f32>,
    /// Granite: divisor of the logits.
    pub logit_scale: Option<f32>,
}

/// A mixture-of-experts feed-forward: a softmax router over `n_expert` experts, of which each
/// token uses the `n_used` with the highest probability, their outputs summed with those
/// probabilities as weights.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Moe {
    /// Experts per layer (`{arch}.expert_count`).
    pub n_expert: usize,
    /// Experts each token uses (`{arch}.expert_used_count`), `1..=n_expert`.
    pub n_used: usize,
    /// Inner size of one expert (`qwen3moe.expert_feed_forward_length`; Mixtral-style llama
    /// files use `feed_forward_length`).
    pub n_ff_exp: usize,
    /// Divide the chosen experts' probabilities by their sum. llama.cpp does for both families
    /// whatever `expert_weights_norm` says (Mixtral and Qwen3-MoE are trained that way).
    pub norm_weights: bool,
    /// How router logits become the chosen experts' weights.
    pub gating: Gating,
    /// gpt-oss's clamped SwiGLU `(alpha, limit)` instead of the plain one (see
    /// `ggml_graph::Op::SwigluOai`).
    pub swiglu_oai: Option<(f32, f32)>,
}

/// Mixture-of-experts gating, as llama.cpp's `llama_expert_gating_func_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    /// Softmax over all experts, the most probable chosen, their probabilities the weights.
    Softmax,
    /// The experts with the largest logits chosen, the softmax of just their logits the weights
    /// (gpt-oss).
    SoftmaxWeight,
}

/// The mixture-of-experts settings of `arch`: required for `qwen3moe`, present for `llama` when
/// `llama.expert_count` is above 0 (Mixtral).
fn moe_config(md: &Metadata, arch: Architecture, n_ff: usize) -> Result<Option<Moe>, ModelError> {
    let count_key = key(arch, "expert_count");
    let n_expert = match arch {
        Architecture::Qwen3Moe | Architecture::GptOss => req_size(md, &count_key, MAX_EXPERTS)?,
        Architecture::Llama => match opt_u(md, &count_key)? {
            None | Some(0) => return Ok(None),
            Some(n) => {
                check_size(&count_key, n, MAX_EXPERTS)?;
                n
            }
        },
        _ => return Ok(None),
    };
    let used_key = key(arch, "expert_used_count");
    let n_used = req_size(md, &used_key, n_expert)?;
    let n_ff_exp = match arch {
        Architecture::Qwen3Moe | Architecture::GptOss => {
            req_size(md, &key(arch, "expert_feed_forward_length"), MAX_FF)?
        }
        _ => n_ff,
    };
    let gpt_oss = arch == Architecture::GptOss;
    Ok(Some(Moe {
        n_expert,
        n_used,
        n_ff_exp,
        norm_weights: !gpt_oss,
        gating: if gpt_oss {
            Gating::SoftmaxWeight
        } else {
            Gating::Softmax
        },
        // llama.cpp's constants for gpt-oss (not read from the file).
        swiglu_oai: gpt_oss.then_some((1.702, 7.0)),
    }))
}

/// YaRN rope parameters as llama.cpp derives them from `{arch}.rope.scaling.*`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Yarn {
    /// Extrapolation mix: 1.0 with `rope.scaling.type = yarn`, else 0.0.
    pub ext_factor: f32,
    /// cos/sin magnitude before the rope kernel's own YaRN correction.
    pub attn_factor: f32,
    /// Fast boundary (llama.cpp's default 32).
    pub beta_fast: f32,
    /// Slow boundary (default 1).
    pub beta_slow: f32,
    /// Context the model was trained with before scaling.
    pub n_ctx_orig: usize,
}

fn key(arch: Architecture, suffix: &str) -> String {
    format!("{}.{suffix}", arch.name())
}

/// Rope position scaling as llama.cpp reads it: `rope.scaling.type` (absent means `linear`),
/// `rope.scaling.factor` (or the older `rope.scale_linear`; absent or 0 means none), and for
/// `yarn` the original context and attention factor. Returns the position scale and the YaRN
/// settings.
fn rope_scaling(
    md: &Metadata,
    arch: Architecture,
    n_ctx_train: usize,
) -> Result<(f32, Yarn), ModelError> {
    let type_key = key(arch, "rope.scaling.type");
    let kind = md
        .get_str_opt(&type_key)
        .map_err(|e| ModelError::BadKey {
            key: type_key.clone(),
            reason: e.to_string(),
        })?
        .unwrap_or("linear");
    let factor = match opt_f(md, &key(arch, "rope.scaling.factor"))? {
        Some(f) => f,
        None => opt_f(md, &key(arch, "rope.scale_linear"))?.unwrap_or(0.0),
    };
    if factor < 0.0 || !factor.is_finite() {
        return Err(ModelError::BadKey {
            key: key(arch, "rope.scaling.factor"),
            reason: format!("{factor} is not a valid scaling factor"),
        });
    }
    let scale = if factor == 0.0 { 1.0 } else { 1.0 / factor };
    if !scale.is_finite() {
        return Err(ModelError::BadKey {
            key: key(arch, "rope.scaling.factor"),
            reason: format!("{factor} is too small to scale positions by"),
        });
    }
    let attn_key = key(arch, "rope.scaling.attn_factor");
    let rope_attn = opt_f(md, &attn_key)?.unwrap_or(1.0);
    check_positive(&attn_key, rope_attn, "attention factor")?;
    let n_ctx_orig = opt_size(
        md,
        &key(arch, "rope.scaling.original_context_length"),
        MAX_CONTEXT,
    )?
    .unwrap_or(n_ctx_train);
    let mut yarn = Yarn {
        ext_factor: 0.0,
        attn_factor: rope_attn,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig,
    };
    let scale = match kind {
        "none" => 1.0,
        "linear" => scale,
        "yarn" => {
            yarn.ext_factor = 1.0;
            // llama.cpp's context setup: the magnitude 0.1 ln(s) + 1 of the scale s, divided by
            // the same factor because its rope kernel multiplies it in again.
            let f = 1.0 / scale;
            let m = if f <= 1.0 { 1.0 } else { 0.1 * f.ln() + 1.0 };
            yarn.attn_factor = m * (1.0 / (1.0 + 0.1 * f.ln())) * rope_attn;
            scale
        }
        other => {
            return Err(ModelError::BadKey {
                key: type_key,
                reason: format!("rope scaling `{other}` is not supported (none, linear, yarn)"),
            })
        }
    };
    Ok((scale, yarn))
}

fn req_u(md: &Metadata, k: &str) -> Result<usize, ModelError> {
    let v = md
        .require(k)
        .map_err(|_| ModelError::MissingKey(k.to_owned()))?;
    v.to_u64()
        .and_then(|x| usize::try_from(x).ok())
        .ok_or_else(|| ModelError::BadKey {
            key: k.to_owned(),
            reason: format!(
                "expected a non-negative integer, found {}",
                v.type_description()
            ),
        })
}

/// A required size in `1..=max`.
fn req_size(md: &Metadata, k: &str, max: usize) -> Result<usize, ModelError> {
    let v = req_u(md, k)?;
    check_size(k, v, max).map(|()| v)
}

fn check_size(k: &str, v: usize, max: usize) -> Result<(), ModelError> {
    if v == 0 || v > max {
        return Err(ModelError::BadKey {
            key: k.to_owned(),
            reason: format!("{v} is outside the supported range 1..={max}"),
        });
    }
    Ok(())
}

/// An optional size in `1..=max`.
fn opt_size(md: &Metadata, k: &str, max: usize) -> Result<Option<usize>, ModelError> {
    let v = opt_u(md, k)?;
    if let Some(v) = v {
        check_size(k, v, max)?;
    }
    Ok(v)
}

/// A float that must be finite and strictly positive.
fn check_positive(k: &str, v: f32, what: &str) -> Result<f32, ModelError> {
    if v.is_finite() && v > 0.0 {
        Ok(v)
    } else {
        Err(ModelError::BadKey {
            key: k.to_owned(),
            reason: format!("{what} {v} must be a finite number above 0"),
        })
    }
}

fn opt_u(md: &Metadata, k: &str) -> Result<Option<usize>, ModelError> {
    if md.contains_key(k) {
        req_u(md, k).map(Some)
    } else {
        Ok(None)
    }
}

fn opt_f(md: &Metadata, k: &str) -> Result<Option<f32>, ModelError> {
    md.get_f32_opt(k).map_err(|e| ModelError::BadKey {
        key: k.to_owned(),
        reason: e.to_string(),
    })
}

/// gpt-oss's layers as llama.cpp sets them up: `attention.sliding_window` (required) on the
/// layers `attention.sliding_window_pattern` marks (a per-layer list, or a period whose last
/// layer is global; default 2, so even layers slide), with `rope.freq_base_swa` (default the
/// global base) and the global position scale.
fn gpt_oss_layers(
    md: &Metadata,
    arch: Architecture,
    n_layer: usize,
    global: LayerAttention,
) -> Result<Vec<LayerAttention>, ModelError> {
    let sw_key = key(arch, "attention.sliding_window");
    let window = opt_size(md, &sw_key, MAX_CONTEXT)?.ok_or(ModelError::MissingKey(sw_key))?;
    let swa_key = key(arch, "rope.freq_base_swa");
    let swa_base = opt_f(md, &swa_key)?.unwrap_or(global.rope_base);
    check_positive(&swa_key, swa_base, "rope base")?;
    let local = LayerAttention {
        window: Some(window),
        rope_base: swa_base,
        ..global
    };
    let pattern_key = key(arch, "attention.sliding_window_pattern");
    let is_swa: Vec<bool> = match md.get(&pattern_key) {
        Some(gguf::MetadataValue::Array(gguf::ArrayValue::Bool(v))) if v.len() >= n_layer => {
            v[..n_layer].to_vec()
        }
        Some(gguf::MetadataValue::Array(_)) => {
            return Err(ModelError::BadKey {
                key: pattern_key,
                reason: format!("expected {n_layer} booleans"),
            })
        }
        _ => {
            let period = opt_u(md, &pattern_key)?.unwrap_or(2);
            (0..n_layer)
                .map(|il| period == 0 || il % period < period - 1)
                .collect()
        }
    };
    Ok(is_swa
        .into_iter()
        .map(|swa| if swa { local } else { global })
        .collect())
}

impl ModelConfig {
    /// Reads the configuration; `n_vocab` comes from the embedding tensor's row count since the
    /// vocabulary-size key is often absent.
    pub fn from_metadata(md: &Metadata, n_vocab: usize) -> Result<Self, ModelError> {
        const ARCH_KEY: &str = "general.architecture";
        let arch_name = md.get_str(ARCH_KEY).map_err(|e| {
            if md.contains_key(ARCH_KEY) {
                // The key is named once, by `BadKey`: say only what it holds.
                let held = match e {
                    gguf::GgufError::WrongType { found, .. } => format!("found {found}"),
                    e => e.to_string(),
                };
                ModelError::BadKey {
                    key: ARCH_KEY.into(),
                    reason: format!(
                        "expected a string naming the architecture (e.g. `llama`), {held}"
                    ),
                }
            } else {
                ModelError::MissingKey(ARCH_KEY.into())
            }
        })?;
        let arch = Architecture::from_name(arch_name)?;
        if n_vocab == 0 || n_vocab > MAX_VOCAB {
            return Err(ModelError::BadTensor {
                name: "token_embd.weight".into(),
                reason: format!(
                    "{n_vocab} rows (vocabulary entries) is outside the supported range 1..={MAX_VOCAB}"
                ),
            });
        }
        let vs_key = key(arch, "vocab_size");
        if let Some(n) = opt_u(md, &vs_key)? {
            if n != n_vocab {
                return Err(ModelError::BadKey {
                    key: vs_key,
                    reason: format!("{n} entries, but token_embd.weight has {n_vocab} rows"),
                });
            }
        }
        let n_embd = req_size(md, &key(arch, "embedding_length"), MAX_EMBD)?;
        let n_layer = req_size(md, &key(arch, "block_count"), MAX_LAYERS)?;
        let n_ff = req_size(md, &key(arch, "feed_forward_length"), MAX_FF)?;
        let n_head = req_size(md, &key(arch, "attention.head_count"), MAX_HEADS)?;
        let n_head_kv =
            opt_size(md, &key(arch, "attention.head_count_kv"), MAX_HEADS)?.unwrap_or(n_head);
        let n_ctx_train = req_size(md, &key(arch, "context_length"), MAX_CONTEXT)?;
        // The BERT encoders use layer norms, with their own epsilon key.
        let eps_key = if arch.is_embedding() {
            key(arch, "attention.layer_norm_epsilon")
        } else {
            key(arch, "attention.layer_norm_rms_epsilon")
        };
        let rms_eps =
            opt_f(md, &eps_key)?.ok_or_else(|| ModelError::MissingKey(eps_key.clone()))?;
        if !(rms_eps.is_finite() && rms_eps > 0.0 && rms_eps < 1.0) {
            return Err(ModelError::BadKey {
                key: eps_key,
                reason: format!("epsilon {rms_eps} must be a finite number in (0, 1)"),
            });
        }
        if n_head % n_head_kv != 0 {
            return Err(ModelError::BadKey {
                key: key(arch, "attention.head_count_kv"),
                reason: format!("{n_head} query heads cannot be grouped over {n_head_kv} kv heads"),
            });
        }
        let kl_key = key(arch, "attention.key_length");
        let head_dim = match opt_size(md, &kl_key, MAX_HEAD_DIM)? {
            Some(d) => d,
            None if n_embd % n_head == 0 => n_embd / n_head,
            None => {
                return Err(ModelError::BadKey {
                    key: key(arch, "attention.head_count"),
                    reason: format!(
                        "{n_head} heads do not divide the embedding of {n_embd} and `{kl_key}` is absent"
                    ),
                })
            }
        };
        let head_dim_v =
            opt_size(md, &key(arch, "attention.value_length"), MAX_HEAD_DIM)?.unwrap_or(head_dim);
        let n_rot = opt_u(md, &key(arch, "rope.dimension_count"))?.unwrap_or(head_dim);
        if n_rot > head_dim || n_rot % 2 != 0 {
            return Err(ModelError::BadKey {
                key: key(arch, "rope.dimension_count"),
                reason: format!("{n_rot} rotated dims do not fit a head of {head_dim}"),
            });
        }
        let base_key = key(arch, "rope.freq_base");
        let rope_base = opt_f(md, &base_key)?.unwrap_or(10_000.0);
        check_positive(&base_key, rope_base, "rope base")?;
        let (rope_freq_scale, yarn) = rope_scaling(md, arch, n_ctx_train)?;
        let moe = moe_config(md, arch, n_ff)?;
        let mut attn_scale = 1.0 / (head_dim as f32).sqrt();
        let mut embd_scale = 1.0;
        let global = LayerAttention {
            window: None,
            rope_base,
            rope_freq_scale,
        };
        let mut layers = vec![global; n_layer];
        let mut attn_softcap = None;
        let mut final_softcap = None;
        let (mut residual_scale, mut logit_scale) = (None, None);
        if arch == Architecture::Granite {
            let f = |k: &str| -> Result<Option<f32>, ModelError> {
                let fk = key(arch, k);
                match opt_f(md, &fk)? {
                    // llama.cpp treats 0 as "no scale" for these keys.
                    Some(0.0) => Ok(None),
                    Some(v) => check_positive(&fk, v, "scale").map(Some),
                    None => Ok(None),
                }
            };
            let lk = key(arch, "logit_scale");
            logit_scale = Some(f("logit_scale")?.ok_or(ModelError::MissingKey(lk))?);
            residual_scale = f("residual_scale")?;
            if let Some(e) = f("embedding_scale")? {
                embd_scale = e;
            }
            if let Some(a) = f("attention.scale")? {
                attn_scale = a;
            }
            // Granite files may turn rope off (`rope.scaling.finetuned = false`): not planned.
            let fk = key(arch, "rope.scaling.finetuned");
            if let Some(gguf::MetadataValue::Bool(false)) = md.get(&fk) {
                return Err(ModelError::BadKey {
                    key: fk,
                    reason: "granite without rope is not supported".into(),
                });
            }
        }
        if arch == Architecture::GptOss {
            layers = gpt_oss_layers(md, arch, n_layer, global)?;
        }
        if arch == Architecture::Olmo2 {
            // OLMo 3's sliding-window layers (rope without scaling there) are not planned yet.
            let sw_key = key(arch, "attention.sliding_window");
            if let Some(w) = opt_u(md, &sw_key)?.filter(|&w| w > 0) {
                return Err(ModelError::BadKey {
                    key: sw_key,
                    reason: format!("a sliding window ({w}) is not supported for olmo2"),
                });
            }
        }
        if matches!(arch, Architecture::Gemma2 | Architecture::Gemma3) {
            let gemma2 = arch == Architecture::Gemma2;
            let sw_key = key(arch, "attention.sliding_window");
            // Gemma 2 files may omit the window (llama.cpp's default 4096); Gemma 3 needs it.
            let window = match opt_size(md, &sw_key, MAX_CONTEXT)? {
                Some(w) => w,
                None if gemma2 => 4096,
                None => return Err(ModelError::MissingKey(sw_key)),
            };
            // Local layers: Gemma 3 uses base 10000 and no position scaling there, Gemma 2 the
            // global settings.
            let swa_key = key(arch, "rope.freq_base_swa");
            let swa_base =
                opt_f(md, &swa_key)?.unwrap_or(if gemma2 { rope_base } else { 10_000.0 });
            check_positive(&swa_key, swa_base, "rope base")?;
            let local = LayerAttention {
                window: Some(window),
                rope_base: swa_base,
                rope_freq_scale: if gemma2 { rope_freq_scale } else { 1.0 },
            };
            // Sliding-window layers: an explicit per-layer list, or a period whose last layer
            // is global (llama.cpp's default period: 2 for Gemma 2, 6 for Gemma 3).
            let pattern_key = key(arch, "attention.sliding_window_pattern");
            let is_swa: Vec<bool> = match md.get(&pattern_key) {
                Some(gguf::MetadataValue::Array(gguf::ArrayValue::Bool(v))) => {
                    if v.len() < n_layer {
                        return Err(ModelError::BadKey {
                            key: pattern_key,
                            reason: format!("{} entries for {n_layer} layers", v.len()),
                        });
                    }
                    v[..n_layer].to_vec()
                }
                _ => {
                    let period = opt_u(md, &pattern_key)?.unwrap_or(if gemma2 { 2 } else { 6 });
                    (0..n_layer)
                        .map(|il| period > 0 && il % period < period - 1)
                        .collect()
                }
            };
            for (l, swa) in layers.iter_mut().zip(is_swa) {
                if swa {
                    *l = local;
                }
            }
            embd_scale = (n_embd as f32).sqrt();
            // The 27B models (Gemma 2: 46 layers, Gemma 3: 62) scale by the model width per
            // head instead of head_dim.
            if n_layer == if gemma2 { 46 } else { 62 } {
                attn_scale = 1.0 / ((n_embd / n_head) as f32).sqrt();
            }
            // Soft-capping: Gemma 2 always caps (defaults 50 and 30), Gemma 3 only when the
            // file asks for it.
            let cap = |k: &str, default: Option<f32>| -> Result<Option<f32>, ModelError> {
                let ck = key(arch, k);
                match opt_f(md, &ck)?.or(default) {
                    Some(c) if c > 0.0 && c.is_finite() => Ok(Some(c)),
                    Some(0.0) | None => Ok(None),
                    Some(c) => Err(ModelError::BadKey {
                        key: ck,
                        reason: format!("soft-cap {c} must be positive"),
                    }),
                }
            };
            final_softcap = cap("final_logit_softcapping", gemma2.then_some(30.0))?;
            if gemma2 {
                attn_softcap = cap("attn_logit_softcapping", Some(50.0))?;
            }
        }
        Ok(Self {
            arch,
            n_vocab,
            n_embd,
            n_layer,
            n_ff,
            n_head,
            n_head_kv,
            head_dim,
            head_dim_v,
            n_rot,
            rms_eps,
            n_ctx_train,
            rope_mode: arch.rope_mode(),
            attn_scale,
            layers,
            embd_scale,
            yarn,
            attn_softcap,
            final_softcap,
            moe,
            residual_scale,
            logit_scale,
        })
    }

    /// Query heads per key/value head.
    pub fn gqa(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gguf::MetadataValue;

    fn gemma_md() -> Metadata {
        let mut md = Metadata::new();
        md.set(
            "general.architecture",
            MetadataValue::String("gemma3".into()),
        );
        md.set("gemma3.context_length", MetadataValue::U32(32768));
        md.set("gemma3.embedding_length", MetadataValue::U32(640));
        md.set("gemma3.block_count", MetadataValue::U32(18));
        md.set("gemma3.feed_forward_length", MetadataValue::U32(2048));
        md.set("gemma3.attention.head_count", MetadataValue::U32(4));
        md.set("gemma3.attention.head_count_kv", MetadataValue::U32(1));
        md.set("gemma3.attention.key_length", MetadataValue::U32(256));
        md.set("gemma3.attention.value_length", MetadataValue::U32(256));
        md.set(
            "gemma3.attention.layer_norm_rms_epsilon",
            MetadataValue::F32(1e-6),
        );
        md.set("gemma3.rope.freq_base", MetadataValue::F32(1e6));
        md.set("gemma3.attention.sliding_window", MetadataValue::U32(512));
        md
    }

    #[test]
    fn gemma3_layers_and_scales() {
        let c = ModelConfig::from_metadata(&gemma_md(), 262_144).unwrap();
        assert_eq!(c.arch, Architecture::Gemma3);
        assert_eq!(c.rope_mode, RopeMode::Neox);
        assert_eq!(c.gqa(), 4);
        assert_eq!(c.attn_scale, 1.0 / 16.0);
        assert!((c.embd_scale - 640f32.sqrt()).abs() < 1e-6);
        let globals: Vec<usize> = (0..18).filter(|&i| c.layers[i].window.is_none()).collect();
        assert_eq!(globals, vec![5, 11, 17]);
        assert_eq!(c.layers[5].rope_base, 1e6);
        assert_eq!(c.layers[0].rope_base, 1e4);
        assert_eq!(c.layers[0].window, Some(512));
    }

    #[test]
    fn bert_reads_its_layer_norm_epsilon() {
        let mut md = Metadata::new();
        md.set("general.architecture", MetadataValue::String("bert".into()));
        md.set("bert.context_length", MetadataValue::U32(512));
        md.set("bert.embedding_length", MetadataValue::U32(768));
        md.set("bert.block_count", MetadataValue::U32(12));
        md.set("bert.feed_forward_length", MetadataValue::U32(3072));
        md.set("bert.attention.head_count", MetadataValue::U32(12));
        // A decoder's RMS epsilon key means nothing to an encoder.
        md.set(
            "bert.attention.layer_norm_rms_epsilon",
            MetadataValue::F32(1e-6),
        );
        let err = ModelConfig::from_metadata(&md, 30522).unwrap_err();
        assert!(
            err.to_string()
                .contains("bert.attention.layer_norm_epsilon"),
            "{err}"
        );
        md.set(
            "bert.attention.layer_norm_epsilon",
            MetadataValue::F32(1e-12),
        );
        let c = ModelConfig::from_metadata(&md, 30522).unwrap();
        assert!(c.arch.is_embedding());
        assert_eq!(c.rms_eps, 1e-12);
        assert_eq!((c.head_dim, c.n_head_kv), (64, 12));
        assert!(!Architecture::Llama.is_embedding());
    }

    #[test]
    fn missing_key_is_named() {
        let mut md = gemma_md();
        let mut md2 = Metadata::new();
        for (k, v) in md.iter() {
            if k != "gemma3.block_count" {
                md2.set(k, v.clone());
            }
        }
        md = md2;
        let err = ModelConfig::from_metadata(&md, 10).unwrap_err();
        assert!(err.to_string().contains("gemma3.block_count"), "{err}");
    }

    #[test]
    fn unknown_arch_is_an_error() {
        let mut md = gemma_md();
        md.set(
            "general.architecture",
            MetadataValue::String("rwkv6".into()),
        );
        assert!(matches!(
            ModelConfig::from_metadata(&md, 10),
            Err(ModelError::UnsupportedArchitecture(a)) if a == "rwkv6"
        ));
    }

    #[test]
    fn llama_defaults() {
        let mut md = Metadata::new();
        md.set(
            "general.architecture",
            MetadataValue::String("llama".into()),
        );
        md.set("llama.context_length", MetadataValue::U32(4096));
        md.set("llama.embedding_length", MetadataValue::U32(256));
        md.set("llama.block_count", MetadataValue::U32(2));
        md.set("llama.feed_forward_length", MetadataValue::U32(512));
        md.set("llama.attention.head_count", MetadataValue::U32(8));
        md.set(
            "llama.attention.layer_norm_rms_epsilon",
            MetadataValue::F32(1e-5),
        );
        let c = ModelConfig::from_metadata(&md, 100).unwrap();
        assert_eq!(c.n_head_kv, 8);
        assert_eq!(c.head_dim, 32);
        assert_eq!(c.rope_mode, RopeMode::Normal);
        assert_eq!(c.layers[1].rope_base, 10_000.0);
        assert_eq!(c.embd_scale, 1.0);
    }
    fn llama_md() -> Metadata {
        let mut md = Metadata::new();
        md.set(
            "general.architecture",
            MetadataValue::String("llama".into()),
        );
        md.set("llama.context_length", MetadataValue::U32(8192));
        md.set("llama.embedding_length", MetadataValue::U32(256));
        md.set("llama.block_count", MetadataValue::U32(2));
        md.set("llama.feed_forward_length", MetadataValue::U32(512));
        md.set("llama.attention.head_count", MetadataValue::U32(4));
        md.set(
            "llama.attention.layer_norm_rms_epsilon",
            MetadataValue::F32(1e-5),
        );
        md
    }

    #[test]
    fn rope_scaling_types_follow_llama_cpp() {
        // No type key: llama.cpp treats the factor as linear scaling.
        let mut md = llama_md();
        md.set("llama.rope.scaling.factor", MetadataValue::F32(4.0));
        let c = ModelConfig::from_metadata(&md, 10).unwrap();
        assert_eq!(c.layers[0].rope_freq_scale, 0.25);
        assert_eq!(c.yarn.ext_factor, 0.0);
        // `none` ignores the factor.
        md.set(
            "llama.rope.scaling.type",
            MetadataValue::String("none".into()),
        );
        let c = ModelConfig::from_metadata(&md, 10).unwrap();
        assert_eq!(c.layers[0].rope_freq_scale, 1.0);
        // YaRN: extrapolation on, original context from its key, magnitude cancelled to ~1.
        md.set(
            "llama.rope.scaling.type",
            MetadataValue::String("yarn".into()),
        );
        md.set(
            "llama.rope.scaling.original_context_length",
            MetadataValue::U32(2048),
        );
        let c = ModelConfig::from_metadata(&md, 10).unwrap();
        assert_eq!(c.layers[0].rope_freq_scale, 0.25);
        assert_eq!(c.yarn.ext_factor, 1.0);
        assert_eq!(c.yarn.n_ctx_orig, 2048);
        assert!((c.yarn.attn_factor - 1.0).abs() < 1e-6);
        md.set(
            "llama.rope.scaling.type",
            MetadataValue::String("longrope".into()),
        );
        let err = ModelConfig::from_metadata(&md, 10).unwrap_err();
        assert!(err.to_string().contains("rope.scaling.type"), "{err}");
    }

    #[test]
    fn gemma2_defaults_and_soft_caps() {
        let mut md = Metadata::new();
        for (k, v) in gemma_md().iter() {
            if let Some(rest) = k.strip_prefix("gemma3.") {
                if rest != "attention.sliding_window" {
                    md.set(format!("gemma2.{rest}"), v.clone());
                }
            }
        }
        md.set(
            "general.architecture",
            MetadataValue::String("gemma2".into()),
        );
        let c = ModelConfig::from_metadata(&md, 10).unwrap();
        assert_eq!(c.arch, Architecture::Gemma2);
        assert_eq!(c.attn_softcap, Some(50.0));
        assert_eq!(c.final_softcap, Some(30.0));
        // Even layers slide over llama.cpp's default 4096 window with the global rope base.
        assert_eq!(c.layers[0].window, Some(4096));
        assert_eq!(c.layers[1].window, None);
        assert_eq!(c.layers[0].rope_base, 1e6);
        md.set("gemma2.final_logit_softcapping", MetadataValue::F32(0.0));
        md.set("gemma2.attn_logit_softcapping", MetadataValue::F32(-1.0));
        let err = ModelConfig::from_metadata(&md, 10).unwrap_err();
        assert!(err.to_string().contains("attn_logit_softcapping"), "{err}");
        // Gemma 3 caps logits only when its file says so.
        let c = ModelConfig::from_metadata(&gemma_md(), 10).unwrap();
        assert_eq!((c.attn_softcap, c.final_softcap), (None, None));
        let mut g3 = gemma_md();
        g3.set("gemma3.final_logit_softcapping", MetadataValue::F32(30.0));
        let c = ModelConfig::from_metadata(&g3, 10).unwrap();
        assert_eq!(c.final_softcap, Some(30.0));
    }

    #[test]
    fn gpt_oss_and_granite_settings_follow_llama_cpp() {
        let mut md = Metadata::new();
        for (k, v) in llama_md().iter() {
            md.set(k.replace("llama.", "gpt-oss.").as_str(), v.clone());
        }
        md.set(
            "general.architecture",
            MetadataValue::String("gpt-oss".into()),
        );
        md.set("gpt-oss.expert_count", MetadataValue::U32(32));
        md.set("gpt-oss.expert_used_count", MetadataValue::U32(4));
        md.set(
            "gpt-oss.expert_feed_forward_length",
            MetadataValue::U32(2880),
        );
        let err = ModelConfig::from_metadata(&md, 10).unwrap_err();
        assert!(err.to_string().contains("sliding_window"), "{err}");
        md.set("gpt-oss.attention.sliding_window", MetadataValue::U32(128));
        let c = ModelConfig::from_metadata(&md, 10).unwrap();
        // Even layers slide (llama.cpp's default period of 2), odd ones see everything.
        assert_eq!(c.layers[0].window, Some(128));
        assert_eq!(c.layers[1].window, None);
        let m = c.moe.unwrap();
        assert_eq!(m.gating, Gating::SoftmaxWeight);
        assert_eq!(m.swiglu_oai, Some((1.702, 7.0)));
        assert!(!m.norm_weights);
        assert_eq!(c.rope_mode, RopeMode::Neox);

        let mut g = Metadata::new();
        for (k, v) in llama_md().iter() {
            g.set(k.replace("llama.", "granite.").as_str(), v.clone());
        }
        g.set(
            "general.architecture",
            MetadataValue::String("granite".into()),
        );
        let err = ModelConfig::from_metadata(&g, 10).unwrap_err();
        assert!(err.to_string().contains("granite.logit_scale"), "{err}");
        g.set("granite.logit_scale", MetadataValue::F32(8.0));
        g.set("granite.embedding_scale", MetadataValue::F32(12.0));
        g.set("granite.residual_scale", MetadataValue::F32(0.22));
        g.set("granite.attention.scale", MetadataValue::F32(0.015625));
        let c = ModelConfig::from_metadata(&g, 10).unwrap();
        assert_eq!(
            (c.logit_scale, c.residual_scale, c.embd_scale, c.attn_scale),
            (Some(8.0), Some(0.22), 12.0, 0.015625)
        );
        assert_eq!(c.rope_mode, RopeMode::Normal);
        g.set("granite.rope.scaling.finetuned", MetadataValue::Bool(false));
        assert!(ModelConfig::from_metadata(&g, 10).is_err());
    }

    #[test]
    fn experts_are_read_and_bounded() {
        // Dense llama: no experts; an expert count of 0 is dense too (llama.cpp's reading).
        assert_eq!(
            ModelConfig::from_metadata(&llama_md(), 10).unwrap().moe,
            None
        );
        let mut md = llama_md();
        md.set("llama.expert_count", MetadataValue::U32(0));
        assert_eq!(ModelConfig::from_metadata(&md, 10).unwrap().moe, None);
        // Mixtral: the expert size is the feed-forward length.
        md.set("llama.expert_count", MetadataValue::U32(8));
        md.set("llama.expert_used_count", MetadataValue::U32(2));
        let m = ModelConfig::from_metadata(&md, 10).unwrap().moe.unwrap();
        assert_eq!(
            (m.n_expert, m.n_used, m.n_ff_exp, m.norm_weights),
            (8, 2, 512, true)
        );
        let bad = |md: &Metadata, key: &str| {
            let err = ModelConfig::from_metadata(md, 10).unwrap_err();
            assert!(err.to_string().contains(key), "{err}");
        };
        md.set("llama.expert_used_count", MetadataValue::U32(9));
        bad(&md, "llama.expert_used_count");
        md.set("llama.expert_used_count", MetadataValue::U32(0));
        bad(&md, "llama.expert_used_count");
        md.set(
            "llama.expert_count",
            MetadataValue::U32(MAX_EXPERTS as u32 + 1),
        );
        bad(&md, "llama.expert_count");
        // Qwen3-MoE needs all three keys.
        let mut q = Metadata::new();
        for (k, v) in llama_md().iter() {
            let k = k.replace("llama.", "qwen3moe.");
            q.set(k.as_str(), v.clone());
        }
        q.set(
            "general.architecture",
            MetadataValue::String("qwen3moe".into()),
        );
        bad(&q, "qwen3moe.expert_count");
        q.set("qwen3moe.expert_count", MetadataValue::U32(128));
        q.set("qwen3moe.expert_used_count", MetadataValue::U32(8));
        bad(&q, "qwen3moe.expert_feed_forward_length");
        q.set(
            "qwen3moe.expert_feed_forward_length",
            MetadataValue::U32(768),
        );
        let c = ModelConfig::from_metadata(&q, 10).unwrap();
        assert_eq!(c.arch, Architecture::Qwen3Moe);
        assert_eq!(c.rope_mode, RopeMode::Neox);
        let m = c.moe.unwrap();
        assert_eq!((m.n_expert, m.n_used, m.n_ff_exp), (128, 8, 768));
    }
}
