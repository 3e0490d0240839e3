//! Mixture-of-experts kernels: top-k routing, the chosen experts' weights, llama.cpp's
//! `mul_mat_id` over a stack of expert matrices, and the weighted sum of the chosen experts'
//! outputs.
//!
//! `mul_mat_id` groups the (token, slot) columns by expert so that each expert's rows are read
//! once per pass for all the tokens that chose it, and never for an expert no token chose. Every
//! column is summed as a one-column product (llama.cpp's CPU `mul_mat_id` runs each column as a
//! mat-vec), so a token's result does not depend on the other tokens in the pass.

use rayon::prelude::*;

use super::{for_rows, out_f32, unsupported, CpuBackend, SrcView};
use crate::error::Result;
use crate::quant::{
    act_type, dot_float, dot_tile_of, quantize_act, quantize_act_tiled, tiled, tiled_act_bytes,
    vec_dot_cols, Tile,
};
use crate::tensor::{row_bytes, DType, Tensor};

/// Reads I32 element `(i0, i1)` of a dense 2-d tensor given as `i32s()`.
fn id_at(ids: &SrcView<'_>, v: &[i32], i0: usize, i1: usize) -> i32 {
    v[(i0 * ids.t.nb[0] + i1 * ids.t.nb[1]) / 4]
}

pub(crate) fn arg_top_k(t: &Tensor, out: &mut [u8], a: &SrcView<'_>, k: usize) -> Result<()> {
    let av = a.f32s()?;
    let o: &mut [i32] = bytemuck::try_cast_slice_mut(out)
        .map_err(|_| crate::error::GraphError::Misaligned(t.name.clone()))?;
    let n = a.t.ne[0];
    let mut order: Vec<usize> = Vec::with_capacity(n);
    for (r, orow) in o.chunks_mut(k).enumerate().take(a.t.ne[1]) {
        let row = a.row(av, r, 0, 0);
        order.clear();
        order.extend(0..n);
        // Stable: among equal values the lower index stays first. NaN sorts last.
        order.sort_by(|&i, &j| {
            row[j]
                .partial_cmp(&row[i])
                .unwrap_or_else(|| row[i].is_nan().cmp(&row[j].is_nan()))
        });
        for (d, &i) in orow.iter_mut().zip(&order) {
            *d = i as i32;
        }
    }
    Ok(())
}

pub(crate) fn expert_weights(
    t: &Tensor,
    out: &mut [u8],
    probs: &SrcView<'_>,
    ids: &SrcView<'_>,
    norm: bool,
) -> Result<()> {
    let (pv, iv) = (probs.f32s()?, ids.i32s()?);
    let n = probs.t.ne[0];
    let k = t.ne[0];
    let o = out_f32(t, out)?;
    for (r, orow) in o.chunks_mut(k).enumerate() {
        let row = probs.row(pv, r, 0, 0);
        for (i, d) in orow.iter_mut().enumerate() {
            let e = id_at(ids, iv, i, r);
            *d = *usize::try_from(e)
                .ok()
                .and_then(|e| row.get(e))
                .ok_or_else(|| unsupported(t, format!("expert id {e} outside 0..{n}")))?;
        }
        if norm {
            // llama.cpp clamps the sum at the smallest normal f16 before dividing.
            let sum = orow.iter().sum::<f32>().max(6.103_515_6e-5);
            orow.iter_mut().for_each(|v| *v /= sum);
        }
    }
    Ok(())
}

