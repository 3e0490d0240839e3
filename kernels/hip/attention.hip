// Attention over a KV cache: softmax(q k^T * scale + causal/sliding-window mask) v without
// materializing the score matrix, with grouped-query heads sharing K/V tiles.
//
// Rounding follows llama.cpp's KQ and KQV matrix products (and our CPU op): with an f16 cache
// the queries are rounded to f16 before q k^T, and the normalized probabilities are rounded to
// f16 before they weight V. Rounding normalized probabilities needs the row's final max and sum
// first, so each row takes two passes over its keys: scores only (running max and sum), then
// scores again with the probabilities that weight V.
//
// Grid: x = tiles of query rows, y = KV heads, z = splits of the KV range. The query rows of a KV
// head are (token, head-in-group) pairs; each warp owns one row, while the block stages K/V
// tiles in shared memory once for all its rows. Prefill uses many row tiles and one split
// (`phase` 0: both passes in one launch). Decode has one row tile per KV head and splits the KV
// range across blocks: `phase` 1 writes each split's (max, sum), `phase` 2 merges them into the
// row's totals and writes each split's share of the output, and `attn_combine_f32` adds the
// shares.
#include "common.h"

#define ATTN_DMAX 256
#define ATTN_TK 16
#define ATTN_DPL ((ATTN_DMAX + RF_WARP - 1) / RF_WARP)

struct attn_params {
    int n_tokens;      // query tokens
    int n_heads;       // query heads
    int n_kv_heads;    // KV heads (n_heads is a multiple)
    int head_dim;      // <= ATTN_DMAX
    int n_kv;          // valid cache positions (0..n_kv-1)
    int causal;        // 1: key p is seen by query token t only when p <= pos[t]
    int window;        // sliding window (0: none): key p is seen by query t iff pos[t] - p < window
    int split_len;     // KV positions per split (grid.z splits)
    long long q_tok_stride, q_head_stride;
    long long k_pos_stride, k_head_stride;
    long long v_pos_stride, v_head_stride;
    long long o_tok_stride, o_head_stride;
    float scale;
    int phase;         // 0: whole range; split-K: 1 = per-split max and sum, 2 = per-split output
};

// A ggml Q8_0 block: f16 scale and 32 signed bytes. A Q8_0 cache is addressed in blocks (its
// strides count blocks; a row pointer plus a value index `i` reads value i % 32 of block i / 32),
// which works because head sizes are whole blocks.
struct blk_q8_0 {
    unsigned short d;
    signed char qs[32];
};
static_assert(sizeof(blk_q8_0) == 34, "ggml's Q8_0 block is 34 bytes");

template <typename KV>
static __device__ __forceinline__ float ld_kv(const KV* p, long long i);
template <>
__device__ __forceinline__ float ld_kv<float>(const float* p, long long i) { return p[i]; }
template <>
__device__ __forceinline__ float ld_kv<__half>(const __half* p, long long i) { return __half2float(p[i]); }
template <>
__device__ __forceinline__ float ld_kv<blk_q8_0>(const blk_q8_0* p, long long i) {
    const blk_q8_0* b = p + (i >> 5);
    return __half2float(__ushort_as_half(b->d)) * (float)b->qs[i & 31];
}

// A value rounded to the cache's precision (what the CPU converts q and probabilities to).
template <typename KV>
static __device__ __forceinline__ float round_kv(float x);
template <>
__device__ __forceinline__ float round_kv<float>(float x) { return x; }
template <>
__device__ __forceinline__ float round_kv<__half>(float x) { return __half2float(__float2half(x)); }
// Against a Q8_0 cache queries and probabilities stay f32 (as the CPU op keeps them).
template <>
__device__ __forceinline__ float round_kv<blk_q8_0>(float x) { return x; }

// Attention sinks (gpt-oss): head `head`'s logit joins its row's softmax as one more key with no
// value, as ggml's soft_max with sinks, i.e. it enters the row's max and sum only (so it just takes
// probability away from the real keys). Applied to a row's final (max, sum); no-op without sinks.
static __device__ __forceinline__ void add_sink(const float* __restrict__ sinks, int head, float& m, float& l) {
    if (!sinks) return;
    const float sk = sinks[head];
    const float mn = fmaxf(m, sk);
    l = (m == -INFINITY ? 0.0f : l * expf(m - mn)) + expf(sk - mn);
    m = mn;
}

