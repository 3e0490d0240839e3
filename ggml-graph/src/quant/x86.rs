//! AVX2/FMA/F16C dot products of quantized weight rows with 8-bit activation rows.
//!
//! The public entry points check every length before entering `unsafe` code, so the kernels may
//! read whole blocks with unaligned vector loads. They are only called after run-time detection
//! ([`super::detected`]) reported AVX2, FMA and F16C.

use std::arch::x86_64::*;

mod k23;
pub(super) mod ktile;
mod rtile;
pub(super) mod tile;
use k23::cols_k23;

use super::blocks::{QK, QK_K};
use super::Q8K_BYTES;
use crate::tensor::DType;

/// True when every row and column of `t`, with `wblock`- and `ablock`-byte blocks (`nb` per
/// row), and every result in `out` are in bounds, which is all the tile kernels read or write.
fn tile_fits(nb: usize, wblock: usize, ablock: usize, t: &super::Tile<'_>, out: &[f32]) -> bool {
    let super::Tile {
        w,
        wstride,
        rows,
        a,
        astride,
        cols,
        ocs,
        ..
    } = *t;
    rows > 0
        && cols > 0
        && wstride >= nb * wblock
        && w.len() >= (rows - 1) * wstride + nb * wblock
        && astride >= nb * ablock
        && a.len() >= (cols - 1) * astride + nb * ablock
        && ocs >= rows
        && out.len() >= (cols - 1) * ocs + rows
}

/// Writes the tile kernels' `R` rows x `C` columns of results for rows `r0..r0 + R` into `out`,
/// column `c` at `out[c * ocs..]`.
fn scatter_rows<const R: usize, const C: usize>(
    v: &[[f32; C]; R],
    out: &mut [f32],
    ocs: usize,
    r0: usize,
) {
    for (dr, row) in v.iter().enumerate() {
        for (c, &x) in row.iter().enumerate() {
            out[c * ocs + r0 + dr] = x;
        }
    }
}

/// Dot product of `n` values, or `None` when this type has no SIMD kernel here.
pub(super) fn vec_dot(ty: DType, n: usize, w: &[u8], a: &[u8]) -> Option<f32> {
    let (nb, abytes) = match ty {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => (n / QK, 34),
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => {
            (n / QK_K, Q8K_BYTES)
        }
        _ => return None,
    };
    if w.len() < nb * ty.type_size() || a.len() < nb * abytes {
        return None;
    }
    // SAFETY: the caller obtained Simd::Avx2 from detection (avx2, fma, f16c present), and both
    // slices hold at least `nb` whole blocks, which is all the kernels read.
    unsafe {
        Some(match ty {
            DType::Q8_0 => dot_q8_0(nb, w.as_ptr(), a.as_ptr()),
            DType::Q4_0 => dot_q4_0(nb, w.as_ptr(), a.as_ptr()),
            DType::Q5_0 => dot_q5_0(nb, w.as_ptr(), a.as_ptr()),
            DType::Q4_K => dot_q4_k(nb, w.as_ptr(), a.as_ptr(), false),
            DType::Q5_K => dot_q4_k(nb, w.as_ptr(), a.as_ptr(), true),
            DType::Q2_K => k23::cols_q2_k::<1>(nb, w.as_ptr(), a.as_ptr(), 0)[0],
            DType::Q3_K => k23::cols_q3_k::<1>(nb, w.as_ptr(), a.as_ptr(), 0)[0],
            _ => dot_q6_k(nb, w.as_ptr(), a.as_ptr()),
        })
    }
}

/// Dot product of a float row (F32/F16/BF16 bytes) with f32 `a`.
pub(super) fn dot_float(ty: DType, w: &[u8], a: &[f32]) -> Option<f32> {
    let n = a.len();
    if w.len() < n * ty.type_size() || !matches!(ty, DType::F32 | DType::F16 | DType::BF16) {
        return None;
    }
    // SAFETY: detection reported avx2/fma/f16c; `w` holds `n` elements of `ty`, `a` holds `n`.
    Some(unsafe { dot_float_avx2(ty, n, w.as_ptr(), a.as_ptr()) })
}

/// # Safety
/// Requires AVX2, FMA and F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn f16_load(p: *const u8) -> f32 {
    // SAFETY: the caller guarantees two readable bytes at `p`.
    let bits = unsafe { std::ptr::read_unaligned(p as *const u16) };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// # Safety
