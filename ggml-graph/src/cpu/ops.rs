//! CPU kernels for the row-wise and copying ops: elementwise maths, norms, activations, lookups,
//! copies, concatenation, row writes and argmax.

use rayon::prelude::*;

use super::{for_row_groups, for_rows, min_rows, out_f32, unflatten, unsupported, SrcView};
use crate::error::{GraphError, Result};
use crate::tensor::{Act, DType, Tensor};

/// One element of a float/int type as f32.
#[inline]
pub(crate) fn load_scalar(dtype: DType, b: &[u8]) -> f32 {
    match dtype {
        DType::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        DType::F16 => half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        DType::BF16 => half::bf16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32(),
        _ => i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32,
    }
}

/// Stores an f32 as a float type.
#[inline]
fn store_scalar(dtype: DType, v: f32, b: &mut [u8]) {
    match dtype {
        DType::F32 => b[..4].copy_from_slice(&v.to_le_bytes()),
        DType::F16 => b[..2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes()),
        _ => b[..2].copy_from_slice(&half::bf16::from_f32(v).to_bits().to_le_bytes()),
    }
}

/// GELU, tanh form, evaluated as ggml's CPU backend does: inputs rounded to f16 and looked up in
/// a table of f16-rounded results (exact limits beyond +-10). The f16 steps are part of the
/// reference's numerics: computing in full f32 instead moves Gemma logits by tenths.
pub(crate) fn gelu(x: f32) -> f32 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        gelu_table()[half::f16::from_f32(x).to_bits() as usize]
    }
}

/// `gelu_f32` of every f16 value, rounded to f16 (indexed by the f16 bits).
fn gelu_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|b| {
                let x = half::f16::from_bits(b).to_f32();
                half::f16::from_f32(gelu_f32(x)).to_f32()
            })
            .collect()
    })
}

/// GELU, tanh approximation, in f32, with the one fused multiply-add ggml's build contracts
/// `1 + 0.044715 x x` to (it decides the f16 rounding of a few table entries).
pub(crate) fn gelu_f32(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = (0.044_715 * x).mul_add(x, 1.0);
    0.5 * x * (1.0 + (SQRT_2_OVER_PI * x * inner).tanh())
}

/// `cap * tanh(x / cap)` as llama.cpp's graph computes it: a multiply by the f32 reciprocal,
/// libm's tanhf, a multiply by the cap.
pub(crate) fn softcap(x: f32, cap: f32) -> f32 {
    (x * (1.0 / cap)).tanh() * cap
}

pub(crate) fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `act(g) * u` for every value of `g`, in place: the fused gated product's last step, the same
/// values as `act_fn(act)` one at a time. GELU's f16 roundings run a slice at a time (F16C where
/// the CPU has it), as one call per value costs more than the table lookup itself.
pub(crate) fn gate_in_place(act: Act, g: &mut [f32], u: &[f32]) {
    match act {
        Act::Gelu => {
            use half::slice::HalfFloatSliceExt;
            let table = gelu_table();
            let mut bits = [half::f16::ZERO; 64];
            for (gc, uc) in g.chunks_mut(64).zip(u.chunks(64)) {
                let b = &mut bits[..gc.len()];
                b.convert_from_f32_slice(gc);
                for ((v, &y), h) in gc.iter_mut().zip(uc).zip(b.iter()) {
                    let x = *v;
                    let a = if x <= -10.0 {
                        0.0
                    } else if x >= 10.0 {
                        x
                    } else {
                        table[h.to_bits() as usize]
                    };
                    *v = a * y;
                }
            }
        }
        Act::Silu => {
            for (v, &y) in g.iter_mut().zip(u) {
                *v = silu(*v) * y;
            }
        }
    }
}

pub(crate) fn act_fn(act: Act) -> fn(f32) -> f32 {
    match act {
        Act::Gelu => gelu,
        Act::Silu => silu,
    }
}

