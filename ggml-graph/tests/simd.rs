//! The SIMD dot products against the scalar ones, block type by block type: both compute the
//! same integer sums, so they agree to float rounding.

mod common;

use common::*;
use rocmforge_ggml_graph::quant::{
    act_type, detected, dot_float, dot_tile, quantize_act, quantize_act_portable,
    quantize_act_tiled, tiled, tiled_act_bytes, vec_dot, vec_dot_cols, Simd, Tile,
};
use rocmforge_ggml_graph::DType;

#[test]
fn simd_matches_scalar_for_every_type() {
    let levels: Vec<Simd> = [Simd::Avx2, Simd::Avx512]
        .into_iter()
        .filter(|&l| l <= detected())
        .collect();
    if levels.is_empty() {
        println!("skipped: this CPU has no SIMD path (scalar only)");
        return;
    }
    for simd in levels {
        check_level(simd);
    }
}

fn check_level(simd: Simd) {
    let mut rng = Rng::new(77);
    for ty in [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ] {
        let aty = act_type(ty).unwrap();
        // Odd block counts (224 = 7 small blocks; 768 = 3 and 1792 = 7 super-blocks) exercise
        // the kernels' tails.
        let sizes: &[usize] = if ty.block_size() == 32 {
            &[224, 256, 512, 2048]
        } else {
            &[256, 768, 1792, 2048]
        };
        for &n in sizes {
            for _ in 0..8 {
                let w = random_weights(&mut rng, ty, n);
                let x: Vec<f32> = rng.vec(n).iter().map(|v| v * 4.0).collect();
                let mut a = vec![0u8; n / aty.block_size() * aty.type_size()];
                quantize_act(aty, &x, &mut a);
                let s = vec_dot(Simd::Scalar, ty, n, &w, &a);
                let v = vec_dot(simd, ty, n, &w, &a);
                // Several columns at once (the prefill kernels) equal one column at a time.
                let x2: Vec<f32> = rng.vec(3 * n);
                let mut a3 = a.clone();
                let mut a2 = vec![0u8; 3 * a.len()];
                quantize_act(aty, &x2, &mut a2);
                a3.extend_from_slice(&a2);
                for cols in 2..=4 {
                    let mut out = vec![0f32; cols];
                    vec_dot_cols(simd, ty, n, &w, &a3, a.len(), &mut out);
                    for (c, &o) in out.iter().enumerate() {
                        let one =
                            vec_dot(Simd::Scalar, ty, n, &w, &a3[c * a.len()..(c + 1) * a.len()]);
                        assert!(
                            (o - one).abs() <= 1e-4 * (1.0 + one.abs()),
                            "{ty} cols={cols} c={c}: {o} vs {one}"
                        );
                    }
                }
                let scale = dequant(ty, &w, n)
                    .iter()
                    .zip(&x)
                    .map(|(p, &q)| (p * q as f64).abs())
                    .sum::<f64>();
                assert!(
                    ((s - v) as f64).abs() <= 1e-5 * scale,
                    "{ty} n={n}: scalar {s} simd {v} (scale {scale})"
                );
            }
        }
    }
    for ty in [DType::F32, DType::F16, DType::BF16] {
        for n in [1, 7, 64, 333] {
            let w = random_weights(&mut rng, ty, n);
            let x = rng.vec(n);
            let s = dot_float(Simd::Scalar, ty, &w, &x);
            let v = dot_float(simd, ty, &w, &x);
            assert!(
                (s - v).abs() <= 1e-5 * (1.0 + s.abs()),
                "{ty} n={n}: {s} vs {v}"
            );
        }
    }
}

/// The multi-column entry point (up to four columns per weight pass) gives the one-column dot
/// products bit for bit, so a column's result depends on the batch only where llama.cpp's does
/// too (the AVX-512 Q4_K tiles sum whole groups of four columns like llama.cpp's repacked gemm,
/// checked in tests/kquant_orders.rs): any other difference flips Q8 activation roundings in later
/// layers and a real model's logits part by about one unit.
#[test]
fn one_column_and_several_columns_agree_bit_for_bit() {
    let levels: Vec<Simd> = [Simd::Scalar, Simd::Avx2, Simd::Avx512]
        .into_iter()
        .filter(|&l| l <= detected())
        .collect();
    let mut rng = Rng::new(5);
    for simd in levels {
        for ty in [
            DType::Q4_0,
            DType::Q4_1,
            DType::Q5_0,
            DType::Q5_1,
            DType::Q8_0,
            DType::Q2_K,
            DType::Q3_K,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
            DType::IQ4_NL,
            DType::IQ4_XS,
            DType::MXFP4,
        ] {
            let aty = act_type(ty).unwrap();
            // 640 and 2048: Gemma 3 270M's inner dimensions for the small and the K-quant types.
            let n = if ty.block_size() == 32 { 640 } else { 2048 };
            let arb = n / aty.block_size() * aty.type_size();
            for _ in 0..4 {
                let w = random_weights(&mut rng, ty, n);
                // Large, uneven magnitudes like a residual stream's.
                let x: Vec<f32> = rng.vec(4 * n).iter().map(|v| v * v * v * 300.0).collect();
                let mut a = vec![0u8; 4 * arb];
                quantize_act(aty, &x, &mut a);
                for cols in 1..=4 {
                    // Except where llama.cpp's orders differ too: Q4_K's tiles sum whole groups
                    // of four columns like its repacked gemm (tests/kquant_orders.rs).
                    if simd == Simd::Avx512 && ty == DType::Q4_K && cols == 4 {
                        continue;
                    }
                    let mut out = vec![0f32; cols];
                    vec_dot_cols(simd, ty, n, &w, &a, arb, &mut out);
                    for (c, &o) in out.iter().enumerate() {
                        let one = vec_dot(simd, ty, n, &w, &a[c * arb..(c + 1) * arb]);
                        assert_eq!(
                            o.to_bits(),
                            one.to_bits(),
                            "{simd:?} {ty} cols={cols} c={c}: {o} vs {one}"
                        );
                    }
                }
            }
        }
    }
}

