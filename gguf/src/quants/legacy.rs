//! Dequantization of the plain scalar types, ggml's original 32-value block types (Q4_0, Q4_1,
//! Q5_0, Q5_1, Q8_0, Q8_1) and its 1- and 2-bit single-scale types (Q1_0, Q2_0).
//!
//! Every formula evaluates in the same f32 operation order as gguf-py's numpy code, which makes
//! the results bit-identical (Rust never contracts `a * b + c` into an FMA).

use std::sync::OnceLock;

use super::blocks::*;

/// Converts little-endian scalars to f32. When the bytes happen to be aligned for `T` (tensor
/// data in a mapped file is) and the host is little-endian, it reads them as `&[T]` in one
/// straight loop the compiler vectorizes; otherwise it decodes byte by byte.
macro_rules! scalar_kernel {
    ($name:ident, $t:ty, $conv:expr) => {
        pub(crate) fn $name(src: &[u8], dst: &mut [f32]) {
            const W: usize = std::mem::size_of::<$t>();
            let conv: fn($t) -> f32 = $conv;
            #[cfg(target_endian = "little")]
            if let Ok(vals) = bytemuck::try_cast_slice::<u8, $t>(src) {
                for (d, &v) in dst.iter_mut().zip(vals) {
                    *d = conv(v);
                }
                return;
            }
            for (d, s) in dst.iter_mut().zip(src.chunks_exact(W)) {
                let mut a = [0u8; W];
                a.copy_from_slice(s);
                *d = conv(<$t>::from_le_bytes(a));
            }
        }
    };
}

scalar_kernel!(f32_, f32, |v| v);
scalar_kernel!(f64_, f64, |v| v as f32);
scalar_kernel!(i16_, i16, f32::from);
scalar_kernel!(i32_, i32, |v| v as f32);
scalar_kernel!(i64_, i64, |v| v as f32);

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

pub(crate) fn i8_(src: &[u8], dst: &mut [f32]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d = f32::from(s as i8);
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

pub(crate) fn q1_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ1_0] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(128)) {
        let d = f16_le(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            *o = if (b.qs[j / 8] >> (j % 8)) & 1 == 1 {
                d
            } else {
                -d
            };
        }
    }
}

pub(crate) fn q2_0(src: &[u8], dst: &mut [f32]) {
    let blocks: &[BlockQ2_0] = bytemuck::cast_slice(src);
    for (b, out) in blocks.iter().zip(dst.chunks_exact_mut(64)) {
        let d = f16_le(b.d);
        for (j, o) in out.iter_mut().enumerate() {
            let q = (b.qs[j / 4] >> (2 * (j % 4))) & 3;
            *o = (f32::from(q) - 1.0) * d;
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