/// Requires AVX2.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Signed i8 x i8 dot of 32 lanes, as 8 i32 partial sums (sign trick for maddubs).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    let ax = _mm256_sign_epi8(x, x);
    let sy = _mm256_sign_epi8(y, x);
    _mm256_madd_epi16(_mm256_maddubs_epi16(ax, sy), _mm256_set1_epi16(1))
}

/// 32 nibbles of 16 bytes: low nibbles first, then high nibbles.
///
/// # Safety
/// Requires AVX2 and 16 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: 16 readable bytes at `p` (caller).
    let t = unsafe { _mm_loadu_si128(p as *const __m128i) };
    _mm256_and_si256(
        _mm256_set_m128i(_mm_srli_epi16(t, 4), t),
        _mm256_set1_epi8(0x0f),
    )
}

/// Bit `j` of a u32 at `p` expanded to byte `j`: 0xFF when set, 0 otherwise.
///
/// # Safety
/// Requires AVX2 and 4 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(p: *const u8) -> __m256i {
    // SAFETY: 4 readable bytes at `p` (caller).
    let x = unsafe { std::ptr::read_unaligned(p as *const u32) };
    let shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(x as i32), shuf);
    let bit = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(bytes, bit), _mm256_set1_epi64x(-1))
}

/// Signed dot of one 32-value weight block (`qw`, already as i8) with a Q8_0 block at `ab`,
/// accumulated into `acc` with scale `dw * da`.
///
/// # Safety
/// AVX2/FMA/F16C; 34 readable bytes at `ab`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn acc_block(acc: __m256, dw: f32, qw: __m256i, ab: *const u8) -> __m256 {
    // SAFETY: 34 readable bytes at `ab` (caller).
    unsafe {
        let d = _mm256_set1_ps(dw * f16_load(ab));
        let qa = _mm256_loadu_si256(ab.add(2) as *const __m256i);
        _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(dot_i8(qw, qa)), acc)
    }
}

/// Runs `block(acc, i)` over `nb` blocks with four independent accumulators, so the FMA
/// latency chain does not bound the loop.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn blocks4(nb: usize, mut block: impl FnMut(__m256, usize) -> __m256) -> f32 {
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut i = 0;
    while i + 4 <= nb {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = block(*a, i + k);
        }
        i += 4;
    }
    while i < nb {
        acc[0] = block(acc[0], i);
        i += 1;
    }
    let s = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
    // SAFETY: AVX2 present (this function's target features).
    unsafe { hsum(s) }
}

/// # Safety
/// AVX2/FMA/F16C; `w` and `a` hold `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q8_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    blocks4(nb, |acc, i| {
        // SAFETY: block `i` is in bounds of both rows (caller).
        unsafe {
            let wb = w.add(i * 34);
            let qw = _mm256_loadu_si256(wb.add(2) as *const __m256i);
            acc_block(acc, f16_load(wb), qw, a.add(i * 34))
        }
    })
}

