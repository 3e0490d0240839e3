//! Dequantization of the K-quant super-block types (Q2_K..Q8_K), in gguf-py's f32 operation
//! order so results are bit-identical.

use super::blocks::*;
use crate::types::QK_K;

pub(crate) fn q2_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ2K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let dmin = f16_le(b.dmin);
        // Value index = 128 * half + 32 * shift + l; its 2 bits sit at `shift` in qs[32*half + l].
        for (i, o) in out.iter_mut().enumerate() {
            let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
            let q = (b.qs[32 * h + l] >> (2 * s)) & 3;
            let sc = b.scales[i / 16];
            let dl = d * f32::from(sc & 0x0F);
            let ml = dmin * f32::from(sc >> 4);
            *o = dl * f32::from(q) - ml;
        }
    }
}

pub(crate) fn q3_k(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ3K] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(QK_K)) {
        let d = f16_le(b.d);
        let scales = q3k_scales(&b.scales);
        let mut dl = [0f32; 16];
        for (x, &s) in dl.iter_mut().zip(&scales) {
            *x = d * f32::from(s as i8 - 32);
        }
        for (i, o) in out.iter_mut().enumerate() {
            let (h, s, l) = (i / 128, (i / 32) % 4, i % 32);
            let low = ((b.qs[32 * h + l] >> (2 * s)) & 3) as i8;
            // The hmask bit for value i is bit i/32 of hmask[i % 32]; a clear bit means -4.
            let high = (b.hmask[l] >> (i / 32)) & 1;
            let q = low - (((high ^ 1) << 2) as i8);
            *o = dl[i / 16] * f32::from(q);
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
        let mut dl = [0f32; 16];
        for (x, &s) in dl.iter_mut().zip(&b.scales) {
            *x = d * f32::from(s);
        }
        for (i, o) in out.iter_mut().enumerate() {
            // Low nibble: half h = i/128, nibble shift by (i/64)%2, byte ql[64h + i%64].
            let h = i / 128;
            let lo = (b.ql[64 * h + i % 64] >> (4 * ((i / 64) % 2))) & 0x0F;
            let hi = (b.qh[32 * h + i % 32] >> (2 * ((i / 32) % 4))) & 3;
            let q = (lo | (hi << 4)) as i8 - 32;
            *o = dl[i / 16] * f32::from(q);
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
