//! Mixture-of-experts ops: top-k routing and the chosen experts' weights against naive
//! references; `mul_mat_id` against a dequantize-then-f64 reference and, bit for bit, against a
//! one-column `mul_mat` of the chosen expert (the same kernels, so prefill, decode and batches
//! agree).

#![allow(
    clippy::needless_range_loop,
    reason = "references index several arrays in lockstep"
)]

mod common;

use common::*;
use rocmforge_ggml_graph::quant::Simd;
use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, WeightBytes};

#[test]
fn top_k_and_expert_weights_match_a_naive_reference() {
    let mut rng = Rng::new(7);
    let (n, rows, k) = (8, 5, 3);
    let mut v = rng.vec(n * rows);
    // A tie: the lower index must come first.
    v[2] = v[5].max(v[2]) + 1.0;
    v[5] = v[2];
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &[n, rows]).unwrap();
    let ids = g.arg_top_k(a, k).unwrap();
    let w = g.expert_weights(a, ids, false).unwrap();
    let wn = g.expert_weights(a, ids, true).unwrap();
    for o in [ids, w, wn] {
        g.mark_output(o).unwrap();
    }
    let ex = run(&g, &[], &[(a, f32_bytes(&v))]);
    let got_ids = ex.output_i32(ids).unwrap();
    let got_w = ex.output_f32(w).unwrap();
    let got_wn = ex.output_f32(wn).unwrap();
    for r in 0..rows {
        let row = &v[r * n..(r + 1) * n];
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&i, &j| row[j].total_cmp(&row[i]).then(i.cmp(&j)));
        let sum: f32 = order[..k].iter().map(|&i| row[i]).sum();
        for s in 0..k {
            assert_eq!(got_ids[r * k + s], order[s] as i32, "row {r} slot {s}");
            assert_eq!(got_w[r * k + s], row[order[s]]);
            assert_eq!(got_wn[r * k + s], row[order[s]] / sum.max(6.103_515_6e-5));
        }
    }
    assert_eq!(&got_ids[..2], &[2, 5], "ties keep the lower index first");
}

#[test]
fn routing_shapes_are_checked() {
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &[4, 3]).unwrap();
    assert!(g.arg_top_k(a, 0).is_err());
    assert!(g.arg_top_k(a, 5).is_err());
    let ids = g.input("ids", DType::I32, &[2, 2]).unwrap();
    assert!(g.expert_weights(a, ids, true).is_err(), "rows differ");
    let w = g.weight("w", DType::Q8_0, &[64, 8, 4]).unwrap();
    let x = g.input("x", DType::F32, &[64, 3, 2]).unwrap();
    assert!(
        g.mul_mat_id(w, x, ids).is_err(),
        "x has 3 columns per token for 2 slots"
    );
}

#[test]
fn out_of_range_expert_ids_are_errors() {
    let (k, n, n_exp) = (32, 4, 3);
    let mut g = Graph::new();
    let w = g.weight("w", DType::F32, &[k, n, n_exp]).unwrap();
    let x = g.input("x", DType::F32, &[k, 1, 1]).unwrap();
    let ids = g.input("ids", DType::I32, &[1, 1]).unwrap();
    let y = g.mul_mat_id(w, x, ids).unwrap();
    g.mark_output(y).unwrap();
    let mut ex = Executor::new(CpuBackend::new(1).unwrap());
    ex.bind_weight(
        "w",
        DType::F32,
        &[k, n, n_exp],
        WeightBytes::from_vec(vec![0; k * n * n_exp * 4]),
    )
    .unwrap();
    let xb = f32_bytes(&vec![1.0; k]);
    let err = ex
        .run(&g, &[(x, &xb[..]), (ids, &i32_bytes(&[3])[..])])
        .unwrap_err();
    assert!(err.to_string().contains("expert id 3"), "{err}");
}

