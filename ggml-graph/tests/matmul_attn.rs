//! mul_mat for every weight type against a dequantize-then-f64 reference, fused attention against
//! a naive masked softmax, and KV-cache writes that persist across runs.

#![allow(
    clippy::needless_range_loop,
    reason = "references index several arrays in lockstep"
)]

mod common;

use common::*;
use rocmforge_ggml_graph::quant::Simd;
use rocmforge_ggml_graph::{AttnParams, CpuBackend, DType, Executor, Graph, WeightBytes};

const WEIGHT_TYPES: [DType; 13] = [
    DType::F32,
    DType::F16,
    DType::BF16,
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
];

fn mat_ref(w: &[f64], x: &[f32], k: usize, n: usize, m: usize) -> Vec<f64> {
    let mut out = vec![0.0; n * m];
    for col in 0..m {
        for row in 0..n {
            out[col * n + row] = (0..k).map(|i| w[row * k + i] * x[col * k + i] as f64).sum();
        }
    }
    out
}

fn check_mul_mat(simd: Simd) {
    let mut rng = Rng::new(10);
    for ty in WEIGHT_TYPES {
        for (k, n, m) in [(256, 5, 1), (512, 33, 3), (256, 17, 8)] {
            let wb = random_weights(&mut rng, ty, k * n);
            let xv = rng.vec(k * m);
            let mut g = Graph::new();
            let w = g.weight("w", ty, &[k, n]).unwrap();
            let x = g.input("x", DType::F32, &[k, m]).unwrap();
            let y = g.mul_mat(w, x).unwrap();
            g.mark_output(y).unwrap();
            let mut ex = Executor::new(CpuBackend::new(2).unwrap().with_simd(simd));
            ex.bind_weight("w", ty, &[k, n], WeightBytes::from_vec(wb.clone()))
                .unwrap();
            ex.run(&g, &[(x, &f32_bytes(&xv))]).unwrap();
            let want = mat_ref(&dequant(ty, &wb, k), &xv, k, n, m);
            // 8-bit activations bound the error for quantized weights (ggml uses 5e-4 too).
            let bound = if ty.is_quantized() {
                5e-4
            } else if ty == DType::F32 {
                1e-10
            } else {
                1e-5
            };
            assert_close(
                &format!("mul_mat {ty} {k}x{n}x{m} {simd:?}"),
                &ex.output_f32(y).unwrap(),
                &want,
                bound,
            );
        }
    }
}

#[test]
fn mul_mat_every_type_scalar() {
    check_mul_mat(Simd::Scalar);
}

#[test]
fn mul_mat_every_type_simd() {
    check_mul_mat(Simd::Avx2);
    check_mul_mat(rocmforge_ggml_graph::quant::detected());
}

#[test]
fn mul_mat_batched_broadcast() {
    let mut rng = Rng::new(11);
    let (k, n, m, wb2, xb2) = (64, 6, 3, 2, 4);
    let wv = rng.vec(k * n * wb2);
    let xv = rng.vec(k * m * xb2);
    let mut g = Graph::new();
    let w = g.weight("w", DType::F32, &[k, n, wb2]).unwrap();
    let x = g.input("x", DType::F32, &[k, m, xb2]).unwrap();
    let y = g.mul_mat(w, x).unwrap();
    g.mark_output(y).unwrap();
    let ex = run(
        &g,
        &[("w", DType::F32, &[k, n, wb2], f32_bytes(&wv))],
        &[(x, f32_bytes(&xv))],
    );
    let mut want = Vec::new();
    for b in 0..xb2 {
        let wb = b / (xb2 / wb2);
        let w64: Vec<f64> = wv[wb * k * n..(wb + 1) * k * n]
            .iter()
            .map(|&v| v as f64)
            .collect();
        want.extend(mat_ref(&w64, &xv[b * k * m..(b + 1) * k * m], k, n, m));
    }
    assert_close("batched mul_mat", &ex.output_f32(y).unwrap(), &want, 1e-10);
}

