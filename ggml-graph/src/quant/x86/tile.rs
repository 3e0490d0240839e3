//! AVX-512 VNNI row x column tiles for the 32-value block types: Q4_0, Q5_0, Q8_0, IQ4_NL and
//! MXFP4 with Q8_0 activations, Q4_1 and Q5_1 with Q8_1 activations.
//!
//! Every (row, column) result accumulates exactly as ggml's x86 kernels do (its `vec_dot` for one
//! column and llamafile's tinyBLAS for several): eight f32 lanes, one 32-value block per step,
//! `acc = fma(dw * da, lanes, acc)`, then ggml's eight-lane horizontal sum. So with ggml's 8-bit
//! activations the products match llama.cpp bit for bit, and decode (one column) equals prefill.
//! IQ4_NL and MXFP4 take the same steps, which are not llama.cpp's for them (its x86 kernels
//! accumulate two blocks per FMA, or repack the weights). Not followed: Q4_0 weights whose row count is a multiple of 8, which llama.cpp repacks on
//! AVX2 and up (`gemv/gemm_q4_0_8x8_q8_0`, another float order; see `quant::repacked`).
//!
//! Speed comes from the layout: weight rows are decoded in pairs, once per call, into unsigned
//! bytes (the value plus a per-type offset) with the two rows' blocks side by side in one 512-bit
//! vector, plus their scales; activation blocks are prepared once per matmul with the per-lane
//! offset corrections `-offset * sum(a)`, broadcast to both halves. One `vpdpbusd` (started from
//! the correction, so each i32 lane equals the signed dot exactly), one convert, one multiply and
//! one FMA then advance two rows of one column by a block.
//!
//! Q4_1 and Q5_1 (unsigned values, offset 0) add ggml's min term, `m * s` per block on its own
//! chain (a multiply, then an add: `vec_dot_q4_1_q8_1`'s `summs`), to the horizontal sum at the
//! end, as their AVX2 kernel does; the pair blocks carry the two rows' `m` and the prepared
//! activation blocks their `s`.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{decode_small_simd, f16_load, scatter_rows, tile_fits};
use crate::quant::blocks::QK;
use crate::quant::Tile;
use crate::tensor::DType;

/// Bytes of one decoded block of a row pair: 2 x 32 unsigned values, 2 x 8 f32 scales.
const W_BLK: usize = 128;
/// [`W_BLK`] for the types with a min (Q4_1, Q5_1): the two rows' f32 mins follow, padded.
const W_BLK_MIN: usize = 192;
/// Bytes of one prepared activation block: 32 i8 values, 8 i32 offset corrections, f32 scale,
/// f32 sum term `s` (Q8_1), the i32 correction of the whole block (their sum, for
/// [`super::rtile`]), padding.
pub(crate) const A_BLK: usize = 128;
/// Row pairs per register tile (4 x 4 columns: 16 accumulators; Gemma's 640x2048 Q5_0 with 128
/// columns ran ~12% faster than with 2 pairs, the weight and activation loads shared wider).
const TP: usize = 4;
/// Columns per register tile.
const TC: usize = 4;
/// Rows in flight in the one- and two-column kernel.
const DIRECT_ROWS: usize = 4;

/// The value offset that makes `ty`'s weights unsigned, or `None` for other types.
fn offset(ty: DType) -> Option<u8> {
    match ty {
        DType::Q8_0 | DType::IQ4_NL | DType::MXFP4 => Some(128),
        DType::Q4_0 => Some(8),
        DType::Q5_0 => Some(16),
        DType::Q4_1 | DType::Q5_1 => Some(0),
        _ => None,
    }
}

/// True for the types whose blocks carry a min (dotted with Q8_1 activations).
fn has_min(ty: DType) -> bool {
    matches!(ty, DType::Q4_1 | DType::Q5_1)
}

/// Prepares one activation row of `n / 32` Q8_0 blocks (Q8_1 for Q4_1/Q5_1 weights; `q8`) for
/// weights of type `ty` into `out` (`n / 32 * A_BLK` bytes). False when the type or a length
/// does not fit.
pub(crate) fn prepare_act(ty: DType, n: usize, q8: &[u8], out: &mut [u8]) -> bool {
    let Some(off) = offset(ty) else {
        return false;
    };
    let nb = n / QK;
    let ab = if has_min(ty) { 36 } else { 34 };
    if !n.is_multiple_of(QK) || q8.len() < nb * ab || out.len() < nb * A_BLK {
        return false;
    }
    // SAFETY: the caller reached this through Simd::Avx512 detection (AVX-512 F/BW/VL/VNNI plus
    // AVX2/FMA/F16C); `q8` holds `nb` blocks of `ab` bytes and `out` `nb` prepared blocks
    // (checked).
    unsafe { prepare_row(off, has_min(ty), nb, q8.as_ptr(), out.as_mut_ptr()) };
    true
}

