// Shared device helpers for rocmforge's HIP kernels: warp size, warp reductions, 8-bit dot
// products and ggml's quantized block layouts, for both the AMD and the NVIDIA HIP platforms.
//
// Block layouts are byte offsets into ggml's on-disk structs (GGUF stores them verbatim), so a
// weight tensor uploaded byte for byte is read in place. Blocks whose size is not a multiple of 4
// (Q4_0: 18, Q5_0: 22, Q8_0: 34, Q3_K: 110, Q6_K: 210 bytes) are only 2-byte aligned inside a row,
// which is why their 32-bit words are assembled from 16-bit loads.
#pragma once

#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#include <stdint.h>

// ---------------------------------------------------------------------------------------------
// Warp size: a compile-time property of the target, never assumed to be 32. AMD's compiler
// defines the wavefront size of the target it compiles for (64 on GCN/CDNA, 32 by default on
// RDNA); every CUDA architecture has 32-thread warps. Kernels size their shared scratch for the
// smallest warp (32) so that any block of up to 1024 threads fits.
// ---------------------------------------------------------------------------------------------
#if defined(__HIP_PLATFORM_NVIDIA__) || defined(__HIP_PLATFORM_NVCC__)
#define RF_NVIDIA 1
#define RF_WARP 32
#elif defined(RF_WAVE_SIZE)
// One target per compile (`cargo xtask kernels` with the newer toolchain) passes its wave size,
// since clang 21 deprecates __AMDGCN_WAVEFRONT_SIZE.
#define RF_AMD 1
#define RF_WARP RF_WAVE_SIZE
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define RF_AMD 1
#define RF_WARP __AMDGCN_WAVEFRONT_SIZE
#else
#define RF_AMD 1
#define RF_WARP 64
#endif

#define RF_MAX_WARPS_PER_BLOCK 32

// 16 bytes moved by one load or store. HIP's int4 is a struct copied by memcpy, and on AMD an
// array of them filled under a condition stays in scratch memory (SROA does not split it); a clang
// vector type stays in registers. NVIDIA keeps int4.
#if defined(RF_NVIDIA)
typedef int4 rf_b128;
#else
typedef int rf_b128 __attribute__((ext_vector_type(4)));
#endif

// The block size a kernel is always launched with, as a register budget for AMD's compiler: HIP
// compiles a kernel without __launch_bounds__ for blocks of 1024 threads, which caps it at 128
// VGPRs on wave64 targets (192 on RDNA3) and made the mat-vec and paged decode kernels spill to
// scratch (`cargo xtask kernel-resources`). NVIDIA keeps the register allocation it was measured
// with.
#if defined(RF_NVIDIA)
#define RF_AMD_BOUNDS(threads)
#else
#define RF_AMD_BOUNDS(threads) __launch_bounds__(threads)
#endif
#define RF_KERNEL extern "C" __global__

// Programmatic dependent launch (NVIDIA, compute capability 9.0 and later): the host may launch a
// kernel while the kernel before it on the stream is still running, so that the launch and the
// scheduling of its blocks overlap that kernel's tail. Every kernel therefore opens with
// rf_entry(): wait until the grids before it have completed and their writes are visible (before
// any load or store), then let the next kernel start launching. Both are no-ops elsewhere and
// when a kernel is launched the plain way.
// Letting the next kernel launch before the wait measured slower (kernels/PERF.md).
static __device__ __forceinline__ void rf_entry() {
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks for the 128-byte line holding `p` (read-only data no kernel writes, i.e. weights) to be
// brought into the L2 cache. Issued before rf_entry(), it lets a kernel that launched early fetch
// its first weights while the kernel before it is still finishing.
static __device__ __forceinline__ void rf_prefetch_l2(const void* p) {
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}

static __device__ __forceinline__ float rf_shfl_xor(float v, int mask, int width = RF_WARP) {
#if defined(RF_NVIDIA)
    return __shfl_xor_sync(0xffffffffu, v, mask, width);
#else
    return __shfl_xor(v, mask, width);
#endif
}

static __device__ __forceinline__ int rf_shfl_xor_int(int v, int mask, int width = RF_WARP) {
#if defined(RF_NVIDIA)
    return __shfl_xor_sync(0xffffffffu, v, mask, width);
#else
    return __shfl_xor(v, mask, width);
#endif
}

template <int WIDTH = RF_WARP>
static __device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = WIDTH / 2; m > 0; m >>= 1) v += rf_shfl_xor(v, m, WIDTH);
    return v;
}

