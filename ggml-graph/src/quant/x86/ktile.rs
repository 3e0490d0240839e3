//! AVX-512 VNNI row x column tiles for the K-quants Q4_K, Q5_K and Q6_K and for IQ4_XS, all with
//! Q8_K activations.
//!
//! Weight rows are decoded once per call into unsigned bytes in value order plus, per 64 values,
//! a vector of 16-bit sub-block scales; the inner loop is then `vpmaddubsw` + `vpdpwssd` per 64
//! values and row-column pair, exact in integers. IQ4_XS's values are signed (-127..113, too wide
//! for an unsigned offset under `vpmaddubsw`): they are decoded to magnitudes plus a sign mask
//! that negates the activation bytes, ggml's sign trick, so the products stay exact. The float steps per result follow the x86
//! kernel llama.cpp runs for the same matmul (see [`tile`] and [`Order`]), which depends on the
//! type and on the number of activation columns of the whole matmul (`cols`); within one call
//! the results do not depend on the tile shape.
//!
//! Two paths skip the horizontal sums: for several columns, Q4_K weights llama.cpp repacks and
//! Q6_K in its tiled order are laid out per call in groups of 16 rows, one row per 32-bit lane
//! ([`interleave_q4k`], [`interleave_q6k`]), so `vpdpbusd` against a broadcast activation leaves
//! each row's dot in its lane; and the Q4_K mat-vec ([`gemv_q4k`]) reduces four rows at once.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::{f16_load, k4_scales, scatter_rows, tile_fits};
use crate::quant::blocks::QK_K;
use crate::quant::{Tile, Q8K_BYTES};
use crate::tensor::DType;

/// Bytes of one decoded super-block: 256 values, 4 x 32 i16 scales, 16 i16 mins (Q4_K/Q5_K, each
/// repeated for two 16-value groups) or scales (Q6_K), f32 d and dmin, padding.
const W_SB: usize = 576;
const OFF_SC: usize = 256;
const OFF_MIN: usize = 512;
const OFF_D: usize = 544;
/// Rows per register tile.
const TR: usize = 4;
/// Columns per register tile.
const TC: usize = 3;
/// Rows in flight in the one- and two-column kernel.
const DIRECT_ROWS: usize = 2;

/// Which of llama.cpp's x86 kernels a result's float steps follow (a const generic of [`tile`]).
///
/// llama.cpp picks by type and batch: Q4_K weights (2-D, rows a multiple of 8) are repacked and
/// run `gemm_q4_K_8x8` on whole groups of four activation columns and `gemv_q4_K_8x8` on the
/// rest; other Q4_K weights, Q5_K and Q6_K run its tiled K-quant matmul (`ggml-cpu/tiled`) for 8
/// or more columns and `vec_dot_*_q8_K` below that (the caller says which Q4_K weights are
/// repacked).
struct Order;
impl Order {
    /// Q6_K and Q5_K `vec_dot`: eight i32 lanes per super-block, `fma(da * dw, lanes, acc)`,
    /// eight-lane horizontal sum at the end; Q5_K's min term on a scalar chain
    /// `m = fma(-da * dmin, mins, m)` added last.
    const LANES: u8 = 0;
    /// Repacked Q4_K mat-vec: the whole super-block's integer dot and min term, two fma chains
    /// `a = fma(dot, dw * da, a)`, `m = fma(mins, dmin * da, m)`, result `a - m`.
    const GEMV: u8 = 1;
    /// Tiled matmul: per super-block `r = dot * dw` (Q5_K: `r = fma(-dmin, mins, r)`), then
    /// `acc = fma(r, da, acc)`.
    const TILED: u8 = 2;
    /// Q4_K `vec_dot` (weights llama.cpp does not repack): eight i32 lanes as [`Self::LANES`],
    /// `fma(da * dw, lanes, acc)`; the min terms of sub-block pairs on four lanes,
    /// `m = fma(-da * dmin, pair, m)`, summed `(m0 + m2) + (m1 + m3)` and added last.
    const LANES4: u8 = 3;
    /// IQ4_XS `vec_dot`: [`Self::LANES`] without a min chain (the result is the horizontal sum
    /// alone).
    const XS_LANES: u8 = 4;
    /// IQ4_XS in the tiled matmul: `r = dot * dw`, `acc = fma(r, da, acc)`.
    const XS_TILED: u8 = 5;

    /// True for the IQ4_XS orders (signed values: the activations take the weights' signs).
    const fn xs(ord: u8) -> bool {
        ord >= Self::XS_LANES
    }
}

/// Columns from which Q5_K/Q6_K take llama.cpp's tiled order.
const TILED_MIN_COLS: usize = 8;

fn supported(ty: DType) -> bool {
    matches!(ty, DType::Q4_K | DType::Q5_K | DType::Q6_K | DType::IQ4_XS)
}

/// One super-block in registers: values in order (64 per vector; IQ4_XS: magnitudes), the
/// 16-bit scale of each value pair's sub-block, the mins (Q4_K/Q5_K, per 16-value group) or
/// scales (Q6_K), d, dmin; for IQ4_XS the negative values' bits (one mask per 64 values, in
/// `m16`'s place when stored).
#[derive(Clone, Copy)]
struct Sb {
    vals: [__m512i; 4],
    sv: [__m512i; 4],
    m16: __m256i,
    neg: [u64; 4],
    d: f32,
    dmin: f32,
}