/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q4_0 blocks, `a` `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    blocks4(nb, |acc, i| {
        // SAFETY: block `i` is in bounds of both rows (caller).
        unsafe {
            let wb = w.add(i * 18);
            let qw = _mm256_sub_epi8(nibbles(wb.add(2)), _mm256_set1_epi8(8));
            acc_block(acc, f16_load(wb), qw, a.add(i * 34))
        }
    })
}

/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q5_0 blocks, `a` `nb` Q8_0 blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q5_0(nb: usize, w: *const u8, a: *const u8) -> f32 {
    blocks4(nb, |acc, i| {
        // SAFETY: block `i` is in bounds of both rows (caller).
        unsafe {
            let wb = w.add(i * 22);
            // value = nibble + 16 * bit - 16: set the high nibble to 0xF where the bit is clear.
            let hi = _mm256_andnot_si256(bits_to_bytes(wb.add(2)), _mm256_set1_epi8(0xf0_u8 as i8));
            let qw = _mm256_or_si256(nibbles(wb.add(6)), hi);
            acc_block(acc, f16_load(wb), qw, a.add(i * 34))
        }
    })
}

/// Q4_K (or Q5_K when `five`) with Q8_K activations.
///
/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` blocks of the weight type, `a` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q4_k(nb: usize, w: *const u8, a: *const u8, five: bool) -> f32 {
    let bs = if five { 176 } else { 144 };
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    let m4 = _mm256_set1_epi8(0x0f);
    for i in 0..nb {
        // SAFETY: block `i` is in bounds of both rows (caller); every read below stays inside it.
        unsafe {
            let (wb, ab) = (w.add(i * bs), a.add(i * Q8K_BYTES));
            let da = std::ptr::read_unaligned(ab as *const f32);
            let d = da * f16_load(wb);
            let dmin = da * f16_load(wb.add(2));
            let [u0, u1, u2, u3] = k4_scales(wb.add(4));
            // Mins times pair sums of the activation's 16-value group sums.
            let mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, u3 as i32, u2 as i32));
            let bsums = _mm256_loadu_si256(ab.add(4 + QK_K) as *const __m256i);
            let q8s = _mm_hadd_epi16(
                _mm256_castsi256_si128(bsums),
                _mm256_extracti128_si256(bsums, 1),
            );
            acc_m = _mm_fmadd_ps(
                _mm_set1_ps(dmin),
                _mm_cvtepi32_ps(_mm_madd_epi16(mins, q8s)),
                acc_m,
            );
            let mut sc = [0i16; 8];
            _mm_storeu_si128(
                sc.as_mut_ptr() as *mut __m128i,
                _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, u1 as i32, u0 as i32)),
            );
            let (qh, qs) = if five {
                (wb.add(16), wb.add(48))
            } else {
                (wb, wb.add(16))
            };
            let hbits = if five {
                _mm256_loadu_si256(qh as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut sumi = _mm256_setzero_si256();
            let q8 = ab.add(4);
            for j in 0..4 {
                let bits = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                let mut lo = _mm256_and_si256(bits, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                if five {
                    let one = _mm256_set1_epi8(1);
                    let hl = _mm256_and_si256(srl16(hbits, 2 * j), one);
                    let hh = _mm256_and_si256(srl16(hbits, 2 * j + 1), one);
                    lo = _mm256_or_si256(lo, _mm256_slli_epi16(hl, 4));
                    hi = _mm256_or_si256(hi, _mm256_slli_epi16(hh, 4));
                }
                let al = _mm256_loadu_si256(q8.add(64 * j) as *const __m256i);
                let ah = _mm256_loadu_si256(q8.add(64 * j + 32) as *const __m256i);
                let pl =
                    _mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), _mm256_set1_epi16(sc[2 * j]));
                let ph = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(hi, ah),
                    _mm256_set1_epi16(sc[2 * j + 1]),
                );
                sumi = _mm256_add_epi32(sumi, _mm256_add_epi32(pl, ph));
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    let m = _mm_add_ps(acc_m, _mm_movehl_ps(acc_m, acc_m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    // SAFETY: AVX2 present (caller).
    unsafe { hsum(acc) - _mm_cvtss_f32(m) }
}

/// The 12 packed 6-bit scale/min bytes of a Q4_K/Q5_K block rearranged into 8 scale bytes
/// (words 0, 1) and 8 min bytes (words 2, 3).
///
/// # Safety
/// 12 readable bytes at `p`.
#[inline]
unsafe fn k4_scales(p: *const u8) -> [u32; 4] {
    const K1: u32 = 0x3f3f_3f3f;
    const K2: u32 = 0x0f0f_0f0f;
    const K3: u32 = 0x0303_0303;
    // SAFETY: 12 readable bytes at `p` (caller).
    let w = |i: usize| unsafe { std::ptr::read_unaligned(p.add(4 * i) as *const u32) };
    let (u0, u1, u2) = (w(0), w(1), w(2));
    [
        u0 & K1,
        (u2 & K2) | (((u0 >> 6) & K3) << 4),
        u1 & K1,
        ((u2 >> 4) & K2) | (((u1 >> 6) & K3) << 4),
    ]
}

/// 16-bit lane right shift by a run-time count.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn srl16(v: __m256i, n: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(n as i32))
}

/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q6_K blocks, `a` `nb` Q8_K blocks.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_q6_k(nb: usize, w: *const u8, a: *const u8) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    for i in 0..nb {
        // SAFETY: block `i` is in bounds of both rows (caller); every read below stays inside it.
        unsafe {
            let (wb, ab) = (w.add(i * 210), a.add(i * Q8K_BYTES));
            let d = std::ptr::read_unaligned(ab as *const f32) * f16_load(wb.add(208));
            let scales = _mm_loadu_si128(wb.add(192) as *const __m128i);
            // (q - 32) . a = q . a - 32 * sum(a): the second term from the group sums at once.
            let bsums = _mm256_loadu_si256(ab.add(4 + QK_K) as *const __m256i);
            let corr = _mm256_madd_epi16(_mm256_cvtepi8_epi16(scales), bsums);
            let mut sumi = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(corr, 5));
            for half in 0..2 {
                let ql = wb.add(64 * half);
                let qh = _mm256_loadu_si256(wb.add(128 + 32 * half) as *const __m256i);
                let l1 = _mm256_loadu_si256(ql as *const __m256i);
                let l2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(l1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(l2, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                    ),
                ];
                for (k, qk) in q.iter().enumerate() {
                    let q8 = _mm256_loadu_si256(ab.add(4 + 128 * half + 32 * k) as *const __m256i);
                    let p = _mm256_maddubs_epi16(*qk, q8);
                    // Scales of groups g and g + 1, each repeated over 8 i16 lanes.
                    let g = (8 * half + 2 * k) as u64;
                    let sel = _mm_set_epi64x(
                        ((g + 1) * 0x0101_0101_0101_0101) as i64,
                        (g * 0x0101_0101_0101_0101) as i64,
                    );
                    let sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, sel));
                    sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p, sv));
                }
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
        }
    }
    // SAFETY: AVX2 present (caller).
    unsafe { hsum(acc) }
}

