//! Attention on the HIP device: the one-launch decode kernel, the split-key kernel for long
//! caches and, for longer prompts with an f16 cache, tensor-core GEMMs with a masked softmax.

use gpu_mem::{GemmShape, KernelArg, MemRange, Op as BlasOp};
use kernels::{AttnParams, KernelId};

use super::ops::{blocks, Args, ALIGN, MATVEC_MAX_COLS};
use super::{addr, bytes_of, gpu_err, HipDevice};
use crate::backend::TensorMem;
use crate::error::Result;
use crate::tensor::{DType, Tensor};

/// KV length from which single-token attention splits the keys across blocks.
pub(super) const SPLIT_K_FROM: usize = 512;
pub(super) const SPLIT_LEN: usize = 256;
/// Query tokens from which f16-cache attention runs as GEMMs (`attention_gemm`).
pub(super) const ATTN_GEMM_FROM: usize = 16;
/// Query tokens per `attention_gemm` chunk, at most (fewer when scores would pass the scratch cap).
pub(super) const ATTN_GEMM_CHUNK: usize = 512;
/// Scratch for one chunk's scores (f32) and probabilities (f16), at most.
pub(super) const ATTN_GEMM_SCRATCH: usize = 64 << 20;

pub(super) fn attention(
    d: &HipDevice,
    t: &Tensor,
    p: &crate::tensor::AttnParams,
    srcs: &[TensorMem<'_>],
    out: MemRange<'_>,
    warp: u32,
) -> Result<()> {
    let (q, k, v) = (srcs[0].tensor, srcs[1].tensor, srcs[2].tensor);
    let (hd, n_heads, n_tok) = (q.ne[0], q.ne[1], q.ne[2]);
    let (n_kv_heads, n_kv) = (k.ne[1], k.ne[2]);
    let es = k.dtype.type_size();
    // Sinks (the last operand, gpt-oss) join every kernel's softmax.
    let sinks = match p.sinks {
        true => Some(addr(&srcs[srcs.len() - 1])?),
        false => None,
    };
    if n_tok >= ATTN_GEMM_FROM && k.dtype == DType::F16 && n_kv > 0 {
        return attention_gemm(d, t, p, srcs, sinks, out);
    }
    // Few query tokens (decode) over a cache the vector loads can read: one launch, one block
    // per (head, token).
    let vec = if k.dtype == DType::F16 { 8 } else { 4 };
    let (k_addr, v_addr) = (addr(&srcs[1])?.addr(), addr(&srcs[2])?.addr());
    // A Q8_0 cache takes `attn_q8_0` (its strides count blocks; see `ld_kv` there).
    let dec_ok = d.inner.opts.attn_dec
        && k.dtype != DType::Q8_0
        && n_kv <= kernels::ATTN_DEC_MAX_KV
        && hd % vec == 0
        && [k.nb[1], k.nb[2], v.nb[1], v.nb[2]]
            .iter()
            .all(|&b| b % (vec * es) == 0)
        && (k_addr | v_addr) % 16 == 0;
    // The kernels' shared parameter block; only the key split differs between them.
    let attn_params = |split_len: usize| AttnParams {
        n_tokens: n_tok as i32,
        n_heads: n_heads as i32,
        n_kv_heads: n_kv_heads as i32,
        head_dim: hd as i32,
        n_kv: n_kv as i32,
        causal: i32::from(p.causal),
        window: p.window.unwrap_or(0) as i32,
        split_len: split_len as i32,
        q_tok_stride: (q.nb[2] / 4) as i64,
        q_head_stride: (q.nb[1] / 4) as i64,
        k_pos_stride: (k.nb[2] / es) as i64,
        k_head_stride: (k.nb[1] / es) as i64,
        v_pos_stride: (v.nb[2] / es) as i64,
        v_head_stride: (v.nb[1] / es) as i64,
        o_tok_stride: (t.nb[2] / 4) as i64,
        o_head_stride: (t.nb[1] / 4) as i64,
        scale: p.scale,
        phase: 0,
    };
    if dec_ok {
        let params = attn_params(n_kv);
        let kid = if k.dtype == DType::F16 {
            KernelId::AttnDecF16
        } else {
            KernelId::AttnDecF32
        };
        // Decode: the output also goes out quantized for the projection that reads it.
        let ncols = n_heads * hd;
        let quantize =
            n_tok <= MATVEC_MAX_COLS && hd % 32 == 0 && t.nb[1] == hd * 4 && t.nb[2] == ncols * 4;
        let mut cache = d.inner.q8.lock();
        let q8 = if quantize {
            Some(cache.ensure(d, ncols, n_tok)?)
        } else {
            None
        };
        let mut a = Args::new();
        a.push(addr(&srcs[0])?)
            .push(addr(&srcs[1])?)
            .push(addr(&srcs[2])?)
            .push(addr(&srcs[3])?)
            .push(out)
            .push(q8.as_ref().map(|b| MemRange::of_buffer(b)))
            .push(sinks)
            .push(KernelArg::Bytes(bytemuck::bytes_of(&params)));
        // SAFETY: q, k, v, mask, sinks (one f32 per query head) and output are the node's
        // tensors, sized by the scheduler for the shapes passed here; the quantized output
        // buffer is sized above for the same shapes.
        unsafe {
            d.launch_kernel(
                kid,
                [n_heads as u32, n_tok as u32, 1],
                kernels::ATTN_DEC_THREADS,
                &a.0,
            )?
        };
        if quantize {
            cache.holds(&out, ncols, n_tok);
        }
        return Ok(());
    }
    let split_len = if n_tok == 1 && n_kv >= SPLIT_K_FROM {
        SPLIT_LEN
    } else {
        n_kv.max(1)
    };
    let splits = n_kv.max(1).div_ceil(split_len);
    let part_bytes = bytes_of("attention partials", &[splits, n_tok, n_heads, hd + 2, 4])?;
    let part_buf = if splits > 1 {
        Some(d.scratch(part_bytes)?)
    } else {
        None
    };
    let part = match &part_buf {
        Some(b) => Some(
            MemRange::of_buffer(b)
                .sub(0, part_bytes)
                .map_err(|e| gpu_err("attention", e))?,
        ),
        None => None,
    };
    let params = attn_params(split_len);
    let nw = 4u32;
    let rows = (n_tok * (n_heads / n_kv_heads)) as u32;
    let kid = match k.dtype {
        DType::F16 => KernelId::AttnF16,
        DType::Q8_0 => KernelId::AttnQ8_0,
        _ => KernelId::AttnF32,
    };
    // Split-K takes two launches (see `AttnParams::phase`): split maxima and sums, then outputs.
    let phases: &[i32] = if splits > 1 { &[1, 2] } else { &[0] };
    for &phase in phases {
        let pp = AttnParams { phase, ..params };
        let mut a = Args::new();
        a.push(addr(&srcs[0])?)
            .push(addr(&srcs[1])?)
            .push(addr(&srcs[2])?)
            .push(addr(&srcs[3])?);
        a.push(out)
            .push(part)
            .push(sinks)
            .push(KernelArg::Bytes(bytemuck::bytes_of(&pp)));
        // SAFETY: q, k, v, mask and output are the node's tensors, sized by the scheduler for the
        // shapes passed here; the scratch and partials are sized above for the same shapes.
        unsafe {
            d.launch_kernel(
                kid,
                [rows.div_ceil(nw), n_kv_heads as u32, splits as u32],
                nw * warp,
                &a.0,
            )?
        };
    }
    if splits > 1 {
        let n_rows = n_tok * n_heads;
        let mut c = Args::new();
        c.push(part)
            .push(out)
            .push(splits as i32)
            .push(n_heads as i32)
            .push(n_rows as i32)
            .push(hd as i32);
        c.push(params.o_tok_stride).push(params.o_head_stride);
        // SAFETY: q, k, v, mask and output are the node's tensors, sized by the scheduler for the
        // shapes passed here; the scratch and partials are sized above for the same shapes.
        unsafe { d.launch_kernel(KernelId::AttnCombineF32, [n_rows as u32, 1, 1], 128, &c.0)? };
    }
    Ok(())
}

/// [`crate::Op::PagedAttention`]: [`paged_decode`] for f16/f32 caches of the shapes it takes;
/// otherwise one block per (query token, KV head), each token over its own sequence's blocks of
/// the pool (`paged_attn_f16`/`paged_attn_f32`/`paged_attn_q8_0`).
pub(super) fn paged_attention(
    d: &HipDevice,
    t: &Tensor,
    p: &crate::tensor::AttnParams,
    block_size: usize,
    srcs: &[TensorMem<'_>],
    out: MemRange<'_>,
    warp: u32,
) -> Result<()> {
    let (q, k, v, tables) = (
        srcs[0].tensor,
        srcs[1].tensor,
        srcs[2].tensor,
        srcs[5].tensor,
    );
    let (hd, n_heads, n_tok) = (q.ne[0], q.ne[1], q.ne[2]);
    let n_kv_heads = k.ne[1];
    let es = k.dtype.type_size();
    let params = AttnParams {
        n_tokens: n_tok as i32,
        n_heads: n_heads as i32,
        n_kv_heads: n_kv_heads as i32,
        head_dim: hd as i32,
        n_kv: k.ne[2] as i32,
        causal: 1,
        window: p.window.unwrap_or(0) as i32,
        // The tables' column count: the kernel bounds every token's column by it.
        split_len: tables.ne[1] as i32,
        q_tok_stride: (q.nb[2] / 4) as i64,
        q_head_stride: (q.nb[1] / 4) as i64,
        k_pos_stride: (k.nb[2] / es) as i64,
        k_head_stride: (k.nb[1] / es) as i64,
        v_pos_stride: (v.nb[2] / es) as i64,
        v_head_stride: (v.nb[1] / es) as i64,
        o_tok_stride: (t.nb[2] / 4) as i64,
        o_head_stride: (t.nb[1] / 4) as i64,
        scale: p.scale,
        phase: 0,
    };
    let gqa = n_heads / n_kv_heads;
    // The flash-decoding kernel reads 16-byte chunks of each f16/f32 row, a power of two of
    // them (a q8_0 cache takes `paged_attn_q8_0`).
    let vec = 16 / es;
    let addrs = [addr(&srcs[1])?.addr(), addr(&srcs[2])?.addr()];
    // Sinks (the operand after the tables, gpt-oss) join the softmax in every paged kernel.
    let sinks = match srcs.get(6) {
        Some(s) if p.sinks => Some(addr(s)?),
        _ => None,
    };
    if matches!(k.dtype, DType::F16 | DType::F32)
        && hd % vec == 0
        && (hd / vec).is_power_of_two()
        && [k.nb[1], k.nb[2], v.nb[1], v.nb[2]]
            .iter()
            .all(|&b| b % 16 == 0)
        && addrs.iter().all(|&a| a % 16 == 0)
    {
        return paged_decode(d, &params, gqa, block_size, srcs, sinks, out);
    }
    let kid = match k.dtype {
        DType::F16 => KernelId::PagedAttnF16,
        DType::Q8_0 => KernelId::PagedAttnQ8_0,
        _ => KernelId::PagedAttnF32,
    };
    let warps = gqa.clamp(1, 8) as u32;
    let mut a = Args::new();
    for s in &srcs[..6] {
        a.push(addr(s)?);
    }
    a.push(out)
        .push(sinks)
        .push(block_size as i32)
        .push(tables.ne[0] as i32)
        .push(KernelArg::Bytes(bytemuck::bytes_of(&params)));
    // SAFETY: q, k, v, pos, seq, tables, the sinks (one f32 per query head) and the output are
    // the node's tensors, sized by the scheduler for the shapes passed here (supports_op checked
    // them dense where the kernel indexes them flat); the kernel bounds every column, position and table entry it reads by
    // the table and pool sizes passed here (`n_kv` slots, `split_len` columns, `max_blocks`).
    unsafe {
        d.launch_kernel(
            kid,
            [n_tok as u32, n_kv_heads as u32, 1],
            warps * warp,
            &a.0,
        )
    }
}

/// Blocks a paged attention launch aims for: splits of the key range are added until the tokens'
/// (token, KV head) pairs make this many (a few per multiprocessor of a large GPU).
const PAGED_TARGET_BLOCKS: usize = 512;
/// Fewest keys per split.
const PAGED_SPLIT_MIN: usize = 64;
/// Most splits of one token's keys.
const PAGED_MAX_SPLITS: usize = 64;

/// [`paged_attention`] through `paged_dec_*` (flash decoding: each token's keys split over
/// blocks, one online-softmax pass, all query heads of a KV head per block) and, for several
/// splits, `paged_combine_f32`; the `sinks` join whichever finishes the rows. Splits are counted from the tables' capacity (the graph does not
/// know the sequences' lengths); each token divides its own visible range among them, so splits
/// past a short sequence's end return at once.
fn paged_decode(
    d: &HipDevice,
    params: &AttnParams,
    gqa: usize,
    block_size: usize,
    srcs: &[TensorMem<'_>],
    sinks: Option<MemRange<'_>>,
    out: MemRange<'_>,
) -> Result<()> {
    let (k, tables) = (srcs[1].tensor, srcs[5].tensor);
    let (hd, n_heads, n_tok) = (
        params.head_dim as usize,
        params.n_heads as usize,
        params.n_tokens as usize,
    );
    let n_kv_heads = params.n_kv_heads as usize;
    let hpb = if gqa <= 4 { 4 } else { 8 };
    let kid = match (k.dtype == DType::F16, hpb) {
        (true, 4) => KernelId::PagedDecF16H4,
        (true, _) => KernelId::PagedDecF16H8,
        (false, 4) => KernelId::PagedDecF32H4,
        (false, _) => KernelId::PagedDecF32H8,
    };
    let groups = n_kv_heads * gqa.div_ceil(hpb);
    let capacity = tables.ne[0] * block_size;
    let splits = PAGED_TARGET_BLOCKS
        .div_ceil((n_tok * groups).max(1))
        .min(capacity.div_ceil(PAGED_SPLIT_MIN))
        .clamp(1, PAGED_MAX_SPLITS);
    let n_rows = n_tok * n_heads;
    let part_bytes = splits * n_rows * (hd + 2) * 4;
    let part_buf = if splits > 1 {
        Some(d.scratch(part_bytes)?)
    } else {
        None
    };
    let part = match &part_buf {
        Some(b) => Some(
            MemRange::of_buffer(b)
                .sub(0, part_bytes)
                .map_err(|e| gpu_err("paged attention", e))?,
        ),
        None => None,
    };
    let mut a = Args::new();
    for s in &srcs[..6] {
        a.push(addr(s)?);
    }
    a.push(out)
        .push(part)
        .push(sinks)
        .push(block_size as i32)
        .push(tables.ne[0] as i32)
        .push(PAGED_SPLIT_MIN as i32)
        .push(KernelArg::Bytes(bytemuck::bytes_of(params)));
    // SAFETY: q, k, v, pos, seq, tables, the sinks (one f32 per query head) and the output are
    // the node's tensors, sized by the scheduler for the shapes passed here (supports_op checked
    // them dense where the kernel indexes them flat, the caller their 16-byte alignment); the kernel bounds every column,
    // position and table entry it reads by the table and pool sizes passed here; the partials
    // are sized above for `splits` splits of every (token, head) row.
    unsafe {
        d.launch_kernel(
            kid,
            [n_tok as u32, groups as u32, splits as u32],
            kernels::PAGED_DEC_THREADS,
            &a.0,
        )?
    };
    if splits > 1 {
        let mut c = Args::new();
        c.push(part)
            .push(out)
            .push(splits as i32)
            .push(n_heads as i32)
            .push(n_rows as i32)
            .push(hd as i32);
        c.push(params.o_tok_stride)
            .push(params.o_head_stride)
            .push(sinks);
        // SAFETY: the partials were written above for `splits` splits of `n_rows` rows; the
        // output is the node's tensor with the strides passed here, the sinks one f32 per head.
        unsafe { d.launch_kernel(KernelId::PagedCombineF32, [n_rows as u32, 1, 1], 128, &c.0)? };
    }
    Ok(())
}

/// Prefill attention with an f16 cache as two batched GEMMs per head-in-group and token chunk
/// (scores = K^T q, output = V P, one batch entry per KV head) around a masked softmax that
/// writes f16 probabilities (with the heads' `sinks` in its sums when there are some): tensor
/// cores do the products, rounded as the CPU op rounds.
fn attention_gemm(
    d: &HipDevice,
    t: &Tensor,
    p: &crate::tensor::AttnParams,
    srcs: &[TensorMem<'_>],
    sinks: Option<MemRange<'_>>,
    out: MemRange<'_>,
) -> Result<()> {
    let (q, k, v) = (srcs[0].tensor, srcs[1].tensor, srcs[2].tensor);
    let (hd, n_heads, n_tok) = (q.ne[0], q.ne[1], q.ne[2]);
    let (n_kv_heads, n_kv) = (k.ne[1], k.ne[2]);
    let gqa = n_heads / n_kv_heads;
    let views = |e| gpu_err("attention", e);
    let chunk = (ATTN_GEMM_SCRATCH / (n_kv_heads * n_kv * 6)).clamp(1, ATTN_GEMM_CHUNK.min(n_tok));
    let qh_bytes =
        bytes_of("attention f16 queries", &[n_tok, n_heads, hd, 2])?.next_multiple_of(ALIGN);
    let s_bytes =
        bytes_of("attention scores", &[n_kv_heads, chunk, n_kv, 4])?.next_multiple_of(ALIGN);
    let p_bytes = bytes_of("attention probabilities", &[n_kv_heads, chunk, n_kv, 2])?;
    let scratch = d.scratch(qh_bytes + s_bytes + p_bytes)?;
    let base = MemRange::of_buffer(&scratch);
    let qh = base.sub(0, n_tok * n_heads * hd * 2).map_err(views)?;
    let sr = base
        .sub(qh_bytes, n_kv_heads * chunk * n_kv * 4)
        .map_err(views)?;
    let pr = base.sub(qh_bytes + s_bytes, p_bytes).map_err(views)?;
    let (q_tok, q_head) = ((q.nb[2] / 4) as i64, (q.nb[1] / 4) as i64);
    let mut a = Args::new();
    a.push(addr(&srcs[0])?)
        .push(qh)
        .push(n_tok as i32)
        .push(n_heads as i32)
        .push(n_kv_heads as i32)
        .push(hd as i32)
        .push(q_tok)
        .push(q_head);
    // SAFETY: q, k, v, mask and output are the node's tensors, sized by the scheduler for the
    // shapes passed here; the scratch and partials are sized above for the same shapes.
    unsafe {
        d.launch_kernel(
            KernelId::AttnQF16,
            [blocks(n_tok * n_heads * hd, 256), 1, 1],
            256,
            &a.0,
        )?
    };
    let (k_pos, k_head) = (k.nb[2] / 2, k.nb[1] / 2);
    let (v_pos, v_head) = (v.nb[2] / 2, v.nb[1] / 2);
    let (o_tok, o_head) = (t.nb[2] / 4, t.nb[1] / 4);
    let blas = d.inner.sb.blas();
    let kv = addr(&srcs[1])?.view::<half::f16>().map_err(views)?;
    let vv = addr(&srcs[2])?.view::<half::f16>().map_err(views)?;
    let pos = addr(&srcs[3])?;
    for g in 0..gqa {
        for t0 in (0..n_tok).step_by(chunk) {
            let cn = chunk.min(n_tok - t0);
            // Scores, column-major n_kv x cn per KV head: K^T (n_kv x hd) * q (hd x cn).
            let shape = GemmShape {
                trans_a: BlasOp::T,
                trans_b: BlasOp::N,
                m: n_kv,
                n: cn,
                k: hd,
                lda: k_pos,
                ldb: hd,
                ldc: n_kv,
            };
            let q0 = ((g * n_kv_heads * n_tok + t0) * hd) * 2;
            let qv = qh
                .sub(q0, qh.len() - q0)
                .map_err(views)?
                .view::<half::f16>()
                .map_err(views)?;
            let mut sv = sr.view_mut::<f32>().map_err(views)?;
            blas.gemm_strided_batched_ex(
                &shape,
                p.scale,
                &kv,
                k_head,
                &qv,
                n_tok * hd,
                0.0,
                &mut sv,
                cn * n_kv,
                n_kv_heads,
            )
            .map_err(views)?;
            let mut b = Args::new();
            b.push(sr)
                .push(pr)
                .push(pos)
                .push(n_kv as i32)
                .push(cn as i32)
                .push(t0 as i32)
                .push(i32::from(p.causal))
                .push(p.window.unwrap_or(0) as i32)
                .push(sinks)
                .push(gqa as i32)
                .push(g as i32);
            // SAFETY: q, k, v, mask, sinks (one f32 per query head: KV head * gqa + g < n_heads)
            // and output are the node's tensors, sized by the scheduler for the shapes passed
            // here; the scratch and partials are sized above for the same shapes.
            unsafe {
                d.launch_kernel(
                    KernelId::AttnSoftmaxF16,
                    [cn as u32, n_kv_heads as u32, 1],
                    256,
                    &b.0,
                )?
            };
            // Output, column-major hd x cn per head (columns o_tok apart): V (hd x n_kv) * P.
            let shape = GemmShape {
                trans_a: BlasOp::N,
                trans_b: BlasOp::N,
                m: hd,
                n: cn,
                k: n_kv,
                lda: v_pos,
                ldb: n_kv,
                ldc: o_tok,
            };
            let pv = pr.view::<half::f16>().map_err(views)?;
            let o0 = (g * o_head + t0 * o_tok) * 4;
            let mut ov = out
                .sub(o0, out.len() - o0)
                .map_err(views)?
                .view_mut::<f32>()
                .map_err(views)?;
            blas.gemm_strided_batched_ex(
                &shape,
                1.0,
                &vv,
                v_head,
                &pv,
                cn * n_kv,
                0.0,
                &mut ov,
                gqa * o_head,
                n_kv_heads,
            )
            .map_err(views)?;
        }
    }
    Ok(())
}