/// Decodes the super-block of `ty` at `wb`.
///
/// Always inlined into its AVX-512 callers (a call would pass the struct through memory); it has
/// no target features of its own, which `inline(always)` requires.
///
/// # Safety
/// Only called from functions compiled with AVX-512 F/BW/VL/VNNI and F16C; one block of `ty`
/// (Q4_K, Q5_K or Q6_K) readable at `wb`.
#[inline(always)]
unsafe fn decode_sb(ty: DType, wb: *const u8) -> Sb {
    // SAFETY: the caller runs with the features these intrinsics need (see above); the block's
    // bytes are readable and every read below stays inside it.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let m2 = _mm256_set1_epi8(0x03);
        let join =
            |lo: __m256i, hi: __m256i| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
        let mut vals = [_mm512_setzero_si512(); 4];
        let mut sv = [_mm512_setzero_si512(); 4];
        {
            if ty == DType::IQ4_XS {
                let table = _mm256_broadcastsi128_si256(_mm_loadu_si128(
                    gguf::quants::iq_tables::IQ4NL_VALUES.as_ptr() as *const __m128i,
                ));
                let sh = u32::from(std::ptr::read_unaligned(wb.add(2) as *const u16));
                let ls = |ib: usize| {
                    let lo = u32::from(*wb.add(4 + ib / 2) >> (4 * (ib % 2))) & 0x0f;
                    (lo | (((sh >> (2 * ib)) & 3) << 4)) as i16 - 32
                };
                let mut neg = [0u64; 4];
                for j in 0..4 {
                    // Sub-block ib: low nibbles are values 0..16, high nibbles 16..32.
                    let sub = |ib: usize| {
                        let t = _mm_loadu_si128(wb.add(8 + 16 * ib) as *const __m128i);
                        let idx = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), m4);
                        _mm256_shuffle_epi8(table, idx)
                    };
                    let (q0, q1) = (sub(2 * j), sub(2 * j + 1));
                    vals[j] = join(_mm256_abs_epi8(q0), _mm256_abs_epi8(q1));
                    neg[j] = u64::from(_mm256_movemask_epi8(q0) as u32)
                        | u64::from(_mm256_movemask_epi8(q1) as u32) << 32;
                    sv[j] = _mm512_mask_blend_epi16(
                        0xffff_0000,
                        _mm512_set1_epi16(ls(2 * j)),
                        _mm512_set1_epi16(ls(2 * j + 1)),
                    );
                }
                return Sb {
                    vals,
                    sv,
                    m16: _mm256_setzero_si256(),
                    neg,
                    d: f16_load(wb),
                    dmin: 0.0,
                };
            }
            if ty == DType::Q6_K {
                for half in 0..2 {
                    let ql = wb.add(64 * half);
                    let qh = _mm256_loadu_si256(wb.add(128 + 32 * half) as *const __m256i);
                    let l1 = _mm256_loadu_si256(ql as *const __m256i);
                    let l2 = _mm256_loadu_si256(ql.add(32) as *const __m256i);
                    let hi = |s: i32| {
                        _mm256_slli_epi16(
                            _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(s)), m2),
                            4,
                        )
                    };
                    let v0 = _mm256_or_si256(_mm256_and_si256(l1, m4), hi(0));
                    let v1 = _mm256_or_si256(_mm256_and_si256(l2, m4), hi(2));
                    let v2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), hi(4));
                    let v3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l2, 4), m4), hi(6));
                    vals[2 * half] = join(v0, v1);
                    vals[2 * half + 1] = join(v2, v3);
                }
                // Group g's scale on i16 lanes 8g..8g+7 of the 256 values' 128 lanes.
                let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wb.add(192) as *const __m128i));
                let sc512 = _mm512_zextsi256_si512(sc16);
                for (j, v) in sv.iter_mut().enumerate() {
                    let idx = _mm512_srli_epi16(
                        _mm512_add_epi16(
                            _mm512_set1_epi16(32 * j as i16),
                            _mm512_set_epi16(
                                31, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19, 18, 17, 16, 15,
                                14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0,
                            ),
                        ),
                        3,
                    );
                    *v = _mm512_permutexvar_epi16(idx, sc512);
                }
                Sb {
                    vals,
                    sv,
                    m16: sc16,
                    neg: [0; 4],
                    d: f16_load(wb.add(208)),
                    dmin: 0.0,
                }
            } else {
                let five = ty == DType::Q5_K;
                let [u0, u1, u2, u3] = k4_scales(wb.add(4));
                let sc = (u0 as u64 | (u1 as u64) << 32).to_le_bytes();
                let qs = wb.add(if five { 48 } else { 16 });
                let hbits = if five {
                    _mm256_loadu_si256(wb.add(16) as *const __m256i)
                } else {
                    _mm256_setzero_si256()
                };
                let one = _mm256_set1_epi8(1);
                for j in 0..4 {
                    let bits = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                    let mut lo = _mm256_and_si256(bits, m4);
                    let mut hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    if five {
                        let b = |s: usize| {
                            let v = _mm256_srl_epi16(hbits, _mm_cvtsi32_si128(s as i32));
                            _mm256_slli_epi16(_mm256_and_si256(v, one), 4)
                        };
                        lo = _mm256_or_si256(lo, b(2 * j));
                        hi = _mm256_or_si256(hi, b(2 * j + 1));
                    }
                    vals[j] = join(lo, hi);
                    sv[j] = _mm512_mask_blend_epi16(
                        0xffff_0000,
                        _mm512_set1_epi16(sc[2 * j] as i16),
                        _mm512_set1_epi16(sc[2 * j + 1] as i16),
                    );
                }
                // Each sub-block's min on both of its 16-value groups.
                let m8 = _mm_cvtsi64_si128((u2 as u64 | (u3 as u64) << 32) as i64);
                Sb {
                    vals,
                    sv,
                    m16: _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8)),
                    neg: [0; 4],
                    d: f16_load(wb),
                    dmin: f16_load(wb.add(2)),
                }
            }
        }
    }
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks of `ty` (Q4_K, Q5_K or Q6_K) readable at `w`,
/// `nb * W_SB` bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_row(ty: DType, nb: usize, w: *const u8, out: *mut u8) {
    let bs = ty.type_size();
    for i in 0..nb {
        // SAFETY: block `i` is readable and its decoded bytes writable (caller). 512-bit stores,
        // as the tile loads them: a wide load of narrow fresh stores is not forwarded.
        unsafe {
            let sb = decode_sb(ty, w.add(i * bs));
            let o = out.add(i * W_SB);
            for j in 0..4 {
                _mm512_storeu_si512(o.add(64 * j) as *mut _, sb.vals[j]);
                _mm512_storeu_si512(o.add(OFF_SC + 64 * j) as *mut _, sb.sv[j]);
            }
            if ty == DType::IQ4_XS {
                std::ptr::copy_nonoverlapping(sb.neg.as_ptr() as *const u8, o.add(OFF_MIN), 32);
            } else {
                _mm256_storeu_si256(o.add(OFF_MIN) as *mut __m256i, sb.m16);
            }
            let dd = o.add(OFF_D) as *mut f32;
            *dd = sb.d;
            *dd.add(1) = sb.dmin;
        }
    }
}

/// `R` weight rows (`wstride` bytes apart) read straight from their blocks (decoded in
/// registers) times `C` Q8_K rows: [`tile`]'s arithmetic for decode, where a decoded copy would
/// be read once only. Every row keeps its own accumulators (rows in flight only overlap their
/// latencies), and the next rows are prefetched: several rows are several memory streams, which
/// the hardware prefetcher follows less well than one.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks of `ty` readable at `w + r * wstride` for every
/// `r < R`, `C` Q8_K rows of `nb` blocks at `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn rows_direct<const R: usize, const C: usize, const SIX: bool, const ORD: u8>(
    ty: DType,
    nb: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[f32; C]; R] {
    let bs = ty.type_size();
    let mut acc8 = [[_mm256_setzero_ps(); C]; R];
    let mut acc_d = [[0f32; C]; R];
    let mut acc_m = [[0f32; C]; R];
    let mut acc_m4 = [[_mm_setzero_ps(); C]; R];
    let next = w.wrapping_add(R * wstride);
    let lines = (R * wstride).div_ceil(64 * nb.max(1));
    for i in 0..nb {
        for l in 0..lines {
            #[allow(
                unused_unsafe,
                reason = "`_mm_prefetch` is safe to call in newer Rust, unsafe in 1.89 (our MSRV)"
            )]
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add((i * lines + l) * 64) as *const i8)
            };
        }
        for r in 0..R {
            // SAFETY: super-block `i` of every row and of every activation row is in bounds
            // (caller).
            unsafe {
                let sb = decode_sb(ty, w.add(r * wstride + i * bs));
                for c in 0..C {
                    let ab = a.add(c * astride + i * Q8K_BYTES);
                    let mut sumi = _mm512_setzero_si512();
                    for j in 0..4 {
                        let av = signed::<ORD>(
                            _mm512_loadu_si512(ab.add(4 + 64 * j) as *const _),
                            sb.neg[j],
                        );
                        sumi = _mm512_dpwssd_epi32(
                            sumi,
                            _mm512_maddubs_epi16(sb.vals[j], av),
                            sb.sv[j],
                        );
                    }
                    let da = std::ptr::read_unaligned(ab as *const f32);
                    let mm = if Order::xs(ORD) {
                        _mm256_setzero_si256()
                    } else {
                        let bsums = _mm256_loadu_si256(ab.add(4 + QK_K) as *const __m256i);
                        _mm256_madd_epi16(sb.m16, bsums)
                    };
                    finish::<SIX, ORD>(
                        sumi,
                        mm,
                        da,
                        sb.d,
                        sb.dmin,
                        &mut acc8[r][c],
                        &mut acc_d[r][c],
                        &mut acc_m[r][c],
                        &mut acc_m4[r][c],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = result::<SIX, ORD>(acc8[r][c], acc_d[r][c], acc_m[r][c], acc_m4[r][c]);
        }
    }
    out
}

/// Rows per call of [`gemv_q4k`].
const GEMV_ROWS: usize = 4;

/// Q4_K mat-vec in llama.cpp's repacked gemv order ([`Order::GEMV`]) for four rows read straight
/// from their blocks: the same results as [`rows_direct`], with fewer instructions per block.
/// The activation's 256-bit halves are paired to the weight bytes' nibble halves at load, so the
/// nibbles need no shuffle; the scales come from one byte shuffle of the 12 packed bytes; the four
/// rows' dots and min terms are reduced together, and both fma chains of all four rows run as
/// one eight-lane fma (lanes 0-3 the dots, 4-7 the mins).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` Q4_K blocks readable at `w + r * wstride` for `r < 4`,
/// one Q8_K row of `nb` blocks at `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv_q4k(nb: usize, w: *const u8, wstride: usize, a: *const u8) -> [f32; GEMV_ROWS] {
    const BS: usize = 144;
    // [d0, dmin0, d1, dmin1, ...] to [d0..d3, dmin0..dmin3].
    let split = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let mut acc = _mm256_setzero_ps();
    // The next four rows, a few lines per block (a longer distance measured no faster).
    let next = w.wrapping_add(GEMV_ROWS * wstride);
    let lines = (GEMV_ROWS * wstride).div_ceil(64 * nb.max(1));
    for i in 0..nb {
        for l in 0..lines {
            #[allow(
                unused_unsafe,
                reason = "`_mm_prefetch` is safe to call in newer Rust, unsafe in 1.89 (our MSRV)"
            )]
            // SAFETY: a prefetch never faults, whatever the address.
            unsafe {
                _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add((i * lines + l) * 64) as *const i8)
            };
        }
        // SAFETY: super-block `i` of the four rows and of the activation row is in bounds
        // (caller).
        unsafe {
            let ab = a.add(i * Q8K_BYTES + 4);
            let half = |o: usize| _mm256_loadu_si256(ab.add(o) as *const __m256i);
            let pair = |o0: usize, o1: usize| {
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(half(o0)), half(o1))
            };
            // Weight bytes 64k..64k+64: low nibbles sub-blocks 4k and 4k + 2, high 4k+1, 4k+3.
            let av = [pair(0, 64), pair(32, 96), pair(128, 192), pair(160, 224)];
            let bsums = _mm256_loadu_si256(ab.add(QK_K) as *const __m256i);
            let wb = w.add(i * BS);
            let (d0, m0, f0) = gemv_q4k_row(wb, &av, bsums);
            let (d1, m1, f1) = gemv_q4k_row(wb.add(wstride), &av, bsums);
            let (d2, m2, f2) = gemv_q4k_row(wb.add(2 * wstride), &av, bsums);
            let (d3, m3, f3) = gemv_q4k_row(wb.add(3 * wstride), &av, bsums);
            let sums = hsum8([d0, d1, d2, d3], [m0, m1, m2, m3]);
            let dw =
                _mm256_permutevar8x32_ps(_mm256_cvtph_ps(_mm_setr_epi32(f0, f1, f2, f3)), split);
            let da = _mm256_set1_ps(std::ptr::read_unaligned(ab.sub(4) as *const f32));
            acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(dw, da), acc);
        }
    }
    let mut o = [0f32; GEMV_ROWS];
    let res = _mm_sub_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps::<1>(acc));
    // SAFETY: `o` holds four floats.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), res) };
    o
}

