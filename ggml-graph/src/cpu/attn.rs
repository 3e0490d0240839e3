//! CPU kernels for rotary embeddings, masked softmax and fused (flash-style) attention.

use rayon::prelude::*;

use super::{for_rows, out_f32, unflatten, unsupported, CpuBackend, SrcView};
use crate::error::Result;
use crate::tensor::{yarn_ramp, AttnParams, DType, RopeMode, RopeParams, Tensor};

pub(crate) fn rope(
    t: &Tensor,
    out: &mut [u8],
    x: &SrcView<'_>,
    pos: &SrcView<'_>,
    ff: Option<&SrcView<'_>>,
    p: &RopeParams,
) -> Result<()> {
    let xa = x.f32s()?;
    let pa = pos.i32s()?;
    let ffa = match ff {
        Some(f) => Some(f.f32s()?),
        None => None,
    };
    let o = out_f32(t, out)?;
    let (ne0, ne1) = (t.ne[0], t.ne[1]);
    let half = p.n_dims / 2;
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    let corr = p.yarn_corr_dims();
    let mscale = p.mscale();
    // One task per token: the angles depend on the position only, so their sines and cosines
    // are computed once for all heads of the token.
    for_rows(o, ne0 * ne1, |r, orows| {
        let (i2, i3) = (r % t.ne[2].max(1), r / t.ne[2].max(1));
        let position = pa[i2 * pos.t.nb[0] / 4] as f32;
        let mut theta = position;
        let mut sc = Vec::with_capacity(half);
        for i in 0..half {
            // ggml's order of operations: frequency factor, then linear scale, then the YaRN
            // blend of the scaled (interpolated) and trained (extrapolated) angles.
            let extrap = match ffa {
                Some(f) => theta / f[i],
                None => theta,
            };
            let interp = p.freq_scale * extrap;
            // The fused multiply-adds are where ggml's build (GCC contracting `a*b + c*d` to
            // fma(a, b, c*d)) puts them: with them the rotation is bit-exact with llama.cpp's.
            let th = if p.ext_factor != 0.0 {
                let mix = yarn_ramp(corr, i) * p.ext_factor;
                interp.mul_add(1.0 - mix, extrap * mix)
            } else {
                interp
            };
            sc.push((th.sin() * mscale, th.cos() * mscale));
            theta *= theta_scale;
        }
        for (i1, orow) in orows.chunks_exact_mut(ne0).enumerate() {
            let src = x.row(xa, i1, i2, i3);
            for (i, &(sin, cos)) in sc.iter().enumerate() {
                let (a, b) = match p.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (src[a], src[b]);
                orow[a] = x0.mul_add(cos, -(x1 * sin));
                orow[b] = x0.mul_add(sin, x1 * cos);
            }
            orow[p.n_dims..].copy_from_slice(&src[p.n_dims..]);
        }
    });
    Ok(())
}

pub(crate) fn soft_max(
    t: &Tensor,
    out: &mut [u8],
    a: &SrcView<'_>,
    mask: Option<&SrcView<'_>>,
    scale: f32,
) -> Result<()> {
    let aa = a.f32s()?;
    let ma = match mask {
        Some(m) => Some((m, m.f32s()?)),
        None => None,
    };
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0].max(1);
    for_rows(o, ne0, |r, orow| {
        let (i1, i2, i3) = unflatten(r, &t.ne);
        let src = a.row(aa, i1, i2, i3);
        let mrow = ma.map(|(m, all)| m.row(all, i1, i2 % m.t.ne[2], i3 % m.t.ne[3]));
        let mut max = f32::NEG_INFINITY;
        for (i, (o, &v)) in orow.iter_mut().zip(src).enumerate() {
            *o = v * scale + mrow.map_or(0.0, |m| m[i]);
            max = max.max(*o);
        }
        if max == f32::NEG_INFINITY {
            orow.fill(0.0);
            return;
        }
        let mut sum = 0.0f64;
        for o in orow.iter_mut() {
            *o = (*o - max).exp();
            sum += *o as f64;
        }
        let inv = (1.0 / sum) as f32;
        orow.iter_mut().for_each(|o| *o *= inv);
    });
    Ok(())
}

