//! Bit-exact decoding of ggml's quantized blocks into small integers plus scales, the common form
//! used by the scalar dot products and by dequantization.
//!
//! 32-value types decode to `q[32]` with `x = d * q + m`. K-quants decode to `q[256]` with a scale
//! and a min per group of 16 values: `x = d * sc[g] * q - dmin * mn[g]`. Layouts follow ggml's
//! `block_*` structs (checked against the `gguf` Python package in the tests).

use crate::tensor::DType;

/// Values per K-quant super-block.
pub const QK_K: usize = 256;
/// Values per small block.
pub const QK: usize = 32;

#[inline]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

#[inline]
pub(crate) fn put_f16(b: &mut [u8], i: usize, v: f32) {
    b[i..i + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
}

/// A decoded 32-value block: `x = d * q + m`.
#[derive(Clone, Copy, Debug)]
pub struct Small {
    /// Integer values.
    pub q: [i8; QK],
    /// Scale.
    pub d: f32,
    /// Offset (0 for symmetric types).
    pub m: f32,
}

/// A decoded K-quant super-block: `x = d * sc[g] * q - dmin * mn[g]`, `g = index / 16`.
#[derive(Clone, Copy, Debug)]
pub struct Super {
    /// Integer values.
    pub q: [i8; QK_K],
    /// Per-16 group integer scales.
    pub sc: [i16; 16],
    /// Per-16 group integer mins.
    pub mn: [i16; 16],
    /// Super-block scale.
    pub d: f32,
    /// Super-block min scale.
    pub dmin: f32,
}

/// Decodes one 32-value block of `ty` (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0).
pub fn decode_small(ty: DType, b: &[u8]) -> Small {
    let mut q = [0i8; QK];
    let (d, m) = match ty {
        DType::Q4_0 | DType::Q4_1 => {
            let (m, qs, off) = if ty == DType::Q4_1 {
                (f16_at(b, 2), &b[4..20], 0)
            } else {
                (0.0, &b[2..18], 8)
            };
            for j in 0..16 {
                q[j] = (qs[j] & 0x0f) as i8 - off;
                q[j + 16] = (qs[j] >> 4) as i8 - off;
            }
            (f16_at(b, 0), m)
        }
        DType::Q5_0 | DType::Q5_1 => {
            let (m, hb, off) = if ty == DType::Q5_1 {
                (f16_at(b, 2), 4, 0)
            } else {
                (0.0, 2, 16)
            };
            let qh = u32::from_le_bytes([b[hb], b[hb + 1], b[hb + 2], b[hb + 3]]);
            let qs = &b[hb + 4..hb + 20];
            for j in 0..16 {
                let h0 = (((qh >> j) << 4) & 0x10) as u8;
                let h1 = ((qh >> (j + 12)) & 0x10) as u8;
                q[j] = ((qs[j] & 0x0f) | h0) as i8 - off;
                q[j + 16] = ((qs[j] >> 4) | h1) as i8 - off;
            }
            (f16_at(b, 0), m)
        }
        _ => {
            // Q8_0 (and the Q8_1 activation layout, whose payload starts 2 bytes later).
            let start = if ty == DType::Q8_1 { 4 } else { 2 };
            for j in 0..QK {
                q[j] = b[start + j] as i8;
            }
            (f16_at(b, 0), 0.0)
        }
    };
    Small { q, d, m }
}

/// The 6-bit scale and min `j` (0..8) of a Q4_K/Q5_K scale array.
#[inline]
pub(crate) fn scale_min_k4(j: usize, s: &[u8]) -> (u8, u8) {
    if j < 4 {
        (s[j] & 63, s[j + 4] & 63)
    } else {
        (
            (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4),
            (s[j + 4] >> 4) | ((s[j] >> 6) << 4),
        )
    }
}

/// The sixteen signed 6-bit scales of a Q3_K block (stored biased by 32).
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (a0, a1, tmp) = (w(0), w(1), w(2));
    const K1: u32 = 0x0303_0303;
    const K2: u32 = 0x0f0f_0f0f;
    let aux = [
        (a0 & K2) | ((tmp & K1) << 4),
        (a1 & K2) | (((tmp >> 2) & K1) << 4),
        ((a0 >> 4) & K2) | (((tmp >> 4) & K1) << 4),
        ((a1 >> 4) & K2) | (((tmp >> 6) & K1) << 4),
    ];
    let mut out = [0i8; 16];
    for (i, a) in aux.iter().enumerate() {
        for (k, byte) in a.to_le_bytes().iter().enumerate() {
            out[4 * i + k] = *byte as i8 - 32;
        }
    }
    out
}