// `part` (split-K only): per split and row (token * n_heads + head): [m, l, out[head_dim]].
template <typename KV>
static __device__ __forceinline__ void attn_impl(const float* __restrict__ q, const KV* __restrict__ k,
                                                 const KV* __restrict__ v, const int* __restrict__ pos,
                                                 float* __restrict__ out,
                                                 float* __restrict__ part, const float* __restrict__ sinks,
                                                 const attn_params p) {
    __shared__ float ks[ATTN_TK * ATTN_DMAX];
    __shared__ float vs[ATTN_TK * ATTN_DMAX];
    const int D = p.head_dim;
    const int gqa = p.n_heads / p.n_kv_heads;
    const int kvh = blockIdx.y;
    const int nwarps = blockDim.x / RF_WARP;
    const int warp = threadIdx.x / RF_WARP, lane = threadIdx.x % RF_WARP;
    const int rows = p.n_tokens * gqa;
    const int row0 = blockIdx.x * nwarps;
    const int row = row0 + warp;
    const bool active = row < rows;
    const int tok = active ? row / gqa : 0;
    const int head = kvh * gqa + (active ? row % gqa : 0);
    const int qpos = pos[tok];
    const long long nrows = (long long)p.n_tokens * p.n_heads;
    const long long grow = (long long)tok * p.n_heads + head;

    // KV range of this split, narrowed to what the block's rows can see.
    const int last_row = min(row0 + nwarps, rows) - 1;
    const int first_tok = row0 / gqa, last_tok = last_row / gqa;
    int pmin = pos[first_tok], pmax = pmin;
    for (int t = first_tok + 1; t <= last_tok; ++t) {
        pmin = min(pmin, pos[t]);
        pmax = max(pmax, pos[t]);
    }
    int lo = blockIdx.z * p.split_len;
    int hi = min(lo + p.split_len, p.n_kv);
    if (p.causal) hi = min(hi, pmax + 1);
    if (p.window > 0) lo = max(lo, pmin - p.window + 1);
    // This row's own range.
    const int r_hi = p.causal ? min(qpos + 1, p.n_kv) : p.n_kv;
    const int r_lo = p.window > 0 ? max(0, qpos - p.window + 1) : 0;

    float qr[ATTN_DPL], acc[ATTN_DPL];
    const float* qp = q + (long long)tok * p.q_tok_stride + (long long)head * p.q_head_stride;
#pragma unroll
    for (int j = 0; j < ATTN_DPL; ++j) {
        const int d = lane + j * RF_WARP;
        qr[j] = (active && d < D) ? round_kv<KV>(qp[d]) : 0.0f;
        acc[j] = 0.0f;
    }
    const KV* kb = k + (long long)kvh * p.k_head_stride;
    const KV* vb = v + (long long)kvh * p.v_head_stride;

    // Pass 1: the row's max and sum of exp(score - max) over this block's keys.
    float m = -INFINITY, l = 0.0f;
    if (p.phase != 2) {
        for (int t0 = lo; t0 < hi; t0 += ATTN_TK) {
            const int tn = min(ATTN_TK, hi - t0);
            __syncthreads();
            for (int i = threadIdx.x; i < tn * D; i += blockDim.x) {
                const int pp = i / D, d = i % D;
                ks[pp * ATTN_DMAX + d] = ld_kv(kb + (long long)(t0 + pp) * p.k_pos_stride, d);
            }
            __syncthreads();
            if (!active) continue;
            const int a = max(t0, r_lo), e = min(t0 + tn, r_hi);
            for (int ps = a; ps < e; ++ps) {
                const float* kr = ks + (ps - t0) * ATTN_DMAX;
                float s = 0.0f;
#pragma unroll
                for (int j = 0; j < ATTN_DPL; ++j) {
                    const int d = lane + j * RF_WARP;
                    if (d < D) s += qr[j] * kr[d];
                }
                s = p.scale * warp_sum(s);
                const float mn = fmaxf(m, s);
                l = l * expf(m - mn) + expf(s - mn);  // exp(-inf) = 0 on the first key
                m = mn;
            }
        }
    }
    if (p.phase == 1) {
        if (active && lane == 0) {
            float* pp = part + ((long long)blockIdx.z * nrows + grow) * (D + 2);
            pp[0] = m;
            pp[1] = l;
        }
        return;
    }
    if (p.phase == 2 && active) {
        // The row's totals from every split's (max, sum).
        for (int s = 0; s < (int)gridDim.z; ++s) m = fmaxf(m, part[((long long)s * nrows + grow) * (D + 2)]);
        for (int s = 0; s < (int)gridDim.z; ++s) {
            const float* pp = part + ((long long)s * nrows + grow) * (D + 2);
            if (pp[0] != -INFINITY) l += pp[1] * expf(pp[0] - m);
        }
    }
    if (active) add_sink(sinks, head, m, l);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;

    // Pass 2: probabilities, normalized and rounded, weight the V rows.
    for (int t0 = lo; t0 < hi; t0 += ATTN_TK) {
        const int tn = min(ATTN_TK, hi - t0);
        __syncthreads();
        for (int i = threadIdx.x; i < tn * D; i += blockDim.x) {
            const int pp = i / D, d = i % D;
            ks[pp * ATTN_DMAX + d] = ld_kv(kb + (long long)(t0 + pp) * p.k_pos_stride, d);
            vs[pp * ATTN_DMAX + d] = ld_kv(vb + (long long)(t0 + pp) * p.v_pos_stride, d);
        }
        __syncthreads();
        if (!active) continue;
        const int a = max(t0, r_lo), e = min(t0 + tn, r_hi);
        for (int ps = a; ps < e; ++ps) {
            const float* kr = ks + (ps - t0) * ATTN_DMAX;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < ATTN_DPL; ++j) {
                const int d = lane + j * RF_WARP;
                if (d < D) s += qr[j] * kr[d];
            }
            s = p.scale * warp_sum(s);
            const float w = round_kv<KV>(expf(s - m) * inv);
            const float* vr = vs + (ps - t0) * ATTN_DMAX;
#pragma unroll
            for (int j = 0; j < ATTN_DPL; ++j) {
                const int d = lane + j * RF_WARP;
                if (d < D) acc[j] += w * vr[d];
            }
        }
    }
    if (!active) return;
    float* op = p.phase == 0
                    ? out + (long long)tok * p.o_tok_stride + (long long)head * p.o_head_stride
                    : part + ((long long)blockIdx.z * nrows + grow) * (D + 2) + 2;
#pragma unroll
    for (int j = 0; j < ATTN_DPL; ++j) {
        const int d = lane + j * RF_WARP;
        if (d < D) op[d] = acc[j];
    }
}

// `sinks` (null: none) holds one logit per query head (see add_sink).
RF_KERNEL void attn_f16(const float* q, const __half* k, const __half* v, const int* pos, float* out,
                        float* part, const float* sinks, attn_params p) {
    rf_entry();
    attn_impl<__half>(q, k, v, pos, out, part, sinks, p);
}

RF_KERNEL void attn_f32(const float* q, const float* k, const float* v, const int* pos, float* out,
                        float* part, const float* sinks, attn_params p) {
    rf_entry();
    attn_impl<float>(q, k, v, pos, out, part, sinks, p);
}

// Q8_0 cache (strides in blocks): the rows are dequantized into the shared tiles.
RF_KERNEL void attn_q8_0(const float* q, const blk_q8_0* k, const blk_q8_0* v, const int* pos, float* out,
                         float* part, const float* sinks, attn_params p) {
    rf_entry();
    attn_impl<blk_q8_0>(q, k, v, pos, out, part, sinks, p);
}

// ---------------------------------------------------------------------------------------------
// Few-token attention (decode): one block per (query head, query token) over the whole visible
// KV range in one launch. Lanes work in groups of G, one key per group: each lane loads VEC
// cache values at once (16 bytes), the group sums its partial dot products. The scaled scores stay
// in shared memory, so the row's max and sum are known before the probabilities are normalized,
// rounded (as above) and applied to V, where each thread owns VEC output dims of one key subset
// and the subsets are summed through shared memory. Needs head_dim and every cache stride to be
// multiples of VEC, 16-byte aligned caches and at most ATTN_DEC_MAX_KV visible keys (the host
// checks; other shapes take `attn_f16` / `attn_f32`).
// ---------------------------------------------------------------------------------------------
#define ATTN_DEC_MAX_KV 4096
// 512 threads: up to 128 keys per step at head_dim 128 (faster than 256 at tg128).
#define ATTN_DEC_THREADS 512
#define ATTN_DEC_BOUND RF_AMD_BOUNDS(ATTN_DEC_THREADS)
#define ATTN_DEC_KU 4

template <typename KV>
struct kv_vec;
template <>
struct kv_vec<__half> {
    static constexpr int VEC = 8;
    static __device__ __forceinline__ void unpack(const int4& v, float* o) {
        const __half2* h = reinterpret_cast<const __half2*>(&v);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(h[i]);
            o[2 * i] = f.x;
            o[2 * i + 1] = f.y;
        }
    }
    static __device__ __forceinline__ void load(const __half* p, float* o) {
        unpack(*reinterpret_cast<const int4*>(p), o);
    }
};
template <>
struct kv_vec<float> {
    static constexpr int VEC = 4;
    static __device__ __forceinline__ void unpack(const int4& v, float* o) {
        o[0] = __int_as_float(v.x);
        o[1] = __int_as_float(v.y);
        o[2] = __int_as_float(v.z);
        o[3] = __int_as_float(v.w);
    }
    static __device__ __forceinline__ void load(const float* p, float* o) {
        unpack(*reinterpret_cast<const int4*>(p), o);
    }
};

