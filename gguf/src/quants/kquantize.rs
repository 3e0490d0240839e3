//! Quantization of f32 data into the K-quant types (Q2_K..Q6_K, Q8_K), following the search
//! strategies of ggml's reference quantizers (least-squares scale/min fits over a sweep of
//! candidate scales), so quality matches files made by `llama-quantize` without an imatrix.

#![allow(
    clippy::needless_range_loop,
    reason = "block layouts interleave several arrays by index; iterators would obscure them"
)]

use super::blocks::*;
use crate::types::QK_K;

/// Values this small are treated as an all-zero group.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Round half to even, as ggml's `nearest_int` does.
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    if v.abs() < 4_194_303.0 {
        nearest_small(v)
    } else {
        v.round_ties_even() as i32
    }
}

/// [`nearest_int`] for `|v| < 2^22`: ggml's own trick (adding 1.5 * 2^23 rounds to an integer,
/// ties to even, in the low mantissa bits). `round_ties_even` is a libm call on baseline x86-64
/// (no SSE4.1), a fifth of `rocmforge synth`'s time, and keeps loops from vectorizing.
#[inline(always)]
fn nearest_small(v: f32) -> i32 {
    let f = v + 12_582_912.0;
    (f.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// Fits `x ~ scale * L - min` with `L` in `0..=nmax`, minimizing weighted error over a sweep of
/// candidate inverse scales. Returns `(scale, min)` with `min >= 0`.
#[allow(
    clippy::too_many_arguments,
    reason = "mirrors the search's tuning knobs one to one"
)]
fn fit_scale_min(
    x: &[f32],
    w: &[f32],
    nmax: i32,
    l_out: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        return (0.0, -min);
    }
    let err = |d: f32| if use_mad { d.abs() } else { d * d };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l_out[i] = l as u8;
        best += w[i] * err(scale * l as f32 + min - x[i]);
    }
    let mut aux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sl, mut sl2, mut sxl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            aux[i] = l as u8;
            let lf = l as f32;
            sl += w[i] * lf;
            sl2 += w[i] * lf * lf;
            sxl += w[i] * lf * x[i];
        }
        let det = sum_w * sl2 - sl * sl;
        if det > 0.0 {
            let mut this_scale = (sum_w * sxl - sum_x * sl) / det;
            let mut this_min = (sl2 * sum_x - sl * sxl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sxl / sl2;
            }
            let mut cur = 0f32;
            for i in 0..n {
                cur += w[i] * err(this_scale * f32::from(aux[i]) + this_min - x[i]);
            }
            if cur < best {
                l_out.copy_from_slice(&aux[..n]);
                best = cur;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// [`fit_scale_min`] (squared error) of the eight 32-value groups of a super-block at once:
/// group `j` is lane `j` of every step, each lane doing exactly the scalar fit's operations in
/// its order, so the results are the same bits while the compiler runs the lanes side by side
/// (the scalar fit is three dependent float sums, bound by add latency). `xt[i][j]` and
/// `wt[i][j]` are value `i` of group `j` and its weight; codes go to `lt` alike.
fn fit_scale_min8(
    xt: &[[f32; 8]; 32],
    wt: &[[f32; 8]; 32],
    nmax: i32,
    lt: &mut [[u8; 8]; 32],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> ([f32; 8], [f32; 8]) {
    let mut min = xt[0];
    let mut max = xt[0];
    let mut sum_w = wt[0];
    let mut sum_x = [0f32; 8];
    for j in 0..8 {
        sum_x[j] = sum_w[j] * xt[0][j];
    }
    for i in 1..32 {
        for j in 0..8 {
            min[j] = min[j].min(xt[i][j]);
            max[j] = max[j].max(xt[i][j]);
            sum_w[j] += wt[i][j];
            sum_x[j] += wt[i][j] * xt[i][j];
        }
    }
    for m in &mut min {
        if *m > 0.0 {
            *m = 0.0;
        }
    }
    // A flat group (max == min) gets codes 0 and (0, -min) as in the scalar fit; its lane computes
    // with infinities meanwhile, never read.
    let min0 = min;
    // `nearest_int(v).clamp(0, nmax)` without the libm call: out of `nearest_small`'s range
    // (a range so small that `iscale` overflows) the clamp decides alone, NaN giving 0.
    let quant = |iscale: f32, x: f32, min: f32| {
        let v = iscale * (x - min);
        if v.abs() < 4_194_303.0 {
            nearest_small(v).clamp(0, nmax)
        } else if v > 0.0 {
            nmax
        } else {
            0
        }
    };
    let mut iscale = [0f32; 8];
    let mut scale = [0f32; 8];
    let mut best = [0f32; 8];
    for j in 0..8 {
        iscale[j] = nmax as f32 / (max[j] - min[j]);
        scale[j] = 1.0 / iscale[j];
    }
    for i in 0..32 {
        for j in 0..8 {
            let l = quant(iscale[j], xt[i][j], min[j]);
            lt[i][j] = l as u8;
            let d = scale[j] * l as f32 + min[j] - xt[i][j];
            best[j] += wt[i][j] * (d * d);
        }
    }
    let mut aux = [[0u8; 8]; 32];
    for is in 0..=nstep {
        let (mut sl, mut sl2, mut sxl) = ([0f32; 8], [0f32; 8], [0f32; 8]);
        for j in 0..8 {
            // `min` as the last accepted fit left it, as in the scalar fit.
            iscale[j] = (rmin + rdelta * is as f32 + nmax as f32) / (max[j] - min[j]);
        }
        for i in 0..32 {
            for j in 0..8 {
                let l = quant(iscale[j], xt[i][j], min[j]);
                aux[i][j] = l as u8;
                let lf = l as f32;
                sl[j] += wt[i][j] * lf;
                sl2[j] += wt[i][j] * lf * lf;
                sxl[j] += wt[i][j] * lf * xt[i][j];
            }
        }
        let mut this_scale = [0f32; 8];
        let mut this_min = [0f32; 8];
        let mut ok = [false; 8];
        for j in 0..8 {
            let det = sum_w[j] * sl2[j] - sl[j] * sl[j];
            ok[j] = det > 0.0;
            this_scale[j] = (sum_w[j] * sxl[j] - sum_x[j] * sl[j]) / det;
            this_min[j] = (sl2[j] * sum_x[j] - sl[j] * sxl[j]) / det;
            if this_min[j] > 0.0 {
                this_min[j] = 0.0;
                this_scale[j] = sxl[j] / sl2[j];
            }
        }
        let mut cur = [0f32; 8];
        for i in 0..32 {
            for j in 0..8 {
                let d = this_scale[j] * f32::from(aux[i][j]) + this_min[j] - xt[i][j];
                cur[j] += wt[i][j] * (d * d);
            }
        }
        let mut take = [false; 8];
        for j in 0..8 {
            take[j] = ok[j] && cur[j] < best[j];
            if take[j] {
                best[j] = cur[j];
                scale[j] = this_scale[j];
                min[j] = this_min[j];
            }
        }
        if take.iter().any(|&t| t) {
            for (l, a) in lt.iter_mut().zip(&aux) {
                for j in 0..8 {
                    if take[j] {
                        l[j] = a[j];
                    }
                }
            }
        }
    }
    let mut neg_min = [0f32; 8];
    for j in 0..8 {
        if max[j] == min0[j] {
            scale[j] = 0.0;
            min[j] = min0[j];
            for l in lt.iter_mut() {
                l[j] = 0;
            }
        }
        neg_min[j] = -min[j];
    }
    (scale, neg_min)
}

/// Fits `x ~ scale * L` with `L` in `-nmax..nmax`, weights `x^2`, sweeping 19 candidate scales
/// around the max-based one, for the sixteen 16-value groups of a Q6_K super-block at once:
/// `xt[i][j]` is value `i` of group `j`. Returns the scales (signed); the codes are not kept
/// (Q6_K requantizes with the stored scales). Lane `j` of every step does ggml's scalar fit's
/// operations on group `j` in its order, so the bits are the same (see [`fit_scale_min8`]).
fn fit_symmetric16(xt: &[[f32; 16]; 16], nmax: i32) -> [f32; 16] {
    let mut amax = [0f32; 16];
    let mut max = [0f32; 16];
    for row in xt {
        for j in 0..16 {
            if row[j].abs() > amax[j] {
                amax[j] = row[j].abs();
                max[j] = row[j];
            }
        }
    }
    // `nearest_int(v).clamp(-nmax, nmax - 1)` without the libm call (see `fit_scale_min8`).
    let quant = |iscale: f32, v: f32| {
        let r = iscale * v;
        if r.abs() < 4_194_303.0 {
            nearest_small(r).clamp(-nmax, nmax - 1)
        } else if r > 0.0 {
            nmax - 1
        } else if r < 0.0 {
            -nmax
        } else {
            0
        }
    };
    let mut iscale = [0f32; 16];
    for j in 0..16 {
        iscale[j] = -(nmax as f32) / max[j];
    }
    let (mut sumlx, mut suml2) = ([0f32; 16], [0f32; 16]);
    for row in xt {
        for j in 0..16 {
            let v = row[j];
            let q = quant(iscale[j], v);
            let w = v * v;
            sumlx[j] += w * v * q as f32;
            suml2[j] += w * (q * q) as f32;
        }
    }
    let mut scale = [0f32; 16];
    let mut best = [0f32; 16];
    for j in 0..16 {
        scale[j] = if suml2[j] != 0.0 {
            sumlx[j] / suml2[j]
        } else {
            0.0
        };
        best[j] = scale[j] * sumlx[j];
    }
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        for j in 0..16 {
            iscale[j] = -(nmax as f32 + 0.1 * is as f32) / max[j];
        }
        let (mut slx, mut sl2) = ([0f32; 16], [0f32; 16]);
        for row in xt {
            for j in 0..16 {
                let v = row[j];
                let q = quant(iscale[j], v);
                let w = v * v;
                slx[j] += w * v * q as f32;
                sl2[j] += w * (q * q) as f32;
            }
        }
        for j in 0..16 {
            if sl2[j] > 0.0 && slx[j] * slx[j] > best[j] * sl2[j] {
                scale[j] = slx[j] / sl2[j];
                best[j] = scale[j] * slx[j];
            }
        }
    }
    for j in 0..16 {
        if amax[j] < GROUP_MAX_EPS {
            scale[j] = 0.0;
        }
    }
    scale
}

/// Q3_K's per-16 fit: max-based start, then up to five passes of coordinate descent on each
/// code with weights `x^2`. Returns the scale; codes are stored offset by `nmax`.
fn fit_q3(x: &[f32], nmax: i32, l_out: &mut [i8]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l_out.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let mut l = [0i32; 16];
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (i, &v) in x.iter().enumerate() {
        l[i] = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let w = v * v;
        sumlx += w * v * l[i] as f32;
        suml2 += w * (l[i] * l[i]) as f32;
    }
    for _ in 0..5 {
        let mut changed = false;
        for (i, &v) in x.iter().enumerate() {
            let w = v * v;
            let mut slx = sumlx - w * v * l[i] as f32;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * (l[i] * l[i]) as f32;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != l[i] {
                    slx += w * v * new_l as f32;
                    sl2 += w * (new_l * new_l) as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        l[i] = new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        changed = true;
                    }
                }
            }
        }
        if !changed {
            break;
        }
    }
    for (o, &v) in l_out.iter_mut().zip(&l) {
        *o = (v + nmax) as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// Packs 2-bit codes: value `128h + 32s + l` goes to bits `2s` of byte `32h + l`.
fn pack2(l: &[u8; QK_K], qs: &mut [u8; 64]) {
    for h in 0..2 {
        for i in 0..32 {
            let j = 128 * h + i;
            qs[32 * h + i] = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
}

pub(crate) fn q2_k(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ2K] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut l = [0u8; QK_K];
        let mut scales = [0f32; 16];
        let mut mins = [0f32; 16];
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..16 {
            let xs = &x[16 * j..16 * j + 16];
            let mut w = [0f32; 16];
            for (w, v) in w.iter_mut().zip(xs) {
                *w = v.abs();
            }
            let (s, m) = fit_scale_min(xs, &w, 3, &mut l[16 * j..16 * j + 16], -0.5, 0.1, 15, true);
            scales[j] = s;
            mins[j] = m;
            max_scale = max_scale.max(s);
            max_min = max_min.max(m);
        }
        b.scales = [0; 16];
        if max_scale > 0.0 {
            let iscale = 15.0 / max_scale;
            for j in 0..16 {
                b.scales[j] = nearest_int(iscale * scales[j]).clamp(0, 15) as u8;
            }
            b.d = f16_bytes(max_scale / 15.0);
        } else {
            b.d = f16_bytes(0.0);
        }
        if max_min > 0.0 {
            let iscale = 15.0 / max_min;
            for j in 0..16 {
                b.scales[j] |= (nearest_int(iscale * mins[j]).clamp(0, 15) as u8) << 4;
            }
            b.dmin = f16_bytes(max_min / 15.0);
        } else {
            b.dmin = f16_bytes(0.0);
        }
        let (d, dmin) = (f16_le(b.d), f16_le(b.dmin));
        for j in 0..16 {
            let dl = d * f32::from(b.scales[j] & 0x0F);
            if dl == 0.0 {
                continue;
            }
            let ml = dmin * f32::from(b.scales[j] >> 4);
            for i in 0..16 {
                l[16 * j + i] = nearest_int((x[16 * j + i] + ml) / dl).clamp(0, 3) as u8;
            }
        }
        pack2(&l, &mut b.qs);
    }
}

pub(crate) fn q3_k(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ3K] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut li = [0i8; QK_K];
        let mut scales = [0f32; 16];
        let (mut amax, mut max_scale) = (0f32, 0f32);
        for j in 0..16 {
            scales[j] = fit_q3(&x[16 * j..16 * j + 16], 4, &mut li[16 * j..16 * j + 16]);
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        b.scales = [0; 12];
        if max_scale != 0.0 {
            let iscale = -32.0 / max_scale;
            for j in 0..16 {
                let l = (nearest_int(iscale * scales[j]).clamp(-32, 31) + 32) as u8;
                if j < 8 {
                    b.scales[j] = l & 0x0F;
                } else {
                    b.scales[j - 8] |= (l & 0x0F) << 4;
                }
                b.scales[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
            }
            b.d = f16_bytes(1.0 / iscale);
        } else {
            b.d = f16_bytes(0.0);
        }
        let d_all = f16_le(b.d);
        let sc = q3k_scales(&b.scales);
        let mut l = [0u8; QK_K];
        for (o, &v) in l.iter_mut().zip(&li) {
            *o = v as u8;
        }
        for j in 0..16 {
            let d = d_all * f32::from(sc[j] as i8 - 32);
            if d == 0.0 {
                continue;
            }
            for i in 0..16 {
                l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-4, 3) + 4) as u8;
            }
        }
        b.hmask = [0; 32];
        for (j, v) in l.iter_mut().enumerate() {
            if *v > 3 {
                b.hmask[j % 32] |= 1 << (j / 32);
                *v -= 4;
            }
        }
        pack2(&l, &mut b.qs);
    }
}

