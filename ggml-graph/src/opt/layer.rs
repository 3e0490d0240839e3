//! The decode-layer pass: each llama-family decode layer of a one-token graph becomes one
//! [`Op::DecodeLayer`] node, where the device that will run it says it takes the whole layer.
//!
//! The pattern is the 13 launched nodes that [`super::optimize`] leaves of a layer, in order:
//! `rms_norm * w`; the q, k and v `mul_mat`s of it (or all three `mul_mat + bias`, Qwen2's); then
//! in Qwen3's layers the per-head `rms_norm * w` of q and of k (15 nodes); the q and k ropes (one
//! position vector); the K and V cache writes at those positions; the attention (no mask) over
//! views of the caches; the o projection plus the residual `x`; `rms_norm * w` of that sum; the
//! gated FFN front (`mul_mat_swiglu`); the down projection plus the sum. A fused layer keeps every
//! intermediate to itself, so a layer whose intermediates something else reads (another node, a
//! graph output) is left alone.

use crate::graph::Graph;
use crate::plan::needed_nodes;
use crate::tensor::{layer_src, DecodeLayerParams, Op, Tensor, TensorId};

/// Launched nodes per decode layer in the pattern.
const LAYER_NODES: usize = 13;
/// ... with the q and k norms (Qwen3).
const NORMED_NODES: usize = LAYER_NODES + 2;

/// `id`, then each tensor it is a view of, down to its storage root.
fn view_chain(nodes: &[Tensor], id: TensorId) -> impl Iterator<Item = TensorId> + '_ {
    std::iter::successors(Some(id), |&i| nodes[i.index()].view_of.map(|(p, _)| p))
}

/// True when operand `at` of node `id` is `x` or a view of it.
fn operand_is(nodes: &[Tensor], id: TensorId, at: usize, x: TensorId) -> bool {
    nodes[id.index()]
        .src
        .get(at)
        .is_some_and(|&s| view_chain(nodes, s).any(|v| v == x))
}

/// A window of launched nodes as the pattern's 13 (`l`), and the q and k norms' nodes between
/// the projections and the ropes where the window has them (15 nodes, Qwen3's layers).
fn pattern(w: &[TensorId]) -> Option<([TensorId; LAYER_NODES], Option<[TensorId; 2]>)> {
    match w.len() {
        LAYER_NODES => Some((w.try_into().ok()?, None)),
        NORMED_NODES => {
            let mut l = [w[0]; LAYER_NODES];
            l[..4].copy_from_slice(&w[..4]);
            l[4..].copy_from_slice(&w[6..]);
            Some((l, Some([w[4], w[5]])))
        }
        _ => None,
    }
}

