//! Optimizer passes over a [`Graph`]: common-subexpression elimination, view folding and fusion
//! rewrite the graph in place keeping every `TensorId` valid (replaced nodes become dead and are
//! neither run nor allocated); dead-node elimination compacts the graph and returns the id map.
//! [`fuse_decode_layers`] folds whole decode layers into one node for a device that asks for it.

pub(crate) mod layer;

use std::collections::HashMap;

use crate::graph::Graph;
use crate::plan::needed_nodes;
use crate::tensor::{DType, Op, Tensor, TensorId};

pub use layer::fuse_decode_layers;

/// What the passes changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OptStats {
    /// Nodes merged into an identical earlier node.
    pub cse: usize,
    /// Views re-pointed at their root, and identity views removed.
    pub views_folded: usize,
    /// Fusions made (each removes at least one node from the executed set).
    pub fused: usize,
}

/// Runs CSE, view folding and fusion (in that order) on `g` in place.
pub fn optimize(g: &mut Graph) -> OptStats {
    let cse = eliminate_common(g);
    let views_folded = fold_views(g);
    let fused = fuse(g);
    OptStats {
        cse,
        views_folded,
        fused,
    }
}

/// Points every use of `from` (sources, view parents) at `to`; outputs stay on `from`, which
/// becomes a zero-cost view of `to`.
fn redirect(g: &mut Graph, from: TensorId, to: TensorId) {
    for t in g.nodes.iter_mut().skip(from.index() + 1) {
        for s in t.src.iter_mut() {
            if *s == from {
                *s = to;
            }
        }
        if let Some((p, _)) = t.view_of.as_mut() {
            if *p == from {
                *p = to;
            }
        }
    }
    if g.outputs.contains(&from) {
        let t = &mut g.nodes[from.index()];
        t.op = Op::View;
        t.src = vec![to];
        t.view_of = Some((to, 0));
    }
}

fn has_side_effect(g: &Graph, id: TensorId) -> bool {
    g.writes_persistent(id) || matches!(g.nodes[id.index()].op, Op::Cpy | Op::SetRows)
}

/// Merges nodes that compute the same op on the same operands (leaves: same name and kind).
pub fn eliminate_common(g: &mut Graph) -> usize {
    // Candidates by a hash of everything that determines the value, confirmed by `same_value`
    // (graphs are rebuilt per decode step: no string keys here).
    let mut seen: HashMap<u64, Vec<TensorId>> = HashMap::with_capacity(g.len());
    let mut merged = 0;
    for i in 0..g.len() {
        let id = TensorId::from_index(i);
        if has_side_effect(g, id) {
            continue;
        }
        let key = value_hash(&g.nodes[i]);
        let bucket = seen.entry(key).or_default();
        match bucket
            .iter()
            .copied()
            .find(|&f| same_value(&g.nodes[f.index()], &g.nodes[i]))
        {
            Some(first) => {
                redirect(g, id, first);
                merged += 1;
            }
            None => bucket.push(id),
        }
    }
    merged
}

/// A hash of what [`same_value`] compares (the op by variant only).
fn value_hash(t: &Tensor) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::mem::discriminant(&t.op).hash(&mut h);
    t.dtype.hash(&mut h);
    t.ne.hash(&mut h);
    match t.op {
        Op::Leaf(_) => t.name.hash(&mut h),
        _ => {
            t.nb.hash(&mut h);
            t.src.hash(&mut h);
            t.view_of.hash(&mut h);
        }
    }
    h.finish()
}

