//! AVX2 dot products of Q2_K and Q3_K weight rows with one or several Q8_K activation rows.
//!
//! Both types hold 2-bit low parts in the same interleaving (byte `l` of a 32-byte chunk carries
//! values `l`, `l + 32`, `l + 64`, `l + 96` of a 128-value half), so one 32-byte load and four
//! shifts give four 32-value runs, each spanning two 16-value scale groups. Every run is dotted
//! with `maddubs` (unsigned weight x signed activation) and weighted by the two group scales with
//! one `madd`. Q2_K's mins and Q3_K's "high bit clear means minus 4" are handled differently:
//! the mins come from the activation's precomputed group sums; the Q3_K offset is a second
//! `maddubs` of 4-or-0 bytes subtracted before scaling.

use std::arch::x86_64::*;

use super::super::blocks::QK_K;
use super::super::Q8K_BYTES;
use super::{f16_load, hsum};
use crate::tensor::DType;

/// Q2_K block bytes: 16 scale/min nibble pairs, 64 bytes of 2-bit values, f16 d, f16 dmin.
pub(super) const Q2K_BYTES: usize = 84;
/// Q3_K block bytes: 32 high-bit bytes, 64 bytes of 2-bit values, 12 packed scales, f16 d.
pub(super) const Q3K_BYTES: usize = 110;

/// Shuffle selector repeating byte `g` over the low 8 lanes and byte `g + 1` over the high 8,
/// so that widening to i16 gives the scales of groups `g` and `g + 1` for one 32-value run.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn pair_sel(g: usize) -> __m128i {
    const ONES: u64 = 0x0101_0101_0101_0101;
    _mm_set_epi64x(((g as u64 + 1) * ONES) as i64, (g as u64 * ONES) as i64)
}

/// Q2_K or Q3_K (by `ty`) dot products of one weight row with `C` Q8_K rows.
///
/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` blocks of `ty` and each of the `C` activation rows at
/// `a + c * astride` holds `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn cols_k23<const C: usize>(
    ty: DType,
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    // SAFETY: same contract as this function's (caller).
    unsafe {
        if ty == DType::Q2_K {
            cols_q2_k::<C>(nb, w, a, astride)
        } else {
            cols_q3_k::<C>(nb, w, a, astride)
        }
    }
}

/// The sixteen signed 6-bit scales of a Q3_K block (12 packed bytes at `p`, biased by 32) as
/// i8 lanes: low nibbles from bytes 0..8, high 2 bits from bytes 8..12.
///
/// # Safety
/// AVX2/FMA/F16C; 12 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q3k_scales_simd(p: *const u8) -> __m128i {
    // SAFETY: 12 readable bytes at `p` (caller).
    let (lo, hi) = unsafe {
        (
            std::ptr::read_unaligned(p as *const u64),
            std::ptr::read_unaligned(p.add(8) as *const u32),
        )
    };
    const K2: u32 = 0x0f0f_0f0f;
    const K1: u32 = 0x0303_0303;
    let (a0, a1) = (lo as u32, (lo >> 32) as u32);
    let v = _mm_set_epi32(
        (((a1 >> 4) & K2) | (((hi >> 6) & K1) << 4)) as i32,
        (((a0 >> 4) & K2) | (((hi >> 4) & K1) << 4)) as i32,
        ((a1 & K2) | (((hi >> 2) & K1) << 4)) as i32,
        ((a0 & K2) | ((hi & K1) << 4)) as i32,
    );
    _mm_sub_epi8(v, _mm_set1_epi8(32))
}

