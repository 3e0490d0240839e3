//! Grouped decode mat-vecs: the q, k and v projections of a decode step (`mul_mat` nodes reading
//! the same activations) in one launch of a `*_multi` kernel instead of three.

use gpu_mem::MemRange;

use super::ops::{supports, weight_type, Args, K_SPLIT_FROM, MATVEC_MAX_COLS};
use super::{addr, HipDevice};
use crate::backend::GroupNode;
use crate::error::Result;
use crate::tensor::{Op, Tensor};

/// Nodes one `*_multi` launch takes at most.
const GROUP_MAX: usize = 3;

/// True when `t` (with operands `w`, `x`) fits the grouped kernel next to `first`: a decode
/// `mul_mat` of the same weight type, row length and row size, on the same activations.
fn joins(first: &GroupNode<'_>, t: &GroupNode<'_>) -> bool {
    let [w, x] = t.srcs.as_slice() else {
        return false;
    };
    let [w0, x0] = first.srcs.as_slice() else {
        return false;
    };
    let ts: Vec<&Tensor> = t.srcs.iter().map(|m| m.tensor).collect();
    t.tensor.op == Op::MulMat
        && supports(t.tensor, &ts)
        && t.tensor.is_contiguous()
        && w.tensor.dtype == w0.tensor.dtype
        && w.tensor.ne[0] == w0.tensor.ne[0]
        && w.tensor.nb[1] == w0.tensor.nb[1]
        && w.tensor.ne[2] * w.tensor.ne[3] == 1
        && std::ptr::eq(x.buffer, x0.buffer)
        && x.offset == x0.offset
        && x.tensor.ne == x0.tensor.ne
        && x.tensor.nb == x0.tensor.nb
}

/// Queues the longest leading run of `group` the `*_multi` kernels take (two or three nodes) as
/// one launch and returns its length; 0 when fewer than two qualify.
pub(crate) fn launch(d: &HipDevice, group: &[GroupNode<'_>]) -> Result<usize> {
    let Some(first) = group.first() else {
        return Ok(0);
    };
    let [w0, x0] = first.srcs.as_slice() else {
        return Ok(0);
    };
    let (k, m) = (w0.tensor.ne[0], x0.tensor.nrows());
    let Some(wt) = weight_type(w0.tensor.dtype) else {
        return Ok(0);
    };
    let Some(kid) = wt.matvec_multi() else {
        return Ok(0);
    };
    // Rows the plain path would split across a block's warps stay on it.
    if m > MATVEC_MAX_COLS || (k >= K_SPLIT_FROM && wt == kernels::WeightType::Q8_0) {
        return Ok(0);
    }
    let n = group
        .iter()
        .take(GROUP_MAX)
        .take_while(|t| joins(first, t))
        .count();
    if n < 2 {
        return Ok(0);
    }
    let group = &group[..n];
    let mut outs = Vec::with_capacity(GROUP_MAX);
    let mut ws = Vec::with_capacity(GROUP_MAX);
    let mut rows = [0i32; GROUP_MAX];
    let mut grid = 0u32;
    for (i, t) in group.iter().enumerate() {
        let out = addr(&t.dst)?;
        d.inner.q8.lock().written(out.addr(), out.len());
        outs.push(out);
        ws.push(addr(&t.srcs[0])?);
        let nr = t.srcs[0].tensor.ne[1];
        rows[i] = nr as i32;
        grid += nr.div_ceil(wt.matvec_rows_per_block()) as u32;
    }
    let mut cache = d.inner.q8.lock();
    let q8 = cache.quantized(d, addr(x0)?, k, m)?;
    let mut a = Args::new();
    for i in 0..GROUP_MAX {
        a.push(ws.get(i).copied());
    }
    a.push(MemRange::of_buffer(&q8));
    for i in 0..GROUP_MAX {
        a.push(outs.get(i).copied());
    }
    a.push(k as i32).push(w0.tensor.nb[1] as i64);
    for r in rows {
        a.push(r);
    }
    let r = d.launch_kernel(
        kid,
        [grid, m as u32, 1],
        kernels::MATVEC_WARPS * d.inner.warp,
        &a.0,
    );
    drop(cache);
    r?;
    d.inner
        .grouped
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(n)
}