/// True when `l` (13 ids) with the q and k norms `qk_norms` is one decode layer of the pattern
/// (see the module docs).
fn is_layer(nodes: &[Tensor], l: &[TensorId], qk_norms: Option<[TensorId; 2]>) -> bool {
    let t = |i: usize| &nodes[l[i].index()];
    // Operand `k` of node `i` is node `j` or a view of it.
    let from = |i: usize, k: usize, j: usize| operand_is(nodes, l[i], k, l[j]);
    let src = |i: usize, k: usize| t(i).src.get(k).copied();
    let (n0, r4, r5) = (t(0), t(4), t(5));
    let Some(pos) = src(4, 1) else {
        return false;
    };
    let x = src(0, 0);
    // The rope of projection `j` (node 1 or 2) reads it, or its per-head norm (`rms_norm * w`
    // over one head, read by nothing else) where the layer has them.
    let roped = |r: usize, j: usize| match qk_norms {
        None => from(r, 0, j),
        Some(n) => {
            let nn = &nodes[n[j - 1].index()];
            matches!(nn.op, Op::RmsNormMul { .. })
                && operand_is(nodes, n[j - 1], 0, l[j])
                && operand_is(nodes, l[r], 0, n[j - 1])
        }
    };
    // The projections: all plain, or all with a bias.
    let proj = &t(1).op;
    matches!(n0.op, Op::RmsNormMul { .. })
        && n0.ne[1] * n0.ne[2] * n0.ne[3] == 1
        && matches!(proj, Op::MulMat | Op::MulMatAdd)
        && (1..4).all(|i| &t(i).op == proj && src(i, 1) == Some(l[0]))
        && matches!(r4.op, Op::Rope(_))
        && roped(4, 1)
        && r5.op == r4.op
        && roped(5, 2)
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

/// The fused node of layer `l` with the q and k norms `qk_norms` (see [`is_layer`]): the last
/// node's tensor with the layer's op and operands; `None` where the attention reads its caches
/// from other than their first row (the node writes row `pos` of what it reads), where the q/k
/// norms are not per head or differ in epsilon, or where a layer has both biases and norms.
fn fused_node(g: &Graph, l: &[TensorId], qk_norms: Option<[TensorId; 2]>) -> Option<Tensor> {
    let nodes = g.tensors();
    let t = |i: usize| &nodes[l[i].index()];
    if [1, 2].iter().any(|&k| g.storage_root(t(8).src[k]).1 != 0) {
        return None;
    }
    let (Op::RmsNormMul { eps: attn_eps }, Op::Rope(rope), Op::Attention(attn)) =
        (&t(0).op, &t(4).op, &t(8).op)
    else {
        return None;
    };
    let (Op::RmsNormMul { eps: ffn_eps }, Op::MulMatGated(act)) = (&t(10).op, &t(11).op) else {
        return None;
    };
    let q = &nodes[t(8).src[0].index()];
    let mut src = vec![TensorId::from_index(0); layer_src::W_DOWN + 1];
    src[layer_src::X] = t(0).src[0];
    src[layer_src::ATTN_NORM] = t(0).src[1];
    src[layer_src::WQ] = t(1).src[0];
    src[layer_src::WK] = t(2).src[0];
    src[layer_src::WV] = t(3).src[0];
    src[layer_src::POS] = t(4).src[1];
    src[layer_src::K] = t(8).src[1];
    src[layer_src::V] = t(8).src[2];
    src[layer_src::WO] = t(9).src[0];
    src[layer_src::FFN_NORM] = t(10).src[1];
    src[layer_src::W_GATE] = t(11).src[0];
    src[layer_src::W_UP] = t(11).src[1];
    src[layer_src::W_DOWN] = t(12).src[0];
    let qkv_bias = t(1).op == Op::MulMatAdd;
    if qkv_bias {
        src.extend((1..4).map(|i| t(i).src[2]));
    }
    let qk_norm = match qk_norms {
        None => None,
        Some(_) if qkv_bias => return None,
        Some([qn, kn]) => {
            let (qn, kn) = (&nodes[qn.index()], &nodes[kn.index()]);
            let (Op::RmsNormMul { eps }, Op::RmsNormMul { eps: k_eps }) = (&qn.op, &kn.op) else {
                return None;
            };
            if eps != k_eps || qn.ne[0] != q.ne[0] || kn.ne[0] != q.ne[0] {
                return None;
            }
            src.extend([qn.src[1], kn.src[1]]);
            Some(*eps)
        }
    };
    if let Some(&ff) = t(4).src.get(2) {
        src.push(ff);
    }
    let mut node = t(12).clone();
    node.op = Op::DecodeLayer(DecodeLayerParams {
        attn_eps: *attn_eps,
        ffn_eps: *ffn_eps,
        rope: *rope,
        attn: *attn,
        act: *act,
        n_head: q.ne[1],
        head_dim: q.ne[0],
        qkv_bias,
        qk_norm,
    });
    node.src = src;
    Some(node)
}

/// True when something outside layer `l` reads one of its results other than the last (its
/// output residual): a needed node that is not a view (views count through their readers), or
/// a graph output.
fn escapes(g: &Graph, l: &[TensorId], needed: &[bool]) -> bool {
    let nodes = g.tensors();
    let Some(&last) = l.last() else {
        return false;
    };
    let internal = |id: TensorId| id != last && l.contains(&id);
    nodes.iter().enumerate().skip(l[0].index()).any(|(i, t)| {
        needed[i]
            && !l.contains(&TensorId::from_index(i))
            && t.op != Op::View
            && t.src.iter().any(|&s| internal(g.storage_root(s).0))
    }) || g.outputs().iter().any(|&o| internal(g.storage_root(o).0))
}

/// Replaces each decode layer of `g` (one token; see the module docs) that `accept` takes (the
/// fused node and its operands, as a device's `supports_op` is asked) by one
/// [`Op::DecodeLayer`] node in place of the layer's last node, keeping every `TensorId` valid:
/// the cache writes become views of their caches (the fused node writes them) and the other
/// nodes of the layer lose their readers. Returns the layers fused.
pub fn fuse_decode_layers(g: &mut Graph, accept: &dyn Fn(&Tensor, &[&Tensor]) -> bool) -> usize {
    let needed = needed_nodes(g);
    let ids: Vec<TensorId> = g
        .tensors()
        .iter()
        .enumerate()
        .filter(|&(i, t)| needed[i] && !matches!(t.op, Op::Leaf(_) | Op::View))
        .map(|(i, _)| TensorId::from_index(i))
        .collect();
    let mut fused = 0;
    let mut j = 0;
    while j + LAYER_NODES <= ids.len() {
        let nodes = g.tensors();
        // A layer without q/k norms, else one with them.
        let found = [LAYER_NODES, NORMED_NODES]
            .iter()
            .filter_map(|&n| ids.get(j..j + n))
            .find_map(|w| {
                let (l, norms) = pattern(w)?;
                (is_layer(nodes, &l, norms) && !escapes(g, w, &needed))
                    .then(|| fused_node(g, &l, norms))
                    .flatten()
                    .map(|node| (w, l, node))
            })
            .filter(|(_, _, n)| {
                let srcs: Vec<&Tensor> = n.src.iter().map(|s| &nodes[s.index()]).collect();
                accept(n, &srcs)
            });
        let Some((w, l, node)) = found else {
            j += 1;
            continue;
        };
        let width = w.len();
        // The cache writes: views of their caches now, with no side effect of their own.
        for &w in &l[6..8] {
            let t = &mut g.nodes[w.index()];
            let cache = t.src[0];
            t.op = Op::View;
            t.src = vec![cache];
            t.view_of = Some((cache, 0));
        }
        g.nodes[l[LAYER_NODES - 1].index()] = node;
        fused += 1;
        j += width;
    }
    fused
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tensor::{Act, AttnParams, DType, RopeMode, RopeParams};

    /// `n_layer` llama-family decode layers (one token) as the model plans build them, then
    /// optimized: the graph and each layer's q projection.
    pub(crate) fn llama_decode(n_layer: usize) -> (Graph, Vec<TensorId>) {
        decode_graph(n_layer, "llama")
    }

    /// [`llama_decode`] for `arch` llama, qwen2 (biases added to the q, k and v projections,
    /// NeoX rope) or qwen3 (each q and k head RMS-normed before the rope, NeoX rope).
    fn decode_graph(n_layer: usize, arch: &str) -> (Graph, Vec<TensorId>) {
        decode_graph_of(n_layer, arch, [256, 64, 4, 2, 512])
    }

    /// [`decode_graph`] of `[n_embd, head_dim, n_head, n_head_kv, n_ff]`.
    pub(crate) fn decode_graph_of(
        n_layer: usize,
        arch: &str,
        [e, hd, nh, nkv, ff]: [usize; 5],
    ) -> (Graph, Vec<TensorId>) {
        let (qwen2, qwen3) = (arch == "qwen2", arch == "qwen3");
        let ctx = 32;
        let mut g = Graph::new();
        let pos = g.input("pos", DType::I32, &[1]).expect("pos");
        let mut x = g.input("x", DType::F32, &[e, 1]).expect("x");
        let mut qs = Vec::new();
        let mode = if qwen2 || qwen3 {
            RopeMode::Neox
        } else {
            RopeMode::Normal
        };
        let rope = RopeParams::new(mode, hd, 10000.0, 1.0);
        for il in 0..n_layer {
            let w = |g: &mut Graph, n: &str, s: &[usize], t| g.weight(&format!("{n}.{il}"), t, s);
            let an = w(&mut g, "attn_norm", &[e], DType::F32).expect("w");
            let n = g.rms_norm(x, 1e-5).expect("norm");
            let h = g.mul(n, an).expect("mul");
            let wq = w(&mut g, "q", &[e, hd * nh], DType::Q4_K).expect("w");
            let wk = w(&mut g, "k", &[e, hd * nkv], DType::Q4_K).expect("w");
            let wv = w(&mut g, "v", &[e, hd * nkv], DType::Q6_K).expect("w");
            let mut q = g.mul_mat(wq, h).expect("q");
            let mut k = g.mul_mat(wk, h).expect("k");
            let mut v = g.mul_mat(wv, h).expect("v");
            if qwen2 {
                for (y, name, n) in [(&mut q, "bq", nh), (&mut k, "bk", nkv), (&mut v, "bv", nkv)] {
                    let b = w(&mut g, name, &[hd * n], DType::F32).expect("w");
                    *y = g.add(*y, b).expect("bias");
                }
            }
            qs.push(q);
            let mut q3 = g.reshape(q, &[hd, nh, 1]).expect("r");
            let mut k3 = g.reshape(k, &[hd, nkv, 1]).expect("r");
            if qwen3 {
                for (y, name) in [(&mut q3, "qn"), (&mut k3, "kn")] {
                    let nw = w(&mut g, name, &[hd], DType::F32).expect("w");
                    let n = g.rms_norm(*y, 1e-5).expect("norm");
                    *y = g.mul(n, nw).expect("mul");
                }
            }
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
                sinks: false,
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
        (g, qs)
    }

    /// The launched nodes of `g` that a run needs, by op name.
    fn launched(g: &Graph) -> Vec<&'static str> {
        let needed = needed_nodes(g);
        g.tensors()
            .iter()
            .enumerate()
            .filter(|&(i, t)| needed[i] && !matches!(t.op, Op::Leaf(_) | Op::View))
            .map(|(_, t)| t.op.name())
            .collect()
    }

    #[test]
    fn each_decode_layer_becomes_one_node_that_writes_its_caches() {
        let (mut g, _) = llama_decode(3);
        assert_eq!(launched(&g).len(), 3 * LAYER_NODES);
        assert_eq!(fuse_decode_layers(&mut g, &|_, _| true), 3);
        assert_eq!(launched(&g), ["decode_layer"; 3]);
        let nodes = g.tensors();
        let ids: Vec<usize> = (0..nodes.len())
            .filter(|&i| matches!(nodes[i].op, Op::DecodeLayer(_)))
            .collect();
        for (il, &i) in ids.iter().enumerate() {
            let t = &nodes[i];
            let name = |k: usize| &nodes[g.storage_root(t.src[k]).0.index()].name;
            assert_eq!(name(layer_src::WQ), &format!("q.{il}"));
            assert_eq!(name(layer_src::K), &format!("ck.{il}"));
            assert_eq!(name(layer_src::V), &format!("cv.{il}"));
            assert_eq!(name(layer_src::W_DOWN), &format!("down.{il}"));
            assert_eq!(t.src.len(), layer_src::W_DOWN + 1);
            assert!(g.writes_persistent(TensorId::from_index(i)));
            let Op::DecodeLayer(p) = t.op else {
                unreachable!("filtered above")
            };
            assert_eq!((p.n_head, p.head_dim, p.act), (4, 64, Act::Silu));
        }
        // Each layer reads the residual the one before it leaves; the last is the output.
        assert_eq!(nodes[ids[1]].src[layer_src::X].index(), ids[0]);
        assert_eq!(g.outputs()[0].index(), ids[2]);
    }

    #[test]
    fn qwen2_layers_fuse_with_their_biases_and_neox_rope() {
        let (mut g, _) = decode_graph(2, "qwen2");
        assert_eq!(launched(&g).len(), 2 * LAYER_NODES);
        assert_eq!(fuse_decode_layers(&mut g, &|_, _| true), 2);
        assert_eq!(launched(&g), ["decode_layer"; 2]);
        let nodes = g.tensors();
        for (il, t) in nodes
            .iter()
            .filter(|t| matches!(t.op, Op::DecodeLayer(_)))
            .enumerate()
        {
            let Op::DecodeLayer(p) = t.op else {
                unreachable!("filtered above")
            };
            assert!(p.qkv_bias);
            assert_eq!(p.rope.mode, RopeMode::Neox);
            // No frequency factors: the biases are the last operands.
            assert_eq!(t.src.len(), p.freq_factors_src());
            let name = |k: usize| &nodes[g.storage_root(t.src[k]).0.index()].name;
            assert_eq!(name(layer_src::WQ), &format!("q.{il}"));
            assert_eq!(name(layer_src::BQ), &format!("bq.{il}"));
            assert_eq!(name(layer_src::BK), &format!("bk.{il}"));
            assert_eq!(name(layer_src::BV), &format!("bv.{il}"));
        }
        // A llama layer has no bias operands.
        let (mut g, _) = llama_decode(1);
        assert_eq!(fuse_decode_layers(&mut g, &|_, _| true), 1);
        let t = g
            .tensors()
            .iter()
            .find(|t| matches!(t.op, Op::DecodeLayer(_)));
        let Some(Tensor {
            op: Op::DecodeLayer(p),
            src,
            ..
        }) = t
        else {
            panic!("no fused layer")
        };
        assert!(!p.qkv_bias);
        assert_eq!(p.qk_norm, None);
        assert_eq!(src.len(), layer_src::W_DOWN + 1);
    }

    #[test]
    fn qwen3_layers_fuse_with_their_q_and_k_norms() {
        let (mut g, _) = decode_graph(3, "qwen3");
        assert_eq!(launched(&g).len(), 3 * (LAYER_NODES + 2));
        assert_eq!(fuse_decode_layers(&mut g, &|_, _| true), 3);
        assert_eq!(launched(&g), ["decode_layer"; 3]);
        let nodes = g.tensors();
        let fused: Vec<usize> = (0..nodes.len())
            .filter(|&i| matches!(nodes[i].op, Op::DecodeLayer(_)))
            .collect();
        for (il, &i) in fused.iter().enumerate() {
            let t = &nodes[i];
            let Op::DecodeLayer(p) = t.op else {
                unreachable!("filtered above")
            };
            assert_eq!((p.qk_norm, p.qkv_bias), (Some(1e-5), false));
            assert_eq!(p.rope.mode, RopeMode::Neox);
            assert_eq!(t.src.len(), p.freq_factors_src());
            let name = |k: usize| &nodes[g.storage_root(t.src[k]).0.index()].name;
            assert_eq!(name(layer_src::Q_NORM), &format!("qn.{il}"));
            assert_eq!(name(layer_src::K_NORM), &format!("kn.{il}"));
            assert_eq!(name(layer_src::K), &format!("ck.{il}"));
            assert_eq!(name(layer_src::W_DOWN), &format!("down.{il}"));
        }
        // Each layer reads the residual the one before it leaves.
        assert_eq!(nodes[fused[2]].src[layer_src::X].index(), fused[1]);
        // A normed q read elsewhere keeps its layer apart.
        let (mut g, _) = decode_graph(2, "qwen3");
        let qn = g
            .tensors()
            .iter()
            .position(|t| matches!(t.op, Op::RmsNormMul { .. }) && t.ne[0] == 64)
            .map(TensorId::from_index)
            .expect("a q norm");
        g.mark_output(qn).expect("out");
        assert_eq!(fuse_decode_layers(&mut g, &|_, _| true), 1);
    }

    #[test]
    fn layers_the_device_refuses_or_whose_results_are_read_stay_apart() {
        let (mut g, _) = llama_decode(2);
        // Only the second layer's weights are on the device that takes the node.
        let second = |t: &Tensor, s: &[&Tensor]| {
            matches!(t.op, Op::DecodeLayer(_)) && s[layer_src::WQ].name == "q.1"
        };
        assert_eq!(fuse_decode_layers(&mut g, &second), 1);
        let ops = launched(&g);
        assert_eq!(ops.len(), LAYER_NODES + 1);
        assert_eq!(ops[LAYER_NODES], "decode_layer");
        // A q projection wanted as an output: a fused layer would not write it.
        let (mut g, qs) = llama_decode(2);
        g.mark_output(qs[1]).expect("out");
        assert_eq!(fuse_decode_layers(&mut g, &|_, _| true), 1);
        // A device that takes no layer leaves the graph as it was.
        let (mut g, _) = llama_decode(1);
        let before = launched(&g).len();
        assert_eq!(fuse_decode_layers(&mut g, &|_, _| false), 0);
        assert_eq!(launched(&g).len(), before);
    }
}