/// Dot products of one Q2_K row (`nb` blocks at `w`) with `C` Q8_K rows at `a + c * astride`.
///
/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q2_K blocks and each of the `C` activation rows `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn cols_q2_k<const C: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    let mut acc_m = [_mm256_setzero_ps(); C];
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0x0f);
    for i in 0..nb {
        // SAFETY: block `i` of the weight row and of every activation row is in bounds (caller);
        // every read below stays inside those blocks.
        unsafe {
            let wb = w.add(i * Q2K_BYTES);
            let d = f16_load(wb.add(80));
            let dmin = f16_load(wb.add(82));
            let packed = _mm_loadu_si128(wb as *const __m128i);
            let scales = _mm_and_si128(packed, m4);
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(packed, 4), m4));
            let mut sumi = [_mm256_setzero_si256(); C];
            for half in 0..2 {
                let bits = _mm256_loadu_si256(wb.add(16 + 32 * half) as *const __m256i);
                for j in 0..4 {
                    let sh = _mm_cvtsi32_si128(2 * j as i32);
                    let q = _mm256_and_si256(_mm256_srl_epi16(bits, sh), m3);
                    let sv =
                        _mm256_cvtepu8_epi16(_mm_shuffle_epi8(scales, pair_sel(8 * half + 2 * j)));
                    for (c, s) in sumi.iter_mut().enumerate() {
                        let q8 = _mm256_loadu_si256(
                            a.add(c * astride + i * Q8K_BYTES + 4 + 128 * half + 32 * j)
                                as *const __m256i,
                        );
                        let p = _mm256_maddubs_epi16(q, q8);
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, sv));
                    }
                }
            }
            for c in 0..C {
                let ab = a.add(c * astride + i * Q8K_BYTES);
                let da = std::ptr::read_unaligned(ab as *const f32);
                let bsums = _mm256_loadu_si256(ab.add(4 + QK_K) as *const __m256i);
                let m = _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bsums));
                acc[c] =
                    _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
                acc_m[c] = _mm256_fmadd_ps(_mm256_set1_ps(dmin * da), m, acc_m[c]);
            }
        }
    }
    let mut out = [0f32; C];
    for (c, o) in out.iter_mut().enumerate() {
        // SAFETY: AVX2 present (caller).
        *o = unsafe { hsum(acc[c]) - hsum(acc_m[c]) };
    }
    out
}

/// Dot products of one Q3_K row (`nb` blocks at `w`) with `C` Q8_K rows at `a + c * astride`.
///
/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q3_K blocks and each of the `C` activation rows `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn cols_q3_k<const C: usize>(
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi8(1);
    for i in 0..nb {
        // SAFETY: block `i` of the weight row and of every activation row is in bounds (caller);
        // every read below stays inside those blocks.
        unsafe {
            let wb = w.add(i * Q3K_BYTES);
            let d = f16_load(wb.add(108));
            let scales = q3k_scales_simd(wb.add(96));
            let hmask = _mm256_loadu_si256(wb as *const __m256i);
            let mut sumi = [_mm256_setzero_si256(); C];
            for half in 0..2 {
                let bits = _mm256_loadu_si256(wb.add(32 + 32 * half) as *const __m256i);
                for j in 0..4 {
                    let sh = _mm_cvtsi32_si128(2 * j as i32);
                    let q = _mm256_and_si256(_mm256_srl_epi16(bits, sh), m3);
                    // 4 where the high bit is clear (value is low - 4), else 0.
                    let hb = _mm_cvtsi32_si128((4 * half + j) as i32);
                    let set = _mm256_and_si256(_mm256_srl_epi16(hmask, hb), one);
                    let off = _mm256_slli_epi16(_mm256_xor_si256(set, one), 2);
                    let sv =
                        _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, pair_sel(8 * half + 2 * j)));
                    for (c, s) in sumi.iter_mut().enumerate() {
                        let q8 = _mm256_loadu_si256(
                            a.add(c * astride + i * Q8K_BYTES + 4 + 128 * half + 32 * j)
                                as *const __m256i,
                        );
                        let p = _mm256_sub_epi16(
                            _mm256_maddubs_epi16(q, q8),
                            _mm256_maddubs_epi16(off, q8),
                        );
                        *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, sv));
                    }
                }
            }
            for c in 0..C {
                let da = std::ptr::read_unaligned(a.add(c * astride + i * Q8K_BYTES) as *const f32);
                acc[c] =
                    _mm256_fmadd_ps(_mm256_set1_ps(d * da), _mm256_cvtepi32_ps(sumi[c]), acc[c]);
            }
        }
    }
    let mut out = [0f32; C];
    for (c, o) in out.iter_mut().enumerate() {
        // SAFETY: AVX2 present (caller).
        *o = unsafe { hsum(acc[c]) };
    }
    out
}