/// Quantizes `x` (whole 32-value blocks) to Q8_0 and prepares it for weights of type `ty` in
/// one pass: the same values as `quantize_act` followed by [`prepare_act`]. False when the type
/// or a length does not fit.
pub(crate) fn quantize_prepare(ty: DType, x: &[f32], out: &mut [u8]) -> bool {
    let Some(off) = offset(ty) else {
        return false;
    };
    let n = x.len();
    if !n.is_multiple_of(QK) || out.len() < n / QK * A_BLK {
        return false;
    }
    // SAFETY: Simd::Avx512 detection (the only caller path) reported AVX-512 F/BW/VL/VNNI and
    // AVX2/FMA/F16C; `x` holds `n / 32` blocks, `out` as many prepared blocks (checked).
    unsafe { quantize_row(off, has_min(ty), n / QK, x.as_ptr(), out.as_mut_ptr()) };
    true
}

/// Round to nearest, ties to even (`f32::round_ties_even`, ggml's x86 quantizers), of every
/// lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn round_even(r: __m512) -> __m512 {
    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(r)
}

/// Writes one prepared block: values, offset corrections, scale, sum term.
///
/// # Safety
/// AVX-512 VL/VNNI; `A_BLK` bytes writable at `o`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn put_act(off: u8, q: __m256i, d: f32, sum: f32, o: *mut u8) {
    let sums = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(off as i8), q);
    // SAFETY: `A_BLK` bytes writable at `o` (caller).
    unsafe {
        _mm256_storeu_si256(o as *mut __m256i, q);
        _mm256_storeu_si256(
            o.add(32) as *mut __m256i,
            _mm256_sub_epi32(_mm256_setzero_si256(), sums),
        );
        std::ptr::write_unaligned(o.add(64) as *mut f32, d);
        std::ptr::write_unaligned(o.add(68) as *mut f32, sum);
        let whole = _mm512_reduce_add_epi32(_mm512_zextsi256_si512(sums));
        std::ptr::write_unaligned(o.add(72) as *mut i32, -whole);
    }
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `32 * nb` f32 readable at `x`, `nb * A_BLK` bytes writable at
/// `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quantize_row(off: u8, with_sum: bool, nb: usize, x: *const f32, out: *mut u8) {
    for i in 0..nb {
        // SAFETY: block `i` is readable and its prepared bytes writable (caller).
        unsafe {
            let v0 = _mm512_loadu_ps(x.add(i * QK));
            let v1 = _mm512_loadu_ps(x.add(i * QK + 16));
            let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
            // The portable quantizer's arithmetic (ggml's x86 one): values times 127 / amax,
            // ties to even, the scale amax / 127 stored as f16.
            let d = amax / 127.0;
            let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
            let q0 = _mm512_cvtps_epi32(round_even(_mm512_mul_ps(v0, id)));
            let q1 = _mm512_cvtps_epi32(round_even(_mm512_mul_ps(v1, id)));
            let q = _mm256_set_m128i(_mm512_cvtepi32_epi8(q1), _mm512_cvtepi32_epi8(q0));
            // Q8_1's `s`: the unrounded scale times the values' sum, stored as f16.
            let sum = if with_sum {
                let n = _mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1));
                half::f16::from_f32(d * n as f32).to_f32()
            } else {
                0.0
            };
            put_act(
                off,
                q,
                half::f16::from_f32(d).to_f32(),
                sum,
                out.add(i * A_BLK),
            );
        }
    }
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` Q8_0 blocks (Q8_1 when `with_sum`) readable at `q8`,
/// `nb * A_BLK` bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn prepare_row(off: u8, with_sum: bool, nb: usize, q8: *const u8, out: *mut u8) {
    let (bytes, start) = if with_sum { (36, 4) } else { (34, 2) };
    for i in 0..nb {
        // SAFETY: block `i` is readable and its prepared bytes writable (caller).
        unsafe {
            let ab = q8.add(i * bytes);
            let q = _mm256_loadu_si256(ab.add(start) as *const __m256i);
            let sum = if with_sum { f16_load(ab.add(2)) } else { 0.0 };
            put_act(off, q, f16_load(ab), sum, out.add(i * A_BLK));
        }
    }
}

/// Block `i` of a weight row as unsigned bytes (value plus offset), its scale and its min (0 for
/// the types without one).
///
/// # Safety
/// AVX-512 BW/VL and F16C; block `i` of `ty` readable at `w`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_block(ty: DType, w: *const u8, i: usize) -> (__m256i, f32, f32) {
    let m4 = _mm256_set1_epi8(0x0f);
    let nibbles = |p: *const u8| {
        // SAFETY: 16 readable bytes at `p` (inside the block, caller).
        let t = unsafe { _mm_loadu_si128(p as *const __m128i) };
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4)
    };
    // Bit j of the u32 at `p` as 0x10 in byte j.
    let high = |p: *const u8| {
        // SAFETY: 4 readable bytes at `p` (inside the block, caller).
        let qh = unsafe { std::ptr::read_unaligned(p as *const u32) };
        _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10))
    };
    // SAFETY: block `i` readable at `w` (caller).
    unsafe {
        let wb = w.add(i * ty.type_size());
        let flip = _mm256_set1_epi8(0x80_u8 as i8);
        let q = match ty {
            DType::Q8_0 => _mm256_xor_si256(_mm256_loadu_si256(wb.add(2) as *const __m256i), flip),
            DType::IQ4_NL | DType::MXFP4 => {
                let (d, q) = decode_small_simd(ty, wb);
                return (_mm256_xor_si256(q, flip), d, 0.0);
            }
            DType::Q4_0 => nibbles(wb.add(2)),
            DType::Q4_1 => return (nibbles(wb.add(4)), f16_load(wb), f16_load(wb.add(2))),
            DType::Q5_1 => {
                let q = _mm256_or_si256(nibbles(wb.add(8)), high(wb.add(4)));
                return (q, f16_load(wb), f16_load(wb.add(2)));
            }
            _ => _mm256_or_si256(nibbles(wb.add(6)), high(wb.add(2))),
        };
        (q, f16_load(wb), 0.0)
    }
}

/// Bytes of a pair block of `ty`.
fn pair_block(ty: DType) -> usize {
    if has_min(ty) {
        W_BLK_MIN
    } else {
        W_BLK
    }
}

/// Decodes rows `w0` and (when present) `w1`, `nb` blocks of `ty` each, into `nb` pair blocks at
/// `out`; a missing second row decodes as zeros.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks readable at `w0` (and `w1`),
/// `nb * pair_block(ty)` bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_pair(ty: DType, nb: usize, w0: *const u8, w1: Option<*const u8>, out: *mut u8) {
    let pb = pair_block(ty);
    for i in 0..nb {
        // SAFETY: block `i` of both rows is readable, the pair block writable (caller).
        unsafe {
            let o = out.add(i * pb);
            let (q0, d0, m0) = decode_block(ty, w0, i);
            let (q1, d1, m1) = match w1 {
                Some(w1) => decode_block(ty, w1, i),
                None => (_mm256_setzero_si256(), 0.0, 0.0),
            };
            _mm256_storeu_si256(o as *mut __m256i, q0);
            _mm256_storeu_si256(o.add(32) as *mut __m256i, q1);
            _mm256_storeu_ps(o.add(64) as *mut f32, _mm256_set1_ps(d0));
            _mm256_storeu_ps(o.add(96) as *mut f32, _mm256_set1_ps(d1));
            if pb == W_BLK_MIN {
                _mm_storeu_ps(o.add(W_BLK) as *mut f32, _mm_setr_ps(m0, m1, 0.0, 0.0));
            }
        }
    }
}

/// `P` decoded row pairs (`wstride` bytes apart) times `C` prepared activation rows (`astride`
/// bytes apart), `nb` blocks each: `out[2p + h][c]`. `MIN`: pair blocks of [`W_BLK_MIN`] bytes
/// whose min terms are added (Q4_1, Q5_1).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; every row holds `nb` blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const P: usize, const C: usize, const MIN: bool>(
    nb: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[[f32; C]; 2]; P] {
    let pb = if MIN { W_BLK_MIN } else { W_BLK };
    let mut acc = [[_mm512_setzero_ps(); C]; P];
    // Lanes 0 and 1: the min chains of the pair's two rows.
    let mut summ = [[_mm_setzero_ps(); C]; P];
    for i in 0..nb {
        // SAFETY: block `i` of every row is in bounds (caller).
        unsafe {
            let mut wv = [_mm512_setzero_si512(); P];
            let mut dw = [_mm512_setzero_ps(); P];
            let mut mw = [_mm_setzero_ps(); P];
            for p in 0..P {
                let wp = w.add(p * wstride + i * pb);
                wv[p] = _mm512_loadu_si512(wp as *const _);
                dw[p] = _mm512_loadu_ps(wp.add(64) as *const f32);
                if MIN {
                    mw[p] = _mm_loadu_ps(wp.add(W_BLK) as *const f32);
                }
            }
            for c in 0..C {
                let ap = a.add(c * astride + i * A_BLK);
                let av = _mm512_broadcast_i64x4(_mm256_loadu_si256(ap as *const __m256i));
                let corr = _mm512_broadcast_i64x4(_mm256_loadu_si256(ap.add(32) as *const __m256i));
                let da = _mm512_set1_ps(std::ptr::read_unaligned(ap.add(64) as *const f32));
                let sa = _mm_set1_ps(std::ptr::read_unaligned(ap.add(68) as *const f32));
                for p in 0..P {
                    let d = _mm512_mul_ps(dw[p], da);
                    let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr, wv[p], av));
                    acc[p][c] = _mm512_fmadd_ps(d, q, acc[p][c]);
                    if MIN {
                        summ[p][c] = _mm_add_ps(summ[p][c], _mm_mul_ps(mw[p], sa));
                    }
                }
            }
        }
    }
    let mut out = [[[0f32; C]; 2]; P];
    for p in 0..P {
        for c in 0..C {
            let [lo, hi] = hsum8x2(acc[p][c]);
            if MIN {
                let mut m = [0f32; 4];
                // SAFETY: `m` holds four floats.
                unsafe { _mm_storeu_ps(m.as_mut_ptr(), summ[p][c]) };
                out[p][0][c] = lo + m[0];
                out[p][1][c] = hi + m[1];
            } else {
                out[p][0][c] = lo;
                out[p][1][c] = hi;
            }
        }
    }
    out
}

/// `R` weight rows (`wstride` bytes apart) read straight from their blocks (decoded in
/// registers) times `C` prepared columns: [`tile`]'s arithmetic on 256-bit lanes (a row's half of
/// a pair), for decode, where the rows stream from memory once. Each row keeps its own
/// accumulator, so several rows in flight hide the FMA chain's latency without changing a bit;
/// the type is matched once per call, not per block.
///
/// # Safety
/// AVX-512 VL/VNNI and F16C; `nb` blocks of `ty` (one [`offset`] takes) readable at
/// `w + r * wstride` for every `r < R`, `C` prepared activation rows of `nb` blocks at
/// `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_direct<const R: usize, const C: usize>(
    ty: DType,
    nb: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[f32; C]; R] {
    // SAFETY: forwarded from the caller; each arm fixes the type so the block decode is
    // specialized.
    unsafe {
        match ty {
            DType::Q8_0 => rows_direct_body::<R, C>(DType::Q8_0, nb, w, wstride, a, astride),
            DType::Q4_0 => rows_direct_body::<R, C>(DType::Q4_0, nb, w, wstride, a, astride),
            DType::IQ4_NL => rows_direct_body::<R, C>(DType::IQ4_NL, nb, w, wstride, a, astride),
            DType::MXFP4 => rows_direct_body::<R, C>(DType::MXFP4, nb, w, wstride, a, astride),
            DType::Q4_1 => rows_direct_body::<R, C>(DType::Q4_1, nb, w, wstride, a, astride),
            DType::Q5_1 => rows_direct_body::<R, C>(DType::Q5_1, nb, w, wstride, a, astride),
            _ => rows_direct_body::<R, C>(DType::Q5_0, nb, w, wstride, a, astride),
        }
    }
}

