//! The SIMD dot products against the scalar ones, block type by block type: both compute the
//! same integer sums, so they agree to float rounding.

mod common;

use common::*;
use rocmforge_ggml_graph::quant::{
    act_type, detected, dot_float, dot_tile, dot_tile_of, quantize_act, quantize_act_portable,
    quantize_act_tiled, tiled, tiled_act_bytes, vec_dot, vec_dot_cols, Simd, Tile, Q8K_BYTES,
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

/// The 32-value types llama.cpp repacks (2-D weights, rows a multiple of 8), whose tiles take its
/// repacked kernels' order ([`repacked_q4_0_family_sums_in_llama_cpp_order`]).
const REPACKED_32: [DType; 3] = [DType::Q4_0, DType::IQ4_NL, DType::MXFP4];

/// The tile kernels (AVX-512 VNNI; Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, IQ4_NL, MXFP4, Q4_K/Q5_K/Q6_K and
/// IQ4_XS):
/// activations quantized for the tiles (for the 32-value types in one SIMD pass) give bit for bit
/// what the scalar quantizer plus the one-row entry point give, for every tile shape (1 to 9
/// rows, 1 to 9 columns) and odd block counts. Except the columns that take llama.cpp's batched
/// orders (Q4_K: whole groups of four columns; Q5_K/Q6_K/IQ4_XS: 8 or more columns), checked in
/// tests/kquant_orders.rs and, for IQ4_XS, [`iq4_xs_tiles_sum_in_llama_cpp_order`].
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
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::IQ4_NL,
        DType::MXFP4,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::IQ4_XS,
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
                            DType::Q5_K | DType::Q6_K | DType::IQ4_XS => cn >= 8,
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
                            if rn == rows
                                && (cn == cols || cn == 7)
                                && ty != DType::Q5_K
                                && !REPACKED_32.contains(&ty)
                            {
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

/// Q4_0, IQ4_NL and MXFP4 tiles against a plain statement of llama.cpp's float steps, bit for
/// bit: for a weight it repacks (its `gemv/gemm_q4_0_8x8_q8_0` family) one chain per result,
/// `acc = fma(dot, dw * da, acc)` per block with the block's exact integer dot; for one it does
/// not, `vec_dot`'s eight lanes, which the AVX2 kernels also take. Every tile shape up to 35 rows
/// (the 16-row groups and a partial one) and 9 columns.
#[test]
fn repacked_q4_0_family_sums_in_llama_cpp_order() {
    if !tiled(detected(), DType::Q4_0) {
        println!("skipped: this CPU has no AVX-512 VNNI tile kernels");
        return;
    }
    let simd = detected();
    let mut rng = Rng::new(13);
    for ty in REPACKED_32 {
        let values: Option<&[i8; 16]> = match ty {
            DType::IQ4_NL => Some(&gguf::quants::iq_tables::IQ4NL_VALUES),
            DType::MXFP4 => Some(&gguf::quants::iq_tables::MXFP4_VALUES),
            _ => None,
        };
        let (bs, qoff) = (ty.type_size(), if ty == DType::MXFP4 { 1 } else { 2 });
        let reference = |w: &[u8], a: &[u8], n: usize| -> f32 {
            let mut acc = 0f32;
            for (wb, ab) in w.chunks_exact(bs).zip(a.chunks_exact(34)).take(n / 32) {
                let dw = if ty == DType::MXFP4 {
                    gguf::quants::e8m0_to_f32_half(wb[0])
                } else {
                    half::f16::from_bits(u16::from_le_bytes([wb[0], wb[1]])).to_f32()
                };
                let da = half::f16::from_bits(u16::from_le_bytes([ab[0], ab[1]])).to_f32();
                let dot: i32 = (0..32)
                    .map(|v| {
                        let code = (wb[qoff + v % 16] >> (4 * (v / 16)) & 0x0f) as usize;
                        let q = values.map_or(code as i32 - 8, |t| t[code] as i32);
                        q * ab[2 + v] as i8 as i32
                    })
                    .sum();
                acc = (dot as f32).mul_add(dw * da, acc);
            }
            acc
        };
        for n in [32, 224, 640] {
            let (rows, cols) = (35, 9);
            let wrb = n / 32 * bs;
            let mut w = random_weights(&mut rng, ty, rows * n);
            if ty == DType::MXFP4 {
                // The subnormal scales of E8M0 exponents 0 and 1.
                w[0] = 0;
                w[wrb] = 1;
            }
            let mut x: Vec<f32> = rng
                .vec(cols * n)
                .iter()
                .map(|v| v * v * v * 300.0)
                .collect();
            x[..32].fill(0.0);
            let pb = tiled_act_bytes(ty, n);
            let mut prep = vec![0u8; cols * pb];
            for (xr, p) in x.chunks_exact(n).zip(prep.chunks_exact_mut(pb)) {
                assert!(quantize_act_tiled(ty, xr, p));
            }
            let arb = n / 32 * 34;
            let mut q8 = vec![0u8; cols * arb];
            quantize_act(DType::Q8_0, &x, &mut q8);
            for rn in [1, 2, 15, 16, 17, 32, 35] {
                for cn in 1..=cols {
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
                    for repacked in [true, false] {
                        let mut out = vec![0f32; cn * rn];
                        assert!(dot_tile_of(simd, ty, &t, &mut out, repacked));
                        for c in 0..cn {
                            for r in 0..rn {
                                let (wr, ar) =
                                    (&w[r * wrb..(r + 1) * wrb], &q8[c * arb..(c + 1) * arb]);
                                let want = if repacked {
                                    reference(wr, ar, n)
                                } else {
                                    vec_dot(Simd::Avx2, ty, n, wr, ar)
                                };
                                assert_eq!(
                                    out[c * rn + r].to_bits(),
                                    want.to_bits(),
                                    "{ty} n={n} repacked={repacked} tile {rn}x{cn} r={r} c={c}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// IQ4_XS tiles against a plain statement of llama.cpp's float steps, bit for bit: its tiled
/// K-quant matmul for 8 or more columns (per super-block the integer dot of the 6-bit-scaled
/// sub-blocks, `r = dot * dw`, `acc = fma(r, da, acc)`) and `vec_dot_iq4_xs_q8_K` below (eight
/// i32 lanes, values `4m..4m+3` of every 32, `fma(dw * da, lane, acc)`, ggml's `hsum_float_8`).
#[test]
fn iq4_xs_tiles_sum_in_llama_cpp_order() {
    let ty = DType::IQ4_XS;
    if !tiled(detected(), ty) {
        println!("skipped: this CPU has no AVX-512 VNNI tile kernels");
        return;
    }
    let values = &gguf::quants::iq_tables::IQ4NL_VALUES;
    let reference = |tiled: bool, w: &[u8], a: &[u8], n: usize| -> f32 {
        let (mut lanes, mut acc) = ([0f32; 8], 0f32);
        for (wb, ab) in w
            .chunks_exact(136)
            .zip(a.chunks_exact(Q8K_BYTES))
            .take(n / 256)
        {
            let dw = half::f16::from_bits(u16::from_le_bytes([wb[0], wb[1]])).to_f32();
            let da = f32::from_le_bytes([ab[0], ab[1], ab[2], ab[3]]);
            let sh = u16::from_le_bytes([wb[2], wb[3]]) as i32;
            let mut lane_dot = [0i32; 8];
            for ib in 0..8 {
                let lo = (wb[4 + ib / 2] >> (4 * (ib % 2))) as i32 & 0x0f;
                let ls = (lo | (((sh >> (2 * ib)) & 3) << 4)) - 32;
                for v in 0..32 {
                    let code = wb[8 + 16 * ib + v % 16] >> (4 * (v / 16)) & 0x0f;
                    let q = values[code as usize] as i32 * ab[4 + 32 * ib + v] as i8 as i32;
                    lane_dot[v / 4] += ls * q;
                }
            }
            if tiled {
                let dot: i32 = lane_dot.iter().sum();
                acc = (dot as f32 * dw).mul_add(da, acc);
            } else {
                for (l, &d) in lanes.iter_mut().zip(&lane_dot) {
                    *l = (dw * da).mul_add(d as f32, *l);
                }
            }
        }
        if tiled {
            return acc;
        }
        // ggml's hsum_float_8: 128-bit halves, then lanes 2-3 onto 0-1, then lane 1 onto 0.
        let h: Vec<f32> = (0..4).map(|i| lanes[i + 4] + lanes[i]).collect();
        let (x0, x1) = (h[0] + h[2], h[1] + h[3]);
        x0 + x1
    };
    let mut rng = Rng::new(31);
    let simd = detected();
    for n in [256, 768, 2048] {
        let (rows, cols) = (5, 11);
        let wrb = n / 256 * 136;
        let w = random_weights(&mut rng, ty, rows * n);
        let x: Vec<f32> = rng
            .vec(cols * n)
            .iter()
            .map(|v| v * v * v * 300.0)
            .collect();
        let pb = tiled_act_bytes(ty, n);
        let mut a = vec![0u8; cols * pb];
        for (xr, p) in x.chunks_exact(n).zip(a.chunks_exact_mut(pb)) {
            assert!(quantize_act_tiled(ty, xr, p));
        }
        for cn in [1, 2, 3, 7, 8, 11] {
            let mut out = vec![0f32; cn * rows];
            let t = Tile {
                n,
                w: &w,
                wstride: wrb,
                rows,
                a: &a,
                astride: pb,
                cols: cn,
                ocs: rows,
            };
            assert!(dot_tile(simd, ty, &t, &mut out));
            for c in 0..cn {
                for r in 0..rows {
                    let want = reference(
                        cn >= 8,
                        &w[r * wrb..(r + 1) * wrb],
                        &a[c * pb..(c + 1) * pb],
                        n,
                    );
                    assert_eq!(
                        out[c * rows + r].to_bits(),
                        want.to_bits(),
                        "n={n} cols={cn} r={r} c={c}: {} vs {want}",
                        out[c * rows + r]
                    );
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
