//! Conversions between ggml tensor types and f32: dequantization for every type GGUF files
//! use, quantization for the types models are stored in, and the block layouts both share.
//!
//! Reference: ggml's `ggml-common.h` (layouts) and the `gguf` Python package's `quants.py`
//! (the numerical oracle the tests compare against bit for bit).

pub mod blocks;
mod iq;
mod iq1_grid;
mod iq4quantize;
pub mod iq_tables;
mod kquantize;
mod kquants;
mod legacy;
mod quantize;

pub use blocks::*;
pub use iq::e8m0_to_f32_half;
pub use iq1_grid::IQ1S_GRID;

use rayon::prelude::*;

use crate::error::{GgufError, Result};
use crate::types::GgmlType;

type DequantFn = fn(&[u8], &mut [f32]);

fn dequant_fn(ty: GgmlType) -> DequantFn {
    use GgmlType as T;
    match ty {
        T::F32 => legacy::f32_,
        T::F16 => legacy::f16_,
        T::BF16 => legacy::bf16_,
        T::F64 => legacy::f64_,
        T::I8 => legacy::i8_,
        T::I16 => legacy::i16_,
        T::I32 => legacy::i32_,
        T::I64 => legacy::i64_,
        T::Q4_0 => legacy::q4_0,
        T::Q4_1 => legacy::q4_1,
        T::Q5_0 => legacy::q5_0,
        T::Q5_1 => legacy::q5_1,
        T::Q8_0 => legacy::q8_0,
        T::Q8_1 => legacy::q8_1,
        T::Q2_K => kquants::q2_k,
        T::Q3_K => kquants::q3_k,
        T::Q4_K => kquants::q4_k,
        T::Q5_K => kquants::q5_k,
        T::Q6_K => kquants::q6_k,
        T::Q8_K => kquants::q8_k,
        T::IQ2_XXS => iq::iq2_xxs,
        T::IQ2_XS => iq::iq2_xs,
        T::IQ2_S => iq::iq2_s,
        T::IQ3_XXS => iq::iq3_xxs,
        T::IQ3_S => iq::iq3_s,
        T::IQ1_S => iq::iq1_s,
        T::IQ1_M => iq::iq1_m,
        T::IQ4_NL => iq::iq4_nl,
        T::IQ4_XS => iq::iq4_xs,
        T::TQ1_0 => iq::tq1_0,
        T::TQ2_0 => iq::tq2_0,
        T::MXFP4 => iq::mxfp4,
        T::NVFP4 => iq::nvfp4,
        T::Q1_0 => legacy::q1_0,
        T::Q2_0 => legacy::q2_0,
    }
}

/// Checks that `src` holds whole blocks of `ty` and `dst` exactly the values they decode to.
fn check_sizes(ty: GgmlType, src_len: usize, dst_len: usize) -> Result<()> {
    let (bs, ts) = (ty.block_size(), ty.type_size());
    if src_len % ts != 0 {
        return Err(GgufError::SizeMismatch {
            ty,
            reason: format!("{src_len} source bytes are not a whole number of {ts}-byte blocks"),
        });
    }
    let n_blocks = src_len / ts;
    if n_blocks.checked_mul(bs) != Some(dst_len) {
        return Err(GgufError::SizeMismatch {
            ty,
            reason: format!(
                "{n_blocks} blocks decode to {} values, but the output holds {dst_len}",
                n_blocks.saturating_mul(bs)
            ),
        });
    }
    Ok(())
}

/// Dequantizes `src` (whole blocks of `ty`) into `dst` on the calling thread. For callers that
/// parallelize across rows themselves.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_sizes(ty, src.len(), dst.len())?;
    dequant_fn(ty)(src, dst);
    Ok(())
}

/// Values per rayon task: large enough that scheduling costs vanish, small enough to balance.
const PAR_CHUNK_VALUES: usize = 1 << 16;

