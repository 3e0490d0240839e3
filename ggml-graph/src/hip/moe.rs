//! Mixture-of-experts nodes on the HIP device: top-k routing (`argsort_top_k`), the chosen
//! experts' weights (`expert_weights`), gpt-oss's clamped SwiGLU (`swiglu_oai`), llama.cpp's
//! `mul_mat_id` over a stack of expert matrices, and the weighted sum of the chosen experts'
//! outputs (`moe_sum`).
//!
//! `mul_mat_id` takes one of three ways:
//! - per pair: one launch whose grid runs over the (token, slot) pairs, each block multiplying
//!   the matrix its pair chose (read from the ids on the device) with that pair's activations;
//!   only the chosen experts' rows are read. Decode and small batches go this way, which needs
//!   no host round trip (graph capture records it). Plain and biased products over rows of a
//!   few K-quant blocks (a fine-grained mixture's down product: 768 values) take the short-row
//!   kernels, which split a warp's lanes across several rows and quantize their f32 activations
//!   themselves; the rest the kernels that lay a warp along each row, on activations quantized
//!   before the launch.
//! - grouped by expert on integer tiles: once the pairs are enough for the average expert to
//!   reach the tile kernels' column count, for the weight types they read, `moe_group` sorts
//!   the pairs by expert on the device and one `mmq_id_*` launch multiplies every expert's
//!   rows with the activation vectors of its pairs, writing each pair's row (gate and up with
//!   their activation in the same launch). No host round trip: graph capture records it.
//! - grouped by expert on the host, for the other weights (f16, f32, MXFP4): the ids are read
//!   back, the pairs sorted by expert (a counting sort on the host), the activation rows
//!   gathered into expert order, one product per chosen expert (the dense `mul_mat` paths) and
//!   the results scattered back to their (token, slot) rows.
//!
//! Three groups of nodes the scheduler offers go as one: the up and gate products with their
//! gated activation (per pair: `matvec_*_id_gated`; grouped on tiles: one gated `mmq_id_*`
//! launch; grouped on the host: one gated product per expert), in decode an expert product
//! with its experts' bias rows added (`matvec_*_id_add`, gpt-oss), and the routing's softmax,
//! top k and picked weights in either gating's order (`moe_route_f32`, which writes all three
//! nodes' results).

use gpu_mem::MemRange;
use kernels::{act, KernelId};

use super::matmul::{
    act_in_place, act_kind, launch_matvec, mmq, mmq_takes, product, product_scratch, Mat,
    MmqProduct,
};
use super::ops::{
    blocks, dense, elems, f32_rows, quant_rows_ok, weight_type, Args, Q8Cache, ALIGN,
    MATVEC_MAX_COLS, MMQ_MIN_COLS,
};
use super::{addr, gpu_err, rewritten, same_mem, HipDevice};
use crate::backend::{GroupNode, TensorMem};
use crate::error::Result;
use crate::tensor::{Act, DType, Op, Tensor};

