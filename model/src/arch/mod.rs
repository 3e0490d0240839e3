//! Execution plans: one module per architecture, each turning a [`ModelConfig`] and a batch
//! description into a compute [`Graph`]; shared layer pieces live here.
//!
//! Plans only describe computation. Weights appear as named graph leaves (bound later, zero-copy,
//! to the mapped file), the KV cache as persistent leaves owned by the executor; nothing here
//! reads or writes tensor data.

pub mod bert;
pub mod gemma2;
pub mod gemma3;
pub mod gpt_oss;
pub mod granite;
pub mod llama;
pub mod olmo2;
pub mod phi3;
pub mod qwen2;
pub mod qwen3;
pub mod validate;

use std::collections::HashMap;
use std::sync::Arc;

use ggml_graph::{AttnParams, DType, Graph, RopeParams, TensorId};
use gguf::TensorInfo;

use crate::config::{Architecture, LayerAttention, ModelConfig, RopeMode};
use crate::error::ModelError;
use crate::gpus::TensorSplit;

/// Which positions of a batch produce logits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsMode {
    /// Only the last position (prompt processing and decoding).
    Last,
    /// Every position (perplexity).
    All,
}

/// One forward pass: `n_tok` tokens at positions `n_past..n_past + n_tok`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSpec {
    /// Tokens in this pass.
    pub n_tok: usize,
    /// Positions already in the KV cache.
    pub n_past: usize,
    /// Which logits to compute.
    pub logits: LogitsMode,
}

/// KV cache element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    /// Half precision (default, as llama.cpp).
    F16,
    /// Full precision.
    F32,
    /// ggml Q8_0 blocks (32 values, an f16 scale and 32 signed bytes): half of f16's memory.
    /// Keys and values are quantized as they are written and dequantized as attention reads
    /// them; the head dimensions must be multiples of 32.
    Q8_0,
}

impl KvType {
    /// The graph element type of the cache tensors.
    pub fn dtype(self) -> DType {
        match self {
            KvType::F16 => DType::F16,
            KvType::F32 => DType::F32,
            KvType::Q8_0 => DType::Q8_0,
        }
    }

    /// Bytes of `n` values (`n` a multiple of the type's block size).
    pub fn row_bytes(self, n: usize) -> usize {
        let t = self.dtype();
        n / t.block_size() * t.type_size()
    }

    /// Refuses a model whose key or value head size is no whole number of this type's blocks.
    pub fn check(self, cfg: &ModelConfig) -> Result<(), ModelError> {
        let bs = self.dtype().block_size();
        match [cfg.head_dim, cfg.head_dim_v]
            .into_iter()
            .find(|d| d % bs != 0)
        {
            Some(head_dim) => Err(ModelError::KvType {
                kv_type: self.to_string(),
                head_dim,
                block: bs,
            }),
            None => Ok(()),
        }
    }
}

impl std::fmt::Display for KvType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            KvType::F16 => "f16",
            KvType::F32 => "f32",
            KvType::Q8_0 => "q8_0",
        })
    }
}

impl std::str::FromStr for KvType {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "f16" => Ok(KvType::F16),
            "f32" => Ok(KvType::F32),
            "q8_0" | "q8" => Ok(KvType::Q8_0),
            _ => Err(ModelError::InvalidArgument(format!(
                "KV cache type `{s}`: expected f16, f32 or q8_0"
            ))),
        }
    }
}

/// Shape of the KV cache: one K and one V persistent tensor per layer, `n_ctx` rows each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheSpec {
    /// Element type.
    pub dtype: KvType,
    /// Positions the cache holds.
    pub n_ctx: usize,
}

impl KvCacheSpec {
    /// Name of layer `il`'s key cache leaf.
    pub fn k_name(il: usize) -> String {
        format!("cache_k.{il}")
    }

    /// Name of layer `il`'s value cache leaf.
    pub fn v_name(il: usize) -> String {
        format!("cache_v.{il}")
    }

    /// Bytes the whole cache takes for a model.
    pub fn bytes(&self, cfg: &ModelConfig) -> usize {
        // Saturating: an estimate past usize is "more than any memory", never a wrapped size
        // that would pass a fit check.
        let per_pos = cfg.n_head_kv.saturating_mul(
            self.dtype
                .row_bytes(cfg.head_dim)
                .saturating_add(self.dtype.row_bytes(cfg.head_dim_v)),
        );
        [cfg.n_layer, self.n_ctx]
            .iter()
            .fold(per_pos, |a, &f| a.saturating_mul(f))
    }
}

/// The graph of one forward pass and the ids callers feed and read.
#[derive(Debug)]
pub struct ForwardGraph {
    /// The graph.
    pub graph: Graph,
    /// I32 `[n_tok]` token ids input, named `tokens`.
    pub tokens: TensorId,
    /// I32 `[n_tok]` positions input, named `pos`.
    pub pos: TensorId,
    /// f32 `[n_vocab, n_out]` logits output (an embedding encoder's: its `[n_embd, n_out]`
    /// last hidden states).
    pub logits: TensorId,
}

/// Shapes and types of the file's tensors, by name: what the plans declare as weight leaves.
/// With a tensor split, it also holds each GPU's slices (see [`part_suffix`]) and the split
/// the plans build their per-GPU partial results by.
#[derive(Clone, Debug, Default)]
pub struct WeightTable {
    infos: HashMap<String, (DType, Vec<usize>)>,
    split: Option<Arc<TensorSplit>>,
    /// With a split run by one process per GPU: this process's part (the plans build only
    /// it, and sum it with the other processes' by an all-reduce).
    local: Option<usize>,
}

