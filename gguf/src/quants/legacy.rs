//! Dequantization of the plain scalar types and ggml's original 32-value block types
//! (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1).
//!
//! Every formula evaluates in the same f32 operation order as gguf-py's numpy code, which makes
//! the results bit-identical (Rust never contracts `a * b + c` into an FMA).

use std::sync::OnceLock;

use super::blocks::*;

pub(crate) fn f32_(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
    }
}

/// All 65536 half values as f32: one load per element beats a software conversion, and the
/// table is built with the exact, NaN-preserving [`f16_bits_to_f32`].
fn f16_table() -> &'static [f32; 65536] {
    static TABLE: OnceLock<Box<[f32; 65536]>> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = Box::new([0f32; 65536]);
        for (i, v) in t.iter_mut().enumerate() {
            *v = f16_bits_to_f32(i as u16);
        }
        t
    })
}

pub(crate) fn f16_(src: &[u8], dst: &mut [f32]) {
    let table = f16_table();
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = table[usize::from(u16::from_le_bytes([s[0], s[1]]))];
    }
}

pub(crate) fn bf16_(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        // A shift, not a conversion: NaN payloads stay as they are.
        *d = f32::from_bits(u32::from(u16::from_le_bytes([s[0], s[1]])) << 16);
    }
}

pub(crate) fn f64_(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(8)) {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        *d = f64::from_le_bytes(a) as f32;
    }
}

pub(crate) fn i8_(src: &[u8], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from(s as i8);
    }
}

pub(crate) fn i16_(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *d = f32::from(i16::from_le_bytes([s[0], s[1]]));
    }
}

pub(crate) fn i32_(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *d = i32::from_le_bytes([s[0], s[1], s[2], s[3]]) as f32;
    }
}

pub(crate) fn i64_(src: &[u8], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src.chunks_exact(8)) {
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        *d = i64::from_le_bytes(a) as f32;
    }
}

pub(crate) fn q4_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4_0] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(b.d);
        for j in 0..16 {
            out[j] = d * f32::from((b.qs[j] & 0x0F) as i8 - 8);
            out[j + 16] = d * f32::from((b.qs[j] >> 4) as i8 - 8);
        }
    }
}

pub(crate) fn q4_1(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ4_1] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(b.d);
        let m = f16_le(b.m);
        for j in 0..16 {
            out[j] = d * f32::from(b.qs[j] & 0x0F) + m;
            out[j + 16] = d * f32::from(b.qs[j] >> 4) + m;
        }
    }
}

pub(crate) fn q5_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5_0] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(b.d);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..16 {
            let lo = (b.qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
            let hi = (b.qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            out[j] = d * f32::from(lo as i8 - 16);
            out[j + 16] = d * f32::from(hi as i8 - 16);
        }
    }
}

pub(crate) fn q5_1(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ5_1] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(b.d);
        let m = f16_le(b.m);
        let qh = u32::from_le_bytes(b.qh);
        for j in 0..16 {
            let lo = (b.qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
            let hi = (b.qs[j] >> 4) | ((((qh >> (j + 16)) & 1) as u8) << 4);
            out[j] = d * f32::from(lo) + m;
            out[j + 16] = d * f32::from(hi) + m;
        }
    }
}

pub(crate) fn q8_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ8_0] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    }
}

pub(crate) fn q8_1(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ8_1] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(32)) {
        let d = f16_le(b.d);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    }
}
