//! Dequantization of the grid-based i-quants (IQ1..IQ4), the ternary TQ types and MXFP4, in
//! gguf-py's f32 operation order so results are bit-identical.

use super::blocks::*;
use super::iq1_grid::IQ1S_GRID;
use super::iq_tables::*;
use crate::types::QK_K;

/// ggml's `ksigns` table: seven sign bits, the eighth chosen to make the parity even.
const KSIGNS: [u8; 128] = {
    let mut t = [0u8; 128];
    let mut i = 0;
    while i < 128 {
        t[i] = (i as u8) | (((i as u32).count_ones() as u8 & 1) << 7);
        i += 1;
    }
    t
};

#[inline(always)]
fn sign(bits: u8, k: usize) -> f32 {
    if (bits >> k) & 1 == 0 {
        1.0
    } else {
        -1.0
    }
}

/// Writes 8 values `(db * grid[k]) * sign(k)`.
#[inline(always)]
fn grid8(out: &mut [f32], db: f32, row: u64, signs: u8) {
    let g = row.to_le_bytes();
    for k in 0..8 {
        out[k] = db * f32::from(g[k]) * sign(signs, k);
    }
}

/// Writes 4 values `(db * grid[k]) * sign(shift + k)`.
#[inline(always)]
fn grid4(out: &mut [f32], db: f32, row: u32, signs: u8, shift: usize) {
    let g = row.to_le_bytes();
    for k in 0..4 {
        out[k] = db * f32::from(g[k]) * sign(signs, shift + k);
    }
}

pub(crate) fn iq2_xxs(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ2XXS] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
            let aux0 = u32_at(&b.qs, 2 * ib).to_le_bytes();
            let aux1 = u32_at(&b.qs, 2 * ib + 1);
            let db = d * (0.5 + (aux1 >> 28) as f32) * 0.25;
            for (g, o) in sub.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS[((aux1 >> (7 * g)) & 0x7F) as usize];
                grid8(o, db, IQ2XXS_GRID[aux0[g] as usize], signs);
            }
        }
    }
}

pub(crate) fn iq2_xs(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ2XS] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (g, o) in out.chunks_exact_mut(8).enumerate() {
            let q = u16_at(&b.qs, g);
            let ls = (b.scales[g / 4] >> (4 * ((g / 2) % 2))) & 0x0F;
            let db = d * (0.5 + f32::from(ls)) * 0.25;
            grid8(
                o,
                db,
                IQ2XS_GRID[(q & 511) as usize],
                KSIGNS[(q >> 9) as usize],
            );
        }
    }
}

pub(crate) fn iq2_s(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ2S] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (g, o) in out.chunks_exact_mut(8).enumerate() {
            let ls = (b.scales[g / 4] >> (4 * ((g / 2) % 2))) & 0x0F;
            let db = d * (0.5 + f32::from(ls)) * 0.25;
            let idx = usize::from(b.qs[g]) | (usize::from((b.qh[g / 4] >> (2 * (g % 4))) & 3) << 8);
            grid8(o, db, IQ2S_GRID[idx], b.qs[32 + g]);
        }
    }
}

pub(crate) fn iq3_xxs(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ3XXS] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
            let aux = u32_at(&b.qs[64..], ib);
            let db = d * (0.5 + (aux >> 28) as f32) * 0.5;
            for (g, o) in sub.chunks_exact_mut(8).enumerate() {
                let signs = KSIGNS[((aux >> (7 * g)) & 0x7F) as usize];
                let i0 = b.qs[8 * ib + 2 * g] as usize;
                let i1 = b.qs[8 * ib + 2 * g + 1] as usize;
                grid4(&mut o[..4], db, IQ3XXS_GRID[i0], signs, 0);
                grid4(&mut o[4..], db, IQ3XXS_GRID[i1], signs, 4);
            }
        }
    }
}

pub(crate) fn iq3_s(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ3S] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
            let sc = (b.scales[ib / 2] >> (4 * (ib % 2))) & 0x0F;
            let db = d * f32::from(1 + 2 * sc);
            for (g, o) in sub.chunks_exact_mut(8).enumerate() {
                let signs = b.signs[4 * ib + g];
                for half in 0..2 {
                    let i = 8 * ib + 2 * g + half;
                    let idx =
                        usize::from(b.qs[i]) | (usize::from((b.qh[i / 8] >> (i % 8)) & 1) << 8);
                    grid4(
                        &mut o[4 * half..4 * half + 4],
                        db,
                        IQ3S_GRID[idx],
                        signs,
                        4 * half,
                    );
                }
            }
        }
    }
}

#[inline(always)]
fn iq1_group(out: &mut [f32], dl: f32, idx: usize, delta: f32) {
    let g = IQ1S_GRID[idx].to_le_bytes();
    for k in 0..8 {
        out[k] = dl * (f32::from(g[k] as i8) + delta);
    }
}

pub(crate) fn iq1_s(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ1S] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
            let qh = u16_at(&b.qh, ib);
            let dl = d * f32::from(2 * ((qh >> 12) & 7) + 1);
            let delta = if qh & 0x8000 == 0 {
                IQ1_DELTA
            } else {
                -IQ1_DELTA
            };
            for (g, o) in sub.chunks_exact_mut(8).enumerate() {
                let idx = usize::from(b.qs[4 * ib + g]) | (usize::from((qh >> (3 * g)) & 7) << 8);
                iq1_group(o, dl, idx, delta);
            }
        }
    }
}