/// Naive attention: q `[d, hq, t]`, k/v `[d, hkv, n_kv]` (f32 values), positions per query.
#[allow(
    clippy::too_many_arguments,
    reason = "a reference mirrors the op's operands"
)]
fn attn_ref(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    pos: &[i32],
    (d, hq, hkv, n_kv): (usize, usize, usize, usize),
    p: AttnParams,
    mask: Option<&[f32]>,
    half_prec: bool,
) -> Vec<f64> {
    let t = pos.len();
    let mut out = vec![0.0; d * hq * t];
    for tok in 0..t {
        for h in 0..hq {
            let kh = h / (hq / hkv);
            let qp = pos[tok] as usize;
            let mut scores = vec![f64::NEG_INFINITY; n_kv];
            for (j, s) in scores.iter_mut().enumerate() {
                let visible = (!p.causal || j <= qp) && p.window.is_none_or(|w| qp < j + w);
                if !visible {
                    continue;
                }
                // With an f16 cache llama.cpp's CPU path rounds q (and below the
                // probabilities) to f16 for its f16 products.
                let qf = |x: f32| {
                    if half_prec {
                        half::f16::from_f32(x).to_f64()
                    } else {
                        x as f64
                    }
                };
                let dot: f64 = (0..d)
                    .map(|i| qf(q[(tok * hq + h) * d + i]) * k[(j * hkv + kh) * d + i] as f64)
                    .sum();
                let mut sc = dot * p.scale as f64;
                if let Some(c) = p.softcap {
                    sc = c as f64 * (sc / c as f64).tanh();
                }
                *s = sc + mask.map_or(0.0, |m| m[tok * n_kv + j] as f64);
            }
            let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - mx).exp()).sum();
            let probs: Vec<f64> = scores
                .iter()
                .map(|s| {
                    let pr = (s - mx).exp() / sum;
                    if half_prec {
                        half::f16::from_f64(pr).to_f64()
                    } else {
                        pr
                    }
                })
                .collect();
            for i in 0..d {
                out[(tok * hq + h) * d + i] = (0..n_kv)
                    .map(|j| probs[j] * v[(j * hkv + kh) * d + i] as f64)
                    .sum();
            }
        }
    }
    out
}