/// True when `a` and `b` compute the same value: leaves of the same kind, name, type and shape;
/// other nodes with the same op (parameters bit for bit), type, layout, operands and view.
fn same_value(a: &Tensor, b: &Tensor) -> bool {
    if a.dtype != b.dtype || a.ne != b.ne {
        return false;
    }
    match (&a.op, &b.op) {
        (Op::Leaf(ka), Op::Leaf(kb)) => ka == kb && a.name == b.name,
        (Op::Leaf(_), _) | (_, Op::Leaf(_)) => false,
        // Float parameters compare by their exact printed form (0.0 and -0.0 differ).
        (oa, ob) => {
            a.nb == b.nb
                && a.src == b.src
                && a.view_of == b.view_of
                && oa == ob
                && format!("{oa:?}") == format!("{ob:?}")
        }
    }
}

/// Re-points views of views at the root view parent (one hop at run time) and removes views that
/// are identical to their parent.
pub fn fold_views(g: &mut Graph) -> usize {
    let mut folded = 0;
    for i in 0..g.len() {
        let t = &g.nodes[i];
        if t.op != Op::View {
            continue;
        }
        let Some((p, off)) = t.view_of else { continue };
        let parent = &g.nodes[p.index()];
        if parent.op == Op::View {
            if let Some((gp, poff)) = parent.view_of {
                let t = &mut g.nodes[i];
                t.view_of = Some((gp, poff + off));
                t.src = vec![gp];
                folded += 1;
            }
        }
        let t = &g.nodes[i];
        let Some((p, off)) = t.view_of else { continue };
        let parent = &g.nodes[p.index()];
        let is_output = g.outputs.contains(&TensorId::from_index(i));
        if !is_output
            && off == 0
            && parent.ne == t.ne
            && parent.nb == t.nb
            && parent.dtype == t.dtype
        {
            redirect(g, TensorId::from_index(i), p);
            folded += 1;
        }
    }
    folded
}

/// Readers of each node (sources and view parents), among the needed nodes.
fn consumers(g: &Graph) -> Vec<usize> {
    let needed = needed_nodes(g);
    let mut count = vec![0; g.len()];
    for (i, t) in g.nodes.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        for s in &t.src {
            count[s.index()] += 1;
        }
        if let Some((p, _)) = t.view_of {
            if !t.src.contains(&p) {
                count[p.index()] += 1;
            }
        }
    }
    count
}

/// True when `producer`'s value may be folded into its single consumer: one reader, not an
/// output, a computed (non-leaf, non-alias) node.
pub fn can_fuse(g: &Graph, producer: TensorId, readers: &[usize]) -> bool {
    let t = &g.nodes[producer.index()];
    read_once(g, producer, readers) && !matches!(t.op, Op::Leaf(_)) && !t.op.is_alias()
}

/// True when `id` has one reader and is no output of the graph.
fn read_once(g: &Graph, id: TensorId, readers: &[usize]) -> bool {
    readers[id.index()] == 1 && !g.outputs.contains(&id)
}

fn is_row_broadcast(x: &Tensor, w: &Tensor) -> bool {
    w.dtype == DType::F32 && w.ne[0] == x.ne[0] && w.rows_contiguous()
}

/// The most experts per token a [`Op::MoeSum`] is made for (llama.cpp's models use up to 8;
/// longer `add` chains are not walked).
const MAX_EXPERTS_USED: usize = 64;

