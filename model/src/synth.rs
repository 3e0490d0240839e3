//! Synthetic GGUF models: seeded random weights at a real architecture's tensor names and
//! shapes, the metadata llama.cpp needs to load them, and a tokenizer copied from a vocabulary
//! GGUF (or a minimal byte-level one), written with the `gguf` crate's writer and quantizers.
//!
//! Design choices:
//! - Every row of every tensor has its own generator seeded from (seed, tensor name, row), so
//!   the output is the same bytes whatever the thread count, and rows are made in parallel.
//! - Tensors are generated, quantized and written one at a time (peak memory is one quantized
//!   tensor), so Llama-3-8B shapes work without holding the model.
//! - Weights are N(0, 0.02) and norm weights 1 + N(0, 0.02): logits stay in a sane range.

use std::path::Path;

use gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue};
use rayon::prelude::*;

use crate::error::ModelError;

/// Architectures we can synthesize (`general.architecture`; mistral is a llama-arch file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    /// Llama 2/3.
    Llama,
    /// Mistral (llama architecture, SentencePiece vocabulary).
    Mistral,
    /// Qwen2 (q/k/v biases).
    Qwen2,
    /// Qwen3 (q/k RMS norms).
    Qwen3,
    /// Gemma 2 (post-attention/FFN norms, tied output, every other layer windowed, soft-capped
    /// attention scores and logits).
    Gemma2,
    /// Gemma 3 (q/k norms, post-attention/FFN norms, tied output, sliding window).
    Gemma3,
    /// Mixtral (llama architecture with a mixture-of-experts feed-forward).
    Mixtral,
    /// Qwen3-MoE (Qwen3 attention, mixture-of-experts feed-forward).
    Qwen3Moe,
    /// Phi-3 (fused q/k/v and gate/up projections).
    Phi3,
    /// gpt-oss (biased projections, attention sinks, alternating sliding window, YaRN, MXFP4
    /// experts with biases).
    GptOss,
    /// OLMo 2 (no pre-norms, whole-vector q/k norms, post-attention/FFN norms).
    Olmo2,
    /// Granite 3.x (the llama block with embedding, attention, residual and logit scales).
    Granite,
    /// BERT (an embedding encoder: learned positions and token types, biased projections,
    /// layer norms, GELU feed-forward, no output head).
    Bert,
    /// Nomic BERT (the BERT block with a fused q/k/v projection, rope and SwiGLU).
    NomicBert,
}

impl Arch {
    /// Parses `llama|mistral|qwen2|qwen3|gemma2|gemma3|mixtral|qwen3moe|phi3|gpt-oss|olmo2|
    /// granite|bert|nomic-bert`.
    pub fn parse(s: &str) -> Result<Self, ModelError> {
        Ok(match s {
            "llama" => Self::Llama,
            "mistral" => Self::Mistral,
            "qwen2" => Self::Qwen2,
            "qwen3" => Self::Qwen3,
            "gemma2" => Self::Gemma2,
            "gemma3" => Self::Gemma3,
            "mixtral" => Self::Mixtral,
            "qwen3moe" => Self::Qwen3Moe,
            "phi3" => Self::Phi3,
            "gpt-oss" => Self::GptOss,
            "olmo2" => Self::Olmo2,
            "granite" => Self::Granite,
            "bert" => Self::Bert,
            "nomic-bert" => Self::NomicBert,
            _ => return Err(ModelError::UnsupportedArchitecture(s.to_owned())),
        })
    }

    fn gguf_name(self) -> &'static str {
        match self {
            Self::Llama | Self::Mistral | Self::Mixtral => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
            Self::Qwen3Moe => "qwen3moe",
            Self::Phi3 => "phi3",
            Self::GptOss => "gpt-oss",
            Self::Olmo2 => "olmo2",
            Self::Granite => "granite",
            Self::Bert => "bert",
            Self::NomicBert => "nomic-bert",
        }
    }

    /// True for the embedding encoders.
    fn is_encoder(self) -> bool {
        matches!(self, Self::Bert | Self::NomicBert)
    }

    /// True for the mixture-of-experts architectures (their presets give the experts).
    fn is_moe(self) -> bool {
        matches!(self, Self::Mixtral | Self::Qwen3Moe | Self::GptOss)
    }
}

/// Model dimensions.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// Hidden size.
    pub n_embd: u64,
    /// Transformer blocks.
    pub n_layer: u64,
    /// Query heads.
    pub n_head: u64,
    /// Key/value heads.
    pub n_head_kv: u64,
    /// Per-head dimension.
    pub head_dim: u64,
    /// FFN inner size.
    pub n_ff: u64,
    /// Trained context length.
    pub n_ctx: u32,
    /// Rope base.
    pub rope_base: f32,
    /// RMS norm epsilon.
    pub eps: f32,
    /// Mixture-of-experts presets: the experts per layer, those each token uses and one
    /// expert's inner size.
    pub experts: Option<Experts>,
}

/// The experts of a mixture-of-experts shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Experts {
    /// Experts per layer.
    pub n_expert: u64,
    /// Experts each token uses.
    pub n_used: u64,
    /// Inner size of one expert.
    pub n_ff_exp: u64,
}

/// Named shapes: `tiny` (fast tests) and real models' shapes.
pub fn preset(name: &str) -> Result<Shape, ModelError> {
    let s = |n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff, n_ctx, rope_base, eps| Shape {
        n_embd,
        n_layer,
        n_head,
        n_head_kv,
        head_dim,
        n_ff,
        n_ctx,
        rope_base,
        eps,
        experts: None,
    };
    let moe = |sh: Shape, n_expert, n_used, n_ff_exp| Shape {
        experts: Some(Experts {
            n_expert,
            n_used,
            n_ff_exp,
        }),
        ..sh
    };
    Ok(match name {
        "tiny" => s(256, 2, 4, 2, 64, 512, 2048, 10000.0, 1e-5),
        "llama3-8b" => s(4096, 32, 32, 8, 128, 14336, 8192, 500000.0, 1e-5),
        "llama3-70b" => s(8192, 80, 64, 8, 128, 28672, 8192, 500000.0, 1e-5),
        "mistral-7b" => s(4096, 32, 32, 8, 128, 14336, 32768, 1000000.0, 1e-5),
        "qwen2-7b" => s(3584, 28, 28, 4, 128, 18944, 32768, 1000000.0, 1e-6),
        "qwen3-0.6b" => s(1024, 28, 16, 8, 128, 3072, 40960, 1000000.0, 1e-6),
        "qwen3-8b" => s(4096, 36, 32, 8, 128, 12288, 40960, 1000000.0, 1e-6),
        "gemma3-4b" => s(2560, 34, 8, 4, 256, 10240, 131072, 1000000.0, 1e-6),
        "gemma3-270m" => s(640, 18, 4, 1, 256, 2048, 32768, 1000000.0, 1e-6),
        // Phi-3-mini (3.8B); the 128k variant adds LongRoPE factors (see `SynthOptions::parse`).
        "phi3-mini" => s(3072, 32, 32, 32, 96, 8192, 4096, 10000.0, 1e-5),
        "phi3-mini-128k" => s(3072, 32, 32, 32, 96, 8192, 131072, 10000.0, 1e-5),
        "olmo2-1b" => s(2048, 16, 16, 16, 128, 8192, 4096, 500000.0, 1e-6),
        "olmo2-7b" => s(4096, 32, 32, 32, 128, 11008, 4096, 500000.0, 1e-6),
        "granite3-2b" => s(2048, 40, 32, 8, 64, 8192, 131072, 10000000.0, 1e-5),
        // Embedding encoders (for `bert` and `nomic-bert`).
        "bert-base" => s(768, 12, 12, 12, 64, 3072, 512, 10000.0, 1e-12),
        "nomic-embed-text-v1.5" => s(768, 12, 12, 12, 64, 3072, 2048, 1000.0, 1e-12),
        // Mixture-of-experts shapes (for `mixtral` and `qwen3moe`).
        "tiny-moe" => moe(s(256, 2, 4, 2, 64, 512, 2048, 10000.0, 1e-5), 8, 2, 256),
        "mixtral-8x7b" => moe(
            s(4096, 32, 32, 8, 128, 14336, 32768, 1000000.0, 1e-5),
            8,
            2,
            14336,
        ),
        "qwen3-30b-a3b" => moe(
            s(2048, 48, 32, 4, 128, 6144, 40960, 1000000.0, 1e-6),
            128,
            8,
            768,
        ),
        // gpt-oss-20b (its YaRN scaling comes with the architecture, see `SynthOptions::parse`).
        "gpt-oss-20b" => moe(
            s(2880, 24, 64, 8, 64, 2880, 131072, 150000.0, 1e-5),
            32,
            4,
            2880,
        ),
        _ => {
            return Err(ModelError::InvalidArgument(format!(
                "unknown preset `{name}` (tiny, llama3-8b, llama3-70b, mistral-7b, qwen2-7b, qwen3-0.6b, \
                 qwen3-8b, gemma3-270m, gemma3-4b, phi3-mini, phi3-mini-128k, olmo2-1b, olmo2-7b, \
                 granite3-2b, bert-base, nomic-embed-text-v1.5; with experts: tiny-moe, mixtral-8x7b, qwen3-30b-a3b, gpt-oss-20b)"
            )))
        }
    })
}