/// What GPU `k`'s slice of a split tensor adds to its name before `.weight`/`.bias`
/// (`blk.3.attn_q.tp1.weight`) and to its KV cache leaves (`cache_k.3.tp1`).
pub fn part_suffix(k: usize) -> String {
    format!(".tp{k}")
}

/// The GPU of a tensor-split slice or KV cache leaf named with [`part_suffix`].
pub fn part_of(name: &str) -> Option<usize> {
    let i = name.find(".tp")?;
    let rest = &name[i + 3..];
    let digits = rest.split('.').next()?;
    digits.parse().ok()
}

impl WeightTable {
    /// The table of a file's tensor infos.
    pub fn from_infos<'a>(infos: impl IntoIterator<Item = &'a TensorInfo>) -> Self {
        let infos = infos
            .into_iter()
            .map(|t| {
                let dims = t.dims.iter().map(|&d| d as usize).collect();
                (t.name.clone(), (t.ggml_type, dims))
            })
            .collect();
        Self {
            infos,
            split: None,
            local: None,
        }
    }

    /// This table with GPU slices added (name, type, dims) and the split the plans follow.
    pub fn with_split(
        &self,
        split: Arc<TensorSplit>,
        slices: impl IntoIterator<Item = (String, DType, Vec<usize>)>,
    ) -> Self {
        let mut infos = self.infos.clone();
        infos.extend(slices.into_iter().map(|(n, t, d)| (n, (t, d))));
        Self {
            infos,
            split: Some(split),
            local: None,
        }
    }

    /// This table for the process of part `rank` of its split: the plans build only that part
    /// and sum it with the other processes' parts.
    pub(crate) fn for_rank(mut self, rank: usize) -> Self {
        self.local = Some(rank);
        self
    }

    /// The tensor split the plans build for, if any.
    pub fn split(&self) -> Option<&Arc<TensorSplit>> {
        self.split.as_ref()
    }

    /// True when the file has a tensor of this name.
    pub fn contains(&self, name: &str) -> bool {
        self.infos.contains_key(name)
    }

    /// Type and dims of a tensor.
    pub fn get(&self, name: &str) -> Option<(DType, &[usize])> {
        self.infos.get(name).map(|(t, d)| (*t, d.as_slice()))
    }
}

/// Builds one forward graph for `cfg`'s architecture.
pub fn build_forward(
    cfg: &ModelConfig,
    weights: &WeightTable,
    kv: &KvCacheSpec,
    batch: BatchSpec,
) -> Result<ForwardGraph, ModelError> {
    if batch.n_tok == 0 || batch.n_past + batch.n_tok > kv.n_ctx {
        return Err(ModelError::ContextFull {
            needed: batch.n_past + batch.n_tok,
            n_ctx: kv.n_ctx,
        });
    }
    let mut b = Builder::new(cfg, weights, kv, batch)?;
    let hidden = match cfg.arch {
        Architecture::Llama => llama::build(&mut b)?,
        Architecture::Qwen2 => qwen2::build(&mut b)?,
        Architecture::Qwen3 | Architecture::Qwen3Moe => qwen3::build(&mut b)?,
        Architecture::Gemma2 => gemma2::build(&mut b)?,
        Architecture::Gemma3 => gemma3::build(&mut b)?,
        Architecture::Phi3 => phi3::build(&mut b)?,
        Architecture::GptOss => gpt_oss::build(&mut b)?,
        Architecture::Olmo2 => olmo2::build(&mut b)?,
        Architecture::Granite => granite::build(&mut b)?,
        Architecture::Bert | Architecture::NomicBert => bert::build(&mut b)?,
    };
    b.finish(hidden)
}

/// A paged KV cache: per layer one K and one V pool of `n_blocks * block_size` rows (the same
/// persistent leaves as [`KvCacheSpec`]), shared by many sequences through block tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedKvSpec {
    /// Element type.
    pub dtype: KvType,
    /// Blocks in the pool.
    pub n_blocks: usize,
    /// Positions per block.
    pub block_size: usize,
    /// Width of a block table: the blocks of the longest sequence.
    pub max_blocks: usize,
}

impl PagedKvSpec {
    /// The contiguous cache of the same rows (for memory estimates and placement).
    pub fn as_cache(&self) -> KvCacheSpec {
        KvCacheSpec {
            dtype: self.dtype,
            n_ctx: self.n_blocks * self.block_size,
        }
    }
}

/// One forward pass over many sequences: `n_tok` tokens in all, from `n_seqs` sequences, with
/// logits for `n_out` of them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagedBatch {
    /// Tokens in the pass.
    pub n_tok: usize,
    /// Sequences (columns of the block tables).
    pub n_seqs: usize,
    /// Tokens whose logits are computed.
    pub n_out: usize,
    /// Output the normalized hidden states of those tokens (`[n_embd, n_out]`, the output
    /// head's input) instead of logits: embeddings.
    pub hidden: bool,
    /// Pool rows copied before the pass writes (copy-on-write of shared blocks), in every
    /// layer's K and V pool; 0 for none.
    pub n_copy: usize,
}

