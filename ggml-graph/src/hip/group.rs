//! Grouped launches: the q, k and v projections of a decode step (`mul_mat` nodes reading the
//! same activations) in one launch of a `*_multi` kernel instead of three, the q and k ropes in
//! one `rope2_f32`, the K and V cache writes in one `set_rows2_*`, a post-norm with the
//! residual add after it and the next pre-norm in one `rms_norm_add_f32`, and the per-head q and
//! k norms in one `rms_norm2_f32`; the q and k ropes with both cache writes after them go as one
//! `rope_kv_*`, and with the q and k norms before them too as one `norm_rope_kv_*`; with the
//! q, k and v projections before them (Q4_K, an f16 cache) the seven go as one mat-vec launch that
//! rotates and stores its own rows (`matvec_q4_k_rope_kv`, `matvec_q4_k_q6_k_rope_kv`); a
//! mixture of experts' up and gate products with their activation go as one gated expert
//! mat-vec (`matvec_*_id_gated`), an expert product with its experts' bias rows as one biased
//! one (`matvec_*_id_add`).

use gpu_mem::MemRange;

use super::matmul::{launch_matvec, mmq_takes};
use super::ops::{supports, weight_type, Args, K_SPLIT_FROM, MATVEC_MAX_COLS, RMS_Q8_STEPS};
use super::{addr, rewritten, same_mem, HipDevice};
use crate::backend::GroupNode;
use crate::error::Result;
use kernels::{KernelId, WeightType};

use crate::tensor::{DType, Op, RopeMode, RopeParams, Tensor};

/// Nodes one `*_multi` launch takes at most.
const GROUP_MAX: usize = 3;

/// True when `t` (with operands `w`, `x`) fits the grouped kernel next to `first`: a decode
/// `mul_mat` of the same weight type, row length and row size, on the same activations.
fn joins(first: &GroupNode<'_>, t: &GroupNode<'_>) -> bool {
    joins_rows(first, t)
        && t.srcs[0].tensor.dtype == first.srcs[0].tensor.dtype
        && t.srcs[0].tensor.nb[1] == first.srcs[0].tensor.nb[1]
}

/// `t` multiplies the same activations as `first` by a 2-D matrix of the same row length (of any
/// weight type).
fn joins_rows(first: &GroupNode<'_>, t: &GroupNode<'_>) -> bool {
    let [w, x] = t.srcs.as_slice() else {
        return false;
    };
    let [w0, x0] = first.srcs.as_slice() else {
        return false;
    };
    let ts: Vec<&Tensor> = t.srcs.iter().map(|m| m.tensor).collect();
    t.tensor.op == Op::MulMat
        && supports(t.tensor, &ts)
        && t.tensor.is_contiguous()
        && w.tensor.ne[0] == w0.tensor.ne[0]
        && w.tensor.ne[2] * w.tensor.ne[3] == 1
        && std::ptr::eq(x.buffer, x0.buffer)
        && x.offset == x0.offset
        && x.tensor.ne == x0.tensor.ne
        && x.tensor.nb == x0.tensor.nb
}

/// Queues the longest leading run of `group` one grouped kernel takes (at least two nodes) as one
/// launch and returns its length; 0 when fewer than two qualify.
pub(crate) fn launch(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    match group.first().map(|g| &g.tensor.op) {
        Some(Op::MulMat) => match projections_rope_kv(d, group)? {
            0 => mat_vecs(d, group),
            n => Ok(n),
        },
        Some(Op::Rope(_)) => ropes(d, group),
        Some(Op::SetRows) => set_rows(d, group),
        Some(Op::RmsNormMul { .. }) => norm_add(d, group),
        Some(Op::MulMatId) => match super::moe::gate_up(d, group)? {
            0 => super::moe::with_bias(d, group),
            n => Ok(n),
        },
        Some(Op::SoftMax { .. } | Op::ArgTopK(_)) => super::moe::routing(d, group),
        _ => Ok(0),
    }
}

/// True when `g` passes the backend's own checks for its op.
fn supported(g: &GroupNode<'_>) -> bool {
    let ts: Vec<&Tensor> = g.srcs.iter().map(|m| m.tensor).collect();
    supports(g.tensor, &ts)
}

fn elems(bytes: usize, t: &Tensor) -> i64 {
    (bytes / t.dtype.type_size()) as i64
}

