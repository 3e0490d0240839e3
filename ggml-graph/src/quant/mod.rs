//! Quantized dot products: activations are quantized once per mul_mat to 8-bit blocks (Q8_0, Q8_1
//! or Q8_K, as llama.cpp does), then each weight row is dotted in integers block by block.
//!
//! Every weight type has a scalar path (built on [`blocks`] decoding, or the `gguf` crate's for
//! the `generic` module's types) and, for the common types (the legacy and K-quants, IQ4_NL, IQ4_XS and
//! MXFP4), SIMD paths chosen at run time; tests check them against each other.

pub mod blocks;
mod generic;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::tensor::DType;
use blocks::{decode_small, decode_super, f16_at, put_f16, QK, QK_K};

/// Bytes of one Q8_K block: f32 d, 256 i8, 16 i16 group sums.
pub const Q8K_BYTES: usize = 4 + QK_K + 32;

/// The 8-bit activation format that weight type `w` is dotted with, or `None` when the weight
/// is a float type (dotted with f32 activations).
pub fn act_type(w: DType) -> Option<DType> {
    match w {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => Some(DType::Q8_0),
        DType::Q4_1 | DType::Q5_1 => Some(DType::Q8_1),
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => Some(DType::Q8_K),
        _ => generic::act_type(w),
    }
}

/// True for the quantized weight types mul_mat takes: the ones with kernels here and the
/// ones dotted through their `gguf` decoding (the `generic` module).
pub fn is_supported(ty: DType) -> bool {
    blocks::is_supported(ty) || generic::act_type(ty).is_some()
}

/// Which SIMD level the dot products use (ordered: each level includes the ones before).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Simd {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA + F16C.
    Avx2,
    /// AVX2 plus AVX-512 BW/VL and VNNI (`vpdpbusd` for the 32-value block types).
    Avx512,
}

/// The best SIMD level of this CPU (detected once).
pub fn detected() -> Simd {
    static LEVEL: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                return if x86::has_vnni() {
                    Simd::Avx512
                } else {
                    Simd::Avx2
                };
            }
        }
        Simd::Scalar
    })
}

/// Quantizes `x` (a multiple of the block size) to the activation format `ty` in `out`; SIMD
/// where this CPU has a kernel, with the same bytes as [`quantize_act_portable`].
pub fn quantize_act(ty: DType, x: &[f32], out: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if ty == DType::Q8_K && detected() == Simd::Avx512 && x86::ktile::quantize_q8k(x, out) {
        return;
    }
    quantize_act_portable(ty, x, out)
}

/// The portable activation quantizer (the reference for the SIMD ones).
pub fn quantize_act_portable(ty: DType, x: &[f32], out: &mut [u8]) {
    match ty {
        DType::Q8_K => {
            for (xb, ob) in x.chunks_exact(QK_K).zip(out.chunks_exact_mut(Q8K_BYTES)) {
                quantize_q8k_block(xb, ob);
            }
        }
        _ => {
            let bytes = ty.type_size();
            for (xb, ob) in x.chunks_exact(QK).zip(out.chunks_exact_mut(bytes)) {
                quantize_q8_block(ty == DType::Q8_1, xb, ob);
            }
        }
    }
}

fn quantize_q8_block(with_sum: bool, x: &[f32], out: &mut [u8]) {
    let amax = x.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    // As ggml's x86 quantizer: 127 / amax (not 1 / d, which differs in the last bit a quarter of
    // the time) and ties to even. Activations hit exact .5 products often enough (a dozen per
    // Gemma 3 layer input) that either difference moves logits by tenths.
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let start = if with_sum { 4 } else { 2 };
    let mut sum = 0i32;
    for (o, &v) in out[start..start + QK].iter_mut().zip(x) {
        let q = (v * id).round_ties_even() as i32;
        sum += q;
        *o = q as i8 as u8;
    }
    put_f16(out, 0, d);
    if with_sum {
        put_f16(out, 2, d * sum as f32);
    }
}

