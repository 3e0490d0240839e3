//! The persistent decode stack: whole llama-family decode layers ([`Op::DecodeLayer`] nodes, made
//! by `opt::fuse_decode_layers` where [`takes`] accepts them; layers with Qwen2's q/k/v biases,
//! NeoX rope or Qwen3's q/k head norms on the `_qkv` kernels) as one cooperative `decode_stack`
//! launch per up to [`kernels::STACK_MAX_LAYERS`] consecutive layers.
//!
//! Long contexts take `decode_stack_split` instead (attention by KV head and share of its keys),
//! chosen by the layers' KV length (see [`chosen`]): a property of the graph, so a decode step
//! captured and replayed under its graph's key (the session keys them by KV bucket) keeps the
//! kernel its KV length asks for.
//!
//! The kernel keeps every intermediate of a layer on chip or in its own scratch: it writes only
//! the last residual and the K and V cache rows, which is why the scheduler chains only layers
//! whose residuals nothing else reads. Its blocks meet at grid barriers, so the launch is
//! cooperative (every block resident), one block per multiprocessor.

use gpu_mem::{DeviceBuffer, KernelArg, MemRange};
use kernels::{StackLayer, StackParams, STACK_HEAD_DIM, STACK_MAX_LAYERS, STACK_THREADS};

use super::{addr, gpu_err, rewritten, same_mem, HipDevice};
use crate::backend::{GroupNode, TensorMem};
use crate::error::{GraphError, Result};
use crate::tensor::{layer_src as ls, Act, AttnParams, DType, Op, RopeMode, RopeParams, Tensor};

