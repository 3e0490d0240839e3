//! Which nodes the HIP device runs ([`supports`]) and how each one maps onto kernel launches
//! ([`launch`]). Shapes follow ggml (`ne[0]` innermost, `nb` byte strides).

use std::sync::Arc;

use gpu_mem::{DeviceBuffer, KernelArg, MemRange};
use kernels::{act, binary, KernelId, WeightType};

use super::matmul::{mmq_max_cols, mul_mat, mul_mat_bias, mul_mat_gated};
use super::{addr, gpu_err, HipDevice};
use crate::backend::TensorMem;
use crate::error::{GraphError, Result};
use crate::tensor::{Act, DType, Op, Tensor};

/// Columns up to which `mul_mat` uses the integer mat-vec kernels instead of dequant + gemmEx
/// (for quantized weights only below `MMQ_MIN_COLS`).
pub(super) const MATVEC_MAX_COLS: usize = 8;
/// Columns from which `mul_mat` and the gated product take the integer tile kernels (`mmq.hip`)
/// for quantized weights instead of the mat-vecs, grouped or not (kernels/PERF.md, "Batched
/// products: thresholds").
pub(super) const MMQ_MIN_COLS: usize = 5;
/// Columns up to which they take them instead of dequantization to f16 + gemmEx (the same),
/// where the products run as dp4a-style 8-bit dot products (AMD, NVIDIA before compute
/// capability 8.0).
pub(super) const MMQ_MAX_COLS: usize = 32;
/// The same where they run on the tensor cores (NVIDIA, compute capability 8.0 and later:
/// `MMQ_MMA` in mmq.hip, tiles of up to 128 vectors; kernels/PERF.md, "Batched products:
/// thresholds with tensor cores": at 256 vectors gemmEx wins for every type and shape).
pub(super) const MMQ_MMA_MAX_COLS: usize = 128;
/// The same for Q6_K weights, whose 128-vector tiles lose to gemmEx at every shape measured (up
/// to 1.6x; kernels/PERF.md, the same section).
pub(super) const MMQ_MMA_MAX_COLS_Q6_K: usize = 64;
/// Threads per block of `rms_norm_q8_split_f32` (four values each per block slice).
const RMS_Q8_SPLIT_THREADS: u32 = 256;
/// Value steps of four per thread the one-block RMS norm kernels take (`RMS_Q8_STEPS` in ops.hip).
pub(super) const RMS_Q8_STEPS: usize = 4;
/// Row length from which Q8_0 decode mat-vecs split each row across a block's warps. H200,
/// `cargo bench -p rocmforge-kernels --bench decode`, 4096x14336 (Llama-3-8B FFN down): Q8_0 22.2 -> 20.3
/// us; Q4_K (11.4 -> 13.1) and Q6_K (19.2 -> 22.5) are faster with a row per warp, so they keep it.
pub(super) const K_SPLIT_FROM: usize = 8192;

/// A launch's arguments in the kernel's parameter order; `launch_checked` matches them against
/// the kernel's parameter table.
pub(super) struct Args<'a>(pub(super) Vec<KernelArg<'a>>);

impl<'a> Args<'a> {
    pub(super) fn new() -> Self {
        Self(Vec::with_capacity(16))
    }

    pub(super) fn push(&mut self, v: impl Into<KernelArg<'a>>) -> &mut Self {
        self.0.push(v.into());
        self
    }
}

/// The activations last quantized for the mat-vec kernels, kept while their source is unchanged:
/// q/k/v (and gate/up) multiply the same normalized input, so one quantization serves them all.
/// Every launch reports its destination ([`Q8Cache::written`]) and every host write or new
/// buffer clears the cache, so a hit always means the source bytes are the ones quantized.
#[derive(Default)]
pub(crate) struct Q8Cache {
    buf: Option<Arc<DeviceBuffer<u8>>>,
    /// (source address, source bytes, values per vector, vectors) of what `buf` holds.
    key: Option<(u64, usize, usize, usize)>,
}

impl Q8Cache {
    /// Forgets the cached quantization.
    pub(crate) fn clear(&mut self) {
        self.key = None;
    }

    /// The device buffer quantizations go to (kept alive by captured graphs that write it).
    pub(crate) fn buffer(&self) -> Option<Arc<DeviceBuffer<u8>>> {
        self.buf.clone()
    }

