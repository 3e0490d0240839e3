// Row-wise and element-wise kernels of the transformer block: fused RMS norm x weight, RoPE
// (normal and NeoX), softmax with scale and mask, activations and gated activations, broadcast
// add/mul, scale, KV-cache writes (contiguous positions or indexed rows) and argmax.
//
// Layouts are row-major with explicit row strides (in elements), so views of larger tensors
// (one head, one half of a fused gate/up output) are read in place.
#include "common.h"

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * (w ? w[:] : 1). One block per row.
RF_KERNEL void rms_norm_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                            int ncols, long long x_stride, long long y_stride, float eps) {
    rf_entry();
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    float* yr = y + (long long)blockIdx.x * y_stride;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = xr[i] * r * (w ? w[i] : 1.0f);
}

// rms_norm_f32 that also writes its rows quantized for the decode mat-vecs (planar Q8_1, exactly
// what `quantize_q8_1` makes of y), so the products that read the normalized rows skip their
// quantization launch. ncols a multiple of 32 and at most 4 * RMS_Q8_STEPS * blockDim, blockDim
// a multiple of 8 (each 32-value block is four values of eight consecutive threads). Each thread
// loads its values (and their weights) once, before the reduction, and keeps them in registers.
#define RMS_Q8_STEPS 4
RF_KERNEL void rms_norm_q8_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                               uint8_t* __restrict__ y8, int ncols, long long x_stride, long long y_stride,
                               float eps) {
    rf_entry();
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    float* yr = y + (long long)blockIdx.x * y_stride;
    uint8_t* yq = y8 + (size_t)blockIdx.x * q8_vec_bytes(ncols);
    const int stride = 4 * blockDim.x;
    float v[RMS_Q8_STEPS][4], wv[RMS_Q8_STEPS][4];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_Q8_STEPS; ++k) {
        const int i0 = 4 * threadIdx.x + k * stride;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const bool in = i0 < ncols;
            v[k][j] = in ? xr[i0 + j] : 0.0f;
            wv[k][j] = in && w ? w[i0 + j] : 1.0f;
            ss += v[k][j] * v[k][j];
        }
    }
    ss = block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)ncols + eps);
#pragma unroll
    for (int k = 0; k < RMS_Q8_STEPS; ++k) {
        const int i0 = 4 * threadIdx.x + k * stride;
        if (k * stride >= ncols) break;  // the same for the whole block
        const bool in = i0 < ncols;
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[k][j] = in ? v[k][j] * r * wv[k][j] : 0.0f;
            amax = fmaxf(amax, fabsf(v[k][j]));
        }
        amax = warp_max<8>(amax);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[4];
        float qs = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            q[j] = (int)roundf(v[k][j] * id);
            qs += (float)q[j];
        }
        const float sum = warp_sum<8>(qs);
        if (in) {
#pragma unroll
            for (int j = 0; j < 4; ++j) yr[i0 + j] = v[k][j];
            const uint32_t packed = (uint32_t)(q[0] & 0xFF) | ((uint32_t)(q[1] & 0xFF) << 8) |
                                    ((uint32_t)(q[2] & 0xFF) << 16) | ((uint32_t)(q[3] & 0xFF) << 24);
            *reinterpret_cast<uint32_t*>(yq + i0) = packed;
            if ((threadIdx.x & 7) == 0) {
                __half* ds = reinterpret_cast<__half*>(yq + ncols + 4 * (i0 / 32));
                ds[0] = __float2half(d);
                ds[1] = __float2half(sum * d);
            }
        }
    }
}

// Decode norm variants measured and dropped (weight prefetch before the wait, the norm folded
// into the mat-vecs around it), and what the norms cost in the chain: kernels/PERF.md.
// rms_norm_q8_f32 for long rows, spread over several blocks: grid (slices, rows), block x of row
// y normalizes and quantizes values [4 * blockDim * x, 4 * blockDim * (x + 1)), four per thread,
// after summing the squares of the whole row itself (read again from L2: the row is small), so a
// decode norm does not wait on one block's loads and 32-warp reduction (H200, 4096 values: 3.5
// against 4.6 us). ncols a multiple of 32, blockDim a multiple of 8. Rows that fit one block of
// 256 threads take `rms_norm_q8_f32` (2.4 against 2.6 us for Gemma-3-270M's 640 values).
RF_KERNEL void rms_norm_q8_split_f32(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                                     uint8_t* __restrict__ y8, int ncols, long long x_stride, long long y_stride,
                                     float eps) {
    rf_entry();
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const float* xr = x + (long long)blockIdx.y * x_stride;
    float* yr = y + (long long)blockIdx.y * y_stride;
    uint8_t* yq = y8 + (size_t)blockIdx.y * q8_vec_bytes(ncols);
    const int stride = 4 * blockDim.x;
    const int i0 = 4 * threadIdx.x + blockIdx.x * stride;  // this thread's four values
    const bool in = i0 < ncols;
    float v[4], wv[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) wv[j] = in && w ? w[i0 + j] : 1.0f;
    float ss = 0.0f;
    if (((uintptr_t)xr & 15) == 0) {
#pragma unroll 4
        for (int i = 4 * threadIdx.x; i < ncols; i += stride) {
            const float4 t = *reinterpret_cast<const float4*>(xr + i);
            ss += t.x * t.x + t.y * t.y + t.z * t.z + t.w * t.w;
        }
    } else {
        for (int i = 4 * threadIdx.x; i < ncols; i += stride)
#pragma unroll
            for (int j = 0; j < 4; ++j) ss += xr[i + j] * xr[i + j];
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) v[j] = in ? xr[i0 + j] : 0.0f;
    ss = block_sum(ss, scratch);
    if (blockIdx.x * stride >= ncols) return;  // the same for the whole block
    const float r = rsqrtf(ss / (float)ncols + eps);
    float amax = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        v[j] = in ? v[j] * r * wv[j] : 0.0f;
        amax = fmaxf(amax, fabsf(v[j]));
    }
    amax = warp_max<8>(amax);
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    int q[4];
    float qs = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        q[j] = (int)roundf(v[j] * id);
        qs += (float)q[j];
    }
    const float sum = warp_sum<8>(qs);
    if (in) {
#pragma unroll
        for (int j = 0; j < 4; ++j) yr[i0 + j] = v[j];
        const uint32_t packed = (uint32_t)(q[0] & 0xFF) | ((uint32_t)(q[1] & 0xFF) << 8) |
                                ((uint32_t)(q[2] & 0xFF) << 16) | ((uint32_t)(q[3] & 0xFF) << 24);
        *reinterpret_cast<uint32_t*>(yq + i0) = packed;
        if ((threadIdx.x & 7) == 0) {
            __half* ds = reinterpret_cast<__half*>(yq + ncols + 4 * (i0 / 32));
            ds[0] = __float2half(d);
            ds[1] = __float2half(sum * d);
        }
    }
}

