//! The K-quant tile kernels (AVX-512 VNNI) against a plain statement of the float steps of the
//! llama.cpp x86 kernel that computes each result, bit for bit: Q4_K's repacked gemm (whole
//! groups of four columns) and gemv (the other columns), Q5_K/Q6_K's tiled matmul (8 or more
//! columns) and `vec_dot` (fewer). The integer sums are exact in every order; these orders
//! are what makes a Gemma forward pass bit-exact with llama.cpp's.

mod common;

use common::*;
use ggml_graph::quant::blocks::{decode_super, QK_K};
use ggml_graph::quant::{
    detected, dot_tile, quantize_act_tiled, tiled, tiled_act_bytes, Q8K_BYTES,
};
use ggml_graph::DType;

/// One Q8_K block: d, 256 values, 16 group sums.
struct Act {
    d: f32,
    q: Vec<i32>,
    bsum: Vec<i32>,
}

fn act(b: &[u8]) -> Act {
    Act {
        d: f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        q: b[4..4 + QK_K].iter().map(|&v| v as i8 as i32).collect(),
        bsum: (0..16)
            .map(|g| i16::from_le_bytes([b[4 + QK_K + 2 * g], b[5 + QK_K + 2 * g]]) as i32)
            .collect(),
    }
}

#[derive(Clone, Copy, Debug)]
enum Order {
    /// Q6_K/Q5_K `vec_dot`: eight lanes (values `4m..4m+3` of every 32, unsigned codes; Q6_K
    /// minus `32 * scale * sum` of the 32 values `32m..`), `fma(da * dw, lane, acc)`, ggml's
    /// `hsum_float_8`; Q5_K plus its min chain `m = fma(-da * dmin, mins, m)`.
    Lanes,
    /// Repacked Q4_K mat-vec: per super-block `a = fma(dot, dw * da, a)`,
    /// `m = fma(mins, dmin * da, m)`, result `a - m`.
    Gemv,
    /// Repacked Q4_K gemm: the same per 64 values.
    Gemm,
    /// Tiled matmul: `r = dot * dw` (with mins: `r = fma(-dmin, mins, r)`), `acc = fma(r, da, acc)`.
    Tiled,
}

/// llama.cpp's order for column `c` of a matmul with `cols` columns.
fn order(ty: DType, cols: usize, c: usize) -> Order {
    match ty {
        DType::Q4_K if c < cols - cols % 4 => Order::Gemm,
        DType::Q4_K => Order::Gemv,
        _ if cols >= 8 => Order::Tiled,
        _ => Order::Lanes,
    }
}

fn reference(ty: DType, ord: Order, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bs = ty.type_size();
    let six = ty == DType::Q6_K;
    let (mut acc8, mut acc_d, mut acc_m) = ([0f32; 8], 0f32, 0f32);
    for i in 0..n / QK_K {
        let s = decode_super(ty, &w[i * bs..(i + 1) * bs]);
        let y = act(&a[i * Q8K_BYTES..(i + 1) * Q8K_BYTES]);
        let prod = |v: usize| s.sc[v / 16] as i32 * s.q[v] as i32 * y.q[v];
        let dots = |g0: usize, g1: usize| (16 * g0..16 * g1).map(prod).sum::<i32>();
        let mins = |g0: usize, g1: usize| (g0..g1).map(|g| s.mn[g] as i32 * y.bsum[g]).sum::<i32>();
        match ord {
            Order::Lanes => {
                let d = y.d * s.d;
                let bias = if six { 32 } else { 0 };
                for (m, acc) in acc8.iter_mut().enumerate() {
                    let mut lane = 0i32;
                    for v in (0..QK_K).filter(|v| (v % 32) / 4 == m) {
                        lane += s.sc[v / 16] as i32 * (s.q[v] as i32 + bias) * y.q[v];
                    }
                    lane -= bias
                        * (s.sc[2 * m] as i32 * y.bsum[2 * m]
                            + s.sc[2 * m + 1] as i32 * y.bsum[2 * m + 1]);
                    *acc = d.mul_add(lane as f32, *acc);
                }
                if !six {
                    acc_m = (-y.d * s.dmin).mul_add(mins(0, 16) as f32, acc_m);
                }
            }
            Order::Gemv => {
                acc_d = (dots(0, 16) as f32).mul_add(s.d * y.d, acc_d);
                acc_m = (mins(0, 16) as f32).mul_add(s.dmin * y.d, acc_m);
            }
            Order::Gemm => {
                for j in 0..4 {
                    acc_d = (dots(4 * j, 4 * j + 4) as f32).mul_add(s.d * y.d, acc_d);
                    acc_m = (mins(4 * j, 4 * j + 4) as f32).mul_add(s.dmin * y.d, acc_m);
                }
            }
            Order::Tiled => {
                let mut r = dots(0, 16) as f32 * s.d;
                if !six {
                    r = (-s.dmin).mul_add(mins(0, 16) as f32, r);
                }
                acc_d = r.mul_add(y.d, acc_d);
            }
        }
    }
    match ord {
        Order::Lanes => {
            let r: Vec<f32> = (0..4).map(|k| acc8[4 + k] + acc8[k]).collect();
            ((r[0] + r[2]) + (r[1] + r[3])) + acc_m
        }
        Order::Tiled => acc_d,
        Order::Gemv | Order::Gemm => acc_d - acc_m,
    }
}

#[test]
fn k_quant_tiles_sum_in_llama_cpp_order() {
    let simd = detected();
    if !tiled(simd, DType::Q4_K) {
        println!("skipped: this CPU has no AVX-512 VNNI tile kernels");
        return;
    }
    let mut rng = Rng::new(31);
    for ty in [DType::Q4_K, DType::Q5_K, DType::Q6_K] {
        for n in [256, 768, 2048] {
            let rows = 7;
            let wrb = n / QK_K * ty.type_size();
            let w = random_weights(&mut rng, ty, rows * n);
            let max_cols = 14;
            let x: Vec<f32> = rng
                .vec(max_cols * n)
                .iter()
                .map(|v| v * v * v * 300.0)
                .collect();
            let pb = tiled_act_bytes(ty, n);
            let mut prep = vec![0u8; max_cols * pb];
            for (xr, p) in x.chunks_exact(n).zip(prep.chunks_exact_mut(pb)) {
                assert!(quantize_act_tiled(ty, xr, p));
            }
            for cols in [1, 2, 3, 4, 5, 7, 8, 9, 12, 14] {
                let mut out = vec![0f32; cols * rows];
                assert!(dot_tile(
                    simd, ty, n, &w, wrb, rows, &prep, pb, cols, &mut out, rows
                ));
                for c in 0..cols {
                    let ord = order(ty, cols, c);
                    for r in 0..rows {
                        let want = reference(
                            ty,
                            ord,
                            &w[r * wrb..(r + 1) * wrb],
                            &prep[c * pb..(c + 1) * pb],
                            n,
                        );
                        let got = out[c * rows + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{ty} n={n} cols={cols} r={r} c={c} ({ord:?}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
