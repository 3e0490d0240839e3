//! Dot products for the weight types without dedicated kernels (the i-quants, the ternary TQ
//! types, MXFP4, NVFP4, Q1_0 and Q2_0): each weight block is decoded to f32 by the `gguf` crate
//! and dotted with the 8-bit activation blocks llama.cpp pairs the type with.
//!
//! llama.cpp sums these in integers per block with type-specific kernels; here the weight values
//! arrive as floats (exact for every grid and scale these types hold, rounded once where a scale
//! multiplies them), so results agree with llama.cpp's to float rounding, not bit for bit.

use super::blocks::{f16_at, QK, QK_K};
use super::Q8K_BYTES;
use crate::tensor::DType;

/// Largest block of the types handled here (256 values).
const MAX_BLOCK: usize = QK_K;

/// The activation type llama.cpp's CPU backend dots `w` with (its `vec_dot_type`), for the types
/// this module handles.
pub fn act_type(w: DType) -> Option<DType> {
    match w {
        DType::IQ2_XXS
        | DType::IQ2_XS
        | DType::IQ2_S
        | DType::IQ3_XXS
        | DType::IQ3_S
        | DType::IQ1_S
        | DType::IQ1_M
        | DType::IQ4_XS
        | DType::TQ1_0
        | DType::TQ2_0 => Some(DType::Q8_K),
        DType::IQ4_NL | DType::MXFP4 | DType::NVFP4 | DType::Q1_0 | DType::Q2_0 => {
            Some(DType::Q8_0)
        }
        _ => None,
    }
}

/// Bytes and values of one activation block of type `a` (Q8_0 or Q8_K).
fn act_block(a: DType) -> (usize, usize) {
    if a == DType::Q8_K {
        (Q8K_BYTES, QK_K)
    } else {
        (2 + QK, QK)
    }
}

/// Scale and quants of activation block `ab`.
fn act_parts(a: DType, ab: &[u8]) -> (f32, &[u8]) {
    if a == DType::Q8_K {
        (
            f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]),
            &ab[4..4 + QK_K],
        )
    } else {
        (f16_at(ab, 0), &ab[2..2 + QK])
    }
}

/// Dot products of weight row `w` (`n` values of type `ty`, one this module handles) with
/// `out.len()` activation rows, each `astride` bytes after the previous in `a`; every weight
/// block is decoded once for all of them. False when `ty` is not one of this module's types.
pub fn dot_cols(ty: DType, n: usize, w: &[u8], a: &[u8], astride: usize, out: &mut [f32]) -> bool {
    let Some(aty) = act_type(ty) else {
        return false;
    };
    let (bs, ts) = (ty.block_size(), ty.type_size());
    let (abytes, avals) = act_block(aty);
    // Activation blocks are never longer than weight blocks here (32 or 256 against 32..256).
    if bs > MAX_BLOCK || bs % avals != 0 && avals % bs != 0 {
        return false;
    }
    out.fill(0.0);
    let mut wf = [0f32; MAX_BLOCK];
    // Weight blocks per activation block (Q8_K against 32-value types) or the reverse.
    let span = bs.max(avals);
    let mut vals = [0f32; MAX_BLOCK];
    for s in 0..n / span {
        let wv = &mut wf[..span];
        for (j, chunk) in wv.chunks_exact_mut(bs).enumerate() {
            let b = (s * span) / bs + j;
            if gguf::dequantize_row(ty, &w[b * ts..(b + 1) * ts], chunk).is_err() {
                return false;
            }
        }
        for (c, o) in out.iter_mut().enumerate() {
            let row = &a[c * astride..];
            for (j, wchunk) in wv.chunks_exact(avals).enumerate() {
                let ab0 = ((s * span) / avals + j) * abytes;
                let (d, qs) = act_parts(aty, &row[ab0..ab0 + abytes]);
                let v = &mut vals[..avals];
                for ((v, &x), &q) in v.iter_mut().zip(wchunk).zip(qs) {
                    *v = x * f32::from(q as i8);
                }
                *o += d * v.iter().sum::<f32>();
            }
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every type handled here against a plain f32 dot of the dequantized weights with the
    /// dequantized activations.
    #[test]
    fn matches_the_dequantized_dot_for_every_type() {
        let n = 512;
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let x: Vec<f32> = (0..n)
            .map(|_| (next() % 2001) as f32 / 1000.0 - 1.0)
            .collect();
        for &ty in gguf::GgmlType::ALL {
            let Some(aty) = act_type(ty) else { continue };
            let ts = ty.type_size();
            let mut w: Vec<u8> = (0..n / ty.block_size() * ts)
                .map(|_| next() as u8)
                .collect();
            // Sane scales: the f16 or E8M0/E4M3 fields get small positive values.
            for blk in w.chunks_exact_mut(ts) {
                match ty {
                    DType::MXFP4 => blk[0] = 120,
                    DType::NVFP4 => blk[..4].fill(0x38),
                    DType::TQ1_0 => blk[52..54].copy_from_slice(&[0x00, 0x2c]),
                    DType::TQ2_0 => blk[64..66].copy_from_slice(&[0x00, 0x2c]),
                    DType::IQ1_M => {
                        // The f16 scale sits in the top nibbles of the four u16 scale words.
                        let d = 0x2c00u16;
                        for k in 0..4 {
                            let o = 48 + 2 * k;
                            let wd = u16::from_le_bytes([blk[o], blk[o + 1]]) & 0x0FFF;
                            let wd = wd | (((d >> (4 * k)) & 0xF) << 12);
                            blk[o..o + 2].copy_from_slice(&wd.to_le_bytes());
                        }
                    }
                    _ => blk[..2].copy_from_slice(&[0x00, 0x2c]),
                }
            }
            let mut wf = vec![0f32; n];
            if gguf::dequantize(ty, &w, &mut wf).is_err() {
                panic!("{ty}: dequantize");
            }
            let mut act = vec![0u8; n / act_block(aty).1 * act_block(aty).0];
            super::super::quantize_act_portable(aty, &x, &mut act);
            let mut xf = vec![0f32; n];
            let (abytes, avals) = act_block(aty);
            for (i, ab) in act.chunks_exact(abytes).enumerate() {
                let (d, qs) = act_parts(aty, ab);
                for (j, &q) in qs.iter().enumerate() {
                    xf[i * avals + j] = d * f32::from(q as i8);
                }
            }
            let want: f64 = wf
                .iter()
                .zip(&xf)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
            let scale: f64 = wf
                .iter()
                .zip(&xf)
                .map(|(&a, &b)| (f64::from(a) * f64::from(b)).abs())
                .sum();
            let mut got = [0f32; 2];
            let stride = act.len();
            let two: Vec<u8> = act.iter().chain(act.iter()).copied().collect();
            assert!(dot_cols(ty, n, &w, &two, stride, &mut got), "{ty}");
            assert!(
                want.is_finite() && scale > 0.0,
                "{ty}: degenerate test data"
            );
            for g in got {
                let err = (f64::from(g) - want).abs() / scale;
                assert!(err < 1e-5, "{ty}: got {g}, want {want} (rel {err})");
            }
        }
    }
}