/// The operands `[experts, weights]` of an [`Op::MoeSum`] that add `id` may become: `id` ends a
/// chain `((v0 + v1) + v2) + ...` over views `v_s` of slot `s` of one `mul(experts, weights)`
/// (`[n, k, rows]` times `[1, k, rows]`), one view per slot of the product, each view and every
/// link of the chain read only by the next one and no output.
fn moe_sum_operands(g: &Graph, id: TensorId, readers: &[usize]) -> Option<Vec<TensorId>> {
    // Views are aliases, which `can_fuse` refuses: the chain's links and views need only this.
    let only_next = |v: TensorId| read_once(g, v, readers);
    let mut slots = Vec::new();
    let mut cur = id;
    loop {
        let t = &g.nodes[cur.index()];
        let (left, right) = (t.src[0], t.src[1]);
        slots.push(right);
        if slots.len() > MAX_EXPERTS_USED {
            return None;
        }
        if g.nodes[left.index()].op == Op::Add && left != right && only_next(left) {
            cur = left;
        } else {
            slots.push(left);
            break;
        }
    }
    slots.reverse();
    let k = slots.len();
    let (m, _) = g.nodes[slots[0].index()].view_of?;
    let mt = &g.nodes[m.index()];
    let [n, rows] = [mt.ne[0], mt.ne[2]];
    let f = DType::F32.type_size();
    let product_ok = mt.op == Op::Mul
        && mt.dtype == DType::F32
        && mt.ne == [n, k, rows, 1]
        && mt.is_contiguous()
        && readers[m.index()] == k
        && !g.outputs.contains(&m);
    if !product_ok {
        return None;
    }
    let slots_ok = slots.iter().enumerate().all(|(s, &v)| {
        let vt = &g.nodes[v.index()];
        vt.op == Op::View
            && vt.view_of == Some((m, s * n * f))
            && vt.dtype == DType::F32
            && vt.ne == [n, rows, 1, 1]
            && vt.nb[0] == f
            && vt.nb[1] == n * k * f
            && only_next(v)
    });
    let (a, b) = (mt.src[0], mt.src[1]);
    let is_experts = |x: &Tensor| x.dtype == DType::F32 && x.ne == mt.ne && x.rows_contiguous();
    let is_weights =
        |x: &Tensor| x.dtype == DType::F32 && x.ne == [1, k, rows, 1] && x.rows_contiguous();
    // f32 products commute exactly: either operand order is the same value.
    let (xa, xb) = (&g.nodes[a.index()], &g.nodes[b.index()]);
    let src = if is_experts(xa) && is_weights(xb) {
        vec![a, b]
    } else if is_experts(xb) && is_weights(xa) {
        vec![b, a]
    } else {
        return None;
    };
    slots_ok.then_some(src)
}

/// The operands `[experts, weights, r]` of an [`Op::MoeSum`] that `add` node `t` (operands
/// `srcs`) may become: the sum of a two-operand `moe_sum` read only here and a residual `r` of
/// its shape (either order: f32 sums commute exactly).
fn moe_sum_residual(
    g: &Graph,
    t: &Tensor,
    srcs: &[Tensor],
    readers: &[usize],
) -> Option<Vec<TensorId>> {
    let residual_ok = |r: &Tensor| r.dtype == DType::F32 && r.ne == t.ne && r.rows_contiguous();
    (0..2).find_map(|j| {
        let (sum, r) = (&srcs[j], &srcs[1 - j]);
        (sum.op == Op::MoeSum
            && sum.src.len() == 2
            && t.src[0] != t.src[1]
            && can_fuse(g, t.src[j], readers)
            && residual_ok(r))
        .then(|| vec![sum.src[0], sum.src[1], t.src[1 - j]])
    })
}