// Keys per score group that `attn_dec_one_pass` holds in registers.
#define ATTN_DEC_FK 8

// attn_dec when the visible keys fit one pass: each lane owns exactly one chunk of VEC dims
// (chunks == G) and each group at most ATTN_DEC_FK keys, so the query, key and value loads all go
// out together right after the wait (one memory latency instead of three in a row), and the
// block exchanges data twice: the warps' (max, sum) pairs for the softmax, then their partial
// outputs. The roundings are attn_dec_impl's (f16 queries; normalized probabilities rounded
// before they weight V); only the order in which the softmax sum is added up differs. `ml` holds
// 2 * NT / RF_WARP floats and `red` NT / RF_WARP * head_dim.
template <typename KV>
static __device__ __forceinline__ void attn_dec_one_pass(const float* __restrict__ qp, const KV* __restrict__ kb,
                                                         const KV* __restrict__ vb, int lo, int n, int G,
                                                         const attn_params& p, float* __restrict__ op,
                                                         uint8_t* __restrict__ y8,
                                                         const float* __restrict__ sinks, int head, int tok,
                                                         float* ml, float* red) {
    constexpr int VEC = kv_vec<KV>::VEC;
    constexpr int NT = ATTN_DEC_THREADS;
    constexpr int NW = NT / RF_WARP;
    const int D = p.head_dim;
    const int lane = threadIdx.x % RF_WARP, wid = threadIdx.x / RF_WARP;
    const int c = lane % G;
    const int group = threadIdx.x / G, ngroups = NT / G;
    float qv[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) qv[i] = round_kv<KV>(qp[c * VEC + i]);
    int4 kr[ATTN_DEC_FK], vr[ATTN_DEC_FK];
#pragma unroll
    for (int u = 0; u < ATTN_DEC_FK; ++u) {
        const int j = group + u * ngroups;
        kr[u] = vr[u] = make_int4(0, 0, 0, 0);
        if (j < n) {
            kr[u] = *reinterpret_cast<const int4*>(kb + (long long)(lo + j) * p.k_pos_stride + c * VEC);
            vr[u] = *reinterpret_cast<const int4*>(vb + (long long)(lo + j) * p.v_pos_stride + c * VEC);
        }
    }
    // Scores (the group's lanes all end with the sum), the warp's max and its sum of exponentials.
    float s[ATTN_DEC_FK];
    float m = -INFINITY;
#pragma unroll
    for (int u = 0; u < ATTN_DEC_FK; ++u) {
        float kf[VEC];
        kv_vec<KV>::unpack(kr[u], kf);
        float a = 0.0f;
#pragma unroll
        for (int i = 0; i < VEC; ++i) a += qv[i] * kf[i];
        for (int o = G / 2; o > 0; o >>= 1) a += rf_shfl_xor(a, o);
        s[u] = group + u * ngroups < n ? a * p.scale : -INFINITY;
        m = fmaxf(m, s[u]);
    }
    for (int o = RF_WARP / 2; o >= G; o >>= 1) m = fmaxf(m, rf_shfl_xor(m, o));
    float l = 0.0f;
#pragma unroll
    for (int u = 0; u < ATTN_DEC_FK; ++u)
        if (s[u] != -INFINITY) l += expf(s[u] - m);
    for (int o = RF_WARP / 2; o >= G; o >>= 1) l += rf_shfl_xor(l, o);
    if (lane == 0) {
        ml[2 * wid] = m;
        ml[2 * wid + 1] = l;
    }
    __syncthreads();
    float M = -INFINITY, L = 0.0f;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, ml[2 * w]);
#pragma unroll
    for (int w = 0; w < NW; ++w)
        if (ml[2 * w] != -INFINITY) L += ml[2 * w + 1] * expf(ml[2 * w] - M);
    add_sink(sinks, head, M, L);
    const float inv = L > 0.0f ? 1.0f / L : 0.0f;
    // Probability-weighted values: the lane's dims over its keys, then over the warp's groups.
    float acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
#pragma unroll
    for (int u = 0; u < ATTN_DEC_FK; ++u) {
        if (s[u] == -INFINITY) continue;
        const float w = round_kv<KV>(expf(s[u] - M) * inv);
        float vf[VEC];
        kv_vec<KV>::unpack(vr[u], vf);
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc[i] += w * vf[i];
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i)
        for (int o = RF_WARP / 2; o >= G; o >>= 1) acc[i] += rf_shfl_xor(acc[i], o);
    if (lane < G)
#pragma unroll
        for (int i = 0; i < VEC; ++i) red[wid * D + c * VEC + i] = acc[i];
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += NT) {
        float a = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) a += red[w * D + d];
        op[d] = a;
        if (y8) {
            const int ncols = p.n_heads * D;
            q8_1_put(a, y8 + (size_t)tok * q8_vec_bytes(ncols), ncols, head * D + d);
        }
    }
}