/// Query heads per KV head the kernel handles (real models use at most 16).
const MAX_GROUP: usize = 64;

thread_local! {
    /// Per-thread attention scratch (scores, converted K and V rows), grown once and reused.
    static ATTN_SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Each task handles one token and one KV head with all the query heads that share it, so each
/// K and V row is converted once per group: scores first, then an exact softmax, then the
/// weighted sum of V rows.
pub(crate) fn attention(
    be: &CpuBackend,
    t: &Tensor,
    out: &mut [u8],
    srcs: &[SrcView<'_>],
    p: &AttnParams,
) -> Result<()> {
    let (q, k, v, pos) = (&srcs[0], &srcs[1], &srcs[2], &srcs[3]);
    let qa = q.f32s()?;
    let pa = pos.i32s()?;
    let (extra, sinks) = split_sinks(srcs, 4, p)?;
    let ma = match extra.first() {
        Some(m) => Some((m, m.f32s()?)),
        None => None,
    };
    let (n_head, n_kv_head, n_kv) = (q.t.ne[1], k.t.ne[1], k.t.ne[2]);
    let group = n_head / n_kv_head;
    let (d, dv) = (q.t.ne[0], v.t.ne[0]);
    if pa.iter().any(|&x| x < 0) {
        return Err(unsupported(t, "negative query position".into()));
    }
    if group > MAX_GROUP {
        return Err(unsupported(
            t,
            format!("{group} query heads per kv head (at most {MAX_GROUP})"),
        ));
    }
    let o = out_f32(t, out)?;
    let simd = be.simd();
    o.par_chunks_mut(dv * group)
        .enumerate()
        .for_each(|(r, ochunk)| {
            let (kvh, tok) = (r % n_kv_head, r / n_kv_head);
            let qpos = pa[tok * pos.t.nb[0] / 4] as usize;
            let hi = if p.causal { (qpos + 1).min(n_kv) } else { n_kv };
            let order = if q.t.ne[2] >= 2 && d % 16 == 0 {
                SumOrder::Lanes16
            } else {
                SumOrder::Lanes64
            };
            let mrow = ma.map(|(m, all)| m.row(all, tok, 0, 0));
            let task = Task {
                kvh,
                tok,
                qpos,
                hi,
                mrow,
                order,
                rows: None,
                sinks,
            };
            attend_task(q, k, v, qa, group, p, simd, &task, ochunk);
        });
    Ok(())
}

/// [`Op::PagedAttention`](crate::Op::PagedAttention): [`attention`]'s arithmetic with key
/// position `j` of a token's sequence read from pool slot `table[j / block_size] * block_size +
/// j % block_size`.
pub(crate) fn paged_attention(
    be: &CpuBackend,
    t: &Tensor,
    out: &mut [u8],
    srcs: &[SrcView<'_>],
    p: &AttnParams,
    block_size: usize,
) -> Result<()> {
    let (q, k, v) = (&srcs[0], &srcs[1], &srcs[2]);
    let qa = q.f32s()?;
    let pa = srcs[3].i32s()?;
    let sa = srcs[4].i32s()?;
    let ta = srcs[5].i32s()?;
    let (_, sinks) = split_sinks(srcs, 6, p)?;
    let (n_head, n_kv_head, n_slots) = (q.t.ne[1], k.t.ne[1], k.t.ne[2]);
    let (max_blocks, n_seqs) = (srcs[5].t.ne[0], srcs[5].t.ne[1]);
    let group = n_head / n_kv_head;
    let (d, dv) = (q.t.ne[0], v.t.ne[0]);
    if group > MAX_GROUP {
        return Err(unsupported(
            t,
            format!("{group} query heads per kv head (at most {MAX_GROUP})"),
        ));
    }
    let n_blocks = n_slots / block_size.max(1);
    // Every table entry a query reads is checked here, so the tasks cannot index out of range.
    for tok in 0..q.t.ne[2] {
        let (col, qpos) = (sa[2 * tok], pa[tok]);
        if col < 0 || col as usize >= n_seqs || qpos < 0 {
            return Err(unsupported(
                t,
                format!("token {tok}: sequence column {col} of {n_seqs}, position {qpos}"),
            ));
        }
        let used = qpos as usize / block_size + 1;
        let table = &ta[col as usize * max_blocks..][..max_blocks];
        if used > max_blocks
            || table[..used]
                .iter()
                .any(|&b| b < 0 || b as usize >= n_blocks)
        {
            return Err(unsupported(
                t,
                format!(
                    "token {tok} at position {qpos}: block table of sequence {col} reaches \
                     outside the {n_blocks} blocks of the pool"
                ),
            ));
        }
    }
    let o = out_f32(t, out)?;
    let simd = be.simd();
    o.par_chunks_mut(dv * group)
        .enumerate()
        .for_each(|(r, ochunk)| {
            let (kvh, tok) = (r % n_kv_head, r / n_kv_head);
            let qpos = pa[tok] as usize;
            let col = sa[2 * tok] as usize;
            let single = sa[2 * tok + 1] != 0;
            let order = if !single && d % 16 == 0 {
                SumOrder::Lanes16
            } else {
                SumOrder::Lanes64
            };
            let task = Task {
                kvh,
                tok,
                qpos,
                hi: qpos + 1,
                mrow: None,
                order,
                rows: Some((&ta[col * max_blocks..(col + 1) * max_blocks], block_size)),
                sinks,
            };
            attend_task(q, k, v, qa, group, p, simd, &task, ochunk);
        });
    Ok(())
}

/// Where one task of the attention ops reads: its KV head, query token and key range, and for
/// paged pools the sequence's block table and block size.
struct Task<'a> {
    kvh: usize,
    tok: usize,
    qpos: usize,
    hi: usize,
    mrow: Option<&'a [f32]>,
    order: SumOrder,
    rows: Option<(&'a [i32], usize)>,
    sinks: Option<&'a [f32]>,
}

/// The operands after the first `fixed` of an attention node, without the sinks, and the
/// sinks' values (one per query head) when the node has them.
fn split_sinks<'s, 'a>(
    srcs: &'s [SrcView<'a>],
    fixed: usize,
    p: &AttnParams,
) -> Result<(&'s [SrcView<'a>], Option<&'s [f32]>)> {
    let rest = srcs.get(fixed..).unwrap_or(&[]);
    if !p.sinks {
        return Ok((rest, None));
    }
    match rest.split_last() {
        Some((s, extra)) => Ok((extra, Some(s.f32s()?))),
        None => Ok((rest, None)),
    }
}

#[allow(clippy::too_many_arguments)]
fn attend_task(
    q: &SrcView<'_>,
    k: &SrcView<'_>,
    v: &SrcView<'_>,
    qa: &[f32],
    group: usize,
    p: &AttnParams,
    simd: crate::quant::Simd,
    task: &Task<'_>,
    ochunk: &mut [f32],
) {
    let lo = match p.window {
        Some(w) if w > 0 => (task.qpos + 1).saturating_sub(w),
        _ => 0,
    };
    let hi = task.hi;
    ochunk.fill(0.0);
    if hi <= lo {
        return;
    }
    let job = Job {
        q,
        k,
        v,
        qa,
        kvh: task.kvh,
        tok: task.tok,
        group,
        lo,
        hi,
        mrow: task.mrow,
        p,
        simd,
        order: task.order,
        rows: task.rows,
        sinks: task.sinks,
    };
    ATTN_SCRATCH.with(|cell| {
        let mut buf = cell.borrow_mut();
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx") && std::is_x86_feature_detected!("fma") {
            // SAFETY: the CPU has AVX and FMA (checked just above).
            unsafe { attend_fma(&job, &mut buf, ochunk) };
            return;
        }
        attend::<false>(&job, &mut buf, ochunk);
    });
}