/// One row's super-block for [`gemv_q4k`]: its dot lanes (scaled), its min-term lanes (low
/// half) and its d, dmin bits. A function, not a closure, so that it is inlined: a closure
/// returning vectors was compiled apart and passed them through memory.
///
/// # Safety
/// Only called from functions compiled with AVX-512 F/BW/VL/VNNI; one Q4_K block readable at
/// `wb`.
#[inline(always)]
unsafe fn gemv_q4k_row(
    wb: *const u8,
    av: &[__m512i; 4],
    bsums: __m256i,
) -> (__m512i, __m512i, i32) {
    // SAFETY: the caller runs with the features these intrinsics need; the block's 144 bytes
    // are readable.
    unsafe {
        let m4 = _mm512_set1_epi8(0x0f);
        // vpshufb indices into the 16 bytes [scales 0..8, mins 0..8] (in every 128-bit lane):
        // the i16 scale of sub-blocks (s0 on the low 256 bits, s1 on the high), zero-extended.
        let sc_idx = |s0: i16, s1: i16| {
            _mm512_inserti64x4::<1>(
                _mm512_castsi256_si512(_mm256_set1_epi16(s0 | -0x8000)),
                _mm256_set1_epi16(s1 | -0x8000),
            )
        };
        // Nibble vector k pairs with sub-blocks (0, 2), (1, 3), (4, 6), (5, 7).
        let sc = [sc_idx(0, 2), sc_idx(1, 3), sc_idx(4, 6), sc_idx(5, 7)];
        // The min of each 16-value group (i16 lane g: min g / 2).
        let min_idx = _mm256_setr_epi16(
            -0x7ff8, -0x7ff8, -0x7ff7, -0x7ff7, -0x7ff6, -0x7ff6, -0x7ff5, -0x7ff5, -0x7ff4,
            -0x7ff4, -0x7ff3, -0x7ff3, -0x7ff2, -0x7ff2, -0x7ff1, -0x7ff1,
        );
        let dd = std::ptr::read_unaligned(wb as *const i32);
        let [u0, u1, u2, u3] = k4_scales(wb.add(4));
        let s = _mm512_broadcast_i32x4(_mm_setr_epi32(u0 as i32, u1 as i32, u2 as i32, u3 as i32));
        let q0 = _mm512_loadu_si512(wb.add(16) as *const _);
        let q1 = _mm512_loadu_si512(wb.add(80) as *const _);
        let v = [
            _mm512_and_si512(q0, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q0), m4),
            _mm512_and_si512(q1, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(q1), m4),
        ];
        let mut sum = _mm512_setzero_si512();
        for k in 0..4 {
            sum = _mm512_dpwssd_epi32(
                sum,
                _mm512_maddubs_epi16(v[k], av[k]),
                _mm512_shuffle_epi8(s, sc[k]),
            );
        }
        let m16 = _mm256_shuffle_epi8(_mm512_castsi512_si256(s), min_idx);
        let mins = _mm512_zextsi256_si512(_mm256_madd_epi16(m16, bsums));
        (sum, mins, dd)
    }
}

/// The lane sums of eight i32 vectors, `x` then `y`: lane j of the result is the sum of the
/// j-th vector (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum8(x: [__m512i; 4], y: [__m512i; 4]) -> __m256i {
    // Per 128-bit quarter: [a, b, a, b] partials, then [a, b, c, d].
    let two = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
    };
    let four = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b))
    };
    let p = four(two(x[0], x[1]), two(x[2], x[3]));
    let q = four(two(y[0], y[1]), two(y[2], y[3]));
    // Quarters [p0 + p2, p1 + p3, q0 + q2, q1 + q3], then [p, q, p, q].
    let quarters = |a: __m512i, b: __m512i| {
        _mm512_add_epi32(
            _mm512_shuffle_i64x2::<0b1000_1000>(a, b),
            _mm512_shuffle_i64x2::<0b1101_1101>(a, b),
        )
    };
    let t = quarters(p, q);
    _mm512_castsi512_si256(quarters(t, t))
}

/// Rows of one interleaved Q4_K group ([`interleave_q4k`]): one per 32-bit lane.
const IL_ROWS: usize = 16;
/// Offsets in one interleaved super-block: 64 vectors of values (vector g: every row's values
/// 4g..4g + 4), 8 of sub-block scales, 4 of min pairs, the rows' d and dmin.
const IL_SC: usize = 64 * 64;
const IL_MIN: usize = IL_SC + 8 * 64;
const IL_D: usize = IL_MIN + 4 * 64;
const IL_DMIN: usize = IL_D + 64;
/// Bytes of one interleaved super-block of [`IL_ROWS`] rows.
const IL_SB: usize = IL_DMIN + 64;

/// Lays out 16 Q4_K rows (`wstride` bytes apart, `nb` super-blocks) with one row per 32-bit lane,
/// llama.cpp's repacking idea in a wider form: the values of four consecutive positions of all
/// rows in one vector, each sub-block's scale as an i32 per row, the min pair of each
/// 64-value chunk, d and dmin as f32. The product kernel ([`gemm_q4k`]) then needs no horizontal
/// sums: a row's dot stays in its lane.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks readable at `w + r * wstride` for `r < 16`,
/// `nb * IL_SB` bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn interleave_q4k(nb: usize, w: *const u8, wstride: usize, out: *mut u8) {
    const BS: usize = 144;
    let m4 = _mm256_set1_epi8(0x0f);
    // One super-block of every row in value order.
    let mut vals = [[_mm512_setzero_si512(); 4]; IL_ROWS];
    for i in 0..nb {
        // SAFETY: block `i` of every row is readable and the output super-block writable
        // (caller); the lane arrays are 16 u32 (64 bytes) each.
        unsafe {
            let o = out.add(i * IL_SB);
            let mut sc = [[0u32; IL_ROWS]; 8];
            let mut mn = [[0u32; IL_ROWS]; 4];
            let mut dd = [0u32; IL_ROWS];
            for (r, v) in vals.iter_mut().enumerate() {
                let wb = w.add(r * wstride + i * BS);
                dd[r] = std::ptr::read_unaligned(wb as *const u32);
                let [u0, u1, u2, u3] = k4_scales(wb.add(4));
                let b = (u0 as u64 | (u1 as u64) << 32).to_le_bytes();
                let m = (u2 as u64 | (u3 as u64) << 32).to_le_bytes();
                for s in 0..8 {
                    sc[s][r] = u32::from(b[s]);
                }
                for j in 0..4 {
                    mn[j][r] = u32::from(m[2 * j]) | u32::from(m[2 * j + 1]) << 16;
                }
                for (j, vj) in v.iter_mut().enumerate() {
                    let bits = _mm256_loadu_si256(wb.add(16 + 32 * j) as *const __m256i);
                    let lo = _mm256_and_si256(bits, m4);
                    let hi = _mm256_and_si256(_mm256_srli_epi16(bits, 4), m4);
                    *vj = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                }
            }
            for j in 0..4 {
                let t = transpose16(std::array::from_fn(|r| vals[r][j]));
                for (g, tg) in t.iter().enumerate() {
                    _mm512_storeu_si512(o.add(64 * (16 * j + g)) as *mut _, *tg);
                }
            }
            for (s, v) in sc.iter().enumerate() {
                std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, o.add(IL_SC + 64 * s), 64);
            }
            for (j, v) in mn.iter().enumerate() {
                std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, o.add(IL_MIN + 64 * j), 64);
            }
            let halves = |k: usize| {
                _mm256_setr_epi32(
                    dd[8 * k] as i32,
                    dd[8 * k + 1] as i32,
                    dd[8 * k + 2] as i32,
                    dd[8 * k + 3] as i32,
                    dd[8 * k + 4] as i32,
                    dd[8 * k + 5] as i32,
                    dd[8 * k + 6] as i32,
                    dd[8 * k + 7] as i32,
                )
            };
            // Each u32: d (low half) and dmin (high half) as f16.
            let (h0, h1) = (halves(0), halves(1));
            let lo16 = _mm256_set1_epi32(0xffff);
            let d16 = _mm256_packus_epi32(_mm256_and_si256(h0, lo16), _mm256_and_si256(h1, lo16));
            let m16 = _mm256_packus_epi32(_mm256_srli_epi32(h0, 16), _mm256_srli_epi32(h1, 16));
            // packus interleaves 128-bit halves: [h0 lo, h1 lo, h0 hi, h1 hi] in 64-bit units.
            let d16 = _mm256_permute4x64_epi64::<0b1101_1000>(d16);
            let m16 = _mm256_permute4x64_epi64::<0b1101_1000>(m16);
            _mm512_storeu_ps(o.add(IL_D) as *mut f32, _mm512_cvtph_ps(d16));
            _mm512_storeu_ps(o.add(IL_DMIN) as *mut f32, _mm512_cvtph_ps(m16));
        }
    }
}