template <int WIDTH = RF_WARP>
static __device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = WIDTH / 2; m > 0; m >>= 1) v = fmaxf(v, rf_shfl_xor(v, m, WIDTH));
    return v;
}

// Sum over the whole block (any multiple of the warp size up to 1024 threads). Every thread
// gets the result. `scratch` must hold RF_MAX_WARPS_PER_BLOCK floats.
static __device__ __forceinline__ float block_sum(float v, float* scratch) {
    const int lane = threadIdx.x % RF_WARP;
    const int warp = threadIdx.x / RF_WARP;
    const int nwarps = blockDim.x / RF_WARP;
    v = warp_sum(v);
    if (nwarps == 1) return v;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

static __device__ __forceinline__ float block_max(float v, float* scratch) {
    const int lane = threadIdx.x % RF_WARP;
    const int warp = threadIdx.x / RF_WARP;
    const int nwarps = blockDim.x / RF_WARP;
    v = warp_max(v);
    if (nwarps == 1) return v;
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -INFINITY;
    return warp_max(v);
}

// ---------------------------------------------------------------------------------------------
// Activations (ops' act_f32 and the gated mat-vec epilogue evaluate the same functions).
// ---------------------------------------------------------------------------------------------
// GELU, tanh approximation (the form ggml's gelu and GGUF models' "gelu" FFNs use), rounded as
// ggml's CPU backend and our CPU op evaluate it (an f16 lookup table): f16 input, f16 result,
// exact limits beyond +-10.
static __device__ __forceinline__ float gelu_tanh(float x) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x;
    const float k0 = 0.7978845608028654f;  // sqrt(2/pi)
    const float k1 = 0.044715f;
    const float h = __half2float(__float2half(x));
    return __half2float(__float2half(0.5f * h * (1.0f + tanhf(k0 * h * (1.0f + k1 * h * h)))));
}

static __device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }

enum { ACT_GELU = 0, ACT_SILU = 1 };

static __device__ __forceinline__ float act_fn(int kind, float x) { return kind == ACT_GELU ? gelu_tanh(x) : silu(x); }

// ---------------------------------------------------------------------------------------------
// 4 x int8 dot product with 32-bit accumulation: dp4a on NVIDIA (sm_61+), v_dot4_i32_i8 on AMD
// targets that have it (gfx906/908/90a/940/942/950, RDNA2), v_dot4_i32_iu8 on RDNA3 and RDNA4, a
// portable byte loop elsewhere (which, unrolled in the decode stack, spilled its registers).
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ int dot4_i8(int a, int b, int c) {
#if defined(RF_NVIDIA)
    return __dp4a(a, b, c);
#elif defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || defined(__gfx940__) || \
    defined(__gfx1030__) || defined(__gfx1031__) || defined(__gfx1032__) ||                     \
    defined(__gfx1033__) || defined(__gfx1034__) || defined(__gfx1035__) || defined(__gfx1036__) || \
    defined(__gfx942__) || defined(__gfx950__)
    return __builtin_amdgcn_sdot4(a, b, c, false);
#elif defined(__gfx1100__) || defined(__gfx1101__) || defined(__gfx1102__) || defined(__gfx1103__) || \
    defined(__gfx1150__) || defined(__gfx1151__) || defined(__gfx1152__) || defined(__gfx1200__) ||  \
    defined(__gfx1201__)
    // RDNA3 and later: the signed-or-unsigned form (v_dot4_i32_iu8), both operands signed.
    return __builtin_amdgcn_sudot4(true, a, true, b, c, false);
#else
    const int8_t* va = reinterpret_cast<const int8_t*>(&a);
    const int8_t* vb = reinterpret_cast<const int8_t*>(&b);
    return c + va[0] * vb[0] + va[1] * vb[1] + va[2] * vb[2] + va[3] * vb[3];
#endif
}

#if defined(RF_NVIDIA)
// 4 x (unsigned byte times signed byte) with 32-bit accumulation; NVIDIA only (dp4a takes the
// two operands' signedness separately).
static __device__ __forceinline__ int dot4_u8i8(uint32_t a, int b, int c) {
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}
#endif

