//! AVX-512 VNNI tiles in the float order of llama.cpp's repacked Q4_0, IQ4_NL and MXFP4 weights
//! (2-D, rows a multiple of 8: its `gemv/gemm_q4_0_8x8_q8_0` family on AVX2 and up).
//!
//! Those kernels sum each (row, column) result as one chain over the 32-value blocks: the block's
//! integer dot, exact, then `acc = fma(dot, dw * da, acc)`; no lanes, no horizontal sum. The same
//! order here, in the interleaved layout that makes it cheap: sixteen rows side by side, one i32
//! lane per row, so the eight `vpdpbusd` of a block (four values of every row each, against the
//! activation's matching four bytes broadcast) leave the sixteen rows' block dots in one vector,
//! and one convert, one multiply and one FMA advance sixteen results. Rows are interleaved as
//! their blocks are read (a 4 x 4 dword transpose per 128-bit lane of 16-byte nibble runs), once
//! per call for several columns, in registers for one or two.
//!
//! Weights are unsigned (value plus the offset of [`super::tile`]); the activation blocks are
//! the ones [`super::tile`] prepares, whose whole-block correction `-offset * sum(a)` starts
//! each dot.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::tile::A_BLK;
use crate::quant::blocks::QK;
use crate::quant::Tile;
use crate::tensor::DType;

/// Rows per group: one i32 lane each.
const G: usize = 16;
/// Bytes of one interleaved block of a row group: 8 x 64 bytes (dword `k` of every row's 32
/// unsigned values), 16 f32 scales.
const G_BLK: usize = 576;
/// Columns per register tile of the buffered (several-column) kernel.
const GC: usize = 6;

/// True for the types with a repacked order here.
pub(crate) fn supported(ty: DType) -> bool {
    matches!(ty, DType::Q4_0 | DType::IQ4_NL | DType::MXFP4)
}