/// The 16 x 16 transpose of 32-bit elements: lane r of result e is lane e of `x[r]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn transpose16(x: [__m512i; 16]) -> [__m512i; 16] {
    // Within each 128-bit lane: rows 4q..4q + 4 at element k (u[q][k]).
    let mut u = [[_mm512_setzero_si512(); 4]; 4];
    for q in 0..4 {
        let (a, b, c, d) = (x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
        let (ab0, ab1) = (_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
        let (cd0, cd1) = (_mm512_unpacklo_epi32(c, d), _mm512_unpackhi_epi32(c, d));
        u[q] = [
            _mm512_unpacklo_epi64(ab0, cd0),
            _mm512_unpackhi_epi64(ab0, cd0),
            _mm512_unpacklo_epi64(ab1, cd1),
            _mm512_unpackhi_epi64(ab1, cd1),
        ];
    }
    let mut out = [_mm512_setzero_si512(); 16];
    for k in 0..4 {
        let v01lo = _mm512_shuffle_i32x4::<0b0100_0100>(u[0][k], u[1][k]);
        let v01hi = _mm512_shuffle_i32x4::<0b1110_1110>(u[0][k], u[1][k]);
        let v23lo = _mm512_shuffle_i32x4::<0b0100_0100>(u[2][k], u[3][k]);
        let v23hi = _mm512_shuffle_i32x4::<0b1110_1110>(u[2][k], u[3][k]);
        // Element 4L + k of every row, L the 128-bit lane.
        out[k] = _mm512_shuffle_i32x4::<0b1000_1000>(v01lo, v23lo);
        out[4 + k] = _mm512_shuffle_i32x4::<0b1101_1101>(v01lo, v23lo);
        out[8 + k] = _mm512_shuffle_i32x4::<0b1000_1000>(v01hi, v23hi);
        out[12 + k] = _mm512_shuffle_i32x4::<0b1101_1101>(v01hi, v23hi);
    }
    out
}

/// 16 interleaved Q4_K rows ([`interleave_q4k`] at `d`) times `C` Q8_K rows (`astride` bytes
/// apart): lane r of result c is row r's dot with column c. `GEMM`: llama.cpp's repacked gemm
/// order ([`tile_gemm`]: per 64 values `a = fma(dot, dw * da, a)`, `m = fma(mins, dmin * da, m)`);
/// otherwise its repacked gemv order ([`Order::GEMV`]: the same per super-block).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `nb * IL_SB` bytes at `d`, `C` Q8_K rows of `nb` blocks at `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemm_q4k<const C: usize, const GEMM: bool>(
    nb: usize,
    d: *const u8,
    a: *const u8,
    astride: usize,
) -> [__m512; C] {
    let mut acc_d = [_mm512_setzero_ps(); C];
    let mut acc_m = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        // SAFETY: super-block `i` of the interleaved rows and of every column is in bounds
        // (caller).
        unsafe {
            let db = d.add(i * IL_SB);
            let mut ab = [a; C];
            for (c, p) in ab.iter_mut().enumerate() {
                *p = a.add(c * astride + i * Q8K_BYTES);
            }
            let dw = _mm512_loadu_ps(db.add(IL_D) as *const f32);
            let dmin = _mm512_loadu_ps(db.add(IL_DMIN) as *const f32);
            let da: [__m512; C] = std::array::from_fn(|c| {
                _mm512_set1_ps(std::ptr::read_unaligned(ab[c] as *const f32))
            });
            let sd: [__m512; C] = std::array::from_fn(|c| _mm512_mul_ps(dw, da[c]));
            let sm: [__m512; C] = std::array::from_fn(|c| _mm512_mul_ps(dmin, da[c]));
            let mut dot = [_mm512_setzero_si512(); C];
            let mut mins = [_mm512_setzero_si512(); C];
            for j in 0..4 {
                if GEMM {
                    dot = [_mm512_setzero_si512(); C];
                }
                for half in 0..2 {
                    // A sub-block's unscaled dot (`vpdpbusd`, four products per lane), then
                    // times its scale: exact in 32 bits, half the instructions of scaling
                    // every pair.
                    let mut t = [_mm512_setzero_si512(); C];
                    let sb = 16 * j + 8 * half;
                    for g in sb..sb + 8 {
                        let wv = _mm512_loadu_si512(db.add(64 * g) as *const _);
                        for c in 0..C {
                            let av = _mm512_set1_epi32(std::ptr::read_unaligned(
                                ab[c].add(4 + 4 * g) as *const i32,
                            ));
                            t[c] = _mm512_dpbusd_epi32(t[c], wv, av);
                        }
                    }
                    let sc = _mm512_loadu_si512(db.add(IL_SC + 64 * (2 * j + half)) as *const _);
                    for c in 0..C {
                        dot[c] = _mm512_add_epi32(dot[c], _mm512_mullo_epi32(t[c], sc));
                    }
                }
                let mn = _mm512_loadu_si512(db.add(IL_MIN + 64 * j) as *const _);
                for c in 0..C {
                    // The 32-value sums of sub-blocks 2j and 2j + 1 (each of two 16-value sums).
                    let bs = |s: usize| {
                        let p = ab[c].add(4 + QK_K + 4 * s) as *const i16;
                        i32::from(std::ptr::read_unaligned(p))
                            + i32::from(std::ptr::read_unaligned(p.add(1)))
                    };
                    let pair = (bs(2 * j) & 0xffff) | bs(2 * j + 1) << 16;
                    let mj = _mm512_madd_epi16(mn, _mm512_set1_epi32(pair));
                    if GEMM {
                        acc_d[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[c]), sd[c], acc_d[c]);
                        acc_m[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mj), sm[c], acc_m[c]);
                    } else {
                        mins[c] = _mm512_add_epi32(mins[c], mj);
                    }
                }
            }
            if !GEMM {
                for c in 0..C {
                    acc_d[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[c]), sd[c], acc_d[c]);
                    acc_m[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins[c]), sm[c], acc_m[c]);
                }
            }
        }
    }
    std::array::from_fn(|c| _mm512_sub_ps(acc_d[c], acc_m[c]))
}

thread_local! {
    /// Interleaved Q4_K rows of the current call (reused: no allocation per call).
    static INTERLEAVED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Bytes of one interleaved super-block of 16 Q6_K rows ([`interleave_q6k`]): values, scales
/// as i32, scale pairs as i16, d.
const IL6_SC: usize = 64 * 64;
const IL6_PAIR: usize = IL6_SC + 16 * 64;
const IL6_D: usize = IL6_PAIR + 8 * 64;
const IL6_SB: usize = IL6_D + 64;

/// 16 Q6_K rows laid out as [`interleave_q4k`] lays out Q4_K: values 0..63 four positions per
/// lane, each sub-block's scale as an i32 per row and, in pairs of sub-blocks, as i16 pairs (for
/// the `- 32` term), d as f32.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks readable at `w + r * wstride` for `r < 16`,
/// `nb * IL6_SB` bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn interleave_q6k(nb: usize, w: *const u8, wstride: usize, out: *mut u8) {
    const BS: usize = 210;
    let mut vals = [[_mm512_setzero_si512(); 4]; IL_ROWS];
    for i in 0..nb {
        // SAFETY: block `i` of every row is readable and the output super-block writable
        // (caller); the lane arrays are 16 u32 (64 bytes) each.
        unsafe {
            let o = out.add(i * IL6_SB);
            let mut sc = [[0i32; IL_ROWS]; 16];
            let mut pair = [[0u32; IL_ROWS]; 8];
            let mut d = [0f32; IL_ROWS];
            for (r, v) in vals.iter_mut().enumerate() {
                let wb = w.add(r * wstride + i * BS);
                *v = decode_sb(DType::Q6_K, wb).vals;
                let scale = |s: usize| *wb.add(192 + s) as i8;
                for (s, lanes) in sc.iter_mut().enumerate() {
                    lanes[r] = i32::from(scale(s));
                }
                for (p, lanes) in pair.iter_mut().enumerate() {
                    lanes[r] = u32::from(i16::from(scale(2 * p)) as u16)
                        | u32::from(i16::from(scale(2 * p + 1)) as u16) << 16;
                }
                d[r] = f16_load(wb.add(208));
            }
            for j in 0..4 {
                let t = transpose16(std::array::from_fn(|r| vals[r][j]));
                for (g, tg) in t.iter().enumerate() {
                    _mm512_storeu_si512(o.add(64 * (16 * j + g)) as *mut _, *tg);
                }
            }
            for (s, v) in sc.iter().enumerate() {
                std::ptr::copy_nonoverlapping(v.as_ptr() as *const u8, o.add(IL6_SC + 64 * s), 64);
            }
            for (p, v) in pair.iter().enumerate() {
                std::ptr::copy_nonoverlapping(
                    v.as_ptr() as *const u8,
                    o.add(IL6_PAIR + 64 * p),
                    64,
                );
            }
            std::ptr::copy_nonoverlapping(d.as_ptr() as *const u8, o.add(IL6_D), 64);
        }
    }
}

