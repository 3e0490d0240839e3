// Decode-time matrix-vector products: activations quantized to Q8_1 blocks on the device, then
// integer dot products against ggml-quantized weight rows read in place.
//
// Each weight type defines a "unit": the span of values one thread handles per step (one 32-value
// Q8_1 block, or two for Q4_K/Q5_K whose nibbles pair sub-blocks). A block of threads computes one
// output row: its threads stride over the row's units, then the block reduces. Offsets that
// depend on the whole 32-value block (Q4_0's -8, the K-quant minimums) use the Q8_1 block's
// precomputed sum `s`, or per-16 sums via a dot with ones where the scale changes every 16 values.
#include "common.h"

// x (n floats, n a multiple of 32) -> y (n/32 Q8_1 blocks). One 32-lane group per block: works
// for any warp size that is a multiple of 32, since the reductions use width 32.
RF_KERNEL void quantize_q8_1(const float* __restrict__ x, uint8_t* __restrict__ y, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int blk = i / QK8_1;
    if (blk * QK8_1 >= n) return;  // whole 32-lane groups leave together
    const int l = i % QK8_1;
    const float v = x[i];
    const float amax = warp_max<32>(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    const float sum = warp_sum<32>((float)q);
    uint8_t* b = y + (size_t)blk * Q8_1_BYTES;
    reinterpret_cast<int8_t*>(b + 4)[l] = (int8_t)q;
    if (l == 0) {
        reinterpret_cast<__half*>(b)[0] = __float2half(d);
        reinterpret_cast<__half*>(b)[1] = __float2half(sum * d);
    }
}

// ---------------------------------------------------------------------------------------------
// Per-type unit dot products. `b` is the weight block, `u` the unit index inside it, `y` the Q8_1
// activations of the whole row (block index = value index / 32).
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ int ones() { return 0x01010101; }

struct vd_q4_0 {
    static constexpr int QK = 32, BYTES = Q4_0_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        int sumi = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int w = ld_i32_a2(b + 2 + 4 * j);
            sumi = dot4_i8(w & 0x0F0F0F0F, ld_i32_a4(a.qs + 4 * j), sumi);
            sumi = dot4_i8((w >> 4) & 0x0F0F0F0F, ld_i32_a4(a.qs + 16 + 4 * j), sumi);
        }
        return ld_f16(b) * (a.d * (float)sumi - 8.0f * a.s);
    }
};

struct vd_q4_1 {
    static constexpr int QK = 32, BYTES = Q4_1_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        int sumi = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int w = ld_i32_a4(b + 4 + 4 * j);
            sumi = dot4_i8(w & 0x0F0F0F0F, ld_i32_a4(a.qs + 4 * j), sumi);
            sumi = dot4_i8((w >> 4) & 0x0F0F0F0F, ld_i32_a4(a.qs + 16 + 4 * j), sumi);
        }
        return ld_f16(b) * a.d * (float)sumi + ld_f16(b + 2) * a.s;
    }
};

struct vd_q5_0 {
    static constexpr int QK = 32, BYTES = Q5_0_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        const uint32_t qh = (uint32_t)ld_i32_a2(b + 2);
        int sumi = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int w = ld_i32_a2(b + 6 + 4 * j);
            const int lo = (w & 0x0F0F0F0F) | spread_bit4((qh >> (4 * j)) & 0xF);
            const int hi = ((w >> 4) & 0x0F0F0F0F) | spread_bit4((qh >> (16 + 4 * j)) & 0xF);
            sumi = dot4_i8(lo, ld_i32_a4(a.qs + 4 * j), sumi);
            sumi = dot4_i8(hi, ld_i32_a4(a.qs + 16 + 4 * j), sumi);
        }
        return ld_f16(b) * (a.d * (float)sumi - 16.0f * a.s);
    }
};