/// Elements `i..i + 8` of a F32, F16 or BF16 row as f32. A function, not a closure in
/// [`dot_float_avx2`]: a closure returning a vector was compiled apart in the CLI build.
///
/// # Safety
/// Only called from functions compiled with AVX2 and F16C; elements `i..i + 8` readable at `w`.
#[inline(always)]
unsafe fn float8(ty: DType, w: *const u8, i: usize) -> __m256 {
    // SAFETY: the caller runs with the features these intrinsics need; the read is in bounds
    // (caller).
    unsafe {
        match ty {
            DType::F32 => _mm256_loadu_ps((w as *const f32).add(i)),
            DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(w.add(2 * i) as *const __m128i)),
            _ => _mm256_castsi256_ps(_mm256_slli_epi32(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(w.add(2 * i) as *const __m128i)),
                16,
            )),
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C; `w` holds `n` elements of `ty`, `a` holds `n` f32.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_float_avx2(ty: DType, n: usize, w: *const u8, a: *const f32) -> f32 {
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut i = 0;
    // SAFETY: every load covers elements below `n` (loop bounds), readable per the caller.
    unsafe {
        while i + 16 <= n {
            acc0 = _mm256_fmadd_ps(float8(ty, w, i), _mm256_loadu_ps(a.add(i)), acc0);
            acc1 = _mm256_fmadd_ps(float8(ty, w, i + 8), _mm256_loadu_ps(a.add(i + 8)), acc1);
            i += 16;
        }
        while i + 8 <= n {
            acc0 = _mm256_fmadd_ps(float8(ty, w, i), _mm256_loadu_ps(a.add(i)), acc0);
            i += 8;
        }
        let mut s = hsum(_mm256_add_ps(acc0, acc1));
        while i < n {
            let x = match ty {
                DType::F32 => std::ptr::read_unaligned((w as *const f32).add(i)),
                DType::F16 => f16_load(w.add(2 * i)),
                _ => f32::from_bits(
                    (std::ptr::read_unaligned(w.add(2 * i) as *const u16) as u32) << 16,
                ),
            };
            s += x * *a.add(i);
            i += 1;
        }
        s
    }
}

/// Dot products of one weight row with `out.len()` (1 to 4) activation rows spaced `astride`
/// bytes apart in `a`, decoding each weight block once for all of them. Returns false when this
/// type or column count has no kernel here.
pub(super) fn vec_dot_cols(
    ty: DType,
    n: usize,
    w: &[u8],
    a: &[u8],
    astride: usize,
    out: &mut [f32],
) -> bool {
    let (nb, abytes) = match ty {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::MXFP4 => (n / QK, 34),
        DType::Q4_1 | DType::Q5_1 => (n / QK, 36),
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS => {
            (n / QK_K, Q8K_BYTES)
        }
        _ => return false,
    };
    let c = out.len();
    if !(1..=4).contains(&c)
        || w.len() < nb * ty.type_size()
        || astride < nb * abytes
        || a.len() < (c - 1) * astride + nb * abytes
    {
        return false;
    }
    macro_rules! go {
        ($f:ident) => {
            // SAFETY: detection reported avx2/fma/f16c; `w` holds `nb` blocks and each of the
            // `c` activation rows holds `nb` blocks (checked above).
            unsafe {
                match c {
                    1 => out.copy_from_slice(&$f::<1>(ty, nb, w.as_ptr(), a.as_ptr(), astride)),
                    2 => out.copy_from_slice(&$f::<2>(ty, nb, w.as_ptr(), a.as_ptr(), astride)),
                    3 => out.copy_from_slice(&$f::<3>(ty, nb, w.as_ptr(), a.as_ptr(), astride)),
                    _ => out.copy_from_slice(&$f::<4>(ty, nb, w.as_ptr(), a.as_ptr(), astride)),
                }
            }
        };
    }
    match ty {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::MXFP4 => {
            go!(cols_small)
        }
        DType::Q4_1 | DType::Q5_1 => go!(cols_q4_1),
        DType::IQ4_XS => go!(cols_iq4_xs),
        DType::Q6_K => go!(cols_q6_k),
        DType::Q2_K | DType::Q3_K => go!(cols_k23),
        _ => go!(cols_q4_k),
    }
    true
}

/// Weight scale and i8 values of a Q8_0, Q4_0, Q5_0, IQ4_NL or MXFP4 block.
///
/// # Safety
/// AVX2/FMA/F16C; one whole block of `ty` readable at `wb`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_small_simd(ty: DType, wb: *const u8) -> (f32, __m256i) {
    // SAFETY: one block readable at `wb` (caller).
    unsafe {
        match ty {
            DType::Q8_0 => (
                f16_load(wb),
                _mm256_loadu_si256(wb.add(2) as *const __m256i),
            ),
            DType::Q4_0 => (
                f16_load(wb),
                _mm256_sub_epi8(nibbles(wb.add(2)), _mm256_set1_epi8(8)),
            ),
            DType::IQ4_NL => (
                f16_load(wb),
                lookup(&gguf::quants::iq_tables::IQ4NL_VALUES, nibbles(wb.add(2))),
            ),
            DType::MXFP4 => (
                gguf::quants::e8m0_to_f32_half(*wb),
                lookup(&gguf::quants::iq_tables::MXFP4_VALUES, nibbles(wb.add(1))),
            ),
            _ => {
                let hi =
                    _mm256_andnot_si256(bits_to_bytes(wb.add(2)), _mm256_set1_epi8(0xf0_u8 as i8));
                (f16_load(wb), _mm256_or_si256(nibbles(wb.add(6)), hi))
            }
        }
    }
}