// `y8` non-null: the output (dense, o_head_stride == head_dim, head_dim a multiple of 32) also
// goes out quantized for the decode mat-vecs, as `quantize_q8_1` would make it of each token's
// n_heads * head_dim values. `sinks` (null: none) holds one logit per query head (see add_sink).
template <typename KV>
static __device__ __forceinline__ void attn_dec_impl(const float* __restrict__ q, const KV* __restrict__ k,
                                                     const KV* __restrict__ v, const int* __restrict__ pos,
                                                     float* __restrict__ out, uint8_t* __restrict__ y8,
                                                     const float* __restrict__ sinks, const attn_params p) {
    constexpr int VEC = kv_vec<KV>::VEC;
    constexpr int NT = ATTN_DEC_THREADS;
    __shared__ float sc[ATTN_DEC_MAX_KV];
    __shared__ float red[NT * 8];  // PV partial sums (at most NT * VEC floats), reductions
    const int head = blockIdx.x, tok = blockIdx.y;
    const int D = p.head_dim, chunks = D / VEC;
    const int kvh = head / (p.n_heads / p.n_kv_heads);
    const int qpos = pos[tok];
    const int hi = p.causal ? min(qpos + 1, p.n_kv) : p.n_kv;
    const int lo = p.window > 0 ? max(0, qpos - p.window + 1) : 0;
    const int n = max(hi - lo, 0);
    const float* qp = q + (long long)tok * p.q_tok_stride + (long long)head * p.q_head_stride;

    // Scores: groups of G lanes (a power of two, at most a warp), one key per group. G is more
    // than half of min(chunks, warp), so a lane owns at most two chunks of the query and holds
    // them in registers: their loads go out with the first keys' (no shared-memory round trip).
    int G = 1;
    while (G * 2 <= chunks && G < RF_WARP) G *= 2;
    const int lane = threadIdx.x % RF_WARP;
    const int gl = lane % G;
    const int group = threadIdx.x / G, ngroups = NT / G;
    const KV* kb = k + (long long)kvh * p.k_head_stride;
    const KV* vb = v + (long long)kvh * p.v_head_stride;
    if (chunks == G && n <= ngroups * ATTN_DEC_FK) {
        float* op = out + (long long)tok * p.o_tok_stride + (long long)head * p.o_head_stride;
        attn_dec_one_pass<KV>(qp, kb, vb, lo, n, G, p, op, y8, sinks, head, tok, sc, red);
        return;
    }
    float qv[2][VEC];
#pragma unroll
    for (int cc = 0; cc < 2; ++cc) {
        const int c = gl + cc * G;
#pragma unroll
        for (int i = 0; i < VEC; ++i) qv[cc][i] = c < chunks ? round_kv<KV>(qp[c * VEC + i]) : 0.0f;
    }
    // ATTN_DEC_KU keys per group and step, their loads issued before the first product.
    float mx = -INFINITY;
    for (int j0 = 0; j0 < n; j0 += ngroups * ATTN_DEC_KU) {
        float s[ATTN_DEC_KU];
#pragma unroll
        for (int u = 0; u < ATTN_DEC_KU; ++u) s[u] = 0.0f;
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
            const int c = gl + cc * G;
            if (c >= chunks) break;
            float kf[ATTN_DEC_KU][VEC];
#pragma unroll
            for (int u = 0; u < ATTN_DEC_KU; ++u) {
                const int j = j0 + u * ngroups + group;
                if (j < n) {
                    kv_vec<KV>::load(kb + (long long)(lo + j) * p.k_pos_stride + c * VEC, kf[u]);
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) kf[u][i] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < ATTN_DEC_KU; ++u)
#pragma unroll
                for (int i = 0; i < VEC; ++i) s[u] += qv[cc][i] * kf[u][i];
        }
#pragma unroll
        for (int u = 0; u < ATTN_DEC_KU; ++u) {
            // Group sum (the whole warp takes part; xor partners stay inside a group).
            for (int m = G / 2; m > 0; m >>= 1) s[u] += rf_shfl_xor(s[u], m);
            const int j = j0 + u * ngroups + group;
            if (j < n) {
                const float v = s[u] * p.scale;
                if (gl == 0) sc[j] = v;
                mx = fmaxf(mx, v);
            }
        }
    }
    mx = block_max(mx, red);
    float l = 0.0f;
    __syncthreads();  // scores written by other groups
    if (mx != -INFINITY)
        for (int j = threadIdx.x; j < n; j += NT) l += expf(sc[j] - mx);
    __syncthreads();  // `red` reused by block_sum
    l = block_sum(l, red);
    // Every thread holds the row's max and sum: the sink joins them alike.
    add_sink(sinks, head, mx, l);
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (int j = threadIdx.x; j < n; j += NT) sc[j] = round_kv<KV>(expf(sc[j] - mx) * inv);
    __syncthreads();

    // Output: thread t owns dims [VEC * (t % chunks), +VEC) for keys t / chunks + i * kgroups.
    const int kgroups = NT / chunks;
    const int c = threadIdx.x % chunks, kg = threadIdx.x / chunks;
    float acc[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
    if (kg < kgroups) {
        for (int j = kg; j < n; j += kgroups * ATTN_DEC_KU) {
            float w[ATTN_DEC_KU], vf[ATTN_DEC_KU][VEC];
#pragma unroll
            for (int u = 0; u < ATTN_DEC_KU; ++u) {
                const int jj = j + u * kgroups;
                w[u] = jj < n ? sc[jj] : 0.0f;
                if (jj < n) {
                    kv_vec<KV>::load(vb + (long long)(lo + jj) * p.v_pos_stride + c * VEC, vf[u]);
                } else {
#pragma unroll
                    for (int i = 0; i < VEC; ++i) vf[u][i] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < ATTN_DEC_KU; ++u)
#pragma unroll
                for (int i = 0; i < VEC; ++i) acc[i] += w[u] * vf[u][i];
        }
    }
    __syncthreads();
    if (kg < kgroups)
#pragma unroll
        for (int i = 0; i < VEC; ++i) red[kg * D + c * VEC + i] = acc[i];
    __syncthreads();
    float* op = out + (long long)tok * p.o_tok_stride + (long long)head * p.o_head_stride;
    for (int d = threadIdx.x; d < D; d += NT) {
        float a = 0.0f;
        for (int g = 0; g < kgroups; ++g) a += red[g * D + d];
        op[d] = a;
        if (y8) {
            // 32-lane groups hold 32 consecutive values (D <= NT, D a multiple of 32).
            const int ncols = p.n_heads * D;
            q8_1_put(a, y8 + (size_t)tok * q8_vec_bytes(ncols), ncols, head * D + d);
        }
    }
}

// Kernel entry of the decode attention: ask for the cache rows this block reads (its KV head's
// keys and values over the visible range) to be brought into L2, then rf_entry(). A prefetch
// only moves data toward the cache that every write also goes through, so it is safe while the
// kernel before is still writing this step's rows; `pos` may not be final yet either (it only
// steers prefetches, clamped to the cache), the real reads come after the wait. Variants
// measured on par or slower and dropped (a later launch of the next kernel, the rope folded in,
// a block cluster per head, other block sizes) are in kernels/PERF.md.
template <typename KV>
static __device__ __forceinline__ void attn_dec_entry(const KV* k, const KV* v, const int* pos,
                                                      const attn_params p) {
    const int qpos = min(max(pos[blockIdx.y], 0), max(p.n_kv - 1, 0));
    const int hi = p.causal ? min(qpos + 1, p.n_kv) : p.n_kv;
    const int lo = p.window > 0 ? max(0, qpos - p.window + 1) : 0;
    const int kvh = blockIdx.x / (p.n_heads / p.n_kv_heads);
    const int lines = (p.head_dim * (int)sizeof(KV) + 127) / 128;
    for (int i = threadIdx.x; i < (hi - lo) * lines; i += ATTN_DEC_THREADS) {
        const long long o = (long long)(i % lines) * (128 / (int)sizeof(KV));
        const long long j = lo + i / lines;
        rf_prefetch_l2(k + (long long)kvh * p.k_head_stride + j * p.k_pos_stride + o);
        rf_prefetch_l2(v + (long long)kvh * p.v_head_stride + j * p.v_pos_stride + o);
    }
    rf_entry();
}

RF_KERNEL void ATTN_DEC_BOUND attn_dec_f16(const float* q, const __half* k, const __half* v, const int* pos, float* out,
                            uint8_t* y8, const float* sinks, attn_params p) {
    attn_dec_entry<__half>(k, v, pos, p);
    attn_dec_impl<__half>(q, k, v, pos, out, y8, sinks, p);
}

RF_KERNEL void ATTN_DEC_BOUND attn_dec_f32(const float* q, const float* k, const float* v, const int* pos, float* out,
                            uint8_t* y8, const float* sinks, attn_params p) {
    attn_dec_entry<float>(k, v, pos, p);
    attn_dec_impl<float>(q, k, v, pos, out, y8, sinks, p);
}

// Adds the `n_splits` shares of each row's output (phase 2's results, already normalized by the
// row's totals): one block per row (token * n_heads + head).
RF_KERNEL void attn_combine_f32(const float* __restrict__ part, float* __restrict__ out, int n_splits,
                                int n_heads, int n_rows, int head_dim, long long o_tok_stride,
                                long long o_head_stride) {
    rf_entry();
    const long long grow = blockIdx.x;
    const int tok = (int)(grow / n_heads), head = (int)(grow % n_heads);
    const long long ps = (long long)head_dim + 2;
    float* op = out + (long long)tok * o_tok_stride + (long long)head * o_head_stride;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int s = 0; s < n_splits; ++s) a += part[((long long)s * n_rows + grow) * ps + 2 + d];
        op[d] = a;
    }
}