/// One task of [`attention`]: one query token, one KV head and its query heads.
struct Job<'a, 'b> {
    q: &'a SrcView<'b>,
    k: &'a SrcView<'b>,
    v: &'a SrcView<'b>,
    qa: &'a [f32],
    kvh: usize,
    tok: usize,
    group: usize,
    lo: usize,
    hi: usize,
    mrow: Option<&'a [f32]>,
    p: &'a AttnParams,
    simd: crate::quant::Simd,
    order: SumOrder,
    /// Paged pools: the block table and block size mapping key positions to pool rows.
    rows: Option<(&'a [i32], usize)>,
    /// Attention sinks, one logit per query head.
    sinks: Option<&'a [f32]>,
}

impl Job<'_, '_> {
    /// The pool row of key position `j`.
    #[inline(always)]
    fn row(&self, j: usize) -> usize {
        match self.rows {
            Some((table, bs)) => table[j / bs] as usize * bs + j % bs,
            None => j,
        }
    }
}

/// [`attend`] compiled with AVX and FMA instructions (`f32::mul_add` is then one instruction
/// instead of a libm call, and the lane chains vector lanes).
///
/// # Safety
/// The CPU must support AVX and FMA.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx,fma")]
unsafe fn attend_fma(job: &Job<'_, '_>, buf: &mut Vec<f32>, out: &mut [f32]) {
    attend::<true>(job, buf, out)
}

/// Scores, softmax and the weighted sum of V rows, each rounded and summed the way llama.cpp's
/// CPU backend does on this kind of machine (attention as two matrix products): q rounded to
/// the K cache type and the probabilities to the V cache type; the products summed in
/// [`SumOrder`]; exponentials as ggml's AVX-512 `ggml_v_expf`, summed per 16 key positions. With
/// that the attention output is bit-exact with llama.cpp's given the same inputs, so small
/// differences elsewhere are not amplified here.
#[inline(always)]
fn attend<const FMA: bool>(job: &Job<'_, '_>, buf: &mut Vec<f32>, out: &mut [f32]) {
    let (k, v, p, group, lo, hi) = (job.k, job.v, job.p, job.group, job.lo, job.hi);
    let (d, dv) = (job.q.t.ne[0], v.t.ne[0]);
    let (krb, vrb) = (k.t.row_bytes(), v.t.row_bytes());
    let n = hi - lo;
    let lanes = job.order.lanes();
    let need = group * n + group * d + d + dv + lanes * group * dv;
    if buf.len() < need {
        buf.resize(need, 0.0);
    }
    let (scores, rest) = buf.split_at_mut(group * n);
    let (qrows, rest) = rest.split_at_mut(group * d);
    let (krow, rest) = rest.split_at_mut(d);
    let (vrow, rest) = rest.split_at_mut(dv);
    let acc = &mut rest[..lanes * group * dv];
    for (g, qr) in qrows.chunks_exact_mut(d).enumerate() {
        qr.copy_from_slice(&job.q.row(job.qa, job.kvh * group + g, job.tok, 0)[..d]);
        round_to(k.t.dtype, qr);
    }
    for j in lo..hi {
        let ko = k.off(job.kvh, job.row(j), 0);
        to_f32_row(job.simd, k.t.dtype, &k.data[ko..ko + krb], krow);
        let bias = job.mrow.map_or(0.0, |m| m[j]);
        let mut put = |g: usize, dot: f32| {
            let s = p.scale * dot;
            let s = match p.softcap {
                Some(c) => super::ops::softcap(s, c),
                None => s,
            };
            scores[g * n + (j - lo)] = s + bias;
        };
        let mut g0 = 0;
        // Four query heads per pass over the key row on the vector path (independent chains).
        #[cfg(target_arch = "x86_64")]
        if FMA && job.order == SumOrder::Lanes16 && d % 16 == 0 {
            while g0 + 4 <= group {
                let q4 = |i: usize| &qrows[(g0 + i) * d..(g0 + i + 1) * d];
                // SAFETY: `FMA` is only set on the `attend_fma` path (AVX and FMA present).
                let dots = unsafe { lane_dot16x4_avx(krow, [q4(0), q4(1), q4(2), q4(3)]) };
                for (i, acc) in dots.iter().enumerate() {
                    put(g0 + i, reduce16(acc));
                }
                g0 += 4;
            }
        }
        for g in g0..group {
            put(
                g,
                ordered_dot::<FMA>(job.order, krow, &qrows[g * d..(g + 1) * d]),
            );
        }
    }
    for g in 0..group {
        let sg = &mut scores[g * n..(g + 1) * n];
        let sink = job.sinks.map(|s| s[job.kvh * group + g]);
        let max = sg.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let max = sink.map_or(max, |s| max.max(s));
        if max == f32::NEG_INFINITY {
            sg.fill(0.0);
            continue;
        }
        // ggml_vec_soft_max_f32: 16 positions per step (aligned to key position 0), each
        // step's sum reduced in f32 and added to an f64 total.
        let mut sum = 0.0f64;
        for c in lo / 16..hi.div_ceil(16) {
            let mut e = [0f32; 16];
            for (l, e) in e.iter_mut().enumerate() {
                let j = 16 * c + l;
                if (lo..hi).contains(&j) {
                    let x = &mut sg[j - lo];
                    *x = ggml_expf(*x - max);
                    *e = *x;
                }
            }
            sum += reduce16(&e) as f64;
        }
        // The sink joins the sum as ggml's softmax adds it (libm `expf`, not the vector one).
        if let Some(s) = sink {
            sum += f64::from((s - max).exp());
        }
        let inv = (1.0 / sum) as f32;
        sg.iter_mut().for_each(|x| *x *= inv);
        round_to(v.t.dtype, sg);
    }
    // Weighted sum of V rows: one fused chain per lane (key position modulo the lane count),
    // lanes reduced at the end. Zero weights (masked positions) leave a chain unchanged.
    acc.fill(0.0);
    let gdv = group * dv;
    for j in lo..hi {
        let vo = v.off(job.kvh, job.row(j), 0);
        to_f32_row(job.simd, v.t.dtype, &v.data[vo..vo + vrb], vrow);
        let lane = &mut acc[(j % lanes) * gdv..(j % lanes + 1) * gdv];
        for (g, a) in lane.chunks_exact_mut(dv).enumerate() {
            let w = scores[g * n + (j - lo)];
            if w != 0.0 {
                for (a, &x) in a.iter_mut().zip(vrow.iter()) {
                    *a = w.mul_add(x, *a);
                }
            }
        }
    }
    // The lanes of every output reduced as `SumOrder::finish` does, a whole row of outputs at
    // a time (lane `l` of all outputs is the row `acc[l * gdv..]`).
    if job.order == SumOrder::Lanes64 {
        let (lo32, hi32) = acc.split_at_mut(32 * gdv);
        for l in 0..16 {
            let (a0, a1) = (l * gdv, (16 + l) * gdv);
            for i in 0..gdv {
                lo32[a0 + i] = (lo32[a0 + i] + hi32[a0 + i]) + (lo32[a1 + i] + hi32[a1 + i]);
            }
        }
    }
    let row = |l: usize| l * gdv..(l + 1) * gdv;
    for l in 0..8 {
        let (x, y) = acc.split_at_mut(8 * gdv);
        for (a, &b) in x[row(l)].iter_mut().zip(&y[row(l)]) {
            *a += b;
        }
    }
    for l in 0..4 {
        let (x, y) = acc.split_at_mut(4 * gdv);
        for (a, &b) in x[row(l)].iter_mut().zip(&y[row(l)]) {
            *a += b;
        }
    }
    for (i, o) in out.iter_mut().enumerate() {
        *o = (acc[i] + acc[2 * gdv + i]) + (acc[gdv + i] + acc[3 * gdv + i]);
    }
}

/// The order in which llama.cpp's x86 CPU backend sums an f16 matrix product: tinyBLAS for
/// batches of two or more columns (16 lanes, one fused chain each) or `ggml_vec_dot_f16` for
/// one column (64 lanes in four 16-wide accumulators).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SumOrder {
    Lanes16,
    Lanes64,
}