pub(crate) fn iq1_m(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ1M] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let sc = [0, 1, 2, 3].map(|i| u16_at(&b.scales, i));
        let d_bits =
            (sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000);
        let d = f16_bits_to_f32(d_bits);
        for (g, o) in out.chunks_exact_mut(8).enumerate() {
            // One 3-bit scale per 16 values; four per u16.
            let s = g / 2;
            let ls = (sc[s / 4] >> (3 * (s % 4))) & 7;
            let dl = d * f32::from(2 * ls + 1);
            let nib = (b.qh[g / 2] >> (4 * (g % 2))) & 0x0F;
            let idx = usize::from(b.qs[g]) | (usize::from(nib & 7) << 8);
            let delta = if nib & 8 == 0 { IQ1_DELTA } else { -IQ1_DELTA };
            iq1_group(o, dl, idx, delta);
        }
    }
}

pub(crate) fn iq4_nl(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ4NL] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(b.d);
        for j in 0..16 {
            out[j] = d * f32::from(IQ4NL_VALUES[usize::from(b.qs[j] & 0x0F)]);
            out[j + 16] = d * f32::from(IQ4NL_VALUES[usize::from(b.qs[j] >> 4)]);
        }
    }
}

pub(crate) fn iq4_xs(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockIQ4XS] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let sh = u16::from_le_bytes(b.scales_h);
        for (ib, sub) in out.chunks_exact_mut(32).enumerate() {
            let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F;
            let hi = ((sh >> (2 * ib)) & 3) as u8;
            let dl = d * f32::from((lo | (hi << 4)) as i8 - 32);
            let qs = &b.qs[16 * ib..16 * ib + 16];
            for j in 0..16 {
                sub[j] = dl * f32::from(IQ4NL_VALUES[usize::from(qs[j] & 0x0F)]);
                sub[j + 16] = dl * f32::from(IQ4NL_VALUES[usize::from(qs[j] >> 4)]);
            }
        }
    }
}

/// Decodes one base-3 fixed-point trit: byte * 3^k (mod 256), then the top bits of x3.
#[inline(always)]
fn trit(byte: u8, pow3: u8) -> i8 {
    let v = byte.wrapping_mul(pow3);
    ((u16::from(v) * 3) >> 8) as i8 - 1
}

pub(crate) fn tq1_0(src: &[u8], dst: &mut [f32]) {
    const POW3: [u8; 5] = [1, 3, 9, 27, 81];
    let blocks: &[BlockTQ1_0] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        // Values 0..160: five trits from each of qs[0..32]; 160..240: from qs[32..48];
        // 240..256: four trits from each of qh.
        for k in 0..5 {
            for l in 0..32 {
                out[32 * k + l] = d * f32::from(trit(b.qs[l], POW3[k]));
            }
            for l in 0..16 {
                out[160 + 16 * k + l] = d * f32::from(trit(b.qs[32 + l], POW3[k]));
            }
        }
        for k in 0..4 {
            for l in 0..4 {
                out[240 + 4 * k + l] = d * f32::from(trit(b.qh[l], POW3[k]));
            }
        }
    }
}

pub(crate) fn tq2_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockTQ2_0] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        // Value 128h + 32s + l sits at shift 2s of qs[32h + l].
        for h in 0..2 {
            for s in 0..4 {
                let q = &b.qs[32 * h..32 * h + 32];
                let o = &mut out[128 * h + 32 * s..128 * h + 32 * s + 32];
                for (o, &q) in o.iter_mut().zip(q) {
                    *o = d * f32::from(((q >> (2 * s)) & 3) as i8 - 1);
                }
            }
        }
    }
}

/// ggml's E8M0 exponent to f32, halved (MXFP4 values are stored doubled).
#[inline(always)]
pub fn e8m0_to_f32_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

pub(crate) fn mxfp4(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockMXFP4] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_to_f32_half(b.e);
        for j in 0..16 {
            out[j] = d * f32::from(MXFP4_VALUES[usize::from(b.qs[j] & 0x0F)]);
            out[j + 16] = d * f32::from(MXFP4_VALUES[usize::from(b.qs[j] >> 4)]);
        }
    }
}

/// ggml's unsigned E4M3 scale (bias 7, no infinities; 0x7F, its NaN, reads as 0) to f32, halved
/// like [`e8m0_to_f32_half`] because the E2M1 values are stored doubled.
#[inline(always)]
pub fn ue4m3_to_f32_half(x: u8) -> f32 {
    if x == 0 || x == 0x7F {
        return 0.0;
    }
    let (exp, man) = (i32::from((x >> 3) & 0x0F), f32::from(x & 0x07));
    // Every value here is exact in f32, so the order of the operations cannot change the bits.
    let raw = if exp == 0 {
        man * (1.0 / 512.0)
    } else {
        (1.0 + man / 8.0) * f32::from_bits(((exp - 7 + 127) as u32) << 23)
    };
    raw * 0.5
}

pub(crate) fn nvfp4(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockNVFP4] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(64)) {
        for (s, (o, qs)) in out
            .chunks_exact_mut(16)
            .zip(b.qs.chunks_exact(8))
            .enumerate()
        {
            let d = ue4m3_to_f32_half(b.d[s]);
            for (j, &q) in qs.iter().enumerate() {
                o[j] = d * f32::from(MXFP4_VALUES[usize::from(q & 0x0F)]);
                o[j + 8] = d * f32::from(MXFP4_VALUES[usize::from(q >> 4)]);
            }
        }
    }
}
