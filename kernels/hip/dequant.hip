// Dequantization of ggml-quantized tensors: whole matrices to f16 (the A operand of the prefill
// gemmEx) and selected rows to f32 (get_rows from quantized embedding tables).
//
// One thread expands one 32-value sub-block; rows are `row_bytes` apart in the source and
// `ncols` values apart in the destination.
#include "common.h"

// Writes 32 values with 16-byte stores where the destination allows it (the f16 gemm operand
// always does): scalar 2-byte stores, 64 bytes apart across a warp, left most of the write
// bandwidth unused.
static __device__ __forceinline__ void store32(__half* d, const float* v) {
    if ((reinterpret_cast<uintptr_t>(d) & 15) == 0) {
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            union {
                __half2 h[4];
                int4 q;
            } u;
#pragma unroll
            for (int k = 0; k < 4; ++k) u.h[k] = __floats2half2_rn(v[8 * c + 2 * k], v[8 * c + 2 * k + 1]);
            reinterpret_cast<int4*>(d)[c] = u.q;
        }
    } else {
#pragma unroll
        for (int l = 0; l < 32; ++l) d[l] = __float2half(v[l]);
    }
}

static __device__ __forceinline__ void store32(float* d, const float* v) {
    if ((reinterpret_cast<uintptr_t>(d) & 15) == 0) {
#pragma unroll
        for (int c = 0; c < 8; ++c)
            reinterpret_cast<float4*>(d)[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
    } else {
#pragma unroll
        for (int l = 0; l < 32; ++l) d[l] = v[l];
    }
}

// Rows given by grid.y (or by `ids` when non-null); sub-blocks by grid.x * blockDim.x.
template <typename T, typename O>
static __device__ __forceinline__ void dequant_rows(const uint8_t* __restrict__ src, O* __restrict__ dst,
                                                    const int* __restrict__ ids, int ncols,
                                                    long long row_bytes, long long dst_stride) {
    const int sub_total = ncols / 32;
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= sub_total) return;
    const int r = blockIdx.y + blockIdx.z * gridDim.y;
    const long long src_row = ids ? (long long)ids[r] : (long long)r;
    constexpr int SPB = T::QK / 32;
    const uint8_t* b = src + src_row * row_bytes + (long long)(s / SPB) * T::BYTES;
    float v[32];
    T::run(b, s % SPB, v);
    O* d = dst + (long long)r * dst_stride + (long long)s * 32;
    store32(d, v);
}

#define RF_DEQUANT(suffix, T)                                                                    \
    RF_KERNEL void dequant_f16_##suffix(const uint8_t* src, __half* dst, int ncols, long long row_bytes, \
                                        long long dst_stride) {                                 \
        rf_entry();                                                                             \
        dequant_rows<T, __half>(src, dst, nullptr, ncols, row_bytes, dst_stride);                \
    }                                                                                            \
    RF_KERNEL void get_rows_##suffix(const uint8_t* src, const int* ids, float* dst, int ncols,   \
                                     long long row_bytes, long long dst_stride) {                \
        rf_entry();                                                                              \
        dequant_rows<T, float>(src, dst, ids, ncols, row_bytes, dst_stride);                     \
    }

RF_DEQUANT(q4_0, deq_q4_0)
RF_DEQUANT(q4_1, deq_q4_1)
RF_DEQUANT(q5_0, deq_q5_0)
RF_DEQUANT(q5_1, deq_q5_1)
RF_DEQUANT(q8_0, deq_q8_0)
RF_DEQUANT(q2_k, deq_q2_k)
RF_DEQUANT(q3_k, deq_q3_k)
RF_DEQUANT(q4_k, deq_q4_k)
RF_DEQUANT(q5_k, deq_q5_k)
RF_DEQUANT(q6_k, deq_q6_k)
RF_DEQUANT(mxfp4, deq_mxfp4)

// Float tables: one thread per value, any row length. Strides in elements.
template <typename S>
static __device__ __forceinline__ float ld_s(const S* p, long long i);
template <>
__device__ __forceinline__ float ld_s<float>(const float* p, long long i) { return p[i]; }
template <>
__device__ __forceinline__ float ld_s<__half>(const __half* p, long long i) { return __half2float(p[i]); }

template <typename S>
static __device__ __forceinline__ void get_rows_plain(const S* __restrict__ src, const int* __restrict__ ids,
                                                      float* __restrict__ dst, int ncols, long long src_stride,
                                                      long long dst_stride) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= ncols) return;
    const int r = blockIdx.y + blockIdx.z * gridDim.y;
    dst[(long long)r * dst_stride + c] = ld_s(src, (long long)ids[r] * src_stride + c);
}

RF_KERNEL void get_rows_f32(const float* src, const int* ids, float* dst, int ncols, long long src_stride,
                            long long dst_stride) {
    rf_entry();
    get_rows_plain<float>(src, ids, dst, ncols, src_stride, dst_stride);
}

RF_KERNEL void get_rows_f16(const __half* src, const int* ids, float* dst, int ncols, long long src_stride,
                            long long dst_stride) {
    rf_entry();
    get_rows_plain<__half>(src, ids, dst, ncols, src_stride, dst_stride);
}

// Element-wise conversions for the gemmEx operands and results (n values, contiguous).
RF_KERNEL void convert_f32_f16(const float* x, __half* y, long long n) {
    rf_entry();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2half(x[i]);
}

RF_KERNEL void convert_f16_f32(const __half* x, float* y, long long n) {
    rf_entry();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __half2float(x[i]);
}