/// The entries of a 16-value table at 32 indices (0..16 each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn lookup(table: &[i8; 16], idx: __m256i) -> __m256i {
    // SAFETY: the table is 16 readable bytes.
    let t = unsafe { _mm_loadu_si128(table.as_ptr() as *const __m128i) };
    _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(t), idx)
}

/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` blocks of `ty`; `C` Q8_0 rows of `nb` blocks at `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols_small<const C: usize>(
    ty: DType,
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    let bs = ty.type_size();
    for i in 0..nb {
        // SAFETY: block `i` of the weight row and of every activation row is in bounds (caller).
        unsafe {
            let (dw, qw) = decode_small_simd(ty, w.add(i * bs));
            let ax = _mm256_sign_epi8(qw, qw);
            for (c, acc) in acc.iter_mut().enumerate() {
                let ab = a.add(c * astride + i * 34);
                let d = _mm256_set1_ps(dw * f16_load(ab));
                let qa = _mm256_loadu_si256(ab.add(2) as *const __m256i);
                let p = _mm256_madd_epi16(
                    _mm256_maddubs_epi16(ax, _mm256_sign_epi8(qa, qw)),
                    _mm256_set1_epi16(1),
                );
                *acc = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), *acc);
            }
        }
    }
    // SAFETY: AVX2 present (caller).
    acc.map(|v| unsafe { hsum(v) })
}

/// Q4_1 (or Q5_1) with Q8_1 activations: per column an eight-lane FMA chain of the block dots
/// and a scalar sum of the min terms, added at the end.
///
/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` blocks of `ty`; `C` Q8_1 rows of `nb` blocks at
/// `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols_q4_1<const C: usize>(
    ty: DType,
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    let five = ty == DType::Q5_1;
    let bs = ty.type_size();
    let mut acc = [_mm256_setzero_ps(); C];
    let mut acc_m = [0.0f32; C];
    for i in 0..nb {
        // SAFETY: block `i` of the weight row and of every activation row is in bounds (caller).
        unsafe {
            let wb = w.add(i * bs);
            let (dw, mw) = (f16_load(wb), f16_load(wb.add(2)));
            let qw = if five {
                let hi = _mm256_and_si256(bits_to_bytes(wb.add(4)), _mm256_set1_epi8(0x10));
                _mm256_or_si256(nibbles(wb.add(8)), hi)
            } else {
                nibbles(wb.add(4))
            };
            for c in 0..C {
                let ab = a.add(c * astride + i * 36);
                let d = _mm256_set1_ps(dw * f16_load(ab));
                acc_m[c] += mw * f16_load(ab.add(2));
                let qa = _mm256_loadu_si256(ab.add(4) as *const __m256i);
                let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qw, qa), _mm256_set1_epi16(1));
                acc[c] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[c]);
            }
        }
    }
    let mut out = [0.0f32; C];
    for c in 0..C {
        // SAFETY: AVX2 present (caller).
        out[c] = unsafe { hsum(acc[c]) } + acc_m[c];
    }
    out
}