/// `out[:, t] = experts[:, 0, t] * w[0, 0, t] + experts[:, 1, t] * w[0, 1, t] + ...`, added
/// left to right with every product rounded first (Rust never contracts `a * b + c` into a
/// fused multiply-add), then `r[:, t]` added when given, so the result equals the unfused `mul`
/// and `add` chain (and the residual `add`) bit for bit.
pub(crate) fn moe_sum(
    t: &Tensor,
    out: &mut [u8],
    experts: &SrcView<'_>,
    w: &SrcView<'_>,
    r: Option<&SrcView<'_>>,
) -> Result<()> {
    let (ev, wv) = (experts.f32s()?, w.f32s()?);
    let rv = r.map(|r| r.f32s()).transpose()?;
    let k = experts.t.ne[1];
    let o = out_f32(t, out)?;
    for_rows(o, t.ne[0].max(1), |row, orow| {
        let weight = |s: usize| w.row(wv, s, row, 0)[0];
        let w0 = weight(0);
        for (d, &x) in orow.iter_mut().zip(experts.row(ev, 0, row, 0)) {
            *d = x * w0;
        }
        for s in 1..k {
            let ws = weight(s);
            for (d, &x) in orow.iter_mut().zip(experts.row(ev, s, row, 0)) {
                *d += x * ws;
            }
        }
        if let (Some(r), Some(rv)) = (r, rv) {
            for (d, &x) in orow.iter_mut().zip(r.row(rv, row, 0, 0)) {
                *d += x;
            }
        }
    });
    Ok(())
}

/// How the activation columns are prepared for the weight type.
enum Acts {
    /// Float weights: f32 rows (rounded to the weight's type as ggml does).
    Float(Vec<f32>),
    /// Quantized weights: rows for the tile kernels (`tile`) or for `vec_dot`, `arb` bytes each.
    Quant {
        bytes: Vec<u8>,
        arb: usize,
        tile: bool,
    },
}

