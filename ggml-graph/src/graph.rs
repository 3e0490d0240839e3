//! The graph and its builder methods: each method checks operand shapes and appends one node.
//!
//! Nodes are stored in creation order, which is a valid execution order because a node's operands
//! always exist before it. Nodes that write persistent storage (`set_rows`, `cpy` into a persistent
//! view) are kept by dead-node elimination even when nothing reads them.

use crate::error::{shape_err, GraphError, Result};
use crate::tensor::{
    contiguous_strides, layer_src, shape4, Act, AttnParams, DType, Leaf, Op, RopeParams, Tensor,
    TensorId, MAX_DIMS,
};

/// A computation graph: tensors (leaves and op results) in execution order, plus outputs.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Graph {
    pub(crate) nodes: Vec<Tensor>,
    pub(crate) outputs: Vec<TensorId>,
}

impl Graph {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }

    /// All tensors, in execution order; `TensorId::index` indexes this slice.
    pub fn tensors(&self) -> &[Tensor] {
        &self.nodes
    }

    /// The tensor with this id.
    pub fn tensor(&self, id: TensorId) -> Result<&Tensor> {
        self.nodes.get(id.index()).ok_or(GraphError::BadId(id))
    }

    /// Tensors marked as outputs.
    pub fn outputs(&self) -> &[TensorId] {
        &self.outputs
    }

    /// Marks `id` as an output: its value is kept and readable after a run.
    pub fn mark_output(&mut self, id: TensorId) -> Result<()> {
        self.tensor(id)?;
        if !self.outputs.contains(&id) {
            self.outputs.push(id);
        }
        Ok(())
    }

    /// Number of nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// True when the graph has no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Root storage of a tensor (following views) and the byte offset into it.
    pub fn storage_root(&self, id: TensorId) -> (TensorId, usize) {
        let mut cur = id;
        let mut off = 0;
        while let Some((parent, o)) = self.nodes[cur.index()].view_of {
            off += o;
            cur = parent;
        }
        (cur, off)
    }

    fn t(&self, id: TensorId) -> Result<&Tensor> {
        self.tensor(id)
    }

    fn push(&mut self, t: Tensor) -> TensorId {
        let id = TensorId(self.nodes.len() as u32);
        self.nodes.push(t);
        id
    }

    fn push_op(
        &mut self,
        op: Op,
        dtype: DType,
        ne: [usize; MAX_DIMS],
        src: Vec<TensorId>,
    ) -> TensorId {
        let name = format!("{}#{}", op.name(), self.nodes.len());
        self.push(Tensor {
            name,
            dtype,
            nb: contiguous_strides(dtype, &ne),
            ne,
            op,
            src,
            view_of: None,
        })
    }

    fn leaf(&mut self, kind: Leaf, name: &str, dtype: DType, shape: &[usize]) -> Result<TensorId> {
        let ne = shape4(shape)
            .ok_or_else(|| shape_err("leaf", format!("`{name}`: bad shape {shape:?}")))?;
        // Every byte size derived from this shape later (strides, extents, the planner's
        // offsets) stays far from overflow when the whole tensor fits in isize::MAX bytes.
        let bytes = ne
            .iter()
            .skip(1)
            .try_fold(crate::tensor::row_bytes(dtype, ne[0]), |acc, &n| {
                acc.checked_mul(n)
            })
            .filter(|&b| b <= isize::MAX as usize / 2);
        if bytes.is_none() {
            return Err(shape_err(
                "leaf",
                format!("`{name}`: shape {shape:?} of {dtype} is too large to address"),
            ));
        }
        if ne[0] % dtype.block_size() != 0 {
            return Err(shape_err(
                "leaf",
                format!(
                    "`{name}`: row of {} is not a multiple of {dtype}'s block {}",
                    ne[0],
                    dtype.block_size()
                ),
            ));
        }
        Ok(self.push(Tensor {
            name: name.to_string(),
            dtype,
            nb: contiguous_strides(dtype, &ne),
            ne,
            op: Op::Leaf(kind),
            src: Vec::new(),
            view_of: None,
        }))
    }

    /// A per-run input (dense, given to [`crate::Executor::run`]).
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<TensorId> {
        self.leaf(Leaf::Input, name, dtype, shape)
    }

    /// A weight bound by name to external bytes (GGUF dims: `[row_len, n_rows, ...]`).
    pub fn weight(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<TensorId> {
        self.leaf(Leaf::Weight, name, dtype, shape)
    }

    /// An executor-owned buffer that keeps its contents across runs (zeroed when first created).
    pub fn persistent(&mut self, name: &str, dtype: DType, shape: &[usize]) -> Result<TensorId> {
        self.leaf(Leaf::Persistent, name, dtype, shape)
    }

    /// Renames a tensor (for debugging and error messages).
    pub fn set_name(&mut self, id: TensorId, name: &str) -> Result<()> {
        self.tensor(id)?;
        self.nodes[id.index()].name = name.to_string();
        Ok(())
    }

    fn need_f32(&self, op: &'static str, id: TensorId) -> Result<&Tensor> {
        let t = self.t(id)?;
        if t.dtype != DType::F32 {
            return Err(shape_err(
                op,
                format!("`{}` must be f32, is {}", t.name, t.dtype),
            ));
        }
        if !t.rows_contiguous() {
            return Err(shape_err(
                op,
                format!("`{}` rows are not contiguous", t.name),
            ));
        }
        Ok(t)
    }

    /// Embedding lookup: rows of `table` picked by I32 `ids` `[n]`, as f32 `[table.ne0, n]`.
    pub fn get_rows(&mut self, table: TensorId, ids: TensorId) -> Result<TensorId> {
        let (tt, it) = (self.t(table)?, self.t(ids)?);
        if it.dtype != DType::I32 || it.ne[1] * it.ne[2] * it.ne[3] != 1 {
            return Err(shape_err(
                "get_rows",
                format!("ids must be I32 [n], got {} {:?}", it.dtype, it.ne),
            ));
        }
        if tt.ne[2] * tt.ne[3] != 1 || !tt.rows_contiguous() {
            return Err(shape_err(
                "get_rows",
                format!("table must be a 2-d row-contiguous matrix, got {:?}", tt.ne),
            ));
        }
        let ne = [tt.ne[0], it.ne[0], 1, 1];
        Ok(self.push_op(Op::GetRows, DType::F32, ne, vec![table, ids]))
    }

    /// Matrix product `w[K, N] x x[K, M] -> [N, M]` (batched over dims 2, 3; `w` broadcast).
    pub fn mul_mat(&mut self, w: TensorId, x: TensorId) -> Result<TensorId> {
        let (wt, xt) = (self.t(w)?, self.t(x)?);
        if wt.ne[0] != xt.ne[0] || xt.ne[2] % wt.ne[2] != 0 || xt.ne[3] % wt.ne[3] != 0 {
            return Err(shape_err(
                "mul_mat",
                format!("w {:?} and x {:?} do not match", wt.ne, xt.ne),
            ));
        }
        if !wt.rows_contiguous() || !xt.rows_contiguous() {
            return Err(shape_err("mul_mat", "operand rows must be contiguous"));
        }
        if !matches!(xt.dtype, DType::F32) {
            return Err(shape_err(
                "mul_mat",
                format!("activations must be f32, got {}", xt.dtype),
            ));
        }
        let ne = [wt.ne[1], xt.ne[1], xt.ne[2], xt.ne[3]];
        Ok(self.push_op(Op::MulMat, DType::F32, ne, vec![w, x]))
    }

    fn binary(&mut self, op: Op, a: TensorId, b: TensorId) -> Result<TensorId> {
        let name = op.name();
        let at = self.need_f32(name, a)?;
        let bt = self.need_f32(name, b)?;
        if (0..MAX_DIMS).any(|d| bt.ne[d] == 0 || at.ne[d] % bt.ne[d] != 0) {
            return Err(shape_err(
                name,
                format!("{:?} cannot be broadcast over {:?}", bt.ne, at.ne),
            ));
        }
        let ne = at.ne;
        Ok(self.push_op(op, DType::F32, ne, vec![a, b]))
    }

    /// Elementwise `a + b` with `b` repeated over `a`.
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Add, a, b)
    }

    /// Elementwise `a * b` with `b` repeated over `a`.
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId> {
        self.binary(Op::Mul, a, b)
    }

    fn unary_like(&mut self, op: Op, a: TensorId) -> Result<TensorId> {
        let ne = self.need_f32(op.name(), a)?.ne;
        Ok(self.push_op(op, DType::F32, ne, vec![a]))
    }

    /// `a * s`.
    pub fn scale(&mut self, a: TensorId, s: f32) -> Result<TensorId> {
        self.unary_like(Op::Scale(s), a)
    }

    /// RMS normalization of each row.
    pub fn rms_norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.unary_like(Op::RmsNorm { eps }, a)
    }

    /// Mean/variance normalization of each row.
    pub fn norm(&mut self, a: TensorId, eps: f32) -> Result<TensorId> {
        self.unary_like(Op::Norm { eps }, a)
    }

    /// GELU (tanh approximation).
    pub fn gelu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(Act::Gelu), a)
    }

    /// SiLU.
    pub fn silu(&mut self, a: TensorId) -> Result<TensorId> {
        self.unary_like(Op::Unary(Act::Silu), a)
    }

    /// `act(gate) * up`, elementwise (same shapes).
    pub fn gated(&mut self, act: Act, gate: TensorId, up: TensorId) -> Result<TensorId> {
        let op = Op::Gated(act);
        let gt = self.need_f32(op.name(), gate)?;
        let ut = self.need_f32(op.name(), up)?;
        if gt.ne != ut.ne {
            return Err(shape_err(
                op.name(),
                format!("gate {:?} and up {:?} differ", gt.ne, ut.ne),
            ));
        }
        let ne = gt.ne;
        Ok(self.push_op(op, DType::F32, ne, vec![gate, up]))
    }

    /// `silu(gate) * up`.
    pub fn swiglu(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        self.gated(Act::Silu, gate, up)
    }

    /// `cap * tanh(a / cap)` elementwise (soft-capping; `cap` > 0).
    pub fn softcap(&mut self, a: TensorId, cap: f32) -> Result<TensorId> {
        if !(cap > 0.0 && cap.is_finite()) {
            return Err(shape_err("softcap", format!("cap {cap} must be positive")));
        }
        self.unary_like(Op::SoftCap(cap), a)
    }

    /// `gelu(gate) * up`.
    pub fn geglu(&mut self, gate: TensorId, up: TensorId) -> Result<TensorId> {
        self.gated(Act::Gelu, gate, up)
    }

    /// Rotary embedding of `x` `[head_dim, n_head, n_tok]` at I32 positions `pos` `[n_tok]`;
    /// `freq_factors` (f32 `[n_dims/2]`) divide the per-pair frequencies when given.
    pub fn rope(
        &mut self,
        x: TensorId,
        pos: TensorId,
        params: RopeParams,
        freq_factors: Option<TensorId>,
    ) -> Result<TensorId> {
        let xt = self.need_f32("rope", x)?;
        let pt = self.t(pos)?;
        if pt.dtype != DType::I32 || pt.ne[0] != xt.ne[2] || pt.nrows() != 1 {
            return Err(shape_err(
                "rope",
                format!(
                    "pos must be I32 [{}], got {} {:?}",
                    xt.ne[2], pt.dtype, pt.ne
                ),
            ));
        }
        if params.n_dims == 0 || !params.n_dims.is_multiple_of(2) || params.n_dims > xt.ne[0] {
            return Err(shape_err(
                "rope",
                format!(
                    "n_dims {} invalid for head size {}",
                    params.n_dims, xt.ne[0]
                ),
            ));
        }
        let ne = xt.ne;
        let mut src = vec![x, pos];
        if let Some(ff) = freq_factors {
            let ft = self.need_f32("rope", ff)?;
            if ft.nelements() < params.n_dims / 2 {
                return Err(shape_err("rope", "freq_factors shorter than n_dims/2"));
            }
            src.push(ff);
        }
        Ok(self.push_op(Op::Rope(params), DType::F32, ne, src))
    }

    /// Row softmax of `a * scale + mask` (mask f32 `[a.ne0, >= a.ne1]`, optional).
    pub fn soft_max_ext(
        &mut self,
        a: TensorId,
        mask: Option<TensorId>,
        scale: f32,
    ) -> Result<TensorId> {
        let at = self.need_f32("soft_max", a)?;
        let ne = at.ne;
        let mut src = vec![a];
        if let Some(m) = mask {
            let mt = self.need_f32("soft_max", m)?;
            if mt.ne[0] != ne[0] || mt.ne[1] < ne[1] {
                return Err(shape_err(
                    "soft_max",
                    format!("mask {:?} does not cover {:?}", mt.ne, ne),
                ));
            }
            src.push(m);
        }
        Ok(self.push_op(Op::SoftMax { scale }, DType::F32, ne, src))
    }

    /// Fused attention over a KV view (see [`Op::Attention`] for layouts).
    pub fn attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        pos: TensorId,
        mask: Option<TensorId>,
        params: AttnParams,
    ) -> Result<TensorId> {
        let qt = self.need_f32("attention", q)?;
        let (kt, vt, pt) = (self.t(k)?, self.t(v)?, self.t(pos)?);
        let kv_ok = kv_cache_ok;
        if !kv_ok(kt) || !kv_ok(vt) {
            return Err(shape_err(
                "attention",
                "k and v must be f32/f16/bf16 with contiguous rows or q8_0 rows of whole blocks",
            ));
        }
        if kt.ne[0] != qt.ne[0] || kt.ne[1] != vt.ne[1] || kt.ne[2] != vt.ne[2] {
            return Err(shape_err(
                "attention",
                format!("q {:?}, k {:?}, v {:?} do not match", qt.ne, kt.ne, vt.ne),
            ));
        }
        if kt.ne[1] == 0 || qt.ne[1] % kt.ne[1] != 0 || qt.ne[3] != 1 || kt.ne[3] != 1 {
            return Err(shape_err(
                "attention",
                format!("{} query heads over {} kv heads", qt.ne[1], kt.ne[1]),
            ));
        }
        if pt.dtype != DType::I32 || pt.ne[0] != qt.ne[2] || pt.nrows() != 1 {
            return Err(shape_err(
                "attention",
                format!("pos must be I32 [{}]", qt.ne[2]),
            ));
        }
        let ne = [vt.ne[0], qt.ne[1], qt.ne[2], 1];
        let mut src = vec![q, k, v, pos];
        if let Some(m) = mask {
            let mt = self.need_f32("attention", m)?;
            if mt.ne[0] < kt.ne[2] || mt.ne[1] < qt.ne[2] {
                return Err(shape_err(
                    "attention",
                    format!("mask {:?} smaller than [{}, {}]", mt.ne, kt.ne[2], qt.ne[2]),
                ));
            }
            src.push(m);
        }
        Ok(self.push_op(Op::Attention(params), DType::F32, ne, src))
    }

    /// Attention over a paged KV pool (see [`Op::PagedAttention`] for layouts).
    #[allow(clippy::too_many_arguments)]
    pub fn paged_attention(
        &mut self,
        q: TensorId,
        k: TensorId,
        v: TensorId,
        pos: TensorId,
        seq: TensorId,
        tables: TensorId,
        params: AttnParams,
        block_size: usize,
    ) -> Result<TensorId> {
        let op = "paged_attention";
        let qt = self.need_f32(op, q)?;
        let (kt, vt, pt, st, tt) = (
            self.t(k)?,
            self.t(v)?,
            self.t(pos)?,
            self.t(seq)?,
            self.t(tables)?,
        );
        let kv_ok = kv_cache_ok;
        if !kv_ok(kt) || !kv_ok(vt) {
            return Err(shape_err(
                op,
                "k and v must be f32/f16/bf16 with contiguous rows or q8_0 rows of whole blocks",
            ));
        }
        if kt.ne[0] != qt.ne[0] || kt.ne[1] != vt.ne[1] || kt.ne[2] != vt.ne[2] {
            return Err(shape_err(
                op,
                format!("q {:?}, k {:?}, v {:?} do not match", qt.ne, kt.ne, vt.ne),
            ));
        }
        if kt.ne[1] == 0 || qt.ne[1] % kt.ne[1] != 0 || qt.ne[3] != 1 || kt.ne[3] != 1 {
            return Err(shape_err(
                op,
                format!("{} query heads over {} kv heads", qt.ne[1], kt.ne[1]),
            ));
        }
        if block_size == 0 || kt.ne[2] % block_size != 0 || !params.causal {
            return Err(shape_err(
                op,
                format!(
                    "{} slots in blocks of {block_size} (causal attention only)",
                    kt.ne[2]
                ),
            ));
        }
        let n_tok = qt.ne[2];
        let dense_i32 = |t: &Tensor, ne0: usize, ne1: usize| {
            t.dtype == DType::I32 && t.is_contiguous() && t.ne == [ne0, ne1, 1, 1]
        };
        if !dense_i32(pt, n_tok, 1)
            || !dense_i32(st, 2, n_tok)
            || !dense_i32(tt, tt.ne[0], tt.ne[1])
        {
            return Err(shape_err(
                op,
                format!(
                    "pos must be dense I32 [{n_tok}], seq I32 [2, {n_tok}], tables 2-d I32; got \
                     {:?}, {:?}, {:?}",
                    pt.ne, st.ne, tt.ne
                ),
            ));
        }
        let ne = [vt.ne[0], qt.ne[1], n_tok, 1];
        let src = vec![q, k, v, pos, seq, tables];
        Ok(self.push_op(
            Op::PagedAttention { params, block_size },
            DType::F32,
            ne,
            src,
        ))
    }

    /// Adds attention sinks (f32 `[n_head]`, one logit per query head; see
    /// [`AttnParams::sinks`]) to the attention node `attn` just built by [`Graph::attention`]
    /// or [`Graph::paged_attention`]; returns the same node.
    pub fn add_attention_sinks(&mut self, attn: TensorId, sinks: TensorId) -> Result<TensorId> {
        let n_head = self.t(attn)?.ne[1];
        let st = self.t(sinks)?;
        if st.dtype != DType::F32 || !st.is_contiguous() || st.nelements() != n_head {
            return Err(shape_err(
                "attention",
                format!(
                    "sinks must be dense f32 [{n_head}], got {} {:?}",
                    st.dtype, st.ne
                ),
            ));
        }
        let node = &mut self.nodes[attn.index()];
        let params = match &mut node.op {
            Op::Attention(p) | Op::PagedAttention { params: p, .. } if !p.sinks => p,
            _ => {
                return Err(shape_err(
                    "attention",
                    format!("`{}` is no attention without sinks", node.name),
                ))
            }
        };
        params.sinks = true;
        node.src.push(sinks);
        Ok(attn)
    }

    /// gpt-oss's clamped SwiGLU of same-shaped `gate` and `up` (see [`Op::SwigluOai`]).
    pub fn swiglu_oai(
        &mut self,
        gate: TensorId,
        up: TensorId,
        alpha: f32,
        limit: f32,
    ) -> Result<TensorId> {
        let op = Op::SwigluOai { alpha, limit };
        let gt = self.need_f32(op.name(), gate)?;
        let ut = self.need_f32(op.name(), up)?;
        if gt.ne != ut.ne {
            return Err(shape_err(
                op.name(),
                format!("gate {:?} and up {:?} differ", gt.ne, ut.ne),
            ));
        }
        let ne = gt.ne;
        Ok(self.push_op(op, DType::F32, ne, vec![gate, up]))
    }

    /// Converts `src` into the view `dst` (same element count); the result aliases `dst`.
    pub fn cpy(&mut self, src: TensorId, dst: TensorId) -> Result<TensorId> {
        let (st, dt) = (self.t(src)?, self.t(dst)?);
        let float = |d: DType| matches!(d, DType::F32 | DType::F16 | DType::BF16);
        if st.nelements() != dt.nelements()
            || !float(st.dtype)
            || !(float(dt.dtype) || dt.dtype == st.dtype)
        {
            return Err(shape_err(
                "cpy",
                format!("{} {:?} -> {} {:?}", st.dtype, st.ne, dt.dtype, dt.ne),
            ));
        }
        let t = Tensor {
            name: format!("cpy#{}", self.nodes.len()),
            dtype: dt.dtype,
            ne: dt.ne,
            nb: dt.nb,
            op: Op::Cpy,
            src: vec![src, dst],
            view_of: Some((dst, 0)),
        };
        Ok(self.push(t))
    }

    /// Dense copy of a strided tensor.
    pub fn cont(&mut self, a: TensorId) -> Result<TensorId> {
        let at = self.t(a)?;
        if !matches!(at.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32) {
            return Err(shape_err("cont", format!("unsupported type {}", at.dtype)));
        }
        let (dtype, ne) = (at.dtype, at.ne);
        Ok(self.push_op(Op::Cont, dtype, ne, vec![a]))
    }

    /// A view of `a` with explicit shape, byte strides and byte offset.
    pub fn view(
        &mut self,
        a: TensorId,
        shape: &[usize],
        nb: &[usize],
        offset: usize,
    ) -> Result<TensorId> {
        let at = self.t(a)?;
        let ne = shape4(shape).ok_or_else(|| shape_err("view", format!("bad shape {shape:?}")))?;
        let mut strides = contiguous_strides(at.dtype, &ne);
        if nb.len() + 1 != shape.len() && !(shape.len() == 1 && nb.is_empty()) {
            return Err(shape_err(
                "view",
                format!("{} strides for {} dims (give nb1..)", nb.len(), shape.len()),
            ));
        }
        strides[1..=nb.len()].copy_from_slice(nb);
        for d in nb.len() + 1..MAX_DIMS {
            strides[d] = strides[d - 1] * ne[d - 1];
        }
        let t = Tensor {
            name: format!("view#{}", self.nodes.len()),
            dtype: at.dtype,
            ne,
            nb: strides,
            op: Op::View,
            src: vec![a],
            view_of: Some((a, offset)),
        };
        let parent_extent = at.extent();
        let end = checked_extent(&t).and_then(|e| e.checked_add(offset));
        if end.is_none_or(|e| e > parent_extent) || ne[0] % at.dtype.block_size() != 0 {
            return Err(shape_err(
                "view",
                format!("view {ne:?} nb {strides:?} + {offset} exceeds parent {:?} ({parent_extent} bytes)", at.ne),
            ));
        }
        Ok(self.push(t))
    }

    /// Same data, new shape (the source must be contiguous).
    pub fn reshape(&mut self, a: TensorId, shape: &[usize]) -> Result<TensorId> {
        let at = self.t(a)?;
        let ne =
            shape4(shape).ok_or_else(|| shape_err("reshape", format!("bad shape {shape:?}")))?;
        if !at.is_contiguous()
            || ne.iter().product::<usize>() != at.nelements()
            || ne[0] % at.dtype.block_size() != 0
        {
            return Err(shape_err(
                "reshape",
                format!("{:?} (contiguous: {}) -> {ne:?}", at.ne, at.is_contiguous()),
            ));
        }
        let t = Tensor {
            name: format!("reshape#{}", self.nodes.len()),
            dtype: at.dtype,
            nb: contiguous_strides(at.dtype, &ne),
            ne,
            op: Op::View,
            src: vec![a],
            view_of: Some((a, 0)),
        };
        Ok(self.push(t))
    }

    /// Permutes axes: source dim `d` becomes result dim `axes[d]` (ggml's convention).
    pub fn permute(&mut self, a: TensorId, axes: [usize; MAX_DIMS]) -> Result<TensorId> {
        let at = self.t(a)?;
        let mut seen = [false; MAX_DIMS];
        for &ax in &axes {
            if ax >= MAX_DIMS || seen[ax] {
                return Err(shape_err(
                    "permute",
                    format!("axes {axes:?} are not a permutation"),
                ));
            }
            seen[ax] = true;
        }
        if at.dtype.is_quantized() && axes[0] != 0 {
            return Err(shape_err(
                "permute",
                "cannot move the block dimension of a quantized tensor",
            ));
        }
        let (mut ne, mut nb) = ([0; MAX_DIMS], [0; MAX_DIMS]);
        for d in 0..MAX_DIMS {
            ne[axes[d]] = at.ne[d];
            nb[axes[d]] = at.nb[d];
        }
        let t = Tensor {
            name: format!("permute#{}", self.nodes.len()),
            dtype: at.dtype,
            ne,
            nb,
            op: Op::View,
            src: vec![a],
            view_of: Some((a, 0)),
        };
        Ok(self.push(t))
    }

    /// Swaps dims 0 and 1.
    pub fn transpose(&mut self, a: TensorId) -> Result<TensorId> {
        self.permute(a, [1, 0, 2, 3])
    }

    /// Concatenation of f32 tensors along `dim`.
    pub fn concat(&mut self, a: TensorId, b: TensorId, dim: usize) -> Result<TensorId> {
        let at = self.t(a)?;
        let bt = self.t(b)?;
        if dim >= MAX_DIMS || at.dtype != DType::F32 || bt.dtype != DType::F32 {
            return Err(shape_err(
                "concat",
                format!("dim {dim}, types {} {}", at.dtype, bt.dtype),
            ));
        }
        if (0..MAX_DIMS).any(|d| d != dim && at.ne[d] != bt.ne[d]) {
            return Err(shape_err(
                "concat",
                format!("{:?} and {:?} differ outside dim {dim}", at.ne, bt.ne),
            ));
        }
        let mut ne = at.ne;
        ne[dim] += bt.ne[dim];
        Ok(self.push_op(Op::Concat { dim }, DType::F32, ne, vec![a, b]))
    }

    /// The sum of `parts` (dense f32 tensors of one shape), as one [`Op::AllReduce`] node.
    pub fn all_reduce(&mut self, parts: &[TensorId]) -> Result<TensorId> {
        let Some(&first) = parts.first() else {
            return Err(shape_err("all_reduce", "no operands"));
        };
        let ne = self.t(first)?.ne;
        for &p in parts {
            let t = self.t(p)?;
            if t.dtype != DType::F32 || !t.is_contiguous() || t.ne != ne {
                return Err(shape_err(
                    "all_reduce",
                    format!(
                        "operands must be dense f32 {ne:?}, `{}` is {} {:?}",
                        t.name, t.dtype, t.ne
                    ),
                ));
            }
        }
        Ok(self.push_op(Op::AllReduce, DType::F32, ne, parts.to_vec()))
    }

    /// Writes f32 rows of `src` `[K, n]` into rows `idx` (I32 `[n]`) of `dst` `[K, R]`; the result
    /// aliases `dst`.
    pub fn set_rows(&mut self, dst: TensorId, src: TensorId, idx: TensorId) -> Result<TensorId> {
        let (dt, st, it) = (self.t(dst)?, self.t(src)?, self.t(idx)?);
        if st.dtype != DType::F32 || !st.rows_contiguous() || !dt.rows_contiguous() {
            return Err(shape_err("set_rows", "src must be f32 and rows contiguous"));
        }
        let dst_ok = matches!(dt.dtype, DType::F32 | DType::F16 | DType::BF16)
            || (dt.dtype == DType::Q8_0 && dt.ne[0] % DType::Q8_0.block_size() == 0);
        if !dst_ok || dt.ne[2] * dt.ne[3] != 1 {
            return Err(shape_err(
                "set_rows",
                format!(
                    "dst must be a 2-d f32/f16/bf16 (or q8_0, whole blocks per row) matrix, got {} {:?}",
                    dt.dtype, dt.ne
                ),
            ));
        }
        if st.ne[0] != dt.ne[0]
            || st.ne[2] * st.ne[3] != 1
            || it.dtype != DType::I32
            || it.ne[0] != st.ne[1]
            || it.nrows() != 1
        {
            return Err(shape_err(
                "set_rows",
                format!(
                    "src {:?}, idx {} {:?} into dst {:?}",
                    st.ne, it.dtype, it.ne, dt.ne
                ),
            ));
        }
        let t = Tensor {
            name: format!("set_rows#{}", self.nodes.len()),
            dtype: dt.dtype,
            ne: dt.ne,
            nb: dt.nb,
            op: Op::SetRows,
            src: vec![dst, src, idx],
            view_of: Some((dst, 0)),
        };
        Ok(self.push(t))
    }

    /// I32 index of the maximum of each row of an f32 `[K, M]` tensor, as `[M]`.
    pub fn argmax(&mut self, a: TensorId) -> Result<TensorId> {
        let at = self.need_f32("argmax", a)?;
        if at.ne[2] * at.ne[3] != 1 {
            return Err(shape_err("argmax", "input must be 2-d"));
        }
        let ne = [at.ne[1], 1, 1, 1];
        Ok(self.push_op(Op::Argmax, DType::I32, ne, vec![a]))
    }

    /// I32 indices of the `k` largest values of each row of an f32 `[n, M]` tensor, largest
    /// first, as `[k, M]` (mixture-of-experts routing; `1 <= k <= n`).
    pub fn arg_top_k(&mut self, a: TensorId, k: usize) -> Result<TensorId> {
        let at = self.need_f32("argsort_top_k", a)?;
        if at.ne[2] * at.ne[3] != 1 || k == 0 || k > at.ne[0] {
            return Err(shape_err(
                "argsort_top_k",
                format!("top {k} of rows {:?} (2-d, 1 <= k <= row length)", at.ne),
            ));
        }
        let ne = [k, at.ne[1], 1, 1];
        Ok(self.push_op(Op::ArgTopK(k), DType::I32, ne, vec![a]))
    }

    /// The values of f32 `probs` `[n, M]` at I32 `ids` `[k, M]` (each row its own indices), as
    /// f32 `[k, M]`; `norm` divides each row by its sum (mixture-of-experts weights).
    pub fn expert_weights(
        &mut self,
        probs: TensorId,
        ids: TensorId,
        norm: bool,
    ) -> Result<TensorId> {
        let op = Op::ExpertWeights { norm };
        let pt = self.need_f32(op.name(), probs)?;
        let it = self.t(ids)?;
        if it.dtype != DType::I32
            || !it.is_contiguous()
            || pt.ne[2] * pt.ne[3] != 1
            || it.ne[2] * it.ne[3] != 1
            || it.ne[1] != pt.ne[1]
        {
            return Err(shape_err(
                op.name(),
                format!(
                    "probs {:?} and ids {} {:?} (2-d, ids I32 with one row per probs row)",
                    pt.ne, it.dtype, it.ne
                ),
            ));
        }
        let ne = [it.ne[0], it.ne[1], 1, 1];
        Ok(self.push_op(op, DType::F32, ne, vec![probs, ids]))
    }

    /// llama.cpp's `mul_mat_id`: matrix `ids[i, t]` of the stack `w` `[K, N, n_mat]` times column
    /// `x[:, i % n_x, t]` of `x` `[K, n_x, n_tok]` (`n_x` 1 or `n_used`), for ids I32 `[n_used,
    /// n_tok]`, as f32 `[N, n_used, n_tok]`.
    pub fn mul_mat_id(&mut self, w: TensorId, x: TensorId, ids: TensorId) -> Result<TensorId> {
        let (wt, xt, it) = (self.t(w)?, self.t(x)?, self.t(ids)?);
        let bad = |d: String| shape_err("mul_mat_id", d);
        if it.dtype != DType::I32 || !it.is_contiguous() || it.ne[2] * it.ne[3] != 1 {
            return Err(bad(format!(
                "ids must be dense I32 [n_used, n_tok], got {} {:?}",
                it.dtype, it.ne
            )));
        }
        let (n_used, n_tok) = (it.ne[0], it.ne[1]);
        if wt.ne[0] != xt.ne[0]
            || wt.ne[3] != 1
            || xt.ne[3] != 1
            || xt.ne[2] != n_tok
            || !(xt.ne[1] == 1 || xt.ne[1] == n_used)
        {
            return Err(bad(format!(
                "w {:?}, x {:?} and ids {:?} do not match",
                wt.ne, xt.ne, it.ne
            )));
        }
        if !wt.rows_contiguous() || !xt.rows_contiguous() || xt.dtype != DType::F32 {
            return Err(bad("operand rows must be contiguous, x f32".into()));
        }
        let ne = [wt.ne[1], n_used, n_tok, 1];
        Ok(self.push_op(Op::MulMatId, DType::F32, ne, vec![w, x, ids]))
    }

    /// Leaf kind of the storage root of `id`, if that root is a leaf.
    pub fn root_leaf(&self, id: TensorId) -> Option<Leaf> {
        match self.nodes[self.storage_root(id).0.index()].op {
            Op::Leaf(l) => Some(l),
            _ => None,
        }
    }

    /// Storage roots node `id` writes besides its own result: the destination of `cpy` and
    /// `set_rows`, the K and V caches of a decode layer.
    pub fn written_roots(&self, id: TensorId) -> Vec<TensorId> {
        let t = &self.nodes[id.index()];
        match t.op {
            Op::Cpy | Op::SetRows => vec![self.storage_root(id).0],
            Op::DecodeLayer(_) => [layer_src::K, layer_src::V]
                .iter()
                .filter_map(|&k| t.src.get(k))
                .map(|&s| self.storage_root(s).0)
                .collect(),
            _ => Vec::new(),
        }
    }

    /// True when the node writes persistent storage (a side effect that must not be dropped).
    pub fn writes_persistent(&self, id: TensorId) -> bool {
        self.written_roots(id)
            .iter()
            .any(|r| self.nodes[r.index()].op == Op::Leaf(Leaf::Persistent))
    }
}

/// [`Tensor::extent`] without overflow: `None` when the view's strides reach past `usize`.
fn checked_extent(t: &Tensor) -> Option<usize> {
    if t.nelements() == 0 {
        return Some(0);
    }
    let (mut end, first) = if t.dtype.is_quantized() || t.rows_contiguous() {
        (t.row_bytes(), 1)
    } else {
        (t.dtype.type_size(), 0)
    };
    for d in first..MAX_DIMS {
        end = end.checked_add((t.ne[d] - 1).checked_mul(t.nb[d])?)?;
    }
    Some(end)
}

/// A KV cache operand the attention ops read: float rows with dense elements, or Q8_0 rows of
/// whole blocks (dequantized as they are read).
fn kv_cache_ok(t: &Tensor) -> bool {
    let float = matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16);
    let q8 = t.dtype == DType::Q8_0 && t.ne[0].is_multiple_of(DType::Q8_0.block_size());
    (float || q8) && t.rows_contiguous()
}