/// 16 interleaved Q6_K rows ([`interleave_q6k`] at `d`) times `C` Q8_K rows in llama.cpp's tiled
/// order ([`Order::TILED`]: per super-block `r = dot * dw`, `acc = fma(r, da, acc)`, the dot
/// `(q - 32) . a` exact in integers); lane r of result c is row r's.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `nb * IL6_SB` bytes at `d`, `C` Q8_K rows of `nb` blocks at `a`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemm_q6k<const C: usize>(
    nb: usize,
    d: *const u8,
    a: *const u8,
    astride: usize,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        // SAFETY: super-block `i` of the interleaved rows and of every column is in bounds
        // (caller).
        unsafe {
            let db = d.add(i * IL6_SB);
            let mut ab = [a; C];
            for (c, p) in ab.iter_mut().enumerate() {
                *p = a.add(c * astride + i * Q8K_BYTES);
            }
            let mut dot = [_mm512_setzero_si512(); C];
            for s in 0..16 {
                let mut t = [_mm512_setzero_si512(); C];
                for g in 4 * s..4 * s + 4 {
                    let wv = _mm512_loadu_si512(db.add(64 * g) as *const _);
                    for c in 0..C {
                        let av = _mm512_set1_epi32(std::ptr::read_unaligned(
                            ab[c].add(4 + 4 * g) as *const i32
                        ));
                        t[c] = _mm512_dpbusd_epi32(t[c], wv, av);
                    }
                }
                let sc = _mm512_loadu_si512(db.add(IL6_SC + 64 * s) as *const _);
                for c in 0..C {
                    dot[c] = _mm512_add_epi32(dot[c], _mm512_mullo_epi32(t[c], sc));
                }
            }
            let dw = _mm512_loadu_ps(db.add(IL6_D) as *const f32);
            for c in 0..C {
                // Sum over sub-blocks of scale times 16-value sum, for the `- 32` term.
                let mut off = _mm512_setzero_si512();
                for p in 0..8 {
                    let sp = _mm512_loadu_si512(db.add(IL6_PAIR + 64 * p) as *const _);
                    let bs = std::ptr::read_unaligned(ab[c].add(4 + QK_K + 4 * p) as *const i32);
                    off = _mm512_add_epi32(off, _mm512_madd_epi16(sp, _mm512_set1_epi32(bs)));
                }
                let total = _mm512_sub_epi32(dot[c], _mm512_slli_epi32::<5>(off));
                let da = _mm512_set1_ps(std::ptr::read_unaligned(ab[c] as *const f32));
                let r = _mm512_mul_ps(_mm512_cvtepi32_ps(total), dw);
                acc[c] = _mm512_fmadd_ps(r, da, acc[c]);
            }
        }
    }
    acc
}

/// Rows `0..` of a Q4_K weight llama.cpp repacks, or of a Q6_K weight in its tiled order, in
/// whole groups of 16 through the interleaved layouts ([`interleave_q4k`], [`interleave_q6k`]):
/// Q4_K columns below `gemm_cols` in the gemm order and the rest in the gemv order, Q6_K columns
/// all tiled. Returns the rows done (a multiple of 16).
fn k_interleaved(ty: DType, t: &Tile<'_>, nb: usize, gemm_cols: usize, out: &mut [f32]) -> usize {
    let groups = t.rows / IL_ROWS;
    if groups == 0 {
        return 0;
    }
    let six = ty == DType::Q6_K;
    let sb = if six { IL6_SB } else { IL_SB };
    INTERLEAVED.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < nb * sb {
            buf.resize(nb * sb, 0);
        }
        let mut res = [0f32; IL_ROWS];
        for grp in 0..groups {
            let r0 = grp * IL_ROWS;
            let wp = t.w[r0 * t.wstride..].as_ptr();
            // SAFETY: AVX-512 VNNI detected (caller path); rows `r0..r0 + 16` hold `nb` blocks
            // (checked by the caller), the buffer `nb * sb` bytes.
            unsafe {
                if six {
                    interleave_q6k(nb, wp, t.wstride, buf.as_mut_ptr())
                } else {
                    interleave_q4k(nb, wp, t.wstride, buf.as_mut_ptr())
                }
            };
            let dp = buf.as_ptr();
            let mut c0 = 0;
            while c0 < t.cols {
                let four = if six {
                    t.cols - c0 >= 4
                } else {
                    c0 < gemm_cols
                };
                let ap = t.a[c0 * t.astride..].as_ptr();
                let mut put = |c: usize, vc: __m512| {
                    // SAFETY: `res` holds 16 floats.
                    unsafe { _mm512_storeu_ps(res.as_mut_ptr(), vc) };
                    let o = (c0 + c) * t.ocs + r0;
                    out[o..o + IL_ROWS].copy_from_slice(&res);
                };
                if four {
                    // SAFETY: as above; 4 Q8_K rows of `nb` blocks from column `c0` (checked by
                    // the caller; `gemm_cols` is a multiple of 4).
                    let v = unsafe {
                        if six {
                            gemm_q6k::<4>(nb, dp, ap, t.astride)
                        } else {
                            gemm_q4k::<4, true>(nb, dp, ap, t.astride)
                        }
                    };
                    for (c, vc) in v.into_iter().enumerate() {
                        put(c, vc);
                    }
                } else {
                    // SAFETY: as above; column `c0 < cols` holds `nb` Q8_K blocks.
                    let [v] = unsafe {
                        if six {
                            gemm_q6k::<1>(nb, dp, ap, t.astride)
                        } else {
                            gemm_q4k::<1, false>(nb, dp, ap, t.astride)
                        }
                    };
                    put(0, v);
                }
                c0 += if four { 4 } else { 1 };
            }
        }
    });
    groups * IL_ROWS
}

/// The activation bytes `av` with the signs of IQ4_XS weights (negated where `neg` has a bit),
/// for the IQ4_XS orders; `av` itself for the others.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn signed<const ORD: u8>(av: __m512i, neg: u64) -> __m512i {
    if Order::xs(ORD) {
        _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av)
    } else {
        av
    }
}

/// One super-block's float step of one result (see [`Order`]).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn finish<const SIX: bool, const ORD: u8>(
    sumi: __m512i,
    mm: __m256i,
    da: f32,
    dw: f32,
    dmin: f32,
    acc8: &mut __m256,
    acc_d: &mut f32,
    acc_m: &mut f32,
    acc_m4: &mut __m128,
) {
    // Lanes m and m + 8 hold the same four values of two 32-value chunks.
    let s8 = _mm256_add_epi32(
        _mm512_castsi512_si256(sumi),
        _mm512_extracti64x4_epi64::<1>(sumi),
    );
    if ORD == Order::XS_TILED {
        *acc_d = (hsum_i32(s8) as f32 * dw).mul_add(da, *acc_d);
    } else if ORD == Order::XS_LANES {
        *acc8 = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(s8), *acc8);
    } else if ORD == Order::TILED {
        let r = if SIX {
            // (q - 32) . a in integers, then one rounding per step.
            hsum_i32(_mm256_sub_epi32(s8, _mm256_slli_epi32(mm, 5))) as f32 * dw
        } else {
            (-dmin).mul_add(hsum_i32(mm) as f32, hsum_i32(s8) as f32 * dw)
        };
        *acc_d = r.mul_add(da, *acc_d);
    } else if ORD == Order::LANES4 {
        *acc8 = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(s8), *acc8);
        // Lane l of mm: sub-block l's min times its 32-value sum; pairs of sub-blocks added.
        let pairs = _mm256_hadd_epi32(mm, mm);
        let p4 = _mm256_castsi256_si128(_mm256_permute4x64_epi64::<0b1000>(pairs));
        *acc_m4 = _mm_fmadd_ps(_mm_set1_ps(-da * dmin), _mm_cvtepi32_ps(p4), *acc_m4);
    } else if ORD == Order::LANES {
        // Q6_K: (q - 32) . a, subtracting 32 * scale * group sum per lane.
        let s8 = if SIX {
            _mm256_sub_epi32(s8, _mm256_slli_epi32(mm, 5))
        } else {
            s8
        };
        *acc8 = _mm256_fmadd_ps(_mm256_set1_ps(da * dw), _mm256_cvtepi32_ps(s8), *acc8);
        if !SIX {
            // Q5_K: the min term on its own chain, `fma(-da * dmin, mins, m)`.
            *acc_m = (-da * dmin).mul_add(hsum_i32(mm) as f32, *acc_m);
        }
    } else {
        // The whole super-block's integer dot and min term, two fma chains (the result is
        // `acc_d - acc_m`).
        let (dot, mins) = (hsum_i32(s8) as f32, hsum_i32(mm) as f32);
        *acc_d = dot.mul_add(dw * da, *acc_d);
        *acc_m = mins.mul_add(dmin * da, *acc_m);
    }
}

