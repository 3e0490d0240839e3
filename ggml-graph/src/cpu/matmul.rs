//! CPU matrix products: activations quantized once to 8-bit blocks for quantized weights, then
//! integer block dot products; float weights dotted with f32 activations. Parallel over chunks of
//! weight rows; each chunk dots its rows with every activation column so a weight row is loaded
//! from memory once per op.

use rayon::prelude::*;

use super::ops::{act_fn, gate_in_place};
use super::{out_f32, unsupported, CpuBackend, SrcView};
use crate::error::Result;
use crate::quant::{
    act_type, dot_float, dot_tile_of, quantize_act, quantize_act_tiled, tiled, tiled_act_bytes,
    vec_dot, vec_dot_cols, Tile,
};
use crate::tensor::{row_bytes, Act, DType, Tensor};

/// Weight rows per parallel task.
fn chunk_rows(n: usize, threads: usize) -> usize {
    // Enough tasks to balance (8 per thread), but never tiny ones; whole 4-row tiles.
    ((n / (threads * 8)).clamp(4, 256) + 3) & !3
}

/// The second weight and activation of a fused gated product: `act(w . x) * (w2 . x)`.
pub(crate) type Gate<'a, 'b> = Option<(&'a SrcView<'b>, Act)>;

pub(crate) fn mul_mat(
    be: &CpuBackend,
    t: &Tensor,
    out: &mut [u8],
    w: &SrcView<'_>,
    x: &SrcView<'_>,
    gate: Gate<'_, '_>,
) -> Result<()> {
    let wt = w.t;
    let wty = wt.dtype;
    let float_w = matches!(wty, DType::F32 | DType::F16 | DType::BF16);
    if !float_w && !crate::quant::is_supported(wty) {
        return Err(unsupported(t, format!("weight type {wty}")));
    }
    let k = wt.ne[0];
    let (n, m) = (t.ne[0], t.ne[1]);
    let (b2, b3) = (t.ne[2], t.ne[3]);
    let (r2, r3) = (b2 / wt.ne[2], b3 / wt.ne[3]);
    let xa = x.f32s()?;
    // ggml multiplies F16 (BF16) weights with activations converted to F16 (BF16) (their
    // `vec_dot_type`); the same rounding here keeps F16 models on llama.cpp's numbers.
    let x_rounded: Option<Vec<f32>> = match wty {
        DType::F16 => Some(
            xa.iter()
                .map(|&v| half::f16::from_f32(v).to_f32())
                .collect(),
        ),
        DType::BF16 => Some(
            xa.iter()
                .map(|&v| half::bf16::from_f32(v).to_f32())
                .collect(),
        ),
        _ => None,
    };
    let xa = x_rounded.as_deref().unwrap_or(xa);
    let simd = be.simd();
    let o = out_f32(t, out)?;
    let n_cols = m * b2 * b3;

    // Activation rows, flat over (m, b2, b3): quantized into scratch, or f32 slices.
    let aty = act_type(wty);
    let tile = tiled(simd, wty);
    let mut scratch = be.scratch.lock();
    let arb = match aty {
        Some(_) if tile => tiled_act_bytes(wty, k),
        Some(a) => row_bytes(a, k),
        None => 0,
    };
    if let Some(aty) = aty {
        if scratch.len() < arb * n_cols {
            scratch.resize(arb * n_cols, 0);
        }
        let quant = |(c, dst): (usize, &mut [u8])| {
            let (mi, i2, i3) = (c % m, (c / m) % b2, c / (m * b2));
            let xr = x.row(xa, mi, i2, i3);
            if !(tile && quantize_act_tiled(wty, xr, dst)) {
                quantize_act(aty, xr, dst);
            }
        };
        if n_cols <= 4 {
            scratch[..arb * n_cols]
                .chunks_mut(arb)
                .enumerate()
                .for_each(quant);
        } else {
            scratch[..arb * n_cols]
                .par_chunks_mut(arb)
                .enumerate()
                .for_each(quant);
        }
    }
    let acts: &[u8] = &scratch[..arb * n_cols];
    let wrb = wt.row_bytes();
    let chunk = chunk_rows(n, be.n_threads());

    for i3 in 0..b3 {
        for i2 in 0..b2 {
            let batch = i3 * b2 + i2;
            let w_off = (i2 / r2) * wt.nb[2] + (i3 / r3) * wt.nb[3];
            let ob = &mut o[batch * n * m..(batch + 1) * n * m];
            if tile {
                let a = &acts[batch * m * arb..(batch + 1) * m * arb];
                let layout = be.columns.lock().clone();
                let cols = Cols {
                    a,
                    arb,
                    m,
                    layout: layout.as_deref(),
                };
                mul_mat_tiled(simd, wty, k, w, w_off, &cols, gate, chunk, ob)?;
                continue;
            }
            let dot1 = |wv: &SrcView<'_>, row: usize, col: usize| -> f32 {
                let wo = w_off + row * wt.nb[1];
                let wrow = &wv.data[wo..wo + wrb];
                if float_w {
                    dot_float(simd, wty, wrow, x.row(xa, col, i2, i3))
                } else {
                    let c = batch * m + col;
                    vec_dot(simd, wty, k, wrow, &acts[c * arb..(c + 1) * arb])
                }
            };
            let dot = |row: usize, col: usize| -> f32 {
                match gate {
                    Some((w2, act)) => act_fn(act)(dot1(w, row, col)) * dot1(w2, row, col),
                    None => dot1(w, row, col),
                }
            };
            if m == 1 {
                ob.par_chunks_mut(chunk).enumerate().for_each(|(ci, oc)| {
                    for (i, o) in oc.iter_mut().enumerate() {
                        *o = dot(ci * chunk + i, 0);
                    }
                });
            } else {
                // Split every output column into row chunks; a task owns one chunk in all columns.
                let n_chunks = n.div_ceil(chunk);
                let mut tiles: Vec<Vec<&mut [f32]>> =
                    (0..n_chunks).map(|_| Vec::with_capacity(m)).collect();
                for col in ob.chunks_mut(n) {
                    for (ci, part) in col.chunks_mut(chunk).enumerate() {
                        tiles[ci].push(part);
                    }
                }
                tiles.par_iter_mut().enumerate().for_each(|(ci, cols)| {
                    let rows = cols.first().map_or(0, |c| c.len());
                    if float_w {
                        for r in 0..rows {
                            for (col, oc) in cols.iter_mut().enumerate() {
                                oc[r] = dot(ci * chunk + r, col);
                            }
                        }
                        return;
                    }
                    // Quantized: up to 4 columns per weight-row pass, each block decoded once.
                    let (mut tmp, mut tmp2) = ([0f32; 4], [0f32; 4]);
                    for r in 0..rows {
                        let wo = w_off + (ci * chunk + r) * wt.nb[1];
                        let mut col = 0;
                        while col < m {
                            let cn = (m - col).min(4);
                            let a0 = (batch * m + col) * arb;
                            let a = &acts[a0..a0 + cn * arb];
                            vec_dot_cols(
                                simd,
                                wty,
                                k,
                                &w.data[wo..wo + wrb],
                                a,
                                arb,
                                &mut tmp[..cn],
                            );
                            if let Some((w2, act)) = gate {
                                vec_dot_cols(
                                    simd,
                                    wty,
                                    k,
                                    &w2.data[wo..wo + wrb],
                                    a,
                                    arb,
                                    &mut tmp2[..cn],
                                );
                                gate_in_place(act, &mut tmp[..cn], &tmp2[..cn]);
                            }
                            for (c, &v) in tmp[..cn].iter().enumerate() {
                                cols[col + c][r] = v;
                            }
                            col += cn;
                        }
                    }
                });
            }
        }
    }
    Ok(())
}