/// IQ4_XS with Q8_K activations: the eight 32-value sub-blocks' dots times their 6-bit scales
/// summed in integers, then one FMA per super-block.
///
/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` IQ4_XS blocks; `C` Q8_K rows of `nb` blocks at
/// `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols_iq4_xs<const C: usize>(
    _ty: DType,
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    let values = &gguf::quants::iq_tables::IQ4NL_VALUES;
    for i in 0..nb {
        // SAFETY: block `i` of the weight row and of every activation row is in bounds (caller);
        // every read below stays inside them (136-byte weight, Q8K_BYTES activation blocks).
        unsafe {
            let wb = w.add(i * 136);
            let dw = f16_load(wb);
            let sh = u32::from(std::ptr::read_unaligned(wb.add(2) as *const u16));
            let mut sumi = [_mm256_setzero_si256(); C];
            for ib in 0..8 {
                let lo = u32::from(*wb.add(4 + ib / 2) >> (4 * (ib % 2))) & 0x0f;
                let ls = (lo | (((sh >> (2 * ib)) & 3) << 4)) as i16 - 32;
                let q = lookup(values, nibbles(wb.add(8 + 16 * ib)));
                let aq = _mm256_sign_epi8(q, q);
                let s16 = _mm256_set1_epi16(ls);
                for (c, s) in sumi.iter_mut().enumerate() {
                    let qa = _mm256_loadu_si256(
                        a.add(c * astride + i * Q8K_BYTES + 4 + 32 * ib) as *const __m256i
                    );
                    let p = _mm256_maddubs_epi16(aq, _mm256_sign_epi8(qa, q));
                    *s = _mm256_add_epi32(*s, _mm256_madd_epi16(p, s16));
                }
            }
            for (c, s) in sumi.iter().enumerate() {
                let da = std::ptr::read_unaligned(a.add(c * astride + i * Q8K_BYTES) as *const f32);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(*s), acc[c]);
            }
        }
    }
    // SAFETY: AVX2 present (caller).
    acc.map(|v| unsafe { hsum(v) })
}