fn quantize_q8k_block(x: &[f32], out: &mut [u8]) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        out.fill(0);
        return;
    }
    let iscale = -127.0 / max;
    for (o, &v) in out[4..4 + QK_K].iter_mut().zip(x) {
        // Ties to even, as ggml's `nearest_int`.
        *o = ((iscale * v).round_ties_even() as i32).min(127) as i8 as u8;
    }
    for g in 0..16 {
        let s: i32 = out[4 + 16 * g..4 + 16 * g + 16]
            .iter()
            .map(|&b| b as i8 as i32)
            .sum();
        out[4 + QK_K + 2 * g..4 + QK_K + 2 * g + 2].copy_from_slice(&(s as i16).to_le_bytes());
    }
    out[0..4].copy_from_slice(&(1.0 / iscale).to_le_bytes());
}

/// True when `ty` on `simd` runs through the row x column tile kernels ([`dot_tile`]), which take
/// activations from [`quantize_act_tiled`].
pub fn tiled(simd: Simd, ty: DType) -> bool {
    cfg!(target_arch = "x86_64")
        && simd == Simd::Avx512
        && matches!(
            ty,
            DType::Q4_0
                | DType::Q4_1
                | DType::Q5_0
                | DType::Q5_1
                | DType::Q8_0
                | DType::IQ4_NL
                | DType::MXFP4
                | DType::Q4_K
                | DType::Q5_K
                | DType::Q6_K
                | DType::IQ4_XS
        )
}

/// True for the tile types whose activations are prepared beyond plain Q8_0 blocks.
fn prepared(ty: DType) -> bool {
    matches!(
        ty,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::IQ4_NL
            | DType::MXFP4
    )
}

/// Bytes of one activation row of `n` values for the tile kernels of weight type `ty`.
pub fn tiled_act_bytes(ty: DType, n: usize) -> usize {
    if prepared(ty) {
        n / QK * 128
    } else {
        n / QK_K * Q8K_BYTES
    }
}

