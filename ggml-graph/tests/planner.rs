//! Memory planner properties on random graphs: simultaneously live tensors never overlap, peak is
//! at most the sum of sizes, and executing a planned graph equals a reference computed op by op.

use proptest::prelude::*;
use rocmforge_ggml_graph::plan::{is_arena_root, plan, plan_grouped};
use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, TensorId};

/// Builds a random chain/DAG of elementwise, norm, view and matmul nodes over two inputs.
fn random_graph(ops: &[(u8, usize, usize)]) -> Graph {
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &[16, 4]).unwrap();
    let b = g.input("b", DType::F32, &[16, 4]).unwrap();
    let w = g.weight("w", DType::F32, &[16, 16]).unwrap();
    let mut pool: Vec<TensorId> = vec![a, b];
    for &(op, i, j) in ops {
        let x = pool[i % pool.len()];
        let y = pool[j % pool.len()];
        let t = match op % 6 {
            0 => g.add(x, y),
            1 => g.mul(x, y),
            2 => g.rms_norm(x, 1e-6),
            3 => g.mul_mat(w, x),
            4 => g.reshape(x, &[64]).and_then(|r| g.reshape(r, &[16, 4])),
            _ => g.silu(x),
        }
        .unwrap();
        pool.push(t);
    }
    // A few outputs, including the last node.
    let last = *pool.last().unwrap();
    g.mark_output(last).unwrap();
    if pool.len() > 4 {
        g.mark_output(pool[pool.len() / 2]).unwrap();
    }
    g
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]
    #[test]
    fn live_ranges_never_overlap(ops in prop::collection::vec((0u8..6, 0usize..64, 0usize..64), 1..40)) {
        let g = random_graph(&ops);
        let p = plan(&g);
        let roots: Vec<usize> = (0..g.len())
            .filter(|&i| p.needed[i] && is_arena_root(&g, TensorId::from_index(i)))
            .collect();
        let sum: usize = roots.iter().map(|&i| g.tensors()[i].dense_bytes().div_ceil(64) * 64).sum();
        prop_assert!(p.peak <= sum, "peak {} > sum {}", p.peak, sum);
        prop_assert_eq!(sum, p.total);
        for (x, &i) in roots.iter().enumerate() {
            for &j in &roots[x + 1..] {
                let (bi, di) = p.live[i].unwrap();
                let (bj, dj) = p.live[j].unwrap();
                let overlap_time = bi <= dj && bj <= di;
                let (oi, oj) = (p.offset[i].unwrap(), p.offset[j].unwrap());
                let (si, sj) = (g.tensors()[i].dense_bytes(), g.tensors()[j].dense_bytes());
                let overlap_mem = oi < oj + sj && oj < oi + si;
                // A node placed in place over its operand shares its bytes by design.
                let handover = p.in_place[j] == Some(i) || p.in_place[i] == Some(j);
                prop_assert!(handover || !(overlap_time && overlap_mem), "tensors {} and {} overlap", i, j);
            }
        }
    }
}

#[test]
fn reuse_makes_peak_smaller_than_total() {
    let ops: Vec<(u8, usize, usize)> = (0..20).map(|i| (5, i + 1, 0)).collect();
    let g = random_graph(&ops);
    let p = plan(&g);
    assert!(p.peak * 4 <= p.total, "peak {} total {}", p.peak, p.total);
}

#[test]
fn elementwise_chain_runs_in_place() {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[1024, 4]).unwrap();
    let a = g.silu(x).unwrap();
    let b = g.scale(a, 0.5).unwrap();
    let c = g.rms_norm(b, 1e-6).unwrap();
    let d = g.add(c, x).unwrap(); // x is still read here, so nothing before may overwrite it
    let e = g.gelu(d).unwrap();
    g.mark_output(e).unwrap();
    let p = plan(&g);
    let in_place: Vec<bool> = [a, b, c, d, e]
        .iter()
        .map(|t| p.in_place[t.index()].is_some())
        .collect();
    assert_eq!(in_place, [false, true, true, true, true]);
    // x and one working buffer.
    assert_eq!(p.peak, 2 * 1024 * 4 * 4);

    // The in-place chain computes what the ops compute one by one.
    let xv: Vec<f32> = (0..4096)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0)
        .collect();
    let mut ex = Executor::new(CpuBackend::new(1).unwrap());
    ex.run(&g, &[(x, bytemuck::cast_slice(&xv))]).unwrap();
    let got = ex.output_f32(e).unwrap();
    let silu = |v: f64| v / (1.0 + (-v).exp());
    // ggml's CPU GELU: f16 input, f16 result.
    let gelu = |v: f64| {
        let h = half::f16::from_f64(v).to_f64();
        let y = 0.5
            * h
            * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (h + 0.044715 * h * h * h)).tanh());
        half::f16::from_f64(y).to_f64()
    };
    for (r, (grow, xrow)) in got.chunks(1024).zip(xv.chunks(1024)).enumerate() {
        let b: Vec<f64> = xrow.iter().map(|&v| silu(v as f64) * 0.5).collect();
        let rms = (b.iter().map(|v| v * v).sum::<f64>() / 1024.0 + 1e-6).sqrt();
        for (i, (&g, &xi)) in grow.iter().zip(xrow).enumerate() {
            let want = gelu(b[i] / rms + xi as f64);
            assert!(
                (g as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                "row {r} col {i}: {g} vs {want}"
            );
        }
    }
}

/// Nodes that may run as one launch (a group) never write where another of them reads: two
/// independent chains (`qn = silu(q)`, `rq = scale(qn)` and the same for k), grouped as one
/// launch of all four, keep every operand and result apart, while the plain plan reuses the first
/// chain's dead bytes for the second's results.
#[test]
fn grouped_nodes_never_overlap_each_others_operands() {
    let mut g = Graph::new();
    let q = g.input("q", DType::F32, &[256]).unwrap();
    let k = g.input("k", DType::F32, &[256]).unwrap();
    let qn = g.silu(q).unwrap();
    let kn = g.silu(k).unwrap();
    let rq = g.scale(qn, 0.5).unwrap();
    let rk = g.scale(kn, 0.5).unwrap();
    let s = g.add(rq, rk).unwrap();
    g.mark_output(s).unwrap();
    let overlaps = |p: &rocmforge_ggml_graph::Plan, ids: &[TensorId]| {
        let mut pairs = Vec::new();
        for (x, &a) in ids.iter().enumerate() {
            for &b in &ids[x + 1..] {
                let (oa, ob) = (p.offset[a.index()].unwrap(), p.offset[b.index()].unwrap());
                let (sa, sb) = (
                    g.tensors()[a.index()].dense_bytes(),
                    g.tensors()[b.index()].dense_bytes(),
                );
                if oa < ob + sb && ob < oa + sa {
                    pairs.push((a, b));
                }
            }
        }
        pairs
    };
    let all = [q, k, qn, kn, rq, rk];
    assert!(
        !overlaps(&plan(&g), &all).is_empty(),
        "the plain plan reuses bytes within the chains"
    );
    let p = plan_grouped(&g, &[vec![qn, kn, rq, rk]]);
    assert_eq!(overlaps(&p, &all), vec![]);
    assert!(all.iter().all(|t| p.in_place[t.index()].is_none()));
}