/// The scale `1 / sqrt(mean(x^2) + eps)` as ggml's CPU kernel rounds it: f32 squares summed in
/// f64, mean and root in f32. Tiny differences here flip 8-bit activation roundings downstream.
pub(crate) fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let ss: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    let mean = (ss / x.len() as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// [`rms_scale`] of up to `G` rows of `ne0` values in `rows` (one scale per row): the same
/// sequential f64 sum per row, the rows' sums interleaved so their addition chains overlap
/// instead of each waiting on its own latency.
fn rms_scales<const G: usize>(rows: &[f32], ne0: usize, eps: f32) -> [f32; G] {
    let n = rows.len() / ne0;
    let mut out = [0f32; G];
    if n < G {
        for (o, r) in out.iter_mut().zip(rows.chunks_exact(ne0)) {
            *o = rms_scale(r, eps);
        }
        return out;
    }
    let mut ss = [0f64; G];
    for i in 0..ne0 {
        for (k, s) in ss.iter_mut().enumerate() {
            let v = rows[k * ne0 + i];
            *s += (v * v) as f64;
        }
    }
    for (o, s) in out.iter_mut().zip(ss) {
        let mean = (s / ne0 as f64) as f32;
        *o = 1.0 / (mean + eps).sqrt();
    }
    out
}

pub(crate) fn rms_norm_in_place(o: &mut [f32], eps: f32) {
    let scale = rms_scale(o, eps);
    o.iter_mut().for_each(|v| *v *= scale);
}

pub(crate) fn norm_in_place(o: &mut [f32], eps: f32) {
    let n = o.len() as f64;
    let mean = o.iter().map(|&v| v as f64).sum::<f64>() / n;
    let var = o.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
    let scale = 1.0 / (var + eps as f64).sqrt();
    o.iter_mut()
        .for_each(|v| *v = ((*v as f64 - mean) * scale) as f32);
}

/// Copies each row of `a` into the (dense) output, unless `a` already is the output (planned in
/// place), then applies `f` to it.
pub(crate) fn map_rows(
    t: &Tensor,
    out: &mut [u8],
    a: &SrcView<'_>,
    f: impl Fn(&mut [f32]) + Sync,
) -> Result<()> {
    let all = a.f32s()?;
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0].max(1);
    for_rows(o, ne0, |r, orow| {
        if !a.aliased {
            let (i1, i2, i3) = unflatten(r, &t.ne);
            orow.copy_from_slice(a.row(all, i1, i2, i3));
        }
        f(orow);
    });
    Ok(())
}

pub(crate) fn binary(
    t: &Tensor,
    out: &mut [u8],
    a: &SrcView<'_>,
    b: &SrcView<'_>,
    f: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<()> {
    let (aa, ba) = (a.f32s()?, b.f32s()?);
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0].max(1);
    let bne = b.t.ne;
    for_rows(o, ne0, |r, orow| {
        let (i1, i2, i3) = unflatten(r, &t.ne);
        if !a.aliased {
            orow.copy_from_slice(a.row(aa, i1, i2, i3));
        }
        let brow = b.row(ba, i1 % bne[1], i2 % bne[2], i3 % bne[3]);
        if brow.len() == orow.len() {
            for (o, &y) in orow.iter_mut().zip(brow) {
                *o = f(*o, y);
            }
        } else {
            for (i, o) in orow.iter_mut().enumerate() {
                *o = f(*o, brow[i % bne[0]]);
            }
        }
    });
    Ok(())
}

pub(crate) fn gated(
    t: &Tensor,
    out: &mut [u8],
    g: &SrcView<'_>,
    u: &SrcView<'_>,
    f: fn(f32) -> f32,
) -> Result<()> {
    gated_rows(t, out, g, u, |x, y| f(x) * y)
}

