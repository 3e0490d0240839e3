//! Tensor descriptors and the op enum: the nodes of a [`crate::Graph`].
//!
//! Shapes follow ggml: `ne[0]` is the innermost (contiguous) dimension, `nb[i]` the byte stride of
//! dimension `i`. A quantized row of `ne[0]` values takes `dtype.row_bytes(ne[0])` bytes.

use gguf::GgmlType;

/// Element type of a tensor: any ggml type (f32, f16, bf16, i32 and every quantized block type).
pub type DType = GgmlType;

/// Maximum number of dimensions.
pub const MAX_DIMS: usize = 4;

/// Index of a tensor inside its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub(crate) u32);

impl TensorId {
    /// Position of the tensor in its graph's node list.
    pub fn index(self) -> usize {
        self.0 as usize
    }

    /// The id of node `i` (graph methods check that it exists).
    pub fn from_index(i: usize) -> Self {
        Self(i as u32)
    }
}

/// What a tensor's storage is and who owns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Leaf {
    /// Data provided per run by the caller (token ids, positions, masks...).
    Input,
    /// Read-only bytes bound by name to the executor (e.g. a slice of a mmap'd GGUF), zero-copy.
    Weight,
    /// Executor-owned buffer, found by name, that keeps its contents across runs (the KV cache).
    Persistent,
}

/// RoPE layout: which dimensions form a rotated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeMode {
    /// Adjacent pairs `(2i, 2i+1)` (llama, mistral).
    Normal,
    /// Split halves `(i, i + n_dims/2)` (qwen2, qwen3, gemma3...).
    Neox,
}

/// Rotary embedding parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeParams {
    /// Pair layout.
    pub mode: RopeMode,
    /// Number of leading dimensions rotated (partial rotary when below the head size).
    pub n_dims: usize,
    /// Base of the frequency ladder (10000, 1e6...).
    pub freq_base: f32,
    /// Linear position scaling (1.0 for none).
    pub freq_scale: f32,
    /// YaRN extrapolation mix (0.0: plain scaled rope; 1.0 with `rope.scaling.type = yarn`).
    pub ext_factor: f32,
    /// Magnitude applied to cos/sin (YaRN's attention factor; 1.0 otherwise).
    pub attn_factor: f32,
    /// YaRN: rotations per original context above which a dimension is extrapolated.
    pub beta_fast: f32,
    /// YaRN: rotations per original context below which a dimension is interpolated.
    pub beta_slow: f32,
    /// YaRN: the context length the model was trained with before scaling.
    pub n_ctx_orig: usize,
}

impl RopeParams {
    /// Plain rotary embedding (no YaRN) with a linear position scale.
    pub fn new(mode: RopeMode, n_dims: usize, freq_base: f32, freq_scale: f32) -> Self {
        Self {
            mode,
            n_dims,
            freq_base,
            freq_scale,
            ext_factor: 0.0,
            attn_factor: 1.0,
            beta_fast: 32.0,
            beta_slow: 1.0,
            n_ctx_orig: 0,
        }
    }

    /// YaRN's correction range `[low, high]` of pair indices (ggml's `rope_yarn_corr_dims`):
    /// pairs below `low` keep their trained frequency, pairs above `high` are fully scaled.
    pub fn yarn_corr_dims(&self) -> [f32; 2] {
        let n = self.n_dims as f32;
        let dim = |beta: f32| {
            n * (self.n_ctx_orig as f32 / (beta * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * self.freq_base.ln())
        };
        let start = dim(self.beta_fast).floor();
        let end = dim(self.beta_slow).ceil();
        [start.max(0.0), end.min(n - 1.0)]
    }

    /// The cos/sin magnitude: `attn_factor`, times YaRN's `1 + 0.1 ln(1 / freq_scale)` when
    /// extrapolation is on (as ggml's `rope_yarn`).
    pub fn mscale(&self) -> f32 {
        if self.ext_factor != 0.0 {
            self.attn_factor * 0.1f32.mul_add((1.0 / self.freq_scale).ln(), 1.0)
        } else {
            self.attn_factor
        }
    }
}

/// YaRN's ramp for pair `i` between the correction dims (1 below `low`, 0 above `high`).
pub fn yarn_ramp(corr: [f32; 2], i: usize) -> f32 {
    let y = (i as f32 - corr[0]) / (corr[1] - corr[0]).max(0.001);
    1.0 - y.clamp(0.0, 1.0)
}

/// Elementwise activation used alone or in a gated pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Act {
    /// GELU, tanh approximation.
    Gelu,
    /// SiLU (x * sigmoid(x)).
    Silu,
}