/// The loop of [`rows_direct`], always inlined into it (no target features of its own, which
/// `inline(always)` requires).
///
/// # Safety
/// Only called from functions compiled with AVX-512 VL/VNNI and F16C; as [`rows_direct`].
#[inline(always)]
unsafe fn rows_direct_body<const R: usize, const C: usize>(
    ty: DType,
    nb: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[f32; C]; R] {
    // SAFETY: the caller runs with the features these intrinsics need; block `i` of every row
    // and of every activation row is in bounds (caller).
    unsafe {
        let mut acc = [[_mm256_setzero_ps(); C]; R];
        // Q4_1/Q5_1's min chains (`m * s` per block, a multiply then an add).
        let mut summ = [[0f32; C]; R];
        let min = has_min(ty);
        // The next group of rows, a few lines per block step: with several rows in flight the
        // accesses are no longer one sequential stream, which the hardware prefetcher follows
        // less well.
        let next = w.wrapping_add(R * wstride);
        let lines = (R * wstride).div_ceil(64 * nb.max(1));
        for i in 0..nb {
            if R > 1 {
                for l in 0..lines {
                    _mm_prefetch::<_MM_HINT_T0>(
                        next.wrapping_add((i * lines + l) * 64) as *const i8
                    );
                }
            }
            let mut av = [_mm256_setzero_si256(); C];
            let mut corr = [_mm256_setzero_si256(); C];
            let mut da = [0f32; C];
            let mut sa = [0f32; C];
            for c in 0..C {
                let ap = a.add(c * astride + i * A_BLK);
                av[c] = _mm256_loadu_si256(ap as *const __m256i);
                corr[c] = _mm256_loadu_si256(ap.add(32) as *const __m256i);
                da[c] = std::ptr::read_unaligned(ap.add(64) as *const f32);
                sa[c] = std::ptr::read_unaligned(ap.add(68) as *const f32);
            }
            for (r, (acc, summ)) in acc.iter_mut().zip(summ.iter_mut()).enumerate() {
                let (q, dw, mw) = decode_block(ty, w.add(r * wstride), i);
                for c in 0..C {
                    // The same rounding as `_mm256_mul_ps` of the broadcast scales.
                    let d = _mm256_set1_ps(dw * da[c]);
                    let p = _mm256_cvtepi32_ps(_mm256_dpbusd_epi32(corr[c], q, av[c]));
                    acc[c] = _mm256_fmadd_ps(d, p, acc[c]);
                    if min {
                        summ[c] += mw * sa[c];
                    }
                }
            }
        }
        let mut out = [[0f32; C]; R];
        for ((o, acc), summ) in out.iter_mut().zip(acc.iter()).zip(summ.iter()) {
            for ((o, &v), &m) in o.iter_mut().zip(acc.iter()).zip(summ.iter()) {
                let [lo, _] = hsum8x2(_mm512_castps256_ps512(v));
                *o = if min { lo + m } else { lo };
            }
        }
        out
    }
}