/// Fuses `rms_norm * w`, `mul_mat + bias`, `act(mul_mat(wg, x)) * mul_mat(wu, x)` and the
/// weighted sum of the chosen experts' outputs (`mul` and the `add`s over its slots, then the
/// residual `add`).
pub fn fuse(g: &mut Graph) -> usize {
    let mut fused = 0;
    let mut readers = consumers(g);
    for i in 0..g.len() {
        let t = g.nodes[i].clone();
        let srcs: Vec<Tensor> = t.src.iter().map(|s| g.nodes[s.index()].clone()).collect();
        let new: Option<(Op, Vec<TensorId>)> = match t.op {
            Op::Mul => {
                let (a, b) = (t.src[0], t.src[1]);
                match srcs[0].op {
                    Op::RmsNorm { eps }
                        if can_fuse(g, a, &readers) && is_row_broadcast(&srcs[0], &srcs[1]) =>
                    {
                        Some((Op::RmsNormMul { eps }, vec![srcs[0].src[0], b]))
                    }
                    _ => None,
                }
            }
            Op::Add => {
                let (a, b) = (t.src[0], t.src[1]);
                let moe = moe_sum_operands(g, TensorId::from_index(i), &readers)
                    .or_else(|| moe_sum_residual(g, &t, &srcs, &readers));
                let bias_ok =
                    srcs[1].ne[0] == t.ne[0] && srcs[1].ne[1] == 1 && srcs[1].rows_contiguous();
                match srcs[0].op {
                    _ if moe.is_some() => moe.map(|src| (Op::MoeSum, src)),
                    Op::MulMat if can_fuse(g, a, &readers) && bias_ok => {
                        Some((Op::MulMatAdd, vec![srcs[0].src[0], srcs[0].src[1], b]))
                    }
                    _ => None,
                }
            }
            Op::Gated(act) => {
                let (gate, up) = (t.src[0], t.src[1]);
                let both_mm = srcs[0].op == Op::MulMat && srcs[1].op == Op::MulMat;
                if both_mm && gate != up && can_fuse(g, gate, &readers) && can_fuse(g, up, &readers)
                {
                    let (wg, wu) = (
                        &g.nodes[srcs[0].src[0].index()],
                        &g.nodes[srcs[1].src[0].index()],
                    );
                    let same_x = srcs[0].src[1] == srcs[1].src[1];
                    if same_x && wg.dtype == wu.dtype && wg.ne == wu.ne && wg.nb == wu.nb {
                        Some((
                            Op::MulMatGated(act),
                            vec![srcs[0].src[0], srcs[1].src[0], srcs[0].src[1]],
                        ))
                    } else {
                        None
                    }
                } else {
                    None
                }
            }
            _ => None,
        };
        if let Some((op, src)) = new {
            // The fused producers now have no reader.
            for s in &t.src {
                if !src.contains(s) {
                    readers[s.index()] = 0;
                }
            }
            let n = &mut g.nodes[i];
            n.op = op;
            n.src = src;
            fused += 1;
        }
    }
    fused
}

/// For graphs the GPU runs: folds a `scale` of the queries that only an attention reads into the
/// attention's score scale (one launch less per layer; `q.k * s` instead of `(s q).k`, equal up
/// to rounding, so the CPU's own graphs never take it). Attentions with soft-capping keep theirs.
pub fn fold_query_scale(g: &mut Graph) -> usize {
    let readers = consumers(g);
    let mut folded = 0;
    for i in 0..g.len() {
        let Op::Attention(p) = &g.nodes[i].op else {
            continue;
        };
        let Some(&q) = g.nodes[i].src.first() else {
            continue;
        };
        let Op::Scale(s) = g.nodes[q.index()].op else {
            continue;
        };
        if p.softcap.is_some() || !can_fuse(g, q, &readers) {
            continue;
        }
        let mut p = *p;
        p.scale *= s;
        let x = g.nodes[q.index()].src[0];
        let n = &mut g.nodes[i];
        n.op = Op::Attention(p);
        n.src[0] = x;
        folded += 1;
    }
    folded
}

/// A compacted copy of `g` without the nodes no output or persistent write needs, and the map
/// from old ids to new ones.
pub fn eliminate_dead(g: &Graph) -> (Graph, Vec<Option<TensorId>>) {
    let needed = needed_nodes(g);
    let mut map = vec![None; g.len()];
    let mut out = Graph::new();
    for (i, t) in g.nodes.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        let mut t = t.clone();
        let remap = |id: TensorId| map[id.index()].unwrap_or(id);
        t.src = t.src.iter().map(|&s| remap(s)).collect();
        t.view_of = t.view_of.map(|(p, o)| (remap(p), o));
        map[i] = Some(TensorId::from_index(out.nodes.len()));
        out.nodes.push(t);
    }
    out.outputs = g.outputs.iter().filter_map(|o| map[o.index()]).collect();
    (out, map)
}