// ---------------------------------------------------------------------------------------------
// Loads from byte pointers with the alignment the block layout guarantees.
// ---------------------------------------------------------------------------------------------
static __device__ __forceinline__ float ld_f16(const uint8_t* p) {
    return __half2float(__ushort_as_half(*reinterpret_cast<const uint16_t*>(p)));
}

// 32-bit word at a 2-byte aligned address.
static __device__ __forceinline__ int ld_i32_a2(const uint8_t* p) {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
    return (int)((uint32_t)q[0] | ((uint32_t)q[1] << 16));
}

// 32-bit word at a 4-byte aligned address.
static __device__ __forceinline__ int ld_i32_a4(const uint8_t* p) {
    return *reinterpret_cast<const int*>(p);
}

// ---------------------------------------------------------------------------------------------
// Activations quantized on the device for the integer dot products: ggml's block_q8_1 values
// (d = amax / 127, 32 x int8, s = d * sum(qs)) stored planar, so that value loads are 16-byte
// aligned and adjacent lanes read adjacent bytes: per vector of `ncols` values, `ncols` int8 at
// offset 0, then `ncols / 32` half2 (d, s) at offset `ncols`; vectors are `q8_vec_bytes(ncols)`
// apart (36 bytes per 32 values, rounded up to 16). `kernels::q8_1_vector_bytes` mirrors this.
// ---------------------------------------------------------------------------------------------
#define QK8_1 32
#define Q8_1_BYTES 36

static __device__ __forceinline__ size_t q8_vec_bytes(int ncols) {
    return ((size_t)ncols / 32 * Q8_1_BYTES + 15) & ~(size_t)15;
}

struct q8_vec {
    const uint8_t* q;   // ncols int8
    const uint8_t* ds;  // ncols / 32 half2 (d, s)
};

static __device__ __forceinline__ q8_vec q8_vec_at(const uint8_t* y, int ncols, int vec) {
    q8_vec v;
    v.q = y + (size_t)vec * q8_vec_bytes(ncols);
    v.ds = v.q + ncols;
    return v;
}

// Value `i` of a planar Q8 vector of `ncols` values at `yq` with one half2 (d, s) per QK values
// (Q8_1: QK = 32; the decode stack's FFN activation: 16), from `v`, where each QK-lane group holds
// QK consecutive values (block i / QK): the scale and sum come from width-QK reductions, so every
// lane of the group takes part, and only lanes with `write` store.
// `qi`: where value i's byte goes (i itself, or i's place in a permuted layout).
template <int QK>
static __device__ __forceinline__ void q8_put(float v, uint8_t* yq, int ncols, int i, int qi, bool write = true) {
    const float amax = warp_max<QK>(fabsf(v));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = (int)roundf(v * id);
    const float sum = warp_sum<QK>((float)q);
    if (!write) return;
    reinterpret_cast<int8_t*>(yq)[qi] = (int8_t)q;
    if ((i & (QK - 1)) == 0) {
        __half* ds = reinterpret_cast<__half*>(yq + ncols + 4 * (i / QK));
        ds[0] = __float2half(d);
        ds[1] = __float2half(sum * d);
    }
}

static __device__ __forceinline__ void q8_1_put(float v, uint8_t* yq, int ncols, int i, int qi) {
    q8_put<QK8_1>(v, yq, ncols, i, qi);
}

static __device__ __forceinline__ void q8_1_put(float v, uint8_t* yq, int ncols, int i) {
    q8_1_put(v, yq, ncols, i, i);
}

// The low (d) and high (s) halves of a packed half2 word.
static __device__ __forceinline__ float lo_f16(uint32_t w) {
    return __half2float(__ushort_as_half((unsigned short)(w & 0xFFFFu)));
}
static __device__ __forceinline__ float hi_f16(uint32_t w) {
    return __half2float(__ushort_as_half((unsigned short)(w >> 16)));
}

// 16 bytes at a 16-byte aligned address.
static __device__ __forceinline__ int4 ld_b128(const uint8_t* p) {
    return *reinterpret_cast<const int4*>(p);
}

