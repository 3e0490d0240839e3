//! The HIP device's matrix products: the integer mat-vecs on Q8_1 activations for a few
//! columns, the integer tile products (MMQ) for batches, and dequantization to f16 with the BLAS
//! library's GEMM beyond them; plain, with a bias row, and gated (two products and their
//! activation).

use gpu_mem::{GemmShape, MemRange, Op as BlasOp};
use kernels::{act, KernelId, WeightType};

use super::ops::{
    blocks, dequant_kernel, weight_type, Args, Q8Cache, ALIGN, K_SPLIT_FROM, MATVEC_MAX_COLS,
    MMQ_MAX_COLS, MMQ_MIN_COLS, MMQ_MMA_MAX_COLS, MMQ_MMA_MAX_COLS_Q6_K,
};
use super::{addr, gpu_err, HipDevice};
use crate::backend::TensorMem;
use crate::error::Result;
use crate::tensor::{Act, DType};

/// The largest grid.y (and grid.z) a launch may use on every HIP platform.
const MAX_GRID_Y: usize = 65535;

/// Float mat-vecs with fewer output values than this run 8 warps per row instead of 4.
const FLOAT_MATVEC_WIDE_BELOW: usize = 1024;

/// f32 weights of up to this many rows times more vectors than the mat-vecs take run on the
/// float tiles (`gemm_f32_part`, split along the rows' values so that a short output still
/// fills the device) instead of the BLAS library's sgemm, which took 687 us for a router's
/// `[2048, 128]` times 512 vectors (0.27 GFLOP; H200, per-node profile of the Qwen3-30B-A3B
/// shape's prompt, kernels/PERF.md "Expert-grouped products"). Routers have 8 to a few
/// hundred experts.
pub(super) const FLOAT_TILES_MAX_ROWS: usize = 1024;

/// Queues decode mat-vec kernel `kid`: grid x `grid`, one grid row per activation vector (`m`),
/// [`kernels::MATVEC_WARPS`] warps per block. Takes the quantization cache's guard and releases it
/// once the launch is queued, so that no other launch requantizes into the buffer `args` read
/// before this one is on the stream.
///
/// # Safety
/// As for [`HipDevice::launch_kernel`]: `args` meet `kid`'s contract for this grid and `m`.
pub(super) unsafe fn launch_matvec(
    d: &HipDevice,
    kid: KernelId,
    grid: u32,
    m: usize,
    args: &Args<'_>,
    cache: parking_lot::MutexGuard<'_, Q8Cache>,
) -> Result<()> {
    // SAFETY: the caller's promise for `args`, this grid and `m`.
    let r = unsafe {
        d.launch_kernel(
            kid,
            [grid, m as u32, 1],
            kernels::MATVEC_WARPS * d.inner.warp,
            &args.0,
        )
    };
    drop(cache);
    r
}

/// Columns up to which Q4_K/Q6_K products take the column mat-vecs (each weight read once for
/// all columns; [`kernels::WeightType::matvec_cols`]) ahead of the tile kernels, which start at
/// `MMQ_MIN_COLS`: on an H200 the tile products beat them from 5 columns (kernels/PERF.md,
/// "Batched products: thresholds").
pub(super) const COLS_MAX: usize = kernels::MATVEC_COLS_MAX;

/// Whether a product of `m` vectors with `dtype` weights takes the column mat-vecs (then not
/// the tile kernels, whatever [`mmq_takes`] says).
pub(super) fn takes_cols(dtype: DType, m: usize) -> bool {
    cols_kernel(dtype, m, false, false).is_some()
}

/// Column mat-vec launches queued by every device of this process (tests: whether a product
/// took them).
#[cfg(test)]
static COLS_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