/// `out = op(g, u)` element by element, row by row; the gate row is copied into `out` first
/// unless it already lives there (`aliased`).
fn gated_rows(
    t: &Tensor,
    out: &mut [u8],
    g: &SrcView<'_>,
    u: &SrcView<'_>,
    op: impl Fn(f32, f32) -> f32 + Sync,
) -> Result<()> {
    let (ga, ua) = (g.f32s()?, u.f32s()?);
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0].max(1);
    for_rows(o, ne0, |r, orow| {
        let (i1, i2, i3) = unflatten(r, &t.ne);
        if !g.aliased {
            orow.copy_from_slice(g.row(ga, i1, i2, i3));
        }
        for (o, &y) in orow.iter_mut().zip(u.row(ua, i1, i2, i3)) {
            *o = op(*o, y);
        }
    });
    Ok(())
}

/// ggml's `swiglu_oai` row by row, in its order of operations.
pub(crate) fn swiglu_oai(
    t: &Tensor,
    out: &mut [u8],
    g: &SrcView<'_>,
    u: &SrcView<'_>,
    alpha: f32,
    limit: f32,
) -> Result<()> {
    gated_rows(t, out, g, u, |x, y| {
        let x = x.min(limit);
        let y = y.clamp(-limit, limit);
        x / (1.0 + (alpha * -x).exp()) * (y + 1.0)
    })
}

pub(crate) fn get_rows(
    t: &Tensor,
    out: &mut [u8],
    table: &SrcView<'_>,
    ids: &SrcView<'_>,
) -> Result<()> {
    let ids_v = ids.i32s()?;
    let n_rows = table.t.ne[1];
    let idx: Vec<usize> = (0..ids.t.ne[0])
        .map(|i| ids_v[i * ids.t.nb[0] / 4])
        .map(|r| usize::try_from(r).ok().filter(|&r| r < n_rows).ok_or(r))
        .collect::<std::result::Result<_, i32>>()
        .map_err(|r| unsupported(t, format!("row id {r} outside table of {n_rows} rows")))?;
    let o = out_f32(t, out)?;
    let (ne0, rb, nb1, ty) = (t.ne[0], table.t.row_bytes(), table.t.nb[1], table.t.dtype);
    // gguf's dequantization is the crate-wide reference for every block layout.
    o.par_chunks_mut(ne0)
        .zip(idx.par_iter())
        .try_for_each(|(orow, &r)| {
            gguf::dequantize_row(ty, &table.data[r * nb1..r * nb1 + rb], orow)
        })
        .map_err(|e| unsupported(t, format!("table type {ty}: {e}")))
}

/// Byte offsets of the elements of a tensor in logical (row-major) order.
struct Elems {
    ne: [usize; 4],
    nb: [usize; 4],
    idx: [usize; 4],
    left: usize,
}

impl Elems {
    fn new(t: &Tensor) -> Self {
        Self {
            ne: t.ne,
            nb: t.nb,
            idx: [0; 4],
            left: t.nelements(),
        }
    }
}

impl Iterator for Elems {
    type Item = usize;
    fn next(&mut self) -> Option<usize> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let off = (0..4).map(|d| self.idx[d] * self.nb[d]).sum();
        for d in 0..4 {
            self.idx[d] += 1;
            if self.idx[d] < self.ne[d] {
                break;
            }
            self.idx[d] = 0;
        }
        Some(off)
    }
}

pub(crate) fn cpy(t: &Tensor, out: &mut [u8], src: &SrcView<'_>) -> Result<()> {
    let (st, ses, des) = (src.t, src.t.dtype.type_size(), t.dtype.type_size());
    for (so, o) in Elems::new(st).zip(Elems::new(t)) {
        if so + ses > src.data.len() || o + des > out.len() {
            return Err(unsupported(t, "element outside its buffer".into()));
        }
        let v = load_scalar(st.dtype, &src.data[so..so + ses]);
        store_scalar(t.dtype, v, &mut out[o..o + des]);
    }
    Ok(())
}

