//! AVX-512 VNNI row x column tiles for the 32-value block types (Q4_0, Q5_0, Q8_0).
//!
//! Weight rows are decoded once per call into unsigned bytes (the value plus a per-type offset)
//! and per-lane scale vectors; activation rows are prepared once per matmul into bytes, scale
//! vectors and the per-lane offset corrections `-offset * sum(a)`. The inner loop is then one
//! `vpdpbusd` (started from the correction, so every i32 lane equals the signed dot exactly), one
//! convert, one multiply and one FMA per row-column pair and 64 values, and each decoded weight
//! vector serves several columns, each activation vector several rows.
//!
//! Every (row, column) result has its own accumulator walked in block order, so a result does not
//! depend on the tile shape: one column, four columns, one row or many agree bit for bit.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::f16_load;
use crate::quant::blocks::QK;
use crate::tensor::DType;

/// Bytes of one decoded weight step (two blocks): 64 unsigned values, 16 f32 scales.
const W_STEP: usize = 128;
/// Bytes of one prepared activation step (two blocks): 64 i8 values, 16 f32 scales, 16 i32
/// offset corrections.
pub(crate) const A_STEP: usize = 192;
/// Rows per register tile.
const TR: usize = 4;
/// Columns per register tile.
const TC: usize = 4;

/// Two-block steps of an `n`-value row (an odd last block fills half a step, the rest zero).
pub(crate) fn steps(n: usize) -> usize {
    (n / QK).div_ceil(2)
}

/// The value offset that makes `ty`'s weights unsigned, or `None` for other types.
fn offset(ty: DType) -> Option<u8> {
    match ty {
        DType::Q8_0 => Some(128),
        DType::Q4_0 => Some(8),
        DType::Q5_0 => Some(16),
        _ => None,
    }
}

/// Prepares one activation row of `nb` Q8_0 blocks (`q8`) for weights of type `ty` into `out`
/// (`steps * A_STEP` bytes). False when the type or a length does not fit.
pub(crate) fn prepare_act(ty: DType, n: usize, q8: &[u8], out: &mut [u8]) -> bool {
    let Some(off) = offset(ty) else {
        return false;
    };
    let nb = n / QK;
    if !n.is_multiple_of(QK) || q8.len() < nb * 34 || out.len() < steps(n) * A_STEP {
        return false;
    }
    // SAFETY: the caller reached this through Simd::Avx512 detection (AVX-512 F/BW/VL/VNNI plus
    // AVX2/FMA/F16C); `q8` holds `nb` blocks and `out` `steps(n)` prepared steps (checked).
    unsafe { prepare_row(off, nb, q8.as_ptr(), out.as_mut_ptr()) };
    true
}

/// Quantizes `x` (whole 32-value blocks) to Q8_0 and prepares it for weights of type `ty` in
/// one pass: the same bytes as `quantize_act` followed by [`prepare_act`]. False when the type or
/// a length does not fit.
pub(crate) fn quantize_prepare(ty: DType, x: &[f32], out: &mut [u8]) -> bool {
    let Some(off) = offset(ty) else {
        return false;
    };
    let n = x.len();
    if !n.is_multiple_of(QK) || out.len() < steps(n) * A_STEP {
        return false;
    }
    // SAFETY: Simd::Avx512 detection (the only caller path) reported AVX-512 F/BW/VL/VNNI and
    // AVX2/FMA/F16C; `x` holds `n / 32` blocks, `out` `steps(n)` prepared steps (checked).
    unsafe { quantize_row(off, n / QK, x.as_ptr(), out.as_mut_ptr()) };
    true
}