/// Shared by Q4_K and Q5_K: per-32 scale/min fits, 6-bit packing, then requantization with the
/// stored scales. Returns the codes (0..=nmax).
#[allow(
    clippy::too_many_arguments,
    reason = "search knobs plus the three header fields"
)]
fn k4_common(
    x: &[f32],
    nmax: i32,
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    d: &mut [u8; 2],
    dmin: &mut [u8; 2],
    packed: &mut [u8; 12],
) -> [u8; QK_K] {
    let mut l = [0u8; QK_K];
    let mut xt = [[0f32; 8]; 32];
    let mut wt = [[0f32; 8]; 32];
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2: f32 = xs.iter().map(|v| v * v).sum();
        let av_x = (sum_x2 / 32.0).sqrt();
        for (i, v) in xs.iter().enumerate() {
            xt[i][j] = *v;
            wt[i][j] = av_x + v.abs();
        }
    }
    let mut lt = [[0u8; 8]; 32];
    let (scales, mins) = fit_scale_min8(&xt, &wt, nmax, &mut lt, rmin, rdelta, nstep);
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        for i in 0..32 {
            l[32 * j + i] = lt[i][j];
        }
        max_scale = max_scale.max(scales[j]);
        max_min = max_min.max(mins[j]);
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    *packed = [0; 12];
    for j in 0..8 {
        let ls = nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8;
        let lm = nearest_int(inv_min * mins[j]).clamp(0, 63) as u8;
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    *d = f16_bytes(max_scale / 63.0);
    *dmin = f16_bytes(max_min / 63.0);
    let (df, mf) = (f16_le(*d), f16_le(*dmin));
    for j in 0..8 {
        let (sc, m) = k4_scale_min(j, packed);
        let dl = df * f32::from(sc);
        if dl == 0.0 {
            continue;
        }
        let ml = mf * f32::from(m);
        for i in 0..32 {
            l[32 * j + i] = nearest_int((x[32 * j + i] + ml) / dl).clamp(0, nmax) as u8;
        }
    }
    l
}