/// A result from its accumulators (see [`Order`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn result<const SIX: bool, const ORD: u8>(
    acc8: __m256,
    acc_d: f32,
    acc_m: f32,
    acc_m4: __m128,
) -> f32 {
    if ORD == Order::TILED || ORD == Order::XS_TILED {
        acc_d
    } else if ORD == Order::XS_LANES {
        hsum_float_8(acc8)
    } else if ORD == Order::LANES4 {
        let m = _mm_add_ps(acc_m4, _mm_movehl_ps(acc_m4, acc_m4));
        hsum_float_8(acc8) + _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)))
    } else if ORD == Order::LANES {
        // Q5_K adds its min chain (zero for Q6_K).
        hsum_float_8(acc8) + acc_m
    } else {
        acc_d - acc_m
    }
}

/// `R` decoded weight rows (`wstride` bytes apart) times `C` Q8_K rows (`astride` bytes
/// apart), `nb` super-blocks each; `out[r][c]`, in the float steps of `ORD` (see [`Order`]; for
/// Q6_K `GEMV` means `LANES`). Q4_K's four-column order is [`tile_gemm`].
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; every row holds `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<const R: usize, const C: usize, const SIX: bool, const ORD: u8>(
    nb: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[f32; C]; R] {
    let mut acc8 = [[_mm256_setzero_ps(); C]; R];
    let mut acc_d = [[0f32; C]; R];
    let mut acc_m = [[0f32; C]; R];
    let mut acc_m4 = [[_mm_setzero_ps(); C]; R];
    for i in 0..nb {
        // SAFETY: super-block `i` of every row is in bounds (caller).
        unsafe {
            let mut sumi = [[_mm512_setzero_si512(); C]; R];
            for j in 0..4 {
                let mut neg = [0u64; R];
                if Order::xs(ORD) {
                    for (r, m) in neg.iter_mut().enumerate() {
                        let wp = w.add(r * wstride + i * W_SB + OFF_MIN + 8 * j);
                        *m = std::ptr::read_unaligned(wp as *const u64);
                    }
                }
                for c in 0..C {
                    let av = _mm512_loadu_si512(
                        a.add(c * astride + i * Q8K_BYTES + 4 + 64 * j) as *const _
                    );
                    for r in 0..R {
                        let wp = w.add(r * wstride + i * W_SB);
                        let wv = _mm512_loadu_si512(wp.add(64 * j) as *const _);
                        let sv = _mm512_loadu_si512(wp.add(OFF_SC + 64 * j) as *const _);
                        let av = signed::<ORD>(av, neg[r]);
                        sumi[r][c] =
                            _mm512_dpwssd_epi32(sumi[r][c], _mm512_maddubs_epi16(wv, av), sv);
                    }
                }
            }
            for c in 0..C {
                let ab = a.add(c * astride + i * Q8K_BYTES);
                let da = std::ptr::read_unaligned(ab as *const f32);
                let bsums = _mm256_loadu_si256(ab.add(4 + QK_K) as *const __m256i);
                for r in 0..R {
                    let wp = w.add(r * wstride + i * W_SB);
                    let mm = if Order::xs(ORD) {
                        _mm256_setzero_si256()
                    } else {
                        let m16 = _mm256_loadu_si256(wp.add(OFF_MIN) as *const __m256i);
                        _mm256_madd_epi16(m16, bsums)
                    };
                    let dw = std::ptr::read_unaligned(wp.add(OFF_D) as *const f32);
                    let dmin = std::ptr::read_unaligned(wp.add(OFF_D + 4) as *const f32);
                    finish::<SIX, ORD>(
                        sumi[r][c],
                        mm,
                        da,
                        dw,
                        dmin,
                        &mut acc8[r][c],
                        &mut acc_d[r][c],
                        &mut acc_m[r][c],
                        &mut acc_m4[r][c],
                    );
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = result::<SIX, ORD>(acc8[r][c], acc_d[r][c], acc_m[r][c], acc_m4[r][c]);
        }
    }
    out
}

/// Rows per register tile of [`tile_gemm`].
const GR: usize = 2;
/// Columns per register tile of [`tile_gemm`].
const GC: usize = 2;

/// Q4_K's order for whole groups of four columns (ggml's repacked `gemm_q4_K_8x8`): per 64
/// values (two sub-blocks) the integer dot and min term, `a = fma(dot, dw * da, a)`,
/// `m = fma(mins, dmin * da, m)`, result `a - m`. Same operands as [`tile`]; the four 64-value
/// sums of a result are kept apart until the end of each super-block.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; every row holds `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_gemm<const R: usize, const C: usize>(
    nb: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[f32; C]; R] {
    let mut acc_d = [[0f32; C]; R];
    let mut acc_m = [[0f32; C]; R];
    for i in 0..nb {
        // SAFETY: super-block `i` of every row is in bounds (caller).
        unsafe {
            let mut sums = [[[_mm512_setzero_si512(); 4]; C]; R];
            for j in 0..4 {
                for c in 0..C {
                    let av = _mm512_loadu_si512(
                        a.add(c * astride + i * Q8K_BYTES + 4 + 64 * j) as *const _
                    );
                    for r in 0..R {
                        let wp = w.add(r * wstride + i * W_SB);
                        let wv = _mm512_loadu_si512(wp.add(64 * j) as *const _);
                        let sv = _mm512_loadu_si512(wp.add(OFF_SC + 64 * j) as *const _);
                        sums[r][c][j] = _mm512_madd_epi16(_mm512_maddubs_epi16(wv, av), sv);
                    }
                }
            }
            for c in 0..C {
                let ab = a.add(c * astride + i * Q8K_BYTES);
                let da = std::ptr::read_unaligned(ab as *const f32);
                let bsums = _mm256_loadu_si256(ab.add(4 + QK_K) as *const __m256i);
                for r in 0..R {
                    let wp = w.add(r * wstride + i * W_SB);
                    let m16 = _mm256_loadu_si256(wp.add(OFF_MIN) as *const __m256i);
                    let dw = std::ptr::read_unaligned(wp.add(OFF_D) as *const f32);
                    let dmin = std::ptr::read_unaligned(wp.add(OFF_D + 4) as *const f32);
                    let dots = hsum4(sums[r][c]);
                    // Lane l: sub-block l's min times its 32-value sum; 64 values = lanes 2j, 2j+1.
                    let mm = _mm256_madd_epi16(m16, bsums);
                    let pairs = _mm256_hadd_epi32(mm, mm);
                    let mins = _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(
                        pairs,
                        _mm256_setr_epi32(0, 1, 4, 5, 0, 1, 4, 5),
                    ));
                    let mut fd = [0f32; 4];
                    let mut fm = [0f32; 4];
                    _mm_storeu_ps(fd.as_mut_ptr(), _mm_cvtepi32_ps(dots));
                    _mm_storeu_ps(fm.as_mut_ptr(), _mm_cvtepi32_ps(mins));
                    let (sd, sm) = (dw * da, dmin * da);
                    for j in 0..4 {
                        acc_d[r][c] = fd[j].mul_add(sd, acc_d[r][c]);
                        acc_m[r][c] = fm[j].mul_add(sm, acc_m[r][c]);
                    }
                }
            }
        }
    }
    let mut out = [[0f32; C]; R];
    for r in 0..R {
        for c in 0..C {
            out[r][c] = acc_d[r][c] - acc_m[r][c];
        }
    }
    out
}

