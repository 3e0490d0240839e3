//! The CPU backend: a rayon thread pool and one kernel per op, parallel across rows.

mod attn;
mod matmul;
mod moe;
mod ops;

use parking_lot::Mutex;
use rayon::prelude::*;

use crate::error::{GraphError, Result};
use crate::quant::{detected, Simd};
use crate::tensor::{DType, Op, Tensor};

/// CPU compute: its thread pool, SIMD level and reusable scratch (quantized activations).
pub struct CpuBackend {
    pool: rayon::ThreadPool,
    simd: Simd,
    scratch: Mutex<Vec<u8>>,
    /// See [`CpuBackend::set_column_layout`].
    columns: Mutex<Option<Vec<(u32, u32)>>>,
}

impl CpuBackend {
    /// A backend with `n_threads` worker threads (0: rayon's default, one per core) and the best
    /// SIMD level the CPU has.
    pub fn new(n_threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(n_threads)
            .thread_name(|i| format!("ggml-cpu-{i}"))
            .build()
            .map_err(|e| GraphError::Unsupported {
                backend: "cpu",
                op: "thread pool",
                detail: e.to_string(),
            })?;
        Ok(Self {
            pool,
            simd: detected(),
            scratch: Mutex::new(Vec::new()),
            columns: Mutex::new(None),
        })
    }

    /// Caps the SIMD level at `simd` (tests compare the scalar and SIMD paths through whole graphs).
    pub fn with_simd(mut self, simd: Simd) -> Self {
        self.simd = simd.min(detected());
        self
    }

    /// The SIMD level in use.
    pub fn simd(&self) -> Simd {
        self.simd
    }

    /// For passes over several independent sequences: mat-mul column `j` is summed as column
    /// `layout[j].1` of a product with `layout[j].0` columns, and every column of a product with
    /// another column count than the layout's as a one-column product. The x86 tile kernels
    /// sum K-quant products in an order that depends on the column count (llama.cpp's: see
    /// [`crate::quant::batched_order`]); with the layout each sequence's columns get the bits
    /// they get when the sequence runs alone. `None` (the default): each product in its own
    /// order.
    pub fn set_column_layout(&self, layout: Option<Vec<(u32, u32)>>) {
        *self.columns.lock() = layout;
    }

    /// Worker threads.
    pub fn n_threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Runs `f` on the backend's thread pool: nodes computed inside it (by an executor or a
    /// scheduler over the CPU alone) skip entering the pool once each.
    pub fn install<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }

    /// True when this backend can run `t`'s op with its operand types.
    pub fn supports(&self, t: &Tensor, srcs: &[&Tensor]) -> bool {
        match t.op {
            Op::MulMatGated(_) if srcs[0].dtype != srcs[1].dtype => false,
            Op::MulMat | Op::MulMatAdd | Op::MulMatGated(_) | Op::MulMatId => {
                let w = srcs[0].dtype;
                matches!(w, DType::F32 | DType::F16 | DType::BF16) || crate::quant::is_supported(w)
            }
            // Rows are decoded by `gguf`, which reads every type but the 8-bit activation ones.
            Op::GetRows => !matches!(srcs[0].dtype, DType::Q8_K),
            Op::DecodeLayer(_) => false,
            _ => true,
        }
    }
}

/// An operand: its descriptor and bytes from its first byte to the end of its extent.
pub(crate) struct SrcView<'a> {
    pub t: &'a Tensor,
    pub data: &'a [u8],
    /// The operand occupies exactly the output's bytes (planned in place): read it from the
    /// output; `data` is empty.
    pub aliased: bool,
}

impl SrcView<'_> {
    pub fn f32s(&self) -> Result<&[f32]> {
        if self.aliased {
            return Ok(&[]);
        }
        bytemuck::try_cast_slice(self.data).map_err(|_| GraphError::Misaligned(self.t.name.clone()))
    }

    pub fn i32s(&self) -> Result<&[i32]> {
        bytemuck::try_cast_slice(self.data).map_err(|_| GraphError::Misaligned(self.t.name.clone()))
    }

    /// Byte offset of row `(i1, i2, i3)`.
    #[inline]
    pub fn off(&self, i1: usize, i2: usize, i3: usize) -> usize {
        i1 * self.t.nb[1] + i2 * self.t.nb[2] + i3 * self.t.nb[3]
    }

    /// f32 row `(i1, i2, i3)` of an f32 tensor given as `f32s()`.
    #[inline]
    pub fn row<'b>(&self, all: &'b [f32], i1: usize, i2: usize, i3: usize) -> &'b [f32] {
        let o = self.off(i1, i2, i3) / 4;
        &all[o..o + self.t.ne[0]]
    }
}