/// Dequantizes `src` (whole blocks of `ty`) into `dst`, spreading large inputs over rayon's
/// thread pool.
pub fn dequantize(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<()> {
    check_sizes(ty, src.len(), dst.len())?;
    let f = dequant_fn(ty);
    if dst.len() <= PAR_CHUNK_VALUES {
        f(src, dst);
        return Ok(());
    }
    let blocks_per_chunk = (PAR_CHUNK_VALUES / ty.block_size()).max(1);
    let src_chunk = blocks_per_chunk * ty.type_size();
    let dst_chunk = blocks_per_chunk * ty.block_size();
    src.par_chunks(src_chunk)
        .zip(dst.par_chunks_mut(dst_chunk))
        .for_each(|(s, d)| f(s, d));
    Ok(())
}

/// Dequantizes `src` into a new vector.
pub fn dequantize_to_vec(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>> {
    let n = (src.len() / ty.type_size()).saturating_mul(ty.block_size());
    let mut out = vec![0f32; n];
    dequantize(ty, src, &mut out)?;
    Ok(out)
}

type QuantFn = fn(&[f32], &mut [u8]);

fn quant_fn(ty: GgmlType) -> Option<QuantFn> {
    use GgmlType as T;
    Some(match ty {
        T::Q4_0 => quantize::q4_0,
        T::Q4_1 => quantize::q4_1,
        T::Q5_0 => quantize::q5_0,
        T::Q5_1 => quantize::q5_1,
        T::Q8_0 => quantize::q8_0,
        T::Q2_K => kquantize::q2_k,
        T::Q3_K => kquantize::q3_k,
        T::Q4_K => kquantize::q4_k,
        T::Q5_K => kquantize::q5_k,
        T::Q6_K => kquantize::q6_k,
        T::Q8_K => kquantize::q8_k,
        T::MXFP4 => quantize::mxfp4,
        T::IQ4_NL => iq4quantize::iq4_nl,
        T::IQ4_XS => iq4quantize::iq4_xs,
        _ => return None,
    })
}

/// Types [`quantize`] accepts, besides the plain F32/F16/BF16.
pub const QUANTIZABLE: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::MXFP4,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
];

/// True when [`quantize`] supports `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) || quant_fn(ty).is_some()
}

/// Quantizes `src` (a whole number of blocks) into `dst` (exactly the encoded size), on the
/// calling thread.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<()> {
    check_sizes(ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => {
            for (d, s) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&s.to_le_bytes());
            }
        }
        GgmlType::F16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&half::f16::from_f32(*s).to_bits().to_le_bytes());
            }
        }
        GgmlType::BF16 => {
            for (d, s) in dst.chunks_exact_mut(2).zip(src) {
                d.copy_from_slice(&half::bf16::from_f32(*s).to_bits().to_le_bytes());
            }
        }
        _ => match quant_fn(ty) {
            Some(f) => f(src, dst),
            None => {
                return Err(GgufError::Unsupported {
                    ty,
                    what: "quantization",
                })
            }
        },
    }
    Ok(())
}