// Two RMS norms x weight over rows of one length in one launch (Gemma 3's per-head q and k
// norms): blocks [0, rows0) take x0/w0/y0, the rest x1/w1/y1; outputs dense. As rms_norm_f32.
RF_KERNEL void rms_norm2_f32(const float* __restrict__ x0, const float* __restrict__ w0, float* __restrict__ y0,
                             long long x0_stride, int rows0, const float* __restrict__ x1,
                             const float* __restrict__ w1, float* __restrict__ y1, long long x1_stride,
                             int ncols, float eps) {
    rf_entry();
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const bool first = (int)blockIdx.x < rows0;
    const long long row = first ? blockIdx.x : blockIdx.x - rows0;
    const float* xr = (first ? x0 : x1) + row * (first ? x0_stride : x1_stride);
    const float* w = first ? w0 : w1;
    float* yr = (first ? y0 : y1) + row * (long long)ncols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, scratch);
    const float r = rsqrtf(ss / (float)ncols + eps);
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] = xr[i] * r * w[i];
}

// A post-norm, the residual add after it and (optionally) the next pre-norm in one launch
// (Gemma's `x + rms_norm(a) * w1` then `rms_norm(.) * w2`): n = rms_norm(a) * w1 (written when
// `n` is set), y = n + x, and with `w2` set h = rms_norm(y) * w2, also quantized into `h8` (planar
// Q8_1 like `rms_norm_q8_f32`) when `h8` is set. One block per row, four values per thread per
// step (ncols a multiple of 32, at most 4 * RMS_Q8_STEPS * blockDim, blockDim a multiple of 8).
// Each thread reads and writes only its own values, so outputs may alias dying inputs.
RF_KERNEL void rms_norm_add_f32(const float* a, const float* __restrict__ w1, const float* x,
                                float* n, float* y, const float* __restrict__ w2, float* h, uint8_t* __restrict__ h8,
                                int ncols, long long a_stride, long long x_stride, float eps1, float eps2) {
    rf_entry();
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const long long row = blockIdx.x;
    const float* ar = a + row * a_stride;
    const float* xr = x + row * x_stride;
    const long long o = row * (long long)ncols;
    const int stride = 4 * blockDim.x;
    float v[RMS_Q8_STEPS][4], xv[RMS_Q8_STEPS][4];
    float ss = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_Q8_STEPS; ++k) {
        const int i0 = 4 * threadIdx.x + k * stride;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const bool in = i0 < ncols;
            v[k][j] = in ? ar[i0 + j] : 0.0f;
            xv[k][j] = in ? xr[i0 + j] : 0.0f;
            ss += v[k][j] * v[k][j];
        }
    }
    ss = block_sum(ss, scratch);
    const float r1 = rsqrtf(ss / (float)ncols + eps1);
    float ss2 = 0.0f;
#pragma unroll
    for (int k = 0; k < RMS_Q8_STEPS; ++k) {
        const int i0 = 4 * threadIdx.x + k * stride;
        if (i0 >= ncols) break;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const float nv = v[k][j] * r1 * w1[i0 + j];
            if (n) n[o + i0 + j] = nv;
            v[k][j] = nv + xv[k][j];
            y[o + i0 + j] = v[k][j];
            ss2 += v[k][j] * v[k][j];
        }
    }
    if (!w2) return;  // the same for the whole block
    ss2 = block_sum(ss2, scratch);
    const float r2 = rsqrtf(ss2 / (float)ncols + eps2);
    uint8_t* hq = h8 ? h8 + (size_t)row * q8_vec_bytes(ncols) : nullptr;
#pragma unroll
    for (int k = 0; k < RMS_Q8_STEPS; ++k) {
        const int i0 = 4 * threadIdx.x + k * stride;
        if (k * stride >= ncols) break;  // the same for the whole block
        const bool in = i0 < ncols;
        float amax = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[k][j] = in ? v[k][j] * r2 * w2[i0 + j] : 0.0f;
            amax = fmaxf(amax, fabsf(v[k][j]));
        }
        if (in) {
#pragma unroll
            for (int j = 0; j < 4; ++j) h[o + i0 + j] = v[k][j];
        }
        if (!hq) continue;
        amax = warp_max<8>(amax);
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        int q[4];
        float qs = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            q[j] = (int)roundf(v[k][j] * id);
            qs += (float)q[j];
        }
        const float sum = warp_sum<8>(qs);
        if (in) {
            const uint32_t packed = (uint32_t)(q[0] & 0xFF) | ((uint32_t)(q[1] & 0xFF) << 8) |
                                    ((uint32_t)(q[2] & 0xFF) << 16) | ((uint32_t)(q[3] & 0xFF) << 24);
            *reinterpret_cast<uint32_t*>(hq + i0) = packed;
            if ((threadIdx.x & 7) == 0) {
                __half* ds = reinterpret_cast<__half*>(hq + ncols + 4 * (i0 / 32));
                ds[0] = __float2half(d);
                ds[1] = __float2half(sum * d);
            }
        }
    }
}