struct vd_q5_1 {
    static constexpr int QK = 32, BYTES = Q5_1_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        const uint32_t qh = (uint32_t)ld_i32_a4(b + 4);
        int sumi = 0;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int w = ld_i32_a4(b + 8 + 4 * j);
            const int lo = (w & 0x0F0F0F0F) | spread_bit4((qh >> (4 * j)) & 0xF);
            const int hi = ((w >> 4) & 0x0F0F0F0F) | spread_bit4((qh >> (16 + 4 * j)) & 0xF);
            sumi = dot4_i8(lo, ld_i32_a4(a.qs + 4 * j), sumi);
            sumi = dot4_i8(hi, ld_i32_a4(a.qs + 16 + 4 * j), sumi);
        }
        return ld_f16(b) * a.d * (float)sumi + ld_f16(b + 2) * a.s;
    }
};

struct vd_q8_0 {
    static constexpr int QK = 32, BYTES = Q8_0_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        int sumi = 0;
#pragma unroll
        for (int j = 0; j < 8; ++j) sumi = dot4_i8(ld_i32_a2(b + 2 + 4 * j), ld_i32_a4(a.qs + 4 * j), sumi);
        return ld_f16(b) * a.d * (float)sumi;
    }
};

// Q2_K unit u (0..7) = values 32u..32u+31: 2-bit fields at shift 2*(u%4) of qs[32*(u/4) + l],
// scales (low nibble) and mins (high nibble) per 16 values.
struct vd_q2_k {
    static constexpr int QK = QK_K, BYTES = Q2_K_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int u, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        const int n = u / 4, j = u % 4;
        const uint8_t* qs = b + 16 + 32 * n;
        float acc_d = 0.0f, acc_m = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int sq = 0, su = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int w = (ld_i32_a4(qs + 16 * h + 4 * k) >> (2 * j)) & 0x03030303;
                const int v = ld_i32_a4(a.qs + 16 * h + 4 * k);
                sq = dot4_i8(w, v, sq);
                su = dot4_i8(ones(), v, su);
            }
            const int s = b[8 * n + 2 * j + h];
            acc_d += (float)((s & 0xF) * sq);
            acc_m += (float)((s >> 4) * su);
        }
        return a.d * (ld_f16(b + 80) * acc_d - ld_f16(b + 82) * acc_m);
    }
};

// Q3_K unit u (0..7): 2 low bits at shift 2*(u%4) of qs[32*(u/4) + l], the high bit (set means
// "no -4") at bit 4*(u/4) + u%4 of hmask[l]; signed 6-bit scales per 16 values.
struct vd_q3_k {
    static constexpr int QK = QK_K, BYTES = Q3_K_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int u, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        const int n = u / 4, j = u % 4;
        const uint8_t* qs = b + 32 + 32 * n;
        float acc = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int sq = 0, su = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int lo = (ld_i32_a2(qs + 16 * h + 4 * k) >> (2 * j)) & 0x03030303;
                const int hb = (ld_i32_a2(b + 16 * h + 4 * k) >> (4 * n + j)) & 0x01010101;
                const int v = ld_i32_a4(a.qs + 16 * h + 4 * k);
                // (q2 + 4*hb) - 4 == q2 - (hb ? 0 : 4); the bytes stay in 0..7, so no borrows.
                sq = dot4_i8(lo | (hb << 2), v, sq);
                su = dot4_i8(ones(), v, su);
            }
            acc += (float)(scale_q3_k(b + 96, 8 * n + 2 * j + h) * (sq - 4 * su));
        }
        return a.d * ld_f16(b + 108) * acc;
    }
};