/// `decode_stack` launches queued by every device of this process (see [`stack_launches`]).
#[cfg(any(test, feature = "testing"))]
static LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `decode_stack` launches queued so far by every device of this process (for tests: a
/// whole-model run shows whether its layers took the persistent kernel). Only with the `testing`
/// feature: a process-wide count is no API for a library.
#[cfg(any(test, feature = "testing"))]
pub fn stack_launches() -> usize {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Those of the [`stack_launches`] that ran `decode_stack_portable` (see
/// [`stack_portable_launches`]).
#[cfg(any(test, feature = "testing"))]
static PORTABLE_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Decode stack launches of the portable kernel queued so far by every device of this process
/// (tests: whether a forced `HipOptions::stack_kernel` took). Only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub fn stack_portable_launches() -> usize {
    PORTABLE_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Those of the [`stack_launches`] that ran `decode_stack_split` (see [`stack_split_launches`]).
#[cfg(any(test, feature = "testing"))]
static SPLIT_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Decode stack launches of the split-attention kernel queued so far by every device of this
/// process (tests: whether a long context, or a forced `HipOptions::stack_kernel`, took it).
/// Only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub fn stack_split_launches() -> usize {
    SPLIT_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// `head_q6_k` launches queued by every device of this process (see [`head_launches`]).
#[cfg(any(test, feature = "testing"))]
static HEAD_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `head_q6_k` launches queued so far by every device of this process (tests: whether an output
/// head took the ring kernel). Only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub fn head_launches() -> usize {
    HEAD_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts a queued `head_q6_k` launch.
pub(crate) fn head_launched() {
    #[cfg(any(test, feature = "testing"))]
    HEAD_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// What the device keeps for the stack: whether it runs it, the barrier counter (zero between
/// launches, which leave it so), the dynamic shared memory `decode_stack` and `head_q6_k` were
/// allowed so far and which sizes one resident block per multiprocessor can have (see
/// `HipDevice::stack_fits`), its multiprocessor count and L2 size.
pub(crate) struct State {
    pub(crate) on: bool,
    /// `DecodeStack` or `DecodeStackPortable` (see `HipOptions::stack_kernel`).
    pub(crate) kernel: kernels::KernelId,
    /// With `DecodeStack`: the KV length from which layers take `DecodeStackSplit` (see
    /// [`chosen`]); `None`, never.
    pub(crate) split_from: Option<usize>,
    pub(crate) bar: Option<DeviceBuffer<u32>>,
    pub(crate) smem_allowed: Vec<(kernels::KernelId, u32)>,
    pub(crate) fits: Vec<(kernels::KernelId, u32, bool)>,
    pub(crate) sms: u32,
    pub(crate) l2_bytes: usize,
}

/// The shapes every layer of one launch shares.
#[derive(Clone, Copy, PartialEq)]
struct Dims {
    n_embd: usize,
    n_ff: usize,
    n_head: usize,
    n_head_kv: usize,
    eps: f32,
    rope: RopeParams,
    attn: AttnParams,
    n_kv: usize,
    kv_stride: usize,
    /// q/k/v biases (operands `ls::BQ ..= ls::BV`).
    qkv_bias: bool,
    /// Per-head q and k norms (operands `ls::Q_NORM`, `ls::K_NORM`), epsilon `eps`.
    qk_norm: bool,
}

/// `w` is a 2-D `[cols, rows]` matrix of one of `dtypes` with dense rows, 16 bytes apart (the
/// kernel copies rows with 16-byte asynchronous copies; [`aligned`] checks the memory).
fn matrix_ok(w: &Tensor, dtypes: &[DType], cols: usize, rows: usize) -> bool {
    let row_bytes = cols / w.dtype.block_size() * w.dtype.type_size();
    dtypes.contains(&w.dtype)
        && w.ne == [cols, rows, 1, 1]
        && w.nb[1] == row_bytes
        && row_bytes.is_multiple_of(16)
}

/// Every matrix of layer `l` starts 16-byte aligned in its buffer.
fn aligned(l: &GroupNode<'_>) -> bool {
    [
        ls::WQ,
        ls::WK,
        ls::WV,
        ls::WO,
        ls::W_GATE,
        ls::W_UP,
        ls::W_DOWN,
    ]
    .iter()
    .all(|&i| l.srcs[i].offset.is_multiple_of(16))
}

/// `v` is an f32 vector of `n` dense values.
fn vector_ok(t: &Tensor, n: usize) -> bool {
    t.dtype == DType::F32 && t.nelements() == n && t.is_contiguous()
}

/// Input widths of the kernel's products are multiples of this.
const STACK_CHUNK_COLS: usize = 2048;

/// The shapes of the decode layer `t` (operands `s`, see [`ls`]), or `None` when the kernel does
/// not take it.
fn layer_dims(t: &Tensor, s: &[&Tensor]) -> Option<Dims> {
    let Op::DecodeLayer(p) = t.op else {
        return None;
    };
    if s.len() < p.freq_factors_src() {
        return None;
    }
    let (rope, attn) = (p.rope, p.attn);
    let n_embd = s[ls::X].ne[0];
    let n_head = s[ls::WQ].ne[1] / STACK_HEAD_DIM;
    let n_head_kv = s[ls::WK].ne[1] / STACK_HEAD_DIM;
    let n_ff = s[ls::W_GATE].ne[1];
    let (kview, vview) = (s[ls::K], s[ls::V]);
    let f16 = DType::F16.type_size();
    let kv_stride = n_head_kv * STACK_HEAD_DIM;
    let biases_ok = !p.qkv_bias
        || [
            (ls::BQ, n_head * STACK_HEAD_DIM),
            (ls::BK, kv_stride),
            (ls::BV, kv_stride),
        ]
        .iter()
        .all(|&(i, n)| vector_ok(s[i], n));
    // Per-head q/k norms: their weights, the attention norm's epsilon, and room for the heads'
    // counters in the barrier buffer.
    let norms_ok = p.qk_norm.is_none_or(|eps| {
        eps == p.attn_eps
            && !p.qkv_bias
            && n_head + n_head_kv <= kernels::STACK_NORM_HEADS
            && [ls::Q_NORM, ls::K_NORM]
                .iter()
                .all(|&i| vector_ok(s[i], STACK_HEAD_DIM))
    });
    // Normal rope over any even number of dims; NeoX's pairs meet in a group only with all of
    // the head's dims rotated (`DS_NEOX` in `hip/stack/activations.h`).
    let rope_ok = match rope.mode {
        RopeMode::Normal => rope.n_dims.is_multiple_of(2) && rope.n_dims <= STACK_HEAD_DIM,
        RopeMode::Neox => rope.n_dims == STACK_HEAD_DIM,
    };
    // Whole 8-block Q4_K chunks (and 16-byte aligned Q6_K rows) in every product.
    let ok = n_embd.is_multiple_of(STACK_CHUNK_COLS)
        && n_ff.is_multiple_of(STACK_CHUNK_COLS)
        && (n_head * STACK_HEAD_DIM).is_multiple_of(STACK_CHUNK_COLS)
        && n_head > 0
        && n_head_kv > 0
        && n_head.is_multiple_of(n_head_kv)
        && p.attn_eps == p.ffn_eps
        && vector_ok(s[ls::X], n_embd)
        && vector_ok(s[ls::ATTN_NORM], n_embd)
        && vector_ok(s[ls::FFN_NORM], n_embd)
        && t.dtype == DType::F32
        && t.is_contiguous()
        && matrix_ok(s[ls::WQ], &[DType::Q4_K], n_embd, n_head * STACK_HEAD_DIM)
        && matrix_ok(s[ls::WK], &[DType::Q4_K], n_embd, kv_stride)
        && matrix_ok(s[ls::WV], &[DType::Q4_K, DType::Q6_K], n_embd, kv_stride)
        && matrix_ok(s[ls::WO], &[DType::Q4_K], n_head * STACK_HEAD_DIM, n_embd)
        && matrix_ok(s[ls::W_GATE], &[DType::Q4_K], n_embd, n_ff)
        && matrix_ok(s[ls::W_UP], &[DType::Q4_K], n_embd, n_ff)
        && matrix_ok(s[ls::W_DOWN], &[DType::Q4_K, DType::Q6_K], n_ff, n_embd)
        && p.act == Act::Silu
        && rope_ok
        && biases_ok
        && norms_ok
        && s[ls::POS].dtype == DType::I32
        && (p.head_dim, p.n_head) == (STACK_HEAD_DIM, n_head)
        && attn.causal
        && attn.window.is_none()
        && attn.softcap.is_none()
        && [kview, vview].iter().all(|v| {
            v.dtype == DType::F16
                && v.ne[0] == STACK_HEAD_DIM
                && v.ne[1] == n_head_kv
                && v.nb[1] == STACK_HEAD_DIM * f16
                && v.nb[2] == kv_stride * f16
        })
        && kview.ne[2] == vview.ne[2];
    ok.then_some(Dims {
        n_embd,
        n_ff,
        n_head,
        n_head_kv,
        eps: p.attn_eps,
        rope,
        attn,
        n_kv: kview.ne[2],
        kv_stride,
        qkv_bias: p.qkv_bias,
        qk_norm: p.qk_norm.is_some(),
    })
}

/// True where layers of `dims` take the `_qkv` kernels: q/k/v biases, NeoX rope or q/k norms.
fn qkv_ext(dims: &Dims) -> bool {
    dims.qkv_bias || dims.qk_norm || dims.rope.mode == RopeMode::Neox
}

/// The kernel that runs layers of `dims` where the device runs `kernel` (`DecodeStack` or
/// `DecodeStackPortable`): its `_qkv` variant where the layers need it ([`qkv_ext`]).
fn variant(kernel: kernels::KernelId, dims: &Dims) -> kernels::KernelId {
    use kernels::KernelId as K;
    match (kernel, qkv_ext(dims)) {
        (K::DecodeStack, true) => K::DecodeStackQkv,
        (K::DecodeStackPortable, true) => K::DecodeStackPortableQkv,
        (k, _) => k,
    }
}

/// True for the portable stack kernels (`decode_stack_portable` and its `_qkv` variant).
fn portable(kernel: kernels::KernelId) -> bool {
    matches!(
        kernel,
        kernels::KernelId::DecodeStackPortable | kernels::KernelId::DecodeStackPortableQkv
    )
}

/// Dynamic shared memory of a launch of `kernel` over layers of `dims`.
fn shared_bytes(kernel: kernels::KernelId, dims: &Dims) -> u32 {
    let max_cols = dims.n_embd.max(dims.n_ff).max(dims.n_head * STACK_HEAD_DIM);
    let bytes = if portable(kernel) {
        kernels::stack_portable_shared_bytes(max_cols)
    } else if kernel == kernels::KernelId::DecodeStackSplit {
        kernels::stack_split_shared_bytes(max_cols)
    } else {
        kernels::stack_shared_bytes(max_cols)
    };
    u32::try_from(bytes).unwrap_or(u32::MAX)
}

/// The kernel that runs layers of `dims` on `d`: `decode_stack_split` where the device's kernel
/// is `decode_stack`, the layers' KV length (the cache views' positions, the step's keys rounded
/// up to the session's KV bucket) reaches `State::split_from`
/// ([`kernels::STACK_SPLIT_MIN_KV`] unless forced), the split attention takes the heads and its
/// block fits; else the device's kernel (its `_qkv` variant where the layers need it). Only
/// `dims` decides, so every run of one graph (a captured one's replays too) takes the same kernel.
fn chosen(d: &HipDevice, dims: &Dims) -> kernels::KernelId {
    let (kernel, split_from) = {
        let st = d.inner.stack.lock();
        (st.kernel, st.split_from)
    };
    // The `_qkv` kernels have no split form: their layers keep the per-query-head attention.
    let kernel = variant(kernel, dims);
    let split = kernels::KernelId::DecodeStackSplit;
    let take = kernel == kernels::KernelId::DecodeStack
        && split_from.is_some_and(|n| dims.n_kv >= n)
        && dims.n_head_kv <= kernels::STACK_MAX_KV_HEADS
        && dims.n_head / dims.n_head_kv <= kernels::STACK_MAX_GQA
        && d.stack_fits(split, shared_bytes(split, dims));
    if take {
        split
    } else {
        kernel
    }
}

/// Work items of the busiest block of a launch over `n_layer` layers of `dims` on `sms` blocks.
fn items(sms: u32, n_layer: usize, dims: &Dims) -> usize {
    kernels::stack_items(
        sms as usize,
        n_layer,
        dims.n_embd,
        dims.n_ff,
        dims.n_head,
        dims.n_head_kv,
    )
}

/// True when the device runs the decode layer `t` (operands `srcs`) as a `decode_stack`: the
/// stack is on, the kernel takes the layer's shapes, and one layer's launch fits the device
/// (one resident block per multiprocessor with its shared memory, the busiest block's work
/// within the kernel's bound).
pub(crate) fn takes(d: &HipDevice, t: &Tensor, srcs: &[&Tensor]) -> bool {
    let (on, sms) = {
        let st = d.inner.stack.lock();
        (st.on, st.sms)
    };
    on && layer_dims(t, srcs).is_some_and(|dims| {
        let kernel = chosen(d, &dims);
        items(sms, 1, &dims) <= kernels::STACK_MAX_ITEMS
            && d.stack_fits(kernel, shared_bytes(kernel, &dims))
    })
}

/// Device addresses of layer `l` (of `dims`)'s weights and caches, and of its q/k/v biases or
/// q/k norm weights (`StackParams::qkv_vec`), and the memory they cover (for the capture's record
/// of what the launch uses).
fn layer_ptrs<'a>(
    l: &GroupNode<'a>,
    dims: &Dims,
    uses: &mut Vec<MemRange<'a>>,
) -> Result<(StackLayer, [u64; 3])> {
    let mut at = |i: usize| -> Result<u64> {
        let m = addr(&l.srcs[i])?;
        uses.push(m);
        Ok(m.addr())
    };
    let qkv_vec = if dims.qkv_bias {
        [at(ls::BQ)?, at(ls::BK)?, at(ls::BV)?]
    } else if dims.qk_norm {
        [at(ls::Q_NORM)?, at(ls::K_NORM)?, 0]
    } else {
        [0; 3]
    };
    let layer = StackLayer {
        wq: at(ls::WQ)?,
        wk: at(ls::WK)?,
        wv: at(ls::WV)?,
        wo: at(ls::WO)?,
        wg: at(ls::W_GATE)?,
        wu: at(ls::W_UP)?,
        wd: at(ls::W_DOWN)?,
        attn_norm: at(ls::ATTN_NORM)?,
        ffn_norm: at(ls::FFN_NORM)?,
        kc: at(ls::K)?,
        vc: at(ls::V)?,
    };
    Ok((layer, qkv_vec))
}

/// The kernel's scratch areas, `(offset, bytes)` in one buffer, each 256-byte aligned: the roped
/// queries (and keys, with q/k norms), the three Q8_1 vectors (normed residual, attention output,
/// FFN activation), the sums of squares and `decode_stack_split`'s partial outputs (`splits`
/// shares per KV head; none for the other kernels).
struct Scratch {
    areas: [(usize, usize); 6],
    bytes: usize,
}

impl Scratch {
    fn new(d: &Dims, splits: usize) -> Self {
        let n_q = d.n_head * STACK_HEAD_DIM;
        // With q/k norms the keys wait there too until their head's norm.
        let n_qk = n_q + usize::from(d.qk_norm) * d.n_head_kv * STACK_HEAD_DIM;
        let lens = [
            n_qk * 4,
            kernels::q8_1_vector_bytes(d.n_embd),
            kernels::q8_1_vector_bytes(n_q),
            kernels::q8_16_vector_bytes(d.n_ff),
            2 * STACK_MAX_LAYERS * 4,
            kernels::stack_attn_part_bytes(splits, d.n_head),
        ];
        let mut areas = [(0, 0); 6];
        let mut bytes = 0;
        for (area, len) in areas.iter_mut().zip(lens) {
            *area = (bytes, len);
            bytes += len.div_ceil(256) * 256;
        }
        Self { areas, bytes }
    }
}

/// Queues the longest leading run of `group` (consecutive decode layers, each reading the
/// residual the one before it leaves) that one launch takes: up to [`STACK_MAX_LAYERS`] layers of
/// the first one's shapes, rope positions and factors, within the kernel's work bound. Returns
/// the layers queued; an error where the first layer is not one [`takes`] accepted.
pub(crate) fn launch(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let refused = |why: &str| GraphError::Unsupported {
        backend: "hip",
        op: "decode_layer",
        detail: format!("the decode stack cannot run this layer: {why}"),
    };
    let (on, sms) = {
        let st = d.inner.stack.lock();
        (st.on, st.sms)
    };
    if !on {
        return Err(refused("the stack is off"));
    }
    fn tensors<'a>(g: &GroupNode<'a>) -> Vec<&'a Tensor> {
        g.srcs.iter().map(|m| m.tensor).collect()
    }
    let first = group.first().ok_or_else(|| refused("no layer"))?;
    let dims = layer_dims(first.tensor, &tensors(first)).ok_or_else(|| refused("its shapes"))?;
    // Every layer of one launch shares the first one's shapes, norms, rope and positions.
    let rope0 = &first.srcs;
    let ff_at = match first.tensor.op {
        Op::DecodeLayer(p) => p.freq_factors_src(),
        _ => return Err(refused("not a decode layer")),
    };
    let same = |l: &GroupNode<'_>| {
        layer_dims(l.tensor, &tensors(l)) == Some(dims)
            && l.srcs.len() == rope0.len()
            && same_mem(&l.srcs[ls::POS], &rope0[ls::POS])
            && (l.srcs.get(ff_at).zip(rope0.get(ff_at))).is_none_or(|(a, b)| same_mem(a, b))
    };
    let n_layer = group
        .iter()
        .take(STACK_MAX_LAYERS)
        .take_while(|l| same(l))
        .count();
    let n_layer = (1..=n_layer)
        .rev()
        .find(|&n| items(sms, n, &dims) <= kernels::STACK_MAX_ITEMS)
        .ok_or_else(|| refused("too much work per block"))?;
    let layers = &group[..n_layer];
    if !layers.iter().all(aligned) {
        return Err(refused("a matrix is not 16-byte aligned"));
    }
    let kernel = chosen(d, &dims);
    let smem = shared_bytes(kernel, &dims);
    if !d.stack_fits(kernel, smem) {
        return Err(refused("its shared memory"));
    }
    let split = kernel == kernels::KernelId::DecodeStackSplit;
    let splits = if split {
        kernels::stack_attn_splits(sms as usize, dims.n_head, dims.n_head_kv)
    } else {
        0
    };
    let scratch = Scratch::new(&dims, splits);
    let buf = d.scratch(scratch.bytes)?;
    let sbuf = MemRange::of_buffer(&*buf);
    let [q, xq, aq, hq, ss, part] = scratch
        .areas
        .map(|(off, len)| sbuf.sub(off, len).map_err(|e| gpu_err("decode_stack", e)));
    let (q, xq, aq, hq, ss, part) = (q?, xq?, aq?, hq?, ss?, part?);
    let mut uses = Vec::with_capacity(n_layer * 14 + 9);
    let mut p = StackParams::default();
    let mut v_q6 = 0u32;
    let mut d_q6 = 0u32;
    for (i, l) in layers.iter().enumerate() {
        (p.layer[i], p.qkv_vec[i]) = layer_ptrs(l, &dims, &mut uses)?;
        if l.srcs[ls::WV].tensor.dtype == DType::Q6_K {
            v_q6 |= 1 << i;
        }
        if l.srcs[ls::W_DOWN].tensor.dtype == DType::Q6_K {
            d_q6 |= 1 << i;
        }
    }
    let x_in = addr(&first.srcs[ls::X])?;
    let pos = addr(&first.srcs[ls::POS])?;
    let ff = first.srcs.get(ff_at).map(addr).transpose()?;
    // Every layer's residual counts as rewritten for the quantization cache (the kernel writes
    // the last one; the others' bytes are stale now).
    let mut x_out = None;
    for g in layers {
        x_out = Some(rewritten(d, g)?);
    }
    let x_out = x_out.ok_or_else(|| gpu_err("decode_stack", "empty run"))?;
    for l in layers {
        for c in [ls::K, ls::V] {
            let m = addr(&l.srcs[c])?;
            d.inner.q8.lock().written(m.addr(), m.len());
        }
    }
    let (bar, l2_bytes) = {
        let st = d.inner.stack.lock();
        let bar = st
            .bar
            .as_ref()
            .ok_or_else(|| gpu_err("decode_stack", "no barrier counter"))?;
        (MemRange::of_buffer(bar).addr(), st.l2_bytes)
    };
    uses.extend([x_in, x_out, pos, q, xq, aq, hq, ss]);
    uses.extend(ff);
    if split {
        uses.push(part);
    }
    let corr = dims.rope.yarn_corr_dims();
    let i32_of = |v: usize| i32::try_from(v).map_err(|_| gpu_err("decode_stack", "size overflow"));
    p.freq_factors = ff.map_or(0, |f| f.addr());
    p.pos = pos.addr();
    p.x_in = x_in.addr();
    p.x_out = x_out.addr();
    p.q = q.addr();
    p.xq = xq.addr();
    p.aq = aq.addr();
    p.hq = hq.addr();
    p.ss = ss.addr();
    p.bar = bar;
    p.kv_stride = dims.kv_stride as i64;
    p.v_q6 = v_q6;
    p.d_q6 = d_q6;
    if dims.qkv_bias {
        p.qkv |= kernels::STACK_QKV_BIAS;
    }
    if dims.rope.mode == RopeMode::Neox {
        p.qkv |= kernels::STACK_QKV_NEOX;
    }
    if dims.qk_norm {
        p.qkv |= kernels::STACK_QKV_NORM;
    }
    p.n_layer = i32_of(n_layer)?;
    p.n_embd = i32_of(dims.n_embd)?;
    p.n_ff = i32_of(dims.n_ff)?;
    p.n_head = i32_of(dims.n_head)?;
    p.n_head_kv = i32_of(dims.n_head_kv)?;
    p.n_kv = i32_of(dims.n_kv)?;
    p.n_dims = i32_of(dims.rope.n_dims)?;
    p.eps = dims.eps;
    p.attn_scale = dims.attn.scale;
    p.base = dims.rope.freq_base;
    p.freq_scale = dims.rope.freq_scale;
    p.ext_factor = dims.rope.ext_factor;
    p.mscale = dims.rope.mscale();
    p.corr_lo = corr[0];
    p.corr_hi = corr[1];
    p.prefetch_items =
        kernels::stack_prefetch_items(l2_bytes, sms as usize, dims.n_head, dims.n_embd);
    if split {
        p.attn_splits = i32_of(splits)?;
        p.attn_prefetch_rows = kernels::stack_attn_prefetch_rows(l2_bytes, splits, dims.n_head_kv);
        p.attn_part = part.addr();
    }
    // SAFETY: every layer's tensors match `dims` (`layer_dims`), the scratch areas are sized
    // for them (`Scratch::new`), and `uses` holds all memory the parameter block points to.
    unsafe {
        d.launch_cooperative(
            kernel,
            sms,
            STACK_THREADS,
            smem,
            &[KernelArg::Bytes(bytemuck::bytes_of(&p))],
            &uses,
        )?
    };
    #[cfg(any(test, feature = "testing"))]
    {
        LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if portable(kernel) {
            PORTABLE_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        if split {
            SPLIT_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
    // The scratch stays alive through the launch: a later, larger request waits for the
    // stream before it frees this one.
    drop(buf);
    Ok(n_layer)
}

/// Queues one decode layer `t` (a node [`takes`] accepted, launched on its own) as a
/// `decode_stack` launch.
pub(crate) fn launch_one(
    d: &HipDevice,
    t: &Tensor,
    dst: TensorMem<'_>,
    srcs: &[TensorMem<'_>],
) -> Result<()> {
    let g = GroupNode {
        tensor: t,
        dst,
        srcs: srcs.to_vec(),
    };
    launch(d, std::slice::from_ref(&g)).map(|_| ())
}

/// Grid and dynamic shared memory of a `head_q6_k` launch for a Q6_K mat-vec of one vector over
/// `nrows` rows of `ncols` values (`row_bytes` apart, from `w`), or `None` where it goes to the
/// per-op kernel: the stack off, a matrix the kernel does not take, or no room for its block.
pub(crate) fn head_launch(
    d: &HipDevice,
    w: &MemRange<'_>,
    nrows: usize,
    ncols: usize,
    row_bytes: usize,
) -> Option<(u32, u32)> {
    let (on, sms) = {
        let st = d.inner.stack.lock();
        // The head kernel shares the NVIDIA stack's ring: none beside the portable stack.
        (st.on && st.kernel == kernels::KernelId::DecodeStack, st.sms)
    };
    let dense = ncols / DType::Q6_K.block_size() * DType::Q6_K.type_size();
    if !on
        || row_bytes != dense
        || !w.addr().is_multiple_of(16)
        || !kernels::head_takes(nrows, ncols, sms as usize)
    {
        return None;
    }
    let smem = u32::try_from(kernels::head_shared_bytes(ncols)).ok()?;
    d.stack_fits(kernels::KernelId::HeadQ6_K, smem)
        .then_some((sms, smem))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opt::layer::tests::decode_graph_of;

    /// What [`layer_dims`] reads of each fused layer of a two-layer `arch` decode graph of
    /// `[n_embd, n_head, n_ff]` (heads of 128, 4 key-value heads), with `edit` applied to each
    /// fused node's parameters first.
    fn dims_of(
        arch: &str,
        [e, nh, ff]: [usize; 3],
        edit: impl Fn(&mut crate::tensor::DecodeLayerParams),
    ) -> Vec<Option<Dims>> {
        let (mut g, _) = decode_graph_of(2, arch, [e, STACK_HEAD_DIM, nh, 4, ff]);
        assert_eq!(crate::opt::fuse_decode_layers(&mut g, &|_, _| true), 2);
        let nodes = g.tensors();
        nodes
            .iter()
            .filter(|t| matches!(t.op, Op::DecodeLayer(_)))
            .map(|t| {
                let mut t = t.clone();
                if let Op::DecodeLayer(p) = &mut t.op {
                    edit(p);
                }
                let srcs: Vec<&Tensor> = t.src.iter().map(|s| &nodes[s.index()]).collect();
                layer_dims(&t, &srcs)
            })
            .collect()
    }

    #[test]
    fn the_stack_takes_llama_qwen2_and_qwen3_layers_of_its_widths() {
        let shape = [2048, 16, 6144];
        for arch in ["llama", "qwen2", "qwen3"] {
            let dims = dims_of(arch, shape, |_| ());
            assert_eq!(dims.len(), 2);
            for d in dims {
                let d = d.unwrap_or_else(|| panic!("{arch}: a layer the stack should take"));
                assert_eq!(
                    (d.n_embd, d.n_head, d.n_head_kv, d.n_ff),
                    (2048, 16, 4, 6144)
                );
                assert_eq!(d.qkv_bias, arch == "qwen2", "{arch}");
                assert_eq!(d.qk_norm, arch == "qwen3", "{arch}");
                let neox = d.rope.mode == RopeMode::Neox;
                assert_eq!(neox, arch != "llama", "{arch}");
            }
        }
        // NeoX pairs meet in a group only with all 128 dims rotated.
        let partial = dims_of("qwen2", shape, |p| p.rope.n_dims = 64);
        assert!(partial.iter().all(Option::is_none));
        // Q/K norms with another epsilon than the attention norm's are not the kernel's.
        let eps = dims_of("qwen3", shape, |p| p.qk_norm = Some(1e-3));
        assert!(eps.iter().all(Option::is_none));
        // Qwen2-7B's widths (3584, FFN 18944) are no whole 2048-value chunks: per op.
        let q7 = dims_of("qwen2", [3584, 28, 18944], |_| ());
        assert!(q7.iter().all(Option::is_none));
    }
}