// ---------------------------------------------------------------------------------------------
// Prefill through GEMMs (tensor cores where the BLAS has them), for an f16 cache: queries to f16
// (`attn_q_f16`), scores = K^T q per KV head (batched GEMM, f32 out), masked softmax to f16
// probabilities (`attn_softmax_f16`), output = V P per KV head (batched GEMM). The roundings are
// the ones above: f16 queries, probabilities normalized then rounded to f16.
// ---------------------------------------------------------------------------------------------

// q [token][head][d] (strided, f32) -> qh [head-in-group][kv head][token][d] (dense, f16), so
// that for one head-in-group the rows of every KV head form one batched GEMM operand.
RF_KERNEL void attn_q_f16(const float* __restrict__ q, __half* __restrict__ qh, int n_tokens, int n_heads,
                          int n_kv_heads, int head_dim, long long q_tok_stride, long long q_head_stride) {
    rf_entry();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n = (long long)n_tokens * n_heads * head_dim;
    if (i >= n) return;
    const int gqa = n_heads / n_kv_heads;
    const int d = (int)(i % head_dim);
    const long long r = i / head_dim;  // (g * n_kv_heads + kvh) * n_tokens + tok
    const int tok = (int)(r % n_tokens);
    const int gk = (int)(r / n_tokens);
    const int kvh = gk % n_kv_heads, g = gk / n_kv_heads;
    const int head = kvh * gqa + g;
    qh[i] = __float2half(q[(long long)tok * q_tok_stride + (long long)head * q_head_stride + d]);
}

// One block per (query token of the chunk, KV head): scores s[kvh][tok][n_kv] (already scaled)
// -> probabilities p (same layout, f16), zero where the causal mask or the window hides a key.
// Query token `tok` of the chunk is token `tok0 + tok` of the batch (its position is pos[...]).
// The rows are those of head-in-group `g` of `gqa`; `sinks` (null: none) holds one logit per
// query head (see add_sink).
RF_KERNEL void attn_softmax_f16(const float* __restrict__ s, __half* __restrict__ p, const int* __restrict__ pos,
                                int n_kv, int n_rows, int tok0, int causal, int window,
                                const float* __restrict__ sinks, int gqa, int g) {
    rf_entry();
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const long long base = ((long long)blockIdx.y * n_rows + blockIdx.x) * n_kv;
    const float* sr = s + base;
    __half* pr = p + base;
    const int qpos = pos[tok0 + blockIdx.x];
    const int hi = causal ? min(qpos + 1, n_kv) : n_kv;
    const int lo = window > 0 ? max(0, qpos - window + 1) : 0;
    float mx = -INFINITY;
    for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) mx = fmaxf(mx, sr[j]);
    mx = block_max(mx, scratch);
    float sum = 0.0f;
    if (mx != -INFINITY)
        for (int j = lo + threadIdx.x; j < hi; j += blockDim.x) sum += expf(sr[j] - mx);
    sum = block_sum(sum, scratch);
    // A row with no visible key keeps zeros (its -inf max marks it) whatever its sink.
    const bool any = mx != -INFINITY;
    if (any) add_sink(sinks, blockIdx.y * gqa + g, mx, sum);
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = threadIdx.x; j < n_kv; j += blockDim.x)
        pr[j] = __float2half(j >= lo && j < hi && any ? expf(sr[j] - mx) * inv : 0.0f);
}