// Bytes 2..5 of the 8-byte pair (lo, hi): a 32-bit word that starts at a 2-byte offset.
static __device__ __forceinline__ uint32_t funnel16(uint32_t lo, uint32_t hi) {
    return (lo >> 16) | (hi << 16);
}

// Orders a warp's shared-memory writes before its lanes read each other's data.
static __device__ __forceinline__ void rf_syncwarp() {
#if defined(RF_NVIDIA)
    __syncwarp();
#else
    __builtin_amdgcn_fence(__ATOMIC_RELEASE, "wavefront");
    __builtin_amdgcn_wave_barrier();
    __builtin_amdgcn_fence(__ATOMIC_ACQUIRE, "wavefront");
#endif
}

// ---------------------------------------------------------------------------------------------
// ggml block layouts (bytes per block, values per block, field offsets).
// ---------------------------------------------------------------------------------------------
#define QK_K 256

#define Q4_0_BYTES 18  // half d; u8 qs[16]
#define Q4_1_BYTES 20  // half d; half m; u8 qs[16]
#define Q5_0_BYTES 22  // half d; u8 qh[4]; u8 qs[16]
#define Q5_1_BYTES 24  // half d; half m; u8 qh[4]; u8 qs[16]
#define Q8_0_BYTES 34  // half d; i8 qs[32]
#define Q2_K_BYTES 84  // u8 scales[16]; u8 qs[64]; half d; half dmin
#define Q3_K_BYTES 110 // u8 hmask[32]; u8 qs[64]; u8 scales[12]; half d
#define Q4_K_BYTES 144 // half d; half dmin; u8 scales[12]; u8 qs[128]
#define Q5_K_BYTES 176 // half d; half dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]
#define Q6_K_BYTES 210 // u8 ql[128]; u8 qh[64]; i8 scales[16]; half d
#define MXFP4_BYTES 17 // u8 e (E8M0 exponent); u8 qs[16] (E2M1 nibbles, order as Q4_0)

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K super-block.
static __device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
    if (j < 4) {
        sc = q[j] & 63;
        m = q[j + 4] & 63;
    } else {
        sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

// The signed 6-bit scale of sub-block `is` (0..15) of a Q3_K super-block.
static __device__ __forceinline__ int scale_q3_k(const uint8_t* s, int is) {
    const int lo = is < 8 ? (s[is] & 0xF) : (s[is - 8] >> 4);
    const int hi = (s[8 + (is % 4)] >> (2 * (is / 4))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Spreads 4 bits (b0..b3) to bit 4 of each byte of a 32-bit word.
static __device__ __forceinline__ int spread_bit4(uint32_t h) {
    return (int)(((h & 1u) << 4) | ((h & 2u) << 11) | ((h & 4u) << 18) | ((h & 8u) << 25));
}

// ---------------------------------------------------------------------------------------------
// Dequantization of 32 consecutive values (sub-block `sub` of a block) into `out`.
// ---------------------------------------------------------------------------------------------
struct deq_q4_0 {
    static constexpr int QK = 32, BYTES = Q4_0_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        const float d = ld_f16(b);
        const uint8_t* qs = b + 2;
        for (int l = 0; l < 16; ++l) {
            out[l] = d * (float)((qs[l] & 0xF) - 8);
            out[l + 16] = d * (float)((qs[l] >> 4) - 8);
        }
    }
};

struct deq_q4_1 {
    static constexpr int QK = 32, BYTES = Q4_1_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        const float d = ld_f16(b), m = ld_f16(b + 2);
        const uint8_t* qs = b + 4;
        for (int l = 0; l < 16; ++l) {
            out[l] = d * (float)(qs[l] & 0xF) + m;
            out[l + 16] = d * (float)(qs[l] >> 4) + m;
        }
    }
};

struct deq_q5_0 {
    static constexpr int QK = 32, BYTES = Q5_0_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        const float d = ld_f16(b);
        const uint32_t qh = (uint32_t)ld_i32_a2(b + 2);
        const uint8_t* qs = b + 6;
        for (int l = 0; l < 16; ++l) {
            const int h0 = (qh >> l) & 1, h1 = (qh >> (l + 16)) & 1;
            out[l] = d * (float)(((qs[l] & 0xF) | (h0 << 4)) - 16);
            out[l + 16] = d * (float)(((qs[l] >> 4) | (h1 << 4)) - 16);
        }
    }
};