thread_local! {
    /// A task's tile results and its gate's (see [`mul_mat_tiled`]).
    static TILE_OUT: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The activation columns of a tiled product: `m` prepared rows of `arb` bytes in `a`, and the
/// column layout of [`CpuBackend::set_column_layout`](super::CpuBackend::set_column_layout).
struct Cols<'a> {
    a: &'a [u8],
    arb: usize,
    m: usize,
    layout: Option<&'a [(u32, u32)]>,
}

/// One tile call over some of the columns: their indices and prepared rows, padded (the last
/// column repeated) to a count for which the kernels sum every column in the wanted order.
struct SubCall {
    cols: Vec<usize>,
    acts: Vec<u8>,
    padded: usize,
}

/// The tile calls that give each column the order its layout asks for; `None` when one call
/// over all columns already does.
fn sub_calls(ty: DType, repacked: bool, c: &Cols<'_>) -> Option<Vec<SubCall>> {
    let layout = c.layout?;
    let want: Vec<bool> = (0..c.m)
        .map(|j| match layout.get(j) {
            Some(&(n, i)) if layout.len() == c.m => {
                crate::quant::batched_order(ty, repacked, n as usize, i as usize)
            }
            _ => false,
        })
        .collect();
    if (0..c.m).all(|j| want[j] == crate::quant::batched_order(ty, repacked, c.m, j)) {
        return None;
    }
    let q4 = ty == DType::Q4_K && repacked;
    let mut calls = Vec::new();
    let mut push = |cols: Vec<usize>, padded: usize| {
        let mut acts = Vec::with_capacity(padded * c.arb);
        for k in 0..padded {
            let j = cols[k.min(cols.len() - 1)];
            acts.extend_from_slice(&c.a[j * c.arb..(j + 1) * c.arb]);
        }
        calls.push(SubCall { cols, acts, padded });
    };
    let batched: Vec<usize> = (0..c.m).filter(|&j| want[j]).collect();
    if !batched.is_empty() {
        let n = batched.len();
        let padded = if q4 { n.next_multiple_of(4) } else { n.max(8) };
        push(batched, padded);
    }
    // Mat-vec columns: fewer than the batched order's minimum per call.
    let per = if q4 { 3 } else { 7 };
    let single: Vec<usize> = (0..c.m).filter(|&j| !want[j]).collect();
    for part in single.chunks(per) {
        push(part.to_vec(), part.len());
    }
    Some(calls)
}