/// The graph of a paged pass and the ids callers feed and read.
#[derive(Debug)]
pub struct PagedGraph {
    /// The graph.
    pub graph: Graph,
    /// I32 `[n_tok]` token ids.
    pub tokens: TensorId,
    /// I32 `[n_tok]` positions (in each token's own sequence).
    pub pos: TensorId,
    /// I32 `[n_tok]` pool rows the tokens' keys and values are written to.
    pub slots: TensorId,
    /// I32 `[2, n_tok]`: each token's block-table column and its one-token flag (see
    /// [`ggml_graph::Op::PagedAttention`]).
    pub seq: TensorId,
    /// I32 `[max_blocks, n_seqs]` block tables.
    pub tables: TensorId,
    /// I32 `[n_out]` indices of the tokens whose logits are computed.
    pub out_rows: TensorId,
    /// I32 `[n_copy]` source and destination pool rows of the copies made before the writes
    /// (with [`PagedBatch::n_copy`] > 0).
    pub copy: Option<(TensorId, TensorId)>,
    /// f32 `[n_vocab, n_out]` logits, or `[n_embd, n_out]` hidden states with
    /// [`PagedBatch::hidden`].
    pub logits: TensorId,
}

/// The paged pass's inputs inside a [`Builder`].
#[derive(Clone, Copy, Debug)]
struct PagedInputs {
    spec: PagedKvSpec,
    slots: TensorId,
    seq: TensorId,
    tables: TensorId,
    out_rows: TensorId,
    hidden: bool,
    copy: Option<(TensorId, TensorId)>,
}

/// Builds one forward pass over several sequences with a paged KV cache for `cfg`'s
/// architecture: the same plan as [`build_forward`], with the KV written to the pool rows the
/// caller picks and attention over each token's own sequence.
pub fn build_paged_forward(
    cfg: &ModelConfig,
    weights: &WeightTable,
    kv: &PagedKvSpec,
    batch: PagedBatch,
) -> Result<PagedGraph, ModelError> {
    if batch.n_tok == 0 || batch.n_seqs == 0 || batch.n_out == 0 || batch.n_out > batch.n_tok {
        return Err(ModelError::InvalidArgument(format!(
            "paged pass of {} tokens, {} sequences, {} logits",
            batch.n_tok, batch.n_seqs, batch.n_out
        )));
    }
    let cache = kv.as_cache();
    let spec = BatchSpec {
        n_tok: batch.n_tok,
        n_past: 0,
        logits: LogitsMode::All,
    };
    let mut b = Builder::new(cfg, weights, &cache, spec)?;
    let slots = b.g.input("slots", DType::I32, &[batch.n_tok])?;
    let seq = b.g.input("seq", DType::I32, &[2, batch.n_tok])?;
    let tables =
        b.g.input("block_tables", DType::I32, &[kv.max_blocks, batch.n_seqs])?;
    let out_rows = b.g.input("out_rows", DType::I32, &[batch.n_out])?;
    let copy = if batch.n_copy > 0 {
        Some((
            b.g.input("copy_src", DType::I32, &[batch.n_copy])?,
            b.g.input("copy_dst", DType::I32, &[batch.n_copy])?,
        ))
    } else {
        None
    };
    b.paged = Some(PagedInputs {
        spec: *kv,
        slots,
        seq,
        tables,
        out_rows,
        hidden: batch.hidden,
        copy,
    });
    let hidden = match cfg.arch {
        Architecture::Llama => llama::build(&mut b)?,
        Architecture::Qwen2 => qwen2::build(&mut b)?,
        Architecture::Qwen3 | Architecture::Qwen3Moe => qwen3::build(&mut b)?,
        Architecture::Gemma2 => gemma2::build(&mut b)?,
        Architecture::Gemma3 => gemma3::build(&mut b)?,
        Architecture::Phi3 => phi3::build(&mut b)?,
        Architecture::GptOss => gpt_oss::build(&mut b)?,
        Architecture::Olmo2 => olmo2::build(&mut b)?,
        Architecture::Granite => granite::build(&mut b)?,
        Architecture::Bert | Architecture::NomicBert => bert::build(&mut b)?,
    };
    let fg = b.finish(hidden)?;
    Ok(PagedGraph {
        graph: fg.graph,
        tokens: fg.tokens,
        pos: fg.pos,
        slots,
        seq,
        tables,
        out_rows,
        copy,
        logits: fg.logits,
    })
}

/// The attention heads one graph part computes: all of them, or one GPU's share of a tensor
/// split (whose weights and KV cache carry the GPU's [`part_suffix`]).
struct Part {
    n_head: usize,
    n_head_kv: usize,
    sfx: String,
}

impl Part {
    /// Every head, through the whole tensors.
    fn whole(cfg: &ModelConfig) -> Self {
        Self {
            n_head: cfg.n_head,
            n_head_kv: cfg.n_head_kv,
            sfx: String::new(),
        }
    }
}

/// Graph-building context shared by the plans: the graph, its inputs and weight lookup.
pub struct Builder<'a> {
    /// The graph under construction.
    pub g: Graph,
    /// Model hyper-parameters.
    pub cfg: &'a ModelConfig,
    weights: &'a WeightTable,
    kv: &'a KvCacheSpec,
    /// The batch being built for.
    pub batch: BatchSpec,
    /// Token ids input.
    pub tokens: TensorId,
    /// Positions input (also the KV rows written).
    pub pos: TensorId,
    declared: HashMap<String, TensorId>,
    paged: Option<PagedInputs>,
    /// A paged pass's output rows were picked in the last layer.
    rows_selected: bool,
}

impl std::fmt::Debug for Builder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Builder")
            .field("batch", &self.batch)
            .field("nodes", &self.g.len())
            .finish()
    }
}

