// Block-level quantized dot products shared by the decode kernels (matvec.hip, stack.hip): the
// Q8_1 activation fragments each lane loads, the Q4_K and Q6_K block dot products against them,
// the shared-memory stage readers they use, and the cp.async helpers of the weight streams.
#pragma once
#include "common.h"

static __device__ __forceinline__ int ones() { return 0x01010101; }

// Signed bytes q - 32 for bytes q in 0..63, with no borrow between bytes.
static __device__ __forceinline__ int sub32_bytes(int q) {
    return (int)((((uint32_t)q | 0x80808080u) - 0x20202020u) ^ 0x80808080u);
}

// N 32-bit words starting at the 2-byte aligned byte offset `o` of a shared-memory stage (which
// has a slack word past its data, so the window's last read stays inside it).
template <int N>
static __device__ __forceinline__ void st_words(const uint32_t* st, int o, uint32_t* out) {
    const uint32_t* p = st + (o >> 2);
    const int sh = (o & 2) * 8;
    uint32_t w[N + 1];
#pragma unroll
    for (int k = 0; k <= N; ++k) w[k] = p[k];
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = (uint32_t)(((((uint64_t)w[k + 1]) << 32) | w[k]) >> sh);
}

static __device__ __forceinline__ float st_f16(const uint32_t* st, int o) {
    const uint32_t w = st[o >> 2];
    return (o & 2) ? hi_f16(w) : lo_f16(w);
}

static __device__ __forceinline__ int word(const int4& v, int k) {
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// --- Q2_K / Q3_K / Q6_K: four lanes per block; lane c = 2n + h takes values 128n + 32j + 16h +
// [0, 16) (j = 0..3) of its 256, which share their low-bit bytes (l in [16h, 16h + 16) of half n).

struct act_h16 {
    int4 q[4];   // values 128n + 32j + 16h + [0, 16), j = 0..3
    float d[4];  // their Q8_1 scales
};

// The decode stack keeps its Q8_1 input in shared memory with the 16-byte pieces of each
// 512-byte span permuted, piece u stored at act_swz(u): the eight lanes of a quarter-warp read
// pieces 16b + 4c + j (Q4_K, four lanes per block) or 16b + 8n + h + 2j (Q6_K) of two blocks,
// which in place fall on two of the eight 16-byte bank groups (4-way conflicts, three quarters of
// the stack's shared-memory wavefronts in ncu); permuted, on eight.
static __device__ __forceinline__ int act_swz(int u) { return u ^ (((u >> 3) & 1) * 5) ^ (((u >> 4) & 1) * 2); }

// 16 bytes of a Q8_1 vector's values at piece u, permuted (SWZ) or in place.
template <bool SWZ>
static __device__ __forceinline__ int4 ld_act_piece(q8_vec y, int u) {
    return ld_b128(y.q + 16 * (SWZ ? act_swz(u) : u));
}

template <bool SWZ = false>
static __device__ __forceinline__ void load_act_h16(q8_vec y, int b, int c, act_h16& a) {
    const int n = c >> 1, h = c & 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) a.q[j] = ld_act_piece<SWZ>(y, 16 * b + 8 * n + h + 2 * j);
    const int4 ds = ld_b128(y.ds + 4 * (8 * b + 4 * n));
    a.d[0] = lo_f16((uint32_t)ds.x);
    a.d[1] = lo_f16((uint32_t)ds.y);
    a.d[2] = lo_f16((uint32_t)ds.z);
    a.d[3] = lo_f16((uint32_t)ds.w);
}


// Whether the Q6_K mat-vecs take the cp.async pipeline (off: measured slower on the 8B's FFN
// shapes; the output head's numbers are at MV_PREFETCH_TALL_ROWS in matvec.hip).
#ifndef MV_Q6K_PIPE
#define MV_Q6K_PIPE false
#endif

template <int ROUNDS_>
struct mv_q6_k {
    static constexpr int QK = QK_K, BYTES = Q6_K_BYTES, LPB = 4, ROUNDS = ROUNDS_;
    static constexpr bool PIPE = MV_Q6K_PIPE;
    using Act = act_h16;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int c, Act& a) { load_act_h16(y, b, c, a); }
    // SPLIT: the -32 offset of the 6-bit values is taken out of the byte loop (the unsigned
    // values' dot product minus 32 times the activations' sum, a second dp4a against ones): two
    // instructions fewer per word, for issue-bound callers (the decode stack); the mat-vecs keep
    // the per-byte subtraction, which they were measured with.
    template <bool SPLIT = false>
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int c, const Act& a) {
        const int n = c >> 1, h = c & 1;
        uint32_t ql0[4], ql1[4], qh[4], sc[2];
        st_words<4>(st, o + 64 * n + 16 * h, ql0);
        st_words<4>(st, o + 64 * n + 32 + 16 * h, ql1);
        st_words<4>(st, o + 128 + 32 * n + 16 * h, qh);
        st_words<2>(st, o + 192 + 8 * n, sc);
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const uint32_t* ql = (j & 1) ? ql1 : ql0;
            int s = 0, sa = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int lo = (int)(ql[k] >> (4 * (j >> 1))) & 0x0F0F0F0F;
                const int hi = (int)(qh[k] >> (2 * j)) & 0x03030303;
                if (SPLIT) {
                    s = dot4_i8(lo | (hi << 4), word(a.q[j], k), s);
                    sa = dot4_i8(ones(), word(a.q[j], k), sa);
                } else {
                    s = dot4_i8(sub32_bytes(lo | (hi << 4)), word(a.q[j], k), s);
                }
            }
            const int scale = (int)(int8_t)(sc[j >> 1] >> (8 * (2 * (j & 1) + h)));
            acc += (float)(scale * (SPLIT ? s - 32 * sa : s)) * a.d[j];
        }
        return st_f16(st, o + 208) * acc;
    }
};

