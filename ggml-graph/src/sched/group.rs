//! Launch groups: runs of consecutive scheduled nodes a device may take as one launch.

use crate::graph::Graph;
use crate::tensor::{Op, Tensor, TensorId};

/// Launched nodes per layer of a llama-family decode step, in scheduled order (see
/// [`stack_run`]).
pub const STACK_LAYER_NODES: usize = 13;

/// `id`, then each tensor it is a view of, down to its storage root.
fn view_chain(nodes: &[Tensor], id: TensorId) -> impl Iterator<Item = TensorId> + '_ {
    std::iter::successors(Some(id), |&i| nodes[i.index()].view_of.map(|(p, _)| p))
}

/// True when `s` is `x` or a view of it.
fn is_view_of(nodes: &[Tensor], s: TensorId, x: TensorId) -> bool {
    view_chain(nodes, s).any(|v| v == x)
}

/// True when operand `at` of node `id` is `x` or a view of it.
fn operand_is(nodes: &[Tensor], id: TensorId, at: usize, x: TensorId) -> bool {
    nodes[id.index()]
        .src
        .get(at)
        .is_some_and(|&s| is_view_of(nodes, s, x))
}

/// Length of the run of nodes at the start of `ids` that a device may launch as one (see
/// [`crate::backend::Device::launch_group`]): `mul_mat`s reading the same activations (at most
/// three: q, k and v; seven with their ropes and cache writes, see [`projection_chain`]), ropes of
/// the same parameters, positions and factors (two: q and k; four with the K and V cache writes
/// after them, see [`rope_chain`]) or `set_rows` of the same indices (two: the K and V cache
/// writes), a chain of `rms_norm * w`, the `add` reading it and the `rms_norm * w` of that sum (a
/// post-norm, the residual add and the next norm), two independent `rms_norm * w` (q and k
/// norms), or whole llama-family decode layers (see [`stack_run`]); 1 when the first node starts
/// no such run.
pub(super) fn group_run(graph: &Graph, ids: &[TensorId]) -> usize {
    let nodes = graph.tensors();
    match nodes[ids[0].index()].op {
        Op::MulMat => projection_chain(nodes, ids),
        Op::Rope(_) => rope_chain(nodes, ids),
        Op::SetRows => same_kind_run(nodes, ids, 2),
        Op::RmsNormMul { .. } => match stack_run(graph, ids) {
            0 => norm_chain(nodes, ids),
            n => n,
        },
        _ => 1,
    }
}

/// Every run of `ids` a device may be offered as one group, with its position in `ids`: the one
/// [`group_run`] finds at each position (a device that takes part of a run is offered the rest
/// again, so any suffix may start one).
pub(super) fn possible_groups(graph: &Graph, ids: &[TensorId]) -> Vec<(usize, Vec<TensorId>)> {
    (0..ids.len())
        .filter_map(|j| {
            let run = group_run(graph, &ids[j..]);
            (run > 1).then(|| (j, ids[j..j + run].to_vec()))
        })
        .collect()
}

/// Length of the run of up to `max` independent nodes like the first (see [`group_run`]).
fn same_kind_run(nodes: &[Tensor], ids: &[TensorId], max: usize) -> usize {
    let first = &nodes[ids[0].index()];
    // A node reading an earlier node of the run (directly or through views) must wait for it.
    let reads = |run: &[TensorId], id: TensorId| view_chain(nodes, id).any(|x| run.contains(&x));
    let mut run = vec![ids[0]];
    1 + ids[1..]
        .iter()
        .take(max - 1)
        .take_while(|&&id| {
            let t = &nodes[id.index()];
            let reads_run = t.src.iter().any(|&s| reads(&run, s));
            run.push(id);
            !reads_run
                && match first.op {
                    Op::MulMat => t.op == Op::MulMat && t.src.get(1) == first.src.get(1),
                    Op::Rope(_) => t.op == first.op && t.src[1..] == first.src[1..],
                    _ => t.op == Op::SetRows && t.src.get(2) == first.src.get(2),
                }
        })
        .count()
}

/// Length of the run at the start of `ids` from `mul_mat`s on the same activations (at most three):
/// 7 when they are the q, k and v projections followed by the rope pair and cache writes of
/// [`rope_chain`], the ropes reading the first two products and the V write the third (through
/// views); a device takes the seven as one launch only with a mat-vec that rotates and stores its
/// rows itself.
fn projection_chain(nodes: &[Tensor], ids: &[TensorId]) -> usize {
    let run = same_kind_run(nodes, ids, 3);
    let [q, k, v, rest @ ..] = ids else {
        return run;
    };
    // A rope's input is operand 0, the rows a `set_rows` stores operand 1.
    let chain = run == 3
        && rest.len() >= 4
        && matches!(nodes[rest[0].index()].op, Op::Rope(_))
        && rope_chain(nodes, rest) == 4
        && operand_is(nodes, rest[0], 0, *q)
        && operand_is(nodes, rest[1], 0, *k)
        && operand_is(nodes, rest[3], 1, *v);
    if chain {
        7
    } else {
        run
    }
}