/// Fused attention parameters.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttnParams {
    /// Multiplier applied to q.k (usually 1/sqrt(head_dim)).
    pub scale: f32,
    /// Mask keys whose position is after the query position.
    pub causal: bool,
    /// Sliding window: a key at position `j` is visible from query position `p` only when
    /// `p - j < window`.
    pub window: Option<usize>,
    /// Gemma 2 style soft-capping of the scaled scores, `cap * tanh(s / cap)`, before the mask
    /// and softmax (`None`: off).
    pub softcap: Option<f32>,
    /// Attention sinks (gpt-oss): the op's last operand is an f32 `[n_head]` logit per query
    /// head that joins each row's softmax as an extra key with no value (it only takes
    /// probability away from the real keys), as ggml's `soft_max_add_sinks`.
    pub sinks: bool,
}

/// An operation with its typed parameters; the operands are the node's `src` list, in the order
/// documented per variant.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// A leaf: no computation.
    Leaf(Leaf),
    /// `[table, ids]`: rows of `table` (any type) picked by I32 `ids` -> f32 `[table.ne0, n]`.
    GetRows,
    /// `[w, x]`: `out[n, m] = sum_k w[k, n] * x[k, m]`, batched over dims 2 and 3 with broadcast
    /// of `w`.
    MulMat,
    /// `[a, b]`: elementwise sum, `b` broadcast (repeated) over `a`.
    Add,
    /// `[a, b]`: elementwise product, `b` broadcast over `a`.
    Mul,
    /// `[a]`: `a * s`.
    Scale(f32),
    /// `[a]`: `cap * tanh(a / cap)` elementwise (Gemma 2 final-logit soft-capping).
    SoftCap(f32),
    /// `[a]`: per row `x / sqrt(mean(x^2) + eps)`.
    RmsNorm {
        /// Epsilon inside the square root.
        eps: f32,
    },
    /// `[a]`: per row `(x - mean) / sqrt(var + eps)`.
    Norm {
        /// Epsilon inside the square root.
        eps: f32,
    },
    /// `[x, pos]` or `[x, pos, freq_factors]`: x is `[head_dim, n_head, n_tok]`, pos I32 `[n_tok]`.
    Rope(RopeParams),
    /// `[a]` or `[a, mask]`: row softmax of `a * scale + mask` (mask `[ne0, rows]`, broadcast over
    /// dims 2 and 3).
    SoftMax {
        /// Multiplier applied before the mask.
        scale: f32,
    },
    /// `[a]`: elementwise activation.
    Unary(Act),
    /// `[gate, up]`: `act(gate) * up` (swiglu with Silu, geglu with Gelu).
    Gated(Act),
    /// `[q, k, v, pos]` or `[q, k, v, pos, mask]`: q `[d, n_head, n_tok]` f32, k `[d, n_kv_head,
    /// n_kv]`, v `[dv, n_kv_head, n_kv]` (f32/f16/bf16, or q8_0 rows dequantized as read; key
    /// `j` has position `j`), pos I32
    /// `[n_tok]` (query positions), optional additive f32 mask `[n_kv, n_tok]`, then with
    /// [`AttnParams::sinks`] the sinks f32 `[n_head]`.
    /// Result `[dv, n_head, n_tok]` f32. Query head `h` reads kv head `h / (n_head / n_kv_head)`.
    Attention(AttnParams),
    /// `[q, k, v, pos, seq, tables]`: attention of every query token over the cached positions
    /// of its own sequence in a paged KV pool. q `[d, n_head, n_tok]` f32; k `[d, n_kv_head,
    /// n_slots]` and v `[dv, n_kv_head, n_slots]` (f32/f16/bf16/q8_0) pools in blocks of `block_size`
    /// slots (slot `b * block_size + i` holds position `i` of the block with id `b`); pos I32
    /// `[n_tok]` (query positions); seq I32 `[2, n_tok]`: per token its sequence's column of
    /// `tables` and 1 when the token is its sequence's only one in the pass (a decode step: the
    /// CPU then sums as [`Op::Attention`] does for a one-token batch, so results equal a
    /// sequence run alone), else 0; tables I32 `[max_blocks, n_seqs]`: block ids by the block
    /// index of the position; with [`AttnParams::sinks`] then the sinks f32 `[n_head]`. Always
    /// causal; the window applies as in [`Op::Attention`].
    /// Result `[dv, n_head, n_tok]` f32.
    PagedAttention {
        /// Scale, window and soft-capping (`causal` must be true).
        params: AttnParams,
        /// Positions per block.
        block_size: usize,
    },
    /// `[src, dst]`: converts `src` into the (view) `dst` element by element in logical order;
    /// the result aliases `dst`.
    Cpy,
    /// `[a]`: contiguous copy of a (possibly strided) tensor.
    Cont,
    /// `[a]`: a view of `a`'s storage (reshape, view, permute, transpose); no computation.
    View,
    /// `[a, b]`: concatenation along `dim`.
    Concat {
        /// Dimension joined.
        dim: usize,
    },
    /// `[dst, src, idx]`: `dst` row `idx[i]` := `src` row `i`, converted to `dst`'s type (q8_0
    /// rows quantized block by block); the
    /// result aliases `dst` (take views of the result to read what was written).
    SetRows,
    /// `[p0, p1, ...]`: elementwise sum of dense f32 tensors of one shape: the partial results
    /// of a tensor split, one per device. A [`crate::sched::Scheduler`] with a
    /// [`crate::backend::Collective`] over the partials' devices sums them in place on every
    /// device (an all-reduce) instead of copying them to one; a device that runs the node
    /// itself adds the operands it is given.
    AllReduce,
    /// `[a]`: I32 index of the largest value of each row.
    Argmax,
    /// `[a]`: I32 `[k, rows]`: per row of f32 `a` the indices of its `k` largest values, largest
    /// first, the lower index first among equal values (mixture-of-experts routing).
    ArgTopK(usize),
    /// `[probs, ids]`: f32 `[k, rows]`: per row the values of f32 `probs` `[n, rows]` at the
    /// I32 indices `ids` `[k, rows]`; with `norm` divided by their sum (at least 2^-14), as
    /// llama.cpp's `build_moe_ffn` normalises the chosen experts' weights.
    ExpertWeights {
        /// Divide the picked values by their sum.
        norm: bool,
    },
    /// `[w, x, ids]`: llama.cpp's `mul_mat_id`. `w` is a stack of matrices `[k, n, n_mat]`, x f32
    /// `[k, n_x, n_tok]` with `n_x` 1 or `ids.ne0`, ids I32 `[n_used, n_tok]`. Result f32
    /// `[n, n_used, n_tok]`: `out[:, i, t] = w[:, :, ids[i, t]] . x[:, i % n_x, t]`. Only the
    /// chosen matrices are read; every column is summed as a one-column product.
    MulMatId,
    /// `[gate, up]`: gpt-oss's clamped SwiGLU (ggml's `swiglu_oai`): with `g = min(gate,
    /// limit)` and `u = clamp(up, -limit, limit)`, `g * sigmoid(alpha g) * (u + 1)`.
    SwigluOai {
        /// Sigmoid sharpness (gpt-oss: 1.702).
        alpha: f32,
        /// Clamp of both halves (gpt-oss: 7).
        limit: f32,
    },
    /// Fused `[experts, weights]` or `[experts, weights, r]`: f32 `[n, rows]`, per row `t` the
    /// sum over the `k` slots of `experts[:, s, t] * weights[0, s, t]` (`experts` `[n, k, rows]`,
    /// `weights` `[1, k, rows]`), slot 0 plus slot 1 first and then each further slot, every
    /// product rounded before its add, and `r` `[n, rows]` (the residual) added to that sum when
    /// given: the mixture-of-experts output as the `mul` and the chain of `add`s over slot views
    /// that llama.cpp builds compute it (then the residual `add`), bit for bit. Made by the
    /// optimizer.
    MoeSum,
    /// Fused `[x, w]`: `rms_norm(x, eps) * w` (`w` broadcast), made by the optimizer.
    RmsNormMul {
        /// Epsilon inside the square root.
        eps: f32,
    },
    /// Fused `[w, x, b]`: `mul_mat(w, x) + b` (`b` broadcast), made by the optimizer.
    MulMatAdd,
    /// Fused `[w_gate, w_up, x]`: `act(mul_mat(w_gate, x)) * mul_mat(w_up, x)`, made by the
    /// optimizer; the activations are quantized once for both weights.
    MulMatGated(Act),
    /// A whole llama-family decode layer for one token, made by
    /// [`crate::opt::fuse_decode_layers`] for a device that runs it as one kernel. Operands in
    /// the order of [`layer_src`]; the result is the layer's output residual `[n_embd, 1]` f32.
    /// Besides it the node stores the layer's key and value rows at the position into the K and V
    /// caches its operands view (it writes persistent storage, as `set_rows` does).
    DecodeLayer(DecodeLayerParams),
}