impl SumOrder {
    fn lanes(self) -> usize {
        match self {
            SumOrder::Lanes16 => 16,
            SumOrder::Lanes64 => 64,
        }
    }

    /// Combines the lane partials as the x86 build does.
    #[inline(always)]
    fn finish(self, acc: &[f32]) -> f32 {
        match self {
            SumOrder::Lanes16 => reduce16(acc),
            SumOrder::Lanes64 => {
                let mut r = [0f32; 16];
                for (l, r) in r.iter_mut().enumerate() {
                    *r = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
                }
                reduce16(&r)
            }
        }
    }
}

/// `_mm512_reduce_add_ps` as GCC implements it: halves, quarters, then pairs.
#[inline(always)]
fn reduce16(v: &[f32]) -> f32 {
    let mut s8 = [0f32; 8];
    for (i, s) in s8.iter_mut().enumerate() {
        *s = v[i] + v[i + 8];
    }
    let s4 = [s8[0] + s8[4], s8[1] + s8[5], s8[2] + s8[6], s8[3] + s8[7]];
    (s4[0] + s4[2]) + (s4[1] + s4[3])
}

/// Dot product in `order`; lengths that are not a multiple of 64 finish as `ggml_vec_dot_f16`
/// does (the tail added in f64). `FMA`: called from [`attend_fma`] (AVX and FMA present).
#[inline(always)]
fn ordered_dot<const FMA: bool>(order: SumOrder, a: &[f32], b: &[f32]) -> f32 {
    let mut s = match order {
        SumOrder::Lanes16 => order.finish(&lane_dot::<16, FMA>(a, b)),
        SumOrder::Lanes64 => order.finish(&lane_dot::<64, FMA>(a, b)),
    } as f64;
    let main = a.len() / order.lanes() * order.lanes();
    for (&x, &y) in a[main..].iter().zip(&b[main..]) {
        s += (x * y) as f64;
    }
    s as f32
}