    /// Forgets the cached quantization when `addr..addr + bytes` overlaps its source.
    pub(crate) fn written(&mut self, addr: u64, bytes: usize) {
        if let Some((src, len, ..)) = self.key {
            if addr < src + len as u64 && src < addr + bytes as u64 {
                self.key = None;
            }
        }
    }

    /// The quantization buffer, grown to hold `m` vectors of `k` values (forgetting what it
    /// held when it grows).
    pub(super) fn ensure(
        &mut self,
        d: &HipDevice,
        k: usize,
        m: usize,
    ) -> Result<Arc<DeviceBuffer<u8>>> {
        let bytes = m * kernels::q8_1_vector_bytes(k);
        if self.buf.as_ref().is_none_or(|b| b.len() < bytes) {
            if d.inner.capturing.load(std::sync::atomic::Ordering::Relaxed) {
                // Growing synchronizes, which a capture forbids (the caller falls back).
                return Err(gpu_err(
                    "quantize",
                    "q8 buffer would grow during graph capture",
                ));
            }
            // Queued mat-vecs may still read the old buffer.
            d.inner
                .sb
                .stream()
                .synchronize()
                .map_err(|e| gpu_err("quantize", e))?;
            self.key = None;
            self.buf = None;
            self.buf = Some(Arc::new(
                DeviceBuffer::new(
                    &d.inner.dev,
                    bytes.max(1 << 16),
                    "hip-backend q8 activations",
                )
                .map_err(|e| gpu_err("quantize", e))?,
            ));
        }
        self.buf
            .clone()
            .ok_or_else(|| gpu_err("quantize", "q8 buffer missing"))
    }

    /// Records that the buffer now holds `x` (`m` vectors of `k` values) quantized.
    pub(super) fn holds(&mut self, x: &MemRange<'_>, k: usize, m: usize) {
        self.key = Some((x.addr(), x.len(), k, m));
    }

    /// `x` (`m` dense f32 vectors of `k` values) quantized to planar Q8_1, quantizing it now
    /// unless the cache already holds it.
    pub(super) fn quantized(
        &mut self,
        d: &HipDevice,
        x: MemRange<'_>,
        k: usize,
        m: usize,
    ) -> Result<Arc<DeviceBuffer<u8>>> {
        if k.checked_mul(m)
            .and_then(|n| n.checked_mul(4))
            .is_none_or(|b| b > x.len())
        {
            return Err(gpu_err(
                "quantize",
                format!("{m} vectors of {k} f32 values exceed {} bytes", x.len()),
            ));
        }
        let key = (x.addr(), x.len(), k, m);
        let q8 = self.ensure(d, k, m)?;
        if self.key != Some(key) {
            self.key = None;
            let mut a = Args::new();
            a.push(x)
                .push(MemRange::of_buffer(&q8))
                .push(k as i32)
                .push(k as i64);
            // SAFETY: `x` holds m dense vectors of k f32 values (checked above), and `ensure`
            // sized `q8` for m quantized vectors of k values.
            unsafe {
                d.launch_kernel(
                    KernelId::QuantizeQ8_1,
                    [blocks(k, 256), m as u32, 1],
                    256,
                    &a.0,
                )?
            };
            self.key = Some(key);
        }
        Ok(q8)
    }
}

pub(super) fn weight_type(t: DType) -> Option<WeightType> {
    WeightType::from_ggml_name(t.name())
}

/// The dequantize-to-f16 kernel of a quantized type (the `WeightType`s and MXFP4).
pub(super) fn dequant_kernel(t: DType) -> Option<KernelId> {
    match t {
        DType::MXFP4 => Some(KernelId::DequantF16Mxfp4),
        _ => weight_type(t).map(WeightType::dequant_f16),
    }
}

/// Whether the quantized-weight kernels read `t` with rows of `k` values: the `WeightType`s
/// and MXFP4 (32-value blocks).
pub(super) fn quant_rows_ok(t: DType, k: usize) -> bool {
    match t {
        DType::MXFP4 => k.is_multiple_of(32),
        _ => weight_type(t).is_some_and(|wt| k.is_multiple_of(wt.block_values())),
    }
}