/// Parameters of an [`Op::DecodeLayer`] node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DecodeLayerParams {
    /// Epsilon of the attention pre-norm.
    pub attn_eps: f32,
    /// Epsilon of the FFN pre-norm.
    pub ffn_eps: f32,
    /// The q and k ropes.
    pub rope: RopeParams,
    /// The attention (no mask).
    pub attn: AttnParams,
    /// The gated FFN's activation.
    pub act: Act,
    /// Query heads.
    pub n_head: usize,
    /// Values per query and key head.
    pub head_dim: usize,
    /// The q, k and v projections add biases (operands [`layer_src::BQ`] ..= [`layer_src::BV`]).
    pub qkv_bias: bool,
    /// Each q and k head is RMS-normed with this epsilon and times a weight (operands
    /// [`layer_src::Q_NORM`] and [`layer_src::K_NORM`]) before the rope (Qwen3). Never with
    /// `qkv_bias`.
    pub qk_norm: Option<f32>,
}

impl DecodeLayerParams {
    /// Operand position of the rope's frequency factors, when the node has them (its last
    /// operand, after the biases or the q/k norm weights).
    pub fn freq_factors_src(&self) -> usize {
        if self.qkv_bias {
            layer_src::BV + 1
        } else if self.qk_norm.is_some() {
            layer_src::K_NORM + 1
        } else {
            layer_src::W_DOWN + 1
        }
    }
}

