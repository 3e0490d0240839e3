//! The K-quant tile kernels (AVX-512 VNNI) against a plain statement of the float steps of the
//! llama.cpp x86 kernel that computes each result, bit for bit: Q4_K's repacked gemm (whole
//! groups of four columns) and gemv (the other columns), Q5_K/Q6_K's tiled matmul (8 or more
//! columns) and `vec_dot` (fewer), and the same tiled/`vec_dot` choice for Q4_K weights that
//! llama.cpp does not repack (rows not a multiple of 8). The integer sums are exact in every
//! order; these orders are what makes a Gemma forward pass bit-exact with llama.cpp's.

mod common;

use common::*;
use rocmforge_ggml_graph::quant::blocks::{decode_super, QK_K};
use rocmforge_ggml_graph::quant::{
    detected, dot_tile, dot_tile_of, quantize_act_tiled, repacked, tiled, tiled_act_bytes, Tile,
    Q8K_BYTES,
};
use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, WeightBytes};

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
    /// Q4_K `vec_dot` (not repacked): the lanes of [`Order::Lanes`]; the min terms of sub-block
    /// pairs on four lanes `m = fma(-da * dmin, pair, m)`, summed `(m0 + m2) + (m1 + m3)`.
    Lanes4,
}

/// llama.cpp's order for column `c` of a matmul with `cols` columns (Q4_K weights repacked).
fn order(ty: DType, cols: usize, c: usize) -> Order {
    match ty {
        DType::Q4_K if c < cols - cols % 4 => Order::Gemm,
        DType::Q4_K => Order::Gemv,
        _ if cols >= 8 => Order::Tiled,
        _ => Order::Lanes,
    }
}

/// llama.cpp's order for a Q4_K weight it does not repack.
fn order_plain_q4k(cols: usize) -> Order {
    if cols >= 8 {
        Order::Tiled
    } else {
        Order::Lanes4
    }
}