/// The parameters of `a` and `b` when they are ropes one launch can take: the same parameters,
/// positions and factors over rows of one length, dense outputs.
fn rope_pair_params(a: &GroupNode<'_>, b: &GroupNode<'_>) -> Option<RopeParams> {
    let Op::Rope(p) = a.tensor.op else {
        return None;
    };
    let (xa, xb) = (a.srcs[0].tensor, b.srcs[0].tensor);
    let ok = b.tensor.op == a.tensor.op
        && supported(a)
        && supported(b)
        && a.srcs.len() == b.srcs.len()
        && xa.ne[0] == xb.ne[0]
        && a.tensor.is_contiguous()
        && b.tensor.is_contiguous()
        && a.srcs[1..]
            .iter()
            .zip(&b.srcs[1..])
            .all(|(u, v)| std::ptr::eq(u.buffer, v.buffer) && u.offset == v.offset);
    ok.then_some(p)
}

/// Pushes the rope kernels' shared tail of arguments: positions, head size, rotated dims, base,
/// scale, frequency factors, mode and the YaRN terms of rope `a` (parameters `p`).
fn push_rope_params<'a>(args: &mut Args<'a>, a: &GroupNode<'a>, p: &RopeParams) -> Result<()> {
    let ff = match a.srcs.get(2) {
        Some(m) => Some(addr(m)?),
        None => None,
    };
    let corr = p.yarn_corr_dims();
    args.push(addr(&a.srcs[1])?)
        .push(a.srcs[0].tensor.ne[0] as i32)
        .push(p.n_dims as i32)
        .push(p.freq_base)
        .push(p.freq_scale)
        .push(ff)
        .push(i32::from(p.mode == RopeMode::Neox))
        .push(p.ext_factor)
        .push(p.mscale())
        .push(corr[0])
        .push(corr[1]);
    Ok(())
}

/// Pushes the cache-write arguments of `rope_kv_*` / `norm_rope_kv_*` for the K and V writes
/// `c` and `e` and returns the kernel of their cache type.
fn push_cache_writes<'a>(
    d: &HipDevice,
    args: &mut Args<'a>,
    c: &GroupNode<'a>,
    e: &GroupNode<'a>,
    kernels: [KernelId; 2],
) -> Result<KernelId> {
    let v = e.srcs[0].tensor;
    args.push(rewritten(d, c)?)
        .push(elems(c.tensor.nb[1], c.tensor))
        .push(addr(&e.srcs[0])?)
        .push(v.ne[0] as i32)
        .push(elems(v.nb[1], v))
        .push(rewritten(d, e)?)
        .push(elems(e.tensor.nb[1], e.tensor))
        .push(addr(&c.srcs[1])?);
    Ok(if c.tensor.dtype == DType::F16 {
        kernels[0]
    } else {
        kernels[1]
    })
}

/// Two ropes of the same parameters, positions and factors over rows of one length (queries
/// and keys), dense outputs; with the K and V cache writes after them, those too.
fn ropes(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let [a, b, ..] = group else { return Ok(0) };
    let Some(p) = rope_pair_params(a, b) else {
        return Ok(0);
    };
    let (xa, xb) = (a.srcs[0].tensor, b.srcs[0].tensor);
    let kv = match group {
        [_, _, c, e, ..] => cache_writes(b, c, e),
        _ => None,
    };
    let mut args = Args::new();
    for (g, x) in [(a, xa), (b, xb)] {
        let out = rewritten(d, g)?;
        args.push(addr(&g.srcs[0])?)
            .push(out)
            .push(x.ne[1] as i32)
            .push(elems(x.nb[1], x))
            .push(x.nrows() as i32);
    }
    push_rope_params(&mut args, a, &p)?;
    let pairs = (xa.nrows() + xb.nrows()) * xa.ne[0] / 2;
    if let Some((c, e)) = kv {
        let kid = push_cache_writes(
            d,
            &mut args,
            c,
            e,
            [KernelId::RopeKvF16, KernelId::RopeKvF32],
        )?;
        let v = e.srcs[0].tensor;
        let total = pairs + v.ne[0] * v.ne[1];
        // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
        // the shapes passed here (the group's shapes were matched when it was formed).
        unsafe { d.launch_kernel(kid, [total.div_ceil(256) as u32, 1, 1], 256, &args.0)? };
        return Ok(4);
    }
    // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
    // the shapes passed here (the group's shapes were matched when it was formed).
    unsafe {
        d.launch_kernel(
            KernelId::Rope2F32,
            [pairs.div_ceil(256) as u32, 1, 1],
            256,
            &args.0,
        )?
    };
    Ok(2)
}