#[cfg(test)]
pub(super) fn cols_launches() -> usize {
    COLS_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The column mat-vec for a product of `m` vectors with `dtype` weights, plain or with a bias
/// row, or `gated`; `None` where the one-vector kernels or the tile kernels take it.
fn cols_kernel(dtype: DType, m: usize, bias: bool, gated: bool) -> Option<(WeightType, KernelId)> {
    let wt = weight_type(dtype).filter(|_| m <= COLS_MAX)?;
    let kid = if gated {
        wt.matvec_cols_gated(m)
    } else {
        wt.matvec_cols(m, bias)
    };
    kid.map(|k| (wt, k))
}

/// Queues column mat-vec `kid` (type `wt`) over `n` rows and `m` vectors; releases the
/// quantization cache's guard once queued, as [`launch_matvec`].
///
/// # Safety
/// As for [`HipDevice::launch_kernel`]: `args` meet `kid`'s contract for `n` rows and `m`.
unsafe fn launch_cols(
    d: &HipDevice,
    kid: KernelId,
    wt: WeightType,
    n: usize,
    m: usize,
    args: &Args<'_>,
    cache: parking_lot::MutexGuard<'_, Q8Cache>,
) -> Result<()> {
    // SAFETY: the caller's promise for `args`, `n` and `m`.
    let r = unsafe {
        d.launch_kernel(
            kid,
            kernels::matvec_cols_grid(wt, n, m),
            kernels::MATVEC_WARPS * d.inner.warp,
            &args.0,
        )
    };
    drop(cache);
    #[cfg(test)]
    COLS_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    r
}

pub(super) fn mul_mat(
    d: &HipDevice,
    w: &TensorMem<'_>,
    x: &TensorMem<'_>,
    out: MemRange<'_>,
) -> Result<()> {
    mul_mat_bias(d, w, x, out, None).map(|_| ())
}

/// `mul_mat`, adding the row `bias` in the mat-vec kernel where one of its variants takes it;
/// returns whether it did (the caller adds it otherwise).
pub(super) fn mul_mat_bias(
    d: &HipDevice,
    w: &TensorMem<'_>,
    x: &TensorMem<'_>,
    out: MemRange<'_>,
    bias: Option<MemRange<'_>>,
) -> Result<bool> {
    let wt_ = w.tensor;
    let mat = Mat {
        dtype: wt_.dtype,
        k: wt_.ne[0],
        n: wt_.ne[1],
        row_bytes: wt_.nb[1],
        w: addr(w)?,
    };
    product(d, &mat, addr(x)?, x.tensor.nrows(), out, bias)
}

/// One weight matrix in device memory: `n` rows of `k` values of `dtype`, `row_bytes` apart.
pub(super) struct Mat<'a> {
    pub(super) dtype: DType,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) row_bytes: usize,
    pub(super) w: MemRange<'a>,
}

/// Bytes of the backend scratch [`product`] may use for `m` vectors times `w` (it starts at the
/// scratch's first byte; callers that keep their own data in the scratch put it past this).
pub(super) fn product_scratch(d: &HipDevice, w: &Mat<'_>, m: usize) -> usize {
    let (k, n) = (w.k, w.n);
    let gemm = (m * k * 2).div_ceil(ALIGN) * ALIGN + (n * k * 2).div_ceil(ALIGN) * ALIGN;
    let sms = usize::try_from(d.inner.dev.info().compute_units).unwrap_or(0);
    if float_tiles_take(w.dtype, n, m) {
        return kernels::GemmF32Plan::new(n, m, k, sms).splits * m * n * 4;
    }
    let tiles = if mmq_takes_weight(d, w.dtype, m) && !takes_cols(w.dtype, m) {
        kernels::MmqPlan::new(n, m, k, 1, sms).partial_values(n, m) * 4
    } else {
        0
    };
    gemm.max(tiles)
}