/// Block `i` of the rows at `rows` (16 pointers; a partial group repeats a row), interleaved:
/// vector `k` holds values `4k..4k + 4` of every row (lane = row) as unsigned bytes, and the
/// rows' scales.
///
/// Always inlined into its AVX-512 callers (it returns vectors); no target features of its own,
/// which `inline(always)` requires.
///
/// # Safety
/// Only called from functions compiled with AVX-512 F/BW/VL/VNNI and F16C; block `i` of `ty`
/// readable at every `rows[r]`.
#[inline(always)]
unsafe fn group_block(ty: DType, rows: &[*const u8; G], i: usize) -> ([__m512i; 8], __m512) {
    // SAFETY: the caller runs with the features these intrinsics need; every read stays inside
    // block `i` of a row (caller).
    unsafe {
        let bs = ty.type_size();
        let qoff = if ty == DType::MXFP4 { 1 } else { 2 };
        let ld = |r: usize| _mm_loadu_si128(rows[r].add(i * bs + qoff) as *const __m128i);
        // a[q], 128-bit lane l: the 16 nibble bytes of row 4l + q.
        let mut a = [_mm512_setzero_si512(); 4];
        for (q, v) in a.iter_mut().enumerate() {
            let x = _mm512_castsi128_si512(ld(q));
            let x = _mm512_inserti32x4::<1>(x, ld(4 + q));
            let x = _mm512_inserti32x4::<2>(x, ld(8 + q));
            *v = _mm512_inserti32x4::<3>(x, ld(12 + q));
        }
        let (l01, h01) = (
            _mm512_unpacklo_epi32(a[0], a[1]),
            _mm512_unpackhi_epi32(a[0], a[1]),
        );
        let (l23, h23) = (
            _mm512_unpacklo_epi32(a[2], a[3]),
            _mm512_unpackhi_epi32(a[2], a[3]),
        );
        // Dword d of every row, lane 4l + q = row 4l + q.
        let d = [
            _mm512_unpacklo_epi64(l01, l23),
            _mm512_unpackhi_epi64(l01, l23),
            _mm512_unpacklo_epi64(h01, h23),
            _mm512_unpackhi_epi64(h01, h23),
        ];
        let m4 = _mm512_set1_epi8(0x0f);
        let table = match ty {
            DType::IQ4_NL => Some(&gguf::quants::iq_tables::IQ4NL_VALUES),
            DType::MXFP4 => Some(&gguf::quants::iq_tables::MXFP4_VALUES),
            _ => None,
        };
        let value = |idx: __m512i| match table {
            Some(t) => {
                let t = _mm512_broadcast_i32x4(_mm_loadu_si128(t.as_ptr() as *const __m128i));
                _mm512_xor_si512(_mm512_shuffle_epi8(t, idx), _mm512_set1_epi8(0x80_u8 as i8))
            }
            None => idx,
        };
        let mut w = [_mm512_setzero_si512(); 8];
        for k in 0..4 {
            // Byte j of a block's nibbles: value j (low), value j + 16 (high).
            w[k] = value(_mm512_and_si512(d[k], m4));
            w[k + 4] = value(_mm512_and_si512(_mm512_srli_epi16::<4>(d[k]), m4));
        }
        let dw = if ty == DType::MXFP4 {
            // `gguf::quants::e8m0_to_f32_half` on sixteen lanes: 2^(e - 128) as f32 bits.
            let e = |r: usize| *rows[r].add(i * bs) as i8;
            let e = _mm512_cvtepu8_epi32(_mm_setr_epi8(
                e(0),
                e(1),
                e(2),
                e(3),
                e(4),
                e(5),
                e(6),
                e(7),
                e(8),
                e(9),
                e(10),
                e(11),
                e(12),
                e(13),
                e(14),
                e(15),
            ));
            let small = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
            let normal = _mm512_slli_epi32::<23>(_mm512_sub_epi32(e, _mm512_set1_epi32(1)));
            let sub = _mm512_sllv_epi32(_mm512_set1_epi32(0x0020_0000), e);
            _mm512_castsi512_ps(_mm512_mask_blend_epi32(small, normal, sub))
        } else {
            let h = |r: usize| std::ptr::read_unaligned(rows[r].add(i * bs) as *const i16);
            _mm512_cvtph_ps(_mm256_setr_epi16(
                h(0),
                h(1),
                h(2),
                h(3),
                h(4),
                h(5),
                h(6),
                h(7),
                h(8),
                h(9),
                h(10),
                h(11),
                h(12),
                h(13),
                h(14),
                h(15),
            ))
        };
        (w, dw)
    }
}

/// One block's step for `C` prepared columns: the sixteen rows' exact dots, then
/// `acc = fma(dot, dw * da, acc)`.
///
/// # Safety
/// Only called from functions compiled with AVX-512 F/BW/VL/VNNI; block `i` of `C` prepared
/// activation rows readable at `a + c * astride`.
#[inline(always)]
unsafe fn step<const C: usize>(
    w: &[__m512i; 8],
    dw: __m512,
    a: *const u8,
    astride: usize,
    i: usize,
    acc: &mut [__m512; C],
) {
    // SAFETY: the caller runs with the features these intrinsics need; the reads stay inside
    // prepared block `i` of each column (caller).
    unsafe {
        for (c, acc) in acc.iter_mut().enumerate() {
            let ap = a.add(c * astride + i * A_BLK);
            let dword =
                |k: usize| _mm512_set1_epi32(std::ptr::read_unaligned(ap.add(4 * k) as *const i32));
            // Two chains (the integer sums are exact in any order).
            let mut s0 = _mm512_set1_epi32(std::ptr::read_unaligned(ap.add(72) as *const i32));
            let mut s1 = _mm512_setzero_si512();
            for k in (0..8).step_by(2) {
                s0 = _mm512_dpbusd_epi32(s0, w[k], dword(k));
                s1 = _mm512_dpbusd_epi32(s1, w[k + 1], dword(k + 1));
            }
            let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1));
            let da = _mm512_set1_ps(std::ptr::read_unaligned(ap.add(64) as *const f32));
            *acc = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, da), *acc);
        }
    }
}

/// The 16 row pointers of the group at row `r0` (`rn` rows, the last repeated to fill).
fn group_rows(w: &[u8], wstride: usize, r0: usize, rn: usize) -> [*const u8; G] {
    std::array::from_fn(|g| w[(r0 + g.min(rn - 1)) * wstride..].as_ptr())
}

