//! Quantization of f32 data into the 32-value block types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! MXFP4), byte-identical to gguf-py (and ggml's reference quantizers it mirrors).

use super::blocks::*;

/// The value with the largest magnitude, first one on ties (sign kept).
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0f32;
    let mut max = 0f32;
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::MAX;
    let mut max = -f32::MAX;
    for &v in x {
        min = min.min(v);
        max = max.max(v);
    }
    (min, max)
}

fn inv(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// `trunc(v)` as a code in `0..=max` (NaN maps to 0, as a saturating cast does).
fn code(v: f32, max: u8) -> u8 {
    (v.trunc() as u8).min(max)
}

pub(crate) fn q4_0(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ4_0] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let d = signed_absmax(x) / -8.0;
        let id = inv(d);
        b.d = f16_bytes(d);
        for j in 0..16 {
            let lo = code(x[j] * id + 8.5, 15);
            let hi = code(x[j + 16] * id + 8.5, 15);
            b.qs[j] = lo | (hi << 4);
        }
    }
}

pub(crate) fn q4_1(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ4_1] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inv(d);
        b.d = f16_bytes(d);
        b.m = f16_bytes(min);
        for j in 0..16 {
            let lo = code((x[j] - min) * id + 0.5, 15);
            let hi = code((x[j + 16] - min) * id + 0.5, 15);
            b.qs[j] = lo | (hi << 4);
        }
    }
}

fn pack5(q: &[u8; 32], qs: &mut [u8; 16]) -> [u8; 4] {
    let mut qh = 0u32;
    for j in 0..16 {
        qs[j] = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
    }
    for (j, &v) in q.iter().enumerate() {
        qh |= u32::from((v >> 4) & 1) << j;
    }
    qh.to_le_bytes()
}

pub(crate) fn q5_0(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ5_0] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let d = signed_absmax(x) / -16.0;
        let id = inv(d);
        b.d = f16_bytes(d);
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = code(v * id + 16.5, 31);
        }
        b.qh = pack5(&q, &mut b.qs);
    }
}

pub(crate) fn q5_1(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ5_1] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inv(d);
        b.d = f16_bytes(d);
        b.m = f16_bytes(min);
        let mut q = [0u8; 32];
        for (q, &v) in q.iter_mut().zip(x) {
            *q = code((v - min) * id + 0.5, 31);
        }
        b.qh = pack5(&q, &mut b.qs);
    }
}

pub(crate) fn q8_0(x: &[f32], out: &mut [u8]) {
    let blocks: &mut [BlockQ8_0] = bytemuck::cast_slice_mut(out);
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = inv(d);
        b.d = f16_bytes(d);
        for (q, &v) in b.qs.iter_mut().zip(x) {
            // f32::round rounds half away from zero, like C's roundf.
            *q = (v * id).round() as i8;
        }
    }
}

/// MXFP4 as ggml's `quantize_row_mxfp4_ref`: the block exponent is `floor(log2(amax)) - 2`
/// (so the largest E2M1 value, 6, covers the block's largest magnitude), each value the nearest
/// of the 16 E2M1 values, the first on ties.
pub(crate) fn mxfp4(x: &[f32], out: &mut [u8]) {
    use super::iq::e8m0_to_f32_half;
    use super::iq_tables::MXFP4_VALUES;
    let blocks: &mut [BlockMXFP4] = bytemuck::cast_slice_mut(out);
    let nearest = |v: f32, d: f32| {
        let mut best = 0usize;
        let mut best_err = (f32::from(MXFP4_VALUES[0]) * d - v).abs();
        for (i, &q) in MXFP4_VALUES.iter().enumerate().skip(1) {
            let err = (f32::from(q) * d - v).abs();
            if err < best_err {
                best = i;
                best_err = err;
            }
        }
        best as u8
    };
    for (b, x) in blocks.iter_mut().zip(x.chunks_exact(32)) {
        let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
        // C's `(uint8_t)(float)` of the exponent: in range for every finite non-zero amax.
        b.e = if amax > 0.0 {
            (amax.log2().floor() - 2.0 + 127.0) as u8
        } else {
            0
        };
        let d = e8m0_to_f32_half(b.e);
        for j in 0..16 {
            b.qs[j] = nearest(x[j], d) | nearest(x[j + 16], d) << 4;
        }
    }
}