/// `out` (`m` rows of `w.n`) = `w` times `x` (`m` dense f32 vectors of `w.k`), plus the row
/// `bias` in the mat-vec kernel where one of its variants takes it; returns whether it did (the
/// caller adds it otherwise).
pub(super) fn product(
    d: &HipDevice,
    w: &Mat<'_>,
    xp: MemRange<'_>,
    m: usize,
    out: MemRange<'_>,
    bias: Option<MemRange<'_>>,
) -> Result<bool> {
    let (k, n, wp) = (w.k, w.n, w.w);
    let warp = d.inner.warp;
    if w.dtype == DType::MXFP4 && m <= MATVEC_MAX_COLS {
        let mut cache = d.inner.q8.lock();
        let q8 = cache.quantized(d, xp, k, m)?;
        let mut b = Args::new();
        b.push(wp)
            .push(MemRange::of_buffer(&q8))
            .push(out)
            .push(k as i32)
            .push(w.row_bytes as i64)
            .push(n as i32)
            .push(n as i32);
        // SAFETY: `w` holds `n` MXFP4 rows of `k` values, `q8` the `m` vectors quantized above and
        // `out` `m` rows of `n` f32 (the caller's shapes).
        return unsafe {
            launch_matvec(
                d,
                KernelId::MatvecMxfp4,
                kernels::matvec_grid_mxfp4(n),
                m,
                &b,
                cache,
            )
            .map(|()| false)
        };
    }
    if let Some((wt, kid)) = cols_kernel(w.dtype, m, bias.is_some(), false) {
        let mut cache = d.inner.q8.lock();
        let q8 = cache.quantized(d, xp, k, m)?;
        let mut b = Args::new();
        b.push(wp);
        if let Some(bias) = bias {
            b.push(bias);
        }
        b.push(MemRange::of_buffer(&q8))
            .push(out)
            .push(k as i32)
            .push(w.row_bytes as i64)
            .push(n as i32)
            .push(n as i32)
            .push(m as i32);
        // SAFETY: `w` holds `n` rows of `k` values of `wt`, `q8` the `m` vectors quantized above,
        // `bias` (when given) a row of `n` f32 and `out` `m` rows of `n` f32 (the caller's shapes).
        return unsafe { launch_cols(d, kid, wt, n, m, &b, cache).map(|()| bias.is_some()) };
    }
    if let (true, Some(wt)) = (mmq_takes_weight(d, w.dtype, m), weight_type(w.dtype)) {
        let ws = [wp];
        let p = MmqProduct {
            wt,
            ws: &ws,
            row_bytes: w.row_bytes,
            k,
            n,
            m,
            act: None,
        };
        return mmq(d, &p, bias, xp, out).map(|()| bias.is_some());
    }
    if m <= MATVEC_MAX_COLS {
        if let Some(wt) = weight_type(w.dtype) {
            let k_split = k >= K_SPLIT_FROM && wt == kernels::WeightType::Q8_0;
            let variant = wt.matvec_variant(bias.is_some(), k_split);
            let mut cache = d.inner.q8.lock();
            let q8 = cache.quantized(d, xp, k, m)?;
            // The head kernel takes the plain mat-vec's arguments (no bias).
            let head = (m == 1 && bias.is_none() && wt == kernels::WeightType::Q6_K)
                .then(|| super::stack::head_launch(d, &wp, n, k, w.row_bytes))
                .flatten();
            let mut b = Args::new();
            b.push(wp);
            if let Some(bias) = bias {
                b.push(bias);
            }
            b.push(MemRange::of_buffer(&q8))
                .push(out)
                .push(k as i32)
                .push(w.row_bytes as i64)
                .push(n as i32)
                .push(n as i32);
            if let Some((grid, smem)) = head {
                // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for
                // the shapes passed here (a layout `supports` accepts), and buffers sized above for
                // them.
                let r = unsafe {
                    d.launch_kernel_smem(
                        KernelId::HeadQ6_K,
                        [grid, 1, 1],
                        kernels::STACK_THREADS,
                        smem,
                        &b.0,
                    )
                };
                drop(cache);
                r?;
                super::stack::head_launched();
                return Ok(false);
            }
            let grid = if k_split {
                n.div_ceil(wt.matvec_rows_per_warp()) as u32
            } else {
                kernels::matvec_grid(wt, n)
            };
            // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
            // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
            return unsafe {
                launch_matvec(d, variant, grid, m, &b, cache).map(|()| bias.is_some())
            };
        }
        let kid = if w.dtype == DType::F32 {
            KernelId::MatvecF32
        } else {
            KernelId::MatvecF16
        };
        let mut a = Args::new();
        a.push(wp)
            .push(xp)
            .push(out)
            .push(k as i32)
            .push((w.row_bytes / w.dtype.type_size()) as i64)
            .push(n as i32);
        // One block per row: a short output (a router's 128 experts) gets wider blocks, so
        // that enough loads are in flight to approach the memory bandwidth.
        let threads = if n * m < FLOAT_MATVEC_WIDE_BELOW {
            8 * warp
        } else {
            4 * warp
        };
        // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
        // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
        return unsafe {
            d.launch_kernel(kid, [n as u32, m as u32, 1], threads, &a.0)
                .map(|()| false)
        };
    }
    if float_tiles_take(w.dtype, n, m) {
        return float_tiles(d, w, xp, m, out, bias).map(|()| bias.is_some());
    }
    // Column-major view: C (n x m) = op(W) (n x k) * X (k x m), W stored as k x n.
    let shape = GemmShape {
        trans_a: BlasOp::T,
        trans_b: BlasOp::N,
        m: n,
        n: m,
        k,
        lda: k,
        ldb: k,
        ldc: n,
    };
    let blas = d.inner.sb.blas();
    let views = |e| gpu_err("mul_mat", e);
    let mut c = out.view_mut::<f32>().map_err(views)?;
    if w.dtype == DType::F32 {
        let av = wp.view::<f32>().map_err(views)?;
        let bv = xp.view::<f32>().map_err(views)?;
        return blas
            .sgemm(&shape, 1.0, &av, &bv, 0.0, &mut c)
            .map(|()| false)
            .map_err(|e| gpu_err("mul_mat", e));
    }
    let x_bytes = (m * k * 2).div_ceil(ALIGN) * ALIGN;
    let w_bytes = if w.dtype == DType::F16 { 0 } else { n * k * 2 };
    let scratch = d.scratch(x_bytes + w_bytes)?;
    let base = MemRange::of_buffer(&scratch);
    let xh = base.sub(0, m * k * 2).map_err(views)?;
    let mut a = Args::new();
    a.push(xp).push(xh).push((m * k) as i64);
    // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
    // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
    unsafe {
        d.launch_kernel(
            KernelId::ConvertF32F16,
            [blocks(m * k, 256), 1, 1],
            256,
            &a.0,
        )?
    };
    let wh = match dequant_kernel(w.dtype) {
        Some(deq) => {
            let wh = base.sub(x_bytes, n * k * 2).map_err(views)?;
            // Rows go in grid.y, which the hardware caps at 65535 (vocabularies are larger):
            // one launch per slice of rows.
            let row_bytes = w.row_bytes;
            let mut r0 = 0;
            while r0 < n {
                let rows = (n - r0).min(MAX_GRID_Y);
                let src = wp.sub(r0 * row_bytes, rows * row_bytes).map_err(views)?;
                let dst = wh.sub(r0 * k * 2, rows * k * 2).map_err(views)?;
                let mut b = Args::new();
                b.push(src)
                    .push(dst)
                    .push(k as i32)
                    .push(row_bytes as i64)
                    .push(k as i64);
                // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for
                // the shapes passed here (a layout `supports` accepts), and buffers sized above for
                // them.
                unsafe { d.launch_kernel(deq, [blocks(k / 32, 64), rows as u32, 1], 64, &b.0)? };
                r0 += rows;
            }
            wh
        }
        None => wp,
    };
    let av = wh.view::<half::f16>().map_err(views)?;
    let bv = xh.view::<half::f16>().map_err(views)?;
    blas.gemm_ex(&shape, 1.0, &av, &bv, 0.0, &mut c)
        .map(|()| false)
        .map_err(|e| gpu_err("mul_mat", e))
}