// RoPE over x laid out [rows = tokens * heads, head_dim] (row stride `x_stride`), in place
// allowed. Token of row r is r / n_heads, its position pos[token]. The first `n_dims` values of
// each head rotate: pairs (2i, 2i+1) in normal mode, (i, i + n_dims/2) in NeoX mode. Angles as
// ggml's rope: extrap = pos * base^(-2i/n_dims) / (freq_factors ? freq_factors[i] : 1),
// interp = freq_scale * extrap, and with YaRN (ext_factor != 0) a blend of the two by the ramp
// over the correction dims [corr_lo, corr_hi]; cos/sin are multiplied by `mscale` (the host
// folds YaRN's magnitude correction into it). One thread per pair; `rope_pair` computes pair `t`
// (flat index over the rows) and returns what it wrote (row -1: past the last pair);
// `rope_angle` (common.h) is the rotation of pair i alone.
struct rope_out {
    int r, c0, c1;  // row, and the two columns written
    float a, b;     // their values
};

static __device__ __forceinline__ rope_out rope_pair(long long t, const float* x, float* y, const int* __restrict__ pos,
                                                     int n_heads, int head_dim, int n_dims, long long x_stride,
                                                     long long y_stride, float base, float freq_scale,
                                                     const float* __restrict__ freq_factors, int neox, int n_rows,
                                                     float ext_factor, float mscale, float corr_lo, float corr_hi) {
    const int pairs_per_row = head_dim / 2;
    if (t >= (long long)n_rows * pairs_per_row) return {-1, 0, 0, 0.0f, 0.0f};
    const int r = (int)(t / pairs_per_row);
    const int i = (int)(t % pairs_per_row);
    const float* xr = x + (long long)r * x_stride;
    float* yr = y + (long long)r * y_stride;
    const rope_rot o = rope_angle(i, (float)pos[r / n_heads], n_dims, base, freq_scale, freq_factors, neox,
                                  ext_factor, mscale, corr_lo, corr_hi);
    const float a = xr[o.i0], b = xr[o.i1];
    const float ya = o.rot ? a * o.c - b * o.s : a;
    const float yb = o.rot ? a * o.s + b * o.c : b;
    yr[o.i0] = ya;
    yr[o.i1] = yb;
    return {r, o.i0, o.i1, ya, yb};
}

RF_KERNEL void rope_f32(const float* x, float* y, const int* __restrict__ pos, int n_heads, int head_dim,
                        int n_dims, long long x_stride, long long y_stride, float base, float freq_scale,
                        const float* __restrict__ freq_factors, int neox, int n_rows, float ext_factor,
                        float mscale, float corr_lo, float corr_hi) {
    rf_entry();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    rope_pair(t, x, y, pos, n_heads, head_dim, n_dims, x_stride, y_stride, base, freq_scale, freq_factors, neox,
              n_rows, ext_factor, mscale, corr_lo, corr_hi);
}

// Two `rope_f32`s of one position vector and one set of parameters (the queries and keys of a
// layer) in one launch: threads [0, n_rows0 * head_dim / 2) take x0, the rest x1; outputs dense.
RF_KERNEL void rope2_f32(const float* x0, float* y0, int n_heads0, long long x_stride0, int n_rows0,
                         const float* x1, float* y1, int n_heads1, long long x_stride1, int n_rows1,
                         const int* __restrict__ pos, int head_dim, int n_dims, float base, float freq_scale,
                         const float* __restrict__ freq_factors, int neox, float ext_factor, float mscale,
                         float corr_lo, float corr_hi) {
    rf_entry();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long first = (long long)n_rows0 * (head_dim / 2);
    if (t < first)
        rope_pair(t, x0, y0, pos, n_heads0, head_dim, n_dims, x_stride0, head_dim, base, freq_scale, freq_factors,
                  neox, n_rows0, ext_factor, mscale, corr_lo, corr_hi);
    else
        rope_pair(t - first, x1, y1, pos, n_heads1, head_dim, n_dims, x_stride1, head_dim, base, freq_scale,
                  freq_factors, neox, n_rows1, ext_factor, mscale, corr_lo, corr_hi);
}

// y[r, :] = softmax(x[r, :] * scale + (mask ? mask[(r % mask_rows), :] : 0)). One block per row.
RF_KERNEL void softmax_f32(const float* __restrict__ x, const float* __restrict__ mask, float* __restrict__ y,
                           int ncols, long long x_stride, long long y_stride, long long mask_stride,
                           int mask_rows, float scale) {
    rf_entry();
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    const float* mr = mask ? mask + (long long)(blockIdx.x % mask_rows) * mask_stride : nullptr;
    float* yr = y + (long long)blockIdx.x * y_stride;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = xr[i] * scale + (mr ? mr[i] : 0.0f);
        yr[i] = v;
        mx = fmaxf(mx, v);
    }
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float e = mx == -INFINITY ? 0.0f : expf(yr[i] - mx);
        yr[i] = e;
        sum += e;
    }
    __syncthreads();
    sum = block_sum(sum, scratch);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) yr[i] *= inv;
}

// y = act(a) (b == null) or act(a) * b (gated: swiglu with SILU, geglu with GELU), over a
// [rows, ncols] grid with per-operand row strides.
RF_KERNEL void act_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                       int ncols, int nrows, long long a_stride, long long b_stride, long long y_stride, int kind) {
    rf_entry();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)ncols * nrows) return;
    const long long r = t / ncols, c = t % ncols;
    float v = act_fn(kind, a[r * a_stride + c]);
    if (b) v *= b[r * b_stride + c];
    y[r * y_stride + c] = v;
}

enum { BIN_ADD = 0, BIN_MUL = 1 };

// y[r, c] = a[r, c] op b[r % b_rows, c % b_cols]: b broadcasts over rows and repeats along them.
RF_KERNEL void binary_f32(const float* __restrict__ a, const float* __restrict__ b, float* __restrict__ y,
                          int ncols, int nrows, long long a_stride, long long b_stride, long long y_stride,
                          int b_rows, int b_cols, int op) {
    rf_entry();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)ncols * nrows) return;
    const long long r = t / ncols, c = t % ncols;
    const float bv = b[(r % b_rows) * b_stride + (c % b_cols)];
    const float av = a[r * a_stride + c];
    y[r * y_stride + c] = op == BIN_ADD ? av + bv : av * bv;
}