/// Quantizes `src` (a whole number of blocks) into a new buffer, in parallel over blocks for
/// large inputs.
pub fn quantize(ty: GgmlType, src: &[f32]) -> Result<Vec<u8>> {
    if !can_quantize(ty) {
        return Err(GgufError::Unsupported {
            ty,
            what: "quantization",
        });
    }
    let bs = ty.block_size();
    if src.len() % bs != 0 {
        return Err(GgufError::SizeMismatch {
            ty,
            reason: format!(
                "{} values are not a whole number of {bs}-value blocks",
                src.len()
            ),
        });
    }
    let mut out = vec![0u8; src.len() / bs * ty.type_size()];
    if src.len() <= PAR_CHUNK_VALUES {
        quantize_row(ty, src, &mut out)?;
        return Ok(out);
    }
    let blocks_per_chunk = (PAR_CHUNK_VALUES / bs).max(1);
    src.par_chunks(blocks_per_chunk * bs)
        .zip(out.par_chunks_mut(blocks_per_chunk * ty.type_size()))
        .try_for_each(|(s, d)| quantize_row(ty, s, d))?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mxfp4_quantizes_as_ggml() {
        // E2M1 values times 8: ggml picks exponent floor(log2(48)) - 2 and every value is on
        // the grid, so the round trip is exact; halfway values go to the first (smaller) code.
        let grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        let mut x: Vec<f32> = (0..32).map(|i| grid[i % 8] * 8.0).collect();
        x[9] = -x[9];
        let mut q = vec![0u8; 17];
        quantize_row(GgmlType::MXFP4, &x, &mut q).unwrap();
        assert_eq!(q[0], 130);
        let mut back = vec![0f32; 32];
        dequantize_row(GgmlType::MXFP4, &q, &mut back).unwrap();
        assert_eq!(back, x);
        x[1] = 5.0 * 8.0;
        x[2] = 2.5 * 8.0;
        quantize_row(GgmlType::MXFP4, &x, &mut q).unwrap();
        dequantize_row(GgmlType::MXFP4, &q, &mut back).unwrap();
        assert_eq!((back[1], back[2]), (32.0, 16.0));
        assert!(can_quantize(GgmlType::MXFP4));
    }

    #[test]
    fn block_structs_match_the_type_table() {
        use std::mem::size_of;
        let sizes = [
            (GgmlType::Q4_0, size_of::<BlockQ4_0>()),
            (GgmlType::Q4_1, size_of::<BlockQ4_1>()),
            (GgmlType::Q5_0, size_of::<BlockQ5_0>()),
            (GgmlType::Q5_1, size_of::<BlockQ5_1>()),
            (GgmlType::Q8_0, size_of::<BlockQ8_0>()),
            (GgmlType::Q8_1, size_of::<BlockQ8_1>()),
            (GgmlType::Q2_K, size_of::<BlockQ2K>()),
            (GgmlType::Q3_K, size_of::<BlockQ3K>()),
            (GgmlType::Q4_K, size_of::<BlockQ4K>()),
            (GgmlType::Q5_K, size_of::<BlockQ5K>()),
            (GgmlType::Q6_K, size_of::<BlockQ6K>()),
            (GgmlType::Q8_K, size_of::<BlockQ8K>()),
            (GgmlType::IQ2_XXS, size_of::<BlockIQ2XXS>()),
            (GgmlType::IQ2_XS, size_of::<BlockIQ2XS>()),
            (GgmlType::IQ2_S, size_of::<BlockIQ2S>()),
            (GgmlType::IQ3_XXS, size_of::<BlockIQ3XXS>()),
            (GgmlType::IQ3_S, size_of::<BlockIQ3S>()),
            (GgmlType::IQ1_S, size_of::<BlockIQ1S>()),
            (GgmlType::IQ1_M, size_of::<BlockIQ1M>()),
            (GgmlType::IQ4_NL, size_of::<BlockIQ4NL>()),
            (GgmlType::IQ4_XS, size_of::<BlockIQ4XS>()),
            (GgmlType::TQ1_0, size_of::<BlockTQ1_0>()),
            (GgmlType::TQ2_0, size_of::<BlockTQ2_0>()),
            (GgmlType::MXFP4, size_of::<BlockMXFP4>()),
            (GgmlType::NVFP4, size_of::<BlockNVFP4>()),
            (GgmlType::Q1_0, size_of::<BlockQ1_0>()),
            (GgmlType::Q2_0, size_of::<BlockQ2_0>()),
        ];
        for (ty, size) in sizes {
            assert_eq!(size, ty.type_size(), "{ty}");
        }
    }

    #[test]
    fn unaligned_scalar_input_decodes_like_aligned() {
        for ty in [
            GgmlType::F32,
            GgmlType::F64,
            GgmlType::I16,
            GgmlType::I32,
            GgmlType::I64,
        ] {
            let n = 64;
            let bytes: Vec<u8> = (0..n * ty.type_size() + 1)
                .map(|i| (i * 37 % 251) as u8)
                .collect();
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            let mut shifted = bytes[1..].to_vec();
            dequantize_row(ty, &shifted, &mut a).expect("aligned copy");
            shifted.insert(0, 0);
            dequantize_row(ty, &shifted[1..], &mut b).expect("unaligned view");
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a), bits(&b), "{ty}");
        }
    }

    #[test]
    fn size_mismatches_are_errors() {
        let mut out = [0f32; 32];
        assert!(matches!(
            dequantize(GgmlType::Q8_0, &[0; 33], &mut out),
            Err(GgufError::SizeMismatch { .. })
        ));
        assert!(matches!(
            dequantize_row(GgmlType::Q8_0, &[0; 68], &mut out),
            Err(GgufError::SizeMismatch { .. })
        ));
        assert!(matches!(
            quantize(GgmlType::Q4_0, &[0.0; 31]),
            Err(GgufError::SizeMismatch { .. })
        ));
        assert!(matches!(
            quantize(GgmlType::IQ2_XXS, &[0.0; 256]),
            Err(GgufError::Unsupported { .. })
        ));
    }

    #[test]
    fn q8_0_layout_is_scale_then_values() {
        let q = quantize(GgmlType::Q8_0, &[1.0; 32]).expect("quantize");
        assert_eq!(q.len(), 34);
        assert_eq!(
            f16_le([q[0], q[1]]),
            half::f16::from_f32(1.0 / 127.0).to_f32()
        );
        assert!(q[2..].iter().all(|&b| b as i8 == 127));
    }
}