/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q4_K/Q5_K blocks; `C` Q8_K rows at `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols_q4_k<const C: usize>(
    ty: DType,
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    let five = ty == DType::Q5_K;
    let bs = ty.type_size();
    let mut out = [0.0f32; C];
    let mut acc_m = [0.0f32; C];
    let m4 = _mm256_set1_epi8(0x0f);
    for i in 0..nb {
        // SAFETY: block `i` of the weight row and of every activation row is in bounds (caller).
        unsafe {
            let wb = w.add(i * bs);
            let (d, dmin) = (f16_load(wb), f16_load(wb.add(2)));
            let [u0, u1, u2, u3] = k4_scales(wb.add(4));
            let mins = _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, u3 as i32, u2 as i32));
            let mut sc = [0i16; 8];
            _mm_storeu_si128(
                sc.as_mut_ptr() as *mut __m128i,
                _mm_cvtepu8_epi16(_mm_set_epi32(0, 0, u1 as i32, u0 as i32)),
            );
            let (qh, qs) = if five {
                (wb.add(16), wb.add(48))
            } else {
                (wb, wb.add(16))
            };
            let hbits = if five {
                _mm256_loadu_si256(qh as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut sumi = [_mm256_setzero_si256(); C];
            for j in 0..4 {
                let bits = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                let mut lo = _mm256_and_si256(bits, m4);
                let mut hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                if five {
                    let one = _mm256_set1_epi8(1);
                    lo = _mm256_or_si256(
                        lo,
                        _mm256_slli_epi16(_mm256_and_si256(srl16(hbits, 2 * j), one), 4),
                    );
                    hi = _mm256_or_si256(
                        hi,
                        _mm256_slli_epi16(_mm256_and_si256(srl16(hbits, 2 * j + 1), one), 4),
                    );
                }
                let (sl, sh) = (
                    _mm256_set1_epi16(sc[2 * j]),
                    _mm256_set1_epi16(sc[2 * j + 1]),
                );
                for (c, s) in sumi.iter_mut().enumerate() {
                    let q8 = a.add(c * astride + i * Q8K_BYTES + 4);
                    let al = _mm256_loadu_si256(q8.add(64 * j) as *const __m256i);
                    let ah = _mm256_loadu_si256(q8.add(64 * j + 32) as *const __m256i);
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, al), sl);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, ah), sh);
                    *s = _mm256_add_epi32(*s, _mm256_add_epi32(pl, ph));
                }
            }
            for (c, s) in sumi.iter().enumerate() {
                let ab = a.add(c * astride + i * Q8K_BYTES);
                let da = std::ptr::read_unaligned(ab as *const f32);
                let bsums = _mm256_loadu_si256(ab.add(4 + QK_K) as *const __m256i);
                let q8s = _mm_hadd_epi16(
                    _mm256_castsi256_si128(bsums),
                    _mm256_extracti128_si256(bsums, 1),
                );
                let m = _mm_madd_epi16(mins, q8s);
                let m = _mm_add_epi32(m, _mm_unpackhi_epi64(m, m));
                let m = _mm_cvtsi128_si32(_mm_add_epi32(m, _mm_shuffle_epi32(m, 1)));
                // ggml's repacked Q4_K mat-vec order, as the AVX-512 tiles: the whole integer
                // dot and min term per super-block, two fma chains, `a - m` at the end.
                let x = _mm_add_epi32(_mm256_castsi256_si128(*s), _mm256_extracti128_si256(*s, 1));
                let x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
                let dot = _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32(x, 1)));
                out[c] = (dot as f32).mul_add(d * da, out[c]);
                acc_m[c] = (m as f32).mul_add(dmin * da, acc_m[c]);
            }
        }
    }
    for (o, &m) in out.iter_mut().zip(acc_m.iter()) {
        *o -= m;
    }
    out
}

/// # Safety
/// AVX2/FMA/F16C; `w` holds `nb` Q6_K blocks; `C` Q8_K rows at `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn cols_q6_k<const C: usize>(
    _ty: DType,
    nb: usize,
    w: *const u8,
    a: *const u8,
    astride: usize,
) -> [f32; C] {
    let mut acc = [_mm256_setzero_ps(); C];
    let m4 = _mm256_set1_epi8(0x0f);
    let m2 = _mm256_set1_epi8(0x03);
    for i in 0..nb {
        // SAFETY: block `i` of the weight row and of every activation row is in bounds (caller).
        unsafe {
            let wb = w.add(i * 210);
            let dw = f16_load(wb.add(208));
            let scales = _mm_loadu_si128(wb.add(192) as *const __m128i);
            let sc16 = _mm256_cvtepi8_epi16(scales);
            let mut sumi = [_mm256_setzero_si256(); C];
            for (c, s) in sumi.iter_mut().enumerate() {
                let bsums = _mm256_loadu_si256(
                    a.add(c * astride + i * Q8K_BYTES + 4 + QK_K) as *const __m256i
                );
                *s = _mm256_sub_epi32(
                    _mm256_setzero_si256(),
                    _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5),
                );
            }
            for half in 0..2 {
                let ql = wb.add(64 * half);
                let qh = _mm256_loadu_si256(wb.add(128 + 32 * half) as *const __m256i);
                let l1 = _mm256_loadu_si256(ql as *const __m256i);
                let l2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                let q = [
                    _mm256_or_si256(
                        _mm256_and_si256(l1, m4),
                        _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(l2, m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4),
                    ),
                    _mm256_or_si256(
                        _mm256_and_si256(_mm256_srli_epi16(l2, 4), m4),
                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4),
                    ),
                ];
                for (k, qk) in q.iter().enumerate() {
                    let g = (8 * half + 2 * k) as u64;
                    let sel = _mm_set_epi64x(
                        ((g + 1) * 0x0101_0101_0101_0101) as i64,
                        (g * 0x0101_0101_0101_0101) as i64,
                    );
                    let sv = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, sel));
                    for (c, s) in sumi.iter_mut().enumerate() {
                        let q8 = _mm256_loadu_si256(
                            a.add(c * astride + i * Q8K_BYTES + 4 + 128 * half + 32 * k)
                                as *const __m256i,
                        );
                        *s = _mm256_add_epi32(
                            *s,
                            _mm256_madd_epi16(_mm256_maddubs_epi16(*qk, q8), sv),
                        );
                    }
                }
            }
            for (c, s) in sumi.iter().enumerate() {
                let da = std::ptr::read_unaligned(a.add(c * astride + i * Q8K_BYTES) as *const f32);
                acc[c] = _mm256_fmadd_ps(_mm256_set1_ps(dw * da), _mm256_cvtepi32_ps(*s), acc[c]);
            }
        }
    }
    // SAFETY: AVX2 present (caller).
    acc.map(|v| unsafe { hsum(v) })
}