/// Rows of a group read straight from their blocks for `C` (1 or 2) columns.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks of `ty` readable at every `rows[r]`, `C` prepared
/// rows of `nb` blocks at `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn direct<const C: usize>(
    ty: DType,
    nb: usize,
    rows: &[*const u8; G],
    wstride: usize,
    a: *const u8,
    astride: usize,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    // The next group's rows (contiguous after this group's), a few lines per block step: sixteen
    // row streams at once are more than the hardware prefetcher follows, one sequential run of
    // the next group is what it follows best.
    let next = rows[0].wrapping_add(G * wstride);
    let lines = (G * wstride).div_ceil(64 * nb.max(1));
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
        // SAFETY: forwarded from the caller.
        unsafe {
            let (w, dw) = group_block(ty, rows, i);
            step::<C>(&w, dw, a, astride, i, &mut acc);
        }
    }
    acc
}

/// Four Q4_0 rows' 16 nibble bytes of one block, row `o[l]` bytes after `b` in 128-bit lane `l`.
///
/// # Safety
/// Only called from functions compiled with AVX-512 F/BW/VL; 16 readable bytes at every
/// `b + o[l]`.
#[inline(always)]
unsafe fn lanes4(b: *const u8, o: [usize; 4]) -> __m512i {
    // SAFETY: the caller runs with AVX-512 F/BW/VL; the reads are in bounds (caller). Masked
    // loads (all lanes) rather than `_mm_loadu_si128` or `read_unaligned`, whose copies are
    // checked and spilled through the stack in builds with debug assertions (the `ci` profile).
    unsafe {
        let ld = |r: usize| _mm_maskz_loadu_epi8(!0, b.wrapping_add(o[r]) as *const i8);
        let x = _mm512_castsi128_si512(ld(0));
        let x = _mm512_inserti32x4::<1>(x, ld(1));
        let x = _mm512_inserti32x4::<2>(x, ld(2));
        _mm512_inserti32x4::<3>(x, ld(3))
    }
}

/// The four i32 lanes of each 128-bit lane of `s[k]` summed into lane `4l + k` (exact).
#[inline(always)]
fn sum_quads(s: [__m512i; 4]) -> __m512i {
    // SAFETY: only reached from functions compiled with AVX-512 F (callers' target features).
    unsafe {
        let t0 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(s[0], s[1]),
            _mm512_unpackhi_epi32(s[0], s[1]),
        );
        let t1 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(s[2], s[3]),
            _mm512_unpackhi_epi32(s[2], s[3]),
        );
        _mm512_add_epi32(_mm512_unpacklo_epi64(t0, t1), _mm512_unpackhi_epi64(t0, t1))
    }
}