/// Whether a product of `m` vectors with `n` rows of `dtype` weights takes [`float_tiles`].
pub(super) fn float_tiles_take(dtype: DType, n: usize, m: usize) -> bool {
    dtype == DType::F32 && m > MATVEC_MAX_COLS && n <= FLOAT_TILES_MAX_ROWS
}

/// `out` (`m` rows of `w.n`) = the f32 matrix `w` times `x` (`m` dense f32 vectors of `w.k`),
/// plus the row `bias` when given: `gemm_f32_part` over the plan's shares of the rows' values
/// into the scratch, then `mmq_combine` adding them up (in share order) with the bias.
fn float_tiles(
    d: &HipDevice,
    w: &Mat<'_>,
    xp: MemRange<'_>,
    m: usize,
    out: MemRange<'_>,
    bias: Option<MemRange<'_>>,
) -> Result<()> {
    let (k, n) = (w.k, w.n);
    let sms = usize::try_from(d.inner.dev.info().compute_units).unwrap_or(0);
    let plan = kernels::GemmF32Plan::new(n, m, k, sms);
    let part_bytes = plan.splits * m * n * 4;
    let scratch = d.scratch(part_bytes)?;
    let part = MemRange::of_buffer(&scratch)
        .sub(0, part_bytes)
        .map_err(|e| gpu_err("mul_mat", e))?;
    d.inner.q8.lock().written(part.addr(), part.len());
    let mut a = Args::new();
    a.push(w.w)
        .push(xp)
        .push(part)
        .push(k as i32)
        .push((w.row_bytes / 4) as i64)
        .push(k as i64)
        .push(n as i32)
        .push(m as i32)
        .push(plan.kper as i32);
    // SAFETY: `w` holds `n` f32 rows of `k` values (`row_bytes` apart), `x` `m` dense vectors
    // of `k` f32 and `part` the plan's `splits` times `m` rows of `n` f32 (sized above); the
    // grid is the plan's.
    unsafe {
        d.launch_kernel(
            KernelId::GemmF32Part,
            plan.grid,
            kernels::GEMM_F32_THREADS,
            &a.0,
        )?
    };
    let mut c = Args::new();
    c.push(part)
        .push(bias)
        .push(out)
        .push(n as i32)
        .push(m as i32)
        .push(n as i32)
        .push(plan.splits as i32)
        .push(0i32)
        .push(act::SILU);
    // SAFETY: `part` holds the shares' partial results written above, `bias` (when given) a
    // row of `n` f32 and `out` `m` rows of `n` f32 (the caller's shapes).
    unsafe {
        d.launch_kernel(
            KernelId::MmqCombine,
            kernels::mmq_combine_grid(n, m),
            kernels::MMQ_THREADS,
            &c.0,
        )
    }
}

