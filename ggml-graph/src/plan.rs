//! The memory planner: liveness analysis and best-fit placement of intermediate tensors in one
//! arena, in the manner of ggml's graph allocator.
//!
//! Every tensor whose storage root is an input leaf or a computing op gets an arena range; views,
//! `cpy` and `set_rows` alias their parent; weights and persistent buffers live outside the arena.
//! A range is taken when its node runs and given back after the last node that reads it (directly or
//! through a view), so later nodes reuse it. Outputs are never given back.

use crate::graph::Graph;
use crate::tensor::{Leaf, Op, TensorId};

/// Alignment of every arena range, in bytes (a cache line; also enough for any SIMD load).
pub const ALIGN: usize = 64;

/// Where each tensor lives in the arena, which nodes must run, and the arena's peak size.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// For each tensor whose storage root is in the arena: that root's byte offset.
    pub offset: Vec<Option<usize>>,
    /// Nodes needed by an output or a persistent write.
    pub needed: Vec<bool>,
    /// First node index at which each arena root is live, and the last (inclusive; `usize::MAX`
    /// for outputs). `None` for tensors that are not arena roots.
    pub live: Vec<Option<(usize, usize)>>,
    /// For a node placed over its first operand's storage (in place): that operand's root.
    pub in_place: Vec<Option<usize>>,
    /// Bytes of arena needed.
    pub peak: usize,
    /// Sum of the sizes of all arena roots (what a planner without reuse would need).
    pub total: usize,
}

fn align_up(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Ops whose kernels can write their result over their first operand (same shape, elementwise
/// or row-wise, reading each row before writing it).
pub fn in_place_op(op: &Op) -> bool {
    matches!(
        op,
        Op::Add
            | Op::Mul
            | Op::Scale(_)
            | Op::RmsNorm { .. }
            | Op::Norm { .. }
            | Op::Unary(_)
            | Op::Gated(_)
            | Op::RmsNormMul { .. }
    )
}

/// Marks the nodes that outputs and persistent writes depend on.
pub fn needed_nodes(graph: &Graph) -> Vec<bool> {
    let n = graph.len();
    let mut needed = vec![false; n];
    for &o in graph.outputs() {
        needed[o.index()] = true;
    }
    for i in 0..n {
        if graph.writes_persistent(TensorId(i as u32)) {
            needed[i] = true;
        }
    }
    for i in (0..n).rev() {
        if !needed[i] {
            continue;
        }
        let t = &graph.nodes[i];
        for s in &t.src {
            needed[s.index()] = true;
        }
        if let Some((p, _)) = t.view_of {
            needed[p.index()] = true;
        }
    }
    needed
}

/// True when a tensor owns arena storage (it is not a view, not a weight or persistent buffer).
pub fn is_arena_root(graph: &Graph, id: TensorId) -> bool {
    let t = &graph.nodes[id.index()];
    match t.op {
        Op::Leaf(Leaf::Input) => true,
        Op::Leaf(_) => false,
        ref op => !op.is_alias(),
    }
}

/// Best-fit allocator over a growing byte range.
#[derive(Default)]
struct FreeList {
    free: Vec<(usize, usize)>,
    end: usize,
}

impl FreeList {
    fn alloc(&mut self, size: usize) -> usize {
        let size = align_up(size.max(1));
        let best = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, &(_, s))| s >= size)
            .min_by_key(|(_, &(_, s))| s)
            .map(|(i, _)| i);
        if let Some(i) = best {
            let (off, s) = self.free[i];
            if s == size {
                self.free.remove(i);
            } else {
                self.free[i] = (off + size, s - size);
            }
            return off;
        }
        // Grow, absorbing a free block that touches the end.
        if let Some(i) = self.free.iter().position(|&(o, s)| o + s == self.end) {
            let (off, _) = self.free.remove(i);
            self.end = off + size;
            return off;
        }
        let off = self.end;
        self.end += size;
        off
    }

    fn release(&mut self, off: usize, size: usize) {
        let size = align_up(size.max(1));
        self.free.push((off, size));
        self.free.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::with_capacity(self.free.len());
        for &(o, s) in &self.free {
            match merged.last_mut() {
                Some(last) if last.0 + last.1 == o => last.1 += s,
                _ => merged.push((o, s)),
            }
        }
        self.free = merged;
    }
}

/// Plans arena placement for `graph`.
pub fn plan(graph: &Graph) -> Plan {
    plan_grouped(graph, &[])
}