pub(crate) fn mul_mat_id(
    be: &CpuBackend,
    t: &Tensor,
    out: &mut [u8],
    w: &SrcView<'_>,
    x: &SrcView<'_>,
    ids: &SrcView<'_>,
) -> Result<()> {
    let wt = w.t;
    let wty = wt.dtype;
    let float_w = matches!(wty, DType::F32 | DType::F16 | DType::BF16);
    if !float_w && !crate::quant::is_supported(wty) {
        return Err(unsupported(t, format!("weight type {wty}")));
    }
    let (k, n, n_mat) = (wt.ne[0], wt.ne[1], wt.ne[2]);
    let (n_used, n_tok) = (ids.t.ne[0], ids.t.ne[1]);
    let n_x = x.t.ne[1];
    let iv = ids.i32s()?;
    let xa = x.f32s()?;
    let simd = be.simd();

    // Columns by expert: (output column, activation row), in token order.
    let mut by_expert: Vec<Vec<(usize, usize)>> = vec![Vec::new(); n_mat];
    for tok in 0..n_tok {
        for slot in 0..n_used {
            let e = id_at(ids, iv, slot, tok);
            let e = usize::try_from(e)
                .ok()
                .filter(|&e| e < n_mat)
                .ok_or_else(|| unsupported(t, format!("expert id {e} outside 0..{n_mat}")))?;
            by_expert[e].push((tok * n_used + slot, tok * n_x + slot % n_x));
        }
    }

    // Each activation row prepared once, even when several experts read it.
    let x_row = |r: usize| x.row(xa, r % n_x, r / n_x, 0);
    let n_rows = n_x * n_tok;
    let acts = if float_w {
        let round = |v: f32| match wty {
            DType::F16 => half::f16::from_f32(v).to_f32(),
            DType::BF16 => half::bf16::from_f32(v).to_f32(),
            _ => v,
        };
        Acts::Float(
            (0..n_rows)
                .flat_map(|r| x_row(r).iter().map(|&v| round(v)))
                .collect(),
        )
    } else {
        let aty = act_type(wty).ok_or_else(|| unsupported(t, format!("weight type {wty}")))?;
        let tile = tiled(simd, wty);
        let arb = if tile {
            tiled_act_bytes(wty, k)
        } else {
            row_bytes(aty, k)
        };
        let mut bytes = vec![0u8; arb * n_rows];
        bytes.par_chunks_mut(arb).enumerate().for_each(|(r, dst)| {
            if !(tile && quantize_act_tiled(wty, x_row(r), dst)) {
                quantize_act(aty, x_row(r), dst);
            }
        });
        Acts::Quant { bytes, arb, tile }
    };
    // llama.cpp repacks Q4_K expert stacks under the 2-d rule and runs them column by column
    // through its repacked mat-vec, whose float steps the tile kernels follow with this flag.
    let repacked = crate::quant::repacked(wty, [k, n, 1, 1]);
    // Columns per tile call that still sum each column in mat-vec order
    // (see `crate::quant::batched_order`).
    let per_call = match wty {
        DType::Q4_K if repacked => 3,
        DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => 7,
        _ => 8,
    };

    let o = out_f32(t, out)?;
    let mut cols: Vec<Option<&mut [f32]>> = o.chunks_mut(n).map(Some).collect();
    let (wrb, wstride) = (wt.row_bytes(), wt.nb[1]);
    let chunk = ((n / (be.n_threads() * 4)).clamp(4, 256) + 3) & !3;
    let bad = || unsupported(t, format!("{wty} tile shapes (k {k}, rows {n})"));

    for (e, list) in by_expert.iter().enumerate() {
        if list.is_empty() {
            continue;
        }
        let wexp = &w.data[e * wt.nb[2]..];
        let rows: Vec<usize> = list.iter().map(|&(_, r)| r).collect();
        // This expert's activation rows, side by side.
        let gathered_q: Vec<u8>;
        let gathered_f: Vec<f32>;
        let (qa, fa, arb, tile) = match &acts {
            Acts::Quant { bytes, arb, tile } => {
                gathered_q = rows
                    .iter()
                    .flat_map(|&r| bytes[r * arb..(r + 1) * arb].iter().copied())
                    .collect();
                (&gathered_q[..], &[][..], *arb, *tile)
            }
            Acts::Float(v) => {
                gathered_f = rows
                    .iter()
                    .flat_map(|&r| v[r * k..(r + 1) * k].iter().copied())
                    .collect();
                (&[][..], &gathered_f[..], 0, false)
            }
        };
        let m = list.len();
        // Every column of this expert split into row chunks; a task owns one chunk of all.
        let n_chunks = n.div_ceil(chunk);
        let mut tiles: Vec<Vec<&mut [f32]>> =
            (0..n_chunks).map(|_| Vec::with_capacity(m)).collect();
        for &(c, _) in list {
            let col = cols[c]
                .take()
                .ok_or_else(|| unsupported(t, "column chosen twice".into()))?;
            for (ci, part) in col.chunks_mut(chunk).enumerate() {
                tiles[ci].push(part);
            }
        }
        let ok = tiles.par_iter_mut().enumerate().all(|(ci, outs)| {
            let r0 = ci * chunk;
            let rn = outs.first().map_or(0, |c| c.len());
            if float_w {
                for r in 0..rn {
                    let wo = (r0 + r) * wstride;
                    let wrow = &wexp[wo..wo + wrb];
                    for (c, oc) in outs.iter_mut().enumerate() {
                        oc[r] = dot_float(simd, wty, wrow, &fa[c * k..(c + 1) * k]);
                    }
                }
                return true;
            }
            if tile {
                let Some(wr) = wexp.get(r0 * wstride..r0 * wstride + (rn - 1) * wstride + wrb)
                else {
                    return false;
                };
                let mut res = vec![0f32; rn * per_call];
                let mut c0 = 0;
                while c0 < m {
                    let cn = (m - c0).min(per_call);
                    let tl = Tile {
                        n: k,
                        w: wr,
                        wstride,
                        rows: rn,
                        a: &qa[c0 * arb..(c0 + cn) * arb],
                        astride: arb,
                        cols: cn,
                        ocs: rn,
                    };
                    if !dot_tile_of(simd, wty, &tl, &mut res[..rn * cn], repacked) {
                        return false;
                    }
                    for c in 0..cn {
                        outs[c0 + c].copy_from_slice(&res[c * rn..(c + 1) * rn]);
                    }
                    c0 += cn;
                }
                return true;
            }
            let mut tmp = [0f32; 4];
            for r in 0..rn {
                let wo = (r0 + r) * wstride;
                let wrow = &wexp[wo..wo + wrb];
                let mut c0 = 0;
                while c0 < m {
                    let cn = (m - c0).min(4);
                    let a = &qa[c0 * arb..(c0 + cn) * arb];
                    vec_dot_cols(simd, wty, k, wrow, a, arb, &mut tmp[..cn]);
                    for (c, &v) in tmp[..cn].iter().enumerate() {
                        outs[c0 + c][r] = v;
                    }
                    c0 += cn;
                }
            }
            true
        });
        if !ok {
            return Err(bad());
        }
    }
    Ok(())
}