/// Gated expert launches (`matvec_*_id_gated`) queued by every device of this process (see
/// [`expert_gate_up_launches`]).
#[cfg(any(test, feature = "testing"))]
static GATE_UP_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Gated expert launches queued so far by every device of this process (for tests: whether a
/// model's up and gate products took one launch). Only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub fn expert_gate_up_launches() -> usize {
    GATE_UP_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Biased expert launches (`matvec_*_id_add`) queued by every device of this process (see
/// [`expert_bias_launches`]).
#[cfg(any(test, feature = "testing"))]
static BIAS_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Biased expert launches queued so far by every device of this process (for tests: whether a
/// model's expert products took their biases in the same launch). Only with the `testing`
/// feature.
#[cfg(any(test, feature = "testing"))]
pub fn expert_bias_launches() -> usize {
    BIAS_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Expert-grouped tile launches (`mmq_id_*`) queued by every device of this process (see
/// [`grouped_tile_launches`]).
#[cfg(any(test, feature = "testing"))]
static TILE_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Expert-grouped tile launches queued so far by every device of this process (for tests:
/// whether a prompt's expert products took the one-launch tile path). Only with the `testing`
/// feature.
#[cfg(any(test, feature = "testing"))]
pub fn grouped_tile_launches() -> usize {
    TILE_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The largest grid.y: the per-pair launch and the gather put the pairs there.
const MAX_PAIRS: usize = 65535;

/// Whether the HIP device runs the mixture-of-experts node `t` with operands `srcs`.
pub(super) fn supports(t: &Tensor, srcs: &[&Tensor]) -> bool {
    let out_f32 = dense(t, DType::F32);
    match (&t.op, srcs) {
        (Op::ArgTopK(_), [a]) => f32_rows(a) && a.ne[2] * a.ne[3] == 1 && dense(t, DType::I32),
        (Op::ExpertWeights { .. }, [probs, ids]) => {
            f32_rows(probs)
                && probs.ne[2] * probs.ne[3] == 1
                && dense(ids, DType::I32)
                && ids.ne[1] == probs.ne[1]
                && t.ne[0] == ids.ne[0]
                && out_f32
        }
        (Op::SwigluOai { .. }, [g, u]) => f32_rows(g) && f32_rows(u) && g.ne == u.ne && out_f32,
        (Op::MoeSum, [x, w, rest @ ..]) => {
            let residual_ok = match rest {
                [] => true,
                [r] => f32_rows(r) && r.ne == t.ne,
                _ => false,
            };
            residual_ok
                && f32_rows(x)
                && x.ne[3] == 1
                && w.dtype == DType::F32
                && w.ne[..3] == [1, x.ne[1], x.ne[2]]
                && w.ne[3] == 1
                && out_f32
                && t.ne[..2] == [x.ne[0], x.ne[2]]
                && x.nelements() <= i32::MAX as usize
        }
        (Op::MulMatId, [w, x, ids]) => {
            let k = w.ne[0];
            let wt_ok = quant_rows_ok(w.dtype, k) || matches!(w.dtype, DType::F32 | DType::F16);
            wt_ok
                && w.is_contiguous()
                && w.ne[3] == 1
                && dense(x, DType::F32)
                && x.ne[0] == k
                && dense(ids, DType::I32)
                && ids.ne[0] * ids.ne[1] <= MAX_PAIRS
                && x.ne[2] == ids.ne[1]
                && (x.ne[1] == 1 || x.ne[1] == ids.ne[0])
                && out_f32
                && t.ne[0] == w.ne[1]
        }
        _ => false,
    }
}

/// Queues the mixture-of-experts node `t` (one `supports` accepts) on the device's stream.
pub(super) fn launch(
    d: &HipDevice,
    t: &Tensor,
    srcs: &[TensorMem<'_>],
    out: MemRange<'_>,
) -> Result<()> {
    let warp = d.inner.warp;
    let mut a = Args::new();
    match t.op {
        Op::ArgTopK(k) => {
            let x = srcs[0].tensor;
            a.push(addr(&srcs[0])?)
                .push(out)
                .push(x.ne[0] as i32)
                .push(k as i32)
                .push(elems(x.nb[1], x));
            // SAFETY: `a` holds `x.ne[1]` rows of `x.ne[0]` f32 (`nb[1]` apart) and `out` as many
            // rows of `k` I32 (the node's shapes, checked by `supports`); one warp per row.
            unsafe { d.launch_kernel(KernelId::ArgTopKF32, [x.ne[1] as u32, 1, 1], warp, &a.0) }
        }
        Op::ExpertWeights { norm } => {
            let (p, ids) = (srcs[0].tensor, srcs[1].tensor);
            a.push(addr(&srcs[0])?)
                .push(addr(&srcs[1])?)
                .push(out)
                .push(p.ne[0] as i32)
                .push(ids.ne[0] as i32)
                .push(elems(p.nb[1], p))
                .push(i32::from(norm));
            // SAFETY: `probs` holds `ids.ne[1]` rows of `p.ne[0]` f32, `ids` and `out` dense rows
            // of `ids.ne[0]` values each (checked by `supports`); one warp per row.
            unsafe {
                d.launch_kernel(
                    KernelId::ExpertWeightsF32,
                    [ids.ne[1] as u32, 1, 1],
                    warp,
                    &a.0,
                )
            }
        }
        Op::SwigluOai { alpha, limit } => {
            let (g, u) = (srcs[0].tensor, srcs[1].tensor);
            let n = g.ne[0];
            a.push(addr(&srcs[0])?)
                .push(addr(&srcs[1])?)
                .push(out)
                .push(n as i32)
                .push(g.nrows() as i32)
                .push(elems(g.nb[1], g))
                .push(elems(u.nb[1], u))
                .push(n as i64)
                .push(alpha)
                .push(limit);
            // SAFETY: `g` and `u` hold the node's rows (`nb[1]` apart), `out` as many dense rows.
            unsafe {
                d.launch_kernel(
                    KernelId::SwigluOaiF32,
                    [blocks(t.nelements(), 256), 1, 1],
                    256,
                    &a.0,
                )
            }
        }
        Op::MoeSum => {
            let (x, w) = (srcs[0].tensor, srcs[1].tensor);
            let (r, r_row) = match srcs.get(2) {
                Some(m) => (Some(addr(m)?), elems(m.tensor.nb[1], m.tensor)),
                None => (None, 0),
            };
            a.push(addr(&srcs[0])?)
                .push(addr(&srcs[1])?)
                .push(r)
                .push(out)
                .push(x.ne[0] as i32)
                .push(x.ne[1] as i32)
                .push(x.ne[2] as i32)
                .push(elems(x.nb[1], x))
                .push(elems(x.nb[2], x))
                .push(elems(w.nb[1], w))
                .push(elems(w.nb[2], w))
                .push(r_row);
            // SAFETY: `x` holds `ne[2]` rows of `ne[1]` slots of `ne[0]` f32 (`nb` apart), `w` one
            // f32 per slot and row (`nb` apart), the residual (when given) and `out` `ne[2]` rows
            // of `ne[0]` (`r_row` apart, dense) (the shapes `supports` checked); one thread per
            // output value.
            unsafe {
                d.launch_kernel(
                    KernelId::MoeSumF32,
                    [blocks(t.nelements(), 256), 1, 1],
                    256,
                    &a.0,
                )
            }
        }
        _ => mul_mat_id(d, srcs, out),
    }
}

/// Queues a mixture of experts' routing, three nodes the scheduler offers as a group, as one
/// `moe_route_f32` launch and returns 3; 0 when `group` does not start with one. The softmax
/// gating's `probs = soft_max(x)`, `ids = argsort_top_k(probs)`, `expert_weights(probs, ids)`,
/// or gpt-oss's `ids = argsort_top_k(x)`, `picked = expert_weights(x, ids)`,
/// `soft_max(picked)`: unmasked softmaxes, every result dense (each is written, as the separate
/// launches would).
pub(super) fn routing(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let [a, b, c, ..] = group else {
        return Ok(0);
    };
    let nodes_ok = [a, b, c].iter().all(|g| {
        let ts: Vec<&Tensor> = g.srcs.iter().map(|m| m.tensor).collect();
        super::ops::supports(g.tensor, &ts) && g.tensor.is_contiguous()
    });
    if !nodes_ok {
        return Ok(0);
    }
    // (x, the n-wide or k-wide values, ids, weights, scale, top first, norm)
    let (x, vals, ids, w, scale, top_first, norm) = match (&a.tensor.op, &b.tensor.op, &c.tensor.op)
    {
        (Op::SoftMax { scale }, Op::ArgTopK(_), Op::ExpertWeights { norm })
            if a.srcs.len() == 1
                && same_mem(&b.srcs[0], &a.dst)
                && same_mem(&c.srcs[0], &a.dst)
                && same_mem(&c.srcs[1], &b.dst) =>
        {
            (&a.srcs[0], a, b, c, *scale, false, *norm)
        }
        (Op::ArgTopK(_), Op::ExpertWeights { norm: false }, Op::SoftMax { scale })
            if c.srcs.len() == 1
                && same_mem(&b.srcs[0], &a.srcs[0])
                && same_mem(&b.srcs[1], &a.dst)
                && same_mem(&c.srcs[0], &b.dst) =>
        {
            (&a.srcs[0], b, a, c, *scale, true, false)
        }
        _ => return Ok(0),
    };
    let xt = x.tensor;
    let (n, k, rows) = (xt.ne[0], ids.tensor.ne[0], ids.tensor.ne[1]);
    let shapes_ok = n <= kernels::ROUTE_MAX_EXPERTS
        && k <= n
        && xt.ne[1] == rows
        && xt.ne[2] * xt.ne[3] == 1
        && vals.tensor.ne[..2] == [if top_first { k } else { n }, rows]
        && w.tensor.ne[..2] == [k, rows]
        && ids.tensor.ne[2] * ids.tensor.ne[3] == 1;
    if !shapes_ok {
        return Ok(0);
    }
    let xa = addr(x)?;
    let (vo, io, wo) = (rewritten(d, vals)?, rewritten(d, ids)?, rewritten(d, w)?);
    let mut args = Args::new();
    args.push(xa)
        .push(vo)
        .push(io)
        .push(wo)
        .push(n as i32)
        .push(k as i32)
        .push(elems(xt.nb[1], xt))
        .push(scale)
        .push(i32::from(top_first))
        .push(i32::from(norm));
    // SAFETY: `x` holds `rows` rows of `n` f32 (`nb[1]` apart); the values, ids and weights are
    // the group's dense results of `rows` rows of n (or k) f32, k I32 and k f32 (the shapes
    // checked above, n within the kernel's shared row); one warp per row.
    unsafe {
        d.launch_kernel(
            KernelId::MoeRouteF32,
            [rows as u32, 1, 1],
            d.inner.warp,
            &args.0,
        )?
    };
    Ok(3)
}

/// The shapes of a `mul_mat_id` node: `n_mat` matrices of `n` rows of `k` values, `n_x`
/// activation vectors per token, `n_used` experts per token, `n_tok` tokens.
struct IdShape {
    k: usize,
    n: usize,
    n_mat: usize,
    n_x: usize,
    n_used: usize,
    n_tok: usize,
}

impl IdShape {
    /// The shapes of a product of the stack `w` with activations `x` chosen by `ids`.
    fn of(w: &Tensor, x: &Tensor, ids: &Tensor) -> Self {
        Self {
            k: w.ne[0],
            n: w.ne[1],
            n_mat: w.ne[2],
            n_x: x.ne[1],
            n_used: ids.ne[0],
            n_tok: ids.ne[1],
        }
    }

    fn pairs(&self) -> usize {
        self.n_used * self.n_tok
    }

    /// The activation vector pair `p` multiplies.
    fn vector_of(&self, p: usize) -> usize {
        (p / self.n_used) * self.n_x + (p % self.n_used) % self.n_x
    }
}

fn mul_mat_id(d: &HipDevice, srcs: &[TensorMem<'_>], out: MemRange<'_>) -> Result<()> {
    let s = IdShape::of(srcs[0].tensor, srcs[1].tensor, srcs[2].tensor);
    if on_tiles(srcs[0].tensor.dtype, &s) {
        return grouped_tiles(d, &srcs[0], None, &srcs[1], &srcs[2], &s, out);
    }
    if by_expert(d, &s) {
        return grouped(d, srcs, &s, out);
    }
    per_pair(d, srcs, &s, out)
}

/// Whether a `mul_mat_id` of shape `s` with `dtype` weights is grouped by expert on the
/// device and multiplied on integer tiles ([`grouped_tiles`]): where grouping pays (as
/// [`by_expert`], capture or not: nothing is read back) and the tile kernels read the weights.
fn on_tiles(dtype: DType, s: &IdShape) -> bool {
    s.n_tok > 1
        && s.pairs() >= MMQ_MIN_COLS * s.n_mat
        && s.n_mat <= kernels::MOE_GROUP_MAX_EXPERTS
        && tile_kernel(dtype, 16).is_some()
}

/// The expert-grouped tile kernel for `dtype` weights and tiles of `nt` pairs, if any.
fn tile_kernel(dtype: DType, nt: usize) -> Option<KernelId> {
    match dtype {
        DType::MXFP4 => Some(kernels::mmq_id_mxfp4(nt)),
        dt => weight_type(dt).map(|wt| wt.mmq_id(nt)),
    }
}

/// Whether a `mul_mat_id` of shape `s` is multiplied grouped by expert on the host's sort
/// rather than per pair (where [`on_tiles`] does not take it).
fn by_expert(d: &HipDevice, s: &IdShape) -> bool {
    let capturing = d.inner.capturing.load(std::sync::atomic::Ordering::Relaxed);
    // Grouping pays once the average expert's columns reach the tile kernels; it reads the ids
    // back, which a graph capture cannot record.
    !capturing && s.n_tok > 1 && s.pairs() >= MMQ_MIN_COLS * s.n_mat
}

/// A mixture of experts' up product, gate product and gated activation (the scheduler's
/// `expert_gate_up` run: `mul_mat_id`s of one activation and id tensor, `act(gate) * up` of the
/// two) as one gated expert mat-vec (`matvec_*_id_gated`) writing the activation's rows, where
/// both products take the per-pair path with one quantized weight type and layout, or as one
/// gated grouped tile launch where they take the tiles (MXFP4 too). Returns 3 when it
/// launched, 0 when the nodes go their own ways.
pub(super) fn gate_up(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let [up, gate, act, ..] = group else {
        return Ok(0);
    };
    let Op::Gated(kind) = act.tensor.op else {
        return Ok(0);
    };
    let ([wu, x, ids], [wg, xg, idsg], [ga, ua]) = (
        up.srcs.as_slice(),
        gate.srcs.as_slice(),
        act.srcs.as_slice(),
    ) else {
        return Ok(0);
    };
    let nodes_ok = [up, gate, act].iter().all(|g| {
        let ts: Vec<&Tensor> = g.srcs.iter().map(|m| m.tensor).collect();
        super::ops::supports(g.tensor, &ts)
    });
    let w = wu.tensor;
    let s = IdShape::of(w, x.tensor, ids.tensor);
    let fits = nodes_ok
        && gate.tensor.op == Op::MulMatId
        && same_mem(x, xg)
        && same_mem(ids, idsg)
        && same_mem(ga, &gate.dst)
        && same_mem(ua, &up.dst)
        && wg.tensor.dtype == w.dtype
        && wg.tensor.ne == w.ne
        && wg.tensor.nb == w.nb
        && dense(act.tensor, DType::F32)
        && act.tensor.ne == up.tensor.ne;
    if fits && on_tiles(w.dtype, &s) {
        rewritten(d, up)?;
        rewritten(d, gate)?;
        let out = rewritten(d, act)?;
        grouped_tiles(d, wg, Some((wu, kind)), x, ids, &s, out)?;
        #[cfg(any(test, feature = "testing"))]
        GATE_UP_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(3);
    }
    // Every quantized type has a gated expert mat-vec (so a by-expert product too); MXFP4 none.
    let Some(l) = id_kernel(w.dtype, s.k, w.nb[1], s.n, IdKind::Gated).filter(|_| fits) else {
        return Ok(0);
    };
    rewritten(d, up)?;
    rewritten(d, gate)?;
    let out = rewritten(d, act)?;
    if by_expert(d, &s) {
        // One gated product per chosen expert over its gathered rows.
        let mats = |e: usize| Ok((expert_mat(wg, &s, e)?, expert_mat(wu, &s, e)?));
        by_expert_runs(
            d,
            x,
            ids,
            &s,
            out,
            |e, c| Ok(gated_scratch(d, &mats(e)?.0, c)),
            |e, xg, c, yg| {
                let (g, u) = mats(e)?;
                gated_product(d, kind, &g, &u, xg, c, yg)
            },
        )?;
        #[cfg(any(test, feature = "testing"))]
        GATE_UP_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        return Ok(3);
    }
    let mut cache = d.inner.q8.lock();
    let xp = addr(x)?;
    let q8 = id_input(d, &mut cache, &l, xp, s.k, s.n_x * s.n_tok)?;
    let y = q8.as_ref().map_or(xp, |b| MemRange::of_buffer(b));
    let mut a = Args::new();
    a.push(addr(wg)?).push(addr(wu)?);
    id_operands(&mut a, addr(ids)?, y, out, w, &s).push(act_kind(kind));
    // SAFETY: `wg` and `wu` are stacks of `n_mat` matrices of one type and layout (`nb[2]`
    // apart) of `n` rows, `ids` the dense `[n_used, n_tok]` I32 ids (each checked against
    // `n_mat` by the kernel), `y` the `n_x * n_tok` activation vectors (f32 or quantized above,
    // as the kernel takes them) and `out` the activation node's `pairs` dense rows of `n` f32;
    // grid y is the pair.
    unsafe { launch_matvec(d, l.kid, l.grid, s.pairs(), &a, cache)? };
    #[cfg(any(test, feature = "testing"))]
    GATE_UP_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(3)
}

/// The operands every quantized expert mat-vec takes after its weights (and bias): the ids,
/// the activations (Q8_1, or f32 for the short-row kernels), the output, then the shapes of the
/// stack `w` and of the pairs.
fn id_operands<'a, 'b>(
    a: &'b mut Args<'a>,
    ids: MemRange<'a>,
    q8: MemRange<'a>,
    out: MemRange<'a>,
    w: &Tensor,
    s: &IdShape,
) -> &'b mut Args<'a> {
    a.push(ids)
        .push(q8)
        .push(out)
        .push(s.k as i32)
        .push(w.nb[1] as i64)
        .push(w.nb[2] as i64)
        .push(s.n as i32)
        .push(s.n_used as i32)
        .push(s.n_x as i32)
        .push(s.n_mat as i32)
}

/// The per-pair expert mat-vecs: plain, with the experts' bias rows, gated.
#[derive(Clone, Copy)]
enum IdKind {
    Plain,
    Bias,
    Gated,
}

/// A per-pair expert mat-vec launch: the kernel, its grid x, and whether it takes the
/// activations as f32 (the short-row kernels quantize them themselves) rather than Q8_1.
struct IdLaunch {
    kid: KernelId,
    grid: u32,
    f32_in: bool,
}

/// The per-pair expert mat-vec of kind `kind` for a stack of `dtype` rows of `k` values
/// (`row_bytes`) and its grid x over `n` rows: the short-row kernels (a warp's lanes split
/// across several rows) for the plain and biased products of the K-quant types where a row fits
/// them, else the kernels that lay a warp along each row; `None` for a weight type without one
/// (the float types; MXFP4 has no gated kernel).
fn id_kernel(dtype: DType, k: usize, row_bytes: usize, n: usize, kind: IdKind) -> Option<IdLaunch> {
    let long = |kid, grid| IdLaunch {
        kid,
        grid,
        f32_in: false,
    };
    if dtype == DType::MXFP4 {
        let grid = kernels::matvec_grid_mxfp4(n);
        return match kind {
            IdKind::Plain => Some(long(KernelId::MatvecIdMxfp4, grid)),
            IdKind::Bias => Some(long(KernelId::MatvecIdAddMxfp4, grid)),
            IdKind::Gated => None,
        };
    }
    let wt = weight_type(dtype)?;
    let short = wt
        .matvec_id_short()
        .filter(|_| kernels::matvec_id_short_fits(k, row_bytes));
    let short_kid = |kid| IdLaunch {
        kid,
        grid: kernels::matvec_id_short_grid(n),
        f32_in: true,
    };
    Some(match (kind, short) {
        (IdKind::Plain, Some([plain, _])) => short_kid(plain),
        (IdKind::Bias, Some([_, bias])) => short_kid(bias),
        (IdKind::Plain, None) => long(wt.matvec_id(), kernels::matvec_grid(wt, n)),
        (IdKind::Bias, None) => long(wt.matvec_id_add(), kernels::matvec_grid(wt, n)),
        (IdKind::Gated, _) => long(wt.matvec_id_gated(), kernels::matvec_gated_grid(wt, n)),
    })
}

/// The activations an expert mat-vec launch `l` reads: `x` itself (`vectors` dense f32 vectors
/// of `k`) for the short-row kernels, else `x` quantized to Q8_1 (through the device's cache,
/// whose guard `cache` is; the buffer is returned to be kept alive until the launch is queued).
fn id_input<'a>(
    d: &HipDevice,
    cache: &mut Q8Cache,
    l: &IdLaunch,
    x: MemRange<'a>,
    k: usize,
    vectors: usize,
) -> Result<Option<std::sync::Arc<gpu_mem::DeviceBuffer<u8>>>> {
    if l.f32_in {
        if k.checked_mul(vectors)
            .and_then(|v| v.checked_mul(4))
            .is_none_or(|b| b > x.len())
        {
            return Err(gpu_err(
                "mul_mat_id",
                format!(
                    "{vectors} vectors of {k} f32 values exceed {} bytes",
                    x.len()
                ),
            ));
        }
        return Ok(None);
    }
    cache.quantized(d, x, k, vectors).map(Some)
}

/// One launch over every (token, slot) pair.
fn per_pair(d: &HipDevice, srcs: &[TensorMem<'_>], s: &IdShape, out: MemRange<'_>) -> Result<()> {
    let w = srcs[0].tensor;
    let (wp, xp, ip) = (addr(&srcs[0])?, addr(&srcs[1])?, addr(&srcs[2])?);
    let pairs = s.pairs();
    let quant = id_kernel(w.dtype, s.k, w.nb[1], s.n, IdKind::Plain);
    let mut a = Args::new();
    if let Some(l) = quant {
        let vectors = s.n_x * s.n_tok;
        let mut cache = d.inner.q8.lock();
        let q8 = id_input(d, &mut cache, &l, xp, s.k, vectors)?;
        a.push(wp);
        let y = q8.as_ref().map_or(xp, |b| MemRange::of_buffer(b));
        id_operands(&mut a, ip, y, out, w, s);
        // SAFETY: `w` is the stack of `n_mat` matrices (`nb[2]` apart) of `n` rows, `ids` the
        // dense `[n_used, n_tok]` I32 ids (each checked against `n_mat` by the kernel), `y` the
        // `n_x * n_tok` activation vectors (f32 or quantized above, as the kernel takes them)
        // and `out` the `pairs` dense rows of `n` f32; grid y is the pair.
        return unsafe { launch_matvec(d, l.kid, l.grid, pairs, &a, cache) };
    }
    let kid = if w.dtype == DType::F32 {
        KernelId::MatvecIdF32
    } else {
        KernelId::MatvecIdF16
    };
    a.push(wp)
        .push(ip)
        .push(xp)
        .push(out)
        .push(s.k as i32)
        .push(elems(w.nb[1], w))
        .push(elems(w.nb[2], w))
        .push(s.n as i32)
        .push(s.n_used as i32)
        .push(s.n_x as i32)
        .push(s.n_mat as i32);
    // SAFETY: as above, with `x` the dense f32 activations themselves; one block per output row
    // and pair.
    unsafe { d.launch_kernel(kid, [s.n as u32, pairs as u32, 1], 4 * d.inner.warp, &a.0) }
}

/// An expert product, its experts' bias rows and their sum (the scheduler's `expert_bias` run:
/// `mul_mat_id`, `get_rows` of a dense f32 `[n, n_mat]` bias stack by the same ids, `add`) as
/// one biased expert mat-vec (`matvec_*_id_add`) writing the sum, where the product takes the
/// per-pair path with a quantized or MXFP4 weight. Returns 3 when it launched, 0 otherwise.
pub(super) fn with_bias(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let [mm, rows, add, ..] = group else {
        return Ok(0);
    };
    let ([w, x, ids], [b, flat], [ya, ra]) = (
        mm.srcs.as_slice(),
        rows.srcs.as_slice(),
        add.srcs.as_slice(),
    ) else {
        return Ok(0);
    };
    let nodes_ok = [mm, rows, add].iter().all(|g| {
        let ts: Vec<&Tensor> = g.srcs.iter().map(|m| m.tensor).collect();
        super::ops::supports(g.tensor, &ts)
    });
    let wt = w.tensor;
    let s = IdShape::of(wt, x.tensor, ids.tensor);
    let kid = id_kernel(wt.dtype, s.k, wt.nb[1], s.n, IdKind::Bias);
    let bt = b.tensor;
    let fits = nodes_ok
        && rows.tensor.op == Op::GetRows
        && same_mem(flat, ids)
        && add.tensor.op == Op::Add
        && dense(bt, DType::F32)
        && bt.ne[0] == s.n
        && bt.ne[1] == s.n_mat
        && same_mem(ya, &mm.dst)
        && same_mem(ra, &rows.dst)
        && ya.tensor.ne == ra.tensor.ne
        && dense(add.tensor, DType::F32)
        && add.tensor.ne == mm.tensor.ne
        && !by_expert(d, &s);
    let Some(l) = kid.filter(|_| fits) else {
        return Ok(0);
    };
    rewritten(d, mm)?;
    rewritten(d, rows)?;
    let out = rewritten(d, add)?;
    let mut cache = d.inner.q8.lock();
    let xp = addr(x)?;
    let q8 = id_input(d, &mut cache, &l, xp, s.k, s.n_x * s.n_tok)?;
    let y = q8.as_ref().map_or(xp, |b| MemRange::of_buffer(b));
    let mut a = Args::new();
    a.push(addr(w)?).push(addr(b)?);
    id_operands(&mut a, addr(ids)?, y, out, wt, &s);
    // SAFETY: `w` is the stack of `n_mat` matrices (`nb[2]` apart) of `n` rows, `b` the dense
    // f32 `[n, n_mat]` bias stack, `ids` the dense `[n_used, n_tok]` I32 ids (each checked
    // against `n_mat` by the kernel before it reads a matrix or bias row), `q8` the
    // `n_x * n_tok` activation vectors (f32 or quantized above, as the kernel takes them) and
    // `out` the sum's `pairs` dense rows of `n` f32; grid y is the pair.
    unsafe { launch_matvec(d, l.kid, l.grid, s.pairs(), &a, cache)? };
    #[cfg(any(test, feature = "testing"))]
    BIAS_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(3)
}

/// Scratch bytes [`gated_product`] uses from the scratch's start for `m` vectors times `w`
/// (and a matrix of its type and shape).
fn gated_scratch(d: &HipDevice, w: &Mat<'_>, m: usize) -> usize {
    let sms = usize::try_from(d.inner.dev.info().compute_units).unwrap_or(0);
    let tiles = if mmq_takes(d, m) {
        kernels::MmqPlan::new(w.n, m, w.k, 2, sms).partial_values(w.n, m) * 4
    } else {
        0
    };
    tiles.max(align(product_scratch(d, w, m)) + w.n * m * 4)
}

/// `out` (`m` rows of `n`) = `act(wg x) * (wu x)` for `m` dense f32 vectors `x`, `wg` and `wu`
/// of one type and shape: both on integer tiles in one launch where the tile kernels take `m`,
/// one gated mat-vec for a few vectors of a quantized type, else both products (the up one into
/// the scratch past what a product uses) and the activation.
fn gated_product(
    d: &HipDevice,
    kind: Act,
    wg: &Mat<'_>,
    wu: &Mat<'_>,
    x: MemRange<'_>,
    m: usize,
    out: MemRange<'_>,
) -> Result<()> {
    let (k, n) = (wg.k, wg.n);
    let wt = weight_type(wg.dtype);
    if let Some(wt) = wt.filter(|_| mmq_takes(d, m)) {
        let ws = [wg.w, wu.w];
        let p = MmqProduct {
            wt,
            ws: &ws,
            row_bytes: wg.row_bytes,
            k,
            n,
            m,
            act: Some(act_kind(kind)),
        };
        return mmq(d, &p, None, x, out);
    }
    if let Some(wt) = wt.filter(|_| m <= MATVEC_MAX_COLS) {
        let mut cache = d.inner.q8.lock();
        let q8 = cache.quantized(d, x, k, m)?;
        let mut b = Args::new();
        b.push(wg.w)
            .push(wu.w)
            .push(MemRange::of_buffer(&q8))
            .push(out)
            .push(k as i32)
            .push(wg.row_bytes as i64)
            .push(n as i32)
            .push(n as i32)
            .push(act_kind(kind));
        let grid = kernels::matvec_gated_grid(wt, n);
        // SAFETY: `wg` and `wu` hold `n` rows of `row_bytes` of a quantized type, `q8` the `m`
        // vectors of `k` quantized above and `out` `m` rows of `n` f32 (the caller's shapes).
        return unsafe { launch_matvec(d, wt.matvec_gated(), grid, m, &b, cache) };
    }
    let at = align(product_scratch(d, wu, m));
    let scratch = d.scratch(at + n * m * 4)?;
    let up = MemRange::of_buffer(&scratch)
        .sub(at, n * m * 4)
        .map_err(|e| gpu_err("mul_mat_id", e))?;
    product(d, wg, x, m, out, None)?;
    product(d, wu, x, m, up, None)?;
    d.inner.q8.lock().written(up.addr(), up.len());
    act_in_place(d, kind, out, up, n, m)
}

/// `out` (one row of `s.n` f32 per pair) = each pair's matrix of the stack `w` times its
/// activation vector of `x`, or with `up` = `(wu, kind)` the gated `act(w x) * (wu x)`: the
/// pairs sorted by expert on the device (`moe_group`, for the plan's tile width), then one
/// `mmq_id_*` launch over every expert's tiles reading the Q8_1 activations through the sorted
/// pairs and writing each pair's row. Pairs whose id is outside the stack get zero rows.
fn grouped_tiles(
    d: &HipDevice,
    w: &TensorMem<'_>,
    up: Option<(&TensorMem<'_>, Act)>,
    x: &TensorMem<'_>,
    ids: &TensorMem<'_>,
    s: &IdShape,
    out: MemRange<'_>,
) -> Result<()> {
    let wt = w.tensor;
    let pairs = s.pairs();
    let plan = kernels::MmqIdPlan::new(pairs, s.n_mat, s.n);
    let kid = tile_kernel(wt.dtype, plan.nt).ok_or_else(|| {
        gpu_err(
            "mul_mat_id",
            format!("{} weights have no tile kernels", wt.dtype.name()),
        )
    })?;
    let list = (s.n_mat + 1) * 4;
    let at_off = align(pairs * 4);
    let at_tiles = at_off + align(list);
    let views = |e| gpu_err("mul_mat_id", e);
    let mut cache = d.inner.q8.lock();
    let q8 = cache.quantized(d, addr(x)?, s.k, s.n_x * s.n_tok)?;
    let scratch = d.scratch(at_tiles + list)?;
    let base = MemRange::of_buffer(&scratch);
    let rows = base.sub(0, pairs * 4).map_err(views)?;
    let off = base.sub(at_off, list).map_err(views)?;
    let tiles = base.sub(at_tiles, list).map_err(views)?;
    cache.written(base.addr(), at_tiles + list);
    let mut g = Args::new();
    g.push(addr(ids)?)
        .push(rows)
        .push(off)
        .push(tiles)
        .push(out)
        .push(pairs as i32)
        .push(s.n_mat as i32)
        .push(plan.nt as i32)
        .push(s.n as i32);
    // SAFETY: `ids` holds the node's `pairs` dense I32 ids, `rows` `pairs` I32 and `off` and
    // `tiles` `n_mat + 1` each (sized above), `out` `pairs` dense rows of `n` f32 (the node's
    // result); one block per expert and one for the totals, `n_mat` within the kernel's
    // histogram (`on_tiles`).
    unsafe {
        d.launch_kernel(
            KernelId::MoeGroup,
            [s.n_mat as u32 + 1, 1, 1],
            kernels::MOE_GROUP_THREADS,
            &g.0,
        )?
    };
    let wu = match up {
        Some((u, _)) => Some(addr(u)?),
        None => None,
    };
    let mut a = Args::new();
    a.push(addr(w)?)
        .push(wu)
        .push(rows)
        .push(off)
        .push(tiles)
        .push(MemRange::of_buffer(&q8))
        .push(out)
        .push(s.k as i32)
        .push(wt.nb[1] as i64)
        .push(wt.nb[2] as i64)
        .push(s.n as i32)
        .push(s.n_used as i32)
        .push(s.n_x as i32)
        .push(s.n_mat as i32)
        .push(up.map_or(act::SILU, |(_, kind)| act_kind(kind)));
    // SAFETY: `w` (and `wu`, of the same type and layout) is a stack of `n_mat` matrices
    // (`nb[2]` apart) of `n` rows of `nb[1]` bytes, `rows`, `off` and `tiles` the sorted pairs
    // `moe_group` writes before this launch on the stream (for the plan's tile width), `q8` the
    // `n_x * n_tok` activation vectors of `k` quantized above and `out` `pairs` dense rows of
    // `n` f32; the grid covers every tile the sort can make (`MmqIdPlan`).
    unsafe { d.launch_kernel(kid, plan.grid, kernels::MMQ_THREADS, &a.0)? };
    drop(cache);
    #[cfg(any(test, feature = "testing"))]
    TILE_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// The pairs sorted by expert, stable: the activation row and the output row of each, and the
/// `(expert, first, count)` runs.
struct Groups {
    src_rows: Vec<i32>,
    dst_rows: Vec<i32>,
    runs: Vec<(usize, usize, usize)>,
}

/// Sorts the pairs of `ids` (one expert id per pair, in pair order) by expert.
fn group_pairs(ids: &[i32], s: &IdShape) -> Result<Groups> {
    let mut count = vec![0usize; s.n_mat];
    for &e in ids {
        let slot = usize::try_from(e)
            .ok()
            .and_then(|e| count.get_mut(e))
            .ok_or_else(|| {
                gpu_err(
                    "mul_mat_id",
                    format!("expert id {e} outside 0..{}", s.n_mat),
                )
            })?;
        *slot += 1;
    }
    let mut next = Vec::with_capacity(s.n_mat);
    let mut runs = Vec::new();
    let mut at = 0;
    for (e, &c) in count.iter().enumerate() {
        next.push(at);
        if c > 0 {
            runs.push((e, at, c));
        }
        at += c;
    }
    let mut src_rows = vec![0i32; ids.len()];
    let mut dst_rows = vec![0i32; ids.len()];
    for (p, &e) in ids.iter().enumerate() {
        // In range: every id was checked above.
        let j = next[e as usize];
        next[e as usize] += 1;
        src_rows[j] = s.vector_of(p) as i32;
        dst_rows[j] = p as i32;
    }
    Ok(Groups {
        src_rows,
        dst_rows,
        runs,
    })
}

fn align(b: usize) -> usize {
    b.div_ceil(ALIGN) * ALIGN
}

/// Gather by expert, one product per chosen expert, scatter back.
fn grouped(d: &HipDevice, srcs: &[TensorMem<'_>], s: &IdShape, out: MemRange<'_>) -> Result<()> {
    let mat_of = |e: usize| expert_mat(&srcs[0], s, e);
    by_expert_runs(
        d,
        &srcs[1],
        &srcs[2],
        s,
        out,
        |e, c| Ok(product_scratch(d, &mat_of(e)?, c)),
        |e, xg, c, yg| product(d, &mat_of(e)?, xg, c, yg, None).map(|_| ()),
    )
}

/// Matrix `e` of the expert stack `w` (`s.n_mat` matrices of `s.n` rows of `s.k`).
fn expert_mat<'a>(w: &TensorMem<'a>, s: &IdShape, e: usize) -> Result<Mat<'a>> {
    let t = w.tensor;
    Ok(Mat {
        dtype: t.dtype,
        k: s.k,
        n: s.n,
        row_bytes: t.nb[1],
        w: addr(w)?
            .sub(e * t.nb[2], s.n * t.nb[1])
            .map_err(|e| gpu_err("mul_mat_id", e))?,
    })
}

/// The pairs of `ids` grouped by expert: reads the ids back, gathers the activation rows of
/// `x` into expert order, calls `run(expert, rows, count, out_rows)` for each chosen expert
/// (`count` gathered rows of `s.k`, `count` output rows of `s.n`) and scatters the results back
/// to their pairs' rows of `out`. `scratch_of(expert, count)` is the scratch `run` uses from the
/// scratch's start; the gathered rows go past the largest.
fn by_expert_runs(
    d: &HipDevice,
    x: &TensorMem<'_>,
    ids: &TensorMem<'_>,
    s: &IdShape,
    out: MemRange<'_>,
    scratch_of: impl Fn(usize, usize) -> Result<usize>,
    mut run: impl FnMut(usize, MemRange<'_>, usize, MemRange<'_>) -> Result<()>,
) -> Result<()> {
    let pairs = s.pairs();
    let mut raw = vec![0u8; pairs * 4];
    // Waits for the routing that wrote the ids (the stream's work so far).
    ids.buffer.read(ids.offset, &mut raw)?;
    let ids: Vec<i32> = raw
        .chunks_exact(4)
        .map(|b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let g = group_pairs(&ids, s)?;
    let xp = addr(x)?;
    let views = |e| gpu_err("mul_mat_id", e);
    let mut core = 0;
    for &(e, _, c) in &g.runs {
        core = core.max(scratch_of(e, c)?);
    }
    let idx_bytes = align(pairs * 4);
    let at_src = align(core);
    let at_dst = at_src + idx_bytes;
    let at_x = at_dst + idx_bytes;
    let at_y = at_x + align(pairs * s.k * 4);
    let scratch = d.scratch(at_y + pairs * s.n * 4)?;
    let base = MemRange::of_buffer(&scratch);
    let src_ids = base.sub(at_src, pairs * 4).map_err(views)?;
    let dst_ids = base.sub(at_dst, pairs * 4).map_err(views)?;
    let xs = base.sub(at_x, pairs * s.k * 4).map_err(views)?;
    let ys = base.sub(at_y, pairs * s.n * 4).map_err(views)?;
    let stream = d.inner.sb.stream();
    stream
        .queue_write_range(bytemuck::cast_slice(&g.src_rows), src_ids)
        .and_then(|()| stream.queue_write_range(bytemuck::cast_slice(&g.dst_rows), dst_ids))
        .map_err(views)?;
    let mut a = Args::new();
    a.push(xp)
        .push(src_ids)
        .push(xs)
        .push(s.k as i32)
        .push(s.k as i64)
        .push(s.k as i64);
    // SAFETY: `x` holds `n_x * n_tok` dense rows of `k` f32 and every source row index is below
    // that (`vector_of`); `xs` takes `pairs` rows of `k`.
    unsafe {
        d.launch_kernel(
            KernelId::GetRowsF32,
            [blocks(s.k, 256), pairs as u32, 1],
            256,
            &a.0,
        )?
    };
    {
        let mut cache = d.inner.q8.lock();
        cache.written(xs.addr(), xs.len());
        cache.written(ys.addr(), ys.len());
    }
    for &(e, first, c) in &g.runs {
        let xg = xs.sub(first * s.k * 4, c * s.k * 4).map_err(views)?;
        let yg = ys.sub(first * s.n * 4, c * s.n * 4).map_err(views)?;
        run(e, xg, c, yg)?;
    }
    let mut b = Args::new();
    b.push(ys)
        .push(dst_ids)
        .push(out)
        .push(s.n as i32)
        .push(pairs as i32)
        .push(s.n as i64)
        .push(s.n as i64);
    // SAFETY: `ys` holds `pairs` rows of `n` f32 and every destination index is a pair of the
    // node's output (`pairs` dense rows of `n`).
    unsafe {
        d.launch_kernel(
            KernelId::SetRowsF32,
            [blocks(pairs * s.n, 256), 1, 1],
            256,
            &b.0,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_group_by_expert_in_pair_order() {
        let s = IdShape {
            k: 32,
            n: 8,
            n_mat: 4,
            n_x: 1,
            n_used: 2,
            n_tok: 3,
        };
        // Tokens 0..3 chose (2, 0), (0, 3), (2, 1).
        let g = group_pairs(&[2, 0, 0, 3, 2, 1], &s).expect("valid ids");
        assert_eq!(g.runs, vec![(0, 0, 2), (1, 2, 1), (2, 3, 2), (3, 5, 1)]);
        assert_eq!(g.dst_rows, vec![1, 2, 5, 0, 4, 3]);
        // One activation vector per token: pair p reads token p / 2's.
        assert_eq!(g.src_rows, vec![0, 1, 2, 0, 2, 1]);
        let s2 = IdShape { n_x: 2, ..s };
        let g2 = group_pairs(&[2, 0, 0, 3, 2, 1], &s2).expect("valid ids");
        // One vector per pair: pair p reads vector p.
        assert_eq!(g2.src_rows, g2.dst_rows);
        assert!(group_pairs(&[0, 4, 1, 1, 2, 2], &s).is_err());
        assert!(group_pairs(&[0, -1, 1, 1, 2, 2], &s).is_err());
    }
}
