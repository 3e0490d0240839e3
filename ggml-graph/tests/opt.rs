//! Optimizer passes: each test shows the graph's ops before and after the pass and checks that
//! the outputs are equal (fusions to float rounding, the rest exactly).

mod common;

use common::*;
use rocmforge_ggml_graph::opt::{
    eliminate_common, eliminate_dead, fold_query_scale, fold_views, fuse, optimize,
};
use rocmforge_ggml_graph::plan::needed_nodes;
use rocmforge_ggml_graph::{DType, Graph, TensorId};

/// Names of the ops that would run, in order.
fn live_ops(g: &Graph) -> Vec<&'static str> {
    let needed = needed_nodes(g);
    g.tensors()
        .iter()
        .enumerate()
        .filter(|(i, t)| needed[*i] && !matches!(t.op, rocmforge_ggml_graph::Op::Leaf(_)))
        .map(|(_, t)| t.op.name())
        .collect()
}

struct Case {
    g: Graph,
    x: TensorId,
    outs: Vec<TensorId>,
}

/// A feed-forward block with duplicated work and nested views.
fn ffn(dup: bool) -> Case {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[64, 3]).unwrap();
    let nw = g.weight("nw", DType::F32, &[64]).unwrap();
    let wg = g.weight("wg", DType::Q4_K, &[256, 32]).unwrap();
    let wu = g.weight("wu", DType::Q4_K, &[256, 32]).unwrap();
    let wo = g.weight("wo", DType::Q8_0, &[32, 64]).unwrap();
    let bias = g.weight("bias", DType::F32, &[64]).unwrap();
    let h = g.rms_norm(x, 1e-6).unwrap();
    let h = g.mul(h, nw).unwrap();
    // Nested views: [64, 3] -> [192] -> [256, ...] is not allowed, so reshape through [192, 1].
    let r1 = g.reshape(h, &[192]).unwrap();
    let r2 = g.reshape(r1, &[64, 3]).unwrap();
    let h2 = if dup {
        let again = g.rms_norm(x, 1e-6).unwrap();
        let again = g.mul(again, nw).unwrap();
        g.add(r2, again).unwrap()
    } else {
        g.scale(r2, 2.0).unwrap()
    };
    let cat = g.concat(h2, h2, 0).unwrap(); // [128, 3]
    let cat = g.concat(cat, cat, 0).unwrap(); // [256, 3]
    let gate = g.mul_mat(wg, cat).unwrap();
    let up = g.mul_mat(wu, cat).unwrap();
    let act = g.geglu(gate, up).unwrap();
    let down = g.mul_mat(wo, act).unwrap();
    let y = g.add(down, bias).unwrap();
    let _unused = g.silu(y).unwrap();
    g.mark_output(y).unwrap();
    Case {
        g,
        x,
        outs: vec![y],
    }
}

fn weights(rng: &mut Rng) -> Vec<(&'static str, DType, Vec<usize>, Vec<u8>)> {
    vec![
        (
            "nw",
            DType::F32,
            vec![64],
            random_weights(rng, DType::F32, 64),
        ),
        (
            "wg",
            DType::Q4_K,
            vec![256, 32],
            random_weights(rng, DType::Q4_K, 256 * 32),
        ),
        (
            "wu",
            DType::Q4_K,
            vec![256, 32],
            random_weights(rng, DType::Q4_K, 256 * 32),
        ),
        (
            "wo",
            DType::Q8_0,
            vec![32, 64],
            random_weights(rng, DType::Q8_0, 32 * 64),
        ),
        (
            "bias",
            DType::F32,
            vec![64],
            random_weights(rng, DType::F32, 64),
        ),
    ]
}

fn outputs(c: &Case, g: &Graph, outs: &[TensorId]) -> Vec<Vec<f32>> {
    let mut rng = Rng::new(31);
    let w = weights(&mut rng);
    let wr: Vec<(&str, DType, &[usize], Vec<u8>)> = w
        .iter()
        .map(|(n, t, s, b)| (*n, *t, s.as_slice(), b.clone()))
        .collect();
    let xv = rng.vec(64 * 3);
    let ex = run(g, &wr, &[(c.x, f32_bytes(&xv))]);
    outs.iter().map(|&o| ex.output_f32(o).unwrap()).collect()
}

#[test]
fn cse_merges_duplicates() {
    let c = ffn(true);
    let before = live_ops(&c.g);
    let mut g = c.g.clone();
    assert_eq!(
        eliminate_common(&mut g),
        2,
        "rms_norm and mul computed twice"
    );
    let after = live_ops(&g);
    assert_eq!(before.iter().filter(|&&o| o == "rms_norm").count(), 2);
    assert_eq!(
        after.iter().filter(|&&o| o == "rms_norm").count(),
        1,
        "{after:?}"
    );
    assert_eq!(outputs(&c, &c.g, &c.outs), outputs(&c, &g, &c.outs));
}

