//! CPU kernels for rotary embeddings, masked softmax and fused (flash-style) attention.

use rayon::prelude::*;

use super::{for_rows, out_f32, unflatten, unsupported, CpuBackend, SrcView};
use crate::error::Result;
use crate::quant::dot_float;
use crate::tensor::{AttnParams, DType, RopeMode, RopeParams, Tensor};

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
    for_rows(o, ne0, |r, orow| {
        let (i1, i2, i3) = unflatten(r, &t.ne);
        let src = x.row(xa, i1, i2, i3);
        let position = pa[i2 * pos.t.nb[0] / 4] as f32;
        let mut theta = position;
        for i in 0..half {
            let mut th = theta * p.freq_scale;
            if let Some(f) = ffa {
                th /= f[i];
            }
            let (sin, cos) = th.sin_cos();
            let (a, b) = match p.mode {
                RopeMode::Normal => (2 * i, 2 * i + 1),
                RopeMode::Neox => (i, i + half),
            };
            let (x0, x1) = (src[a], src[b]);
            orow[a] = x0 * cos - x1 * sin;
            orow[b] = x0 * sin + x1 * cos;
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

/// `acc += w * row` for a float row of type `ty`.
fn axpy(ty: DType, row: &[u8], w: f32, acc: &mut [f32]) {
    match ty {
        DType::F32 => {
            for (a, c) in acc.iter_mut().zip(row.chunks_exact(4)) {
                *a += w * f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (a, c) in acc.iter_mut().zip(row.chunks_exact(2)) {
                *a += w * half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        _ => {
            for (a, c) in acc.iter_mut().zip(row.chunks_exact(2)) {
                *a += w * half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
    }
}

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
    let o = out_f32(t, out)?;
    let simd = be.simd();
    o.par_chunks_mut(dv).enumerate().for_each(|(r, orow)| {
        let (h, tok) = (r % n_head, r / n_head);
        let kvh = h / group;
        let qrow = &q.row(qa, h, tok, 0)[..d];
        let qpos = pa[tok * pos.t.nb[0] / 4] as usize;
        let hi = if p.causal { (qpos + 1).min(n_kv) } else { n_kv };
        let lo = match p.window {
            Some(w) if w > 0 => (qpos + 1).saturating_sub(w),
            _ => 0,
        };
        let mrow = ma.map(|(m, all)| m.row(all, tok, 0, 0));
        orow.fill(0.0);
        let (mut max, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        for j in lo..hi {
            let ko = k.off(kvh, j, 0);
            let mut s = p.scale * dot_float(simd, k.t.dtype, &k.data[ko..ko + krb], qrow);
            if let Some(m) = mrow {
                s += m[j];
            }
            if s == f32::NEG_INFINITY {
                continue;
            }
            let vo = v.off(kvh, j, 0);
            let vrow = &v.data[vo..vo + vrb];
            if s > max {
                let c = (max - s).exp();
                orow.iter_mut().for_each(|a| *a *= c);
                sum *= c;
                max = s;
            }
            let w = (s - max).exp();
            sum += w;
            axpy(v.t.dtype, vrow, w, orow);
        }
        if sum > 0.0 {
            let inv = 1.0 / sum;
            orow.iter_mut().for_each(|a| *a *= inv);
        }
    });
    Ok(())
}