/// One fused chain per lane `i % L` over the whole `L`-value chunks of `a` and `b`.
#[inline(always)]
fn lane_dot<const L: usize, const FMA: bool>(a: &[f32], b: &[f32]) -> [f32; L] {
    #[cfg(target_arch = "x86_64")]
    if FMA {
        // SAFETY: `FMA` is only set on the `attend_fma` path, which requires AVX and FMA.
        return unsafe { lane_dot_avx::<L>(a, b) };
    }
    let mut acc = [0f32; L];
    for (x, y) in a.chunks_exact(L).zip(b.chunks_exact(L)) {
        for l in 0..L {
            acc[l] = x[l].mul_add(y[l], acc[l]);
        }
    }
    acc
}

/// [`lane_dot`] for 16 lanes of one row `a` with four rows `b` (lengths a multiple of 16, as
/// [`ordered_dot`] then has no tail): eight independent chains.
///
/// # Safety
/// The CPU must support AVX and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx,fma")]
unsafe fn lane_dot16x4_avx(a: &[f32], b: [&[f32]; 4]) -> [[f32; 16]; 4] {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let n = b.iter().fold(a.len(), |n, r| n.min(r.len())) / 16 * 16;
    let mut i = 0;
    while i < n {
        // SAFETY: values i..i + 16 are inside `a` and every `b` row (i + 16 <= n).
        unsafe {
            let x0 = _mm256_loadu_ps(a.as_ptr().add(i));
            let x1 = _mm256_loadu_ps(a.as_ptr().add(i + 8));
            for (acc, row) in acc.iter_mut().zip(&b) {
                acc[0] = _mm256_fmadd_ps(x0, _mm256_loadu_ps(row.as_ptr().add(i)), acc[0]);
                acc[1] = _mm256_fmadd_ps(x1, _mm256_loadu_ps(row.as_ptr().add(i + 8)), acc[1]);
            }
        }
        i += 16;
    }
    let mut out = [[0f32; 16]; 4];
    for (o, acc) in out.iter_mut().zip(&acc) {
        // SAFETY: each output row holds 16 floats.
        unsafe {
            _mm256_storeu_ps(o.as_mut_ptr(), acc[0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(8), acc[1]);
        }
    }
    out
}

/// [`lane_dot`] with eight lanes per AVX register (`L` a multiple of 8, at most 64).
///
/// # Safety
/// The CPU must support AVX and FMA.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx,fma")]
unsafe fn lane_dot_avx<const L: usize>(a: &[f32], b: &[f32]) -> [f32; L] {
    use std::arch::x86_64::*;
    let mut acc = [_mm256_setzero_ps(); 8];
    let nv = L / 8;
    for (x, y) in a.chunks_exact(L).zip(b.chunks_exact(L)) {
        for (v, acc) in acc.iter_mut().enumerate().take(nv) {
            // SAFETY: lanes 8v..8v+8 are inside both `L`-long chunks (8 nv = L).
            unsafe {
                let xv = _mm256_loadu_ps(x.as_ptr().add(8 * v));
                let yv = _mm256_loadu_ps(y.as_ptr().add(8 * v));
                *acc = _mm256_fmadd_ps(xv, yv, *acc);
            }
        }
    }
    let mut out = [0f32; L];
    for (v, acc) in acc.iter().enumerate().take(nv) {
        // SAFETY: `out` holds `L = 8 nv` floats.
        unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * v), *acc) };
    }
    out
}