thread_local! {
    /// A task's results of one sub-call and its gate's (see [`mul_mat_tiled`]).
    static SUB_OUT: std::cell::RefCell<(Vec<f32>, Vec<f32>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// The tile-kernel path: each task owns `chunk` weight rows and computes them for all `m`
/// columns (`a`: prepared activation rows, `arb` bytes each) into `ob` (`m` columns of `n`).
#[allow(clippy::too_many_arguments)]
fn mul_mat_tiled(
    simd: crate::quant::Simd,
    wty: DType,
    k: usize,
    w: &SrcView<'_>,
    w_off: usize,
    c: &Cols<'_>,
    gate: Gate<'_, '_>,
    chunk: usize,
    ob: &mut [f32],
) -> Result<()> {
    let (a, arb, m) = (c.a, c.arb, c.m);
    let wt = w.t;
    let n = ob.len() / m;
    let wstride = wt.nb[1];
    let wrb = wt.row_bytes();
    let repacked = crate::quant::repacked(wty, wt.ne);
    let calls = sub_calls(wty, repacked, c);
    let span = |r0: usize, rn: usize| (w_off + r0 * wstride, (rn - 1) * wstride + wrb);
    let run_on =
        |r0: usize, rn: usize, a: &[u8], cols: usize, res: &mut [f32], res2: &mut [f32]| -> bool {
            let (s, len) = span(r0, rn);
            let Some(wr) = w.data.get(s..s + len) else {
                return false;
            };
            let tile = |w| Tile {
                n: k,
                w,
                wstride,
                rows: rn,
                a,
                astride: arb,
                cols,
                ocs: rn,
            };
            if !dot_tile_of(simd, wty, &tile(wr), res, repacked) {
                return false;
            }
            if let Some((w2, act)) = gate {
                let Some(wr2) = w2.data.get(s..s + len) else {
                    return false;
                };
                if !dot_tile_of(simd, wty, &tile(wr2), res2, repacked) {
                    return false;
                }
                gate_in_place(act, res, res2);
            }
            true
        };
    // All `m` columns of rows `r0..r0 + rn` into `res` (`m` columns of `rn`), through the
    // sub-calls when the layout asks for orders one call would not give.
    let run = |r0: usize, rn: usize, res: &mut [f32], res2: &mut [f32]| -> bool {
        let Some(calls) = &calls else {
            return run_on(r0, rn, a, m, res, res2);
        };
        SUB_OUT.with(|bufs| {
            let (sres, sres2) = &mut *bufs.borrow_mut();
            for call in calls {
                let len = rn * call.padded;
                if sres.len() < len {
                    sres.resize(len, 0.0);
                }
                let len2 = if gate.is_some() { len } else { 0 };
                if sres2.len() < len2 {
                    sres2.resize(len2, 0.0);
                }
                let (o, o2) = (&mut sres[..len], &mut sres2[..len2]);
                if !run_on(r0, rn, &call.acts, call.padded, o, o2) {
                    return false;
                }
                for (slot, &j) in call.cols.iter().enumerate() {
                    res[j * rn..(j + 1) * rn].copy_from_slice(&o[slot * rn..(slot + 1) * rn]);
                }
            }
            true
        })
    };
    let bad = || unsupported(wt, format!("{wty} tile shapes (k {k}, rows {n})"));
    if m == 1 && calls.is_none() {
        let ok = ob
            .par_chunks_mut(chunk)
            .enumerate()
            .map(|(ci, oc)| {
                let rn = oc.len();
                let mut res2 = if gate.is_some() {
                    vec![0f32; rn]
                } else {
                    Vec::new()
                };
                run(ci * chunk, rn, oc, &mut res2)
            })
            .all(|ok| ok);
        return if ok { Ok(()) } else { Err(bad()) };
    }
    // Split every output column into row chunks; a task owns one chunk in all columns.
    let n_chunks = n.div_ceil(chunk);
    let mut tiles: Vec<Vec<&mut [f32]>> = (0..n_chunks).map(|_| Vec::with_capacity(m)).collect();
    for col in ob.chunks_mut(n) {
        for (ci, part) in col.chunks_mut(chunk).enumerate() {
            tiles[ci].push(part);
        }
    }
    let ok = tiles
        .par_iter_mut()
        .enumerate()
        .map(|(ci, cols)| {
            let rn = cols.first().map_or(0, |c| c.len());
            TILE_OUT.with(|bufs| {
                // Reused per thread: a fresh zeroed buffer per task costs page faults and a
                // memset (tens of kB per task in prefill); the tiles write every value.
                let (res, res2) = &mut *bufs.borrow_mut();
                let len2 = if gate.is_some() { rn * m } else { 0 };
                if res.len() < rn * m {
                    res.resize(rn * m, 0.0);
                }
                if res2.len() < len2 {
                    res2.resize(len2, 0.0);
                }
                let (res, res2) = (&mut res[..rn * m], &mut res2[..len2]);
                if !run(ci * chunk, rn, res, res2) {
                    return false;
                }
                for (col, r) in cols.iter_mut().zip(res.chunks_exact(rn)) {
                    col.copy_from_slice(r);
                }
                true
            })
        })
        .all(|ok| ok);
    if ok {
        Ok(())
    } else {
        Err(bad())
    }
}