pub(super) fn act_kind(kind: Act) -> i32 {
    if kind == Act::Gelu {
        act::GELU
    } else {
        act::SILU
    }
}

/// `act(w_gate x) * (w_up x)`: one gated mat-vec launch for decode (the activations quantized
/// once), otherwise both products (the up one into scratch) and the gated activation.
pub(super) fn mul_mat_gated(
    d: &HipDevice,
    kind: Act,
    srcs: &[TensorMem<'_>],
    out: MemRange<'_>,
) -> Result<()> {
    let (wg, wu, x) = (&srcs[0], &srcs[1], &srcs[2]);
    let (k, n, m) = (wg.tensor.ne[0], wg.tensor.ne[1], x.tensor.nrows());
    let gated = weight_type(wg.tensor.dtype).map(|wt| (wt, wt.matvec_gated()));
    let same = wu.tensor.dtype == wg.tensor.dtype && wu.tensor.nb[1] == wg.tensor.nb[1];
    if let (true, Some((wt, kid))) = (same, cols_kernel(wg.tensor.dtype, m, false, true)) {
        let mut cache = d.inner.q8.lock();
        let q8 = cache.quantized(d, addr(x)?, k, m)?;
        let mut b = Args::new();
        gated_args(&mut b, wg, wu, MemRange::of_buffer(&q8), out, kind)?.push(m as i32);
        // SAFETY: gate and up hold `n` rows of `k` values of `wt` each (`same` row bytes), `q8`
        // the `m` vectors quantized above and `out` `m` rows of `n` f32 (the node's shapes).
        return unsafe { launch_cols(d, kid, wt, n, m, &b, cache) };
    }
    if let (true, Some((wt, _))) = (
        mmq_takes_weight(d, wg.tensor.dtype, m)
            && wu.tensor.dtype == wg.tensor.dtype
            && wu.tensor.nb[1] == wg.tensor.nb[1],
        gated,
    ) {
        let ws = [addr(wg)?, addr(wu)?];
        let p = MmqProduct {
            wt,
            ws: &ws,
            row_bytes: wg.tensor.nb[1],
            k,
            n,
            m,
            act: Some(act_kind(kind)),
        };
        return mmq(d, &p, None, addr(x)?, out);
    }
    if let (true, Some((wt, kid))) = (m <= MATVEC_MAX_COLS, gated) {
        let mut cache = d.inner.q8.lock();
        let q8 = cache.quantized(d, addr(x)?, k, m)?;
        let mut b = Args::new();
        gated_args(&mut b, wg, wu, MemRange::of_buffer(&q8), out, kind)?;
        let grid = kernels::matvec_gated_grid(wt, n);
        // SAFETY: the memory arguments are the node's tensors, sized by the scheduler for the
        // shapes passed here (a layout `supports` accepts), and buffers sized above for them.
        return unsafe { launch_matvec(d, kid, grid, m, &b, cache) };
    }
    // The up product goes past everything `mul_mat` puts in the scratch (its f16 copies of the
    // activations and of one weight), grown first so that `mul_mat` reuses the same buffer.
    let up_bytes = n * m * 4;
    let x_bytes = (m * k * 2).div_ceil(ALIGN) * ALIGN;
    let w_bytes = (n * k * 2).div_ceil(ALIGN) * ALIGN;
    let up_at = x_bytes + w_bytes;
    let scratch = d.scratch(up_at + up_bytes)?;
    let up = MemRange::of_buffer(&scratch)
        .sub(up_at, up_bytes)
        .map_err(|e| gpu_err("mul_mat_gated", e))?;
    mul_mat(d, wg, x, out)?;
    mul_mat(d, wu, x, up)?;
    act_in_place(d, kind, out, up, n, m)
}

/// The arguments the gated mat-vecs (one vector and columns) share: gate and up weights, the
/// Q8_1 activations `q8`, the output, the row length, row bytes, rows, output stride and the
/// activation.
fn gated_args<'a, 'b>(
    b: &'b mut Args<'a>,
    wg: &TensorMem<'a>,
    wu: &TensorMem<'a>,
    q8: MemRange<'a>,
    out: MemRange<'a>,
    kind: Act,
) -> Result<&'b mut Args<'a>> {
    let (k, n) = (wg.tensor.ne[0], wg.tensor.ne[1]);
    Ok(b.push(addr(wg)?)
        .push(addr(wu)?)
        .push(q8)
        .push(out)
        .push(k as i32)
        .push(wg.tensor.nb[1] as i64)
        .push(n as i32)
        .push(n as i32)
        .push(act_kind(kind)))
}

/// `out = act(out) * up` over `m` dense rows of `n` f32: the gated products' last step where
/// the two products ran apart.
pub(super) fn act_in_place(
    d: &HipDevice,
    kind: Act,
    out: MemRange<'_>,
    up: MemRange<'_>,
    n: usize,
    m: usize,
) -> Result<()> {
    let rows = n * m * 4;
    if out.len() < rows || up.len() < rows {
        return Err(gpu_err(
            "gated activation",
            format!("{m} rows of {n} f32 do not fit the given ranges"),
        ));
    }
    let mut a = Args::new();
    a.push(out)
        .push(up)
        .push(out)
        .push(n as i32)
        .push(m as i32)
        .push(n as i64)
        .push(n as i64)
        .push(n as i64)
        .push(act_kind(kind));
    // SAFETY: `out` and `up` are device ranges of at least `m` dense rows of `n` f32 (checked
    // above); the kernel reads and writes only those.
    unsafe { d.launch_kernel(KernelId::ActF32, [blocks(n * m, 256), 1, 1], 256, &a.0) }
}

/// `mmq_*` launches queued by every device of this process (see [`mmq_launches`]).
#[cfg(any(test, feature = "testing"))]
static MMQ_LAUNCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// `mmq_*` tile-kernel launches queued so far by every device of this process (tests: whether
/// batched products took the tile kernels). Only with the `testing` feature.
#[cfg(any(test, feature = "testing"))]
pub fn mmq_launches() -> usize {
    MMQ_LAUNCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// The most activation vectors `d`'s tile kernels take: more where their products run on
/// tensor cores (every NVIDIA image is built for compute capability 8.0 or later).
pub(super) fn mmq_max_cols(d: &HipDevice) -> usize {
    match d.inner.target {
        kernels::Device::Nvidia { major, .. } if major >= 8 => MMQ_MMA_MAX_COLS,
        _ => MMQ_MAX_COLS,
    }
}

/// Whether a product of `m` activation vectors with quantized weights takes the tile kernels
/// on `d`.
pub(super) fn mmq_takes(d: &HipDevice, m: usize) -> bool {
    (MMQ_MIN_COLS..=mmq_max_cols(d)).contains(&m)
}

/// [`mmq_takes`] for `mul_mat` and its fused forms with weights of `dtype`: Q6_K stops at
/// `MMQ_MMA_MAX_COLS_Q6_K`.
pub(super) fn mmq_takes_weight(d: &HipDevice, dtype: DType, m: usize) -> bool {
    mmq_takes(d, m) && (dtype != DType::Q6_K || m <= MMQ_MMA_MAX_COLS_Q6_K)
}

/// One batched product on integer tiles: `ws` (one matrix, or gate and up for a gated product
/// with activation `act`) of `n` rows of `k` values (`row_bytes` apart) in format `wt`, times `m`
/// vectors.
pub(super) struct MmqProduct<'a, 'b> {
    pub(super) wt: WeightType,
    pub(super) ws: &'a [MemRange<'b>],
    pub(super) row_bytes: usize,
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) m: usize,
    pub(super) act: Option<i32>,
}

