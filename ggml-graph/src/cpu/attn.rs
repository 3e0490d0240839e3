//! CPU kernels for rotary embeddings, masked softmax and fused (flash-style) attention.

use rayon::prelude::*;

use super::{for_rows, out_f32, unflatten, unsupported, CpuBackend, SrcView};
use crate::error::Result;
use crate::quant::dot_float;
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
    let ne0 = t.ne[0];
    let half = p.n_dims / 2;
    let theta_scale = p.freq_base.powf(-2.0 / p.n_dims as f32);
    let corr = p.yarn_corr_dims();
    let mscale = p.mscale();
    for_rows(o, ne0, |r, orow| {
        let (i1, i2, i3) = unflatten(r, &t.ne);
        let src = x.row(xa, i1, i2, i3);
        let position = pa[i2 * pos.t.nb[0] / 4] as f32;
        let mut theta = position;
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
            let (sin, cos) = (th.sin() * mscale, th.cos() * mscale);
            let (a, b) = match p.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (x0, x1) = (src[a], src[b]);
            orow[a] = x0.mul_add(cos, -(x1 * sin));
            orow[b] = x0.mul_add(sin, x1 * cos);
            theta *= theta_scale;
        }
        orow[p.n_dims..].copy_from_slice(&src[p.n_dims..]);
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
    let ma = match srcs.get(4) {
        Some(m) => Some((m, m.f32s()?)),
        None => None,
    };
    let (n_head, n_kv_head, n_kv) = (q.t.ne[1], k.t.ne[1], k.t.ne[2]);
    let group = n_head / n_kv_head;
    let (d, dv) = (q.t.ne[0], v.t.ne[0]);
    let (krb, vrb) = (k.t.row_bytes(), v.t.row_bytes());
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
            let lo = match p.window {
                Some(w) if w > 0 => (qpos + 1).saturating_sub(w),
                _ => 0,
            };
            let n = hi.saturating_sub(lo);
            let mrow = ma.map(|(m, all)| m.row(all, tok, 0, 0));
            ochunk.fill(0.0);
            if n == 0 {
                return;
            }
            ATTN_SCRATCH.with(|cell| {
                let mut buf = cell.borrow_mut();
                let need = group * n + group * d + d + dv;
                if buf.len() < need {
                    buf.resize(need, 0.0);
                }
                let (scores, rest) = buf.split_at_mut(group * n);
                let (qrows, rest) = rest.split_at_mut(group * d);
                let (krow, rest) = rest.split_at_mut(d);
                let vrow = &mut rest[..dv];
                // llama.cpp's CPU path (KQ and KQV as matrix products) converts the queries to
                // the K cache's type and the probabilities to the V cache's type before the
                // products: half precision with the default f16 cache. Those roundings move
                // Gemma logits by tenths, so they are part of the numerics we follow.
                for (g, qr) in qrows.chunks_exact_mut(d).enumerate() {
                    qr.copy_from_slice(&q.row(qa, kvh * group + g, tok, 0)[..d]);
                    round_to(k.t.dtype, qr);
                }
                for j in lo..hi {
                    let ko = k.off(kvh, j, 0);
                    to_f32_row(simd, k.t.dtype, &k.data[ko..ko + krb], krow);
                    let bias = mrow.map_or(0.0, |m| m[j]);
                    for (g, qrow) in qrows.chunks_exact(d).enumerate() {
                        let s =
                            p.scale * dot_float(simd, DType::F32, bytemuck::cast_slice(krow), qrow);
                        let s = match p.softcap {
                            Some(c) => super::ops::softcap(s, c),
                            None => s,
                        };
                        scores[g * n + (j - lo)] = s + bias;
                    }
                }
                for g in 0..group {
                    let sg = &mut scores[g * n..(g + 1) * n];
                    let max = sg.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                    if max == f32::NEG_INFINITY {
                        sg.fill(0.0);
                        continue;
                    }
                    let mut sum = 0.0f64;
                    for x in sg.iter_mut() {
                        *x = (*x - max).exp();
                        sum += *x as f64;
                    }
                    let inv = (1.0 / sum) as f32;
                    sg.iter_mut().for_each(|x| *x *= inv);
                    round_to(v.t.dtype, sg);
                }
                for j in lo..hi {
                    let vo = v.off(kvh, j, 0);
                    to_f32_row(simd, v.t.dtype, &v.data[vo..vo + vrb], vrow);
                    for (g, orow) in ochunk.chunks_exact_mut(dv).enumerate() {
                        let w = scores[g * n + (j - lo)];
                        if w != 0.0 {
                            for (a, &x) in orow.iter_mut().zip(vrow.iter()) {
                                *a += w * x;
                            }
                        }
                    }
                }
            });
        });
    Ok(())
}

/// Rounds `x` to the precision of `ty` (F16 or BF16; F32 leaves it as is).
fn round_to(ty: DType, x: &mut [f32]) {
    match ty {
        DType::F16 => x
            .iter_mut()
            .for_each(|v| *v = half::f16::from_f32(*v).to_f32()),
        DType::BF16 => x
            .iter_mut()
            .for_each(|v| *v = half::bf16::from_f32(*v).to_f32()),
        _ => {}
    }
}

/// Converts a float row (F32/F16/BF16 bytes) to f32.
fn to_f32_row(simd: crate::quant::Simd, ty: DType, src: &[u8], dst: &mut [f32]) {
    if !crate::quant::convert_row(simd, ty, src, dst) {
        for (d, c) in dst.iter_mut().zip(src.chunks_exact(ty.type_size())) {
            *d = super::ops::load_scalar(ty, c);
        }
    }
}