#[test]
fn view_folding_collapses_chains() {
    let c = ffn(false);
    let mut g = c.g.clone();
    let n = fold_views(&mut g);
    assert!(n >= 2, "folded {n}");
    // The scale now reads h through a single view hop (or directly).
    let scale = g
        .tensors()
        .iter()
        .position(|t| t.op.name() == "scale")
        .unwrap();
    let src = g.tensors()[scale].src[0];
    let (root, _) = g.storage_root(src);
    let hops = {
        let mut k = 0;
        let mut cur = src;
        while let Some((p, _)) = g.tensors()[cur.index()].view_of {
            cur = p;
            k += 1;
        }
        k
    };
    assert!(hops <= 1, "{hops} view hops");
    assert_eq!(g.tensors()[root.index()].op.name(), "mul");
    assert_eq!(outputs(&c, &c.g, &c.outs), outputs(&c, &g, &c.outs));
}

#[test]
fn fusion_rewrites_norm_gate_and_bias() {
    let c = ffn(false);
    let before = live_ops(&c.g);
    let mut g = c.g.clone();
    assert_eq!(fuse(&mut g), 3);
    let after = live_ops(&g);
    assert_eq!(
        before,
        [
            "rms_norm", "mul", "view", "view", "scale", "concat", "concat", "mul_mat", "mul_mat",
            "geglu", "mul_mat", "add"
        ]
    );
    assert_eq!(
        after,
        [
            "rms_norm_mul",
            "view",
            "view",
            "scale",
            "concat",
            "concat",
            "mul_mat_geglu",
            "mul_mat_add"
        ]
    );
    let (a, b) = (outputs(&c, &c.g, &c.outs), outputs(&c, &g, &c.outs));
    let want: Vec<f64> = a[0].iter().map(|&v| v as f64).collect();
    assert_close("fused block", &b[0], &want, 1e-10);
}

#[test]
fn can_fuse_refuses_shared_or_output_producers() {
    let mut c = ffn(false);
    // Make the gate product an output: the gated fusion must not happen.
    let gate =
        c.g.tensors()
            .iter()
            .position(|t| t.op.name() == "mul_mat")
            .map(TensorId::from_index)
            .unwrap();
    c.g.mark_output(gate).unwrap();
    let mut g = c.g.clone();
    assert_eq!(fuse(&mut g), 2);
    assert!(live_ops(&g).contains(&"geglu"));
    let outs = [c.outs[0], gate];
    assert_eq!(outputs(&c, &c.g, &outs)[1], outputs(&c, &g, &outs)[1]);
}

#[test]
fn dead_nodes_are_removed_and_ids_remapped() {
    let c = ffn(true);
    let (g, map) = eliminate_dead(&c.g);
    assert!(g.len() < c.g.len(), "{} -> {}", c.g.len(), g.len());
    assert!(
        !g.tensors().iter().any(|t| t.op.name() == "silu"),
        "the unused silu is gone"
    );
    let y = map[c.outs[0].index()].unwrap();
    let c2 = Case {
        g: g.clone(),
        x: map[c.x.index()].unwrap(),
        outs: vec![y],
    };
    assert_eq!(outputs(&c, &c.g, &c.outs), outputs(&c2, &g, &[y]));
}

#[test]
fn all_passes_together() {
    let c = ffn(true);
    let mut g = c.g.clone();
    let stats = optimize(&mut g);
    assert!(
        stats.cse == 2 && stats.fused >= 2 && stats.views_folded >= 1,
        "{stats:?}"
    );
    assert!(live_ops(&g).len() < live_ops(&c.g).len());
    let (a, b) = (outputs(&c, &c.g, &c.outs), outputs(&c, &g, &c.outs));
    let want: Vec<f64> = a[0].iter().map(|&v| v as f64).collect();
    assert_close("optimized block", &b[0], &want, 1e-10);
}

/// The GPU-only query-scale fold: `attention(scale(q, s))` becomes one attention with its score
/// scale multiplied by `s` (same outputs to rounding); a scaled q that is also an output stays.
#[test]
fn query_scale_folds_into_attention() {
    for shared in [false, true] {
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &[16, 2, 1]).unwrap();
        let k = g.input("k", DType::F32, &[16, 1, 8]).unwrap();
        let v = g.input("v", DType::F32, &[16, 1, 8]).unwrap();
        let pos = g.input("pos", DType::I32, &[1]).unwrap();
        let qs = g.scale(q, 0.25).unwrap();
        let p = rocmforge_ggml_graph::AttnParams {
            scale: 0.5,
            causal: true,
            window: None,
            softcap: None,
            sinks: false,
        };
        let a = g.attention(qs, k, v, pos, None, p).unwrap();
        g.mark_output(a).unwrap();
        if shared {
            g.mark_output(qs).unwrap();
        }
        let mut rng = Rng::new(7);
        let inputs = vec![
            (q, f32_bytes(&rng.vec(32))),
            (k, f32_bytes(&rng.vec(128))),
            (v, f32_bytes(&rng.vec(128))),
            (pos, 7i32.to_le_bytes().to_vec()),
        ];
        let want = run(&g, &[], &inputs).output_f32(a).unwrap();
        let mut f = g.clone();
        let n = fold_query_scale(&mut f);
        assert_eq!(n, usize::from(!shared));
        let ops = live_ops(&f);
        assert_eq!(ops.contains(&"scale"), shared, "{ops:?}");
        let got = run(&f, &[], &inputs).output_f32(a).unwrap();
        let want64: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
        assert_close("folded attention", &got, &want64, 1e-10);
    }
}