/// Dense rows, and rows evenly strided across dims 1..3 (one row stride describes them all).
fn rows_uniform(t: &Tensor) -> bool {
    t.rows_contiguous() && t.nb[2] == t.nb[1] * t.ne[1] && t.nb[3] == t.nb[2] * t.ne[2]
}

pub(super) fn f32_rows(t: &Tensor) -> bool {
    t.dtype == DType::F32 && rows_uniform(t)
}

pub(super) fn dense(t: &Tensor, dt: DType) -> bool {
    t.dtype == dt && t.is_contiguous()
}

/// True when `b` broadcasts onto `a` in a way `binary_f32` expresses.
fn broadcastable(a: &Tensor, b: &Tensor) -> bool {
    b.dtype == DType::F32
        && b.rows_contiguous()
        && (b.ne[0] == a.ne[0] || b.ne[0] == 1)
        && (b.nrows() == 1 || (b.ne[1..] == a.ne[1..] && rows_uniform(b)))
}

/// Whether the HIP device runs `t` with operands `srcs`.
pub(crate) fn supports(t: &Tensor, srcs: &[&Tensor]) -> bool {
    let out_f32 = dense(t, DType::F32);
    match (&t.op, srcs) {
        (Op::MulMat, [w, x]) => {
            let wt_ok =
                quant_rows_ok(w.dtype, w.ne[0]) || matches!(w.dtype, DType::F32 | DType::F16);
            wt_ok
                && w.is_contiguous()
                && w.ne[2] == 1
                && w.ne[3] == 1
                && dense(x, DType::F32)
                && out_f32
        }
        (Op::MulMatAdd, [w, x, b]) => {
            supports(&mul_mat_shape(t), &[w, x])
                && dense(b, DType::F32)
                && b.ne[0] == t.ne[0]
                && b.nrows() == 1
        }
        (Op::MulMatGated(_), [wg, wu, x]) => {
            wg.dtype == wu.dtype
                && wg.ne == wu.ne
                && wg.nb == wu.nb
                && supports(&mul_mat_shape(t), &[wg, x])
        }
        (Op::RmsNormMul { .. }, [a, w]) => {
            f32_rows(a) && dense(w, DType::F32) && w.ne[0] == a.ne[0] && w.nrows() == 1 && out_f32
        }
        (Op::RmsNorm { .. }, [a]) | (Op::Unary(_), [a]) => f32_rows(a) && out_f32,
        (Op::Scale(_), [a]) => dense(a, DType::F32) && out_f32,
        (Op::Add | Op::Mul, [a, b]) => f32_rows(a) && broadcastable(a, b) && out_f32,
        (Op::Gated(_), [g, u]) => f32_rows(g) && f32_rows(u) && g.ne == u.ne && out_f32,
        (Op::Rope(p), [x, pos, rest @ ..]) => {
            let ff_ok = match rest {
                [] => true,
                [ff] => dense(ff, DType::F32) && ff.nelements() >= p.n_dims / 2,
                _ => false,
            };
            f32_rows(x)
                && x.ne[3] == 1
                && x.ne[0] % 2 == 0
                && p.n_dims % 2 == 0
                && p.n_dims <= x.ne[0]
                && dense(pos, DType::I32)
                && pos.nelements() >= x.ne[2]
                && ff_ok
                && out_f32
        }
        (Op::SoftMax { .. }, [a, rest @ ..]) => {
            let mask_ok = match rest {
                [] => true,
                [m] => {
                    f32_rows(m)
                        && m.ne[0] == a.ne[0]
                        && m.ne[1] == a.ne[1]
                        && m.ne[2] == 1
                        && m.ne[3] == 1
                }
                _ => false,
            };
            f32_rows(a) && mask_ok && out_f32
        }
        (Op::GetRows, [table, ids]) => {
            let tt_ok = quant_rows_ok(table.dtype, table.ne[0])
                || matches!(table.dtype, DType::F32 | DType::F16);
            tt_ok
                && table.is_contiguous()
                && table.ne[2] == 1
                && table.ne[3] == 1
                && dense(ids, DType::I32)
                && ids.ne[1] == 1
                && ids.ne[2] == 1
                && ids.ne[3] == 1
                && out_f32
        }
        // The scheduler asks with every source ([dst, src, idx]); launches pass the sources
        // minus the written destination ([src, idx]). `t` describes the destination either way.
        (Op::SetRows, [.., src, idx]) if srcs.len() <= 3 => {
            (matches!(t.dtype, DType::F16 | DType::F32)
                || (t.dtype == DType::Q8_0 && t.ne[0].is_multiple_of(32)))
                && t.rows_contiguous()
                && t.ne[2] * t.ne[3] == 1
                && src.dtype == DType::F32
                && src.rows_contiguous()
                && src.ne[0] == t.ne[0]
                && src.ne[2] * src.ne[3] == 1
                && dense(idx, DType::I32)
                && idx.nelements() >= src.ne[1]
        }
        (Op::Argmax, [a]) => f32_rows(a) && dense(t, DType::I32),
        (Op::AllReduce, [first, ..]) => {
            out_f32
                && t.is_contiguous()
                && srcs
                    .iter()
                    .all(|s| dense(s, DType::F32) && s.ne == first.ne)
        }
        (
            Op::ArgTopK(_)
            | Op::ExpertWeights { .. }
            | Op::MulMatId
            | Op::SwigluOai { .. }
            | Op::MoeSum,
            _,
        ) => super::moe::supports(t, srcs),
        // Soft-capped scores have no GPU kernel yet: such layers run on the CPU.
        (Op::Attention(p), [q, k, v, pos, rest @ ..]) => {
            let d = q.ne[0];
            p.softcap.is_none()
                && sinks_ok(p.sinks, rest, q.ne[1])
                && q.dtype == DType::F32
                && q.rows_contiguous()
                && q.ne[3] == 1
                && kv_cache_type(k, d)
                && v.dtype == k.dtype
                && k.rows_contiguous()
                && v.rows_contiguous()
                && k.ne[0] == d
                && v.ne[0] == d
                && d <= kernels::ATTN_MAX_HEAD_DIM
                && k.ne[1] > 0
                && q.ne[1] % k.ne[1] == 0
                && v.ne[1] == k.ne[1]
                && v.ne[2] == k.ne[2]
                && k.ne[3] == 1
                && v.ne[3] == 1
                && dense(pos, DType::I32)
                && pos.nelements() >= q.ne[2]
                && out_f32
        }
        (Op::PagedAttention { params, .. }, [q, k, v, pos, seq, tables, rest @ ..]) => {
            let d = q.ne[0];
            params.softcap.is_none()
                && sinks_ok(params.sinks, rest, q.ne[1])
                && q.dtype == DType::F32
                && q.rows_contiguous()
                && kv_cache_type(k, d)
                && v.dtype == k.dtype
                && k.rows_contiguous()
                && v.rows_contiguous()
                && k.ne[0] == d
                && v.ne[0] == d
                && d <= kernels::ATTN_MAX_HEAD_DIM
                && k.ne[1] > 0
                && q.ne[1] % k.ne[1] == 0
                && v.ne[1] == k.ne[1]
                && dense(pos, DType::I32)
                && dense(seq, DType::I32)
                && dense(tables, DType::I32)
                && out_f32
        }
        _ => false,
    }
}