/// ggml's AVX-512 `ggml_v_expf` for one value: exp(x) from a degree-5 polynomial on the reduced
/// argument, scaled by 2^n (flushing to 0 or infinity beyond |n| > 192).
#[inline(always)]
fn ggml_expf(x: f32) -> f32 {
    let c = |bits: u32| f32::from_bits(bits);
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = x.mul_add(c(0x3fb8_aa3b), r);
    let n = z - r;
    let b = (-n).mul_add(c(0x35bf_be8e), (-n).mul_add(c(0x3f31_7200), x));
    let u = b * b;
    let j = c(0x3c07_2010)
        .mul_add(b, c(0x3d2b_9f17))
        .mul_add(u, c(0x3e2a_af33).mul_add(b, c(0x3eff_fedb)))
        .mul_add(u, c(0x3f7f_fff6).mul_add(b, 1.0));
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    // scalef: j * 2^n rounded once (the f64 product is exact; |n| <= 192 is a normal f64).
    let two_n = f64::from_bits(((n as i64 + 1023) as u64) << 52);
    (j as f64 * two_n) as f32
}

/// Rounds `x` to the precision of `ty` (F16 or BF16; F32 leaves it as is, and so does Q8_0: the
/// queries and probabilities stay f32 against a Q8_0 cache, whose rows are dequantized).
fn round_to(ty: DType, x: &mut [f32]) {
    match ty {
        DType::F16 => {
            // Through F16C where the CPU has it (round to nearest even either way).
            use half::slice::HalfFloatSliceExt;
            let mut h = [half::f16::ZERO; 64];
            for c in x.chunks_mut(64) {
                let h = &mut h[..c.len()];
                h.convert_from_f32_slice(c);
                h.convert_to_f32_slice(c);
            }
        }
        DType::BF16 => x
            .iter_mut()
            .for_each(|v| *v = half::bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

/// Converts a KV row (F32/F16/BF16 bytes or Q8_0 blocks) to f32.
fn to_f32_row(simd: crate::quant::Simd, ty: DType, src: &[u8], dst: &mut [f32]) {
    if crate::quant::convert_row(simd, ty, src, dst) {
        return;
    }
    if ty.is_quantized() {
        // The graph admits only whole Q8_0 blocks per row, so the sizes always agree.
        let _ = gguf::quants::dequantize_row(ty, src, dst);
        return;
    }
    {
        for (d, c) in dst.iter_mut().zip(src.chunks_exact(ty.type_size())) {
            *d = super::ops::load_scalar(ty, c);
        }
    }
}