pub(crate) fn cont(t: &Tensor, out: &mut [u8], src: &SrcView<'_>) -> Result<()> {
    let es = t.dtype.type_size();
    let st = src.t;
    let ne0 = t.ne[0].max(1);
    out.par_chunks_mut(ne0 * es)
        .with_min_len(min_rows(ne0))
        .enumerate()
        .for_each(|(r, orow)| {
            let (i1, i2, i3) = unflatten(r, &t.ne);
            let base = src.off(i1, i2, i3);
            if st.nb[0] == es {
                orow.copy_from_slice(&src.data[base..base + orow.len()]);
            } else {
                for (i0, o) in orow.chunks_exact_mut(es).enumerate() {
                    let so = base + i0 * st.nb[0];
                    o.copy_from_slice(&src.data[so..so + es]);
                }
            }
        });
    Ok(())
}

pub(crate) fn concat(
    t: &Tensor,
    out: &mut [u8],
    a: &SrcView<'_>,
    b: &SrcView<'_>,
    dim: usize,
) -> Result<()> {
    let (aa, ba) = (a.f32s()?, b.f32s()?);
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0];
    let split = a.t.ne[dim];
    o.par_chunks_mut(ne0.max(1))
        .enumerate()
        .for_each(|(r, orow)| {
            let (i1, i2, i3) = unflatten(r, &t.ne);
            if dim == 0 {
                orow[..split].copy_from_slice(a.row(aa, i1, i2, i3));
                orow[split..].copy_from_slice(b.row(ba, i1, i2, i3));
                return;
            }
            let mut idx = [0, i1, i2, i3];
            if idx[dim] < split {
                orow.copy_from_slice(a.row(aa, idx[1], idx[2], idx[3]));
            } else {
                idx[dim] -= split;
                orow.copy_from_slice(b.row(ba, idx[1], idx[2], idx[3]));
            }
        });
    Ok(())
}

pub(crate) fn set_rows(
    t: &Tensor,
    out: &mut [u8],
    src: &SrcView<'_>,
    idx: &SrcView<'_>,
) -> Result<()> {
    let sa = src.f32s()?;
    let iv = idx.i32s()?;
    let (rows, es) = (t.ne[1], t.dtype.type_size());
    for i in 0..src.t.ne[1] {
        let r = iv[i * idx.t.nb[0] / 4];
        let r = usize::try_from(r)
            .ok()
            .filter(|&r| r < rows)
            .ok_or_else(|| unsupported(t, format!("row index {r} outside {rows} rows")))?;
        let dst = &mut out[r * t.nb[1]..r * t.nb[1] + t.row_bytes()];
        let s = src.row(sa, i, 0, 0);
        match t.dtype {
            // Q8_0 KV cache rows: quantized on write, block by block as ggml's reference does.
            DType::Q8_0 => gguf::quants::quantize_row(DType::Q8_0, &s[..t.ne[0]], dst)
                .map_err(|e| unsupported(t, e.to_string()))?,
            DType::F32 => dst.copy_from_slice(bytemuck::cast_slice(s)),
            // KV cache rows: converted with F16C where the CPU has it (the same rounding, to
            // nearest even, as the scalar conversion).
            DType::F16 => {
                use half::slice::HalfFloatSliceExt;
                match bytemuck::try_cast_slice_mut::<u8, half::f16>(&mut *dst) {
                    Ok(d) => d.convert_from_f32_slice(s),
                    Err(_) => {
                        for (d, &v) in dst.chunks_exact_mut(es).zip(s) {
                            store_scalar(t.dtype, v, d);
                        }
                    }
                }
            }
            _ => {
                for (d, &v) in dst.chunks_exact_mut(es).zip(s) {
                    store_scalar(t.dtype, v, d);
                }
            }
        }
    }
    Ok(())
}

