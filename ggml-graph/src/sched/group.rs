//! Launch groups: runs of consecutive scheduled nodes a device may take as one launch.

use crate::graph::Graph;
use crate::tensor::{Op, Tensor, TensorId};

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
/// norms), consecutive fused decode layers (see [`layer_chain`]) or a mixture of experts' up and
/// gate products with their gated activation (see [`expert_gate_up`]) or an expert product with
/// its experts' bias rows added (see [`expert_bias`]) or a mixture of experts' routing (see
/// [`routing`]); 1 when the first node starts no such run.
pub(super) fn group_run(graph: &Graph, ids: &[TensorId]) -> usize {
    let nodes = graph.tensors();
    match nodes[ids[0].index()].op {
        Op::MulMat => projection_chain(nodes, ids),
        Op::Rope(_) => rope_chain(nodes, ids),
        Op::SetRows => same_kind_run(nodes, ids, 2),
        Op::RmsNormMul { .. } => norm_chain(nodes, ids),
        Op::DecodeLayer(_) => layer_chain(graph, ids),
        Op::MulMatId => expert_gate_up(graph, ids).max(expert_bias(graph, ids)),
        Op::SoftMax { .. } | Op::ArgTopK(_) => routing(nodes, ids),
        _ => 1,
    }
}

/// 3 when `ids` starts with a mixture of experts' routing: the softmax gating's unmasked
/// `probs = soft_max(x)`, `argsort_top_k(probs)` and `expert_weights(probs, ids)`, or gpt-oss's
/// `argsort_top_k(x)`, `expert_weights(x, ids)` (not normalised) and the unmasked `soft_max` of
/// those picked values: a device may compute all three results in one launch. Else 1.
fn routing(nodes: &[Tensor], ids: &[TensorId]) -> usize {
    let [a, b, c, ..] = ids else {
        return 1;
    };
    let (ta, tb, tc) = (&nodes[a.index()], &nodes[b.index()], &nodes[c.index()]);
    let softmax_first = matches!(ta.op, Op::SoftMax { .. })
        && ta.src.len() == 1
        && matches!(tb.op, Op::ArgTopK(_))
        && tb.src == [*a]
        && matches!(tc.op, Op::ExpertWeights { .. })
        && tc.src == [*a, *b];
    let top_first = matches!(ta.op, Op::ArgTopK(_))
        && tb.op == (Op::ExpertWeights { norm: false })
        && tb.src == [ta.src[0], *a]
        && matches!(tc.op, Op::SoftMax { .. })
        && tc.src == [*b];
    if softmax_first || top_first {
        3
    } else {
        1
    }
}

/// 3 when `ids` starts with a mixture of experts' up product, its gate product (`mul_mat_id` of
/// the same activations and expert ids) and the gated activation `act(gate) * up` of the two,
/// whose products nothing else reads (no other needed node, no graph output): a device may run
/// the three as one gated expert mat-vec that writes only the activation's rows. Else 1.
fn expert_gate_up(graph: &Graph, ids: &[TensorId]) -> usize {
    let nodes = graph.tensors();
    let [up, gate, act, ..] = ids else {
        return 1;
    };
    let (u, g, a) = (
        &nodes[up.index()],
        &nodes[gate.index()],
        &nodes[act.index()],
    );
    let pair =
        g.op == Op::MulMatId && u.src.len() == 3 && g.src.len() == 3 && u.src[1..] == g.src[1..];
    let gated = matches!(a.op, Op::Gated(_)) && a.src.as_slice() == [*gate, *up];
    if !pair || !gated {
        return 1;
    }
    if read_only_by(graph, *up, *act) && read_only_by(graph, *gate, *act) {
        3
    } else {
        1
    }
}

/// True when `x` is no graph output and no needed node but `reader` reads it (views of `x`
/// count as `x` only when `reader` reads them).
fn read_only_by(graph: &Graph, x: TensorId, reader: TensorId) -> bool {
    let nodes = graph.tensors();
    let needed = crate::plan::needed_nodes(graph);
    // The views of `x` that `reader` reads directly stand for it.
    let via: Vec<TensorId> = nodes[reader.index()]
        .src
        .iter()
        .copied()
        .filter(|&s| is_view_of(nodes, s, x))
        .collect();
    !graph.outputs().contains(&x)
        && !via.iter().any(|v| graph.outputs().contains(v))
        && nodes.iter().enumerate().all(|(i, t)| {
            let id = TensorId::from_index(i);
            let reads = t.src.contains(&x) || t.view_of.is_some_and(|(p, _)| p == x);
            !needed[i] || !reads || id == reader || via.contains(&id)
        })
        && via.iter().all(|&v| {
            v == x
                || nodes.iter().enumerate().all(|(i, t)| {
                    let reads = t.src.contains(&v) || t.view_of.is_some_and(|(p, _)| p == v);
                    !needed[i] || !reads || TensorId::from_index(i) == reader
                })
        })
}