struct deq_q5_1 {
    static constexpr int QK = 32, BYTES = Q5_1_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        const float d = ld_f16(b), m = ld_f16(b + 2);
        const uint32_t qh = (uint32_t)ld_i32_a4(b + 4);
        const uint8_t* qs = b + 8;
        for (int l = 0; l < 16; ++l) {
            const int h0 = (qh >> l) & 1, h1 = (qh >> (l + 16)) & 1;
            out[l] = d * (float)((qs[l] & 0xF) | (h0 << 4)) + m;
            out[l + 16] = d * (float)((qs[l] >> 4) | (h1 << 4)) + m;
        }
    }
};

struct deq_q8_0 {
    static constexpr int QK = 32, BYTES = Q8_0_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        const float d = ld_f16(b);
        const int8_t* qs = reinterpret_cast<const int8_t*>(b + 2);
        for (int l = 0; l < 32; ++l) out[l] = d * (float)qs[l];
    }
};

struct deq_q2_k {
    static constexpr int QK = QK_K, BYTES = Q2_K_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int sub, float* out) {
        const uint8_t* sc = b;
        const uint8_t* qs = b + 16;
        const float d = ld_f16(b + 80), dmin = ld_f16(b + 82);
        const int n = sub / 4, j = sub % 4;
        for (int l = 0; l < 32; ++l) {
            const int s = sc[8 * n + 2 * j + l / 16];
            const int q = (qs[32 * n + l] >> (2 * j)) & 3;
            out[l] = d * (float)(s & 0xF) * (float)q - dmin * (float)(s >> 4);
        }
    }
};

struct deq_q3_k {
    static constexpr int QK = QK_K, BYTES = Q3_K_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int sub, float* out) {
        const uint8_t* hm = b;
        const uint8_t* qs = b + 32;
        const uint8_t* sc = b + 96;
        const float d = ld_f16(b + 108);
        const int n = sub / 4, j = sub % 4;
        for (int l = 0; l < 32; ++l) {
            const int s = scale_q3_k(sc, 8 * n + 2 * j + l / 16);
            const int q = ((qs[32 * n + l] >> (2 * j)) & 3) - (((hm[l] >> (4 * n + j)) & 1) ? 0 : 4);
            out[l] = d * (float)s * (float)q;
        }
    }
};

struct deq_q4_k {
    static constexpr int QK = QK_K, BYTES = Q4_K_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int sub, float* out) {
        const float d = ld_f16(b), dmin = ld_f16(b + 2);
        int sc, m;
        scale_min_k4(sub, b + 4, sc, m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        const uint8_t* qs = b + 16 + 32 * (sub / 2);
        const int shift = 4 * (sub & 1);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t w = (uint32_t)ld_i32_a2(qs + 4 * k) >> shift;
#pragma unroll
            for (int i = 0; i < 4; ++i) out[4 * k + i] = d1 * (float)((w >> (8 * i)) & 0xF) - m1;
        }
    }
};

struct deq_q5_k {
    static constexpr int QK = QK_K, BYTES = Q5_K_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int sub, float* out) {
        const float d = ld_f16(b), dmin = ld_f16(b + 2);
        int sc, m;
        scale_min_k4(sub, b + 4, sc, m);
        const float d1 = d * (float)sc, m1 = dmin * (float)m;
        const uint8_t* qh = b + 16;
        const uint8_t* qs = b + 48 + 32 * (sub / 2);
        const int shift = 4 * (sub & 1);
        for (int l = 0; l < 32; ++l) {
            const int q = ((qs[l] >> shift) & 0xF) | (((qh[l] >> sub) & 1) << 4);
            out[l] = d1 * (float)q - m1;
        }
    }
};