/// Operand positions of an [`Op::DecodeLayer`] node.
pub mod layer_src {
    /// The input residual `[n_embd, 1]`.
    pub const X: usize = 0;
    /// The attention norm's weight.
    pub const ATTN_NORM: usize = 1;
    /// The q, k and v projections.
    pub const WQ: usize = 2;
    /// See [`WQ`].
    pub const WK: usize = 3;
    /// See [`WQ`].
    pub const WV: usize = 4;
    /// I32 position of the token `[1]` (rope, cache row and attention).
    pub const POS: usize = 5;
    /// The keys the attention reads: a view `[head_dim, n_head_kv, n_kv]` of the K cache, whose
    /// row `pos` the node writes.
    pub const K: usize = 6;
    /// The values, as [`K`] of the V cache.
    pub const V: usize = 7;
    /// The output projection.
    pub const WO: usize = 8;
    /// The FFN norm's weight.
    pub const FFN_NORM: usize = 9;
    /// The FFN's gate, up and down matrices.
    pub const W_GATE: usize = 10;
    /// See [`W_GATE`].
    pub const W_UP: usize = 11;
    /// See [`W_GATE`].
    pub const W_DOWN: usize = 12;
    /// The q projection's bias (f32 `[n_head * head_dim]`), when the layer has biases
    /// ([`super::DecodeLayerParams::qkv_bias`]). The rope's frequency factors, when it has them,
    /// follow the last operand of the layer (see
    /// [`super::DecodeLayerParams::freq_factors_src`]).
    pub const BQ: usize = 13;
    /// The k projection's bias, as [`BQ`].
    pub const BK: usize = 14;
    /// The v projection's bias, as [`BQ`].
    pub const BV: usize = 15;
    /// The q heads' norm weight (f32 `[head_dim]`), when the layer norms its q and k heads
    /// ([`super::DecodeLayerParams::qk_norm`]; then without biases).
    pub const Q_NORM: usize = 13;
    /// The k heads' norm weight, as [`Q_NORM`].
    pub const K_NORM: usize = 14;
}