/// llama.cpp's file types (`LLAMA_FTYPE_MOSTLY_*`, named as `llama-quantize` takes them): each
/// picks a type per tensor by the rules of llama.cpp's `llama_tensor_get_type` without an
/// importance matrix. Besides what each variant says, models with 8 experts get Q8_0 attn_k and
/// attn_v and (for Q2_K, Q3_K_S/M, Q4_K_S/M and the IQ4 types) Q5_K attn_output, and a row
/// that the type's blocks do not tile takes llama.cpp's fallback type.
#[allow(
    non_camel_case_types,
    reason = "names match llama-quantize's spelling of the file types"
)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LlamaFtype {
    /// Q4_0; the output (and a tied embedding) Q6_K.
    Q4_0,
    /// Q4_1; the output Q6_K.
    Q4_1,
    /// Q5_0; the output Q6_K.
    Q5_0,
    /// Q5_1; the output Q6_K.
    Q5_1,
    /// Q8_0 everywhere.
    Q8_0,
    /// Q2_K; Q3_K attn_output and ffn_down, Q3_K or (GQA >= 4) Q4_K attn_v, Q6_K output.
    Q2_K,
    /// Q3_K; the output Q6_K.
    Q3_K_S,
    /// Q3_K; Q4_K attn_output, attn_v and ffn_down, Q5_K for those in the first layers.
    Q3_K_M,
    /// Q3_K; Q5_K attn_output, attn_v and ffn_down.
    Q3_K_L,
    /// Q4_K; Q5_K attn_v of the first 4 layers and ffn_down of the first eighth.
    Q4_K_S,
    /// Q4_K; Q6_K output, and attn_v and ffn_down in `use_more_bits` layers.
    Q4_K_M,
    /// Q5_K; the output Q6_K.
    Q5_K_S,
    /// Q5_K; Q6_K output, and attn_v and ffn_down in `use_more_bits` layers.
    Q5_K_M,
    /// Q6_K everywhere.
    Q6_K,
    /// IQ4_NL; Q5_K attn_v (GQA >= 4) and ffn_down of the first eighth, Q6_K output.
    IQ4_NL,
    /// IQ4_XS; Q5_K attn_v (GQA >= 4) and ffn_down of the first eighth, Q6_K output.
    IQ4_XS,
}

impl LlamaFtype {
    /// Every file type.
    pub const ALL: [Self; 16] = [
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q2_K,
        Self::Q3_K_S,
        Self::Q3_K_M,
        Self::Q3_K_L,
        Self::Q4_K_S,
        Self::Q4_K_M,
        Self::Q5_K_S,
        Self::Q5_K_M,
        Self::Q6_K,
        Self::IQ4_NL,
        Self::IQ4_XS,
    ];

    /// The name llama-quantize takes (`Q4_K_M`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q5_0 => "Q5_0",
            Self::Q5_1 => "Q5_1",
            Self::Q8_0 => "Q8_0",
            Self::Q2_K => "Q2_K",
            Self::Q3_K_S => "Q3_K_S",
            Self::Q3_K_M => "Q3_K_M",
            Self::Q3_K_L => "Q3_K_L",
            Self::Q4_K_S => "Q4_K_S",
            Self::Q4_K_M => "Q4_K_M",
            Self::Q5_K_S => "Q5_K_S",
            Self::Q5_K_M => "Q5_K_M",
            Self::Q6_K => "Q6_K",
            Self::IQ4_NL => "IQ4_NL",
            Self::IQ4_XS => "IQ4_XS",
        }
    }

    /// The type of the tensors no rule singles out (`llama_ftype_get_default_type`).
    fn default_type(self) -> GgmlType {
        use GgmlType as T;
        match self {
            Self::Q4_0 => T::Q4_0,
            Self::Q4_1 => T::Q4_1,
            Self::Q5_0 => T::Q5_0,
            Self::Q5_1 => T::Q5_1,
            Self::Q8_0 => T::Q8_0,
            Self::Q2_K => T::Q2_K,
            Self::Q3_K_S | Self::Q3_K_M | Self::Q3_K_L => T::Q3_K,
            Self::Q4_K_S | Self::Q4_K_M => T::Q4_K,
            Self::Q5_K_S | Self::Q5_K_M => T::Q5_K,
            Self::Q6_K => T::Q6_K,
            Self::IQ4_NL => T::IQ4_NL,
            Self::IQ4_XS => T::IQ4_XS,
        }
    }
}

/// Weight type choice: a llama.cpp file type's mixture, or one type for every matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    /// The per-tensor types `llama-quantize` picks for this file type.
    Mix(LlamaFtype),
    /// Every matrix of this type (`llama-quantize --pure`), but for the fallback of rows that
    /// do not fill whole blocks.
    All(GgmlType),
}

impl FileType {
    /// llama.cpp's Q4_K_M mixture (Q4_K with Q6_K for the output and some attn_v/ffn_down).
    pub const Q4KM: Self = Self::Mix(LlamaFtype::Q4_K_M);

    /// Parses a llama.cpp file type (`q4_k_m`, `q4_0`, `iq4_xs`... as llama-quantize names
    /// them, any case) or else one ggml type for every matrix (`q4_k`, `f16`, `bf16`...).
    pub fn parse(s: &str) -> Result<Self, ModelError> {
        if let Some(m) = LlamaFtype::ALL
            .iter()
            .find(|m| m.name().eq_ignore_ascii_case(s))
        {
            return Ok(Self::Mix(*m));
        }
        (0..64)
            .filter_map(GgmlType::from_id)
            .find(|t| t.name().eq_ignore_ascii_case(s) && gguf::can_quantize(*t))
            .map(Self::All)
            .ok_or_else(|| ModelError::InvalidArgument(format!("unsupported weight type `{s}`")))
    }
}

