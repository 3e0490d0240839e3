//! What batching many sequences in one pass relies on, bit for bit: a mat-mul over N activation
//! columns gives each column the bits of the one-column product, and paged attention over a
//! block pool gives each token the bits of the contiguous attention of its sequence alone.

#![allow(
    clippy::needless_range_loop,
    reason = "the references index several arrays in lockstep"
)]

mod common;

use common::*;
use rocmforge_ggml_graph::quant::Simd;
use rocmforge_ggml_graph::{AttnParams, CpuBackend, DType, Executor, Graph, WeightBytes};

fn mul_mat(
    simd: Simd,
    ty: DType,
    wb: &[u8],
    (k, n): (usize, usize),
    x: &[f32],
    layout: Option<Vec<(u32, u32)>>,
) -> Vec<f32> {
    let m = x.len() / k;
    let mut g = Graph::new();
    let w = g.weight("w", ty, &[k, n]).unwrap();
    let xi = g.input("x", DType::F32, &[k, m]).unwrap();
    let y = g.mul_mat(w, xi).unwrap();
    g.mark_output(y).unwrap();
    let mut ex = Executor::new(CpuBackend::new(2).unwrap().with_simd(simd));
    ex.backend().set_column_layout(layout);
    ex.bind_weight("w", ty, &[k, n], WeightBytes::from_vec(wb.to_vec()))
        .unwrap();
    ex.run(&g, &[(xi, &f32_bytes(x))]).unwrap();
    ex.output_f32(y).unwrap()
}

fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// The x86 tile kernels sum K-quant products in an order that depends on the column count, as
/// llama.cpp does (Q4_K: repacked gemm in whole groups of four columns, mat-vec for the rest;
/// Q5_K/Q6_K: tiled from 8 columns), so a batch of N columns is not N one-column products
/// bit for bit. With a column layout each column gets the bits of the product it names: here
/// segments of 3, 1 and 9 columns (three sequences) in one product of 13 columns, and 13
/// decode tokens (each its own one-column product).
#[test]
fn mul_mat_columns_follow_the_column_layout() {
    let mut rng = Rng::new(21);
    let types = [
        DType::F32,
        DType::F16,
        DType::Q4_0,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];
    let simds = [
        Simd::Scalar,
        Simd::Avx2,
        rocmforge_ggml_graph::quant::detected(),
    ];
    let (k, n) = (512, 40);
    for simd in simds {
        for ty in types {
            let wb = random_weights(&mut rng, ty, k * n);
            let segs = [3usize, 1, 9];
            let m: usize = segs.iter().sum();
            let x = rng.vec(k * m);
            let layout: Vec<(u32, u32)> = segs
                .iter()
                .flat_map(|&c| (0..c).map(move |i| (c as u32, i as u32)))
                .collect();
            let all = mul_mat(simd, ty, &wb, (k, n), &x, Some(layout));
            let mut c0 = 0;
            for c in segs {
                let alone = mul_mat(simd, ty, &wb, (k, n), &x[c0 * k..(c0 + c) * k], None);
                let got = &all[c0 * n..(c0 + c) * n];
                assert!(
                    same_bits(got, &alone),
                    "{ty} {simd:?}: segment of {c} at {c0}"
                );
                c0 += c;
            }
            let singles = mul_mat(simd, ty, &wb, (k, n), &x, Some(vec![(1, 0); m]));
            for col in 0..m {
                let alone = mul_mat(simd, ty, &wb, (k, n), &x[col * k..(col + 1) * k], None);
                let got = &singles[col * n..(col + 1) * n];
                assert!(same_bits(got, &alone), "{ty} {simd:?}: decode column {col}");
            }
        }
    }
}

/// Contiguous attention of one sequence alone: `t` query tokens at positions `pos` over its
/// keys/values `[d, hkv, n_kv]` written through an `ty` cache.
#[allow(clippy::too_many_arguments)]
fn contiguous(
    ty: DType,
    p: AttnParams,
    (d, hq, hkv): (usize, usize, usize),
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos: &[i32],
) -> Vec<f32> {
    let (t, n_kv) = (pos.len(), k.len() / (d * hkv));
    let mut g = Graph::new();
    let qi = g.input("q", DType::F32, &[d, hq, t]).unwrap();
    let ki = g.input("k", DType::F32, &[d * hkv, n_kv]).unwrap();
    let vi = g.input("v", DType::F32, &[d * hkv, n_kv]).unwrap();
    let pi = g.input("pos", DType::I32, &[t]).unwrap();
    let kc = g.persistent("kc", ty, &[d * hkv, n_kv]).unwrap();
    let vc = g.persistent("vc", ty, &[d * hkv, n_kv]).unwrap();
    let kw = g.cpy(ki, kc).unwrap();
    let vw = g.cpy(vi, vc).unwrap();
    let es = ty.type_size();
    let kv = g
        .view(kw, &[d, hkv, n_kv], &[d * es, d * hkv * es], 0)
        .unwrap();
    let vv = g
        .view(vw, &[d, hkv, n_kv], &[d * es, d * hkv * es], 0)
        .unwrap();
    let y = g.attention(qi, kv, vv, pi, None, p).unwrap();
    g.mark_output(y).unwrap();
    let ex = run(
        &g,
        &[],
        &[
            (qi, f32_bytes(q)),
            (ki, f32_bytes(k)),
            (vi, f32_bytes(v)),
            (pi, i32_bytes(pos)),
        ],
    );
    ex.output_f32(y).unwrap()
}