pub(crate) fn argmax(t: &Tensor, out: &mut [u8], a: &SrcView<'_>) -> Result<()> {
    let aa = a.f32s()?;
    let o: &mut [i32] =
        bytemuck::try_cast_slice_mut(out).map_err(|_| GraphError::Misaligned(t.name.clone()))?;
    o.par_iter_mut().enumerate().for_each(|(m, o)| {
        let row = a.row(aa, m, 0, 0);
        let mut best = 0;
        for (i, &v) in row.iter().enumerate() {
            if v > row[best] {
                best = i;
            }
        }
        *o = best as i32;
    });
    Ok(())
}

/// `out += b` with `b` broadcast (the bias of a fused `mul_mat` + `add`).
pub(crate) fn add_in_place(t: &Tensor, out: &mut [u8], b: &SrcView<'_>) -> Result<()> {
    let ba = b.f32s()?;
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0].max(1);
    let bne = b.t.ne;
    for_rows(o, ne0, |r, orow| {
        let (i1, i2, i3) = unflatten(r, &t.ne);
        let brow = b.row(ba, i1 % bne[1], i2 % bne[2], i3 % bne[3]);
        for (i, o) in orow.iter_mut().enumerate() {
            *o += brow[i % bne[0]];
        }
    });
    Ok(())
}

/// `rms_norm(x) * w` with `w` broadcast, in one pass over each row.
pub(crate) fn rms_norm_mul(
    t: &Tensor,
    out: &mut [u8],
    x: &SrcView<'_>,
    w: &SrcView<'_>,
    eps: f32,
) -> Result<()> {
    let (xa, wa) = (x.f32s()?, w.f32s()?);
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0].max(1);
    let wne = w.t.ne;
    const G: usize = 4;
    for_row_groups::<G>(o, ne0, |r0, rows| {
        if !x.aliased {
            for (k, orow) in rows.chunks_exact_mut(ne0).enumerate() {
                let (i1, i2, i3) = unflatten(r0 + k, &t.ne);
                orow.copy_from_slice(x.row(xa, i1, i2, i3));
            }
        }
        let scales = rms_scales::<G>(rows, ne0, eps);
        for (k, orow) in rows.chunks_exact_mut(ne0).enumerate() {
            let (i1, i2, i3) = unflatten(r0 + k, &t.ne);
            let scale = scales[k];
            orow.iter_mut().for_each(|v| *v *= scale);
            let wrow = w.row(wa, i1 % wne[1], i2 % wne[2], i3 % wne[3]);
            if wrow.len() == orow.len() {
                // The usual case (no broadcast along the row): no index division per element.
                orow.iter_mut().zip(wrow).for_each(|(o, &wv)| *o *= wv);
            } else {
                for (i, o) in orow.iter_mut().enumerate() {
                    *o *= wrow[i % wne[0]];
                }
            }
        }
    });
    Ok(())
}

/// The elementwise sum of dense f32 operands of `t`'s shape (`all_reduce`).
pub(crate) fn sum_all(t: &Tensor, out: &mut [u8], srcs: &[SrcView<'_>]) -> Result<()> {
    let n = t.nelements();
    let mut parts = Vec::with_capacity(srcs.len());
    for s in srcs {
        let v = s.f32s()?;
        if s.aliased || !s.t.is_contiguous() || v.len() < n {
            return Err(unsupported(
                t,
                format!("`{}`: operands must be dense f32 of {n} values", s.t.name),
            ));
        }
        parts.push(&v[..n]);
    }
    let o = out_f32(t, out)?;
    let ne0 = t.ne[0].max(1);
    for_rows(&mut o[..n], ne0, |r, orow| {
        let span = r * ne0..r * ne0 + orow.len();
        orow.fill(0.0);
        for p in &parts {
            for (o, &x) in orow.iter_mut().zip(&p[span.clone()]) {
                *o += x;
            }
        }
    });
    Ok(())
}