/// Everything that decides the output bytes.
#[derive(Clone, Debug)]
pub struct SynthOptions {
    /// Architecture.
    pub arch: Arch,
    /// Preset name (recorded in `general.name`).
    pub preset: String,
    /// Dimensions.
    pub shape: Shape,
    /// Weight types.
    pub ftype: FileType,
    /// Random seed.
    pub seed: u64,
    /// Rope, soft-capping and window settings beyond the architecture's defaults.
    pub extras: Extras,
}

/// Optional metadata and tensors that exercise less common model features.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Extras {
    /// `rope.scaling.type = yarn` with this factor and original context length.
    pub yarn: Option<(f32, u32)>,
    /// A `rope_freqs.weight` tensor (Llama 3.1 style per-pair frequency divisors).
    pub rope_freqs: bool,
    /// `attn_logit_softcapping` and `final_logit_softcapping` (Gemma 2).
    pub softcap: Option<(f32, f32)>,
    /// `attention.sliding_window` (Gemma: 512 when unset; Phi-3: 2047, unused).
    pub window: Option<u32>,
    /// Standard deviation of the q and k projections instead of 0.02: larger values make
    /// attention sharp, so rope and score changes show in the logits.
    pub qk_std: Option<f32>,
    /// LongRoPE (Phi-3 128k): `rope_factors_long`/`rope_factors_short` tensors, this original
    /// context (`rope.scaling.original_context_length`) and the attention factor Phi-3's
    /// converter derives from it and the trained context.
    pub longrope: Option<u32>,
    /// `pooling_type` of the embedding encoders (llama.cpp's numbers: 0 none, 1 mean, 2 cls,
    /// 3 last); default: cls for `bert` (as BGE), mean for `nomic-bert`.
    pub pooling: Option<u32>,
}

impl SynthOptions {
    /// Options from the CLI's strings.
    pub fn parse(
        arch: &str,
        preset_name: &str,
        ftype: &str,
        seed: u64,
    ) -> Result<Self, ModelError> {
        let (arch_v, mut shape) = (Arch::parse(arch)?, preset(preset_name)?);
        if arch_v.is_encoder() {
            // BERT encoders have no grouped-query attention.
            shape.n_head_kv = shape.n_head;
        }
        if arch_v.is_moe() != shape.experts.is_some() {
            return Err(ModelError::InvalidArgument(format!(
                "preset `{preset_name}` {} experts and `{arch}` {} them",
                if shape.experts.is_some() {
                    "has"
                } else {
                    "has no"
                },
                if arch_v.is_moe() {
                    "needs"
                } else {
                    "has no use for"
                }
            )));
        }
        let mut extras = Extras::default();
        if preset_name == "phi3-mini-128k" {
            extras.longrope = Some(4096);
        }
        if arch_v == Arch::GptOss {
            // gpt-oss's own rope scaling: YaRN, 32x from 4096 positions.
            extras.yarn = Some((32.0, 4096));
        }
        Ok(Self {
            arch: arch_v,
            preset: preset_name.to_owned(),
            shape,
            ftype: FileType::parse(ftype)?,
            seed,
            extras,
        })
    }
}

/// A tiny byte-level BPE vocabulary (256 byte tokens, one merge, BOS/EOS) for files made
/// without `--vocab`.
fn builtin_vocab(md: &mut gguf::Metadata) {
    let table = crate::tokenizer::byte_to_char_table();
    let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
    tokens.extend([
        "Ġt".to_owned(),
        "<|begin_of_text|>".to_owned(),
        "<|end_of_text|>".to_owned(),
    ]);
    let mut types = vec![1i32; tokens.len()];
    let n = tokens.len();
    types[n - 2] = 3;
    types[n - 1] = 3;
    md.set("tokenizer.ggml.model", "gpt2");
    md.set("tokenizer.ggml.pre", "gpt-2");
    md.set(
        "tokenizer.ggml.tokens",
        MetadataValue::Array(gguf::ArrayValue::String(tokens)),
    );
    md.set(
        "tokenizer.ggml.token_type",
        MetadataValue::Array(gguf::ArrayValue::I32(types)),
    );
    md.set(
        "tokenizer.ggml.merges",
        MetadataValue::Array(gguf::ArrayValue::String(vec!["Ġ t".to_owned()])),
    );
    md.set(
        "tokenizer.ggml.bos_token_id",
        MetadataValue::U32((n - 2) as u32),
    );
    md.set(
        "tokenizer.ggml.eos_token_id",
        MetadataValue::U32((n - 1) as u32),
    );
    md.set("tokenizer.ggml.add_bos_token", MetadataValue::Bool(true));
}

/// One tensor to generate.
struct Spec {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    norm: bool,
    std: f32,
}