/// [`direct`] for Q4_0 without interleaving: each row's block is dotted where it lies (four rows
/// per vector, one per 128-bit lane, against the activation's halves broadcast to every lane),
/// then the sixteen rows' partial sums are reduced together into one vector, lane = row, and the
/// scales come in one gather. The block dots are exact integers, so the results are [`direct`]'s
/// bit for bit, for fewer instructions per block than the transpose takes. Row `r` of the group
/// starts `offs[r]` bytes after `w` (a partial group repeats a row).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` Q4_0 blocks readable at every `w + offs[r]`, every
/// `offs[r] + 4 <= i32::MAX`, `C` prepared rows of `nb` blocks at `a + c * astride`; `next` is
/// only prefetched.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn direct_q4_0<const C: usize>(
    nb: usize,
    w: *const u8,
    offs: &[usize; G],
    next: *const u8,
    lines: usize,
    a: *const u8,
    astride: usize,
) -> [__m512; C] {
    const BS: usize = 18;
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); C];
    // Vector k: rows 4l + k, l = 0..4.
    let quad = |k: usize| [offs[k], offs[4 + k], offs[8 + k], offs[12 + k]];
    let o = [quad(0), quad(1), quad(2), quad(3)];
    let g = |r: usize| offs[r] as i32;
    let gidx = _mm512_setr_epi32(
        g(0),
        g(1),
        g(2),
        g(3),
        g(4),
        g(5),
        g(6),
        g(7),
        g(8),
        g(9),
        g(10),
        g(11),
        g(12),
        g(13),
        g(14),
        g(15),
    );
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
        let b = w.wrapping_add(i * BS);
        // SAFETY: block `i` of every row and of every prepared column is in bounds (caller).
        unsafe {
            let mut lo = [_mm512_setzero_si512(); 4];
            let mut hi = [_mm512_setzero_si512(); 4];
            for k in 0..4 {
                let x = lanes4(b.wrapping_add(2), o[k]);
                lo[k] = _mm512_and_si512(x, m4);
                hi[k] = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m4);
            }
            // The first four bytes of every row's block: its f16 scale in the low half.
            let d = _mm512_i32gather_epi32::<1>(gidx, b as *const i32);
            let dw = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d));
            for (c, acc) in acc.iter_mut().enumerate() {
                let ap = a.wrapping_add(c * astride + i * A_BLK);
                // Bytes 0..32: the values; 64: the f32 scale; 72: the i32 block correction.
                let av = _mm512_maskz_loadu_epi8(!0, ap as *const i8);
                let tail = _mm512_maskz_loadu_epi32(!0, ap.wrapping_add(64) as *const i32);
                let alo = _mm512_broadcast_i32x4(_mm512_castsi512_si128(av));
                let ahi = _mm512_shuffle_i32x4::<0b0101_0101>(av, av);
                let mut s = [_mm512_setzero_si512(); 4];
                for k in 0..4 {
                    s[k] = _mm512_dpbusd_epi32(
                        _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[k], alo),
                        hi[k],
                        ahi,
                    );
                }
                let corr = _mm512_permutexvar_epi32(_mm512_set1_epi32(2), tail);
                let dot = _mm512_cvtepi32_ps(_mm512_add_epi32(sum_quads(s), corr));
                let da = _mm512_permutexvar_ps(_mm512_setzero_si512(), _mm512_castsi512_ps(tail));
                *acc = _mm512_fmadd_ps(dot, _mm512_mul_ps(dw, da), *acc);
            }
        }
    }
    acc
}

/// Interleaves `nb` blocks of a group into `out` (`nb * G_BLK` bytes).
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI and F16C; `nb` blocks of `ty` readable at every `rows[r]`, `nb * G_BLK`
/// bytes writable at `out`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_group(ty: DType, nb: usize, rows: &[*const u8; G], out: *mut u8) {
    for i in 0..nb {
        // SAFETY: forwarded from the caller; block `i`'s bytes of `out` are in bounds.
        unsafe {
            let (w, dw) = group_block(ty, rows, i);
            let o = out.add(i * G_BLK);
            for (k, v) in w.iter().enumerate() {
                _mm512_storeu_si512(o.add(64 * k) as *mut _, *v);
            }
            _mm512_storeu_ps(o.add(512) as *mut f32, dw);
        }
    }
}

/// An interleaved group (`nb` blocks at `wg`) times `C` prepared columns.
///
/// # Safety
/// AVX-512 F/BW/VL/VNNI; `nb * G_BLK` bytes readable at `wg`, `C` prepared rows of `nb` blocks at
/// `a + c * astride`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn buffered<const C: usize>(
    nb: usize,
    wg: *const u8,
    a: *const u8,
    astride: usize,
) -> [__m512; C] {
    let mut acc = [_mm512_setzero_ps(); C];
    for i in 0..nb {
        // SAFETY: forwarded from the caller.
        unsafe {
            let o = wg.add(i * G_BLK);
            let w: [__m512i; 8] =
                std::array::from_fn(|k| _mm512_loadu_si512(o.add(64 * k) as *const _));
            let dw = _mm512_loadu_ps(o.add(512) as *const f32);
            step::<C>(&w, dw, a, astride, i, &mut acc);
        }
    }
    acc
}

