//! A Q8_0 KV cache: `set_rows` quantizes rows as ggml's reference quantizer does, and the
//! attention ops read them dequantized, so attention over a Q8_0 cache gives the bits of
//! attention over an f32 cache holding the dequantized rows (the same sums in the same order).

mod common;

use common::*;
use rocmforge_ggml_graph::quant::Simd;
use rocmforge_ggml_graph::{AttnParams, CpuBackend, DType, Executor, Graph};

/// Heads, KV heads and head size of the tests (head size a multiple of 32 and 16).
const D: usize = 64;
const HQ: usize = 4;
const HKV: usize = 2;

/// Attention of `pos.len()` query tokens over `n` cached rows of keys and values written with
/// `set_rows` into a cache of `ty`: contiguous (rows 0..n) or, with `paged = Some((bs, table))`,
/// a pool whose position `j` sits in slot `table[j / bs] * bs + j % bs`.
fn attend(
    ty: DType,
    simd: Simd,
    p: AttnParams,
    (q, k, v, pos): (&[f32], &[f32], &[f32], &[i32]),
    paged: Option<(usize, &[i32])>,
) -> Vec<f32> {
    let row = D * HKV;
    let (t, n) = (pos.len(), k.len() / row);
    let (n_slots, slots): (usize, Vec<i32>) = match paged {
        None => (n, (0..n as i32).collect()),
        Some((bs, table)) => (
            (*table.iter().max().unwrap_or(&0) as usize + 1) * bs,
            (0..n)
                .map(|j| (table[j / bs] as usize * bs + j % bs) as i32)
                .collect(),
        ),
    };
    let mut g = Graph::new();
    let qi = g.input("q", DType::F32, &[D, HQ, t]).unwrap();
    let ki = g.input("k", DType::F32, &[row, n]).unwrap();
    let vi = g.input("v", DType::F32, &[row, n]).unwrap();
    let si = g.input("slots", DType::I32, &[n]).unwrap();
    let pi = g.input("pos", DType::I32, &[t]).unwrap();
    let kc = g.persistent("kc", ty, &[row, n_slots]).unwrap();
    let vc = g.persistent("vc", ty, &[row, n_slots]).unwrap();
    let kw = g.set_rows(kc, ki, si).unwrap();
    let vw = g.set_rows(vc, vi, si).unwrap();
    let rb = D / ty.block_size() * ty.type_size();
    let kv = g.view(kw, &[D, HKV, n_slots], &[rb, rb * HKV], 0).unwrap();
    let vv = g.view(vw, &[D, HKV, n_slots], &[rb, rb * HKV], 0).unwrap();
    let mut inputs = vec![
        (qi, f32_bytes(q)),
        (ki, f32_bytes(k)),
        (vi, f32_bytes(v)),
        (si, i32_bytes(&slots)),
        (pi, i32_bytes(pos)),
    ];
    let y = match paged {
        None => g.attention(qi, kv, vv, pi, None, p).unwrap(),
        Some((bs, table)) => {
            let seq: Vec<i32> = (0..t).flat_map(|_| [0, i32::from(t == 1)]).collect();
            let sq = g.input("seq", DType::I32, &[2, t]).unwrap();
            let tb = g.input("tables", DType::I32, &[table.len(), 1]).unwrap();
            inputs.push((sq, i32_bytes(&seq)));
            inputs.push((tb, i32_bytes(table)));
            g.paged_attention(qi, kv, vv, pi, sq, tb, p, bs).unwrap()
        }
    };
    g.mark_output(y).unwrap();
    let mut ex = Executor::new(CpuBackend::new(2).unwrap().with_simd(simd));
    let ins: Vec<_> = inputs.iter().map(|(i, b)| (*i, b.as_slice())).collect();
    ex.run(&g, &ins).unwrap();
    ex.output_f32(y).unwrap()
}

/// `x` through Q8_0 and back, as the cache holds it.
fn through_q8_0(x: &[f32]) -> Vec<f32> {
    let q = gguf::quantize(DType::Q8_0, x).unwrap();
    gguf::dequantize_to_vec(DType::Q8_0, &q).unwrap()
}

#[test]
fn q8_0_cache_attention_equals_f32_attention_on_the_dequantized_rows() {
    let mut rng = Rng::new(44);
    let n = 37;
    let (k, v) = (rng.vec(D * HKV * n), rng.vec(D * HKV * n));
    let (kd, vd) = (through_q8_0(&k), through_q8_0(&v));
    assert_ne!(
        k, kd,
        "the quantization must change the rows for the test to mean anything"
    );
    let table = [5i32, 0, 7];
    for simd in [
        Simd::Scalar,
        Simd::Avx2,
        rocmforge_ggml_graph::quant::detected(),
    ] {
        for window in [None, Some(9)] {
            let p = AttnParams {
                scale: 0.125,
                causal: true,
                window,
                softcap: None,
                sinks: false,
            };
            // One decode token and a chunk of four, each contiguous and paged.
            for pos in [vec![36i32], vec![20, 21, 22, 23]] {
                let q = rng.vec(D * HQ * pos.len());
                for paged in [None, Some((16usize, &table[..]))] {
                    let got = attend(DType::Q8_0, simd, p, (&q, &k, &v, &pos), paged);
                    let want = attend(DType::F32, simd, p, (&q, &kd, &vd, &pos), paged);
                    assert!(
                        got.iter()
                            .zip(&want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{simd:?} window {window:?} pos {pos:?} paged {}",
                        paged.is_some()
                    );
                    // And close to attention over the exact rows (Q8_0 keeps ~2 decimal digits).
                    let exact = attend(DType::F32, simd, p, (&q, &k, &v, &pos), paged);
                    let want64: Vec<f64> = exact.iter().map(|&x| x as f64).collect();
                    assert_close("q8_0 vs exact", &got, &want64, 1e-3);
                }
            }
        }
    }
}

#[test]
fn q8_0_cache_rows_must_be_whole_blocks() {
    let mut g = Graph::new();
    let kc = g.persistent("kc", DType::Q8_0, &[48, 4]);
    // 48 values is no whole number of 32-value blocks: refused at graph build, not at run.
    assert!(kc.is_err());
    let kc = g.persistent("kc2", DType::Q8_0, &[64, 4]).unwrap();
    let src = g.input("x", DType::F32, &[64, 2]).unwrap();
    let idx = g.input("i", DType::I32, &[2]).unwrap();
    assert!(g.set_rows(kc, src, idx).is_ok());
    let q = g.input("q", DType::F32, &[32, 2, 1]).unwrap();
    let pos = g.input("pos", DType::I32, &[1]).unwrap();
    let kv = g.view(kc, &[32, 2, 4], &[34, 68], 0).unwrap();
    let p = AttnParams {
        scale: 1.0,
        causal: true,
        window: None,
        softcap: None,
        sinks: false,
    };
    assert!(g.attention(q, kv, kv, pos, None, p).is_ok());
}