/// Quantizes `x` for [`dot_tile`] with weights of type `ty`: Q8_K blocks for the K-quants and
/// IQ4_XS; for the 32-value types Q8_0 (Q4_1/Q5_1: Q8_1) values laid out for the tiles (the same
/// values [`quantize_act`] gives).
/// False when `ty` has no tile kernel on this CPU.
pub fn quantize_act_tiled(ty: DType, x: &[f32], out: &mut [u8]) -> bool {
    if !tiled(detected(), ty) {
        return false;
    }
    if !prepared(ty) {
        if !x.len().is_multiple_of(QK_K) || out.len() < tiled_act_bytes(ty, x.len()) {
            return false;
        }
        quantize_act(DType::Q8_K, x, out);
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    {
        x86::tile::quantize_prepare(ty, x, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when llama.cpp's CPU backend (AVX2 and up) repacks a Q4_K, Q4_0, IQ4_NL or MXFP4 weight
/// of shape `ne` into its interleaved layout (2-D, rows a multiple of 8); the tile kernels then
/// follow its repacked kernels' float steps, otherwise its plain ones (see [`dot_tile_of`]).
/// llama.cpp also repacks Q2_K (AVX-512) under the same shape rule; that order is not followed
/// here, so this answers false for it.
pub fn repacked(ty: DType, ne: [usize; 4]) -> bool {
    matches!(ty, DType::Q4_K | DType::Q4_0 | DType::IQ4_NL | DType::MXFP4)
        && ne[1].is_multiple_of(8)
        && ne[2] == 1
        && ne[3] == 1
}

/// True when the x86 tile kernels sum column `i` of a product of `ty` weights with `cols`
/// activation columns in their batched order, as llama.cpp does: Q4_K weights it repacks in
/// whole groups of four columns (repacked gemm; the rest as mat-vec), the other K-quants and
/// IQ4_XS from 8 columns on (its tiled K-quant matmul; fewer: `vec_dot`). The other types sum
/// every column alike.
pub fn batched_order(ty: DType, repacked: bool, cols: usize, i: usize) -> bool {
    match ty {
        DType::Q4_K if repacked => i < cols - cols % 4,
        DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => cols >= 8,
        _ => false,
    }
}

/// The operands of a tile call: `rows` weight rows of `n` values, `wstride` bytes apart in `w`,
/// and `cols` activation rows from [`quantize_act_tiled`], `astride` bytes apart in `a`; results
/// go to `out[c * ocs + r]`.
#[derive(Clone, Copy, Debug)]
pub struct Tile<'a> {
    /// Values per row.
    pub n: usize,
    /// Weight rows.
    pub w: &'a [u8],
    /// Bytes from one weight row to the next.
    pub wstride: usize,
    /// Weight rows to compute.
    pub rows: usize,
    /// Activation rows.
    pub a: &'a [u8],
    /// Bytes from one activation row to the next.
    pub astride: usize,
    /// Activation rows to compute.
    pub cols: usize,
    /// Output values from one column to the next.
    pub ocs: usize,
}

/// Dot products of the weight rows of type `ty` in `t` with its activation rows, into `out`;
/// each weight row is decoded once for all columns. Q4_K, Q4_0, IQ4_NL and MXFP4 rows take the
/// float steps of a weight llama.cpp repacks (see [`dot_tile_of`] for the others). False when
/// [`tiled`] does not hold or a length does not fit.
pub fn dot_tile(simd: Simd, ty: DType, t: &Tile<'_>, out: &mut [f32]) -> bool {
    dot_tile_of(simd, ty, t, out, true)
}

/// [`dot_tile`] for rows of a weight that llama.cpp repacks or not (`repacked`, from
/// [`repacked`]): for Q4_K the float steps differ (its repacked gemm/gemv kernels, or its tiled
/// matmul from 8 columns and `vec_dot` below), for Q4_0, IQ4_NL and MXFP4 too (its repacked
/// gemm/gemv: one `fma(dot, dw * da, acc)` per block, or `vec_dot`'s lanes); the other types
/// ignore it.
pub fn dot_tile_of(simd: Simd, ty: DType, t: &Tile<'_>, out: &mut [f32], repacked: bool) -> bool {
    #[cfg(target_arch = "x86_64")]
    if tiled(simd, ty) {
        return if prepared(ty) {
            x86::tile::dot_tile(ty, t, out, repacked)
        } else {
            x86::ktile::dot_tile(ty, t, out, repacked)
        };
    }
    let _ = (simd, ty, t, out, repacked);
    false
}

/// [`dot_tile`] for one weight row and activation rows given as plain `act_type(ty)` blocks
/// (`astride` bytes apart). False when no tile kernel applies.
fn dot_tile_q8(
    simd: Simd,
    ty: DType,
    n: usize,
    w: &[u8],
    a: &[u8],
    astride: usize,
    out: &mut [f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    if tiled(simd, ty) {
        let cols = out.len();
        if !prepared(ty) {
            let t = Tile {
                n,
                w,
                wstride: w.len(),
                rows: 1,
                a,
                astride,
                cols,
                ocs: 1,
            };
            return dot_tile(simd, ty, &t, out);
        }
        let pb = tiled_act_bytes(ty, n);
        let mut prep = vec![0u8; pb * cols];
        for (c, p) in prep.chunks_exact_mut(pb).enumerate() {
            let Some(row) = a.get(c * astride..) else {
                return false;
            };
            if !x86::tile::prepare_act(ty, n, row, p) {
                return false;
            }
        }
        let t = Tile {
            n,
            w,
            wstride: w.len(),
            rows: 1,
            a: &prep,
            astride: pb,
            cols,
            ocs: 1,
        };
        return dot_tile(simd, ty, &t, out);
    }
    let _ = (simd, ty, n, w, a, astride, out);
    false
}

/// Dot product of one weight row `w` (`n` values of type `ty`) with an activation row `a` already
/// quantized to `act_type(ty)`, on the given SIMD level.
pub fn vec_dot(simd: Simd, ty: DType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    // The tile kernels (and below, the multi-column kernels) first, with one column: every column
    // of a matmul then sees the same float accumulation order whatever the batch size, so prefill
    // and decode agree exactly.
    let mut out = [0f32];
    if dot_tile_q8(simd, ty, n, w, a, a.len(), &mut out) {
        return out[0];
    }
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Scalar {
        if x86::vec_dot_cols(ty, n, w, a, a.len(), &mut out) {
            return out[0];
        }
        if let Some(v) = x86::vec_dot(ty, n, w, a) {
            return v;
        }
    }
    vec_dot_scalar(ty, n, w, a)
}

/// Dot products of one weight row with several activation rows (`out.len()` of them, each
/// `astride` bytes after the previous in `a`); SIMD kernels decode each weight block once for all
/// columns, which is what makes prefill compute-efficient.
pub fn vec_dot_cols(
    simd: Simd,
    ty: DType,
    n: usize,
    w: &[u8],
    a: &[u8],
    astride: usize,
    out: &mut [f32],
) {
    if dot_tile_q8(simd, ty, n, w, a, astride, out) {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Scalar && x86::vec_dot_cols(ty, n, w, a, astride, out) {
        return;
    }
    if generic::dot_cols(ty, n, w, a, astride, out) {
        return;
    }
    for (c, o) in out.iter_mut().enumerate() {
        *o = vec_dot(simd, ty, n, w, &a[c * astride..]);
    }
}

/// The portable dot product (the reference for the SIMD paths).
pub fn vec_dot_scalar(ty: DType, n: usize, w: &[u8], a: &[u8]) -> f32 {
    let mut out = [0f32];
    if generic::dot_cols(ty, n, w, a, a.len(), &mut out) {
        return out[0];
    }
    let wb = ty.type_size();
    match ty {
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => {
            let mut acc = 0.0f32;
            for i in 0..n / QK_K {
                let s = decode_super(ty, &w[i * wb..(i + 1) * wb]);
                let ab = &a[i * Q8K_BYTES..(i + 1) * Q8K_BYTES];
                let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
                let (mut sumi, mut summ) = (0i32, 0i32);
                for g in 0..16 {
                    let mut dot = 0i32;
                    for l in 0..16 {
                        dot += s.q[16 * g + l] as i32 * ab[4 + 16 * g + l] as i8 as i32;
                    }
                    sumi += s.sc[g] as i32 * dot;
                    let bsum = i16::from_le_bytes([ab[4 + QK_K + 2 * g], ab[4 + QK_K + 2 * g + 1]]);
                    summ += s.mn[g] as i32 * bsum as i32;
                }
                acc += da * (s.d * sumi as f32 - s.dmin * summ as f32);
            }
            acc
        }
        _ => {
            let ab_size = if ty == DType::Q4_1 || ty == DType::Q5_1 {
                36
            } else {
                34
            };
            let aty = if ab_size == 36 {
                DType::Q8_1
            } else {
                DType::Q8_0
            };
            let mut acc = 0.0f32;
            for i in 0..n / QK {
                let s = decode_small(ty, &w[i * wb..(i + 1) * wb]);
                let ab = &a[i * ab_size..(i + 1) * ab_size];
                let qa = decode_small(aty, ab);
                let dot: i32 =
                    s.q.iter()
                        .zip(&qa.q)
                        .map(|(&x, &y)| x as i32 * y as i32)
                        .sum();
                acc += s.d * qa.d * dot as f32;
                if aty == DType::Q8_1 {
                    acc += s.m * f16_at(ab, 2);
                }
            }
            acc
        }
    }
}

/// Dot product of f32 `a` with a row of floats `w` of type F32, F16 or BF16.
pub fn dot_float(simd: Simd, ty: DType, w: &[u8], a: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Scalar {
        if let Some(v) = x86::dot_float(ty, w, a) {
            return v;
        }
    }
    let mut acc = 0.0f32;
    match ty {
        DType::F32 => {
            for (c, &x) in w.chunks_exact(4).zip(a) {
                acc += f32::from_le_bytes([c[0], c[1], c[2], c[3]]) * x;
            }
        }
        DType::F16 => {
            for (c, &x) in w.chunks_exact(2).zip(a) {
                acc += half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32() * x;
            }
        }
        _ => {
            for (c, &x) in w.chunks_exact(2).zip(a) {
                acc += half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32() * x;
            }
        }
    }
    acc
}

/// Converts a float row (F32/F16/BF16) or a row of Q8_0 blocks to f32 with SIMD; false when no
/// SIMD path applies.
pub fn convert_row(simd: Simd, ty: DType, src: &[u8], dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    if simd != Simd::Scalar {
        return x86::convert_row(ty, src, dst);
    }
    let _ = (simd, ty, src, dst);
    false
}