/// `out` (`m` rows of `n`) = the product `p` of `x` (`m` dense f32 vectors, quantized to Q8_1
/// through the activation cache), plus `bias` (a row of `n`) when given: one `mmq_*` launch, and
/// `mmq_combine` where the plan splits the rows' steps or multiplies two matrices.
pub(super) fn mmq(
    d: &HipDevice,
    p: &MmqProduct<'_, '_>,
    bias: Option<MemRange<'_>>,
    x: MemRange<'_>,
    out: MemRange<'_>,
) -> Result<()> {
    let (k, n, m) = (p.k, p.n, p.m);
    let sms = usize::try_from(d.inner.dev.info().compute_units).unwrap_or(0);
    let plan = kernels::MmqPlan::new(n, m, k, p.ws.len(), sms);
    let mut cache = d.inner.q8.lock();
    let q8 = cache.quantized(d, x, k, m)?;
    let part_bytes = plan.partial_values(n, m) * 4;
    let scratch = if plan.partial {
        Some(d.scratch(part_bytes)?)
    } else {
        None
    };
    let part = match &scratch {
        Some(s) => Some(
            MemRange::of_buffer(s)
                .sub(0, part_bytes)
                .map_err(|e| gpu_err("mmq", e))?,
        ),
        None => None,
    };
    let mut a = Args::new();
    a.push(p.ws[0])
        .push(p.ws.get(1).copied())
        .push(if plan.partial { None } else { bias })
        .push(MemRange::of_buffer(&q8))
        .push(out)
        .push(part)
        .push(k as i32)
        .push(p.row_bytes as i64)
        .push(n as i32)
        .push(n as i32)
        .push(m as i32)
        .push(plan.splits as i32);
    let kid = p.wt.mmq(plan.nt);
    let smem = plan.smem_bytes(&d.inner.target);
    if smem > 0 && !d.kernel_fits(kid, kernels::MMQ_THREADS, smem, "the product fails") {
        return Err(gpu_err(
            "mmq",
            format!(
                "{}: a block with {smem} bytes of shared memory does not fit this device",
                kid.name()
            ),
        ));
    }
    // SAFETY: the weights are the node's `n` rows of `row_bytes`, `q8` holds `m` quantized
    // vectors of `k` values (`quantized` above), `out` the node's `m` rows of `n` f32 and `part`
    // the plan's partial values; the grid, block and shared memory are the plan's, and
    // `kernel_fits` opted the kernel in to the latter.
    unsafe { d.launch_kernel_smem(kid, plan.grid, kernels::MMQ_THREADS, smem, &a.0)? };
    #[cfg(any(test, feature = "testing"))]
    MMQ_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    if let Some(part) = part {
        let mut c = Args::new();
        c.push(part)
            .push(bias)
            .push(out)
            .push(n as i32)
            .push(m as i32)
            .push(n as i32)
            .push(plan.splits as i32)
            .push(i32::from(p.act.is_some()))
            .push(p.act.unwrap_or(act::SILU));
        // SAFETY: `part` holds the partial results of the launch above (matrices times splits
        // times `m` rows of `n`), `bias` a row of `n` and `out` `m` rows of `n` f32.
        unsafe {
            d.launch_kernel(
                KernelId::MmqCombine,
                kernels::mmq_combine_grid(n, m),
                kernels::MMQ_THREADS,
                &c.0,
            )?
        };
    }
    drop(cache);
    Ok(())
}