/// True when the CPU has AVX-512 BW/VL and VNNI (256-bit `vpdpbusd`, mask-to-byte moves).
pub(super) fn has_vnni() -> bool {
    std::is_x86_feature_detected!("avx512f")
        && std::is_x86_feature_detected!("avx512bw")
        && std::is_x86_feature_detected!("avx512vl")
        && std::is_x86_feature_detected!("avx512vnni")
}

/// F16/BF16/F32 bytes (or Q8_0 blocks) to f32, eight at a time; false for other types or short
/// buffers.
pub(super) fn convert_row(ty: DType, src: &[u8], dst: &mut [f32]) -> bool {
    let n = dst.len();
    if ty == DType::Q8_0 {
        if !n.is_multiple_of(QK) || src.len() < n / QK * ty.type_size() {
            return false;
        }
        // SAFETY: detection reported avx2/fma/f16c; `src` holds `n / 32` blocks, `dst` `n` values.
        unsafe { dequant_q8_0_avx2(n / QK, src.as_ptr(), dst.as_mut_ptr()) };
        return true;
    }
    if !matches!(ty, DType::F32 | DType::F16 | DType::BF16) || src.len() < n * ty.type_size() {
        return false;
    }
    // SAFETY: detection reported avx2/fma/f16c; `src` holds `n` elements, `dst` has room for `n`.
    unsafe { convert_row_avx2(ty, n, src.as_ptr(), dst.as_mut_ptr()) };
    true
}

/// Q8_0 blocks to f32 (`d * q`, one rounding, as ggml's `dequantize_row_q8_0`).
///
/// # Safety
/// AVX2/FMA/F16C; `nb` 34-byte blocks readable at `src`, `32 nb` f32 writable at `dst`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dequant_q8_0_avx2(nb: usize, src: *const u8, dst: *mut f32) {
    // SAFETY: block `b` spans bytes 34 b..34 b + 34 of `src` and values 32 b..32 b + 32 of `dst`,
    // both in bounds per the caller.
    unsafe {
        for b in 0..nb {
            let blk = src.add(34 * b);
            let d = _mm256_set1_ps(f16_load(blk));
            for c in 0..4 {
                let q = _mm_loadl_epi64(blk.add(2 + 8 * c) as *const __m128i);
                let v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                _mm256_storeu_ps(dst.add(32 * b + 8 * c), _mm256_mul_ps(v, d));
            }
        }
    }
}

/// # Safety
/// AVX2/FMA/F16C; `n` elements of `ty` readable at `src`, `n` f32 writable at `dst`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn convert_row_avx2(ty: DType, n: usize, src: *const u8, dst: *mut f32) {
    let mut i = 0;
    // SAFETY: every access is below `n` elements (loop bounds), in bounds per the caller.
    unsafe {
        while i + 8 <= n {
            let v = match ty {
                DType::F32 => _mm256_loadu_ps((src as *const f32).add(i)),
                DType::F16 => _mm256_cvtph_ps(_mm_loadu_si128(src.add(2 * i) as *const __m128i)),
                _ => _mm256_castsi256_ps(_mm256_slli_epi32(
                    _mm256_cvtepu16_epi32(_mm_loadu_si128(src.add(2 * i) as *const __m128i)),
                    16,
                )),
            };
            _mm256_storeu_ps(dst.add(i), v);
            i += 8;
        }
        while i < n {
            let v = match ty {
                DType::F32 => std::ptr::read_unaligned((src as *const f32).add(i)),
                DType::F16 => f16_load(src.add(2 * i)),
                _ => f32::from_bits(
                    (std::ptr::read_unaligned(src.add(2 * i) as *const u16) as u32) << 16,
                ),
            };
            *dst.add(i) = v;
            i += 1;
        }
    }
}
