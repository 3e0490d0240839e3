//! Launch groups: runs of consecutive scheduled nodes a device may take as one launch.

use crate::tensor::{Op, Tensor, TensorId};

/// `id`, then each tensor it is a view of, down to its storage root.
fn view_chain(nodes: &[Tensor], id: TensorId) -> impl Iterator<Item = TensorId> + '_ {
    std::iter::successors(Some(id), |&i| nodes[i.index()].view_of.map(|(p, _)| p))
}

/// Length of the run of nodes at the start of `ids` that a device may launch as one (see
/// [`crate::backend::Device::launch_group`]): `mul_mat`s reading the same activations (at most three: q, k and
/// v), ropes of the same parameters, positions and factors (two: q and k) or `set_rows` of the
/// same indices (two: the K and V cache writes), a chain of `rms_norm * w`, the `add` reading
/// it and the `rms_norm * w` of that sum (a post-norm, the residual add and the next norm), or two
/// independent `rms_norm * w` (q and k norms); 1 when the first node starts no such run.
pub(super) fn group_run(nodes: &[Tensor], ids: &[TensorId]) -> usize {
    let first = &nodes[ids[0].index()];
    let max = match first.op {
        Op::MulMat => 3,
        Op::Rope(_) | Op::SetRows => 2,
        Op::RmsNormMul { .. } => return norm_chain(nodes, ids),
        _ => return 1,
    };
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

/// Length of the chain at the start of `ids`: `rms_norm * w` (the first node), an `add` with it as
/// one operand, then `rms_norm * w` of that sum; each step reads the previous node directly, so a
/// device takes it as one launch only with a kernel that runs the steps in order. Without the
/// `add`, two independent `rms_norm * w` of one row length and epsilon (2).
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
        return if pair { 2 } else { 1 };
    }
    if reads(2, |op| matches!(op, Op::RmsNormMul { .. }), &[0]) {
        3
    } else {
        2
    }
}