/// ggml's eight-lane horizontal sum (`hsum_float_8`: 128-bit halves, then `movehl`, then
/// `movehdup`) of each 256-bit half of `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum8x2(x: __m512) -> [f32; 2] {
    let lo = _mm512_castps512_ps256(x);
    let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
    let s_lo = _mm_add_ps(_mm256_extractf128_ps::<1>(lo), _mm256_castps256_ps128(lo));
    let s_hi = _mm_add_ps(_mm256_extractf128_ps::<1>(hi), _mm256_castps256_ps128(hi));
    let y = _mm256_set_m128(s_hi, s_lo);
    let y = _mm256_add_ps(y, _mm256_permute_ps::<0b1110_1110>(y));
    let y = _mm256_add_ps(y, _mm256_movehdup_ps(y));
    [
        _mm256_cvtss_f32(y),
        _mm_cvtss_f32(_mm256_extractf128_ps::<1>(y)),
    ]
}

thread_local! {
    /// Decoded weight rows of the current call (reused: no allocation per call).
    static DECODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Dot products of `rows` weight rows (`n` values of `ty` each, `wstride` bytes apart in `w`)
/// with `cols` prepared activation rows (`astride` bytes apart in `a`): `out[c * ocs + r]`.
/// Q4_0, IQ4_NL and MXFP4 rows of a weight llama.cpp repacks (`repacked`) take its repacked
/// kernels' order ([`super::rtile`]), the others ggml's `vec_dot` order. False when the type or
/// a length does not fit.
pub(crate) fn dot_tile(ty: DType, t: &Tile<'_>, out: &mut [f32], repacked: bool) -> bool {
    let Tile {
        n,
        w,
        wstride,
        rows,
        a,
        astride,
        cols,
        ocs,
    } = *t;
    let nb = n / QK;
    let bs = ty.type_size();
    if offset(ty).is_none() || !n.is_multiple_of(QK) || !tile_fits(nb, bs, A_BLK, t, out) {
        return false;
    }
    if repacked && super::rtile::supported(ty) {
        super::rtile::dot_tile(ty, t, out);
        return true;
    }
    if cols <= 2 {
        let mut r = 0;
        while r < rows {
            let rn = if rows - r >= DIRECT_ROWS {
                DIRECT_ROWS
            } else {
                1
            };
            let (wr, ap) = (w[r * wstride..].as_ptr(), a.as_ptr());
            macro_rules! go {
                ($r:literal, $c:literal) => {{
                    // SAFETY: AVX-512 VNNI detected (caller path); rows `r..r + $r` hold `nb`
                    // blocks and the `$c` prepared rows `nb` blocks each (checked above).
                    let v = unsafe { rows_direct::<$r, $c>(ty, nb, wr, wstride, ap, astride) };
                    scatter_rows(&v, out, ocs, r);
                }};
            }
            match (rn, cols) {
                (DIRECT_ROWS, 2) => go!(4, 2),
                (DIRECT_ROWS, _) => go!(4, 1),
                (_, 2) => go!(1, 2),
                _ => go!(1, 1),
            }
            r += rn;
        }
        return true;
    }
    let min = has_min(ty);
    DECODED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let dpb = nb * pair_block(ty);
        if buf.len() < TP * dpb {
            buf.resize(TP * dpb, 0);
        }
        let mut r0 = 0;
        while r0 < rows {
            let rn = (rows - r0).min(2 * TP);
            let np = rn.div_ceil(2);
            for p in 0..np {
                let r = r0 + 2 * p;
                let w1 = (r + 1 < r0 + rn).then(|| w[(r + 1) * wstride..].as_ptr());
                // SAFETY: Simd::Avx512 detection (the only caller path) reported the features;
                // rows `r` and `r + 1` (when present) hold `nb` blocks (checked above), the
                // buffer `TP * dpb` bytes.
                unsafe {
                    decode_pair(
                        ty,
                        nb,
                        w[r * wstride..].as_ptr(),
                        w1,
                        buf.as_mut_ptr().add(p * dpb),
                    )
                };
            }
            let mut c0 = 0;
            while c0 < cols {
                let cn = (cols - c0).min(TC);
                let ap = a[c0 * astride..].as_ptr();
                let wp = buf.as_ptr();
                macro_rules! go {
                    ($p:literal, $c:literal) => {{
                        // SAFETY: AVX-512 VNNI detected (caller path); `$p` decoded pairs of
                        // `nb` blocks in the buffer, `$c` prepared rows of `nb` blocks (checked).
                        let res = unsafe {
                            if min {
                                tile::<$p, $c, true>(nb, wp, dpb, ap, astride)
                            } else {
                                tile::<$p, $c, false>(nb, wp, dpb, ap, astride)
                            }
                        };
                        for (p, pair) in res.iter().enumerate() {
                            for (h, row) in pair.iter().enumerate() {
                                let r = 2 * p + h;
                                if r < rn {
                                    for (c, &v) in row.iter().enumerate() {
                                        out[(c0 + c) * ocs + r0 + r] = v;
                                    }
                                }
                            }
                        }
                    }};
                }
                match (np, cn) {
                    (4, 4) => go!(4, 4),
                    (4, 3) => go!(4, 3),
                    (4, 2) => go!(4, 2),
                    (4, 1) => go!(4, 1),
                    (3, 4) => go!(3, 4),
                    (3, 3) => go!(3, 3),
                    (3, 2) => go!(3, 2),
                    (3, 1) => go!(3, 1),
                    (2, 4) => go!(2, 4),
                    (2, 3) => go!(2, 3),
                    (2, 2) => go!(2, 2),
                    (2, 1) => go!(2, 1),
                    (1, 4) => go!(1, 4),
                    (1, 3) => go!(1, 3),
                    (1, 2) => go!(1, 2),
                    _ => go!(1, 1),
                }
                c0 += cn;
            }
            r0 += rn;
        }
    });
    true
}