/// The tile kernels (AVX-512 VNNI; Q4_0/Q5_0/Q8_0 and Q4_K/Q5_K/Q6_K): activations quantized for
/// the tiles (for the 32-value types in one SIMD pass) give bit for bit what the scalar quantizer
/// plus the one-row entry point give, for every tile shape (1 to 9 rows, 1 to 9 columns) and odd
/// block counts. Except the K-quant columns that take llama.cpp's batched orders (Q4_K: whole
/// groups of four columns; Q5_K/Q6_K: 8 or more columns), checked in tests/kquant_orders.rs.
#[test]
fn tiles_match_the_one_row_path_bit_for_bit() {
    if !tiled(detected(), DType::Q8_0) {
        println!("skipped: this CPU has no AVX-512 VNNI tile kernels");
        return;
    }
    let simd = detected();
    let mut rng = Rng::new(9);
    for ty in [
        DType::Q4_0,
        DType::Q5_0,
        DType::Q8_0,
        DType::IQ4_NL,
        DType::MXFP4,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ] {
        let aty = act_type(ty).unwrap();
        let sizes: &[usize] = if ty.block_size() == 32 {
            &[32, 224, 640]
        } else {
            &[256, 768, 2048]
        };
        for &n in sizes {
            let (rows, cols) = (9, 9);
            let wrb = n / ty.block_size() * ty.type_size();
            let w = random_weights(&mut rng, ty, rows * n);
            // Exact halves and zero blocks test the rounding and the zero scale.
            let mut x: Vec<f32> = rng
                .vec(cols * n)
                .iter()
                .map(|v| v * v * v * 300.0)
                .collect();
            x[..32].fill(0.0);
            x[40] = 127.0 * 0.5;
            x[41] = -127.0;
            let pb = tiled_act_bytes(ty, n);
            let mut prep = vec![0u8; cols * pb];
            for (xr, p) in x.chunks_exact(n).zip(prep.chunks_exact_mut(pb)) {
                assert!(quantize_act_tiled(ty, xr, p));
            }
            let arb = n / aty.block_size() * aty.type_size();
            let mut q8 = vec![0u8; cols * arb];
            quantize_act(aty, &x, &mut q8);
            for rn in 1..=rows {
                for cn in 1..=cols {
                    let mut out = vec![0f32; cn * rn];
                    let t = Tile {
                        n,
                        w: &w,
                        wstride: wrb,
                        rows: rn,
                        a: &prep,
                        astride: pb,
                        cols: cn,
                        ocs: rn,
                    };
                    assert!(dot_tile(simd, ty, &t, &mut out));
                    for c in 0..cn {
                        let batched = match ty {
                            DType::Q4_K => c < cn - cn % 4,
                            DType::Q5_K | DType::Q6_K => cn >= 8,
                            _ => false,
                        };
                        if batched {
                            continue;
                        }
                        for r in 0..rn {
                            let one = vec_dot(
                                simd,
                                ty,
                                n,
                                &w[r * wrb..(r + 1) * wrb],
                                &q8[c * arb..(c + 1) * arb],
                            );
                            assert_eq!(
                                out[c * rn + r].to_bits(),
                                one.to_bits(),
                                "{ty} n={n} tile {rn}x{cn} r={r} c={c}"
                            );
                            // The same float steps as the AVX2 multi-column kernels (ggml's
                            // x86 orders: `vec_dot` for the 32-value types and Q6_K, the
                            // repacked Q4_K mat-vec for Q4_K). Not Q5_K: its AVX2 kernel keeps
                            // the Q4_K mat-vec order, the tiles llama.cpp's `vec_dot_q5_K`.
                            if rn == rows && (cn == cols || cn == 7) && ty != DType::Q5_K {
                                let avx2 = vec_dot(
                                    Simd::Avx2,
                                    ty,
                                    n,
                                    &w[r * wrb..(r + 1) * wrb],
                                    &q8[c * arb..(c + 1) * arb],
                                );
                                assert_eq!(avx2.to_bits(), one.to_bits(), "{ty} n={n} vs AVX2");
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The SIMD activation quantizers write the portable quantizer's bytes (ties in the maximum, exact
/// halves, zero blocks, large and tiny magnitudes).
#[test]
fn simd_quantizers_match_the_portable_one() {
    let mut rng = Rng::new(21);
    for ty in [DType::Q8_0, DType::Q8_1, DType::Q8_K] {
        for case in 0..6 {
            let n = 4 * 256;
            let mut x: Vec<f32> = rng.vec(n).iter().map(|v| v * v * v * 50.0).collect();
            match case {
                1 => x[..256].fill(0.0),
                2 => {
                    x[3] = 9.0;
                    x[7] = -9.0;
                    x[300] = -11.0;
                    x[301] = 11.0;
                }
                3 => x.iter_mut().for_each(|v| *v = (*v * 4.0).round() / 4.0),
                4 => x.iter_mut().for_each(|v| *v *= 1e-30),
                _ => {}
            }
            let mut want = vec![0u8; n / ty.block_size() * ty.type_size()];
            let mut got = want.clone();
            quantize_act_portable(ty, &x, &mut want);
            quantize_act(ty, &x, &mut got);
            assert_eq!(got, want, "{ty} case {case}");
        }
    }
}