/// Splits a flat row index into `(i1, i2, i3)` for shape `ne`.
#[inline]
pub(crate) fn unflatten(r: usize, ne: &[usize; 4]) -> (usize, usize, usize) {
    (r % ne[1], (r / ne[1]) % ne[2], r / (ne[1] * ne[2]))
}

/// Rows per rayon task so small rows are batched.
pub(crate) fn min_rows(ne0: usize) -> usize {
    (4096 / ne0.max(1)).max(1)
}

/// Work below this many output values runs on the calling thread: a rayon dispatch costs more
/// than the work itself (decode runs hundreds of such small ops per token).
const SERIAL_MAX: usize = 1 << 14;

/// Calls `f(row_index, row)` for each `ne0`-long row of `o`, in parallel when the op is large.
pub(crate) fn for_rows(o: &mut [f32], ne0: usize, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    if o.len() <= SERIAL_MAX {
        o.chunks_mut(ne0).enumerate().for_each(|(r, row)| f(r, row));
    } else {
        o.par_chunks_mut(ne0)
            .with_min_len(min_rows(ne0))
            .enumerate()
            .for_each(|(r, row)| f(r, row));
    }
}

/// [`for_rows`] for groups of up to `G` rows: `f(first_row_index, rows)` (the last group may be
/// shorter), so kernels can run several rows' latency-bound chains side by side.
pub(crate) fn for_row_groups<const G: usize>(
    o: &mut [f32],
    ne0: usize,
    f: impl Fn(usize, &mut [f32]) + Sync + Send,
) {
    let ne0 = ne0.max(1);
    if o.len() <= SERIAL_MAX {
        o.chunks_mut(ne0 * G)
            .enumerate()
            .for_each(|(i, rows)| f(i * G, rows));
    } else {
        o.par_chunks_mut(ne0 * G)
            .with_min_len(min_rows(ne0).div_ceil(G))
            .enumerate()
            .for_each(|(i, rows)| f(i * G, rows));
    }
}

pub(crate) fn unsupported(t: &Tensor, detail: String) -> GraphError {
    GraphError::Unsupported {
        backend: "cpu",
        op: t.op.name(),
        detail,
    }
}

pub(crate) fn out_f32<'a>(t: &Tensor, out: &'a mut [u8]) -> Result<&'a mut [f32]> {
    bytemuck::try_cast_slice_mut(out).map_err(|_| GraphError::Misaligned(t.name.clone()))
}