// Q4_K unit u (0..3) = values 64u..64u+63: low nibbles of qs[32u + l] are sub-block 2u, high
// nibbles sub-block 2u+1; mins use the Q8_1 sums directly.
struct vd_q4_k {
    static constexpr int QK = QK_K, BYTES = Q4_K_BYTES, UNIT = 64;
    static __device__ __forceinline__ float dot(const uint8_t* b, int u, const uint8_t* y, int yb) {
        const q8_1_view a0 = q8_1_at(y, yb), a1 = q8_1_at(y, yb + 1);
        const int4* qs = reinterpret_cast<const int4*>(b + 16 + 32 * u);
        const int4 w0 = qs[0], w1 = qs[1];
        const int w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            s0 = dot4_i8(w[k] & 0x0F0F0F0F, ld_i32_a4(a0.qs + 4 * k), s0);
            s1 = dot4_i8((w[k] >> 4) & 0x0F0F0F0F, ld_i32_a4(a1.qs + 4 * k), s1);
        }
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * u, b + 4, sc0, m0);
        scale_min_k4(2 * u + 1, b + 4, sc1, m1);
        return ld_f16(b) * ((float)(sc0 * s0) * a0.d + (float)(sc1 * s1) * a1.d) -
               ld_f16(b + 2) * ((float)m0 * a0.s + (float)m1 * a1.s);
    }
};

// Q5_K unit u (0..3): as Q4_K plus the fifth bit of value l of sub-block k at bit k of qh[l].
struct vd_q5_k {
    static constexpr int QK = QK_K, BYTES = Q5_K_BYTES, UNIT = 64;
    static __device__ __forceinline__ float dot(const uint8_t* b, int u, const uint8_t* y, int yb) {
        const q8_1_view a0 = q8_1_at(y, yb), a1 = q8_1_at(y, yb + 1);
        const int4* qs = reinterpret_cast<const int4*>(b + 48 + 32 * u);
        const int4* qhp = reinterpret_cast<const int4*>(b + 16);
        const int4 w0 = qs[0], w1 = qs[1], h0 = qhp[0], h1 = qhp[1];
        const int w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
        const int hh[8] = {h0.x, h0.y, h0.z, h0.w, h1.x, h1.y, h1.z, h1.w};
        int s0 = 0, s1 = 0;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int lo = (w[k] & 0x0F0F0F0F) | (((hh[k] >> (2 * u)) & 0x01010101) << 4);
            const int hi = ((w[k] >> 4) & 0x0F0F0F0F) | (((hh[k] >> (2 * u + 1)) & 0x01010101) << 4);
            s0 = dot4_i8(lo, ld_i32_a4(a0.qs + 4 * k), s0);
            s1 = dot4_i8(hi, ld_i32_a4(a1.qs + 4 * k), s1);
        }
        int sc0, m0, sc1, m1;
        scale_min_k4(2 * u, b + 4, sc0, m0);
        scale_min_k4(2 * u + 1, b + 4, sc1, m1);
        return ld_f16(b) * ((float)(sc0 * s0) * a0.d + (float)(sc1 * s1) * a1.d) -
               ld_f16(b + 2) * ((float)m0 * a0.s + (float)m1 * a1.s);
    }
};

// Q6_K unit u (0..7): n = u/4, j = u%4; low 4 bits from ql[64n + 32(j&1) + l] at shift 4(j>>1),
// high 2 bits from qh[32n + l] at shift 2j; value - 32; int8 scales per 16 values.
struct vd_q6_k {
    static constexpr int QK = QK_K, BYTES = Q6_K_BYTES, UNIT = 32;
    static __device__ __forceinline__ float dot(const uint8_t* b, int u, const uint8_t* y, int yb) {
        const q8_1_view a = q8_1_at(y, yb);
        const int n = u / 4, j = u % 4;
        const uint8_t* ql = b + 64 * n + 32 * (j & 1);
        const uint8_t* qh = b + 128 + 32 * n;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const int shift = 4 * (j >> 1);
        int acc = 0;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            int sq = 0, su = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int lo = (ld_i32_a2(ql + 16 * h + 4 * k) >> shift) & 0x0F0F0F0F;
                const int hi = (ld_i32_a2(qh + 16 * h + 4 * k) >> (2 * j)) & 0x03030303;
                const int v = ld_i32_a4(a.qs + 16 * h + 4 * k);
                sq = dot4_i8(lo | (hi << 4), v, sq);
                su = dot4_i8(ones(), v, su);
            }
            acc += (int)sc[8 * n + 2 * j + h] * (sq - 32 * su);
        }
        return a.d * ld_f16(b + 208) * (float)acc;
    }
};