// y = x * s + bias (n contiguous values; in place allowed).
RF_KERNEL void scale_f32(const float* x, float* y, long long n, float s, float bias) {
    rf_entry();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] * s + bias;
}

// Copies rows [tokens * kv_heads, head_dim] of K or V (f32) into a cache laid out by kv head:
// dst + head * head_stride + (pos0 + token) * pos_stride + d. f16 and f32 caches.
template <typename O>
static __device__ __forceinline__ O to_cache(float v);
template <>
__device__ __forceinline__ float to_cache<float>(float v) { return v; }
template <>
__device__ __forceinline__ __half to_cache<__half>(float v) { return __float2half(v); }

template <typename O>
static __device__ __forceinline__ void kv_write(const float* __restrict__ src, O* __restrict__ dst, int n_tokens,
                                                int n_kv_heads, int head_dim, long long src_stride, int pos0,
                                                long long pos_stride, long long head_stride) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n_tokens * n_kv_heads * head_dim) return;
    const int d = (int)(t % head_dim);
    const long long row = t / head_dim;
    const int h = (int)(row % n_kv_heads);
    const int tok = (int)(row / n_kv_heads);
    dst[(long long)h * head_stride + (long long)(pos0 + tok) * pos_stride + d] = to_cache<O>(src[row * src_stride + d]);
}

RF_KERNEL void kv_write_f16(const float* src, __half* dst, int n_tokens, int n_kv_heads, int head_dim,
                            long long src_stride, int pos0, long long pos_stride, long long head_stride) {
    rf_entry();
    kv_write<__half>(src, dst, n_tokens, n_kv_heads, head_dim, src_stride, pos0, pos_stride, head_stride);
}

RF_KERNEL void kv_write_f32(const float* src, float* dst, int n_tokens, int n_kv_heads, int head_dim,
                            long long src_stride, int pos0, long long pos_stride, long long head_stride) {
    rf_entry();
    kv_write<float>(src, dst, n_tokens, n_kv_heads, head_dim, src_stride, pos0, pos_stride, head_stride);
}

// dst row idx[r] := src row r (f32 converted to the cache type) for r < nrows: the graph's
// set_rows, which writes K/V rows at arbitrary cache slots.
template <typename O>
static __device__ __forceinline__ void set_rows(const float* __restrict__ src, const int* __restrict__ idx,
                                                O* __restrict__ dst, int ncols, int nrows, long long src_stride,
                                                long long dst_stride) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)ncols * nrows) return;
    const long long r = t / ncols, c = t % ncols;
    dst[(long long)idx[r] * dst_stride + c] = to_cache<O>(src[r * src_stride + c]);
}

RF_KERNEL void set_rows_f16(const float* src, const int* idx, __half* dst, int ncols, int nrows,
                            long long src_stride, long long dst_stride) {
    rf_entry();
    set_rows<__half>(src, idx, dst, ncols, nrows, src_stride, dst_stride);
}

RF_KERNEL void set_rows_f32(const float* src, const int* idx, float* dst, int ncols, int nrows,
                            long long src_stride, long long dst_stride) {
    rf_entry();
    set_rows<float>(src, idx, dst, ncols, nrows, src_stride, dst_stride);
}

// set_rows into a Q8_0 cache: one thread per 32-value block, quantized as ggml's reference
// quantize_row_q8_0 (scale amax / 127, values rounded half away from zero). `dst_stride` counts
// blocks of 34 bytes; ncols is a multiple of 32.
RF_KERNEL void set_rows_q8_0(const float* src, const int* idx, unsigned char* dst, int ncols, int nrows,
                             long long src_stride, long long dst_stride) {
    rf_entry();
    const int nb = ncols / 32;
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)nb * nrows) return;
    const long long r = t / nb, b = t % nb;
    const float* x = src + r * src_stride + b * 32;
    unsigned char* o = dst + ((long long)idx[r] * dst_stride + b) * 34;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = fmaxf(amax, fabsf(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __half h = __float2half(d);
    *(unsigned short*)o = *(const unsigned short*)&h;
    signed char* q = (signed char*)(o + 2);
    for (int i = 0; i < 32; ++i) q[i] = (signed char)roundf(x[i] * id);
}

// Two `set_rows` of one index vector (a layer's K and V rows) in one launch: threads
// [0, ncols0 * nrows) write dst0, the rest dst1.
template <typename O>
static __device__ __forceinline__ void set_rows2(const float* src0, O* dst0, int ncols0, long long src_stride0,
                                                 long long dst_stride0, const float* src1, O* dst1, int ncols1,
                                                 long long src_stride1, long long dst_stride1, const int* idx,
                                                 int nrows) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long first = (long long)ncols0 * nrows;
    if (t < first) {
        const long long r = t / ncols0, c = t % ncols0;
        dst0[(long long)idx[r] * dst_stride0 + c] = to_cache<O>(src0[r * src_stride0 + c]);
    } else if (t - first < (long long)ncols1 * nrows) {
        const long long u = t - first;
        const long long r = u / ncols1, c = u % ncols1;
        dst1[(long long)idx[r] * dst_stride1 + c] = to_cache<O>(src1[r * src_stride1 + c]);
    }
}

RF_KERNEL void set_rows2_f16(const float* src0, __half* dst0, int ncols0, long long src_stride0,
                             long long dst_stride0, const float* src1, __half* dst1, int ncols1,
                             long long src_stride1, long long dst_stride1, const int* idx, int nrows) {
    rf_entry();
    set_rows2<__half>(src0, dst0, ncols0, src_stride0, dst_stride0, src1, dst1, ncols1, src_stride1, dst_stride1,
                      idx, nrows);
}

RF_KERNEL void set_rows2_f32(const float* src0, float* dst0, int ncols0, long long src_stride0,
                             long long dst_stride0, const float* src1, float* dst1, int ncols1,
                             long long src_stride1, long long dst_stride1, const int* idx, int nrows) {
    rf_entry();
    set_rows2<float>(src0, dst0, ncols0, src_stride0, dst_stride0, src1, dst1, ncols1, src_stride1, dst_stride1,
                     idx, nrows);
}