/// Plans arena placement for `graph` where the nodes of each of `groups` may run at the same
/// time (one launch of a device taking them as a group): every operand of a group's node stays
/// allocated until the group's last node, and none of them works in place, so no node of a group
/// writes where another one of it still reads.
pub fn plan_grouped(graph: &Graph, groups: &[Vec<TensorId>]) -> Plan {
    let n = graph.len();
    let needed = needed_nodes(graph);
    // The last node of the groups each node is in (itself when in none).
    let mut group_end: Vec<usize> = (0..n).collect();
    let mut grouped = vec![false; n];
    for g in groups.iter().filter(|g| g.len() > 1) {
        let end = g.iter().map(|id| id.index()).max().unwrap_or(0);
        for id in g {
            group_end[id.index()] = group_end[id.index()].max(end);
            grouped[id.index()] = true;
        }
    }
    let mut last_use = vec![None::<usize>; n];
    let mut is_output = vec![false; n];
    for &o in graph.outputs() {
        is_output[graph.storage_root(o).0.index()] = true;
    }
    for (i, t) in graph.nodes.iter().enumerate() {
        if !needed[i] {
            continue;
        }
        let at = group_end[i];
        let mut touch = |id: TensorId| {
            let r = graph.storage_root(id).0.index();
            last_use[r] = Some(last_use[r].map_or(at, |u: usize| u.max(at)));
        };
        for &s in &t.src {
            touch(s);
        }
        if let Some((p, _)) = t.view_of {
            touch(p);
        }
    }
    let mut fl = FreeList::default();
    let mut root_off = vec![None::<usize>; n];
    let mut live = vec![None; n];
    let mut total = 0;
    let mut frees: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut in_place = vec![None; n];
    let mut released = 0;
    let arena = |i: usize| needed[i] && is_arena_root(graph, TensorId(i as u32));
    // Inputs are written before the first node runs: place them first.
    let order = (0..n)
        .filter(|&i| arena(i) && matches!(graph.nodes[i].op, Op::Leaf(_)))
        .chain((0..n).filter(|&i| arena(i) && !matches!(graph.nodes[i].op, Op::Leaf(_))));
    for i in order {
        let t = &graph.nodes[i];
        let size = t.dense_bytes();
        total += align_up(size.max(1));
        let birth = if matches!(t.op, Op::Leaf(_)) { 0 } else { i };
        // Ranges whose last reader ran before this node can be reused by it.
        while released < birth {
            for r in std::mem::take(&mut frees[released]) {
                if let Some(o) = root_off[r] {
                    fl.release(o, graph.nodes[r].dense_bytes());
                }
            }
            released += 1;
        }
        // In place: the first operand is a dense arena root of the same size whose last reader
        // is this node, and no other operand reads it.
        let reuse = match (&t.op, t.src.first()) {
            (op, Some(&s0)) if in_place_op(op) && birth == i && !grouped[i] => {
                let r = s0.index();
                let st = &graph.nodes[r];
                let only_once = t
                    .src
                    .iter()
                    .filter(|&&x| graph.storage_root(x).0.index() == r)
                    .count()
                    == 1;
                let ok = s0 == graph.storage_root(s0).0
                    && root_off[r].is_some()
                    && !is_output[r]
                    && last_use[r] == Some(i)
                    && only_once
                    && st.dtype == t.dtype
                    && st.dense_bytes() == size
                    && st.is_contiguous();
                ok.then_some(r)
            }
            _ => None,
        };
        root_off[i] = match reuse {
            Some(r) => {
                // The range passes to this node: drop the operand's pending release.
                frees[i].retain(|&x| x != r);
                in_place[i] = Some(r);
                root_off[r]
            }
            None => Some(fl.alloc(size)),
        };
        let death = if is_output[i] {
            usize::MAX
        } else {
            last_use[i].unwrap_or(birth).max(birth)
        };
        live[i] = Some((birth, death));
        if death != usize::MAX {
            frees[death].push(i);
        }
    }
    let mut offset = vec![None; n];
    for i in 0..n {
        if !needed[i] {
            continue;
        }
        let (r, o) = graph.storage_root(TensorId(i as u32));
        if let Some(base) = root_off[r.index()] {
            offset[i] = Some(base + o);
        }
    }
    Plan {
        offset,
        needed,
        live,
        in_place,
        peak: fl.end,
        total,
    }
}