/// The K and V cache writes `c` and `e` after the key rope `k`, when one `rope_kv_*` launch can
/// make them: `c` stores `k`'s dense output (a token's heads side by side), `e` any f32 rows, both
/// of one index vector and token count into caches of one type.
fn cache_writes<'g, 'a>(
    k: &GroupNode<'a>,
    c: &'g GroupNode<'a>,
    e: &'g GroupNode<'a>,
) -> Option<(&'g GroupNode<'a>, &'g GroupNode<'a>)> {
    let kx = k.srcs[0].tensor;
    let n_tok = kx.nrows() / kx.ne[1].max(1);
    let (kr, vr) = (c.srcs[0].tensor, e.srcs[0].tensor);
    let ok = c.tensor.op == Op::SetRows
        && e.tensor.op == Op::SetRows
        && supported(c)
        && supported(e)
        && c.tensor.dtype == e.tensor.dtype
        && matches!(c.tensor.dtype, DType::F16 | DType::F32)
        && same_mem(&c.srcs[0], &k.dst)
        && kr.is_contiguous()
        && kr.ne[0] == kx.ne[0] * kx.ne[1]
        && kr.ne[1] == n_tok
        && kr.nrows() == n_tok
        && vr.ne[1] == n_tok
        && vr.nrows() == n_tok
        && vr.nb[0] == DType::F32.type_size()
        && std::ptr::eq(c.srcs[1].buffer, e.srcs[1].buffer)
        && c.srcs[1].offset == e.srcs[1].offset
        && !same_mem(&c.dst, &e.dst);
    ok.then_some((c, e))
}

/// Two `set_rows` of the same indices and row count into caches of one type (K and V).
fn set_rows(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let [a, b, ..] = group else { return Ok(0) };
    let (sa, sb) = (a.srcs[0].tensor, b.srcs[0].tensor);
    let ok = b.tensor.op == Op::SetRows
        && supported(a)
        && supported(b)
        && a.tensor.dtype == b.tensor.dtype
        && matches!(a.tensor.dtype, DType::F16 | DType::F32)
        && sa.ne[1] == sb.ne[1]
        && std::ptr::eq(a.srcs[1].buffer, b.srcs[1].buffer)
        && a.srcs[1].offset == b.srcs[1].offset;
    if !ok {
        return Ok(0);
    }
    let kid = if a.tensor.dtype == DType::F16 {
        KernelId::SetRows2F16
    } else {
        KernelId::SetRows2F32
    };
    let mut args = Args::new();
    for (g, s) in [(a, sa), (b, sb)] {
        let out = rewritten(d, g)?;
        args.push(addr(&g.srcs[0])?)
            .push(out)
            .push(s.ne[0] as i32)
            .push(elems(s.nb[1], s))
            .push(elems(g.tensor.nb[1], g.tensor));
    }
    let n = sa.ne[1];
    args.push(addr(&a.srcs[1])?).push(n as i32);
    let total = n * (sa.ne[0] + sb.ne[0]);
    // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
    // the shapes passed here (the group's shapes were matched when it was formed).
    unsafe { d.launch_kernel(kid, [total.div_ceil(256) as u32, 1, 1], 256, &args.0)? };
    Ok(2)
}