impl Op {
    /// Short lower-case name, as in logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Leaf(_) => "leaf",
            Op::GetRows => "get_rows",
            Op::MulMat => "mul_mat",
            Op::Add => "add",
            Op::Mul => "mul",
            Op::Scale(_) => "scale",
            Op::SoftCap(_) => "softcap",
            Op::RmsNorm { .. } => "rms_norm",
            Op::Norm { .. } => "norm",
            Op::Rope(_) => "rope",
            Op::SoftMax { .. } => "soft_max",
            Op::Unary(Act::Gelu) => "gelu",
            Op::Unary(Act::Silu) => "silu",
            Op::Gated(Act::Gelu) => "geglu",
            Op::Gated(Act::Silu) => "swiglu",
            Op::Attention(_) => "attention",
            Op::PagedAttention { .. } => "paged_attention",
            Op::Cpy => "cpy",
            Op::Cont => "cont",
            Op::View => "view",
            Op::Concat { .. } => "concat",
            Op::SetRows => "set_rows",
            Op::AllReduce => "all_reduce",
            Op::Argmax => "argmax",
            Op::ArgTopK(_) => "argsort_top_k",
            Op::ExpertWeights { .. } => "expert_weights",
            Op::MulMatId => "mul_mat_id",
            Op::SwigluOai { .. } => "swiglu_oai",
            Op::MoeSum => "moe_sum",
            Op::RmsNormMul { .. } => "rms_norm_mul",
            Op::MulMatAdd => "mul_mat_add",
            Op::MulMatGated(Act::Silu) => "mul_mat_swiglu",
            Op::MulMatGated(Act::Gelu) => "mul_mat_geglu",
            Op::DecodeLayer(_) => "decode_layer",
        }
    }

    /// True when the result shares storage with its first view source (no memory of its own).
    pub fn is_alias(&self) -> bool {
        matches!(self, Op::View | Op::Cpy | Op::SetRows)
    }
}

/// One node of a graph: metadata only, no data.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Name (leaves are bound by name; others are for debugging).
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Number of elements per dimension (`ne[0]` innermost).
    pub ne: [usize; MAX_DIMS],
    /// Byte stride per dimension.
    pub nb: [usize; MAX_DIMS],
    /// Operation producing this tensor.
    pub op: Op,
    /// Operands.
    pub src: Vec<TensorId>,
    /// When this tensor shares storage with another: that tensor and the byte offset into it.
    pub view_of: Option<(TensorId, usize)>,
}

impl Tensor {
    /// Total number of elements.
    pub fn nelements(&self) -> usize {
        self.ne.iter().product()
    }

    /// Number of rows (all dims but the first).
    pub fn nrows(&self) -> usize {
        self.ne[1] * self.ne[2] * self.ne[3]
    }

    /// Bytes of one contiguous row.
    pub fn row_bytes(&self) -> usize {
        row_bytes(self.dtype, self.ne[0])
    }

    /// True when the layout is the dense row-major one for its shape.
    pub fn is_contiguous(&self) -> bool {
        self.nb == contiguous_strides(self.dtype, &self.ne)
    }

    /// True when each row is dense (dims 1..3 may have any stride).
    pub fn rows_contiguous(&self) -> bool {
        self.ne[0] <= 1 || self.nb[0] == self.dtype.type_size()
    }

    /// Bytes spanned from the tensor's first byte to one past its last.
    pub fn extent(&self) -> usize {
        if self.nelements() == 0 {
            return 0;
        }
        let (mut end, first) = if self.dtype.is_quantized() || self.rows_contiguous() {
            (self.row_bytes(), 1)
        } else {
            (self.dtype.type_size(), 0)
        };
        for d in first..MAX_DIMS {
            end += (self.ne[d] - 1) * self.nb[d];
        }
        end
    }

    /// Bytes of a dense tensor of this type and shape.
    pub fn dense_bytes(&self) -> usize {
        self.row_bytes() * self.nrows()
    }
}

/// Bytes of `n` values of `dtype` (whole blocks).
pub fn row_bytes(dtype: DType, n: usize) -> usize {
    n / dtype.block_size() * dtype.type_size()
}

/// Dense strides for a shape.
pub fn contiguous_strides(dtype: DType, ne: &[usize; MAX_DIMS]) -> [usize; MAX_DIMS] {
    let mut nb = [0; MAX_DIMS];
    nb[0] = dtype.type_size();
    nb[1] = row_bytes(dtype, ne[0]);
    nb[2] = nb[1] * ne[1];
    nb[3] = nb[2] * ne[2];
    nb
}

/// Pads a shape of 1 to 4 dims with ones.
pub(crate) fn shape4(shape: &[usize]) -> Option<[usize; MAX_DIMS]> {
    if shape.is_empty() || shape.len() > MAX_DIMS {
        return None;
    }
    let mut ne = [1; MAX_DIMS];
    ne[..shape.len()].copy_from_slice(shape);
    Some(ne)
}