// A layer's rope2 (queries x0 -> y0, keys x1 -> y1) and both cache writes in one launch: the
// thread that rotates a key pair also stores it into `kc` row idx[token] (dense keys: row of
// token = its n_heads1 heads), and threads past the ropes copy the values (v_cols per token,
// rows v_stride apart) into `vc` row idx[token]. Outputs dense as in rope2_f32.
template <typename O>
static __device__ __forceinline__ void rope_kv(const float* x0, float* y0, int n_heads0, long long x_stride0,
                                               int n_rows0, const float* x1, float* y1, int n_heads1,
                                               long long x_stride1, int n_rows1, const int* __restrict__ pos,
                                               int head_dim, int n_dims, float base, float freq_scale,
                                               const float* __restrict__ freq_factors, int neox, float ext_factor,
                                               float mscale, float corr_lo, float corr_hi, O* __restrict__ kc,
                                               long long kc_stride, const float* __restrict__ v, int v_cols,
                                               long long v_stride, O* __restrict__ vc, long long vc_stride,
                                               const int* __restrict__ idx) {
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long q_pairs = (long long)n_rows0 * (head_dim / 2);
    const long long k_pairs = (long long)n_rows1 * (head_dim / 2);
    if (t < q_pairs) {
        rope_pair(t, x0, y0, pos, n_heads0, head_dim, n_dims, x_stride0, head_dim, base, freq_scale, freq_factors,
                  neox, n_rows0, ext_factor, mscale, corr_lo, corr_hi);
    } else if (t < q_pairs + k_pairs) {
        const rope_out o = rope_pair(t - q_pairs, x1, y1, pos, n_heads1, head_dim, n_dims, x_stride1, head_dim,
                                     base, freq_scale, freq_factors, neox, n_rows1, ext_factor, mscale, corr_lo,
                                     corr_hi);
        O* row = kc + (long long)idx[o.r / n_heads1] * kc_stride + (long long)(o.r % n_heads1) * head_dim;
        row[o.c0] = to_cache<O>(o.a);
        row[o.c1] = to_cache<O>(o.b);
    } else {
        const long long u = t - q_pairs - k_pairs;
        const int n_tok = n_rows1 / n_heads1;
        if (u >= (long long)v_cols * n_tok) return;
        const long long r = u / v_cols, c = u % v_cols;
        vc[(long long)idx[r] * vc_stride + c] = to_cache<O>(v[r * v_stride + c]);
    }
}

RF_KERNEL void rope_kv_f16(const float* x0, float* y0, int n_heads0, long long x_stride0, int n_rows0,
                           const float* x1, float* y1, int n_heads1, long long x_stride1, int n_rows1,
                           const int* pos, int head_dim, int n_dims, float base, float freq_scale,
                           const float* freq_factors, int neox, float ext_factor, float mscale, float corr_lo,
                           float corr_hi, __half* kc, long long kc_stride, const float* v, int v_cols,
                           long long v_stride, __half* vc, long long vc_stride, const int* idx) {
    rf_entry();
    rope_kv<__half>(x0, y0, n_heads0, x_stride0, n_rows0, x1, y1, n_heads1, x_stride1, n_rows1, pos, head_dim,
                    n_dims, base, freq_scale, freq_factors, neox, ext_factor, mscale, corr_lo, corr_hi, kc,
                    kc_stride, v, v_cols, v_stride, vc, vc_stride, idx);
}

RF_KERNEL void rope_kv_f32(const float* x0, float* y0, int n_heads0, long long x_stride0, int n_rows0,
                           const float* x1, float* y1, int n_heads1, long long x_stride1, int n_rows1,
                           const int* pos, int head_dim, int n_dims, float base, float freq_scale,
                           const float* freq_factors, int neox, float ext_factor, float mscale, float corr_lo,
                           float corr_hi, float* kc, long long kc_stride, const float* v, int v_cols,
                           long long v_stride, float* vc, long long vc_stride, const int* idx) {
    rf_entry();
    rope_kv<float>(x0, y0, n_heads0, x_stride0, n_rows0, x1, y1, n_heads1, x_stride1, n_rows1, pos, head_dim,
                   n_dims, base, freq_scale, freq_factors, neox, ext_factor, mscale, corr_lo, corr_hi, kc,
                   kc_stride, v, v_cols, v_stride, vc, vc_stride, idx);
}