/// 3 when `ids` starts with an expert product `y = mul_mat_id(w, x, ids)`, a `get_rows` of a
/// bias stack by those ids (through a view) and the `add` of `y` and those rows (through views),
/// with `y` and the rows read by nothing else: a device may run the three as one biased expert
/// mat-vec that writes only the sum (gpt-oss's expert biases). Else 1.
fn expert_bias(graph: &Graph, ids: &[TensorId]) -> usize {
    let nodes = graph.tensors();
    let [mm, rows, add, ..] = ids else {
        return 1;
    };
    let (m, r, a) = (
        &nodes[mm.index()],
        &nodes[rows.index()],
        &nodes[add.index()],
    );
    let shape = r.op == Op::GetRows
        && a.op == Op::Add
        && m.src.len() == 3
        && r.src.len() == 2
        && is_view_of(nodes, r.src[1], m.src[2])
        && a.src.len() == 2
        && is_view_of(nodes, a.src[0], *mm)
        && is_view_of(nodes, a.src[1], *rows);
    if shape && read_only_by(graph, *mm, *add) && read_only_by(graph, *rows, *add) {
        3
    } else {
        1
    }
}

/// Length of the chain at the start of `ids` of decode layers, each reading the residual the one
/// before it leaves as its input, that nothing else reads (no other node, no graph output): a
/// device may run the chain as one kernel that keeps those residuals to itself.
fn layer_chain(graph: &Graph, ids: &[TensorId]) -> usize {
    let nodes = graph.tensors();
    let needed = crate::plan::needed_nodes(graph);
    // Only the next layer reads `prev`, through no view.
    let private = |prev: TensorId, next: TensorId| {
        !graph.outputs().contains(&prev)
            && nodes.iter().enumerate().all(|(i, t)| {
                let reads = t.src.contains(&prev) || t.view_of.is_some_and(|(p, _)| p == prev);
                !needed[i] || !reads || TensorId::from_index(i) == next
            })
    };
    1 + ids
        .windows(2)
        .take_while(|w| {
            let t = &nodes[w[1].index()];
            matches!(t.op, Op::DecodeLayer(_))
                && t.src.first() == Some(&w[0])
                && private(w[0], w[1])
        })
        .count()
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opt::layer::tests::llama_decode;
    use crate::tensor::{Act, DType, Leaf};

    /// The launched nodes of `g` a run needs, in order.
    fn launched(g: &Graph) -> Vec<TensorId> {
        let needed = crate::plan::needed_nodes(g);
        g.tensors()
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
            .collect()
    }

    #[test]
    fn groups_inside_a_decode_layer() {
        let (g, _) = llama_decode(1);
        let ids = launched(&g);
        // The q/k/v projections with their ropes and cache writes, the ropes with the cache
        // writes; the layer's first norm starts no chain of its own kinds.
        assert_eq!(group_run(&g, &ids[1..]), 7);
        assert_eq!(group_run(&g, &ids[4..]), 4);
        assert_eq!(group_run(&g, &ids), 1);
    }

    #[test]
    fn consecutive_fused_layers_form_one_run() {
        let (mut g, _) = llama_decode(3);
        assert_eq!(crate::opt::fuse_decode_layers(&mut g, &|_, _| true), 3);
        let ids = launched(&g);
        assert_eq!(ids.len(), 3);
        assert_eq!(group_run(&g, &ids), 3);
        // Offered again after a device took one layer.
        assert_eq!(group_run(&g, &ids[1..]), 2);
    }

    /// A mixture of experts' up and gate products and their activation (the order the model
    /// plans build them in) form one run, unless a product is read elsewhere.
    #[test]
    fn expert_gate_up_products_and_activation_form_one_run() {
        let build = || {
            let mut g = Graph::new();
            let x = g.input("x", DType::F32, &[64, 1, 3]).expect("x");
            let ids = g.input("ids", DType::I32, &[2, 3]).expect("ids");
            let wu = g.weight("up", DType::Q8_0, &[64, 32, 4]).expect("up");
            let wg = g.weight("gate", DType::Q8_0, &[64, 32, 4]).expect("gate");
            let up = g.mul_mat_id(wu, x, ids).expect("up product");
            let gate = g.mul_mat_id(wg, x, ids).expect("gate product");
            let h = g.gated(Act::Silu, gate, up).expect("activation");
            g.mark_output(h).expect("out");
            (g, up, gate)
        };
        let (g, _, _) = build();
        let ids = launched(&g);
        assert_eq!(ids.len(), 3);
        assert_eq!(group_run(&g, &ids), 3);
        assert_eq!(group_run(&g, &ids[1..]), 1);
        // A product another node (or the caller) reads must be written: no run.
        let (mut g, up, _) = build();
        g.mark_output(up).expect("out");
        assert_eq!(group_run(&g, &launched(&g)), 1);
        let (mut g, _, gate) = build();
        let extra = g.scale(gate, 2.0).expect("another reader");
        g.mark_output(extra).expect("out");
        assert_eq!(group_run(&g, &launched(&g)), 1);
    }

    /// An expert product, the bias rows of its experts and their sum (gpt-oss's `add_id`, as the
    /// model plans build it: through reshapes) form one run, unless the product is read elsewhere.
    #[test]
    fn expert_product_and_bias_rows_form_one_run() {
        let build = || {
            let mut g = Graph::new();
            let x = g.input("x", DType::F32, &[64, 1, 3]).expect("x");
            let ids = g.input("ids", DType::I32, &[2, 3]).expect("ids");
            let w = g.weight("w", DType::Q8_0, &[64, 32, 4]).expect("w");
            let b = g.weight("b", DType::F32, &[32, 4]).expect("b");
            let y = g.mul_mat_id(w, x, ids).expect("product");
            let flat = g.reshape(ids, &[6]).expect("flat ids");
            let rows = g.get_rows(b, flat).expect("bias rows");
            let rows = g.reshape(rows, &[32, 2, 3]).expect("rows");
            let out = g.add(y, rows).expect("sum");
            g.mark_output(out).expect("out");
            (g, y)
        };
        let (g, _) = build();
        let ids = launched(&g);
        assert_eq!(ids.len(), 3);
        assert_eq!(group_run(&g, &ids), 3);
        let (mut g, y) = build();
        g.mark_output(y).expect("out");
        assert_eq!(group_run(&g, &launched(&g)), 1);
    }

    /// Both gatings' routing (softmax, top k, picked weights; top k, picked logits, softmax)
    /// form one run of three; a masked softmax or another order does not.
    #[test]
    fn moe_routing_forms_one_run() {
        let mut g = Graph::new();
        let x = g.input("logits", DType::F32, &[16, 3]).expect("x");
        let probs = g.soft_max_ext(x, None, 1.0).expect("probs");
        let ids = g.arg_top_k(probs, 4).expect("ids");
        let w = g.expert_weights(probs, ids, true).expect("weights");
        let raw = g.arg_top_k(x, 4).expect("ids of the logits");
        let picked = g.expert_weights(x, raw, false).expect("picked");
        let w2 = g
            .soft_max_ext(picked, None, 1.0)
            .expect("softmax of picked");
        for o in [w, w2] {
            g.mark_output(o).expect("out");
        }
        let ids = launched(&g);
        assert_eq!(ids.len(), 6);
        assert_eq!(group_run(&g, &ids), 3);
        assert_eq!(group_run(&g, &ids[3..]), 3);
        assert_eq!(group_run(&g, &ids[1..]), 1);
        assert_eq!(group_run(&g, &ids[2..]), 1);
        let mut g = Graph::new();
        let x = g.input("logits", DType::F32, &[16, 3]).expect("x");
        let mask = g.input("mask", DType::F32, &[16, 3]).expect("mask");
        let probs = g.soft_max_ext(x, Some(mask), 1.0).expect("probs");
        let ids = g.arg_top_k(probs, 4).expect("ids");
        let w = g.expert_weights(probs, ids, true).expect("weights");
        g.mark_output(w).expect("out");
        assert_eq!(group_run(&g, &launched(&g)), 1);
    }

    #[test]
    fn a_layer_whose_residual_is_read_elsewhere_ends_the_run() {
        let (mut g, _) = llama_decode(3);
        crate::opt::fuse_decode_layers(&mut g, &|_, _| true);
        let ids = launched(&g);
        // A kernel running the chain writes only the last residual.
        g.mark_output(ids[1]).expect("out");
        assert_eq!(group_run(&g, &ids), 2);
        assert_eq!(group_run(&g, &ids[2..]), 1);
    }
}