/// Length of the run at the start of `ids` from a pair of ropes (q, then k): 4 when the next two
/// nodes are `set_rows` of one index vector, the first storing the second rope's output (through
/// views: the K cache write) and the second reading neither rope (the V cache write); a device
/// takes the four as one launch only with a kernel that stores each key after rotating it.
fn rope_chain(nodes: &[Tensor], ids: &[TensorId]) -> usize {
    let pair = same_kind_run(nodes, ids, 2);
    let [_, k, c, e, ..] = ids else {
        return pair;
    };
    let (ct, et) = (&nodes[c.index()], &nodes[e.index()]);
    let chain = pair == 2
        && ct.op == Op::SetRows
        && et.op == Op::SetRows
        && ct.src.get(2) == et.src.get(2)
        && operand_is(nodes, *c, 1, *k)
        && et
            .src
            .iter()
            .all(|&s| !ids[..3].iter().any(|&x| is_view_of(nodes, s, x)));
    if chain {
        4
    } else {
        pair
    }
}

/// Length of the chain at the start of `ids`: `rms_norm * w` (the first node), an `add` with it as
/// one operand, then `rms_norm * w` of that sum; each step reads the previous node directly, so a
/// device takes it as one launch only with a kernel that runs the steps in order. Without the
/// `add`, two independent `rms_norm * w` of one row length and epsilon (2; 6 with their ropes and
/// the K and V cache writes after them, see [`rope_chain`]: the q and k norms of Gemma 3 and Qwen 3).
fn norm_chain(nodes: &[Tensor], ids: &[TensorId]) -> usize {
    let reads = |i: usize, op_ok: fn(&Op) -> bool, pos: &[usize]| {
        ids.get(i).is_some_and(|&id| {
            let t = &nodes[id.index()];
            op_ok(&t.op) && pos.iter().any(|&p| t.src.get(p) == Some(&ids[i - 1]))
        })
    };
    if !reads(1, |op| *op == Op::Add, &[0, 1]) {
        // Or two norms of rows of one length, the second not reading the first (q and k norms).
        let pair = ids.get(1).is_some_and(|&id| {
            let (a, b) = (&nodes[ids[0].index()], &nodes[id.index()]);
            let root = view_chain(nodes, b.src[0]).last();
            b.op == a.op && b.ne[0] == a.ne[0] && root != Some(ids[0])
        });
        if !pair {
            return 1;
        }
        // Their ropes, each reading its norm directly, and the cache writes after them.
        let roped = |i: usize| {
            ids.get(i + 2)
                .is_some_and(|&r| nodes[r.index()].src.first() == Some(&ids[i]))
        };
        let rest = &ids[2..];
        let ropes = !rest.is_empty()
            && matches!(nodes[rest[0].index()].op, Op::Rope(_))
            && roped(0)
            && roped(1);
        return if ropes && rope_chain(nodes, rest) == 4 {
            6
        } else {
            2
        };
    }
    if reads(2, |op| matches!(op, Op::RmsNormMul { .. }), &[0]) {
        3
    } else {
        2
    }
}