/// Round to nearest, ties to even (`f32::round_ties_even`, ggml's x86 quantizers), of every
/// lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn round_even(r: __m512) -> __m512 {
    _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(r)
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `32 * nb` f32 readable at `x`, `ceil(nb / 2) * A_STEP` bytes
/// writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quantize_row(off: u8, nb: usize, x: *const f32, out: *mut u8) {
    let offv = _mm512_set1_epi8(off as i8);
    for s in 0..nb.div_ceil(2) {
        // SAFETY: blocks below `nb` are readable, the step's bytes writable (caller).
        unsafe {
            let o = out.add(s * A_STEP);
            for h in 0..2 {
                let i = 2 * s + h;
                let (q, d) = if i < nb {
                    let v0 = _mm512_loadu_ps(x.add(i * QK));
                    let v1 = _mm512_loadu_ps(x.add(i * QK + 16));
                    let amax =
                        _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
                    // The scalar quantizer's arithmetic (ggml's): values times 127 / amax,
                    // ties to even, the scale amax / 127 stored as f16.
                    let d = amax / 127.0;
                    let id = _mm512_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
                    let q0 = _mm512_cvtps_epi32(round_even(_mm512_mul_ps(v0, id)));
                    let q1 = _mm512_cvtps_epi32(round_even(_mm512_mul_ps(v1, id)));
                    let q = _mm256_set_m128i(_mm512_cvtepi32_epi8(q1), _mm512_cvtepi32_epi8(q0));
                    (q, half::f16::from_f32(d).to_f32())
                } else {
                    (_mm256_setzero_si256(), 0.0)
                };
                _mm256_storeu_si256(o.add(32 * h) as *mut __m256i, q);
                _mm256_storeu_ps(o.add(64 + 32 * h) as *mut f32, _mm256_set1_ps(d));
            }
            let a = _mm512_loadu_si512(o as *const _);
            let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offv, a);
            _mm512_storeu_si512(
                o.add(128) as *mut _,
                _mm512_sub_epi32(_mm512_setzero_si512(), sums),
            );
        }
    }
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` Q8_0 blocks readable at `q8`, `ceil(nb / 2) * A_STEP`
/// bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn prepare_row(off: u8, nb: usize, q8: *const u8, out: *mut u8) {
    let offv = _mm512_set1_epi8(off as i8);
    for s in 0..nb.div_ceil(2) {
        // SAFETY: blocks below `nb` are readable, the step's bytes writable (caller).
        unsafe {
            let o = out.add(s * A_STEP);
            for h in 0..2 {
                let i = 2 * s + h;
                let (q, d) = if i < nb {
                    let ab = q8.add(i * 34);
                    (
                        _mm256_loadu_si256(ab.add(2) as *const __m256i),
                        f16_load(ab),
                    )
                } else {
                    (_mm256_setzero_si256(), 0.0)
                };
                _mm256_storeu_si256(o.add(32 * h) as *mut __m256i, q);
                _mm256_storeu_ps(o.add(64 + 32 * h) as *mut f32, _mm256_set1_ps(d));
            }
            let a = _mm512_loadu_si512(o as *const _);
            let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), offv, a);
            _mm512_storeu_si512(
                o.add(128) as *mut _,
                _mm512_sub_epi32(_mm512_setzero_si512(), sums),
            );
        }
    }
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks of `ty` (Q4_0, Q5_0 or Q8_0) readable at `w`,
/// `ceil(nb / 2) * W_STEP` bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_row(ty: DType, nb: usize, w: *const u8, out: *mut u8) {
    let bs = ty.type_size();
    let m4 = _mm256_set1_epi8(0x0f);
    let bit5 = _mm256_set1_epi8(0x10);
    let flip = _mm256_set1_epi8(0x80_u8 as i8);
    for s in 0..nb.div_ceil(2) {
        // SAFETY: blocks below `nb` are readable, the step's bytes writable (caller).
        unsafe {
            let o = out.add(s * W_STEP);
            for h in 0..2 {
                let i = 2 * s + h;
                let (q, d) = if i < nb {
                    let wb = w.add(i * bs);
                    let q = match ty {
                        DType::Q8_0 => {
                            _mm256_xor_si256(_mm256_loadu_si256(wb.add(2) as *const __m256i), flip)
                        }
                        DType::Q4_0 => {
                            let t = _mm_loadu_si128(wb.add(2) as *const __m128i);
                            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4)
                        }
                        _ => {
                            let qh = std::ptr::read_unaligned(wb.add(2) as *const u32);
                            let t = _mm_loadu_si128(wb.add(6) as *const __m128i);
                            let nib =
                                _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4);
                            _mm256_or_si256(nib, _mm256_maskz_mov_epi8(qh, bit5))
                        }
                    };
                    (q, f16_load(wb))
                } else {
                    (_mm256_setzero_si256(), 0.0)
                };
                _mm256_storeu_si256(o.add(32 * h) as *mut __m256i, q);
                _mm256_storeu_ps(o.add(64 + 32 * h) as *mut f32, _mm256_set1_ps(d));
            }
        }
    }
}

/// `R` decoded weight rows (`wstride` bytes apart) times `C` prepared activation rows
/// (`astride` bytes apart), `steps` steps each; `out[r][c]`.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; every row holds `steps` steps.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const C: usize>(
    steps: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[f32; C]; R] {
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    for s in 0..steps {
        // SAFETY: step `s` of every row is in bounds (caller).
        unsafe {
            let mut wv = [_mm512_setzero_si512(); R];
            let mut dw = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let p = w.add(r * wstride + s * W_STEP);
                wv[r] = _mm512_loadu_si512(p as *const _);
                dw[r] = _mm512_loadu_ps(p.add(64) as *const f32);
            }
            for c in 0..C {
                let p = a.add(c * astride + s * A_STEP);
                let av = _mm512_loadu_si512(p as *const _);
                let da = _mm512_loadu_ps(p.add(64) as *const f32);
                let corr = _mm512_loadu_si512(p.add(128) as *const _);
                for r in 0..R {
                    let d = _mm512_mul_ps(dw[r], da);
                    let q = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(corr, wv[r], av));
                    acc[r][c] = _mm512_fmadd_ps(d, q, acc[r][c]);
                }
            }
        }
    }
    reduce_tile(&acc)
}

/// Horizontal sums of four vectors, each in the same lane order (halves, quarters, then pairs),
/// so a result never depends on which vectors were reduced together.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum4(v: [__m512; 4]) -> __m128 {
    let mut q = [_mm_setzero_ps(); 4];
    for (qi, &x) in q.iter_mut().zip(v.iter()) {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x)));
        let y = _mm256_add_ps(_mm512_castps512_ps256(x), hi);
        *qi = _mm_add_ps(_mm256_castps256_ps128(y), _mm256_extractf128_ps::<1>(y));
    }
    _mm_hadd_ps(_mm_hadd_ps(q[0], q[1]), _mm_hadd_ps(q[2], q[3]))
}

/// The horizontal sum of every accumulator of an `R x C` tile, four at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) fn reduce_tile<const R: usize, const C: usize>(acc: &[[__m512; C]; R]) -> [[f32; C]; R] {
    let mut out = [[0f32; C]; R];
    let mut k = 0;
    while k < R * C {
        let mut v = [_mm512_setzero_ps(); 4];
        for (j, vj) in v.iter_mut().enumerate() {
            if k + j < R * C {
                *vj = acc[(k + j) / C][(k + j) % C];
            }
        }
        let mut s = [0f32; 4];
        // SAFETY: `s` has room for four f32.
        unsafe { _mm_storeu_ps(s.as_mut_ptr(), hsum4(v)) };
        for (j, &sj) in s.iter().enumerate() {
            if k + j < R * C {
                out[(k + j) / C][(k + j) % C] = sj;
            }
        }
        k += 4;
    }
    out
}

thread_local! {
    /// Decoded weight rows of the current call (reused: no allocation per call).
    static DECODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Dot products of `rows` weight rows (`n` values of `ty` each, `wstride` bytes apart in `w`)
/// with `cols` prepared activation rows (`astride` bytes apart in `a`): `out[c * ocs + r]`.
/// False when the type or a length does not fit.
#[allow(clippy::too_many_arguments)]
pub(crate) fn dot_tile(
    ty: DType,
    n: usize,
    w: &[u8],
    wstride: usize,
    rows: usize,
    a: &[u8],
    astride: usize,
    cols: usize,
    out: &mut [f32],
    ocs: usize,
) -> bool {
    let nb = n / QK;
    let st = steps(n);
    let bs = ty.type_size();
    if offset(ty).is_none()
        || !n.is_multiple_of(QK)
        || rows == 0
        || cols == 0
        || wstride < nb * bs
        || w.len() < (rows - 1) * wstride + nb * bs
        || astride < st * A_STEP
        || a.len() < (cols - 1) * astride + st * A_STEP
        || ocs < rows
        || out.len() < (cols - 1) * ocs + rows
    {
        return false;
    }
    DECODED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let drb = st * W_STEP;
        if buf.len() < TR * drb {
            buf.resize(TR * drb, 0);
        }
        let mut r0 = 0;
        while r0 < rows {
            let rn = (rows - r0).min(TR);
            for r in 0..rn {
                // SAFETY: Simd::Avx512 detection (the only caller path) reported the features;
                // row `r0 + r` holds `nb` blocks (checked above), the buffer `TR * drb` bytes.
                unsafe {
                    decode_row(
                        ty,
                        nb,
                        w.as_ptr().add((r0 + r) * wstride),
                        buf.as_mut_ptr().add(r * drb),
                    )
                };
            }
            let mut c0 = 0;
            while c0 < cols {
                let cn = (cols - c0).min(TC);
                let ap = a[c0 * astride..].as_ptr();
                let wp = buf.as_ptr();
                macro_rules! go {
                    ($r:literal, $c:literal) => {{
                        // SAFETY: AVX-512 VNNI detected (caller path); `$r` decoded rows of
                        // `st` steps in the buffer, `$c` prepared rows of `st` steps (checked).
                        let res = unsafe { tile::<$r, $c>(st, wp, drb, ap, astride) };
                        for (r, row) in res.iter().enumerate() {
                            for (c, &v) in row.iter().enumerate() {
                                out[(c0 + c) * ocs + r0 + r] = v;
                            }
                        }
                    }};
                }
                match (rn, cn) {
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