thread_local! {
    /// The interleaved blocks of the current group (reused: no allocation per call).
    static GROUP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes lanes `0..rn` of each column's result vector to `out[(c0 + c) * ocs + r0 + lane]`.
fn scatter<const C: usize>(
    v: &[__m512; C],
    out: &mut [f32],
    ocs: usize,
    c0: usize,
    r0: usize,
    rn: usize,
) {
    for (c, v) in v.iter().enumerate() {
        let mut lanes = [0f32; G];
        // SAFETY: `lanes` holds 16 floats; AVX-512 F is present (the only caller path).
        unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *v) };
        out[(c0 + c) * ocs + r0..][..rn].copy_from_slice(&lanes[..rn]);
    }
}

/// [`super::tile::dot_tile`] in the repacked order for Q4_0, IQ4_NL and MXFP4 (the caller checked
/// the type, the lengths with `tile_fits`, and the activation layout).
pub(crate) fn dot_tile(ty: DType, t: &Tile<'_>, out: &mut [f32]) {
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
    let ap = a.as_ptr();
    if cols <= 2 {
        // The gather's i32 offsets reach row 15's first four bytes.
        let q4_0 = ty == DType::Q4_0 && (G - 1) * wstride + 4 <= i32::MAX as usize;
        for r0 in (0..rows).step_by(G) {
            let rn = (rows - r0).min(G);
            if q4_0 {
                let offs: [usize; G] = std::array::from_fn(|g| g.min(rn - 1) * wstride);
                let wr = w[r0 * wstride..].as_ptr();
                // The next group's rows (contiguous after this group's), as [`direct`] takes
                // them.
                let next = wr.wrapping_add(G * wstride);
                let lines = (G * wstride).div_ceil(64 * nb.max(1));
                // SAFETY: AVX-512 VNNI detected (caller path); rows `r0..r0 + rn` hold `nb`
                // blocks (checked by the caller), which `offs` stays inside, with the i32 bound
                // checked above; the `cols` prepared rows hold `nb` blocks each.
                unsafe {
                    if cols == 2 {
                        let v = direct_q4_0::<2>(nb, wr, &offs, next, lines, ap, astride);
                        scatter(&v, out, ocs, 0, r0, rn);
                    } else {
                        let v = direct_q4_0::<1>(nb, wr, &offs, next, lines, ap, astride);
                        scatter(&v, out, ocs, 0, r0, rn);
                    }
                }
                continue;
            }
            let gr = group_rows(w, wstride, r0, rn);
            // SAFETY: AVX-512 VNNI detected (caller path); every row holds `nb` blocks and the
            // `cols` prepared rows `nb` blocks each (checked by the caller).
            unsafe {
                if cols == 2 {
                    scatter(
                        &direct::<2>(ty, nb, &gr, wstride, ap, astride),
                        out,
                        ocs,
                        0,
                        r0,
                        rn,
                    );
                } else {
                    scatter(
                        &direct::<1>(ty, nb, &gr, wstride, ap, astride),
                        out,
                        ocs,
                        0,
                        r0,
                        rn,
                    );
                }
            }
        }
        return;
    }
    GROUP.with(|buf| {
        let mut buf = buf.borrow_mut();
        if buf.len() < nb * G_BLK {
            buf.resize(nb * G_BLK, 0);
        }
        for r0 in (0..rows).step_by(G) {
            let rn = (rows - r0).min(G);
            let gr = group_rows(w, wstride, r0, rn);
            // SAFETY: as above; the buffer holds `nb * G_BLK` bytes.
            unsafe { decode_group(ty, nb, &gr, buf.as_mut_ptr()) };
            let wg = buf.as_ptr();
            let mut c0 = 0;
            while c0 < cols {
                let cn = (cols - c0).min(GC);
                let ac = a[c0 * astride..].as_ptr();
                macro_rules! go {
                    ($c:literal) => {{
                        // SAFETY: as above; prepared rows `c0..c0 + $c` hold `nb` blocks.
                        let v = unsafe { buffered::<$c>(nb, wg, ac, astride) };
                        scatter(&v, out, ocs, c0, r0, rn);
                    }};
                }
                match cn {
                    6 => go!(6),
                    5 => go!(5),
                    4 => go!(4),
                    3 => go!(3),
                    2 => go!(2),
                    _ => go!(1),
                }
                c0 += cn;
            }
        }
    });
}