/// True when `l` (13 ids) is one llama-family decode layer on the residual `x` (one token), in
/// the order the optimizer leaves it: `rms_norm * w`; the q, k and v `mul_mat`s of it; the q and
/// k ropes (one position vector); the K and V cache writes at those positions; the attention
/// (no mask) over views of the caches; the o projection plus `x`; `rms_norm * w` of that sum;
/// the gated FFN front (`mul_mat_swiglu`); the down projection plus the sum.
fn decode_layer(nodes: &[Tensor], l: &[TensorId], x: Option<TensorId>) -> bool {
    let t = |i: usize| &nodes[l[i].index()];
    // Operand `k` of node `i` is node `j` or a view of it.
    let from = |i: usize, k: usize, j: usize| operand_is(nodes, l[i], k, l[j]);
    let src = |i: usize, k: usize| t(i).src.get(k).copied();
    let (n0, r4, r5) = (t(0), t(4), t(5));
    let Some(pos) = src(4, 1) else {
        return false;
    };
    let x = x.or(src(0, 0));
    matches!(n0.op, Op::RmsNormMul { .. })
        && src(0, 0) == x
        && n0.ne[1] * n0.ne[2] * n0.ne[3] == 1
        && (1..4).all(|i| t(i).op == Op::MulMat && src(i, 1) == Some(l[0]))
        && matches!(r4.op, Op::Rope(_))
        && from(4, 0, 1)
        && r5.op == r4.op
        && from(5, 0, 2)
        && r5.src[1..] == r4.src[1..]
        && t(6).op == Op::SetRows
        && from(6, 1, 5)
        && src(6, 2) == Some(pos)
        && t(7).op == Op::SetRows
        && from(7, 1, 3)
        && src(7, 2) == Some(pos)
        && matches!(t(8).op, Op::Attention(_))
        && t(8).src.len() == 4
        && from(8, 0, 4)
        && from(8, 1, 6)
        && from(8, 2, 7)
        && src(8, 3) == Some(pos)
        && t(9).op == Op::MulMatAdd
        && from(9, 1, 8)
        && src(9, 2) == x
        && matches!(t(10).op, Op::RmsNormMul { .. })
        && src(10, 0) == Some(l[9])
        && matches!(t(11).op, Op::MulMatGated(_))
        && src(11, 2) == Some(l[10])
        && t(12).op == Op::MulMatAdd
        && src(12, 1) == Some(l[11])
        && src(12, 2) == Some(l[9])
}