/// Decodes one K-quant super-block of `ty` (Q2_K..Q6_K).
pub fn decode_super(ty: DType, b: &[u8]) -> Super {
    let mut s = Super {
        q: [0; QK_K],
        sc: [0; 16],
        mn: [0; 16],
        d: 0.0,
        dmin: 0.0,
    };
    match ty {
        DType::Q2_K => {
            let (scales, qs) = (&b[0..16], &b[16..80]);
            s.d = f16_at(b, 80);
            s.dmin = f16_at(b, 82);
            for g in 0..16 {
                s.sc[g] = (scales[g] & 0x0f) as i16;
                s.mn[g] = (scales[g] >> 4) as i16;
            }
            for n in 0..2 {
                for j in 0..4 {
                    for l in 0..32 {
                        s.q[128 * n + 32 * j + l] = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
                    }
                }
            }
        }
        DType::Q3_K => {
            let (hm, qs) = (&b[0..32], &b[32..96]);
            s.d = f16_at(b, 108);
            let sc = q3k_scales(&b[96..108]);
            for g in 0..16 {
                s.sc[g] = sc[g] as i16;
            }
            for n in 0..2 {
                for j in 0..4 {
                    let bit = 1u8 << (4 * n + j);
                    for l in 0..32 {
                        let lo = ((qs[32 * n + l] >> (2 * j)) & 3) as i8;
                        s.q[128 * n + 32 * j + l] = lo - if hm[l] & bit != 0 { 0 } else { 4 };
                    }
                }
            }
        }
        DType::Q4_K | DType::Q5_K => {
            s.d = f16_at(b, 0);
            s.dmin = f16_at(b, 2);
            let scales = &b[4..16];
            let (qh, qs) = if ty == DType::Q5_K {
                (Some(&b[16..48]), &b[48..176])
            } else {
                (None, &b[16..144])
            };
            for sub in 0..8 {
                let (sc, mn) = scale_min_k4(sub, scales);
                for g in [2 * sub, 2 * sub + 1] {
                    s.sc[g] = sc as i16;
                    s.mn[g] = mn as i16;
                }
            }
            for c in 0..4 {
                for l in 0..32 {
                    let byte = qs[32 * c + l];
                    let (mut lo, mut hi) = (byte & 0x0f, byte >> 4);
                    if let Some(qh) = qh {
                        lo |= ((qh[l] >> (2 * c)) & 1) << 4;
                        hi |= ((qh[l] >> (2 * c + 1)) & 1) << 4;
                    }
                    s.q[64 * c + l] = lo as i8;
                    s.q[64 * c + 32 + l] = hi as i8;
                }
            }
        }
        _ => {
            // Q6_K
            let (ql, qh, scales) = (&b[0..128], &b[128..192], &b[192..208]);
            s.d = f16_at(b, 208);
            for g in 0..16 {
                s.sc[g] = scales[g] as i8 as i16;
            }
            for n in 0..2 {
                let (ql, qh) = (&ql[64 * n..], &qh[32 * n..]);
                for l in 0..32 {
                    let e = 128 * n + l;
                    s.q[e] = ((ql[l] & 0x0f) | ((qh[l] & 3) << 4)) as i8 - 32;
                    s.q[e + 32] = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) as i8 - 32;
                    s.q[e + 64] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8 - 32;
                    s.q[e + 96] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8 - 32;
                }
            }
        }
    }
    s
}

/// True for the types this module decodes.
pub fn is_supported(ty: DType) -> bool {
    matches!(
        ty,
        DType::Q4_0
            | DType::Q4_1
            | DType::Q5_0
            | DType::Q5_1
            | DType::Q8_0
            | DType::Q2_K
            | DType::Q3_K
            | DType::Q4_K
            | DType::Q5_K
            | DType::Q6_K
    )
}

/// Values rebuilt from this module's decoders, for checking them against the `gguf` crate and
/// gguf-py (production dequantization is `gguf::dequantize_row`). Returns false for a type the
/// decoders do not cover.
pub fn reconstruct_row(ty: DType, src: &[u8], dst: &mut [f32]) -> bool {
    match ty {
        DType::F32 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        DType::F16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::f16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::BF16 => {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(2)) {
                *d = half::bf16::from_bits(u16::from_le_bytes([c[0], c[1]])).to_f32();
            }
        }
        DType::Q4_0 | DType::Q4_1 | DType::Q5_0 | DType::Q5_1 | DType::Q8_0 => {
            for (out, blk) in dst
                .chunks_exact_mut(QK)
                .zip(src.chunks_exact(ty.type_size()))
            {
                let s = decode_small(ty, blk);
                for (o, &q) in out.iter_mut().zip(&s.q) {
                    *o = s.d * q as f32 + s.m;
                }
            }
        }
        DType::Q2_K | DType::Q3_K | DType::Q4_K | DType::Q5_K | DType::Q6_K => {
            for (out, blk) in dst
                .chunks_exact_mut(QK_K)
                .zip(src.chunks_exact(ty.type_size()))
            {
                let s = decode_super(ty, blk);
                for (g, og) in out.chunks_exact_mut(16).enumerate() {
                    let dl = s.d * s.sc[g] as f32;
                    let ml = s.dmin * s.mn[g] as f32;
                    for (o, &q) in og.iter_mut().zip(&s.q[16 * g..16 * g + 16]) {
                        *o = dl * q as f32 - ml;
                    }
                }
            }
        }
        _ => return false,
    }
    true
}