/// `mul_mat_id` of a `[k, n, n_exp]` stack with `x` `[k, n_x, n_tok]` and random ids.
fn check_mul_mat_id(ty: DType, simd: Simd, k: usize, n: usize, n_x: usize, n_tok: usize) {
    let (n_exp, n_used) = (6, 2);
    let mut rng = Rng::new(31 + n_tok as u64);
    let wb = random_weights(&mut rng, ty, k * n * n_exp);
    let xv = rng.vec(k * n_x * n_tok);
    let mut idv = Vec::new();
    for _ in 0..n_tok {
        let a = rng.below(n_exp);
        let b = (a + 1 + rng.below(n_exp - 1)) % n_exp;
        idv.extend([a as i32, b as i32]);
    }
    let mut g = Graph::new();
    let w = g.weight("w", ty, &[k, n, n_exp]).unwrap();
    let x = g.input("x", DType::F32, &[k, n_x, n_tok]).unwrap();
    let ids = g.input("ids", DType::I32, &[n_used, n_tok]).unwrap();
    let y = g.mul_mat_id(w, x, ids).unwrap();
    g.mark_output(y).unwrap();
    let mut ex = Executor::new(CpuBackend::new(2).unwrap().with_simd(simd));
    ex.bind_weight("w", ty, &[k, n, n_exp], WeightBytes::from_vec(wb.clone()))
        .unwrap();
    let (xb, ib) = (f32_bytes(&xv), i32_bytes(&idv));
    ex.run(&g, &[(x, &xb[..]), (ids, &ib[..])]).unwrap();
    let got = ex.output_f32(y).unwrap();
    assert_eq!(got.len(), n * n_used * n_tok);

    let wd = dequant(ty, &wb, k);
    let mut want = vec![0f64; got.len()];
    let eb = wb.len() / n_exp;
    for t in 0..n_tok {
        for s in 0..n_used {
            let e = idv[t * n_used + s] as usize;
            let xc = &xv[(t * n_x + s % n_x) * k..][..k];
            for r in 0..n {
                want[(t * n_used + s) * n + r] =
                    (0..k).map(|i| wd[(e * n + r) * k + i] * xc[i] as f64).sum();
            }
            // The same column alone through mul_mat on the expert's matrix: identical bits.
            let mut g1 = Graph::new();
            let w1 = g1.weight("w", ty, &[k, n]).unwrap();
            let x1 = g1.input("x", DType::F32, &[k, 1]).unwrap();
            let y1 = g1.mul_mat(w1, x1).unwrap();
            g1.mark_output(y1).unwrap();
            let mut ex1 = Executor::new(CpuBackend::new(1).unwrap().with_simd(simd));
            ex1.bind_weight(
                "w",
                ty,
                &[k, n],
                WeightBytes::from_vec(wb[e * eb..(e + 1) * eb].to_vec()),
            )
            .unwrap();
            ex1.run(&g1, &[(x1, &f32_bytes(xc)[..])]).unwrap();
            let one = ex1.output_f32(y1).unwrap();
            let col = &got[(t * n_used + s) * n..][..n];
            assert!(
                one.iter().zip(col).all(|(a, b)| a.to_bits() == b.to_bits()),
                "{ty} {simd:?} token {t} slot {s}: mul_mat_id differs from mul_mat alone"
            );
        }
    }
    // 8-bit (16-bit) activations bound the error for quantized (F16) weights, as for mul_mat.
    let bound = match ty {
        DType::F32 => 1e-10,
        DType::F16 => 1e-5,
        _ => 5e-4,
    };
    assert_close(
        &format!("mul_mat_id {ty} {simd:?} n_tok {n_tok}"),
        &got,
        &want,
        bound,
    );
}

#[test]
fn mul_mat_id_matches_reference_and_one_column_products() {
    for simd in [Simd::Scalar, rocmforge_ggml_graph::quant::detected()] {
        for ty in [
            DType::F32,
            DType::F16,
            DType::Q8_0,
            DType::Q4_K,
            DType::Q5_K,
            DType::Q6_K,
        ] {
            // Decode (one token), prefill with x shared by the slots, and x per slot (down).
            check_mul_mat_id(ty, simd, 256, 16, 1, 1);
            check_mul_mat_id(ty, simd, 256, 24, 1, 11);
            check_mul_mat_id(ty, simd, 256, 8, 2, 9);
        }
    }
}