// Asynchronous global-to-shared copies (cp.async) exist on NVIDIA compute capability 8.0 and
// later; elsewhere these helpers compile to nothing and callers take another path.
#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define RF_CP_ASYNC 1
#endif

static __device__ __forceinline__ void cp_async16(void* dst, const void* src) {
#if defined(RF_CP_ASYNC)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(dst)),
                 "l"(src)
                 : "memory");
#endif
}

// The same with the destination as a shared-memory address (callers that add offsets to one
// converted base).
static __device__ __forceinline__ void cp_async16_s(uint32_t dst, const void* src) {
#if defined(RF_CP_ASYNC)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
#endif
}

static __device__ __forceinline__ void cp_async_commit() {
#if defined(RF_CP_ASYNC)
    asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

// Waits until at most N of this thread's copy groups are pending.
template <int N>
static __device__ __forceinline__ void cp_async_wait() {
#if defined(RF_CP_ASYNC)
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

// --- Q4_K / Q5_K: 16-byte aligned blocks read directly; eight lanes per block, lane c takes qs
// bytes [16c, 16c + 16): low nibbles are values 64u + 16h + [0, 16) of sub-block 2u, high
// nibbles the same offsets of sub-block 2u + 1 (u = c / 2, h = c % 2).

struct act_k4 {
    int4 lo, hi;
    float d0, s0, d1, s1;  // s0 = s1 = 0 on odd lanes, so the minimums count once per sub-block
};

// On NVIDIA the Q4_K high nibbles are multiplied in place (byte & 0xF0, unsigned times signed
// dp4a), one shift fewer per word; their sums come out 16 times too large, which HI16 takes
// out of d1 here, once per activation fragment instead of once per row.
#if defined(RF_NVIDIA)
#define RF_K4_HI16 1
#else
#define RF_K4_HI16 0
#endif

template <bool HI16 = false>
static __device__ __forceinline__ void load_act_k4(q8_vec y, int b, int c, act_k4& a) {
    const int u = c >> 1, h = c & 1;
    const uint8_t* base = y.q + 256 * b + 64 * u + 16 * h;
    a.lo = ld_b128(base);
    a.hi = ld_b128(base + 32);
    const uint2 ds = *reinterpret_cast<const uint2*>(y.ds + 4 * (8 * b + 2 * u));
    a.d0 = lo_f16(ds.x);
    a.d1 = HI16 ? lo_f16(ds.y) * 0.0625f : lo_f16(ds.y);
    a.s0 = h ? 0.0f : hi_f16(ds.x);
    a.s1 = h ? 0.0f : hi_f16(ds.y);
}

template <bool A16>
static __device__ __forceinline__ int4 ld_w128(const uint8_t* p) {
    if (A16) return ld_b128(p);
    return make_int4(ld_i32_a2(p), ld_i32_a2(p + 4), ld_i32_a2(p + 8), ld_i32_a2(p + 12));
}

// The 6-bit scales and mins of sub-blocks 2u and 2u + 1 from the 12 scale bytes (s0, s1, s2).
// Sub-blocks 0..3 keep theirs in bytes 0..3 (scales) and 4..7 (mins); 4..7 keep their low four
// bits in the nibbles of bytes 8..11 and their top two bits in the top bits of bytes 0..7. Both
// cases are one expression with per-lane masks, so that a warp, whose lanes hold both, takes no
// divergent branch.
static __device__ __forceinline__ void k4_scales(int u, uint32_t s0, uint32_t s1, uint32_t s2, int& sc0, int& m0,
                                                 int& sc1, int& m1) {
    const int k = 16 * (u & 1);  // bit offset of byte 2u mod 4
    const bool late = u >= 2;
    const uint32_t low = late ? 0x0F0Fu : 0x3F3Fu, top = late ? 0x3030u : 0u;
    const uint32_t sc = (((late ? s2 : s0) >> k) & low) | ((s0 >> (k + 2)) & top);
    const uint32_t mn = (((late ? s2 >> 4 : s1) >> k) & low) | ((s1 >> (k + 2)) & top);
    sc0 = (int)(sc & 0xFF);
    sc1 = (int)(sc >> 8);
    m0 = (int)(mn & 0xFF);
    m1 = (int)(mn >> 8);
}

// Adds the low nibbles of 16 qs bytes times the activation words `lo` to slo and their high
// nibbles times `hi` to shi (16 times too large with RF_K4_HI16).
static __device__ __forceinline__ void k4_dot16(const int4& q, const int4& lo, const int4& hi, int& slo, int& shi) {
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        slo = dot4_i8(word(q, k) & 0x0F0F0F0F, word(lo, k), slo);
#if RF_K4_HI16
        shi = dot4_u8i8((uint32_t)word(q, k) & 0xF0F0F0F0u, word(hi, k), shi);
#else
        shi = dot4_i8((word(q, k) >> 4) & 0x0F0F0F0F, word(hi, k), shi);
#endif
    }
}

template <typename Act>
static __device__ __forceinline__ float k4_finish(const int4& hdr, int u, int slo, int shi, const Act& a) {
    int sc0, m0, sc1, m1;
    k4_scales(u, (uint32_t)hdr.y, (uint32_t)hdr.z, (uint32_t)hdr.w, sc0, m0, sc1, m1);
    return lo_f16((uint32_t)hdr.x) * ((float)(sc0 * slo) * a.d0 + (float)(sc1 * shi) * a.d1) -
           hi_f16((uint32_t)hdr.x) * ((float)m0 * a.s0 + (float)m1 * a.s1);
}

struct mv_q4_k {
    static constexpr int QK = QK_K, BYTES = Q4_K_BYTES, LPB = 8;
    static constexpr bool PIPE = false;  // see kernels/PERF.md (mat-vec)
    using Act = act_k4;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int c, Act& a) {
        load_act_k4<RF_K4_HI16>(y, b, c, a);
    }
    struct Raw {
        int4 hdr, q;
    };
    template <bool A16>
    static __device__ __forceinline__ Raw load(const uint8_t* blk, int c) {
        return Raw{ld_w128<A16>(blk), ld_w128<A16>(blk + 16 + 16 * c)};
    }
    static __device__ __forceinline__ float compute(const Raw& w, int c, const Act& a) {
        const int4 hdr = w.hdr, q = w.q;
        int slo = 0, shi = 0;
        k4_dot16(q, a.lo, a.hi, slo, shi);
        return k4_finish(hdr, c >> 1, slo, shi, a);
    }
};