// ---------------------------------------------------------------------------------------------
// Paged attention (continuous batching): every query token attends over its own sequence's
// positions, read from a pool of KV blocks through the sequence's block table: position `j` of
// the sequence in column `seq[2 t]` of `tables` sits in pool row `tables[col][j / block_size] *
// block_size + j % block_size`. Always causal; the window applies as in attn_impl. One block per
// (query token, KV head); each warp takes query heads of the group in turn and makes attn_impl's
// two passes over the keys (the row's exact max and sum, then probabilities normalized and
// rounded to the cache type weighting V), so the roundings are those of the contiguous kernels
// and of the CPU op. `p.n_kv` is the pool's row count and `p.split_len` the tables' column
// count: a token whose column or position lies outside the tables gets zeros, and a table entry
// outside the pool hides its keys, so no input makes the kernel read outside its buffers.
// ---------------------------------------------------------------------------------------------
template <typename KV>
static __device__ __forceinline__ void paged_impl(const float* __restrict__ q, const KV* __restrict__ k,
                                                  const KV* __restrict__ v, const int* __restrict__ pos,
                                                  const int* __restrict__ seq, const int* __restrict__ tables,
                                                  float* __restrict__ out, const float* __restrict__ sinks,
                                                  const int block_size, const int max_blocks,
                                                  const attn_params p) {
    const int tok = blockIdx.x, kvh = blockIdx.y;
    const int D = p.head_dim;
    const int gqa = p.n_heads / p.n_kv_heads;
    const int nwarps = blockDim.x / RF_WARP;
    const int warp = threadIdx.x / RF_WARP, lane = threadIdx.x % RF_WARP;
    const int qpos = pos[tok];
    const int col = seq[2 * tok];
    const int n_blocks = p.n_kv / block_size;
    if (col < 0 || col >= p.split_len || qpos < 0 || qpos / block_size >= max_blocks) {
        for (int i = threadIdx.x; i < gqa * D; i += blockDim.x) {
            const int head = kvh * gqa + i / D;
            out[(long long)tok * p.o_tok_stride + (long long)head * p.o_head_stride + i % D] = 0.0f;
        }
        return;
    }
    const int* table = tables + (long long)col * max_blocks;
    const int hi = qpos + 1;
    const int lo = p.window > 0 ? max(0, qpos - p.window + 1) : 0;
    const KV* kb = k + (long long)kvh * p.k_head_stride;
    const KV* vb = v + (long long)kvh * p.v_head_stride;
    for (int g = warp; g < gqa; g += nwarps) {
        const int head = kvh * gqa + g;
        const float* qp = q + (long long)tok * p.q_tok_stride + (long long)head * p.q_head_stride;
        float qr[ATTN_DPL], acc[ATTN_DPL];
#pragma unroll
        for (int j = 0; j < ATTN_DPL; ++j) {
            const int d = lane + j * RF_WARP;
            qr[j] = d < D ? round_kv<KV>(qp[d]) : 0.0f;
            acc[j] = 0.0f;
        }
        float m = -INFINITY, l = 0.0f;
        for (int ps = lo; ps < hi; ++ps) {
            const int blk = table[ps / block_size];
            if (blk < 0 || blk >= n_blocks) continue;
            const long long row = (long long)blk * block_size + ps % block_size;
            const KV* kr = kb + row * p.k_pos_stride;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < ATTN_DPL; ++j) {
                const int d = lane + j * RF_WARP;
                if (d < D) s += qr[j] * ld_kv(kr, d);
            }
            s = p.scale * warp_sum(s);
            const float mn = fmaxf(m, s);
            l = l * expf(m - mn) + expf(s - mn);
            m = mn;
        }
        add_sink(sinks, head, m, l);
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        for (int ps = lo; ps < hi; ++ps) {
            const int blk = table[ps / block_size];
            if (blk < 0 || blk >= n_blocks) continue;
            const long long row = (long long)blk * block_size + ps % block_size;
            const KV* kr = kb + row * p.k_pos_stride;
            const KV* vr = vb + row * p.v_pos_stride;
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < ATTN_DPL; ++j) {
                const int d = lane + j * RF_WARP;
                if (d < D) s += qr[j] * ld_kv(kr, d);
            }
            s = p.scale * warp_sum(s);
            const float w = round_kv<KV>(expf(s - m) * inv);
#pragma unroll
            for (int j = 0; j < ATTN_DPL; ++j) {
                const int d = lane + j * RF_WARP;
                if (d < D) acc[j] += w * ld_kv(vr, d);
            }
        }
        float* op = out + (long long)tok * p.o_tok_stride + (long long)head * p.o_head_stride;
#pragma unroll
        for (int j = 0; j < ATTN_DPL; ++j) {
            const int d = lane + j * RF_WARP;
            if (d < D) op[d] = acc[j];
        }
    }
}

RF_KERNEL void paged_attn_f16(const float* q, const __half* k, const __half* v, const int* pos, const int* seq,
                              const int* tables, float* out, const float* sinks, int block_size, int max_blocks,
                              attn_params p) {
    rf_entry();
    paged_impl<__half>(q, k, v, pos, seq, tables, out, sinks, block_size, max_blocks, p);
}

RF_KERNEL void paged_attn_f32(const float* q, const float* k, const float* v, const int* pos, const int* seq,
                              const int* tables, float* out, const float* sinks, int block_size, int max_blocks,
                              attn_params p) {
    rf_entry();
    paged_impl<float>(q, k, v, pos, seq, tables, out, sinks, block_size, max_blocks, p);
}

RF_KERNEL void paged_attn_q8_0(const float* q, const blk_q8_0* k, const blk_q8_0* v, const int* pos,
                               const int* seq, const int* tables, float* out, const float* sinks, int block_size,
                               int max_blocks, attn_params p) {
    rf_entry();
    paged_impl<blk_q8_0>(q, k, v, pos, seq, tables, out, sinks, block_size, max_blocks, p);
}

// ---------------------------------------------------------------------------------------------
// Paged attention, flash-decoding style: the path `paged_attn_*` above stays for shapes this one
// does not take (head dims whose 16-byte chunks are not a power of two, unaligned caches).
// Grid: x = query token, y = (KV head, group of up to HPB of its query heads), z = splits of the
// token's visible key range. Lanes work in groups of G, G * CPL 16-byte chunks being one key
// row; every group walks its share of the split's keys PD_KU at a time (all K and V loads of a
// step in flight together) with an online softmax kept for all the block's query heads, so each
// K/V row is loaded once for the whole GQA group. The groups' states merge through shuffles
// inside a warp and through shared memory across warps. With one split the block writes the
// output; with several, each writes its (max, sum, unnormalized output) to `part` and
// `paged_combine_f32` merges them; sinks (gpt-oss) join each row's max and sum where the row is
// finished (the one split's block, or the merge). The block table entries of a split are staged
// in shared memory once, PD_TBL at a time. Keys, masks and bounds are paged_impl's: always causal, the window as in
// attn_impl, a token whose column or position lies outside the tables gets zeros, a table entry
// outside the pool hides its keys. Rounding: queries are rounded to the cache type as above, but
// the probabilities weight V unrounded: one pass never knows the row's final sum before it
// weights V (GPU and CPU differ by about the f16 rounding of the probabilities).
// The K/V row load is one function (`pd_load`), so another cache type is one more specialization.
// ---------------------------------------------------------------------------------------------
#define PD_THREADS 128
#define PD_BOUND RF_AMD_BOUNDS(PD_THREADS)
#define PD_KU 4
#define PD_TBL 256

// One lane's chunks of a cache row: CPL pieces of VEC values, `c0 + i * G` for i < CPL (those
// past `chunks` read nothing).
template <typename KV, int CPL>
static __device__ __forceinline__ void pd_load(const KV* __restrict__ row, int c0, int G, int chunks, int4* r) {
    constexpr int VEC = kv_vec<KV>::VEC;
#pragma unroll
    for (int i = 0; i < CPL; ++i) {
        const int c = c0 + i * G;
        r[i] = c < chunks ? *reinterpret_cast<const int4*>(row + c * VEC) : make_int4(0, 0, 0, 0);
    }
}

// Merges a softmax state (m2, l2, acc2) into (m, l, acc); -inf maxima mean "no key yet".
static __device__ __forceinline__ void pd_merge_scales(float m, float m2, float& a1, float& a2, float& mm) {
    mm = fmaxf(m, m2);
    a1 = m == -INFINITY ? 0.0f : expf(m - mm);
    a2 = m2 == -INFINITY ? 0.0f : expf(m2 - mm);
}