// ---------------------------------------------------------------------------------------------
// out[c * out_stride + row] = dot(W[row], y[c]): each warp computes one row (rows
// blockIdx.x * warps_per_block + warp), activation vectors in grid.y. W rows are `row_bytes`
// apart; y vectors are `ncols / 32` Q8_1 blocks apart. A warp per row keeps every lane busy on
// short rows (640 values) and needs no block-wide reduction on long ones.
// ---------------------------------------------------------------------------------------------
template <typename T>
static __device__ __forceinline__ void matvec_q(const uint8_t* __restrict__ w, const uint8_t* __restrict__ y,
                                                float* __restrict__ out, int ncols, long long row_bytes,
                                                int out_stride, int nrows) {
    const int lane = threadIdx.x % RF_WARP;
    const int row = blockIdx.x * (blockDim.x / RF_WARP) + threadIdx.x / RF_WARP;
    if (row >= nrows) return;  // whole warps leave together
    const int col = blockIdx.y;
    const uint8_t* wr = w + (long long)row * row_bytes;
    const uint8_t* yc = y + (size_t)col * (ncols / QK8_1) * Q8_1_BYTES;
    constexpr int UPB = T::QK / T::UNIT;  // units per block
    const int units = ncols / T::UNIT;
    float acc = 0.0f;
    for (int u = lane; u < units; u += RF_WARP) {
        const int blk = u / UPB, sub = u % UPB;
        acc += T::dot(wr + (size_t)blk * T::BYTES, sub, yc, u * (T::UNIT / QK8_1));
    }
    acc = warp_sum(acc);
    if (lane == 0) out[(size_t)col * out_stride + row] = acc;
}

#define RF_MATVEC(name, T)                                                                       \
    RF_KERNEL void name(const uint8_t* w, const uint8_t* y, float* out, int ncols, long long row_bytes, \
                        int out_stride, int nrows) {                                             \
        matvec_q<T>(w, y, out, ncols, row_bytes, out_stride, nrows);                             \
    }

RF_MATVEC(matvec_q4_0, vd_q4_0)
RF_MATVEC(matvec_q4_1, vd_q4_1)
RF_MATVEC(matvec_q5_0, vd_q5_0)
RF_MATVEC(matvec_q5_1, vd_q5_1)
RF_MATVEC(matvec_q8_0, vd_q8_0)
RF_MATVEC(matvec_q2_k, vd_q2_k)
RF_MATVEC(matvec_q3_k, vd_q3_k)
RF_MATVEC(matvec_q4_k, vd_q4_k)
RF_MATVEC(matvec_q5_k, vd_q5_k)
RF_MATVEC(matvec_q6_k, vd_q6_k)

// Float weights (F32/F16 rows) times float activations, same grid as the quantized kernels.
template <typename W>
static __device__ __forceinline__ float ld_w(const W* p, int i);
template <>
__device__ __forceinline__ float ld_w<float>(const float* p, int i) { return p[i]; }
template <>
__device__ __forceinline__ float ld_w<__half>(const __half* p, int i) { return __half2float(p[i]); }

template <typename W>
static __device__ __forceinline__ void matvec_f(const W* __restrict__ w, const float* __restrict__ x,
                                                float* __restrict__ out, int ncols, long long row_stride,
                                                int out_stride) {
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const int row = blockIdx.x, col = blockIdx.y;
    const W* wr = w + (long long)row * row_stride;
    const float* xc = x + (size_t)col * ncols;
    float acc = 0.0f;
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) acc += ld_w(wr, i) * xc[i];
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[(size_t)col * out_stride + row] = acc;
}

RF_KERNEL void matvec_f32(const float* w, const float* x, float* out, int ncols, long long row_stride,
                          int out_stride) {
    matvec_f<float>(w, x, out, ncols, row_stride, out_stride);
}

RF_KERNEL void matvec_f16(const __half* w, const float* x, float* out, int ncols, long long row_stride,
                          int out_stride) {
    matvec_f<__half>(w, x, out, ncols, row_stride, out_stride);
}