struct deq_q6_k {
    static constexpr int QK = QK_K, BYTES = Q6_K_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int sub, float* out) {
        const uint8_t* ql = b;
        const uint8_t* qh = b + 128;
        const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
        const float d = ld_f16(b + 208);
        const int n = sub / 4, j = sub % 4;
        const uint8_t* l4 = ql + 64 * n + 32 * (j & 1);
        const int shift = 4 * (j >> 1);
        const float d0 = d * (float)sc[8 * n + 2 * j], d1 = d * (float)sc[8 * n + 2 * j + 1];
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const uint32_t lo = (uint32_t)ld_i32_a2(l4 + 4 * k) >> shift;
            const uint32_t hi = (uint32_t)ld_i32_a2(qh + 32 * n + 4 * k) >> (2 * j);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int q = (int)(((lo >> (8 * i)) & 0xF) | (((hi >> (8 * i)) & 3) << 4)) - 32;
                out[4 * k + i] = (k < 4 ? d0 : d1) * (float)q;
            }
        }
    }
};

// MXFP4's E2M1 values doubled (so that they are integers); the E8M0 scale is halved to match,
// as ggml stores and decodes them.
// The magnitudes 0, 1, 2, 3, 4, 6, 8, 12 come from one packed constant (a table in memory would
// go to scratch on AMD); bit 3 of the nibble is the sign.
static __device__ __forceinline__ int mxfp4_value(int nib) {
    const int m = (int)((0xC8643210u >> (4 * (nib & 7))) & 0xF);
    return (nib & 8) ? -m : m;
}

// Four MXFP4 nibbles (bits 0-3 of each byte of `q`) as four signed bytes of their doubled values.
static __device__ __forceinline__ int mxfp4_bytes(uint32_t q) {
    int r = 0;
#pragma unroll
    for (int b = 0; b < 4; ++b) r |= (mxfp4_value((int)(q >> (8 * b))) & 0xFF) << (8 * b);
    return r;
}

// An E8M0 exponent byte as a float, halved (ggml's `e8m0_to_fp32_half`): 2^(e - 128), with the
// two smallest exponents as subnormals.
static __device__ __forceinline__ float e8m0_half(uint32_t e) {
    const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    return __uint_as_float(bits);
}

struct deq_mxfp4 {
    static constexpr int QK = 32, BYTES = MXFP4_BYTES;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        const float d = e8m0_half(b[0]);
        const uint8_t* qs = b + 1;
        for (int l = 0; l < 16; ++l) {
            out[l] = d * (float)mxfp4_value(qs[l] & 0xF);
            out[l + 16] = d * (float)mxfp4_value(qs[l] >> 4);
        }
    }
};

// Plain float types seen through the same interface, so get_rows/dequant handle every table.
struct deq_f32 {
    static constexpr int QK = 32, BYTES = 128;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        const float* x = reinterpret_cast<const float*>(b);
        for (int l = 0; l < 32; ++l) out[l] = x[l];
    }
};

struct deq_f16 {
    static constexpr int QK = 32, BYTES = 64;
    static __device__ __forceinline__ void run(const uint8_t* b, int, float* out) {
        for (int l = 0; l < 32; ++l) out[l] = ld_f16(b + 2 * l);
    }
};

// ---------------------------------------------------------------------------------------------
// RoPE angles (ops' rope kernels and the q/k/v mat-vec that rotates its outputs): pair i of a
// head at position p; see `rope_pair` in ops.hip for the formula.
// ---------------------------------------------------------------------------------------------
struct rope_rot {
    int i0, i1;  // the two columns the pair moves
    float c, s;  // cos and sin (times mscale)
    bool rot;    // false past n_dims: copied unrotated
};

static __device__ __forceinline__ rope_rot rope_angle(int i, float p, int n_dims, float base, float freq_scale,
                                                      const float* __restrict__ freq_factors, int neox,
                                                      float ext_factor, float mscale, float corr_lo, float corr_hi) {
    const int half_dims = n_dims / 2;
    if (i >= half_dims) return {2 * i, 2 * i + 1, 1.0f, 0.0f, false};
    float extrap = p * powf(base, -2.0f * (float)i / (float)n_dims);
    if (freq_factors) extrap /= freq_factors[i];
    const float interp = freq_scale * extrap;
    float theta = interp;
    if (ext_factor != 0.0f) {
        const float ramp = ((float)i - corr_lo) / fmaxf(0.001f, corr_hi - corr_lo);
        const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, ramp))) * ext_factor;
        theta = interp * (1.0f - mix) + extrap * mix;
    }
    float s, c;
    sincosf(theta, &s, &c);
    return {neox ? i : 2 * i, neox ? i + half_dims : 2 * i + 1, c * mscale, s * mscale, true};
}