template <typename KV, int HPB>
static __device__ __forceinline__ void paged_dec_impl(const float* __restrict__ q, const KV* __restrict__ k,
                                                      const KV* __restrict__ v, const int* __restrict__ pos,
                                                      const int* __restrict__ seq, const int* __restrict__ tables,
                                                      float* __restrict__ out, float* __restrict__ part,
                                                      const float* __restrict__ sinks,
                                                      const int block_size, const int max_blocks,
                                                      const int split_min, const attn_params p) {
    constexpr int VEC = kv_vec<KV>::VEC;
    constexpr int CPL = (ATTN_DMAX / VEC + RF_WARP - 1) / RF_WARP;
    constexpr int NT = PD_THREADS, NW = NT / RF_WARP;
    __shared__ float qs[HPB * ATTN_DMAX];
    __shared__ int tbl[PD_TBL];
    __shared__ float red[NW * HPB * (ATTN_DMAX + 2)];
    const int D = p.head_dim, chunks = D / VEC;
    const int gqa = p.n_heads / p.n_kv_heads;
    const int hgroups = (gqa + HPB - 1) / HPB;
    const int kvh = blockIdx.y / hgroups, h0 = (blockIdx.y % hgroups) * HPB;
    const int nh = min(HPB, gqa - h0);
    const int head0 = kvh * gqa + h0;
    const int tok = blockIdx.x;
    const int split = blockIdx.z, n_splits = gridDim.z;
    const long long nrows = (long long)p.n_tokens * p.n_heads;
    const int qpos = pos[tok];
    const int col = seq[2 * tok];
    // This block's keys [a, b): its split of the token's visible range.
    int a = 0, b = 0;
    if (col >= 0 && col < p.split_len && qpos >= 0 && qpos / block_size < max_blocks) {
        const int hi = qpos + 1;
        const int lo = p.window > 0 ? max(0, qpos - p.window + 1) : 0;
        const int len = max(split_min, (hi - lo + n_splits - 1) / n_splits);
        if ((long long)split * len < hi - lo) {
            a = lo + split * len;
            b = min(a + len, hi);
        }
    }
    if (a >= b) {
        for (int i = threadIdx.x; i < nh * D; i += NT) {
            const long long row = (long long)tok * p.n_heads + head0 + i / D;
            if (n_splits == 1) {
                out[(long long)tok * p.o_tok_stride + (long long)(head0 + i / D) * p.o_head_stride + i % D] = 0.0f;
            } else if (i % D == 0) {
                float* pp = part + ((long long)split * nrows + row) * (D + 2);
                pp[0] = -INFINITY;
                pp[1] = 0.0f;
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < HPB * D; i += NT) {
        const int h = i / D;
        qs[i] = h < nh ? round_kv<KV>(q[(long long)tok * p.q_tok_stride + (long long)(head0 + h) * p.q_head_stride + i % D])
                       : 0.0f;
    }
    const int G = min(chunks, RF_WARP);
    const int lane = threadIdx.x % RF_WARP, wid = threadIdx.x / RF_WARP;
    const int gl = lane % G, grp = threadIdx.x / G, ngrp = NT / G;
    const KV* kb = k + (long long)kvh * p.k_head_stride;
    const KV* vb = v + (long long)kvh * p.v_head_stride;
    const int n_pool = p.n_kv / block_size;

    float m[HPB], l[HPB], acc[HPB][CPL][VEC];
#pragma unroll
    for (int h = 0; h < HPB; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.0f;
#pragma unroll
        for (int i = 0; i < CPL; ++i)
#pragma unroll
            for (int e = 0; e < VEC; ++e) acc[h][i][e] = 0.0f;
    }
    const int last_blk = (b - 1) / block_size;
    for (int sb = a / block_size; sb <= last_blk; sb += PD_TBL) {
        __syncthreads();  // the previous stage's entries are read; first time: qs written
        for (int i = threadIdx.x; i < PD_TBL && sb + i <= last_blk; i += NT) {
            const int e = tables[(long long)col * max_blocks + sb + i];
            tbl[i] = e >= 0 && e < n_pool ? e : -1;
        }
        __syncthreads();
        const int s0 = max(a, sb * block_size);
        const int s1 = min(b, (sb + PD_TBL) * block_size);
        for (int t0 = s0; t0 < s1; t0 += ngrp * PD_KU) {
            int4 kr[PD_KU][CPL], vr[PD_KU][CPL];
            bool ok[PD_KU];
#pragma unroll
            for (int u = 0; u < PD_KU; ++u) {
                const int j = t0 + u * ngrp + grp;
                const int blk = j < s1 ? tbl[j / block_size - sb] : -1;
                ok[u] = blk >= 0;
                const long long row = (long long)blk * block_size + j % block_size;
                if (ok[u]) {
                    pd_load<KV, CPL>(kb + row * p.k_pos_stride, gl, G, chunks, kr[u]);
                    pd_load<KV, CPL>(vb + row * p.v_pos_stride, gl, G, chunks, vr[u]);
                } else {
#pragma unroll
                    for (int i = 0; i < CPL; ++i) kr[u][i] = vr[u][i] = make_int4(0, 0, 0, 0);
                }
            }
            float s[HPB][PD_KU];
#pragma unroll
            for (int h = 0; h < HPB; ++h)
#pragma unroll
                for (int u = 0; u < PD_KU; ++u) s[h][u] = 0.0f;
#pragma unroll
            for (int i = 0; i < CPL; ++i) {
                const int c = gl + i * G;
                if (c >= chunks) break;
                float kf[PD_KU][VEC];
#pragma unroll
                for (int u = 0; u < PD_KU; ++u) kv_vec<KV>::unpack(kr[u][i], kf[u]);
#pragma unroll
                for (int h = 0; h < HPB; ++h) {
                    if (h >= nh) break;
                    float qv[VEC];
#pragma unroll
                    for (int e = 0; e < VEC; ++e) qv[e] = qs[h * D + c * VEC + e];
#pragma unroll
                    for (int u = 0; u < PD_KU; ++u)
#pragma unroll
                        for (int e = 0; e < VEC; ++e) s[h][u] += qv[e] * kf[u][e];
                }
            }
            // Group sums (the whole warp takes part; xor partners stay inside a group).
#pragma unroll
            for (int h = 0; h < HPB; ++h)
#pragma unroll
                for (int u = 0; u < PD_KU; ++u) {
                    for (int o = G / 2; o > 0; o >>= 1) s[h][u] += rf_shfl_xor(s[h][u], o);
                    s[h][u] = ok[u] ? s[h][u] * p.scale : -INFINITY;
                }
            float vf[PD_KU][CPL][VEC];
#pragma unroll
            for (int u = 0; u < PD_KU; ++u)
#pragma unroll
                for (int i = 0; i < CPL; ++i) kv_vec<KV>::unpack(vr[u][i], vf[u][i]);
#pragma unroll
            for (int h = 0; h < HPB; ++h) {
                if (h >= nh) break;
                float mt = m[h];
#pragma unroll
                for (int u = 0; u < PD_KU; ++u) mt = fmaxf(mt, s[h][u]);
                if (mt == -INFINITY) continue;
                const float sc = m[h] == -INFINITY ? 0.0f : expf(m[h] - mt);
                l[h] *= sc;
#pragma unroll
                for (int i = 0; i < CPL; ++i)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[h][i][e] *= sc;
#pragma unroll
                for (int u = 0; u < PD_KU; ++u) {
                    if (s[h][u] == -INFINITY) continue;
                    const float w = expf(s[h][u] - mt);
                    l[h] += w;
#pragma unroll
                    for (int i = 0; i < CPL; ++i)
#pragma unroll
                        for (int e = 0; e < VEC; ++e) acc[h][i][e] += w * vf[u][i][e];
                }
                m[h] = mt;
            }
        }
    }
    // The warp's groups into its first group, then the warps through shared memory.
#pragma unroll
    for (int h = 0; h < HPB; ++h) {
        for (int o = G; o < RF_WARP; o <<= 1) {
            const float m2 = rf_shfl_xor(m[h], o), l2 = rf_shfl_xor(l[h], o);
            float a1, a2, mm;
            pd_merge_scales(m[h], m2, a1, a2, mm);
            l[h] = l[h] * a1 + l2 * a2;
#pragma unroll
            for (int i = 0; i < CPL; ++i)
#pragma unroll
                for (int e = 0; e < VEC; ++e) acc[h][i][e] = acc[h][i][e] * a1 + rf_shfl_xor(acc[h][i][e], o) * a2;
            m[h] = mm;
        }
    }
    if (lane < G) {
#pragma unroll
        for (int h = 0; h < HPB; ++h) {
            if (h >= nh) break;
            float* r = red + (wid * HPB + h) * (ATTN_DMAX + 2);
            if (lane == 0) {
                r[0] = m[h];
                r[1] = l[h];
            }
#pragma unroll
            for (int i = 0; i < CPL; ++i) {
                const int c = gl + i * G;
                if (c < chunks)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) r[2 + c * VEC + e] = acc[h][i][e];
            }
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < nh * D; i += NT) {
        const int h = i / D, d = i % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; ++w) M = fmaxf(M, red[(w * HPB + h) * (ATTN_DMAX + 2)]);
        float L = 0.0f, A = 0.0f;
#pragma unroll
        for (int w = 0; w < NW; ++w) {
            const float* r = red + (w * HPB + h) * (ATTN_DMAX + 2);
            if (r[0] == -INFINITY) continue;
            const float sc = expf(r[0] - M);
            L += r[1] * sc;
            A += r[2 + d] * sc;
        }
        const long long row = (long long)tok * p.n_heads + head0 + h;
        if (n_splits == 1) {
            // The sink joins the row's max and sum; the output was summed against the old max.
            float Ms = M, Ls = L;
            add_sink(sinks, head0 + h, Ms, Ls);
            const float r = M == -INFINITY ? 0.0f : expf(M - Ms);
            out[(long long)tok * p.o_tok_stride + (long long)(head0 + h) * p.o_head_stride + d] = Ls > 0.0f ? A * r / Ls : 0.0f;
        } else {
            float* pp = part + ((long long)split * nrows + row) * (D + 2);
            if (d == 0) {
                pp[0] = M;
                pp[1] = L;
            }
            pp[2 + d] = A;
        }
    }
}

RF_KERNEL void PD_BOUND paged_dec_f16_h4(const float* q, const __half* k, const __half* v, const int* pos, const int* seq,
                                 const int* tables, float* out, float* part, const float* sinks, int block_size,
                                 int max_blocks, int split_min, attn_params p) {
    rf_entry();
    paged_dec_impl<__half, 4>(q, k, v, pos, seq, tables, out, part, sinks, block_size, max_blocks, split_min, p);
}

RF_KERNEL void PD_BOUND paged_dec_f16_h8(const float* q, const __half* k, const __half* v, const int* pos, const int* seq,
                                 const int* tables, float* out, float* part, const float* sinks, int block_size,
                                 int max_blocks, int split_min, attn_params p) {
    rf_entry();
    paged_dec_impl<__half, 8>(q, k, v, pos, seq, tables, out, part, sinks, block_size, max_blocks, split_min, p);
}

RF_KERNEL void PD_BOUND paged_dec_f32_h4(const float* q, const float* k, const float* v, const int* pos, const int* seq,
                                 const int* tables, float* out, float* part, const float* sinks, int block_size,
                                 int max_blocks, int split_min, attn_params p) {
    rf_entry();
    paged_dec_impl<float, 4>(q, k, v, pos, seq, tables, out, part, sinks, block_size, max_blocks, split_min, p);
}

RF_KERNEL void PD_BOUND paged_dec_f32_h8(const float* q, const float* k, const float* v, const int* pos, const int* seq,
                                 const int* tables, float* out, float* part, const float* sinks, int block_size,
                                 int max_blocks, int split_min, attn_params p) {
    rf_entry();
    paged_dec_impl<float, 8>(q, k, v, pos, seq, tables, out, part, sinks, block_size, max_blocks, split_min, p);
}

// Merges the splits of `paged_dec_*`: per row (token * n_heads + head, one block each) the splits'
// maxima, sums and unnormalized outputs into the normalized output (zeros when no split saw a key).
// `sinks` (null: none) holds one logit per query head (see add_sink).
RF_KERNEL void paged_combine_f32(const float* __restrict__ part, float* __restrict__ out, int n_splits,
                                 int n_heads, int n_rows, int head_dim, long long o_tok_stride,
                                 long long o_head_stride, const float* __restrict__ sinks) {
    rf_entry();
    const long long grow = blockIdx.x;
    const int tok = (int)(grow / n_heads), head = (int)(grow % n_heads);
    const long long ps = (long long)head_dim + 2;
    float M = -INFINITY;
    for (int s = 0; s < n_splits; ++s) M = fmaxf(M, part[((long long)s * n_rows + grow) * ps]);
    float* op = out + (long long)tok * o_tok_stride + (long long)head * o_head_stride;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float L = 0.0f, A = 0.0f;
        for (int s = 0; s < n_splits; ++s) {
            const float* pp = part + ((long long)s * n_rows + grow) * ps;
            if (pp[0] == -INFINITY) continue;
            const float sc = expf(pp[0] - M);
            L += pp[1] * sc;
            A += pp[2 + d] * sc;
        }
        float Ms = M;
        add_sink(sinks, head, Ms, L);
        const float r = M == -INFINITY ? 0.0f : expf(M - Ms);
        op[d] = L > 0.0f ? A * r / L : 0.0f;
    }
}