pub(crate) fn q4_k(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ4K] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let l = k4_common(x, 15, -1.0, 0.1, 20, &mut b.d, &mut b.dmin, &mut b.scales);
        for c in 0..4 {
            for i in 0..32 {
                b.qs[32 * c + i] = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

pub(crate) fn q5_k(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ5K] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let l = k4_common(x, 31, -0.5, 0.1, 15, &mut b.d, &mut b.dmin, &mut b.scales);
        b.qh = [0; 32];
        for c in 0..4 {
            for i in 0..32 {
                let (l1, l2) = (l[64 * c + i], l[64 * c + 32 + i]);
                b.qh[i] |= ((l1 >> 4) << (2 * c)) | ((l2 >> 4) << (2 * c + 1));
                b.qs[32 * c + i] = (l1 & 0x0F) | ((l2 & 0x0F) << 4);
            }
        }
    }
}

pub(crate) fn q6_k(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ6K] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut xt = [[0f32; 16]; 16];
        for j in 0..16 {
            for i in 0..16 {
                xt[i][j] = x[16 * j + i];
            }
        }
        let scales = fit_symmetric16(&xt, 32);
        let (mut amax, mut max_scale) = (0f32, 0f32);
        for j in 0..16 {
            if scales[j].abs() > amax {
                amax = scales[j].abs();
                max_scale = scales[j];
            }
        }
        if amax < GROUP_MAX_EPS {
            *b = BlockQ6K {
                ql: [0; 128],
                qh: [0; 64],
                scales: [0; 16],
                d: f16_bytes(0.0),
            };
            continue;
        }
        let iscale = -128.0 / max_scale;
        b.d = f16_bytes(1.0 / iscale);
        for j in 0..16 {
            b.scales[j] = nearest_int(iscale * scales[j]).min(127) as i8;
        }
        let d_all = f16_le(b.d);
        let mut l = [0u8; QK_K];
        for j in 0..16 {
            let d = d_all * f32::from(b.scales[j]);
            if d == 0.0 {
                continue;
            }
            for i in 0..16 {
                l[16 * j + i] = (nearest_int(x[16 * j + i] / d).clamp(-32, 31) + 32) as u8;
            }
        }
        for h in 0..2 {
            for i in 0..32 {
                let j = 128 * h + i;
                let (q1, q2, q3, q4) = (l[j], l[j + 32], l[j + 64], l[j + 96]);
                b.ql[64 * h + i] = (q1 & 0x0F) | ((q3 & 0x0F) << 4);
                b.ql[64 * h + 32 + i] = (q2 & 0x0F) | ((q4 & 0x0F) << 4);
                b.qh[32 * h + i] =
                    (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6);
            }
        }
    }
}