/// Runs one node. `srcs` are its operands, except the written `dst` of `cpy` and `set_rows`.
pub(crate) fn compute(
    be: &CpuBackend,
    t: &Tensor,
    out: &mut [u8],
    srcs: &[SrcView<'_>],
) -> Result<()> {
    match &t.op {
        Op::Leaf(_) | Op::View => Ok(()),
        Op::GetRows => ops::get_rows(t, out, &srcs[0], &srcs[1]),
        Op::MulMat => matmul::mul_mat(be, t, out, &srcs[0], &srcs[1], None),
        Op::MulMatAdd => {
            matmul::mul_mat(be, t, out, &srcs[0], &srcs[1], None)?;
            ops::add_in_place(t, out, &srcs[2])
        }
        Op::MulMatGated(act) => {
            matmul::mul_mat(be, t, out, &srcs[0], &srcs[2], Some((&srcs[1], *act)))
        }
        Op::RmsNormMul { eps } => ops::rms_norm_mul(t, out, &srcs[0], &srcs[1], *eps),
        // Made only for devices that run whole layers (`supports` refuses it).
        Op::DecodeLayer(_) => Err(GraphError::Unsupported {
            backend: "cpu",
            op: t.op.name(),
            detail: format!("`{}`: whole decode layers run on GPUs only", t.name),
        }),
        Op::Add => ops::binary(t, out, &srcs[0], &srcs[1], |a, b| a + b),
        Op::Mul => ops::binary(t, out, &srcs[0], &srcs[1], |a, b| a * b),
        Op::Scale(s) => {
            let s = *s;
            ops::map_rows(t, out, &srcs[0], |o| o.iter_mut().for_each(|v| *v *= s))
        }
        Op::SoftCap(c) => {
            let c = *c;
            ops::map_rows(t, out, &srcs[0], |o| {
                o.iter_mut().for_each(|v| *v = ops::softcap(*v, c))
            })
        }
        Op::RmsNorm { eps } => ops::map_rows(t, out, &srcs[0], |o| ops::rms_norm_in_place(o, *eps)),
        Op::Norm { eps } => ops::map_rows(t, out, &srcs[0], |o| ops::norm_in_place(o, *eps)),
        Op::Unary(act) => {
            let f = ops::act_fn(*act);
            ops::map_rows(t, out, &srcs[0], |o| o.iter_mut().for_each(|v| *v = f(*v)))
        }
        Op::Gated(act) => ops::gated(t, out, &srcs[0], &srcs[1], ops::act_fn(*act)),
        Op::SwigluOai { alpha, limit } => {
            ops::swiglu_oai(t, out, &srcs[0], &srcs[1], *alpha, *limit)
        }
        Op::Rope(p) => attn::rope(t, out, &srcs[0], &srcs[1], srcs.get(2), p),
        Op::SoftMax { scale } => attn::soft_max(t, out, &srcs[0], srcs.get(1), *scale),
        Op::Attention(p) => attn::attention(be, t, out, srcs, p),
        Op::PagedAttention { params, block_size } => {
            attn::paged_attention(be, t, out, srcs, params, *block_size)
        }
        Op::Cpy => ops::cpy(t, out, &srcs[0]),
        Op::Cont => ops::cont(t, out, &srcs[0]),
        Op::Concat { dim } => ops::concat(t, out, &srcs[0], &srcs[1], *dim),
        Op::SetRows => ops::set_rows(t, out, &srcs[0], &srcs[1]),
        Op::AllReduce => ops::sum_all(t, out, srcs),
        Op::Argmax => ops::argmax(t, out, &srcs[0]),
        Op::ArgTopK(k) => moe::arg_top_k(t, out, &srcs[0], *k),
        Op::ExpertWeights { norm } => moe::expert_weights(t, out, &srcs[0], &srcs[1], *norm),
        Op::MulMatId => moe::mul_mat_id(be, t, out, &srcs[0], &srcs[1], &srcs[2]),
        Op::MoeSum => moe::moe_sum(t, out, &srcs[0], &srcs[1], srcs.get(2)),
    }
}

/// Hands `f` the f32 values of `t` stored in `bytes`: in place when they are dense,
/// little-endian f32 at an aligned address (a decode step's logits), else gathered first.
pub(crate) fn with_f32<R>(t: &Tensor, bytes: &[u8], f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    if t.dtype == DType::F32 && t.is_contiguous() && cfg!(target_endian = "little") {
        let dense = bytes.get(..t.nelements() * 4);
        if let Some(v) = dense.and_then(|b| bytemuck::try_cast_slice::<u8, f32>(b).ok()) {
            return Ok(f(v));
        }
    }
    let mut v = vec![0.0; t.nelements()];
    gather_f32(t, bytes, &mut v)?;
    Ok(f(&v))
}

/// Reads a float or I32 tensor in logical order as f32.
pub(crate) fn gather_f32(t: &Tensor, bytes: &[u8], dst: &mut [f32]) -> Result<()> {
    let es = t.dtype.type_size();
    if !matches!(t.dtype, DType::F32 | DType::F16 | DType::BF16 | DType::I32) {
        return Err(unsupported(t, format!("reading {} as f32", t.dtype)));
    }
    // Contiguous f32 (logits every decode step): one copy.
    if t.dtype == DType::F32 && t.is_contiguous() {
        if let Some(src) = bytes.get(..dst.len() * 4) {
            for (d, c) in dst.iter_mut().zip(src.chunks_exact(4)) {
                *d = f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
            return Ok(());
        }
    }
    dst.par_chunks_mut(t.ne[0].max(1))
        .enumerate()
        .for_each(|(r, row)| {
            let (i1, i2, i3) = unflatten(r, &t.ne);
            let base = i1 * t.nb[1] + i2 * t.nb[2] + i3 * t.nb[3];
            for (i0, o) in row.iter_mut().enumerate() {
                let b = &bytes[base + i0 * t.nb[0]..base + i0 * t.nb[0] + es];
                *o = ops::load_scalar(t.dtype, b);
            }
        });
    Ok(())
}