fn reference(ty: DType, ord: Order, w: &[u8], a: &[u8], n: usize) -> f32 {
    let bs = ty.type_size();
    let six = ty == DType::Q6_K;
    let (mut acc8, mut acc_d, mut acc_m, mut acc_m4) = ([0f32; 8], 0f32, 0f32, [0f32; 4]);
    for i in 0..n / QK_K {
        let s = decode_super(ty, &w[i * bs..(i + 1) * bs]);
        let y = act(&a[i * Q8K_BYTES..(i + 1) * Q8K_BYTES]);
        let prod = |v: usize| s.sc[v / 16] as i32 * s.q[v] as i32 * y.q[v];
        let dots = |g0: usize, g1: usize| (16 * g0..16 * g1).map(prod).sum::<i32>();
        let mins = |g0: usize, g1: usize| (g0..g1).map(|g| s.mn[g] as i32 * y.bsum[g]).sum::<i32>();
        match ord {
            Order::Lanes | Order::Lanes4 => {
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
                if let Order::Lanes4 = ord {
                    // Sub-blocks 2k and 2k + 1: groups 4k..4k + 4.
                    for (k, m) in acc_m4.iter_mut().enumerate() {
                        *m = (-y.d * s.dmin).mul_add(mins(4 * k, 4 * k + 4) as f32, *m);
                    }
                } else if !six {
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
        Order::Lanes4 => {
            let r: Vec<f32> = (0..4).map(|k| acc8[4 + k] + acc8[k]).collect();
            let m = (acc_m4[0] + acc_m4[2]) + (acc_m4[1] + acc_m4[3]);
            ((r[0] + r[2]) + (r[1] + r[3])) + m
        }
        Order::Tiled => acc_d,
        Order::Gemv | Order::Gemm => acc_d - acc_m,
    }
}

/// Random weights (`rows` rows of `n` values) and `cols` activation rows (long-tailed values),
/// quantized for the tiles.
struct Fixture {
    w: Vec<u8>,
    wrb: usize,
    x: Vec<f32>,
    prep: Vec<u8>,
    pb: usize,
}

fn fixture(rng: &mut Rng, ty: DType, n: usize, rows: usize, cols: usize) -> Fixture {
    let wrb = n / QK_K * ty.type_size();
    let w = random_weights(rng, ty, rows * n);
    let x: Vec<f32> = rng
        .vec(cols * n)
        .iter()
        .map(|v| v * v * v * 300.0)
        .collect();
    let pb = tiled_act_bytes(ty, n);
    let mut prep = vec![0u8; cols * pb];
    for (xr, p) in x.chunks_exact(n).zip(prep.chunks_exact_mut(pb)) {
        assert!(quantize_act_tiled(ty, xr, p));
    }
    Fixture {
        w,
        wrb,
        x,
        prep,
        pb,
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
    // 37 rows: two interleaved 16-row groups (Q4_K, and Q6_K from 8 columns) and a remainder.
    for (ty, rows) in [
        (DType::Q4_K, 7),
        (DType::Q4_K, 37),
        (DType::Q5_K, 7),
        (DType::Q6_K, 7),
        (DType::Q6_K, 37),
    ] {
        for n in [256, 768, 2048] {
            let Fixture {
                w, wrb, prep, pb, ..
            } = fixture(&mut rng, ty, n, rows, 14);
            for cols in [1, 2, 3, 4, 5, 7, 8, 9, 12, 14] {
                let mut out = vec![0f32; cols * rows];
                let t = Tile {
                    n,
                    w: &w,
                    wstride: wrb,
                    rows,
                    a: &prep,
                    astride: pb,
                    cols,
                    ocs: rows,
                };
                assert!(dot_tile(simd, ty, &t, &mut out));
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

/// llama.cpp's repacking rule on AVX2/AVX-512: Q4_K only, 2-D, rows a multiple of 8.
#[test]
fn repacking_follows_llama_cpp() {
    assert!(repacked(DType::Q4_K, [256, 640, 1, 1]));
    assert!(!repacked(DType::Q4_K, [256, 644, 1, 1]));
    assert!(!repacked(DType::Q4_K, [256, 7, 1, 1]));
    assert!(!repacked(DType::Q4_K, [256, 8, 2, 1]));
    for ty in [DType::Q5_K, DType::Q6_K, DType::Q8_0, DType::Q5_0] {
        assert!(!repacked(ty, [256, 640, 1, 1]), "{ty}");
    }
}

/// Q4_K weights llama.cpp does not repack (rows not a multiple of 8): its tiled order from 8
/// columns, `vec_dot_q4_K_q8_K`'s below; through the tile kernels and through a whole mul_mat.
#[test]
fn unrepacked_q4_k_sums_in_llama_cpp_order() {
    let simd = detected();
    if !tiled(simd, DType::Q4_K) {
        println!("skipped: this CPU has no AVX-512 VNNI tile kernels");
        return;
    }
    let ty = DType::Q4_K;
    let mut rng = Rng::new(47);
    for (n, rows) in [(256, 7), (768, 12), (2048, 21)] {
        let Fixture {
            w,
            wrb,
            x,
            prep,
            pb,
        } = fixture(&mut rng, ty, n, rows, 14);
        assert!(!repacked(ty, [n, rows, 1, 1]));
        for cols in [1, 2, 3, 4, 5, 7, 8, 9, 12, 14] {
            let ord = order_plain_q4k(cols);
            let want = |r: usize, c: usize| {
                reference(
                    ty,
                    ord,
                    &w[r * wrb..(r + 1) * wrb],
                    &prep[c * pb..(c + 1) * pb],
                    n,
                )
            };
            let mut out = vec![0f32; cols * rows];
            let t = Tile {
                n,
                w: &w,
                wstride: wrb,
                rows,
                a: &prep,
                astride: pb,
                cols,
                ocs: rows,
            };
            assert!(dot_tile_of(simd, ty, &t, &mut out, false));
            // The whole matmul decides by the weight's shape.
            let mut g = Graph::new();
            let wt = g.weight("w", ty, &[n, rows]).unwrap();
            let xt = g.input("x", DType::F32, &[n, cols]).unwrap();
            let y = g.mul_mat(wt, xt).unwrap();
            g.mark_output(y).unwrap();
            let mut ex = Executor::new(CpuBackend::new(2).unwrap());
            ex.bind_weight("w", ty, &[n, rows], WeightBytes::from_vec(w.clone()))
                .unwrap();
            ex.run(&g, &[(xt, &f32_bytes(&x[..cols * n]))]).unwrap();
            let graph_out = ex.output_f32(y).unwrap();
            for c in 0..cols {
                for r in 0..rows {
                    let want = want(r, c);
                    for (path, got) in [
                        ("tile", out[c * rows + r]),
                        ("mul_mat", graph_out[c * rows + r]),
                    ] {
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{path} n={n} rows={rows} cols={cols} r={r} c={c} ({ord:?}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