#[test]
fn paged_attention_equals_each_sequence_alone() {
    let mut rng = Rng::new(22);
    let (d, hq, hkv, bs) = (32, 4, 2, 4);
    let n_blocks = 12;
    for (ty, window) in [
        (DType::F16, None),
        (DType::F16, Some(5)),
        (DType::F32, Some(3)),
    ] {
        let p = AttnParams {
            scale: 0.3,
            causal: true,
            window,
            softcap: None,
            sinks: false,
        };
        // Sequence 0: a prefill chunk of 3 tokens at positions 6..9 (10 positions cached);
        // sequence 1: one decode token at position 12 (13 positions).
        let lens = [9usize, 13];
        let chunks: [&[i32]; 2] = [&[6, 7, 8], &[12]];
        let tables: [Vec<i32>; 2] = [vec![7, 2, 9], vec![0, 11, 4, 5]];
        let kvs: Vec<(Vec<f32>, Vec<f32>)> = lens
            .iter()
            .map(|&n| (rng.vec(d * hkv * n), rng.vec(d * hkv * n)))
            .collect();
        let qs: Vec<Vec<f32>> = chunks.iter().map(|c| rng.vec(d * hq * c.len())).collect();
        let alone: Vec<Vec<f32>> = (0..2)
            .map(|s| contiguous(ty, p, (d, hq, hkv), &qs[s], &kvs[s].0, &kvs[s].1, chunks[s]))
            .collect();
        // The pool: every position of both sequences scattered by their block tables.
        let n_slots = n_blocks * bs;
        let mut kp = vec![0f32; d * hkv * n_slots];
        let mut vp = vec![0f32; d * hkv * n_slots];
        let row = d * hkv;
        for s in 0..2 {
            for j in 0..lens[s] {
                let slot = tables[s][j / bs] as usize * bs + j % bs;
                kp[slot * row..(slot + 1) * row].copy_from_slice(&kvs[s].0[j * row..(j + 1) * row]);
                vp[slot * row..(slot + 1) * row].copy_from_slice(&kvs[s].1[j * row..(j + 1) * row]);
            }
        }
        let q: Vec<f32> = qs.concat();
        let pos: Vec<i32> = chunks.concat();
        let seq = [0, 0, 0, 0, 0, 0, 1, 1];
        let max_blocks = 4;
        let mut tab = vec![0i32; max_blocks * 2];
        for s in 0..2 {
            tab[s * max_blocks..s * max_blocks + tables[s].len()].copy_from_slice(&tables[s]);
        }
        let t = pos.len();
        let mut g = Graph::new();
        let qi = g.input("q", DType::F32, &[d, hq, t]).unwrap();
        let ki = g.input("k", DType::F32, &[row, n_slots]).unwrap();
        let vi = g.input("v", DType::F32, &[row, n_slots]).unwrap();
        let pi = g.input("pos", DType::I32, &[t]).unwrap();
        let si = g.input("seq", DType::I32, &[2, t]).unwrap();
        let ti = g.input("tables", DType::I32, &[max_blocks, 2]).unwrap();
        let kc = g.persistent("kc", ty, &[row, n_slots]).unwrap();
        let vc = g.persistent("vc", ty, &[row, n_slots]).unwrap();
        let kw = g.cpy(ki, kc).unwrap();
        let vw = g.cpy(vi, vc).unwrap();
        let es = ty.type_size();
        let kv = g
            .view(kw, &[d, hkv, n_slots], &[d * es, row * es], 0)
            .unwrap();
        let vv = g
            .view(vw, &[d, hkv, n_slots], &[d * es, row * es], 0)
            .unwrap();
        let y = g.paged_attention(qi, kv, vv, pi, si, ti, p, bs).unwrap();
        g.mark_output(y).unwrap();
        let inputs = |tab: &[i32]| {
            vec![
                (qi, f32_bytes(&q)),
                (ki, f32_bytes(&kp)),
                (vi, f32_bytes(&vp)),
                (pi, i32_bytes(&pos)),
                (si, i32_bytes(&seq)),
                (ti, i32_bytes(tab)),
            ]
        };
        let ex = run(&g, &[], &inputs(&tab));
        let got = ex.output_f32(y).unwrap();
        let want: Vec<f32> = alone.concat();
        let same = got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{ty} window {window:?}: paged differs from alone");
        // A table entry outside the pool is an error, not a panic.
        let mut bad = tab.clone();
        bad[1] = n_blocks as i32;
        let mut ex = Executor::new(CpuBackend::new(1).unwrap());
        let owned = inputs(&bad);
        let refs: Vec<_> = owned.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        assert!(ex.run(&g, &refs).is_err());
    }
}