/// Length of the run at the start of `ids` made of whole llama-family decode layers (see
/// [`decode_layer`]), each reading the residual the one before it leaves, [`STACK_LAYER_NODES`]
/// nodes per layer; 0 when no layer starts there. A device takes as many whole layers as one
/// launch of its persistent decode kernel holds; such a kernel keeps every result but the last
/// residual and the cache writes on chip, so a run whose other results are read after it (by a
/// node that runs, or as a graph output) is no run.
fn stack_run(graph: &Graph, ids: &[TensorId]) -> usize {
    let nodes = graph.tensors();
    let mut layers = 0;
    let mut x = None;
    while let Some(l) = ids.get(layers * STACK_LAYER_NODES..(layers + 1) * STACK_LAYER_NODES) {
        if !decode_layer(nodes, l, x) {
            break;
        }
        x = Some(l[STACK_LAYER_NODES - 1]);
        layers += 1;
    }
    if layers == 0 {
        return 0;
    }
    let run = &ids[..layers * STACK_LAYER_NODES];
    let last = run[run.len() - 1];
    let mut in_run = vec![false; nodes.len()];
    for id in run {
        in_run[id.index()] = true;
    }
    // The cache writes alias persistent leaves, which the kernel does write.
    let internal =
        |id: TensorId| id != last && in_run[id.index()] && nodes[id.index()].op != Op::SetRows;
    let needed = crate::plan::needed_nodes(graph);
    let first = run[0].index();
    let escapes = nodes.iter().enumerate().skip(first).any(|(i, t)| {
        needed[i]
            && !in_run[i]
            && t.op != Op::View
            && t.src.iter().any(|&s| internal(graph.storage_root(s).0))
    }) || graph
        .outputs()
        .iter()
        .any(|&o| internal(graph.storage_root(o).0));
    if escapes {
        0
    } else {
        run.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{Act, AttnParams, DType, Leaf, RopeMode, RopeParams};

    /// `n_layer` llama-family decode layers (one token) as the model plans build them, then
    /// optimized: the graph, the launched nodes in order, and each layer's q projection.
    fn llama_decode(n_layer: usize) -> (Graph, Vec<TensorId>, Vec<TensorId>) {
        let (e, hd, nh, nkv, ff, ctx) = (256, 64, 4, 2, 512, 32);
        let mut g = Graph::new();
        let pos = g.input("pos", DType::I32, &[1]).expect("pos");
        let mut x = g.input("x", DType::F32, &[e, 1]).expect("x");
        let mut qs = Vec::new();
        let rope = RopeParams::new(RopeMode::Normal, hd, 10000.0, 1.0);
        for il in 0..n_layer {
            let w = |g: &mut Graph, n: &str, s: &[usize], t| g.weight(&format!("{n}.{il}"), t, s);
            let an = w(&mut g, "attn_norm", &[e], DType::F32).expect("w");
            let n = g.rms_norm(x, 1e-5).expect("norm");
            let h = g.mul(n, an).expect("mul");
            let wq = w(&mut g, "q", &[e, hd * nh], DType::Q4_K).expect("w");
            let wk = w(&mut g, "k", &[e, hd * nkv], DType::Q4_K).expect("w");
            let wv = w(&mut g, "v", &[e, hd * nkv], DType::Q6_K).expect("w");
            let q = g.mul_mat(wq, h).expect("q");
            let k = g.mul_mat(wk, h).expect("k");
            let v = g.mul_mat(wv, h).expect("v");
            qs.push(q);
            let q3 = g.reshape(q, &[hd, nh, 1]).expect("r");
            let k3 = g.reshape(k, &[hd, nkv, 1]).expect("r");
            let qr = g.rope(q3, pos, rope, None).expect("rope");
            let kr = g.rope(k3, pos, rope, None).expect("rope");
            let kc = g
                .persistent(&format!("ck.{il}"), DType::F16, &[hd * nkv, ctx])
                .expect("c");
            let vc = g
                .persistent(&format!("cv.{il}"), DType::F16, &[hd * nkv, ctx])
                .expect("c");
            let k2 = g.reshape(kr, &[hd * nkv, 1]).expect("r");
            let kw = g.set_rows(kc, k2, pos).expect("set");
            let vw = g.set_rows(vc, v, pos).expect("set");
            let nb = [hd * 2, hd * nkv * 2];
            let ka = g.view(kw, &[hd, nkv, ctx], &nb, 0).expect("view");
            let va = g.view(vw, &[hd, nkv, ctx], &nb, 0).expect("view");
            let p = AttnParams {
                scale: 0.125,
                causal: true,
                window: None,
                softcap: None,
            };
            let o = g.attention(qr, ka, va, pos, None, p).expect("attn");
            let o = g.reshape(o, &[hd * nh, 1]).expect("r");
            let wo = w(&mut g, "o", &[hd * nh, e], DType::Q4_K).expect("w");
            let o = g.mul_mat(wo, o).expect("o");
            let x1 = g.add(o, x).expect("add");
            let fnw = w(&mut g, "ffn_norm", &[e], DType::F32).expect("w");
            let n = g.rms_norm(x1, 1e-5).expect("norm");
            let h = g.mul(n, fnw).expect("mul");
            let wg = w(&mut g, "gate", &[e, ff], DType::Q4_K).expect("w");
            let wu = w(&mut g, "up", &[e, ff], DType::Q4_K).expect("w");
            let wd = w(&mut g, "down", &[ff, e], DType::Q6_K).expect("w");
            let gt = g.mul_mat(wg, h).expect("gate");
            let up = g.mul_mat(wu, h).expect("up");
            let a = g.gated(Act::Silu, gt, up).expect("act");
            let d = g.mul_mat(wd, a).expect("down");
            x = g.add(d, x1).expect("add");
        }
        g.mark_output(x).expect("out");
        crate::opt::optimize(&mut g);
        let needed = crate::plan::needed_nodes(&g);
        let ids = g
            .tensors()
            .iter()
            .enumerate()
            .filter(|&(i, t)| {
                needed[i]
                    && !matches!(
                        t.op,
                        Op::Leaf(Leaf::Input | Leaf::Weight | Leaf::Persistent) | Op::View
                    )
            })
            .map(|(i, _)| TensorId::from_index(i))
            .collect();
        (g, ids, qs)
    }

    #[test]
    fn whole_decode_layers_form_one_run() {
        let (g, ids, _) = llama_decode(3);
        assert_eq!(ids.len(), 3 * STACK_LAYER_NODES, "{ids:?}");
        assert_eq!(group_run(&g, &ids), 3 * STACK_LAYER_NODES);
        // From the second layer on, and offered again after a device took one layer.
        assert_eq!(
            group_run(&g, &ids[STACK_LAYER_NODES..]),
            2 * STACK_LAYER_NODES
        );
        // Half a layer is no run: the norm starts none of its own kinds either.
        assert_eq!(group_run(&g, &ids[..STACK_LAYER_NODES - 1]), 1);
        // Inside a layer: the q/k/v projections with their ropes and cache writes, the ropes
        // with the cache writes.
        assert_eq!(group_run(&g, &ids[1..]), 7);
        assert_eq!(group_run(&g, &ids[4..]), 4);
    }

    #[test]
    fn a_run_whose_results_are_read_later_is_no_run() {
        let (mut g, ids, qs) = llama_decode(2);
        // A q projection wanted as an output: a persistent kernel would not write it.
        g.mark_output(qs[1]).expect("out");
        assert_eq!(group_run(&g, &ids), 1);
        // The last residual is the run's own output and may be read.
        let (g, ids, _) = llama_decode(1);
        assert!(g.outputs().contains(&ids[STACK_LAYER_NODES - 1]));
        assert_eq!(group_run(&g, &ids), STACK_LAYER_NODES);
    }
}