// A layer's per-head q and k norms (`rms_norm2_f32`), their ropes and both cache writes
// (`rope_kv`) in one launch (Gemma 3, Qwen 3): one block per head row, one thread per rope pair,
// which loads its two values, takes part in the row's sum of squares, normalizes them (written to
// n0/n1), rotates them (y0/y1, dense) and for key rows stores them into `kc` row idx[token];
// the blocks past the head rows copy the values into `vc`. blockDim: head_dim / 2 rounded up to
// the warp size.
template <typename O>
static __device__ __forceinline__ void norm_rope_kv(
    const float* x0, const float* __restrict__ w0, float* n0, float* y0, long long x0_stride, int n_rows0,
    int n_heads0, const float* x1, const float* __restrict__ w1, float* n1, float* y1, long long x1_stride,
    int n_rows1, int n_heads1, float eps, const int* __restrict__ pos, int head_dim, int n_dims, float base,
    float freq_scale, const float* __restrict__ freq_factors, int neox, float ext_factor, float mscale,
    float corr_lo, float corr_hi, O* __restrict__ kc, long long kc_stride, const float* __restrict__ v, int v_cols,
    long long v_stride, O* __restrict__ vc, long long vc_stride, const int* __restrict__ idx) {
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const int heads = n_rows0 + n_rows1;
    if ((int)blockIdx.x >= heads) {
        const int n_tok = n_rows1 / n_heads1;
        const long long total = (long long)v_cols * n_tok;
        const long long step = (long long)(gridDim.x - heads) * blockDim.x;
        for (long long u = (long long)(blockIdx.x - heads) * blockDim.x + threadIdx.x; u < total; u += step) {
            const long long r = u / v_cols, c = u % v_cols;
            vc[(long long)idx[r] * vc_stride + c] = to_cache<O>(v[r * v_stride + c]);
        }
        return;
    }
    const bool first = (int)blockIdx.x < n_rows0;
    const int r = first ? blockIdx.x : blockIdx.x - n_rows0;
    const int n_heads = first ? n_heads0 : n_heads1;
    const float* xr = (first ? x0 : x1) + (long long)r * (first ? x0_stride : x1_stride);
    const float* w = first ? w0 : w1;
    const long long o_row = (long long)r * head_dim;
    const int i = threadIdx.x;
    const bool in = i < head_dim / 2;
    rope_rot o = {0, 1, 1.0f, 0.0f, false};
    float a = 0.0f, b = 0.0f;
    if (in) {
        o = rope_angle(i, (float)pos[r / n_heads], n_dims, base, freq_scale, freq_factors, neox, ext_factor, mscale,
                       corr_lo, corr_hi);
        a = xr[o.i0];
        b = xr[o.i1];
    }
    const float ss = block_sum(a * a + b * b, scratch);
    if (!in) return;
    const float rs = rsqrtf(ss / (float)head_dim + eps);
    a = a * rs * w[o.i0];
    b = b * rs * w[o.i1];
    float* nr = (first ? n0 : n1) + o_row;
    nr[o.i0] = a;
    nr[o.i1] = b;
    const float ya = o.rot ? a * o.c - b * o.s : a;
    const float yb = o.rot ? a * o.s + b * o.c : b;
    float* yr = (first ? y0 : y1) + o_row;
    yr[o.i0] = ya;
    yr[o.i1] = yb;
    if (!first) {
        O* row = kc + (long long)idx[r / n_heads1] * kc_stride + (long long)(r % n_heads1) * head_dim;
        row[o.i0] = to_cache<O>(ya);
        row[o.i1] = to_cache<O>(yb);
    }
}

RF_KERNEL void norm_rope_kv_f16(const float* x0, const float* w0, float* n0, float* y0, long long x0_stride,
                                int n_rows0, int n_heads0, const float* x1, const float* w1, float* n1, float* y1,
                                long long x1_stride, int n_rows1, int n_heads1, float eps, const int* pos,
                                int head_dim, int n_dims, float base, float freq_scale, const float* freq_factors,
                                int neox, float ext_factor, float mscale, float corr_lo, float corr_hi, __half* kc,
                                long long kc_stride, const float* v, int v_cols, long long v_stride, __half* vc,
                                long long vc_stride, const int* idx) {
    rf_entry();
    norm_rope_kv<__half>(x0, w0, n0, y0, x0_stride, n_rows0, n_heads0, x1, w1, n1, y1, x1_stride, n_rows1, n_heads1,
                         eps, pos, head_dim, n_dims, base, freq_scale, freq_factors, neox, ext_factor, mscale,
                         corr_lo, corr_hi, kc, kc_stride, v, v_cols, v_stride, vc, vc_stride, idx);
}

RF_KERNEL void norm_rope_kv_f32(const float* x0, const float* w0, float* n0, float* y0, long long x0_stride,
                                int n_rows0, int n_heads0, const float* x1, const float* w1, float* n1, float* y1,
                                long long x1_stride, int n_rows1, int n_heads1, float eps, const int* pos,
                                int head_dim, int n_dims, float base, float freq_scale, const float* freq_factors,
                                int neox, float ext_factor, float mscale, float corr_lo, float corr_hi, float* kc,
                                long long kc_stride, const float* v, int v_cols, long long v_stride, float* vc,
                                long long vc_stride, const int* idx) {
    rf_entry();
    norm_rope_kv<float>(x0, w0, n0, y0, x0_stride, n_rows0, n_heads0, x1, w1, n1, y1, x1_stride, n_rows1, n_heads1,
                        eps, pos, head_dim, n_dims, base, freq_scale, freq_factors, neox, ext_factor, mscale, corr_lo,
                        corr_hi, kc, kc_stride, v, v_cols, v_stride, vc, vc_stride, idx);
}

// Index of the largest value of each row (the first one on ties; NaN never wins). One block per
// row, out[r] = index.
RF_KERNEL void argmax_f32(const float* __restrict__ x, int* __restrict__ out, int ncols, long long x_stride) {
    rf_entry();
    __shared__ float sv[RF_MAX_WARPS_PER_BLOCK];
    __shared__ int si[RF_MAX_WARPS_PER_BLOCK];
    const float* xr = x + (long long)blockIdx.x * x_stride;
    float best = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
        const float v = xr[i];
        if (v > best || bi < 0 && v == v) {
            best = v;
            bi = i;
        }
    }
    // Reduce (value, index) pairs: larger value wins, then smaller index; index -1 loses.
#pragma unroll
    for (int m = RF_WARP / 2; m > 0; m >>= 1) {
        const float ov = rf_shfl_xor(best, m);
        const int oi = rf_shfl_xor_int(bi, m);
        if (oi >= 0 && (bi < 0 || ov > best || (ov == best && oi < bi))) {
            best = ov;
            bi = oi;
        }
    }
    const int lane = threadIdx.x % RF_WARP, warp = threadIdx.x / RF_WARP, nwarps = blockDim.x / RF_WARP;
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < nwarps; ++w) {
            if (si[w] >= 0 && (bi < 0 || sv[w] > best || (sv[w] == best && si[w] < bi))) {
                best = sv[w];
                bi = si[w];
            }
        }
        out[blockIdx.x] = bi < 0 ? 0 : bi;
    }
}

// --- Mixture-of-experts routing and gpt-oss's FFN activation ----------------------------------

// Whether (av, ai) ranks before (bv, bi) in the top-k order: the larger value first, the lower
// index among equal values, NaN after every number.
static __device__ __forceinline__ bool topk_before(float av, int ai, float bv, int bi) {
    const bool an = av != av, bn = bv != bv;
    if (an != bn) return bn;
    if (!an && av != bv) return av > bv;
    return ai < bi;
}