/// The tail of a mixture-of-experts block as the model builds it: the chosen experts' outputs
/// `[n, k, nt]` times their weights, then slot 0 + slot 1, + slot 2, ... over views of the
/// product, with `residual` then plus the residual. Returns the graph, its inputs, the result
/// and the product.
fn moe_tail(
    n: usize,
    k: usize,
    nt: usize,
    residual: bool,
) -> (Graph, Vec<TensorId>, TensorId, TensorId) {
    let mut g = Graph::new();
    let experts = g.input("experts", DType::F32, &[n, k, nt]).unwrap();
    let weights = g.input("weights", DType::F32, &[k, nt]).unwrap();
    let wr = g.reshape(weights, &[1, k, nt]).unwrap();
    let prod = g.mul(experts, wr).unwrap();
    let slot = |g: &mut Graph, i: usize| g.view(prod, &[n, nt], &[n * k * 4], i * n * 4).unwrap();
    let mut out = slot(&mut g, 0);
    for i in 1..k {
        let s = slot(&mut g, i);
        out = g.add(out, s).unwrap();
    }
    let mut ins = vec![experts, weights];
    if residual {
        let r = g.input("residual", DType::F32, &[n, nt]).unwrap();
        out = g.add(out, r).unwrap();
        ins.push(r);
    }
    g.mark_output(out).unwrap();
    (g, ins, out, prod)
}

/// The bits of `out` for random inputs of mixed magnitudes (another order of the sums or a
/// fused multiply-add would show).
fn moe_tail_output(g: &Graph, ins: &[TensorId], out: TensorId, seed: u64) -> Vec<u32> {
    let mut rng = Rng::new(seed);
    let inputs: Vec<(TensorId, Vec<u8>)> = ins
        .iter()
        .map(|&i| {
            let n = g.tensors()[i.index()].nelements();
            let v: Vec<f32> = rng.vec(n).iter().map(|v| v * 1e3 * v.abs()).collect();
            (i, f32_bytes(&v))
        })
        .collect();
    let ex = run(g, &[], &inputs);
    ex.output_f32(out)
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

#[test]
fn expert_sum_fuses_into_one_node_bit_exact() {
    for (n, k, nt) in [
        (64usize, 8usize, 1usize),
        (40, 2, 3),
        (2880, 4, 5),
        (16, 3, 70),
    ] {
        for residual in [false, true] {
            let what = format!("n={n} k={k} nt={nt} residual={residual}");
            let (g0, ins, out, _) = moe_tail(n, k, nt, residual);
            let mut g = g0.clone();
            assert_eq!(fuse(&mut g), 1 + usize::from(residual), "{what}");
            assert_eq!(live_ops(&g), ["view", "moe_sum"], "{what}");
            assert_eq!(
                moe_tail_output(&g, &ins, out, 7 + n as u64),
                moe_tail_output(&g0, &ins, out, 7 + n as u64),
                "{what}: the fused sum differs from the mul and adds"
            );
        }
    }
}

#[test]
fn expert_sum_is_not_fused_when_its_parts_are_read() {
    // The weighted outputs are read besides the slot views (a debugging output).
    let (mut g, _, _, prod) = moe_tail(32, 4, 2, false);
    g.mark_output(prod).unwrap();
    assert_eq!(fuse(&mut g), 0);
    // The sum before the residual is an output: the residual stays a separate add.
    let (mut g, _, out, _) = moe_tail(32, 4, 2, true);
    let sum = g.tensors()[out.index()].src[0];
    g.mark_output(sum).unwrap();
    assert_eq!(fuse(&mut g), 1);
    assert_eq!(live_ops(&g), ["view", "moe_sum", "add"]);
    // A partial sum is an output.
    let (mut g, ..) = moe_tail(32, 4, 2, false);
    let first_add = g
        .tensors()
        .iter()
        .position(|t| t.op.name() == "add")
        .unwrap();
    g.mark_output(TensorId::from_index(first_add)).unwrap();
    assert_eq!(fuse(&mut g), 0);
    // Fewer slot views than the product has slots: not the whole sum.
    let mut g = Graph::new();
    let e = g.input("experts", DType::F32, &[8, 3, 1]).unwrap();
    let w = g.input("weights", DType::F32, &[1, 3, 1]).unwrap();
    let p = g.mul(e, w).unwrap();
    let s0 = g.view(p, &[8, 1], &[96], 0).unwrap();
    let s1 = g.view(p, &[8, 1], &[96], 32).unwrap();
    let y = g.add(s0, s1).unwrap();
    g.mark_output(y).unwrap();
    assert_eq!(fuse(&mut g), 0);
}