// --- Q4_K with four lanes per block (the decode stack): lane c takes qs bytes [32c, 32c + 32),
// all of sub-block 2c (low nibbles) and 2c + 1 (high nibbles), against whole Q8_1 blocks 2c and
// 2c + 1. Half the lanes of mv_q4_k per block, so each scale pair is decoded once per 32 bytes
// instead of per 16, and the minimums need no masking by lane. Its Q8_1 input is the stack's,
// 16-byte pieces permuted by act_swz.

struct act_k4w {
    int4 lo[2], hi[2];
    float d0, s0, d1, s1;
};

static __device__ __forceinline__ void load_act_k4w(q8_vec y, int b, int c, act_k4w& a) {
    const int u = 16 * b + 4 * c;
    a.lo[0] = ld_act_piece<true>(y, u);
    a.lo[1] = ld_act_piece<true>(y, u + 1);
    a.hi[0] = ld_act_piece<true>(y, u + 2);
    a.hi[1] = ld_act_piece<true>(y, u + 3);
    const uint2 ds = *reinterpret_cast<const uint2*>(y.ds + 4 * (8 * b + 2 * c));
    a.d0 = lo_f16(ds.x);
    a.d1 = RF_K4_HI16 ? lo_f16(ds.y) * 0.0625f : lo_f16(ds.y);
    a.s0 = hi_f16(ds.x);
    a.s1 = hi_f16(ds.y);
}

struct mv_q4_kw {
    static constexpr int LPB = 4;
    using Act = act_k4w;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int c, Act& a) { load_act_k4w(y, b, c, a); }
    struct Raw {
        int4 hdr, q[2];
    };
    // `blk` 16-byte aligned.
    static __device__ __forceinline__ Raw load(const uint8_t* blk, int c) {
        return Raw{ld_b128(blk), {ld_b128(blk + 16 + 32 * c), ld_b128(blk + 32 + 32 * c)}};
    }
    static __device__ __forceinline__ float compute(const Raw& w, int c, const Act& a) {
        int slo = 0, shi = 0;
        k4_dot16(w.q[0], a.lo[0], a.hi[0], slo, shi);
        k4_dot16(w.q[1], a.lo[1], a.hi[1], slo, shi);
        return k4_finish(w.hdr, c, slo, shi, a);
    }
};