/// llama.cpp's `use_more_bits`: the layers where Q4_K_M/Q5_K_M give attn_v/ffn_down Q6_K.
fn more_bits(i: u64, n: u64) -> bool {
    // The first test guarantees `i >= n / 8` for the subtraction.
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// What llama.cpp's type rules look at besides the tensor itself.
#[derive(Clone, Copy, Debug)]
struct MixContext {
    /// Query heads per key/value head.
    n_gqa: u64,
    /// Experts per layer (0 without).
    n_expert: u64,
    /// No `output.weight`: the token embedding is the output matrix too.
    tied: bool,
}

impl MixContext {
    fn of(arch: Arch, s: &Shape) -> Self {
        Self {
            n_gqa: s.n_head.checked_div(s.n_head_kv).unwrap_or(0),
            n_expert: s.experts.map_or(0, |x| x.n_expert),
            tied: matches!(arch, Arch::Gemma2 | Arch::Gemma3),
        }
    }
}

/// llama.cpp's `llama_tensor_get_type_impl` for the file types of [`LlamaFtype`], without an
/// importance matrix, for the tensor kinds synthetic models have. `layer` is (index, count).
/// Not covered: llama.cpp's bump of attn_v for 70B llama models and its Falcon rules.
fn mix_type(
    m: LlamaFtype,
    name: &str,
    layer: Option<(u64, u64)>,
    cols: u64,
    c: MixContext,
) -> GgmlType {
    use GgmlType as T;
    use LlamaFtype as F;
    let default = m.default_type();
    let (i, n) = layer.unwrap_or((0, 1));
    let is = |t: &str| name.contains(t);
    if name == "output.weight" || (c.tied && name == "token_embd.weight") {
        return if !cols.is_multiple_of(default.block_size() as u64) {
            T::Q8_0
        } else if default != T::Q8_0 {
            T::Q6_K
        } else {
            default
        };
    }
    if name == "token_embd.weight" {
        return default;
    }
    // A fused q/k/v matrix takes attn_v's rules, as in llama.cpp.
    if is("attn_v.weight") || is("attn_qkv.weight") {
        let t = match m {
            F::Q2_K if c.n_gqa >= 4 => T::Q4_K,
            F::Q2_K => T::Q3_K,
            F::Q3_K_M if i < 2 => T::Q5_K,
            F::Q3_K_M => T::Q4_K,
            F::Q3_K_L => T::Q5_K,
            F::IQ4_NL | F::IQ4_XS if c.n_gqa >= 4 => T::Q5_K,
            F::Q4_K_M | F::Q5_K_M if more_bits(i, n) => T::Q6_K,
            F::Q4_K_S if i < 4 => T::Q5_K,
            _ => default,
        };
        return if c.n_expert == 8 { T::Q8_0 } else { t };
    }
    if is("attn_k.weight") {
        return if c.n_expert == 8 { T::Q8_0 } else { default };
    }
    if is("attn_q.weight") {
        return default;
    }
    if is("attn_output.weight") {
        return match m {
            F::Q2_K | F::Q3_K_S | F::Q3_K_M | F::IQ4_NL | F::Q4_K_S | F::Q4_K_M | F::IQ4_XS
                if c.n_expert == 8 =>
            {
                T::Q5_K
            }
            _ if c.n_expert == 8 => default,
            F::Q2_K => T::Q3_K,
            F::Q3_K_M => T::Q4_K,
            F::Q3_K_L => T::Q5_K,
            _ => default,
        };
    }
    // ffn_gate and ffn_up (experts' too) have no rules for these file types.
    if is("ffn_down") {
        return match m {
            F::Q2_K => T::Q3_K,
            F::Q3_K_M if i < n / 16 => T::Q5_K,
            F::Q3_K_M => T::Q4_K,
            F::Q3_K_L => T::Q5_K,
            F::Q4_K_M | F::Q5_K_M if more_bits(i, n) => T::Q6_K,
            F::IQ4_NL | F::IQ4_XS if i < n / 8 => T::Q5_K,
            F::Q4_K_S if i < n / 8 => T::Q5_K,
            _ => default,
        };
    }
    default
}

/// llama.cpp's `tensor_type_fallback`: a type whose blocks do not tile a row of `cols` values
/// gives way to a 32-value type of about the same size, or to F16.
fn fallback(ty: GgmlType, cols: u64) -> GgmlType {
    use GgmlType as T;
    let fits = |t: GgmlType| cols.is_multiple_of(t.block_size() as u64);
    if fits(ty) {
        return ty;
    }
    let smaller = match ty {
        T::IQ4_XS => T::IQ4_NL,
        T::Q2_K | T::Q3_K => T::Q4_0,
        T::Q4_K => T::Q5_0,
        T::Q5_K => T::Q5_1,
        T::Q6_K => T::Q8_0,
        // No fallback in llama.cpp (it refuses these): the nearest 32-value type.
        _ => T::Q8_0,
    };
    if fits(smaller) {
        smaller
    } else {
        T::F16
    }
}

fn matrix_type(
    ft: FileType,
    name: &str,
    layer: Option<(u64, u64)>,
    cols: u64,
    c: MixContext,
) -> GgmlType {
    let ty = match ft {
        FileType::All(t) => t,
        FileType::Mix(m) => mix_type(m, name, layer, cols, c),
    };
    fallback(ty, cols)
}

fn tensor_specs(o: &SynthOptions, n_vocab: u64) -> Vec<Spec> {
    let s = o.shape;
    let (e, hd) = (s.n_embd, s.head_dim);
    let q = s.n_head * hd;
    let kv = s.n_head_kv * hd;
    let mix = MixContext::of(o.arch, &s);
    let mut v = Vec::new();
    let mat = |v: &mut Vec<Spec>, name: String, cols: u64, rows: u64, layer: Option<(u64, u64)>| {
        let ty = matrix_type(o.ftype, &name, layer, cols, mix);
        let qk = name.ends_with("attn_q.weight")
            || name.ends_with("attn_k.weight")
            || name.ends_with("attn_qkv.weight");
        let std = o.extras.qk_std.filter(|_| qk).unwrap_or(0.02);
        v.push(Spec {
            name,
            dims: vec![cols, rows],
            ty,
            norm: false,
            std,
        });
    };
    mat(&mut v, "token_embd.weight".into(), e, n_vocab, None);
    let mut layers = Vec::new();
    for i in 0..s.n_layer {
        let l = Some((i, s.n_layer));
        let b = |t: &str| format!("blk.{i}.{t}");
        let mut m = if o.arch == Arch::Phi3 {
            vec![
                (b("attn_qkv.weight"), e, q + 2 * kv, l),
                (b("attn_output.weight"), q, e, l),
                (b("ffn_up.weight"), e, 2 * s.n_ff, l),
                (b("ffn_down.weight"), s.n_ff, e, l),
            ]
        } else {
            vec![
                (b("attn_q.weight"), e, q, l),
                (b("attn_k.weight"), e, kv, l),
                (b("attn_v.weight"), e, kv, l),
                (b("attn_output.weight"), q, e, l),
            ]
        };
        if s.experts.is_none() && o.arch != Arch::Phi3 {
            m.extend([
                (b("ffn_gate.weight"), e, s.n_ff, l),
                (b("ffn_up.weight"), e, s.n_ff, l),
                (b("ffn_down.weight"), s.n_ff, e, l),
            ]);
        }
        let mut n = match o.arch {
            Arch::GptOss => vec![
                (b("attn_norm.weight"), e),
                (b("post_attention_norm.weight"), e),
            ],
            Arch::Olmo2 => vec![
                (b("attn_q_norm.weight"), q),
                (b("attn_k_norm.weight"), kv),
                (b("post_attention_norm.weight"), e),
                (b("post_ffw_norm.weight"), e),
            ],
            _ => vec![(b("attn_norm.weight"), e), (b("ffn_norm.weight"), e)],
        };
        match o.arch {
            Arch::Qwen2 => {
                n.push((b("attn_q.bias"), q));
                n.push((b("attn_k.bias"), kv));
                n.push((b("attn_v.bias"), kv));
            }
            Arch::Qwen3 | Arch::Qwen3Moe => {
                n.push((b("attn_q_norm.weight"), hd));
                n.push((b("attn_k_norm.weight"), hd));
            }
            Arch::Gemma3 => {
                n.push((b("attn_q_norm.weight"), hd));
                n.push((b("attn_k_norm.weight"), hd));
                n.push((b("post_attention_norm.weight"), e));
                n.push((b("post_ffw_norm.weight"), e));
            }
            Arch::Gemma2 => {
                n.push((b("post_attention_norm.weight"), e));
                n.push((b("post_ffw_norm.weight"), e));
            }
            Arch::GptOss => {
                n.push((b("attn_q.bias"), q));
                n.push((b("attn_k.bias"), kv));
                n.push((b("attn_v.bias"), kv));
                n.push((b("attn_output.bias"), e));
            }
            Arch::Llama
            | Arch::Mistral
            | Arch::Mixtral
            | Arch::Phi3
            | Arch::Olmo2
            | Arch::Granite
            | Arch::Bert
            | Arch::NomicBert => {}
        }
        layers.push((i, m, n));
    }
    for (i, m, n) in layers {
        for (name, cols, rows, l) in m {
            mat(&mut v, name, cols, rows, l);
        }
        if let Some(x) = s.experts {
            let b = |t: &str| format!("blk.{i}.{t}");
            let l = Some((i, s.n_layer));
            // The router stays f32, as llama.cpp's quantizer leaves it.
            v.push(Spec {
                name: b("ffn_gate_inp.weight"),
                dims: vec![e, x.n_expert],
                ty: GgmlType::F32,
                norm: false,
                std: 0.02,
            });
            let gpt_oss = o.arch == Arch::GptOss;
            for (name, cols, rows) in [
                (b("ffn_gate_exps.weight"), e, x.n_ff_exp),
                (b("ffn_up_exps.weight"), e, x.n_ff_exp),
                (b("ffn_down_exps.weight"), x.n_ff_exp, e),
            ] {
                // gpt-oss ships its experts in MXFP4 whatever the rest is.
                let ty = if gpt_oss && cols.is_multiple_of(32) {
                    GgmlType::MXFP4
                } else {
                    matrix_type(o.ftype, &name, l, cols, mix)
                };
                v.push(Spec {
                    name,
                    dims: vec![cols, rows, x.n_expert],
                    ty,
                    norm: false,
                    std: 0.02,
                });
            }
            if gpt_oss {
                // The router's bias, one bias row per expert and one sink logit per head, large
                // enough to move routing and attention.
                let mut biases = vec![
                    (b("ffn_gate_inp.bias"), vec![x.n_expert], 0.5),
                    (b("ffn_gate_exps.bias"), vec![x.n_ff_exp, x.n_expert], 0.1),
                    (b("ffn_up_exps.bias"), vec![x.n_ff_exp, x.n_expert], 0.1),
                    (b("ffn_down_exps.bias"), vec![e, x.n_expert], 0.1),
                ];
                biases.push((b("attn_sinks.weight"), vec![s.n_head], 1.0));
                for (name, dims, std) in biases {
                    v.push(Spec {
                        name,
                        dims,
                        ty: GgmlType::F32,
                        norm: false,
                        std,
                    });
                }
            }
        }
        for (name, len) in n {
            v.push(Spec {
                name,
                dims: vec![len],
                ty: GgmlType::F32,
                norm: true,
                std: 0.02,
            });
        }
    }
    let mut factors = Vec::new();
    if o.extras.rope_freqs {
        factors.push("rope_freqs.weight");
    }
    if o.extras.longrope.is_some() {
        factors.extend(["rope_factors_long.weight", "rope_factors_short.weight"]);
    }
    for name in factors {
        v.push(Spec {
            name: name.into(),
            dims: vec![hd / 2],
            ty: GgmlType::F32,
            norm: true,
            std: 0.02,
        });
    }
    v.push(Spec {
        name: "output_norm.weight".into(),
        dims: vec![e],
        ty: GgmlType::F32,
        norm: true,
        std: 0.02,
    });
    if !matches!(o.arch, Arch::Gemma2 | Arch::Gemma3) {
        let ty = matrix_type(o.ftype, "output.weight", None, e, mix);
        v.push(Spec {
            name: "output.weight".into(),
            dims: vec![e, n_vocab],
            ty,
            norm: false,
            std: 0.02,
        });
    }
    v
}

/// Token types of the synthetic encoders (BERT's two sentences).
const N_TOKEN_TYPES: u64 = 2;

/// The tensors of the embedding encoders (`bert`, `nomic-bert`), named as llama.cpp loads them.
fn encoder_specs(o: &SynthOptions, n_vocab: u64) -> Vec<Spec> {
    let s = o.shape;
    let (e, f) = (s.n_embd, s.n_ff);
    let q = s.n_head * s.head_dim;
    let kv = s.n_head_kv * s.head_dim;
    let mix = MixContext::of(o.arch, &s);
    let bert = o.arch == Arch::Bert;
    let mut v = Vec::new();
    let mat = |v: &mut Vec<Spec>, name: String, cols: u64, rows: u64, layer: Option<(u64, u64)>| {
        let qk = name.ends_with("attn_q.weight")
            || name.ends_with("attn_k.weight")
            || name.ends_with("attn_qkv.weight");
        let std = o.extras.qk_std.filter(|_| qk).unwrap_or(0.02);
        v.push(Spec {
            ty: matrix_type(o.ftype, &name, layer, cols, mix),
            name,
            dims: vec![cols, rows],
            norm: false,
            std,
        });
    };
    // Vectors: norm weights around 1, biases and the small tables around 0, all f32.
    let vector = |v: &mut Vec<Spec>, name: String, dims: Vec<u64>| {
        v.push(Spec {
            norm: name.ends_with("norm.weight"),
            name,
            dims,
            ty: GgmlType::F32,
            std: 0.02,
        });
    };
    mat(&mut v, "token_embd.weight".into(), e, n_vocab, None);
    vector(&mut v, "token_types.weight".into(), vec![e, N_TOKEN_TYPES]);
    if bert {
        vector(
            &mut v,
            "position_embd.weight".into(),
            vec![e, u64::from(s.n_ctx)],
        );
    }
    vector(&mut v, "token_embd_norm.weight".into(), vec![e]);
    vector(&mut v, "token_embd_norm.bias".into(), vec![e]);
    for i in 0..s.n_layer {
        let l = Some((i, s.n_layer));
        let b = |t: &str| format!("blk.{i}.{t}");
        if bert {
            for (name, rows) in [("attn_q", q), ("attn_k", kv), ("attn_v", kv)] {
                mat(&mut v, b(&format!("{name}.weight")), e, rows, l);
                vector(&mut v, b(&format!("{name}.bias")), vec![rows]);
            }
            mat(&mut v, b("attn_output.weight"), q, e, l);
            vector(&mut v, b("attn_output.bias"), vec![e]);
        } else {
            mat(&mut v, b("attn_qkv.weight"), e, q + 2 * kv, l);
            mat(&mut v, b("attn_output.weight"), q, e, l);
        }
        vector(&mut v, b("attn_output_norm.weight"), vec![e]);
        vector(&mut v, b("attn_output_norm.bias"), vec![e]);
        mat(&mut v, b("ffn_up.weight"), e, f, l);
        if bert {
            vector(&mut v, b("ffn_up.bias"), vec![f]);
        } else {
            mat(&mut v, b("ffn_gate.weight"), e, f, l);
        }
        mat(&mut v, b("ffn_down.weight"), f, e, l);
        if bert {
            vector(&mut v, b("ffn_down.bias"), vec![e]);
        }
        vector(&mut v, b("layer_output_norm.weight"), vec![e]);
        vector(&mut v, b("layer_output_norm.bias"), vec![e]);
    }
    v
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Fills `out` with N(mean, std) values from the row's own generator (Box-Muller).
fn normal_row(seed: u64, name: &str, row: u64, mean: f32, std: f32, out: &mut [f32]) {
    let mut st = seed ^ fnv(name) ^ row.wrapping_mul(0xD6E8_FEB8_6659_FD93);
    for pair in out.chunks_mut(2) {
        let u1 = ((splitmix(&mut st) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
        let u2 = (splitmix(&mut st) >> 11) as f64 / (1u64 << 53) as f64;
        let r = (-2.0 * u1.ln()).sqrt();
        let t = std::f64::consts::TAU * u2;
        pair[0] = mean + std * (r * t.cos()) as f32;
        if let Some(x) = pair.get_mut(1) {
            *x = mean + std * (r * t.sin()) as f32;
        }
    }
}

fn tensor_bytes(seed: u64, t: &Spec) -> Result<Vec<u8>, ModelError> {
    let cols = t.dims[0] as usize;
    // Rows of every matrix of a stack (expert tensors are 3-d).
    let rows = t.dims[1..].iter().product::<u64>() as usize;
    let row_bytes = t.ty.row_bytes(cols as u64).ok_or_else(|| {
        ModelError::InvalidArgument(format!("{}: {cols} columns do not fit {}", t.name, t.ty))
    })? as usize;
    let mut out = vec![0u8; row_bytes * rows];
    let top = match t.name.as_str() {
        "rope_freqs.weight" => Some(8.0),
        // LongRoPE: short factors near 1, long ones up to Phi-3-128k's order of magnitude.
        "rope_factors_short.weight" => Some(1.5),
        "rope_factors_long.weight" => Some(40.0),
        _ => None,
    };
    if let Some(top) = top {
        // Frequency divisors from 1 (fastest pair) to `top` (slowest), as long-context factors
        // leave high frequencies alone and slow the low ones down.
        let n = cols.max(2) as f32 - 1.0;
        let vals: Vec<f32> = (0..cols)
            .map(|i| 1.0 + (top - 1.0) * (i as f32 / n).powi(2))
            .collect();
        gguf::quantize_row(t.ty, &vals, &mut out)?;
        return Ok(out);
    }
    let (mean, std) = if t.norm && t.name.contains("norm") {
        (1.0, t.std)
    } else {
        (0.0, t.std)
    };
    out.par_chunks_mut(row_bytes).enumerate().try_for_each(
        |(r, dst)| -> Result<(), ModelError> {
            let mut vals = vec![0f32; cols];
            normal_row(seed, &t.name, r as u64, mean, std, &mut vals);
            gguf::quantize_row(t.ty, &vals, dst)?;
            Ok(())
        },
    )?;
    Ok(out)
}

/// Writes a synthetic model to `out`; the tokenizer is copied from `vocab` (every
/// `tokenizer.*` key) or, without one, a minimal byte-level BPE vocabulary.
///
/// The file is written beside `out` and renamed over it at the end, so a process that has
/// `out` mapped (a server, a concurrent test) keeps reading the old bytes instead of taking a
/// SIGBUS when the file is truncated under it.
pub fn write(o: &SynthOptions, vocab: Option<&Path>, out: &Path) -> Result<(), ModelError> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut tmp = out.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}-{n}", std::process::id()));
    let tmp = std::path::PathBuf::from(tmp);
    let written = write_to(o, vocab, &tmp).and_then(|()| {
        std::fs::rename(&tmp, out).map_err(|e| ModelError::from(gguf::GgufError::io(out, e)))
    });
    if written.is_err() {
        // Best effort: the error being returned is the one that matters.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// The configuration and weight table of the model [`write()`] makes (the tensors' names, types
/// and shapes, no data): what graphs are built from, so a model's step graphs can be built and
/// planned at full size without writing or loading gigabytes of weights (the engine's host-time
/// benchmark).
pub fn layout(
    o: &SynthOptions,
    vocab: Option<&Path>,
) -> Result<(crate::config::ModelConfig, crate::arch::WeightTable), ModelError> {
    let (md, specs) = header(o, vocab)?;
    let infos: Vec<gguf::TensorInfo> = specs
        .iter()
        .map(|t| gguf::TensorInfo {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: t.ty,
            offset: 0,
            size: 0,
            info_offset: 0,
        })
        .collect();
    let n_vocab = md.get_str_array("tokenizer.ggml.tokens")?.len();
    let cfg = crate::config::ModelConfig::from_metadata(&md, n_vocab)?;
    let weights = crate::arch::WeightTable::from_infos(&infos);
    crate::arch::validate::validate_weights(&cfg, &weights)?;
    Ok((cfg, weights))
}

fn write_to(o: &SynthOptions, vocab: Option<&Path>, out: &Path) -> Result<(), ModelError> {
    let (md, specs) = header(o, vocab)?;
    let mut w = GgufWriter::create(out)?;
    w.set_all(&md)?;
    for t in &specs {
        w.add_tensor_info(&t.name, &t.dims, t.ty)?;
    }
    w.write_header()?;
    // One tensor is generated (in parallel over its rows) while the one before is written: the
    // disk and the cores work at once, and at most three tensors are in memory, never the file.
    std::thread::scope(|sc| -> Result<(), ModelError> {
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        let specs = &specs;
        sc.spawn(move || {
            for t in specs {
                tracing::debug!(tensor = %t.name, ty = %t.ty, "synth");
                let bytes = tensor_bytes(o.seed, t);
                let failed = bytes.is_err();
                // A closed channel: the writer failed and returned its error.
                if tx.send(bytes).is_err() || failed {
                    break;
                }
            }
        });
        // The generator sends every tensor in order or stops after its first error (a panic
        // there ends this loop early and re-panics when the scope joins it).
        for (t, bytes) in specs.iter().zip(rx.iter()) {
            w.write_tensor_data(&t.name, &bytes?)?;
        }
        Ok(())
    })?;
    w.finish()?;
    Ok(())
}

/// The metadata and tensor list of the model [`write`] makes.
fn header(
    o: &SynthOptions,
    vocab: Option<&Path>,
) -> Result<(gguf::Metadata, Vec<Spec>), ModelError> {
    let mut md = gguf::Metadata::new();
    let arch = o.arch.gguf_name();
    let s = o.shape;
    md.set("general.architecture", arch);
    let name = format!("rocmforge synthetic {arch} {} seed {}", o.preset, o.seed);
    // llama.cpp gives Phi-3's special tokens their attributes by `general.name` and then needs
    // Phi-3's own tokens (`</s>`, `<unk>`...), which the built-in vocabulary lacks: say "phi 3".
    let name = if o.arch == Arch::Phi3 {
        name.replace("phi3", "phi 3")
    } else {
        name
    };
    md.set("general.name", name.as_str());
    md.set("general.alignment", MetadataValue::U32(32));
    let k = |suffix: &str| format!("{arch}.{suffix}");
    md.set(k("context_length"), MetadataValue::U32(s.n_ctx));
    md.set(k("embedding_length"), MetadataValue::U32(s.n_embd as u32));
    md.set(k("block_count"), MetadataValue::U32(s.n_layer as u32));
    md.set(k("feed_forward_length"), MetadataValue::U32(s.n_ff as u32));
    md.set(
        k("attention.head_count"),
        MetadataValue::U32(s.n_head as u32),
    );
    md.set(
        k("attention.head_count_kv"),
        MetadataValue::U32(s.n_head_kv as u32),
    );
    md.set(
        k("attention.key_length"),
        MetadataValue::U32(s.head_dim as u32),
    );
    md.set(
        k("attention.value_length"),
        MetadataValue::U32(s.head_dim as u32),
    );
    md.set(
        k("rope.dimension_count"),
        MetadataValue::U32(s.head_dim as u32),
    );
    md.set(k("rope.freq_base"), MetadataValue::F32(s.rope_base));
    if o.arch.is_encoder() {
        md.set(k("attention.layer_norm_epsilon"), MetadataValue::F32(s.eps));
        md.set(k("attention.causal"), MetadataValue::Bool(false));
        let default = if o.arch == Arch::Bert { 2 } else { 1 };
        md.set(
            k("pooling_type"),
            MetadataValue::U32(o.extras.pooling.unwrap_or(default)),
        );
    } else {
        md.set(
            k("attention.layer_norm_rms_epsilon"),
            MetadataValue::F32(s.eps),
        );
    }
    if matches!(o.arch, Arch::Gemma2 | Arch::Gemma3) {
        let w = o.extras.window.unwrap_or(512);
        md.set(k("attention.sliding_window"), MetadataValue::U32(w));
    }
    if o.arch == Arch::GptOss {
        let w = o.extras.window.unwrap_or(128);
        md.set(k("attention.sliding_window"), MetadataValue::U32(w));
    }
    if o.arch == Arch::Granite {
        // Granite 3.x 2B's scales.
        md.set(k("embedding_scale"), MetadataValue::F32(12.0));
        md.set(k("residual_scale"), MetadataValue::F32(0.22));
        md.set(k("attention.scale"), MetadataValue::F32(0.015625));
        md.set(k("logit_scale"), MetadataValue::F32(8.0));
    }
    if o.arch == Arch::Phi3 {
        // Phi-3-mini's converted files carry its window (2047); llama.cpp ignores it.
        let w = o.extras.window.unwrap_or(2047);
        md.set(k("attention.sliding_window"), MetadataValue::U32(w));
    }
    if let Some(x) = s.experts {
        md.set(k("expert_count"), MetadataValue::U32(x.n_expert as u32));
        md.set(k("expert_used_count"), MetadataValue::U32(x.n_used as u32));
        match o.arch {
            Arch::Qwen3Moe | Arch::GptOss => md.set(
                k("expert_feed_forward_length"),
                MetadataValue::U32(x.n_ff_exp as u32),
            ),
            // Mixtral files give the expert size as the feed-forward length.
            _ => md.set(
                k("feed_forward_length"),
                MetadataValue::U32(x.n_ff_exp as u32),
            ),
        }
    }
    if let Some((attn, fin)) = o.extras.softcap {
        md.set(k("attn_logit_softcapping"), MetadataValue::F32(attn));
        md.set(k("final_logit_softcapping"), MetadataValue::F32(fin));
    }
    if let Some(orig) = o.extras.longrope {
        // Phi-3's converter: sqrt(1 + ln(scale) / ln(original context)) for the context scale.
        let scale = s.n_ctx as f64 / f64::from(orig);
        let attn = if scale > 1.0 {
            (1.0 + scale.ln() / f64::from(orig).ln()).sqrt()
        } else {
            1.0
        };
        md.set(
            k("rope.scaling.attn_factor"),
            MetadataValue::F32(attn as f32),
        );
        md.set(
            k("rope.scaling.original_context_length"),
            MetadataValue::U32(orig),
        );
    }
    if let Some((factor, orig)) = o.extras.yarn {
        md.set(k("rope.scaling.type"), "yarn");
        md.set(k("rope.scaling.factor"), MetadataValue::F32(factor));
        md.set(
            k("rope.scaling.original_context_length"),
            MetadataValue::U32(orig),
        );
    }
    match vocab {
        Some(p) => {
            let v = GgufFile::open(p)?;
            for (key, val) in v.metadata().iter() {
                if key.starts_with("tokenizer.") {
                    md.set(key, val.clone());
                }
            }
        }
        None => builtin_vocab(&mut md),
    }
    let n_vocab = md.get_str_array("tokenizer.ggml.tokens")?.len() as u64;
    md.set(k("vocab_size"), MetadataValue::U32(n_vocab as u32));
    if o.arch.is_encoder() && !md.contains_key("tokenizer.ggml.token_type_count") {
        // llama.cpp loads a BERT only with token types; "sentence A" and "sentence B".
        md.set(
            "tokenizer.ggml.token_type_count",
            MetadataValue::U32(N_TOKEN_TYPES as u32),
        );
    }

    let specs = if o.arch.is_encoder() {
        encoder_specs(o, n_vocab)
    } else {
        tensor_specs(o, n_vocab)
    };
    Ok((md, specs))
}

/// `rocmforge synth --arch A -o out --seed N` with the `tiny` preset, Q4_K_M weights and the
/// built-in vocabulary.
pub fn write_model(arch: &str, out: &Path, seed: u64) -> Result<(), ModelError> {
    let o = SynthOptions::parse(arch, "tiny", "q4_k_m", seed)?;
    write(&o, None, out)
}

/// The synthetic files the llama.cpp goldens were computed on (`model/tests/data/synth_*.json`):
/// name -> (options, vocabulary file in `ROCMFORGE_VOCAB_DIR`). Regenerating with these gives
/// the same bytes (the goldens record the sha256). Test data: only with the `testing` feature.
#[cfg(feature = "testing")]
pub fn golden_spec(name: &str) -> Option<(SynthOptions, &'static str)> {
    let (arch, ftype, vocab) = match name {
        "llama" => ("llama", "q4_k_m", "ggml-vocab-llama-bpe.gguf"),
        "llama-yarn" | "llama-rope-freqs" => ("llama", "q8_0", "ggml-vocab-llama-bpe.gguf"),
        "mistral" => ("mistral", "q8_0", "ggml-vocab-llama-spm.gguf"),
        "qwen2" => ("qwen2", "q4_k_m", "ggml-vocab-qwen2.gguf"),
        "qwen3" => ("qwen3", "f16", "ggml-vocab-qwen2.gguf"),
        "gemma2" => ("gemma2", "q8_0", "ggml-vocab-llama-spm.gguf"),
        _ => return None,
    };
    let mut o = SynthOptions::parse(arch, "tiny", ftype, 42).ok()?;
    match name {
        // Scaled 4x from a 512-token original context: the correction dims fall inside the
        // 64-dim heads, so some pairs are interpolated, some extrapolated, some blended.
        // Sharp attention (q/k std 0.2: scores of order 10) so position encodings show.
        "llama-yarn" => {
            o.extras.yarn = Some((4.0, 512));
            o.extras.qk_std = Some(0.2);
        }
        "llama-rope-freqs" => {
            o.extras.rope_freqs = true;
            o.extras.qk_std = Some(0.2);
        }
        // Caps below the score and logit magnitudes, so tanh bends them; a 4-token window so
        // short prompts already slide.
        "gemma2" => {
            o.extras.softcap = Some((5.0, 2.0));
            o.extras.window = Some(4);
            o.extras.qk_std = Some(0.2);
        }
        _ => {}
    }
    Some((o, vocab))
}

/// Names accepted by [`golden_spec`].
#[cfg(feature = "testing")]
pub const GOLDEN_NAMES: &[&str] = &[
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "llama-yarn",
    "llama-rope-freqs",
    "gemma2",
];

/// The tiny synthetic files of the newer families' llama.cpp references
/// (`model/tests/data/family_*.json`, made by `scripts/family_goldens.sh`): built-in vocabulary,
/// seed 42. Test data: only with the `testing` feature.
#[cfg(feature = "testing")]
pub fn family_spec(name: &str) -> Option<SynthOptions> {
    let (arch, ftype) = match name {
        "phi3" | "phi3-long" => ("phi3", "q8_0"),
        "gpt-oss" => ("gpt-oss", "q8_0"),
        "olmo2" => ("olmo2", "q4_k_m"),
        "granite" => ("granite", "q8_0"),
        _ => return None,
    };
    let preset = if arch == "gpt-oss" {
        "tiny-moe"
    } else {
        "tiny"
    };
    let mut o = SynthOptions::parse(arch, preset, ftype, 42).ok()?;
    match name {
        // LongRoPE factors with an original context above the tests' 256 positions (the short
        // factors apply) and below (the long ones do); sharp attention so rope shows, and a
        // 4-token window that llama.cpp ignores for Phi-3 (so must we).
        "phi3" => {
            o.extras.longrope = Some(512);
            o.extras.window = Some(4);
            o.extras.qk_std = Some(0.2);
        }
        "phi3-long" => {
            o.extras.longrope = Some(128);
            o.extras.qk_std = Some(0.2);
        }
        // YaRN 4x from 512 positions, a 4-token window on the even layers so short prompts
        // slide, sharp attention; MXFP4 experts, biases and sinks come with the architecture.
        "gpt-oss" => {
            o.extras.yarn = Some((4.0, 512));
            o.extras.window = Some(4);
            o.extras.qk_std = Some(0.2);
        }
        "olmo2" => o.extras.qk_std = Some(0.2),
        _ => {}
    }
    Some(o)
}

/// The tiny synthetic encoders of the embedding references (`model/tests/data/embed_*.json`,
/// made by `scripts/embed_goldens.sh`): name -> (options, vocabulary file in
/// `ROCMFORGE_VOCAB_DIR`, BGE's WordPiece one), seed 42. Test data: only with the `testing`
/// feature.
#[cfg(feature = "testing")]
pub fn embed_spec(name: &str) -> Option<(SynthOptions, &'static str)> {
    let arch = match name {
        "bert" | "nomic-bert" => name,
        _ => return None,
    };
    let mut o = SynthOptions::parse(arch, "tiny", "q8_0", 42).ok()?;
    // Sharp attention, so that positions and the attention mask show in the output.
    o.extras.qk_std = Some(0.2);
    Some((o, "ggml-vocab-bert-bge.gguf"))
}

/// Names accepted by [`embed_spec`].
#[cfg(feature = "testing")]
pub const EMBED_NAMES: &[&str] = &["bert", "nomic-bert"];

/// Names accepted by [`family_spec`].
#[cfg(feature = "testing")]
pub const FAMILY_NAMES: &[&str] = &["phi3", "phi3-long", "gpt-oss", "olmo2", "granite"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_deterministic_and_small() {
        let mut a = vec![0f32; 1000];
        let mut b = vec![0f32; 1000];
        normal_row(7, "x", 3, 0.0, 0.02, &mut a);
        normal_row(7, "x", 3, 0.0, 0.02, &mut b);
        assert_eq!(a, b);
        let var = a.iter().map(|x| x * x).sum::<f32>() / 1000.0;
        assert!((var.sqrt() - 0.02).abs() < 0.003, "std {}", var.sqrt());
    }

    /// Our per-tensor types in the layout of `tests/data/llama_quant_types.txt`: one line per
    /// tensor kind (sorted), the type of each layer's tensor; F32 tensors left out.
    fn type_table(arch: &str, preset_name: &str, m: LlamaFtype) -> Vec<String> {
        let o = SynthOptions::parse(arch, preset_name, m.name(), 42).expect("options");
        let mut kinds: std::collections::BTreeMap<String, Vec<GgmlType>> = Default::default();
        // The built-in vocabulary's 259 tokens, as the pinned files had.
        for t in tensor_specs(&o, 259) {
            if t.ty == GgmlType::F32 {
                continue;
            }
            let name = t.name.strip_suffix(".weight").expect("a matrix");
            let kind = match name.strip_prefix("blk.") {
                Some(rest) => rest.split_once('.').expect("blk.N.kind").1,
                None => name,
            };
            kinds.entry(kind.to_owned()).or_default().push(t.ty);
        }
        kinds
            .iter()
            .map(|(kind, tys)| {
                let tys: Vec<String> = tys.iter().map(|t| t.name().to_uppercase()).collect();
                format!("{arch} {preset_name} {} {kind} {}", m.name(), tys.join(" "))
            })
            .collect()
    }

    #[test]
    fn file_type_mixes_equal_llama_quantize() {
        // Made by scripts/llama_quant_types.sh: llama.cpp 0c1e57098's llama-quantize on F16
        // synthetic models of these shapes (untied 2-layer llama; tied 18-layer Gemma 3 with
        // 640-wide rows, so the fallbacks show; 8-expert Mixtral).
        let want = include_str!("../tests/data/llama_quant_types.txt");
        let mut models: Vec<(&str, &str)> = Vec::new();
        for line in want.lines() {
            let mut f = line.split(' ');
            let key = (f.next().expect("arch"), f.next().expect("preset"));
            if !models.contains(&key) {
                models.push(key);
            }
        }
        assert_eq!(models.len(), 3, "three shapes pinned");
        let mut got = Vec::new();
        for (arch, preset_name) in models {
            for m in LlamaFtype::ALL {
                got.extend(type_table(arch, preset_name, m));
            }
        }
        let want: Vec<&str> = want.lines().collect();
        assert_eq!(got.len(), want.len(), "lines");
        for (g, w) in got.iter().zip(&want) {
            assert_eq!(g, w);
        }
    }

    #[test]
    fn file_types_parse_as_llama_quantize_names_them() {
        assert_eq!(FileType::parse("Q4_K_M").expect("q4_k_m"), FileType::Q4KM);
        assert_eq!(
            FileType::parse("iq4_xs").expect("iq4_xs"),
            FileType::Mix(LlamaFtype::IQ4_XS)
        );
        assert_eq!(
            FileType::parse("q4_0").expect("q4_0"),
            FileType::Mix(LlamaFtype::Q4_0)
        );
        // Plain types that are no file type's name: every matrix of that type.
        assert_eq!(
            FileType::parse("q4_k").expect("q4_k"),
            FileType::All(GgmlType::Q4_K)
        );
        assert_eq!(
            FileType::parse("f16").expect("f16"),
            FileType::All(GgmlType::F16)
        );
        assert!(FileType::parse("iq2_xxs").is_err());
        // The pure types take llama.cpp's fallbacks too (--pure keeps them).
        let c = MixContext {
            n_gqa: 1,
            n_expert: 0,
            tied: false,
        };
        let pure = |t, cols| {
            matrix_type(
                FileType::All(t),
                "blk.0.attn_q.weight",
                Some((0, 1)),
                cols,
                c,
            )
        };
        assert_eq!(pure(GgmlType::Q4_K, 640), GgmlType::Q5_0);
        assert_eq!(pure(GgmlType::IQ4_XS, 640), GgmlType::IQ4_NL);
        assert_eq!(pure(GgmlType::Q4_K, 100), GgmlType::F16);
    }

    /// Every tensor's bytes, generated in parallel over rows, equal a one-row-at-a-time
    /// generation (rows seed their own generators, so the split cannot matter), for each weight
    /// type a Q4_K_M file mixes and the norms.
    #[test]
    fn parallel_rows_equal_serial_rows() {
        let o = SynthOptions::parse("llama", "tiny", "q4_k_m", 3).expect("options");
        let specs = tensor_specs(&o, 259);
        let mut tys = std::collections::BTreeSet::new();
        for t in specs.iter().filter(|t| !t.name.starts_with("rope_")) {
            let got = tensor_bytes(o.seed, t).expect("tensor");
            let cols = t.dims[0] as usize;
            let rb = t.ty.row_bytes(cols as u64).expect("row bytes") as usize;
            let mean = if t.norm && t.name.contains("norm") {
                1.0
            } else {
                0.0
            };
            let mut vals = vec![0f32; cols];
            let mut want = vec![0u8; got.len()];
            for (r, dst) in want.chunks_exact_mut(rb).enumerate() {
                normal_row(o.seed, &t.name, r as u64, mean, t.std, &mut vals);
                gguf::quantize_row(t.ty, &vals, dst).expect("quantize");
            }
            assert!(got == want, "{}: parallel rows differ", t.name);
            tys.insert(t.ty.name());
        }
        assert!(tys.len() >= 3, "types covered: {tys:?}");
    }

    #[test]
    fn writes_a_loadable_tiny_model() {
        let dir = std::env::temp_dir().join(format!("rocmforge-synth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("tiny.gguf");
        write_model("qwen2", &path, 1).expect("write");
        let f = GgufFile::open(&path).expect("reopen");
        assert_eq!(f.architecture().expect("arch"), "qwen2");
        let t = f.tensor("blk.1.attn_k.bias").expect("bias");
        assert_eq!(t.ne(0), 128);
        let tok = crate::tokenizer::Tokenizer::from_gguf(&f).expect("tokenizer");
        assert_eq!(tok.n_vocab(), 259);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