/// [`tile_gemm`] for 2 rows x 2 columns, the four results' sums reduced and their fma chains run
/// together (lane `2 r + c` of 128-bit vectors): same values, fewer instructions.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; both rows hold `nb` super-blocks.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile_gemm22(
    nb: usize,
    w: *const u8,
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [[f32; 2]; 2] {
    let mut acc_d = _mm_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..nb {
        // SAFETY: super-block `i` of both rows and both activation rows is in bounds (caller).
        unsafe {
            let wp = [w.add(i * W_SB), w.add(wstride + i * W_SB)];
            let ab = [a.add(i * Q8K_BYTES), a.add(astride + i * Q8K_BYTES)];
            // x[j]: 128-bit quarter k holds the four results' partial sums (lane 2r + c) over
            // the quarter-k lanes of the 64-value chunk j.
            let mut x = [_mm512_setzero_si512(); 4];
            for (j, xj) in x.iter_mut().enumerate() {
                let av = [
                    _mm512_loadu_si512(ab[0].add(4 + 64 * j) as *const _),
                    _mm512_loadu_si512(ab[1].add(4 + 64 * j) as *const _),
                ];
                let mut t = [_mm512_setzero_si512(); 4];
                for r in 0..2 {
                    let wv = _mm512_loadu_si512(wp[r].add(64 * j) as *const _);
                    let sv = _mm512_loadu_si512(wp[r].add(OFF_SC + 64 * j) as *const _);
                    for c in 0..2 {
                        t[2 * r + c] = _mm512_madd_epi16(_mm512_maddubs_epi16(wv, av[c]), sv);
                    }
                }
                let pair = |a: __m512i, b: __m512i| {
                    _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b))
                };
                let (t01, t23) = (pair(t[0], t[1]), pair(t[2], t[3]));
                // Per quarter: `pair` gives [a02, b02, a13, b13], the 64-bit unpacks then
                // [a02, b02, c02, d02] and [a13, b13, c13, d13].
                *xj = _mm512_add_epi32(
                    _mm512_unpacklo_epi64(t01, t23),
                    _mm512_unpackhi_epi64(t01, t23),
                );
            }
            // The sums of the four quarters of x[j] into quarter j.
            let quarters = |a: __m512i, b: __m512i| {
                _mm512_add_epi32(
                    _mm512_shuffle_i64x2::<0b1000_1000>(a, b),
                    _mm512_shuffle_i64x2::<0b1101_1101>(a, b),
                )
            };
            let (y01, y23) = (quarters(x[0], x[1]), quarters(x[2], x[3]));
            let dots = _mm512_cvtepi32_ps(quarters(y01, y23));
            // Min terms: lane l of mm = sub-block l's min times its 32-value sum.
            let m16 = [
                _mm256_loadu_si256(wp[0].add(OFF_MIN) as *const __m256i),
                _mm256_loadu_si256(wp[1].add(OFF_MIN) as *const __m256i),
            ];
            let bsums = [
                _mm256_loadu_si256(ab[0].add(4 + QK_K) as *const __m256i),
                _mm256_loadu_si256(ab[1].add(4 + QK_K) as *const __m256i),
            ];
            let mm = |r: usize, c: usize| _mm256_madd_epi16(m16[r], bsums[c]);
            // [p0 j0, p0 j1, p1 j0, p1 j1 | p0 j2, p0 j3, p1 j2, p1 j3] and the same for p2, p3.
            let h01 = _mm256_hadd_epi32(mm(0, 0), mm(0, 1));
            let h23 = _mm256_hadd_epi32(mm(1, 0), mm(1, 1));
            let (lo, hi) = (
                _mm256_unpacklo_epi32(h01, h23),
                _mm256_unpackhi_epi32(h01, h23),
            );
            // [j0 | j2] and [j1 | j3], lane p.
            let m02 = _mm256_cvtepi32_ps(_mm256_unpacklo_epi32(lo, hi));
            let m13 = _mm256_cvtepi32_ps(_mm256_unpackhi_epi32(lo, hi));
            let f = |p: *const u8, o: usize| std::ptr::read_unaligned(p.add(o) as *const f32);
            let (dw, dmin) = (
                _mm_setr_ps(
                    f(wp[0], OFF_D),
                    f(wp[0], OFF_D),
                    f(wp[1], OFF_D),
                    f(wp[1], OFF_D),
                ),
                _mm_setr_ps(
                    f(wp[0], OFF_D + 4),
                    f(wp[0], OFF_D + 4),
                    f(wp[1], OFF_D + 4),
                    f(wp[1], OFF_D + 4),
                ),
            );
            let da = _mm_setr_ps(f(ab[0], 0), f(ab[1], 0), f(ab[0], 0), f(ab[1], 0));
            let (sd, sm) = (_mm_mul_ps(dw, da), _mm_mul_ps(dmin, da));
            acc_d = _mm_fmadd_ps(_mm512_castps512_ps128(dots), sd, acc_d);
            acc_d = _mm_fmadd_ps(_mm512_extractf32x4_ps::<1>(dots), sd, acc_d);
            acc_d = _mm_fmadd_ps(_mm512_extractf32x4_ps::<2>(dots), sd, acc_d);
            acc_d = _mm_fmadd_ps(_mm512_extractf32x4_ps::<3>(dots), sd, acc_d);
            acc_m = _mm_fmadd_ps(_mm256_castps256_ps128(m02), sm, acc_m);
            acc_m = _mm_fmadd_ps(_mm256_castps256_ps128(m13), sm, acc_m);
            acc_m = _mm_fmadd_ps(_mm256_extractf128_ps::<1>(m02), sm, acc_m);
            acc_m = _mm_fmadd_ps(_mm256_extractf128_ps::<1>(m13), sm, acc_m);
        }
    }
    let mut o = [0f32; 4];
    // SAFETY: `o` holds four floats.
    unsafe { _mm_storeu_ps(o.as_mut_ptr(), _mm_sub_ps(acc_d, acc_m)) };
    [[o[0], o[1]], [o[2], o[3]]]
}

/// The lane sums of four i32 vectors: lane j of the result is the sum of `v[j]` (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum4(v: [__m512i; 4]) -> __m128i {
    // 128-bit quarters: [v0 q0+q2, v0 q1+q3, v1 q0+q2, v1 q1+q3], same for v2, v3.
    let x01 = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b0100_0100>(v[0], v[1]),
        _mm512_shuffle_i64x2::<0b1110_1110>(v[0], v[1]),
    );
    let x23 = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b0100_0100>(v[2], v[3]),
        _mm512_shuffle_i64x2::<0b1110_1110>(v[2], v[3]),
    );
    // Quarter k: the four partial lanes of v[k].
    let y = _mm512_add_epi32(
        _mm512_shuffle_i64x2::<0b1000_1000>(x01, x23),
        _mm512_shuffle_i64x2::<0b1101_1101>(x01, x23),
    );
    let y = _mm512_add_epi32(y, _mm512_shuffle_epi32::<0b0100_1110>(y));
    let y = _mm512_add_epi32(y, _mm512_shuffle_epi32::<0b1011_0001>(y));
    _mm512_castsi512_si128(_mm512_permutexvar_epi32(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12, 0, 4, 8, 12),
        y,
    ))
}

/// Sum of eight i32 lanes (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum_i32(v: __m256i) -> i32 {
    let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32::<1>(x)))
}