/// The operands after an attention node's fixed ones: none, or with sinks their dense f32 logit
/// per query head (an additive mask is not taken).
fn sinks_ok(sinks: bool, rest: &[&Tensor], n_head: usize) -> bool {
    match rest {
        [] => !sinks,
        [s] => sinks && dense(s, DType::F32) && s.nelements() == n_head,
        _ => false,
    }
}

/// A KV cache the attention kernels read: f16, f32, or Q8_0 rows of whole blocks.
fn kv_cache_type(k: &Tensor, d: usize) -> bool {
    matches!(k.dtype, DType::F16 | DType::F32) || (k.dtype == DType::Q8_0 && d.is_multiple_of(32))
}

/// `t` seen as the plain `mul_mat` a fused mat-mul node extends (same result layout).
fn mul_mat_shape(t: &Tensor) -> Tensor {
    let mut m = t.clone();
    m.op = Op::MulMat;
    m
}

pub(super) fn elems(bytes: usize, t: &Tensor) -> i64 {
    (bytes / t.dtype.type_size()) as i64
}

pub(super) fn blocks(n: usize, per: usize) -> u32 {
    n.div_ceil(per) as u32
}

/// Queues node `t` on the device's stream.
pub(crate) fn launch(
    d: &HipDevice,
    t: &Tensor,
    dst: TensorMem<'_>,
    srcs: &[TensorMem<'_>],
) -> Result<()> {
    let ts: Vec<&Tensor> = srcs.iter().map(|m| m.tensor).collect();
    if !supports(t, &ts) {
        return Err(GraphError::Unsupported {
            backend: "hip",
            op: t.op.name(),
            detail: format!("`{}` has a layout this backend does not take", t.name),
        });
    }
    let out = addr(&dst)?;
    d.inner.q8.lock().written(out.addr(), out.len());
    let warp = d.inner.warp;
    let mut a = Args::new();
    match &t.op {
        Op::MulMat => mul_mat(d, &srcs[0], &srcs[1], out),
        Op::MulMatAdd => {
            if mul_mat_bias(d, &srcs[0], &srcs[1], out, Some(addr(&srcs[2])?))? {
                return Ok(());
            }
            // The bias row added in place (same index read then written by one thread).
            let n = t.ne[0];
            a.push(out).push(addr(&srcs[2])?).push(out);
            a.push(n as i32)
                .push(t.nrows() as i32)
                .push(n as i64)
                .push(0i64)
                .push(n as i64);
            a.push(1i32).push(n as i32).push(binary::ADD);
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe {
                d.launch_kernel(
                    KernelId::BinaryF32,
                    [blocks(t.nelements(), 256), 1, 1],
                    256,
                    &a.0,
                )
            }
        }
        Op::MulMatGated(kind) => mul_mat_gated(d, *kind, srcs, out),
        Op::RmsNorm { .. } | Op::RmsNormMul { .. } => {
            let eps = match t.op {
                Op::RmsNorm { eps } | Op::RmsNormMul { eps } => eps,
                _ => 0.0,
            };
            let x = srcs[0].tensor;
            let w = match srcs.get(1) {
                Some(m) => Some(addr(m)?),
                None => None,
            };
            let (k, m) = (x.ne[0], x.nrows());
            if m <= MATVEC_MAX_COLS.max(mmq_max_cols(d)) && k % 32 == 0 && t.is_contiguous() {
                // Decode: the rows also go out quantized for the mat-vecs (or tile kernels)
                // that read them.
                let mut cache = d.inner.q8.lock();
                let q8 = cache.ensure(d, k, m)?;
                a.push(addr(&srcs[0])?)
                    .push(w)
                    .push(out)
                    .push(MemRange::of_buffer(&q8))
                    .push(k as i32);
                a.push(elems(x.nb[1], x)).push(k as i64).push(eps);
                // Four values per thread. Rows longer than one block of 256 threads takes are
                // split over several blocks (each sums the whole row's squares itself); shorter
                // ones run one block per row (faster there, measured on an H200).
                let block = (k / 4).div_ceil(warp as usize) as u32 * warp;
                if block > RMS_Q8_SPLIT_THREADS {
                    // SAFETY: the memory arguments are the node's tensors, sized by the scheduler
                    // for the shapes passed here (a layout `supports` accepts), and buffers sized
                    // above for them.
                    unsafe {
                        d.launch_kernel(
                            KernelId::RmsNormQ8SplitF32,
                            [blocks(k, 4 * RMS_Q8_SPLIT_THREADS as usize), m as u32, 1],
                            RMS_Q8_SPLIT_THREADS,
                            &a.0,
                        )?
                    };
                } else {
                    // SAFETY: the memory arguments are the node's tensors, sized by the scheduler
                    // for the shapes passed here (a layout `supports` accepts), and buffers sized
                    // above for them.
                    unsafe {
                        d.launch_kernel(
                            KernelId::RmsNormQ8F32,
                            [m as u32, 1, 1],
                            block.max(warp),
                            &a.0,
                        )?
                    };
                }
                cache.holds(&out, k, m);
                return Ok(());
            }
            a.push(addr(&srcs[0])?)
                .push(w)
                .push(out)
                .push(x.ne[0] as i32);
            a.push(elems(x.nb[1], x)).push(x.ne[0] as i64).push(eps);
            // About four values per thread: one 256-thread block per 4096-value row took
            // 3-4 us on an H200, most of a decode norm.
            let block = (x.ne[0] / 4).div_ceil(warp as usize) as u32 * warp;
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe {
                d.launch_kernel(
                    KernelId::RmsNormF32,
                    [x.nrows() as u32, 1, 1],
                    block.clamp(warp, 1024),
                    &a.0,
                )
            }
        }
        Op::Scale(s) => {
            let n = t.nelements();
            a.push(addr(&srcs[0])?)
                .push(out)
                .push(n as i64)
                .push(*s)
                .push(0.0f32);
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe { d.launch_kernel(KernelId::ScaleF32, [blocks(n, 256), 1, 1], 256, &a.0) }
        }
        // The partials on this device (all of them, or after an all-reduce the one holding the
        // sum): copied, then each further one added in place.
        Op::AllReduce => {
            let n = t.nelements();
            a.push(addr(&srcs[0])?)
                .push(out)
                .push(n as i64)
                .push(1.0f32)
                .push(0.0f32);
            // SAFETY: the memory arguments are the node's tensors, dense f32 of `n` values
            // (checked by `supports`), sized by the scheduler.
            unsafe { d.launch_kernel(KernelId::ScaleF32, [blocks(n, 256), 1, 1], 256, &a.0)? };
            for s in &srcs[1..] {
                let mut b = Args::new();
                b.push(out).push(addr(s)?).push(out);
                b.push(n as i32)
                    .push(1i32)
                    .push(n as i64)
                    .push(0i64)
                    .push(n as i64);
                b.push(1i32).push(n as i32).push(binary::ADD);
                // SAFETY: as above; each thread reads then writes one element of `out`.
                unsafe { d.launch_kernel(KernelId::BinaryF32, [blocks(n, 256), 1, 1], 256, &b.0)? };
            }
            Ok(())
        }
        Op::Add | Op::Mul => {
            let (x, y) = (srcs[0].tensor, srcs[1].tensor);
            let b_stride = if y.nrows() == 1 { 0 } else { elems(y.nb[1], y) };
            let op = if matches!(t.op, Op::Add) {
                binary::ADD
            } else {
                binary::MUL
            };
            a.push(addr(&srcs[0])?).push(addr(&srcs[1])?).push(out);
            a.push(x.ne[0] as i32)
                .push(x.nrows() as i32)
                .push(elems(x.nb[1], x))
                .push(b_stride)
                .push(x.ne[0] as i64);
            a.push(y.nrows() as i32).push(y.ne[0] as i32).push(op);
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe {
                d.launch_kernel(
                    KernelId::BinaryF32,
                    [blocks(t.nelements(), 256), 1, 1],
                    256,
                    &a.0,
                )
            }
        }
        Op::Unary(kind) | Op::Gated(kind) => {
            let x = srcs[0].tensor;
            let (b, b_stride) = match srcs.get(1) {
                Some(m) => (Some(addr(m)?), elems(m.tensor.nb[1], m.tensor)),
                None => (None, 0i64),
            };
            let k = if *kind == Act::Gelu {
                act::GELU
            } else {
                act::SILU
            };
            a.push(addr(&srcs[0])?)
                .push(b)
                .push(out)
                .push(x.ne[0] as i32)
                .push(x.nrows() as i32);
            a.push(elems(x.nb[1], x))
                .push(b_stride)
                .push(x.ne[0] as i64)
                .push(k);
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe {
                d.launch_kernel(
                    KernelId::ActF32,
                    [blocks(t.nelements(), 256), 1, 1],
                    256,
                    &a.0,
                )
            }
        }
        Op::Rope(p) => {
            let x = srcs[0].tensor;
            let ff = match srcs.get(2) {
                Some(m) => Some(addr(m)?),
                None => None,
            };
            let rows = x.nrows();
            a.push(addr(&srcs[0])?)
                .push(out)
                .push(addr(&srcs[1])?)
                .push(x.ne[1] as i32)
                .push(x.ne[0] as i32);
            a.push(p.n_dims as i32)
                .push(elems(x.nb[1], x))
                .push(x.ne[0] as i64)
                .push(p.freq_base)
                .push(p.freq_scale);
            let corr = p.yarn_corr_dims();
            a.push(ff)
                .push(i32::from(p.mode == crate::tensor::RopeMode::Neox))
                .push(rows as i32)
                .push(p.ext_factor)
                .push(p.mscale())
                .push(corr[0])
                .push(corr[1]);
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe {
                d.launch_kernel(
                    KernelId::RopeF32,
                    [blocks(rows * x.ne[0] / 2, 256), 1, 1],
                    256,
                    &a.0,
                )
            }
        }
        Op::SoftMax { scale } => {
            let x = srcs[0].tensor;
            let (m, ms, mr) = match srcs.get(1) {
                Some(mm) => (
                    Some(addr(mm)?),
                    elems(mm.tensor.nb[1], mm.tensor),
                    mm.tensor.ne[1] as i32,
                ),
                None => (None, 0i64, 1i32),
            };
            a.push(addr(&srcs[0])?)
                .push(m)
                .push(out)
                .push(x.ne[0] as i32)
                .push(elems(x.nb[1], x));
            a.push(x.ne[0] as i64).push(ms).push(mr).push(*scale);
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe { d.launch_kernel(KernelId::SoftmaxF32, [x.nrows() as u32, 1, 1], 256, &a.0) }
        }
        Op::GetRows => {
            let (table, ids) = (srcs[0].tensor, srcs[1].tensor);
            let n = ids.nelements();
            let ncols = table.ne[0];
            a.push(addr(&srcs[0])?)
                .push(addr(&srcs[1])?)
                .push(out)
                .push(ncols as i32);
            let quant = match table.dtype {
                DType::MXFP4 => Some(KernelId::GetRowsMxfp4),
                dt => weight_type(dt).map(WeightType::get_rows),
            };
            match quant {
                Some(kid) => {
                    a.push(table.nb[1] as i64).push(ncols as i64);
                    // SAFETY: the memory arguments are the node's tensors, sized by the scheduler
                    // for the shapes passed here (a layout `supports` accepts), and buffers sized
                    // above for them.
                    unsafe { d.launch_kernel(kid, [blocks(ncols / 32, 64), n as u32, 1], 64, &a.0) }
                }
                None => {
                    let k = if table.dtype == DType::F32 {
                        KernelId::GetRowsF32
                    } else {
                        KernelId::GetRowsF16
                    };
                    a.push(elems(table.nb[1], table)).push(ncols as i64);
                    // SAFETY: the memory arguments are the node's tensors, sized by the scheduler
                    // for the shapes passed here (a layout `supports` accepts), and buffers sized
                    // above for them.
                    unsafe { d.launch_kernel(k, [blocks(ncols, 256), n as u32, 1], 256, &a.0) }
                }
            }
        }
        Op::SetRows => {
            let src = srcs[0].tensor;
            let n = src.ne[1];
            let kid = match t.dtype {
                DType::F16 => KernelId::SetRowsF16,
                DType::Q8_0 => KernelId::SetRowsQ8_0,
                _ => KernelId::SetRowsF32,
            };
            a.push(addr(&srcs[0])?)
                .push(addr(&srcs[1])?)
                .push(out)
                .push(src.ne[0] as i32)
                .push(n as i32);
            // A Q8_0 destination's stride counts 34-byte blocks, one thread quantizing each.
            a.push(elems(src.nb[1], src)).push(elems(t.nb[1], t));
            let threads = n * src.ne[0] / t.dtype.block_size();
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe { d.launch_kernel(kid, [blocks(threads, 256), 1, 1], 256, &a.0) }
        }
        Op::Argmax => {
            let x = srcs[0].tensor;
            a.push(addr(&srcs[0])?)
                .push(out)
                .push(x.ne[0] as i32)
                .push(elems(x.nb[1], x));
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            unsafe { d.launch_kernel(KernelId::ArgmaxF32, [x.nrows() as u32, 1, 1], 256, &a.0) }
        }
        Op::ArgTopK(_)
        | Op::ExpertWeights { .. }
        | Op::MulMatId
        | Op::SwigluOai { .. }
        | Op::MoeSum => super::moe::launch(d, t, srcs, out),
        Op::Attention(p) => super::attn::attention(d, t, p, srcs, out, warp),
        Op::PagedAttention { params, block_size } => {
            super::attn::paged_attention(d, t, params, *block_size, srcs, out, warp)
        }
        _ => Err(GraphError::Unsupported {
            backend: "hip",
            op: t.op.name(),
            detail: "no launch for this op".to_owned(),
        }),
    }
}

pub(super) const ALIGN: usize = 256;