// The indices of the k largest values of each row (one warp per row, grid.x rows), largest first
// (`out` rows of k). Pick j is the best element ranked after pick j - 1: the order is total, so
// no element is chosen twice and no per-row state is kept besides the last pick.
RF_KERNEL void arg_top_k_f32(const float* __restrict__ a, int* __restrict__ out, int n, int k,
                             long long a_stride) {
    rf_entry();
    const int lane = threadIdx.x % RF_WARP;
    if (threadIdx.x >= RF_WARP) return;  // one warp (the host launches one)
    const float* x = a + (long long)blockIdx.x * a_stride;
    float pv = 0.0f;
    int pi = -1;
    for (int j = 0; j < k; ++j) {
        float bv = 0.0f;
        int bi = -1;
        for (int c = lane; c < n; c += RF_WARP) {
            const float v = x[c];
            if (pi >= 0 && !topk_before(pv, pi, v, c)) continue;
            if (bi < 0 || topk_before(v, c, bv, bi)) {
                bv = v;
                bi = c;
            }
        }
#pragma unroll
        for (int m = RF_WARP / 2; m > 0; m >>= 1) {
            const float ov = rf_shfl_xor(bv, m);
            const int oi = rf_shfl_xor_int(bi, m);
            if (oi >= 0 && (bi < 0 || topk_before(ov, oi, bv, bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) out[(long long)blockIdx.x * k + j] = bi;
        pv = bv;
        pi = bi;
    }
}

// Warp reductions of 32-bit integers in one instruction (`redux.sync`) exist on NVIDIA compute
// capability 8.0 and later.
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RF_REDUX 1
#endif

#if defined(RF_REDUX)
#define RF_TOPK_NONE 0x7fffffff

// An integer that orders top-k candidates as topk_before does their values: larger first, -0
// equal to +0, every NaN last (0; no number maps there).
static __device__ __forceinline__ uint32_t topk_key(float v) {
    if (v != v) return 0u;
    const uint32_t b = v == 0.0f ? 0u : __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The calling lane's best candidate of row `x` (elements lane, lane + 32, ...; bit j of `taken`
// set for those already picked): its key and index, index RF_TOPK_NONE when it has none left.
static __device__ __forceinline__ void topk_lane_best(const float* x, int n, int lane, uint32_t taken, uint32_t& bk,
                                                      int& bi) {
    bk = 0u;
    bi = RF_TOPK_NONE;
    for (int j = 0, c = lane; c < n; ++j, c += RF_WARP) {
        if ((taken >> j) & 1u) continue;
        const uint32_t key = topk_key(x[c]);
        if (bi == RF_TOPK_NONE || key > bk) {  // ties keep the lower index (c grows)
            bk = key;
            bi = c;
        }
    }
}
#endif

// Top k of one row in shared memory by the calling warp (arg_top_k_f32's order and ties); the
// picks land in `pick`, visible to the whole warp on return.
static __device__ __forceinline__ void top_k_warp(const float* x, int n, int k, int* pick) {
    const int lane = threadIdx.x % RF_WARP;
#if defined(RF_REDUX)
    // Each lane keeps its best untaken candidate; a pick is the largest key over the warp, then
    // the lowest index holding it (two reductions instead of five shuffle rounds of value and
    // index), and only the lane that held it looks for its next best.
    uint32_t taken = 0u, bk;
    int bi;
    topk_lane_best(x, n, lane, taken, bk, bi);
    for (int j = 0; j < k; ++j) {
        const uint32_t mk = __reduce_max_sync(0xffffffffu, bi == RF_TOPK_NONE ? 0u : bk);
        const int mi = __reduce_min_sync(0xffffffffu, bi != RF_TOPK_NONE && bk == mk ? bi : RF_TOPK_NONE);
        if (lane == 0) pick[j] = mi;
        if (mi % RF_WARP == lane) {
            taken |= 1u << (mi / RF_WARP);
            topk_lane_best(x, n, lane, taken, bk, bi);
        }
    }
#else
    float pv = 0.0f;
    int pi = -1;
    for (int j = 0; j < k; ++j) {
        float bv = 0.0f;
        int bi = -1;
#pragma unroll 4
        for (int c = lane; c < n; c += RF_WARP) {
            const float v = x[c];
            if (pi >= 0 && !topk_before(pv, pi, v, c)) continue;
            if (bi < 0 || topk_before(v, c, bv, bi)) {
                bv = v;
                bi = c;
            }
        }
#pragma unroll
        for (int m = RF_WARP / 2; m > 0; m >>= 1) {
            const float ov = rf_shfl_xor(bv, m);
            const int oi = rf_shfl_xor_int(bi, m);
            if (oi >= 0 && (bi < 0 || topk_before(ov, oi, bv, bi))) {
                bv = ov;
                bi = oi;
            }
        }
        if (lane == 0) pick[j] = bi;
        pv = bv;
        pi = bi;
    }
#endif
    __syncthreads();
}

// Softmax of n values scaled by `scale` (softmax_f32's arithmetic) by the calling warp, from `x`
// into `y` (the same memory allowed: each lane reads and writes only its own indices).
static __device__ __forceinline__ void softmax_warp(const float* x, float* y, int n, float scale) {
    const int lane = threadIdx.x % RF_WARP;
    float mx = -INFINITY;
#pragma unroll 4
    for (int i = lane; i < n; i += RF_WARP) {
        const float v = x[i] * scale;
        y[i] = v;
        mx = fmaxf(mx, v);
    }
    mx = warp_max(mx);
    float sum = 0.0f;
#pragma unroll 4
    for (int i = lane; i < n; i += RF_WARP) {
        const float e = mx == -INFINITY ? 0.0f : expf(y[i] - mx);
        y[i] = e;
        sum += e;
    }
    sum = warp_sum(sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int i = lane; i < n; i += RF_WARP) y[i] *= inv;
}

// A mixture of experts' routing for each row of router logits `x` (one warp per row, grid.x
// rows, n <= RF_ROUTE_MAX experts, k chosen), in one launch instead of three:
// - top_first 0 (softmax gating): `vals` := softmax(scale x) (rows of n), `ids` := its top k,
//   `w` := the probabilities at the ids, divided by their sum (at least the smallest normal f16)
//   when `norm` is 1;
// - top_first 1 (gpt-oss): `ids` := top k of x, `vals` := x at the ids (rows of k), `w` :=
//   softmax(scale vals).
#define RF_ROUTE_MAX 1024
RF_KERNEL void moe_route_f32(const float* __restrict__ x, float* __restrict__ vals, int* __restrict__ ids,
                             float* __restrict__ w, int n, int k, long long x_stride, float scale, int top_first,
                             int norm) {
    rf_entry();
    __shared__ float row[RF_ROUTE_MAX];
    __shared__ int pick[RF_ROUTE_MAX];
    const int lane = threadIdx.x % RF_WARP;
    if (threadIdx.x >= RF_WARP) return;  // one warp (the host launches one)
    const long long r = blockIdx.x;
    const float* xr = x + r * x_stride;
    int* ir = ids + r * k;
    float* wr = w + r * k;
    if (!top_first) {
        float* pr = vals + r * n;
        softmax_warp(xr, row, n, scale);
        for (int i = lane; i < n; i += RF_WARP) pr[i] = row[i];
        __syncthreads();
        top_k_warp(row, n, k, pick);
        float s = 0.0f;
        for (int i = lane; i < k; i += RF_WARP) {
            ir[i] = pick[i];
            s += row[pick[i]];
        }
        const float sum = norm ? fmaxf(warp_sum(s), 6.103515625e-5f) : 1.0f;
        for (int i = lane; i < k; i += RF_WARP) {
            const float v = row[pick[i]];
            wr[i] = norm ? v / sum : v;
        }
    } else {
        float* pr = vals + r * k;
        for (int i = lane; i < n; i += RF_WARP) row[i] = xr[i];
        __syncthreads();
        top_k_warp(row, n, k, pick);
        for (int i = lane; i < k; i += RF_WARP) {
            const float v = row[pick[i]];
            ir[i] = pick[i];
            pr[i] = v;
            wr[i] = v;
        }
        softmax_warp(wr, wr, k, scale);
    }
}

// The values of each row of `probs` at that row's k ids (one warp per row), divided by their sum
// (at least the smallest normal f16, as llama.cpp clamps it) when `norm` is 1. An id outside the
// row gives 0.
RF_KERNEL void expert_weights_f32(const float* __restrict__ probs, const int* __restrict__ ids,
                                  float* __restrict__ out, int n, int k, long long p_stride, int norm) {
    rf_entry();
    const int lane = threadIdx.x % RF_WARP;
    if (threadIdx.x >= RF_WARP) return;  // one warp (the host launches one)
    const long long r = blockIdx.x;
    const float* p = probs + r * p_stride;
    float s = 0.0f;
    for (int i = lane; i < k; i += RF_WARP) {
        const int e = ids[r * k + i];
        s += e >= 0 && e < n ? p[e] : 0.0f;
    }
    const float sum = norm ? fmaxf(warp_sum(s), 6.103515625e-5f) : 1.0f;
    for (int i = lane; i < k; i += RF_WARP) {
        const int e = ids[r * k + i];
        const float v = e >= 0 && e < n ? p[e] : 0.0f;
        out[r * k + i] = norm ? v / sum : v;
    }
}

// A product and a sum rounded on their own, never contracted into a fused multiply-add: NVIDIA's
// intrinsics promise it; AMD's headers define them as plain operators that the default
// `-ffp-contract=fast` may fuse, so there the operators are compiled with contraction off.
static __device__ __forceinline__ float mul_rn(float a, float b) {
#if defined(RF_NVIDIA)
    return __fmul_rn(a, b);
#else
#pragma clang fp contract(off)
    return a * b;
#endif
}
static __device__ __forceinline__ float add_rn(float a, float b) {
#if defined(RF_NVIDIA)
    return __fadd_rn(a, b);
#else
#pragma clang fp contract(off)
    return a + b;
#endif
}

// The chosen experts' outputs weighted and summed: y[:, r] = x[:, 0, r] * w[0, r] + x[:, 1, r] *
// w[1, r] + ..., left to right, each product rounded before its add, then the residual res[:, r]
// added (when not null), so the result equals a separate multiply and chain of adds bit for bit.
RF_KERNEL void moe_sum_f32(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ res,
                           float* __restrict__ y, int n, int k, int rows, long long x_slot, long long x_row,
                           long long w_slot, long long w_row, long long res_row) {
    rf_entry();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)n * rows) return;
    const long long r = t / n, c = t % n;
    const float* xr = x + r * x_row + c;
    const float* wr = w + r * w_row;
    float acc = mul_rn(xr[0], wr[0]);
    // Unrolled so that the loads of several slots are in flight before the first add needs one.
#pragma unroll 8
    for (int s = 1; s < k; ++s) acc = add_rn(acc, mul_rn(xr[s * x_slot], wr[s * w_slot]));
    if (res) acc = add_rn(acc, res[r * res_row + c]);
    y[r * n + c] = acc;
}

// gpt-oss's clamped SwiGLU (ggml's swiglu_oai): g = min(gate, limit), u = clamp(up, -limit,
// limit), y = g * sigmoid(alpha g) * (u + 1), in ggml's order of operations.
RF_KERNEL void swiglu_oai_f32(const float* __restrict__ g, const float* __restrict__ u, float* __restrict__ y,
                              int ncols, int nrows, long long g_stride, long long u_stride, long long y_stride,
                              float alpha, float limit) {
    rf_entry();
    const long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= (long long)ncols * nrows) return;
    const long long r = t / ncols, c = t % ncols;
    const float x = fminf(g[r * g_stride + c], limit);
    const float v = fminf(fmaxf(u[r * u_stride + c], -limit), limit);
    y[r * y_stride + c] = x / (1.0f + expf(alpha * -x)) * (v + 1.0f);
}