pub(crate) fn q8_k(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ8K] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(QK_K)) {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            *b = BlockQ8K {
                d: [0; 4],
                qs: [0; QK_K],
                bsums: [0; 32],
            };
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for g in 0..16 {
            let s: i32 = b.qs[16 * g..16 * g + 16]
                .iter()
                .map(|&q| i32::from(q))
                .sum();
            b.bsums[2 * g..2 * g + 2].copy_from_slice(&(s as i16).to_le_bytes());
        }
        b.d = (1.0 / iscale).to_le_bytes();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ggml's scalar fit (the reference for [`fit_symmetric16`]): fits `x ~ scale * (L - nmax)` with `L - nmax` in `-nmax..nmax`, weights `x^2`, sweeping 19
    /// candidate scales around the max-based one. Returns the scale (signed).
    fn fit_symmetric(x: &[f32], nmax: i32, l_out: &mut [i8]) -> f32 {
        let mut amax = 0f32;
        let mut max = 0f32;
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax < GROUP_MAX_EPS {
            l_out.fill(0);
            return 0.0;
        }
        let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        let mut iscale = -(nmax as f32) / max;
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for (i, &v) in x.iter().enumerate() {
            let l = quant(iscale, v);
            l_out[i] = (l + nmax) as i8;
            let w = v * v;
            sumlx += w * v * l as f32;
            suml2 += w * (l * l) as f32;
        }
        let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
        let mut best = scale * sumlx;
        for is in -9..=9 {
            if is == 0 {
                continue;
            }
            iscale = -(nmax as f32 + 0.1 * is as f32) / max;
            let (mut slx, mut sl2) = (0f32, 0f32);
            for &v in x {
                let l = quant(iscale, v);
                let w = v * v;
                slx += w * v * l as f32;
                sl2 += w * (l * l) as f32;
            }
            if sl2 > 0.0 && slx * slx > best * sl2 {
                for (i, &v) in x.iter().enumerate() {
                    l_out[i] = (quant(iscale, v) + nmax) as i8;
                }
                scale = slx / sl2;
                best = scale * slx;
            }
        }
        scale
    }

    #[test]
    fn nearest_int_rounds_ties_to_even_everywhere() {
        let mut st = 0x2545_f491_4f6c_dd1du64;
        let mut vals = vec![
            0.5f32,
            1.5,
            2.5,
            -0.5,
            -1.5,
            -2.5,
            4_194_302.5,
            -4_194_302.5,
            1e30,
        ];
        vals.extend([f32::NAN, f32::INFINITY, f32::NEG_INFINITY, -0.0, 1e-40]);
        for _ in 0..100_000 {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            let v = f32::from_bits(st as u32);
            vals.push(v);
            // Exact halves and values near the guard.
            vals.push(((st >> 40) as i32 - (1 << 23)) as f32 * 0.5);
        }
        for v in vals {
            assert_eq!(nearest_int(v), v.round_ties_even() as i32, "{v:e}");
        }
    }

    /// The eight-lane fit gives every group the scalar fit's codes, scale and min, bit for bit,
    /// flat, positive, tiny and ordinary groups side by side.
    #[test]
    fn lockstep_fit_equals_the_scalar_fit() {
        let mut st = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        for case in 0..400 {
            let mut x = [0f32; 256];
            for (j, g) in x.chunks_exact_mut(32).enumerate() {
                for v in g.iter_mut() {
                    *v = next() * 0.05;
                }
                match (case + j) % 9 {
                    0 => g.fill(0.0),
                    1 => g.fill(-0.25),
                    2 => g.iter_mut().for_each(|v| *v = v.abs() + 0.01),
                    3 => g.iter_mut().for_each(|v| *v *= 1e-38),
                    4 => g.iter_mut().for_each(|v| *v = (*v * 64.0).round() / 64.0),
                    _ => {}
                }
            }
            let mut xt = [[0f32; 8]; 32];
            let mut wt = [[0f32; 8]; 32];
            for j in 0..8 {
                for i in 0..32 {
                    xt[i][j] = x[32 * j + i];
                    wt[i][j] = 0.01 + x[32 * j + i].abs();
                }
            }
            for (nmax, rmin, rdelta, nstep) in [(15, -1.0, 0.1, 20), (31, -0.5, 0.1, 15)] {
                let mut lt = [[0u8; 8]; 32];
                let (s8, m8) = fit_scale_min8(&xt, &wt, nmax, &mut lt, rmin, rdelta, nstep);
                for j in 0..8 {
                    let w: Vec<f32> = (0..32).map(|i| wt[i][j]).collect();
                    let mut l = [0u8; 32];
                    let xs = &x[32 * j..32 * j + 32];
                    let (s, m) = fit_scale_min(xs, &w, nmax, &mut l, rmin, rdelta, nstep, false);
                    assert_eq!(s.to_bits(), s8[j].to_bits(), "case {case} group {j} scale");
                    assert_eq!(m.to_bits(), m8[j].to_bits(), "case {case} group {j} min");
                    for i in 0..32 {
                        assert_eq!(l[i], lt[i][j], "case {case} group {j} code {i}");
                    }
                }
            }
        }
    }

    /// The sixteen-lane symmetric fit gives every group the scalar fit's scale bit for bit.
    #[test]
    fn lockstep_symmetric_fit_equals_the_scalar_fit() {
        let mut st = 0x1234_5678_9abc_def1u64;
        let mut next = || {
            st ^= st << 13;
            st ^= st >> 7;
            st ^= st << 17;
            (st >> 11) as f32 / (1u64 << 53) as f32 * 2.0 - 1.0
        };
        for case in 0..400 {
            let mut xt = [[0f32; 16]; 16];
            for j in 0..16 {
                let kind = (case + j) % 7;
                for row in xt.iter_mut() {
                    let v = next() * 0.05;
                    row[j] = match kind {
                        0 => 0.0,
                        1 => 1e-17 * v,
                        2 => (v * 64.0).round() / 64.0,
                        3 => 1e-30 * v,
                        _ => v,
                    };
                }
            }
            let got = fit_symmetric16(&xt, 32);
            for j in 0..16 {
                let x: Vec<f32> = xt.iter().map(|r| r[j]).collect();
                let mut l = [0i8; 16];
                let want = fit_symmetric(&x, 32, &mut l);
                assert_eq!(got[j].to_bits(), want.to_bits(), "case {case} group {j}");
            }
        }
    }
}
