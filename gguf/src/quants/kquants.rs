//! Dequantization of the K-quant super-block types (Q2_K..Q8_K), in gguf-py's f32 operation
//! order so results are bit-identical.

use super::blocks::*;
use crate::types::QK_K;

pub(crate) fn q2_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ2K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let dmin = f16_le(b.dmin);
        // Value 128h + 32s + 16g + l holds its 2 bits at shift 2s of qs[32h + 16g + l];
        // sub-block (16 values) 8h + 2s + g.
        for h in 0..2 {
            for s in 0..4 {
                for g in 0..2 {
                    let sc = b.scales[8 * h + 2 * s + g];
                    let dl = d * f32::from(sc & 0x0F);
                    let ml = dmin * f32::from(sc >> 4);
                    let q = &b.qs[32 * h + 16 * g..32 * h + 16 * g + 16];
                    let o = &mut out[128 * h + 32 * s + 16 * g..128 * h + 32 * s + 16 * g + 16];
                    for (o, &q) in o.iter_mut().zip(q) {
                        *o = dl * f32::from((q >> (2 * s)) & 3) - ml;
                    }
                }
            }
        }
    }
}

pub(crate) fn q3_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ3K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let scales = q3k_scales(&b.scales);
        // Layout as Q2_K for the low bits; the high bit of value i is bit i/32 of
        // hmask[i % 32], and a clear bit means -4.
        for h in 0..2 {
            for s in 0..4 {
                let bit = 4 * h + s;
                for g in 0..2 {
                    let dl = d * f32::from(scales[8 * h + 2 * s + g] as i8 - 32);
                    let base = 128 * h + 32 * s + 16 * g;
                    for l in 0..16 {
                        let low = ((b.qs[32 * h + 16 * g + l] >> (2 * s)) & 3) as i8;
                        let high = (b.hmask[16 * g + l] >> bit) & 1;
                        let q = low - (((high ^ 1) << 2) as i8);
                        out[base + l] = dl * f32::from(q);
                    }
                }
            }
        }
    }
}

pub(crate) fn q4_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let dmin = f16_le(b.dmin);
        for (j, sub) in out.chunks_exact_mut(32).enumerate() {
            let (sc, m) = k4_scale_min(j, &b.scales);
            let dl = d * f32::from(sc);
            let ml = dmin * f32::from(m);
            let qs = &b.qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            for (o, &q) in sub.iter_mut().zip(qs) {
                *o = dl * f32::from((q >> shift) & 0x0F) - ml;
            }
        }
    }
}

pub(crate) fn q5_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let dmin = f16_le(b.dmin);
        for (j, sub) in out.chunks_exact_mut(32).enumerate() {
            let (sc, m) = k4_scale_min(j, &b.scales);
            let dl = d * f32::from(sc);
            let ml = dmin * f32::from(m);
            let qs = &b.qs[32 * (j / 2)..32 * (j / 2) + 32];
            let shift = 4 * (j % 2);
            for (l, o) in sub.iter_mut().enumerate() {
                let q = ((qs[l] >> shift) & 0x0F) | (((b.qh[l] >> j) & 1) << 4);
                *o = dl * f32::from(q) - ml;
            }
        }
    }
}

pub(crate) fn q6_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ6K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        // Value 128h + 32k + l: low nibble at shift 4(k/2) of ql[64h + 32(k%2) + l], high 2
        // bits at shift 2k of qh[32h + l]; scale index 8h + 2k + l/16.
        for h in 0..2 {
            for k in 0..4 {
                for g in 0..2 {
                    let dl = d * f32::from(b.scales[8 * h + 2 * k + g]);
                    let base = 128 * h + 32 * k + 16 * g;
                    for l in 16 * g..16 * g + 16 {
                        let lo = (b.ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0F;
                        let hi = (b.qh[32 * h + l] >> (2 * k)) & 3;
                        let q = (lo | (hi << 4)) as i8 - 32;
                        out[base + l - 16 * g] = dl * f32::from(q);
                    }
                }
            }
        }
    }
}

pub(crate) fn q8_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ8K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = b.scale();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = d * f32::from(q);
        }
    }
}