#[test]
fn attention_gqa_causal_window_f16_cache() {
    let mut rng = Rng::new(12);
    for (kv_ty, window, with_mask, softcap) in [
        (DType::F32, None, false, None),
        (DType::F16, Some(3), false, None),
        (DType::F32, None, true, None),
        (DType::F32, None, true, Some(0.5)),
        (DType::F16, None, false, Some(0.7)),
    ] {
        let (d, hq, hkv, n_kv, t) = (32, 4, 2, 9, 3);
        let qv = rng.vec(d * hq * t);
        let kv = rng.vec(d * hkv * n_kv);
        let vv = rng.vec(d * hkv * n_kv);
        let mv = rng.vec(n_kv * t);
        let pos = [5, 6, 8];
        let p = AttnParams {
            scale: 1.0 / (d as f32).sqrt(),
            causal: true,
            window,
            softcap,
            sinks: false,
        };
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &[d, hq, t]).unwrap();
        let k = g.input("k", DType::F32, &[d, hkv, n_kv]).unwrap();
        let v = g.input("v", DType::F32, &[d, hkv, n_kv]).unwrap();
        let ps = g.input("pos", DType::I32, &[t]).unwrap();
        let m = g.input("mask", DType::F32, &[n_kv, t]).unwrap();
        // Round trip through a cache of the chosen type, as a model does.
        let kc = g.persistent("kc", kv_ty, &[d * hkv, n_kv]).unwrap();
        let vc = g.persistent("vc", kv_ty, &[d * hkv, n_kv]).unwrap();
        let k2 = g.reshape(k, &[d * hkv, n_kv]).unwrap();
        let v2 = g.reshape(v, &[d * hkv, n_kv]).unwrap();
        let kw = g.cpy(k2, kc).unwrap();
        let vw = g.cpy(v2, vc).unwrap();
        let es = kv_ty.type_size();
        let kview = g
            .view(kw, &[d, hkv, n_kv], &[d * es, d * hkv * es], 0)
            .unwrap();
        let vview = g
            .view(vw, &[d, hkv, n_kv], &[d * es, d * hkv * es], 0)
            .unwrap();
        let y = g
            .attention(q, kview, vview, ps, with_mask.then_some(m), p)
            .unwrap();
        g.mark_output(y).unwrap();
        let ex = run(
            &g,
            &[],
            &[
                (q, f32_bytes(&qv)),
                (k, f32_bytes(&kv)),
                (v, f32_bytes(&vv)),
                (ps, i32_bytes(&pos)),
                (m, f32_bytes(&mv)),
            ],
        );
        let round = |x: &[f32]| -> Vec<f32> {
            if kv_ty == DType::F16 {
                x.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect()
            } else {
                x.to_vec()
            }
        };
        let want = attn_ref(
            &qv,
            &round(&kv),
            &round(&vv),
            &pos,
            (d, hq, hkv, n_kv),
            p,
            with_mask.then_some(&mv[..]),
            kv_ty == DType::F16,
        );
        assert_close(
            &format!("attention {kv_ty} {window:?} softcap {softcap:?}"),
            &ex.output_f32(y).unwrap(),
            &want,
            1e-9,
        );
    }
}

#[test]
fn kv_rows_persist_across_runs() {
    let (k, rows) = (8, 6);
    let mut ex = Executor::new(CpuBackend::new(1).unwrap());
    let mut rng = Rng::new(13);
    let mut expect = vec![0.0f32; k * rows];
    for step in 0..3 {
        let n = step + 1;
        let src = rng.vec(k * n);
        let idx: Vec<i32> = (0..n).map(|i| ((step * 2 + i) % rows) as i32).collect();
        let mut g = Graph::new();
        let cache = g.persistent("cache", DType::F16, &[k, rows]).unwrap();
        let s = g.input("src", DType::F32, &[k, n]).unwrap();
        let i = g.input("idx", DType::I32, &[n]).unwrap();
        let w = g.set_rows(cache, s, i).unwrap();
        let all = g.cont(w).unwrap();
        g.mark_output(all).unwrap();
        ex.run(&g, &[(s, &f32_bytes(&src)), (i, &i32_bytes(&idx))])
            .unwrap();
        for (j, &r) in idx.iter().enumerate() {
            for c in 0..k {
                expect[r as usize * k + c] = half::f16::from_f32(src[j * k + c]).to_f32();
            }
        }
        let got = ex.output_f32(all).unwrap();
        assert_eq!(got, expect, "step {step}");
    }
    // A graph that only writes the cache still runs the write.
    let mut g = Graph::new();
    let cache = g.persistent("cache", DType::F16, &[k, rows]).unwrap();
    let s = g.input("src", DType::F32, &[k, 1]).unwrap();
    let i = g.input("idx", DType::I32, &[1]).unwrap();
    g.set_rows(cache, s, i).unwrap();
    ex.run(&g, &[(s, &f32_bytes(&[7.0; 8])), (i, &i32_bytes(&[5]))])
        .unwrap();
    let bytes = ex.persistent_bytes("cache").unwrap();
    assert_eq!(
        half::f16::from_le_bytes([bytes[5 * 16], bytes[5 * 16 + 1]]).to_f32(),
        7.0
    );
    // Out-of-range rows are an error, not a panic.
    assert!(ex
        .run(&g, &[(s, &f32_bytes(&[7.0; 8])), (i, &i32_bytes(&[6]))])
        .is_err());
}