/// Up to three decode mat-vecs of one weight type and row length on the same activations (the
/// `*_multi` kernels); returns how many leading nodes it launched, 0 when fewer than two fit.
fn mat_vecs(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let Some(first) = group.first() else {
        return Ok(0);
    };
    let [w0, x0] = first.srcs.as_slice() else {
        return Ok(0);
    };
    let (k, m) = (w0.tensor.ne[0], x0.tensor.nrows());
    let Some(wt) = weight_type(w0.tensor.dtype) else {
        return Ok(0);
    };
    let kid = wt.matvec_multi();
    // Rows the plain path would split across a block's warps stay on it, and batches the tile
    // kernels take go to them.
    if m > MATVEC_MAX_COLS
        || mmq_takes(d, m)
        || (k >= K_SPLIT_FROM && wt == kernels::WeightType::Q8_0)
    {
        return Ok(0);
    }
    let n = group
        .iter()
        .take(GROUP_MAX)
        .take_while(|t| joins(first, t))
        .count();
    if n < 2 {
        return Ok(0);
    }
    // Q4_K_M keeps some layers' v projection in Q6_K: q, k and that v still go as one launch.
    let q6_third = n == 2
        && wt == WeightType::Q4_K
        && group
            .get(2)
            .is_some_and(|t| joins_rows(first, t) && t.srcs[0].tensor.dtype == DType::Q6_K);
    let (n, kid) = if q6_third {
        (3, KernelId::MatvecMultiQ4_KQ6_K)
    } else {
        (n, kid)
    };
    let group = &group[..n];
    let outs = group
        .iter()
        .map(|t| rewritten(d, t))
        .collect::<Result<Vec<_>>>()?;
    let mut cache = d.inner.q8.lock();
    let q8 = cache.quantized(d, addr(x0)?, k, m)?;
    let rb2 = q6_third.then(|| group[2].srcs[0].tensor.nb[1] as i64);
    let (a, grid) = multi_args(group, &outs, MemRange::of_buffer(&q8), k, rb2, wt)?;
    // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
    // the shapes passed here (the group's shapes were matched when it was formed).
    unsafe { launch_matvec(d, kid, grid, m, &a, cache).map(|()| n) }
}