impl<'a> Builder<'a> {
    fn new(
        cfg: &'a ModelConfig,
        weights: &'a WeightTable,
        kv: &'a KvCacheSpec,
        batch: BatchSpec,
    ) -> Result<Self, ModelError> {
        kv.dtype.check(cfg)?;
        let mut g = Graph::new();
        let tokens = g.input("tokens", DType::I32, &[batch.n_tok])?;
        let pos = g.input("pos", DType::I32, &[batch.n_tok])?;
        Ok(Self {
            g,
            cfg,
            weights,
            kv,
            batch,
            tokens,
            pos,
            declared: HashMap::new(),
            paged: None,
            rows_selected: false,
        })
    }

    /// The weight leaf `name`, declared once per graph with the file's type and shape.
    pub fn weight(&mut self, name: &str) -> Result<TensorId, ModelError> {
        if let Some(&id) = self.declared.get(name) {
            return Ok(id);
        }
        let (dtype, dims) = self
            .weights
            .get(name)
            .ok_or_else(|| ModelError::MissingTensor(name.to_owned()))?;
        let id = self.g.weight(name, dtype, dims)?;
        self.declared.insert(name.to_owned(), id);
        Ok(id)
    }

    /// Like [`Builder::weight`] for tensors an architecture may or may not have.
    pub fn weight_opt(&mut self, name: &str) -> Result<Option<TensorId>, ModelError> {
        if self.weights.contains(name) {
            self.weight(name).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Weight `name` checked to have exactly `dims`.
    pub fn weight_shaped(&mut self, name: &str, dims: &[usize]) -> Result<TensorId, ModelError> {
        if let Some((_, d)) = self.weights.get(name) {
            if d != dims {
                return Err(ModelError::BadTensor {
                    name: name.to_owned(),
                    reason: format!("expected dims {dims:?}, found {d:?}"),
                });
            }
        }
        self.weight(name)
    }

    /// Token embeddings, `[n_embd, n_tok]`, times the architecture's embedding scale.
    pub fn embed(&mut self) -> Result<TensorId, ModelError> {
        let n_embd = self.cfg.n_embd;
        let table = self.weight_shaped("token_embd.weight", &[n_embd, self.cfg.n_vocab])?;
        let x = self.g.get_rows(table, self.tokens)?;
        let x = if self.cfg.embd_scale != 1.0 {
            self.g.scale(x, self.cfg.embd_scale)?
        } else {
            x
        };
        self.g.set_name(x, "inp_scaled")?;
        Ok(x)
    }

    /// Names `id` after llama.cpp's graph callback names (`attn_norm-3`, ...), so intermediate
    /// tensors can be matched with llama.cpp's when comparing the two engines layer by layer.
    pub fn tag(&mut self, id: TensorId, name: &str, il: usize) -> Result<TensorId, ModelError> {
        self.g.set_name(id, &format!("{name}-{il}"))?;
        Ok(id)
    }

    /// `rms_norm(x) * w` with the layer's weight `name`.
    pub fn rms_norm(&mut self, x: TensorId, name: &str) -> Result<TensorId, ModelError> {
        let w = self.weight(name)?;
        let n = self.g.rms_norm(x, self.cfg.rms_eps)?;
        Ok(self.g.mul(n, w)?)
    }

    /// Layer norm `norm(x) * w + b` with the weight `{prefix}.weight` and bias `{prefix}.bias`.
    pub fn layer_norm(&mut self, x: TensorId, prefix: &str) -> Result<TensorId, ModelError> {
        let w = self.weight(&format!("{prefix}.weight"))?;
        let b = self.weight(&format!("{prefix}.bias"))?;
        let n = self.g.norm(x, self.cfg.rms_eps)?;
        let n = self.g.mul(n, w)?;
        Ok(self.g.add(n, b)?)
    }

    /// `w x (+ b)` for the weight `{prefix}.weight` and, when present, the bias `{prefix}.bias`.
    pub fn linear(&mut self, x: TensorId, prefix: &str) -> Result<TensorId, ModelError> {
        let w = self.weight(&format!("{prefix}.weight"))?;
        let y = self.g.mul_mat(w, x)?;
        match self.weight_opt(&format!("{prefix}.bias"))? {
            Some(b) => Ok(self.g.add(y, b)?),
            None => Ok(y),
        }
    }

    fn rope_params(&self, la: &LayerAttention) -> RopeParams {
        let mode = match self.cfg.rope_mode {
            RopeMode::Normal => ggml_graph::RopeMode::Normal,
            RopeMode::Neox => ggml_graph::RopeMode::Neox,
        };
        let y = self.cfg.yarn;
        RopeParams {
            ext_factor: y.ext_factor,
            attn_factor: y.attn_factor,
            beta_fast: y.beta_fast,
            beta_slow: y.beta_slow,
            n_ctx_orig: y.n_ctx_orig,
            ..RopeParams::new(mode, self.cfg.n_rot, la.rope_base, la.rope_freq_scale)
        }
    }

    /// Self-attention of layer `il` on the normalized input `x` `[n_embd, n_tok]`: projections,
    /// optional per-head q/k norms, rotary embedding, KV cache write, attention over the cached
    /// positions and the output projection. Returns `[n_embd, n_tok]`.
    ///
    /// With a tensor split each GPU computes the heads of its share (its slices of the
    /// projections, its part of the KV cache) and the partial outputs are summed.
    pub fn self_attention(
        &mut self,
        il: usize,
        x: TensorId,
        qk_norm: bool,
    ) -> Result<TensorId, ModelError> {
        let Some(ts) = self.weights.split().cloned() else {
            let o = self.attention_part(il, x, qk_norm, &Part::whole(self.cfg))?;
            return self.tag(o, "attn_out", il);
        };
        let mut partials = Vec::with_capacity(ts.n_gpus());
        let local = self.weights.local;
        for k in ts.order(&ts.kv_heads) {
            if local.is_some_and(|r| r != k) {
                continue;
            }
            let part = Part {
                n_head: ts.q_heads(k).len(),
                n_head_kv: ts.kv_heads[k].len(),
                sfx: part_suffix(k),
            };
            partials.push(self.attention_part(il, x, qk_norm, &part)?);
        }
        let o = self.sum_partials(partials)?;
        self.tag(o, "attn_out", il)
    }

    /// The sum of per-GPU partial results built in [`TensorSplit::order`], as one all-reduce
    /// node: the scheduler runs a node that reads no weight where its newest operand was
    /// computed, so the sum lands on the last partial's GPU (the main one). With a collective
    /// the scheduler sums the partials in place on every GPU; without, it copies them there.
    fn sum_partials(&mut self, partials: Vec<TensorId>) -> Result<TensorId, ModelError> {
        match partials.as_slice() {
            [] => Err(ModelError::InvalidArgument(
                "a tensor split gives no GPU any share".into(),
            )),
            // A process's one part still sums with the other processes' parts.
            [one] if self.weights.local.is_none() => Ok(*one),
            all => Ok(self.g.all_reduce(all)?),
        }
    }

    /// Attention over `part`'s heads, through its output projection.
    fn attention_part(
        &mut self,
        il: usize,
        x: TensorId,
        qk_norm: bool,
        part: &Part,
    ) -> Result<TensorId, ModelError> {
        let c = self.cfg;
        let sfx = part.sfx.as_str();
        let (hd, hdv, nh, nkv, nt) = (
            c.head_dim,
            c.head_dim_v,
            part.n_head,
            part.n_head_kv,
            self.batch.n_tok,
        );
        let la = c.layers[il];
        let (mut q, mut k, v) = self.qkv_projections(il, x, part)?;
        if c.arch == Architecture::Olmo2 {
            // OLMo 2 normalizes the whole query and key vectors, not each head.
            q = self.rms_norm(q, &format!("blk.{il}.attn_q_norm.weight"))?;
            k = self.rms_norm(k, &format!("blk.{il}.attn_k_norm.weight"))?;
            self.tag(q, "Qcur_normed", il)?;
            self.tag(k, "Kcur_normed", il)?;
        }
        let mut q = self.g.reshape(q, &[hd, nh, nt])?;
        let mut k = self.g.reshape(k, &[hd, nkv, nt])?;
        if qk_norm {
            q = self.rms_norm(q, &format!("blk.{il}.attn_q_norm{sfx}.weight"))?;
            k = self.rms_norm(k, &format!("blk.{il}.attn_k_norm{sfx}.weight"))?;
            self.tag(q, "Qcur_normed", il)?;
            self.tag(k, "Kcur_normed", il)?;
        }
        let rp = self.rope_params(&la);
        let freq_factors = self.rope_factors()?;
        let q = self.g.rope(q, self.pos, rp, freq_factors)?;
        let k = self.g.rope(k, self.pos, rp, freq_factors)?;
        self.tag(q, "Qcur", il)?;
        self.tag(k, "Kcur", il)?;
        self.tag(v, "Vcur", il)?;

        // Gemma and Phi-3 scale the queries before attention (llama.cpp too, before rounding
        // them to the cache type), the others scale the scores.
        let (q, scale) = if matches!(
            c.arch,
            Architecture::Gemma2 | Architecture::Gemma3 | Architecture::Phi3
        ) {
            (self.g.scale(q, c.attn_scale)?, 1.0)
        } else {
            (q, c.attn_scale)
        };
        let params = AttnParams {
            scale,
            causal: true,
            window: la.window,
            softcap: c.attn_softcap,
            sinks: false,
        };
        let kv_dtype = self.kv.dtype.dtype();
        let o = if let Some(pg) = self.paged {
            // Keys and values go to the pool rows picked for them; each token attends over its
            // own sequence's blocks.
            let n_slots = pg.spec.n_blocks * pg.spec.block_size;
            let cache_k = self.g.persistent(
                &format!("{}{sfx}", KvCacheSpec::k_name(il)),
                kv_dtype,
                &[hd * nkv, n_slots],
            )?;
            let cache_v = self.g.persistent(
                &format!("{}{sfx}", KvCacheSpec::v_name(il)),
                kv_dtype,
                &[hdv * nkv, n_slots],
            )?;
            // Shared blocks a sequence writes into are copied to its own blocks first.
            let (cache_k, cache_v) = match pg.copy {
                Some((src, dst)) => {
                    let kr = self.g.get_rows(cache_k, src)?;
                    let vr = self.g.get_rows(cache_v, src)?;
                    (
                        self.g.set_rows(cache_k, kr, dst)?,
                        self.g.set_rows(cache_v, vr, dst)?,
                    )
                }
                None => (cache_k, cache_v),
            };
            let k_rows = self.g.reshape(k, &[hd * nkv, nt])?;
            let v_rows = self.g.reshape(v, &[hdv * nkv, nt])?;
            let kc = self.g.set_rows(cache_k, k_rows, pg.slots)?;
            let vc = self.g.set_rows(cache_v, v_rows, pg.slots)?;
            let (kr, vr) = (self.kv.dtype.row_bytes(hd), self.kv.dtype.row_bytes(hdv));
            let k_all = self.g.view(kc, &[hd, nkv, n_slots], &[kr, kr * nkv], 0)?;
            let v_all = self.g.view(vc, &[hdv, nkv, n_slots], &[vr, vr * nkv], 0)?;
            self.g.paged_attention(
                q,
                k_all,
                v_all,
                self.pos,
                pg.seq,
                pg.tables,
                params,
                pg.spec.block_size,
            )?
        } else {
            self.contiguous_attention(il, (q, k, v), part, params)?
        };
        // gpt-oss: one sink logit per query head joins every softmax.
        let o = match self.weight_opt(&format!("blk.{il}.attn_sinks.weight"))? {
            Some(s) => self.g.add_attention_sinks(o, s)?,
            None => o,
        };
        let o = self.g.reshape(o, &[hdv * nh, nt])?;
        self.tag(o, "kqv_out", il)?;
        self.linear(o, &format!("blk.{il}.attn_output{sfx}"))
    }

    /// The query, key and value projections of layer `il` (`[n_head * head_dim, n_tok]`,
    /// `[n_head_kv * head_dim, n_tok]`, `[n_head_kv * head_dim_v, n_tok]`), from separate
    /// `attn_{q,k,v}` weights or from one fused `attn_qkv` (Phi-3), whose output rows hold q,
    /// k and v one after the other.
    fn qkv_projections(
        &mut self,
        il: usize,
        x: TensorId,
        part: &Part,
    ) -> Result<(TensorId, TensorId, TensorId), ModelError> {
        let c = self.cfg;
        let fused = format!("blk.{il}.attn_qkv");
        let sfx = part.sfx.as_str();
        if !self.weights.contains(&format!("{fused}.weight")) {
            let q = self.linear(x, &format!("blk.{il}.attn_q{sfx}"))?;
            let k = self.linear(x, &format!("blk.{il}.attn_k{sfx}"))?;
            let v = self.linear(x, &format!("blk.{il}.attn_v{sfx}"))?;
            return Ok((q, k, v));
        }
        let qkv = self.linear(x, &fused)?;
        self.tag(qkv, "wqkv", il)?;
        let nt = self.g.tensor(qkv)?.ne[1];
        let (nq, nk, nv) = (
            c.n_head * c.head_dim,
            c.n_head_kv * c.head_dim,
            c.n_head_kv * c.head_dim_v,
        );
        let f = DType::F32.type_size();
        let row = (nq + nk + nv) * f;
        let mut part = |off: usize, n: usize| -> Result<TensorId, ModelError> {
            let v = self.g.view(qkv, &[n, nt], &[row], off * f)?;
            Ok(self.g.cont(v)?)
        };
        Ok((part(0, nq)?, part(nq, nk)?, part(nq + nk, nv)?))
    }

    /// The rope frequency factors, as llama.cpp's `get_rope_factors` picks them: `rope_freqs`
    /// (Llama 3.1) when the file has it, else LongRoPE's (Phi-3) `rope_factors_long` when a
    /// sequence may be longer than the original training context, else `rope_factors_short`.
    fn rope_factors(&mut self) -> Result<Option<TensorId>, ModelError> {
        if let Some(f) = self.weight_opt("rope_freqs.weight")? {
            return Ok(Some(f));
        }
        // The longest sequence this pass belongs to: a paged sequence's block table, else the
        // whole cache.
        let n_ctx_seq = match self.paged {
            Some(pg) => pg.spec.max_blocks * pg.spec.block_size,
            None => self.kv.n_ctx,
        };
        if n_ctx_seq > self.cfg.yarn.n_ctx_orig {
            if let Some(f) = self.weight_opt("rope_factors_long.weight")? {
                return Ok(Some(f));
            }
        }
        self.weight_opt("rope_factors_short.weight")
    }

    /// Writes the batch's keys and values at their positions in the contiguous cache, then
    /// attends over every filled position: rows 0..n_past + n_tok of the cache.
    fn contiguous_attention(
        &mut self,
        il: usize,
        (q, k, v): (TensorId, TensorId, TensorId),
        part: &Part,
        params: AttnParams,
    ) -> Result<TensorId, ModelError> {
        let c = self.cfg;
        let (hd, hdv, nkv, nt) = (c.head_dim, c.head_dim_v, part.n_head_kv, self.batch.n_tok);
        let kv_dtype = self.kv.dtype.dtype();
        let n_ctx = self.kv.n_ctx;
        let n_kv = self.batch.n_past + nt;
        let sfx = part.sfx.as_str();
        let cache_k = self.g.persistent(
            &format!("{}{sfx}", KvCacheSpec::k_name(il)),
            kv_dtype,
            &[hd * nkv, n_ctx],
        )?;
        let cache_v = self.g.persistent(
            &format!("{}{sfx}", KvCacheSpec::v_name(il)),
            kv_dtype,
            &[hdv * nkv, n_ctx],
        )?;
        let k_rows = self.g.reshape(k, &[hd * nkv, nt])?;
        let v_rows = self.g.reshape(v, &[hdv * nkv, nt])?;
        let kc = self.g.set_rows(cache_k, k_rows, self.pos)?;
        let vc = self.g.set_rows(cache_v, v_rows, self.pos)?;
        let (kr, vr) = (self.kv.dtype.row_bytes(hd), self.kv.dtype.row_bytes(hdv));
        let k_all = self.g.view(kc, &[hd, nkv, n_kv], &[kr, kr * nkv], 0)?;
        let v_all = self.g.view(vc, &[hdv, nkv, n_kv], &[vr, vr * nkv], 0)?;
        Ok(self.g.attention(q, k_all, v_all, self.pos, None, params)?)
    }

    /// Gated feed-forward of layer `il`: `down(act(gate x) * up x)`.
    ///
    /// With a tensor split each GPU computes its columns and the partial outputs are summed.
    pub fn gated_ffn(
        &mut self,
        il: usize,
        x: TensorId,
        act: ggml_graph::Act,
    ) -> Result<TensorId, ModelError> {
        let Some(ts) = self.weights.split().cloned() else {
            let f = self.ffn_part(il, x, act, "")?;
            return self.tag(f, "ffn_out", il);
        };
        let mut partials = Vec::with_capacity(ts.n_gpus());
        let local = self.weights.local;
        for k in ts.order(&ts.ff) {
            if local.is_some_and(|r| r != k) {
                continue;
            }
            partials.push(self.ffn_part(il, x, act, &part_suffix(k))?);
        }
        let f = self.sum_partials(partials)?;
        self.tag(f, "ffn_out", il)
    }

    /// The gated feed-forward through the weights named with `sfx` (a GPU's slices, or the
    /// whole tensors for `""`).
    fn ffn_part(
        &mut self,
        il: usize,
        x: TensorId,
        act: ggml_graph::Act,
        sfx: &str,
    ) -> Result<TensorId, ModelError> {
        let (gate, up) = if self
            .weights
            .contains(&format!("blk.{il}.ffn_gate{sfx}.weight"))
        {
            let gate = self.linear(x, &format!("blk.{il}.ffn_gate{sfx}"))?;
            (gate, self.linear(x, &format!("blk.{il}.ffn_up{sfx}"))?)
        } else {
            // Fused (Phi-3): `ffn_up` gives `[2 n_ff, n_tok]`, the gate in the first half of
            // each row and the up projection in the second (llama.cpp's one-operand swiglu).
            let both = self.linear(x, &format!("blk.{il}.ffn_up{sfx}"))?;
            let nt = self.g.tensor(both)?.ne[1];
            let n_ff = self.cfg.n_ff;
            let f = DType::F32.type_size();
            let row = 2 * n_ff * f;
            (
                self.g.view(both, &[n_ff, nt], &[row], 0)?,
                self.g.view(both, &[n_ff, nt], &[row], n_ff * f)?,
            )
        };
        self.tag(gate, "ffn_gate", il)?;
        self.tag(up, "ffn_up", il)?;
        let h = self.g.gated(act, gate, up)?;
        self.tag(h, "ffn_act", il)?;
        self.linear(h, &format!("blk.{il}.ffn_down{sfx}"))
    }

    /// The feed-forward of layer `il` on the normalized input `x` `[n_embd, n_tok]`: the
    /// mixture of experts when the model has one, else the dense gated one.
    pub fn ffn(
        &mut self,
        il: usize,
        x: TensorId,
        act: ggml_graph::Act,
    ) -> Result<TensorId, ModelError> {
        match self.cfg.moe {
            Some(moe) => self.moe_ffn(il, x, act, moe),
            None => self.gated_ffn(il, x, act),
        }
    }

    /// Mixture-of-experts feed-forward of layer `il` as llama.cpp's `build_moe_ffn`: router
    /// logits `ffn_gate_inp x` (plus its bias, when the file has one), the `n_used` chosen
    /// experts and their weights by the model's [`crate::config::Gating`], each expert's gated
    /// FFN (`ffn_{gate,up,down}_exps` stacks, each with its per-expert bias when present), the
    /// outputs scaled by the weights and summed in slot order.
    pub fn moe_ffn(
        &mut self,
        il: usize,
        x: TensorId,
        act: ggml_graph::Act,
        moe: crate::config::Moe,
    ) -> Result<TensorId, ModelError> {
        let n_embd = self.cfg.n_embd;
        let nt = self.g.tensor(x)?.ne[1];
        let logits = self.linear(x, &format!("blk.{il}.ffn_gate_inp"))?;
        self.tag(logits, "ffn_moe_logits", il)?;
        let (ids, weights) = match moe.gating {
            crate::config::Gating::Softmax => {
                let probs = self.g.soft_max_ext(logits, None, 1.0)?;
                self.tag(probs, "ffn_moe_probs", il)?;
                let ids = self.g.arg_top_k(probs, moe.n_used)?;
                (ids, self.g.expert_weights(probs, ids, moe.norm_weights)?)
            }
            crate::config::Gating::SoftmaxWeight => {
                let ids = self.g.arg_top_k(logits, moe.n_used)?;
                // A softmax already sums to 1: normalizing again would change nothing.
                let picked = self.g.expert_weights(logits, ids, false)?;
                (ids, self.g.soft_max_ext(picked, None, 1.0)?)
            }
        };
        self.tag(ids, "ffn_moe_topk", il)?;
        self.tag(weights, "ffn_moe_weights", il)?;
        let xr = self.g.reshape(x, &[n_embd, 1, nt])?;
        let up = self.expert_linear(il, "ffn_up_exps", xr, ids)?;
        self.tag(up, "ffn_moe_up", il)?;
        let gate = self.expert_linear(il, "ffn_gate_exps", xr, ids)?;
        self.tag(gate, "ffn_moe_gate", il)?;
        let h = match moe.swiglu_oai {
            Some((alpha, limit)) => self.g.swiglu_oai(gate, up, alpha, limit)?,
            None => self.g.gated(act, gate, up)?,
        };
        let experts = self.expert_linear(il, "ffn_down_exps", h, ids)?;
        self.tag(experts, "ffn_moe_down", il)?;
        let wr = self.g.reshape(weights, &[1, moe.n_used, nt])?;
        let experts = self.g.mul(experts, wr)?;
        self.tag(experts, "ffn_moe_weighted", il)?;
        // Slot i of every token: `[n_embd, nt]` with a stride of the token's `n_used` outputs.
        let f = DType::F32.type_size();
        let slot = |g: &mut Graph, i: usize| {
            g.view(
                experts,
                &[n_embd, nt],
                &[n_embd * moe.n_used * f],
                i * n_embd * f,
            )
        };
        let mut out = slot(&mut self.g, 0)?;
        for i in 1..moe.n_used {
            let s = slot(&mut self.g, i)?;
            out = self.g.add(out, s)?;
        }
        if moe.n_used == 1 {
            out = self.g.cont(out)?;
        }
        self.tag(out, "ffn_moe_out", il)
    }

    /// The chosen experts' products `mul_mat_id(blk.{il}.{name}.weight, x, ids)`, plus each
    /// expert's bias row (`{name}.bias`, `[n_out, n_expert]`) when the file has one, as
    /// llama.cpp's `add_id`.
    fn expert_linear(
        &mut self,
        il: usize,
        name: &str,
        x: TensorId,
        ids: TensorId,
    ) -> Result<TensorId, ModelError> {
        let w = self.weight(&format!("blk.{il}.{name}.weight"))?;
        let y = self.g.mul_mat_id(w, x, ids)?;
        let Some(b) = self.weight_opt(&format!("blk.{il}.{name}.bias"))? else {
            return Ok(y);
        };
        let ne = self.g.tensor(y)?.ne;
        let flat = self.g.reshape(ids, &[ne[1] * ne[2]])?;
        let rows = self.g.get_rows(b, flat)?;
        let rows = self.g.reshape(rows, &[ne[0], ne[1], ne[2]])?;
        Ok(self.g.add(y, rows)?)
    }

    /// In the last layer, when only the last position's logits are wanted, keeps only that
    /// position's column of `x` `[n_embd, n_tok]`: the rest of the layer then runs on one row.
    pub fn keep_needed_rows(&mut self, il: usize, x: TensorId) -> Result<TensorId, ModelError> {
        let nt = self.batch.n_tok;
        if il + 1 != self.cfg.n_layer {
            return Ok(x);
        }
        if let Some(pg) = self.paged {
            self.rows_selected = true;
            return Ok(self.g.get_rows(x, pg.out_rows)?);
        }
        if self.batch.logits != LogitsMode::Last || nt == 1 {
            return Ok(x);
        }
        let row = self.cfg.n_embd * DType::F32.type_size();
        Ok(self
            .g
            .view(x, &[self.cfg.n_embd, 1], &[row], (nt - 1) * row)?)
    }

    /// Final norm and output projection (`output.weight`, or the tied embedding table), only on
    /// the positions the batch asks logits for.
    fn finish(mut self, hidden: TensorId) -> Result<ForwardGraph, ModelError> {
        let n_embd = self.cfg.n_embd;
        let nt = self.batch.n_tok;
        let already_one = self.g.tensor(hidden)?.ne[1] == 1;
        let x = match self.batch.logits {
            LogitsMode::All => match self.paged {
                // Architectures that do not select rows in their last layer: select them here.
                Some(pg) if !self.rows_selected => self.g.get_rows(hidden, pg.out_rows)?,
                _ => hidden,
            },
            LogitsMode::Last if nt == 1 || already_one => hidden,
            LogitsMode::Last => {
                let row = n_embd * DType::F32.type_size();
                self.g.view(hidden, &[n_embd, 1], &[row], (nt - 1) * row)?
            }
        };
        let hidden_out = self.paged.is_some_and(|p| p.hidden);
        if self.cfg.arch.is_embedding() {
            // The encoders' last hidden states are their output: no norm, no head.
            self.g.set_name(x, "result_embd")?;
            self.g.mark_output(x)?;
            return Ok(ForwardGraph {
                graph: self.g,
                tokens: self.tokens,
                pos: self.pos,
                logits: x,
            });
        }
        let x = self.rms_norm(x, "output_norm.weight")?;
        self.g.set_name(x, "result_norm")?;
        if hidden_out {
            self.g.mark_output(x)?;
            return Ok(ForwardGraph {
                graph: self.g,
                tokens: self.tokens,
                pos: self.pos,
                logits: x,
            });
        }
        let out = if self.weights.contains("output.weight") {
            self.weight_shaped("output.weight", &[n_embd, self.cfg.n_vocab])?
        } else {
            self.weight("token_embd.weight")?
        };
        let mut logits = self.g.mul_mat(out, x)?;
        if let Some(s) = self.cfg.logit_scale {
            logits = self.g.scale(logits, 1.0 / s)?;
        }
        if let Some(cap) = self.cfg.final_softcap {
            logits = self.g.softcap(logits, cap)?;
        }
        self.g.mark_output(logits)?;
        Ok(ForwardGraph {
            graph: self.g,
            tokens: self.tokens,
            pos: self.pos,
            logits,
        })
    }
}