/// ggml's `hsum_float_8`: 128-bit halves, then `movehl`, then `movehdup`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
fn hsum_float_8(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

thread_local! {
    /// Decoded weight rows of the current call (reused: no allocation per call).
    static DECODED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Dot products of `rows` weight rows (`n` values of `ty` each, `wstride` bytes apart in `w`)
/// with `cols` Q8_K activation rows (`astride` bytes apart in `a`): `out[c * ocs + r]`. `cols`
/// is every activation column of the matmul: the float steps depend on it as llama.cpp's do
/// (see [`Order`]), and for Q4_K on whether llama.cpp repacks the weight (`repacked`). False when
/// the type or a length does not fit.
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
    let nb = n / QK_K;
    let bs = ty.type_size();
    if !supported(ty) || !n.is_multiple_of(QK_K) || !tile_fits(nb, bs, Q8K_BYTES, t, out) {
        return false;
    }
    let six = ty == DType::Q6_K;
    let five = ty == DType::Q5_K;
    let xs = ty == DType::IQ4_XS;
    // Q4_K as llama.cpp runs it without repacking: `vec_dot_q4_K_q8_K`, or tiled from 8 columns.
    let plain4 = ty == DType::Q4_K && !repacked;
    if cols <= 2 {
        let mut r = 0;
        if cols == 1 && ty == DType::Q4_K && !plain4 {
            while rows - r >= GEMV_ROWS {
                // SAFETY: AVX-512 VNNI detected (caller path); rows `r..r + 4` hold `nb` blocks
                // and the Q8_K row `nb` blocks (checked above).
                let v = unsafe { gemv_q4k(nb, w[r * wstride..].as_ptr(), wstride, a.as_ptr()) };
                for (dr, &x) in v.iter().enumerate() {
                    out[r + dr] = x;
                }
                r += GEMV_ROWS;
            }
        }
        while r < rows {
            let rn = if rows - r >= DIRECT_ROWS {
                DIRECT_ROWS
            } else {
                1
            };
            let wr = w[r * wstride..].as_ptr();
            let ap = a.as_ptr();
            macro_rules! go {
                ($r:literal, $c:literal) => {{
                    // SAFETY: AVX-512 VNNI detected (caller path); rows `r..r + $r` hold `nb`
                    // blocks and the `cols` Q8_K rows `nb` blocks each (checked above).
                    let v = unsafe {
                        if xs {
                            rows_direct::<$r, $c, false, { Order::XS_LANES }>(
                                ty, nb, wr, wstride, ap, astride,
                            )
                        } else if six {
                            rows_direct::<$r, $c, true, { Order::LANES }>(
                                ty, nb, wr, wstride, ap, astride,
                            )
                        } else if five {
                            rows_direct::<$r, $c, false, { Order::LANES }>(
                                ty, nb, wr, wstride, ap, astride,
                            )
                        } else if plain4 {
                            rows_direct::<$r, $c, false, { Order::LANES4 }>(
                                ty, nb, wr, wstride, ap, astride,
                            )
                        } else {
                            rows_direct::<$r, $c, false, { Order::GEMV }>(
                                ty, nb, wr, wstride, ap, astride,
                            )
                        }
                    };
                    scatter_rows(&v, out, ocs, r);
                }};
            }
            match (rn, cols) {
                (DIRECT_ROWS, 2) => go!(2, 2),
                (DIRECT_ROWS, _) => go!(2, 1),
                (_, 2) => go!(1, 2),
                _ => go!(1, 1),
            }
            r += rn;
        }
        return true;
    }
    // Q4_K: whole groups of four columns in the repacked gemm order, the rest as mat-vec; Q5_K
    // and Q6_K: the tiled order from 8 columns.
    let gemm_cols = if ty == DType::Q4_K && !plain4 {
        cols - cols % 4
    } else {
        0
    };
    let tiled = (ty != DType::Q4_K || plain4) && cols >= TILED_MIN_COLS;
    DECODED.with(|buf| {
        let mut buf = buf.borrow_mut();
        let drb = nb * W_SB;
        if buf.len() < TR * drb {
            buf.resize(TR * drb, 0);
        }
        // Repacked Q4_K and tiled Q6_K: whole groups of 16 rows interleaved, the rest below.
        let mut r0 = if (ty == DType::Q4_K && !plain4) || (six && tiled) {
            k_interleaved(ty, t, nb, gemm_cols, out)
        } else {
            0
        };
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
            let wp = buf.as_ptr();
            // Q4_K gemm columns (an even count), rows in pairs.
            let mut c0 = 0;
            while c0 < gemm_cols {
                let ap = a[c0 * astride..].as_ptr();
                let mut r = 0;
                while r < rn {
                    let two = rn - r >= GR;
                    // SAFETY: AVX-512 VNNI detected (caller path); decoded rows `r..r + GR`
                    // (or `r`) of `nb` super-blocks in the buffer, Q8_K rows `c0..c0 + GC` of
                    // `nb` (checked above; `gemm_cols` is a multiple of 4).
                    let res: [[f32; GC]; GR] = unsafe {
                        let wr = wp.add(r * drb);
                        if two {
                            tile_gemm22(nb, wr, drb, ap, astride)
                        } else {
                            let [one] = tile_gemm::<1, GC>(nb, wr, drb, ap, astride);
                            [one, [0.0; GC]]
                        }
                    };
                    for (dr, row) in res.iter().enumerate().take(if two { GR } else { 1 }) {
                        for (c, &v) in row.iter().enumerate() {
                            out[(c0 + c) * ocs + r0 + r + dr] = v;
                        }
                    }
                    r += if two { GR } else { 1 };
                }
                c0 += GC;
            }
            while c0 < cols {
                let cn = (cols - c0).min(TC);
                let ap = a[c0 * astride..].as_ptr();
                macro_rules! go {
                    ($r:literal, $c:literal) => {{
                        // SAFETY: AVX-512 VNNI detected (caller path); `$r` decoded rows of
                        // `nb` super-blocks in the buffer, `$c` Q8_K rows of `nb` (checked).
                        let res = unsafe {
                            match (six, tiled) {
                                (false, true) if xs => tile::<$r, $c, false, { Order::XS_TILED }>(
                                    nb, wp, drb, ap, astride,
                                ),
                                (false, false) if xs => tile::<$r, $c, false, { Order::XS_LANES }>(
                                    nb, wp, drb, ap, astride,
                                ),
                                (true, true) => {
                                    tile::<$r, $c, true, { Order::TILED }>(nb, wp, drb, ap, astride)
                                }
                                (true, false) => {
                                    tile::<$r, $c, true, { Order::LANES }>(nb, wp, drb, ap, astride)
                                }
                                (false, true) => tile::<$r, $c, false, { Order::TILED }>(
                                    nb, wp, drb, ap, astride,
                                ),
                                (false, false) if five => tile::<$r, $c, false, { Order::LANES }>(
                                    nb, wp, drb, ap, astride,
                                ),
                                (false, false) if plain4 => {
                                    tile::<$r, $c, false, { Order::LANES4 }>(
                                        nb, wp, drb, ap, astride,
                                    )
                                }
                                (false, false) => {
                                    tile::<$r, $c, false, { Order::GEMV }>(nb, wp, drb, ap, astride)
                                }
                            }
                        };
                        for (r, row) in res.iter().enumerate() {
                            for (c, &v) in row.iter().enumerate() {
                                out[(c0 + c) * ocs + r0 + r] = v;
                            }
                        }
                    }};
                }
                match (rn, cn) {
                    (4, 3) => go!(4, 3),
                    (4, 2) => go!(4, 2),
                    (4, 1) => go!(4, 1),
                    (3, 3) => go!(3, 3),
                    (3, 2) => go!(3, 2),
                    (3, 1) => go!(3, 1),
                    (2, 3) => go!(2, 3),
                    (2, 2) => go!(2, 2),
                    (2, 1) => go!(2, 1),
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

/// Quantizes `x` (whole 256-value blocks) to Q8_K in `out`: bit for bit the portable quantizer
/// (same max search, scale, rounding ties to even, group sums). False when a length does not
/// fit.
pub(crate) fn quantize_q8k(x: &[f32], out: &mut [u8]) -> bool {
    let nb = x.len() / QK_K;
    if !x.len().is_multiple_of(QK_K) || out.len() < nb * Q8K_BYTES {
        return false;
    }
    // SAFETY: Simd::Avx512 detection (the only caller path) reported AVX-512 F/BW/VL/VNNI and
    // AVX2/FMA/F16C; `x` holds `nb` blocks, `out` `nb` Q8_K blocks (checked).
    unsafe { quantize_q8k_rows(nb, x.as_ptr(), out.as_mut_ptr()) };
    true
}

/// # Safety
/// AVX-512 F/BW/VL/VNNI; `256 * nb` f32 readable at `x`, `nb * Q8K_BYTES` bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quantize_q8k_rows(nb: usize, x: *const f32, out: *mut u8) {
    for i in 0..nb {
        // SAFETY: block `i` is readable and its output writable (caller).
        unsafe {
            let xb = x.add(i * QK_K);
            let ob = out.add(i * Q8K_BYTES);
            let mut m = _mm512_setzero_ps();
            for g in 0..16 {
                m = _mm512_max_ps(m, _mm512_abs_ps(_mm512_loadu_ps(xb.add(16 * g))));
            }
            let amax = _mm512_reduce_max_ps(m);
            if amax == 0.0 {
                std::ptr::write_bytes(ob, 0, Q8K_BYTES);
                continue;
            }
            // The first value whose magnitude is the maximum (the portable search keeps the
            // first on ties).
            let mut max = amax;
            for g in 0..16 {
                let v = _mm512_loadu_ps(xb.add(16 * g));
                let hit = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(_mm512_abs_ps(v), _mm512_set1_ps(amax));
                if hit != 0 {
                    max = *xb.add(16 * g + hit.trailing_zeros() as usize);
                    break;
                }
            }
            let iscale = -127.0 / max;
            let sv = _mm512_set1_ps(iscale);
            let sums = ob.add(4 + QK_K) as *mut i16;
            for g in 0..16 {
                let v = _mm512_mul_ps(sv, _mm512_loadu_ps(xb.add(16 * g)));
                let q = _mm512_min_epi32(
                    _mm512_cvtps_epi32(super::tile::round_even(v)),
                    _mm512_set1_epi32(127),
                );
                _mm_storeu_si128(ob.add(4 + 16 * g) as *mut __m128i, _mm512_cvtepi32_epi8(q));
                *sums.add(g) = _mm512_reduce_add_epi32(q) as i16;
            }
            std::ptr::write_unaligned(ob as *mut f32, 1.0 / iscale);
        }
    }
}