/// The leading arguments of the `*_multi` kernels (and of the `*_rope_kv` ones built on them) for
/// the mat-vecs `group` (at most GROUP_MAX) writing `outs`: the weights, the quantized activations
/// `q8`, the outputs, the row length `k`, the row bytes (`rb2`: the third matrix's, where it is of
/// another type) and the row counts; with the grid's block count (types without a kernel of their
/// own count as `wt`).
fn multi_args<'a>(
    group: &[GroupNode<'a>],
    outs: &[MemRange<'a>],
    q8: MemRange<'a>,
    k: usize,
    rb2: Option<i64>,
    wt: WeightType,
) -> Result<(Args<'a>, u32)> {
    let mut a = Args::new();
    let mut rows = [0i32; GROUP_MAX];
    let mut grid = 0u32;
    for i in 0..GROUP_MAX {
        a.push(match group.get(i) {
            Some(t) => Some(addr(&t.srcs[0])?),
            None => None,
        });
    }
    a.push(q8);
    for i in 0..GROUP_MAX {
        a.push(outs.get(i).copied());
    }
    a.push(k as i32).push(group[0].srcs[0].tensor.nb[1] as i64);
    if let Some(rb2) = rb2 {
        a.push(rb2);
    }
    for (i, t) in group.iter().enumerate() {
        let w = t.srcs[0].tensor;
        rows[i] = w.ne[1] as i32;
        let t_wt = weight_type(w.dtype).unwrap_or(wt);
        grid += w.ne[1].div_ceil(t_wt.matvec_rows_per_block()) as u32;
    }
    for r in rows {
        a.push(r);
    }
    Ok((a, grid))
}

/// The q, k and v projections of a decode step, the normal-mode ropes of q and k and the K and V
/// cache writes (an f16 cache) as one `matvec_q4_k_rope_kv` / `matvec_q4_k_q6_k_rope_kv` launch:
/// q and k in Q4_K, v in Q4_K or Q6_K (Q4_K_M), each mat-vec block rotating and storing its own
/// rows; 0 when the seven nodes do not fit it.
fn projections_rope_kv(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let [mq, mk, mv, ra, rb, c, e, ..] = group else {
        return Ok(0);
    };
    if !d.inner.qkv_rope.load(std::sync::atomic::Ordering::Relaxed) {
        return Ok(0);
    }
    let [w0, x0] = mq.srcs.as_slice() else {
        return Ok(0);
    };
    let (k, m) = (w0.tensor.ne[0], x0.tensor.nrows());
    let v_q6 = mv.srcs[0].tensor.dtype == DType::Q6_K;
    let mats_ok = w0.tensor.dtype == DType::Q4_K
        && m <= MATVEC_MAX_COLS
        && !mmq_takes(d, m)
        && joins(mq, mk)
        && if v_q6 {
            joins_rows(mq, mv)
        } else {
            joins(mq, mv)
        };
    if !mats_ok {
        return Ok(0);
    }
    let Some(p) = rope_pair_params(ra, rb) else {
        return Ok(0);
    };
    let Some((c, e)) = cache_writes(rb, c, e) else {
        return Ok(0);
    };
    let (xq, xk, vr) = (ra.srcs[0].tensor, rb.srcs[0].tensor, e.srcs[0].tensor);
    let hd = xq.ne[0];
    let rows = |g: &GroupNode<'_>| g.srcs[0].tensor.ne[1];
    let (n0, n1, n2) = (rows(mq), rows(mk), rows(mv));
    // Every warp of a q or k block owns one row (the epilogue synchronizes the block), and a
    // pair's two rows are neighbours.
    let per = WeightType::Q4_K.matvec_rows_per_block();
    let ok = p.mode == RopeMode::Normal
        && c.tensor.dtype == DType::F16
        && hd % 2 == 0
        && p.n_dims <= hd
        && n0 % per == 0
        && n1 % per == 0
        && same_mem(&ra.srcs[0], &mq.dst)
        && same_mem(&rb.srcs[0], &mk.dst)
        && same_mem(&e.srcs[0], &mv.dst)
        && xq.is_contiguous()
        && xk.is_contiguous()
        && xq.ne[0] * xq.ne[1] == n0
        && xk.ne[0] * xk.ne[1] == n1
        && xq.ne[2] == m
        && xk.ne[2] == m
        && vr.ne[0] == n2
        && vr.nb[1] == n2 * DType::F32.type_size()
        && ra.tensor.is_contiguous()
        && rb.tensor.is_contiguous();
    if !ok {
        return Ok(0);
    }
    let mats = &group[..3];
    let outs = mats
        .iter()
        .map(|t| rewritten(d, t))
        .collect::<Result<Vec<_>>>()?;
    let (yq, yk) = (rewritten(d, ra)?, rewritten(d, rb)?);
    let (kc, vc) = (rewritten(d, c)?, rewritten(d, e)?);
    let ff = match ra.srcs.get(2) {
        Some(f) => Some(addr(f)?),
        None => None,
    };
    let mut cache = d.inner.q8.lock();
    let q8 = cache.quantized(d, addr(x0)?, k, m)?;
    let rb2 = v_q6.then(|| mv.srcs[0].tensor.nb[1] as i64);
    let (mut a, grid) = multi_args(
        mats,
        &outs,
        MemRange::of_buffer(&q8),
        k,
        rb2,
        WeightType::Q4_K,
    )?;
    let corr = p.yarn_corr_dims();
    a.push(yq)
        .push(yk)
        .push(addr(&ra.srcs[1])?)
        .push(hd as i32)
        .push(p.n_dims as i32)
        .push(p.freq_base)
        .push(p.freq_scale)
        .push(ff)
        .push(p.ext_factor)
        .push(p.mscale())
        .push(corr[0])
        .push(corr[1])
        .push(kc)
        .push(elems(c.tensor.nb[1], c.tensor))
        .push(vc)
        .push(elems(e.tensor.nb[1], e.tensor))
        .push(addr(&c.srcs[1])?);
    let kid = if v_q6 {
        KernelId::MatvecRopeKvQ4_KQ6_K
    } else {
        KernelId::MatvecRopeKvQ4_K
    };
    // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
    // the shapes passed here (the group's shapes were matched when it was formed).
    unsafe { launch_matvec(d, kid, grid, m, &a, cache).map(|()| 7) }
}

/// The q and k norms `na`, `nb` (per head), the ropes `ra`, `rb` of their outputs and the K and V
/// cache writes `c`, `e` as one `norm_rope_kv_*` launch (one block per head row, a thread per
/// rope pair); 0 when they do not fit it.
fn norm_rope_kv(d: &HipDevice, [na, nb, ra, rb, c, e]: [&GroupNode<'_>; 6]) -> Result<usize> {
    let Op::RmsNormMul { eps } = na.tensor.op else {
        return Ok(0);
    };
    let Some(p) = rope_pair_params(ra, rb) else {
        return Ok(0);
    };
    let (xa, xb) = (na.srcs[0].tensor, nb.srcs[0].tensor);
    let hd = xa.ne[0];
    let weight_ok = |g: &GroupNode<'_>| {
        let w = g.srcs[1].tensor;
        w.dtype == DType::F32 && w.is_contiguous() && w.nelements() == hd
    };
    let ok = nb.tensor.op == na.tensor.op
        && supported(na)
        && supported(nb)
        && xb.ne[0] == hd
        && hd % 2 == 0
        && hd / 2 <= 1024
        && p.n_dims <= hd
        && na.tensor.is_contiguous()
        && nb.tensor.is_contiguous()
        && weight_ok(na)
        && weight_ok(nb)
        && !same_mem(&nb.srcs[0], &na.dst)
        && same_mem(&ra.srcs[0], &na.dst)
        && same_mem(&rb.srcs[0], &nb.dst)
        && ra.srcs[0].tensor.ne[0] == hd;
    let Some((c, e)) = ok.then(|| cache_writes(rb, c, e)).flatten() else {
        return Ok(0);
    };
    let mut args = Args::new();
    for (n, r, x) in [(na, ra, xa), (nb, rb, xb)] {
        let (nout, rout) = (rewritten(d, n)?, rewritten(d, r)?);
        args.push(addr(&n.srcs[0])?)
            .push(addr(&n.srcs[1])?)
            .push(nout)
            .push(rout)
            .push(elems(x.nb[1], x))
            .push(x.nrows() as i32)
            .push(r.srcs[0].tensor.ne[1] as i32);
    }
    args.push(eps);
    push_rope_params(&mut args, ra, &p)?;
    let kid = push_cache_writes(
        d,
        &mut args,
        c,
        e,
        [KernelId::NormRopeKvF16, KernelId::NormRopeKvF32],
    )?;
    let warp = d.inner.warp as usize;
    let block = (hd / 2).div_ceil(warp) * warp;
    let v = e.srcs[0].tensor;
    // The V rows' cache writes go to blocks after the heads', one value per thread and step: a
    // decode step's 8 at most, a prompt's enough that each thread writes a few values (with 8
    // blocks, 512 threads wrote a 512-token prompt's 262144 values, and the group took 182 us
    // per layer on an H200, Qwen3-30B-A3B shape).
    let v_blocks = (v.ne[0] * v.ne[1]).div_ceil(block).clamp(1, 1024);
    let grid = xa.nrows() + xb.nrows() + v_blocks;
    // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
    // the shapes passed here (the group's shapes were matched when it was formed).
    unsafe { d.launch_kernel(kid, [grid as u32, 1, 1], block as u32, &args.0)? };
    Ok(6)
}

/// `rms_norm(a) * w1`, the `add` of its result and a residual of the same shape, and (when the
/// third node is `rms_norm(sum) * w2`) the next norm, all dense f32 rows of one length, as one
/// `rms_norm_add_f32` launch (one block per row); a decode step's next norm also goes out
/// quantized for the mat-vecs that read it, as the plain decode norm does.
fn norm_add(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let [nrm, add, rest @ ..] = group else {
        return Ok(0);
    };
    if add.tensor.op == nrm.tensor.op {
        if let [_, _, ra, rb, c, e, ..] = group {
            let n = norm_rope_kv(d, [nrm, add, ra, rb, c, e])?;
            if n > 0 {
                return Ok(n);
            }
        }
        return norm_pair(d, nrm, add);
    }
    let Op::RmsNormMul { eps } = nrm.tensor.op else {
        return Ok(0);
    };
    let a = nrm.srcs[0].tensor;
    let (k, m) = (a.ne[0], a.nrows());
    let warp = d.inner.warp as usize;
    let block = (k / 4).div_ceil(warp) * warp;
    let rows_ok = |t: &Tensor| t.dtype == DType::F32 && t.ne == a.ne && t.nb[0] == 4;
    let dense_ok = |t: &Tensor| rows_ok(t) && t.is_contiguous();
    if !(supported(nrm)
        && supported(add)
        && add.tensor.op == Op::Add
        && k % 32 == 0
        && k <= 4 * RMS_Q8_STEPS * block
        && block <= 1024
        && dense_ok(nrm.tensor)
        && dense_ok(add.tensor)
        && rows_ok(a))
    {
        return Ok(0);
    }
    let x = match add.srcs.as_slice() {
        [s0, s1] if same_mem(s0, &nrm.dst) => s1,
        [s0, s1] if same_mem(s1, &nrm.dst) => s0,
        _ => return Ok(0),
    };
    if !rows_ok(x.tensor) {
        return Ok(0);
    }
    let next = rest.first().filter(|t| {
        matches!(t.tensor.op, Op::RmsNormMul { .. })
            && supported(t)
            && same_mem(&t.srcs[0], &add.dst)
            && t.srcs[0].tensor.ne == a.ne
            && t.srcs[0].tensor.is_contiguous()
            && dense_ok(t.tensor)
    });
    let (n_out, y_out) = (addr(&nrm.dst)?, addr(&add.dst)?);
    let h_out = match next {
        Some(t) => Some(addr(&t.dst)?),
        None => None,
    };
    let mut cache = d.inner.q8.lock();
    for o in [Some(n_out), Some(y_out), h_out].into_iter().flatten() {
        cache.written(o.addr(), o.len());
    }
    let quantize = h_out.is_some() && m <= MATVEC_MAX_COLS;
    let h8 = if quantize {
        Some(cache.ensure(d, k, m)?)
    } else {
        None
    };
    let eps2 = match next.map(|t| &t.tensor.op) {
        Some(Op::RmsNormMul { eps }) => *eps,
        _ => 0.0,
    };
    let w2 = match next {
        Some(t) => Some(addr(&t.srcs[1])?),
        None => None,
    };
    let mut args = Args::new();
    args.push(addr(&nrm.srcs[0])?)
        .push(addr(&nrm.srcs[1])?)
        .push(addr(x)?)
        .push(n_out)
        .push(y_out)
        .push(w2)
        .push(h_out)
        .push(h8.as_ref().map(|b| MemRange::of_buffer(b)))
        .push(k as i32)
        .push(elems(a.nb[1], a))
        .push(elems(x.tensor.nb[1], x.tensor))
        .push(eps)
        .push(eps2);
    // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
    // the shapes passed here (the group's shapes were matched when it was formed).
    unsafe {
        d.launch_kernel(
            KernelId::RmsNormAddF32,
            [m as u32, 1, 1],
            block.max(warp) as u32,
            &args.0,
        )?
    };
    if let (Some(h), true) = (h_out, quantize) {
        cache.holds(&h, k, m);
    }
    Ok(if next.is_some() { 3 } else { 2 })
}

/// Two `rms_norm * w` of the same epsilon over rows of one length, dense outputs (Gemma 3's
/// per-head q and k norms), as one `rms_norm2_f32` launch: one block per row of either.
fn norm_pair(d: &HipDevice, a: &GroupNode<'_>, b: &GroupNode<'_>) -> Result<usize> {
    let (Op::RmsNormMul { eps }, xa, xb) = (&a.tensor.op, a.srcs[0].tensor, b.srcs[0].tensor)
    else {
        return Ok(0);
    };
    let ok = b.tensor.op == a.tensor.op
        && supported(a)
        && supported(b)
        && xa.ne[0] == xb.ne[0]
        && a.tensor.is_contiguous()
        && b.tensor.is_contiguous()
        && !same_mem(&b.srcs[0], &a.dst);
    if !ok {
        return Ok(0);
    }
    let mut args = Args::new();
    let mut rows = 0;
    for (i, (g, x)) in [(a, xa), (b, xb)].into_iter().enumerate() {
        let out = rewritten(d, g)?;
        args.push(addr(&g.srcs[0])?)
            .push(addr(&g.srcs[1])?)
            .push(out)
            .push(elems(x.nb[1], x));
        if i == 0 {
            args.push(x.nrows() as i32);
        }
        rows += x.nrows();
    }
    let warp = d.inner.warp as usize;
    let block = (xa.ne[0] / 4).div_ceil(warp) * warp;
    args.push(xa.ne[0] as i32).push(*eps);
    // SAFETY: the memory arguments are the grouped nodes' tensors, sized by the scheduler for
    // the shapes passed here (the group's shapes were matched when it was formed).
    unsafe {
        d.launch_kernel(
            KernelId::RmsNorm2F32,
            [rows as u32, 1, 1],
            block.clamp(warp, 1024) as u32,
            &args.0,
        )?
    };
    Ok(2)
}
