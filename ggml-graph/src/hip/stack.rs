//! The persistent decode stack: whole llama-family decode layers (the runs
//! `sched::group::stack_run` finds) as one cooperative `decode_stack` launch per up to
//! [`kernels::STACK_MAX_LAYERS`] layers.
//!
//! The kernel keeps every intermediate of a layer on chip or in its own scratch: it writes only
//! the last residual and the K and V cache rows, which is why the scheduler offers only runs
//! whose other results nobody reads. Its blocks meet at grid barriers, so the launch is
//! cooperative (every block resident), one block per multiprocessor.

use gpu_mem::{DeviceBuffer, KernelArg, MemRange};
use kernels::{StackLayer, StackParams, STACK_HEAD_DIM, STACK_MAX_LAYERS, STACK_THREADS};

use super::group::{rewritten, same_mem};
use super::{addr, gpu_err, HipDevice};
use crate::backend::GroupNode;
use crate::error::Result;
use crate::sched::STACK_LAYER_NODES;
use crate::tensor::{Act, AttnParams, DType, Op, RopeMode, RopeParams, Tensor};

/// `decode_stack` launches queued by every device of this process (see [`stack_launches`]).
static LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `decode_stack` launches queued so far by every device of this process (for tests and logs:
/// a whole-model run shows whether its layers took the persistent kernel).
pub fn stack_launches() -> usize {
    LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// `head_q6_k` launches queued by every device of this process (see [`head_launches`]).
static HEAD_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `head_q6_k` launches queued so far by every device of this process (tests and logs: whether
/// an output head took the ring kernel).
pub fn head_launches() -> usize {
    HEAD_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Counts a queued `head_q6_k` launch.
pub(crate) fn head_launched() {
    HEAD_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// What the device keeps for the stack: whether it runs it, the barrier counter (zero between
/// launches, which leave it so), the dynamic shared memory `decode_stack` and `head_q6_k` were
/// allowed so far and which sizes one resident block per multiprocessor can have (see
/// `HipDevice::stack_fits`), its multiprocessor count and L2 size.
pub(crate) struct State {
    pub(crate) on: bool,
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
}

/// `w` is a 2-D `[cols, rows]` matrix of `dtype` with dense rows, 16-byte aligned in memory
/// and from row to row (the kernel copies rows with 16-byte asynchronous copies).
fn matrix_ok(w: &GroupNode<'_>, i: usize, dtypes: &[DType], cols: usize, rows: usize) -> bool {
    let m = &w.srcs[i];
    let t = m.tensor;
    let row_bytes = cols / t.dtype.block_size() * t.dtype.type_size();
    dtypes.contains(&t.dtype)
        && t.ne == [cols, rows, 1, 1]
        && t.nb[1] == row_bytes
        && row_bytes.is_multiple_of(16)
        && m.offset.is_multiple_of(16)
}

/// `v` is an f32 vector of `n` dense values.
fn vector_ok(t: &Tensor, n: usize) -> bool {
    t.dtype == DType::F32 && t.nelements() == n && t.is_contiguous()
}

/// Input widths of the kernel's products are multiples of this.
const STACK_CHUNK_COLS: usize = 2048;

/// The shared shapes of the layer `l` (13 nodes), or `None` when the kernel does not take it.
fn layer_dims(l: &[GroupNode<'_>]) -> Option<Dims> {
    let Op::RmsNormMul { eps } = l[0].tensor.op else {
        return None;
    };
    let Op::Rope(rope) = l[4].tensor.op else {
        return None;
    };
    let Op::Attention(attn) = l[8].tensor.op else {
        return None;
    };
    let n_embd = l[0].tensor.ne[0];
    let n_head = l[1].srcs[0].tensor.ne[1] / STACK_HEAD_DIM;
    let n_head_kv = l[2].srcs[0].tensor.ne[1] / STACK_HEAD_DIM;
    let n_ff = l[11].srcs[0].tensor.ne[1];
    let kview = l[8].srcs[1].tensor;
    let vview = l[8].srcs[2].tensor;
    let f16 = DType::F16.type_size();
    let kv_stride = n_head_kv * STACK_HEAD_DIM;
    let q = l[8].srcs[0].tensor;
    // Whole 8-block Q4_K chunks (and 16-byte aligned Q6_K rows) in every product.
    let ok = n_embd.is_multiple_of(STACK_CHUNK_COLS)
        && n_ff.is_multiple_of(STACK_CHUNK_COLS)
        && (n_head * STACK_HEAD_DIM).is_multiple_of(STACK_CHUNK_COLS)
        && n_head > 0
        && n_head_kv > 0
        && n_head.is_multiple_of(n_head_kv)
        && vector_ok(l[0].srcs[0].tensor, n_embd)
        && vector_ok(l[0].srcs[1].tensor, n_embd)
        && vector_ok(l[10].srcs[1].tensor, n_embd)
        && l[12].tensor.dtype == DType::F32
        && l[12].tensor.is_contiguous()
        && matrix_ok(&l[1], 0, &[DType::Q4_K], n_embd, n_head * STACK_HEAD_DIM)
        && matrix_ok(&l[2], 0, &[DType::Q4_K], n_embd, kv_stride)
        && matrix_ok(&l[3], 0, &[DType::Q4_K, DType::Q6_K], n_embd, kv_stride)
        && matrix_ok(&l[9], 0, &[DType::Q4_K], n_head * STACK_HEAD_DIM, n_embd)
        && matrix_ok(&l[11], 0, &[DType::Q4_K], n_embd, n_ff)
        && matrix_ok(&l[11], 1, &[DType::Q4_K], n_embd, n_ff)
        && matrix_ok(&l[12], 0, &[DType::Q4_K, DType::Q6_K], n_ff, n_embd)
        && l[11].tensor.op == Op::MulMatGated(Act::Silu)
        && rope.mode == RopeMode::Normal
        && rope.n_dims.is_multiple_of(2)
        && rope.n_dims <= STACK_HEAD_DIM
        && l[4].srcs[1].tensor.dtype == DType::I32
        && q.ne == [STACK_HEAD_DIM, n_head, 1, 1]
        && [l[6].tensor, l[7].tensor]
            .iter()
            .all(|c| c.dtype == DType::F16 && c.ne[0] == kv_stride && c.nb[1] == kv_stride * f16)
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
        eps,
        rope,
        attn,
        n_kv: kview.ne[2],
        kv_stride,
    })
}

/// Device addresses of layer `l`'s weights and caches, and the memory they cover (for the
/// capture's record of what the launch uses).
fn layer_ptrs<'a>(l: &[GroupNode<'a>], uses: &mut Vec<MemRange<'a>>) -> Result<StackLayer> {
    let mut at = |m: &gpu_mem::MemRange<'a>| {
        uses.push(*m);
        m.addr()
    };
    Ok(StackLayer {
        wq: at(&addr(&l[1].srcs[0])?),
        wk: at(&addr(&l[2].srcs[0])?),
        wv: at(&addr(&l[3].srcs[0])?),
        wo: at(&addr(&l[9].srcs[0])?),
        wg: at(&addr(&l[11].srcs[0])?),
        wu: at(&addr(&l[11].srcs[1])?),
        wd: at(&addr(&l[12].srcs[0])?),
        attn_norm: at(&addr(&l[0].srcs[1])?),
        ffn_norm: at(&addr(&l[10].srcs[1])?),
        kc: at(&addr(&l[6].dst)?),
        vc: at(&addr(&l[7].dst)?),
    })
}

/// The kernel's scratch areas, `(offset, bytes)` in one buffer, each 256-byte aligned: the roped
/// queries, the three Q8_1 vectors (normed residual, attention output, FFN activation) and the
/// sums of squares.
struct Scratch {
    areas: [(usize, usize); 5],
    bytes: usize,
}

impl Scratch {
    fn new(d: &Dims) -> Self {
        let n_q = d.n_head * STACK_HEAD_DIM;
        let lens = [
            n_q * 4,
            kernels::q8_1_vector_bytes(d.n_embd),
            kernels::q8_1_vector_bytes(n_q),
            kernels::q8_16_vector_bytes(d.n_ff),
            2 * STACK_MAX_LAYERS * 4,
        ];
        let mut areas = [(0, 0); 5];
        let mut bytes = 0;
        for (area, len) in areas.iter_mut().zip(lens) {
            *area = (bytes, len);
            bytes += len.div_ceil(256) * 256;
        }
        Self { areas, bytes }
    }
}

/// Queues the longest leading run of whole decode layers of `group` the kernel takes (up to
/// [`STACK_MAX_LAYERS`]) as one launch and returns its node count; 0 when not even one layer
/// fits it (the nodes then go their usual way).
pub(crate) fn launch(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    if !d.inner.stack.lock().on {
        return Ok(0);
    }
    let layers: Vec<&[GroupNode<'_>]> = group
        .chunks_exact(STACK_LAYER_NODES)
        .take(STACK_MAX_LAYERS)
        .collect();
    let Some(dims) = layers.first().and_then(|l| layer_dims(l)) else {
        return Ok(0);
    };
    // Every layer of one launch shares the first one's shapes, norms, rope and positions.
    let rope0 = &layers[0][4].srcs;
    let same = |l: &&[GroupNode<'_>]| {
        layer_dims(l) == Some(dims)
            && l[4].srcs.len() == rope0.len()
            && l[4].srcs[1..]
                .iter()
                .zip(&rope0[1..])
                .all(|(a, b)| same_mem(a, b))
    };
    let n_layer = layers.iter().take_while(|l| same(l)).count();
    let layers = &layers[..n_layer];
    let max_cols = dims.n_embd.max(dims.n_ff).max(dims.n_head * STACK_HEAD_DIM);
    let smem = u32::try_from(kernels::stack_shared_bytes(max_cols)).unwrap_or(u32::MAX);
    if !d.stack_fits(kernels::KernelId::DecodeStack, smem) {
        return Ok(0);
    }
    let sms = d.inner.stack.lock().sms;
    let items = kernels::stack_items(
        sms as usize,
        n_layer,
        dims.n_embd,
        dims.n_ff,
        dims.n_head,
        dims.n_head_kv,
    );
    if items > kernels::STACK_MAX_ITEMS {
        return Ok(0);
    }
    let scratch = Scratch::new(&dims);
    let buf = d.scratch(scratch.bytes)?;
    let sbuf = MemRange::of_buffer(&*buf);
    let [q, xq, aq, hq, ss] = scratch
        .areas
        .map(|(off, len)| sbuf.sub(off, len).map_err(|e| gpu_err("decode_stack", e)));
    let (q, xq, aq, hq, ss) = (q?, xq?, aq?, hq?, ss?);
    let mut uses = Vec::with_capacity(n_layer * 11 + 8);
    let mut p = StackParams::default();
    let mut v_q6 = 0u32;
    let mut d_q6 = 0u32;
    for (i, l) in layers.iter().enumerate() {
        p.layer[i] = layer_ptrs(l, &mut uses)?;
        if l[3].srcs[0].tensor.dtype == DType::Q6_K {
            v_q6 |= 1 << i;
        }
        if l[12].srcs[0].tensor.dtype == DType::Q6_K {
            d_q6 |= 1 << i;
        }
    }
    let first = layers[0];
    let x_in = addr(&first[0].srcs[0])?;
    let pos = addr(&first[4].srcs[1])?;
    let ff = first[4].srcs.get(2).map(addr).transpose()?;
    // Every node's destination counts as rewritten for the quantization cache (the kernel
    // writes the last residual and the caches; the rest of those bytes are stale now).
    let mut x_out = None;
    for g in &group[..n_layer * STACK_LAYER_NODES] {
        x_out = Some(rewritten(d, g)?);
    }
    let x_out = x_out.ok_or_else(|| gpu_err("decode_stack", "empty run"))?;
    let (bar, sms, l2_bytes) = {
        let st = d.inner.stack.lock();
        let bar = st
            .bar
            .as_ref()
            .ok_or_else(|| gpu_err("decode_stack", "no barrier counter"))?;
        (MemRange::of_buffer(bar).addr(), st.sms, st.l2_bytes)
    };
    uses.extend([x_in, x_out, pos, q, xq, aq, hq, ss]);
    uses.extend(ff);
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
    // SAFETY: every layer's tensors match `dims` (`layer_dims`), the scratch areas are sized
    // for them (`Scratch::new`), and `uses` holds all memory the parameter block points to.
    unsafe {
        d.launch_cooperative(
            kernels::KernelId::DecodeStack,
            sms,
            STACK_THREADS,
            smem,
            &[KernelArg::Bytes(bytemuck::bytes_of(&p))],
            &uses,
        )?
    };
    LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The scratch stays alive through the launch: a later, larger request waits for the
    // stream before it frees this one.
    drop(buf);
    Ok(n_layer * STACK_LAYER_NODES)
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
        (st.on, st.sms)
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
