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

template <typename KV>
static __device__ __forceinline__ float ld_kv(const KV* p, long long i);
template <>
__device__ __forceinline__ float ld_kv<float>(const float* p, long long i) { return p[i]; }
template <>
__device__ __forceinline__ float ld_kv<__half>(const __half* p, long long i) { return __half2float(p[i]); }

// A value rounded to the cache's precision (what the CPU converts q and probabilities to).
template <typename KV>
static __device__ __forceinline__ float round_kv(float x);
template <>
__device__ __forceinline__ float round_kv<float>(float x) { return x; }
template <>
__device__ __forceinline__ float round_kv<__half>(float x) { return __half2float(__float2half(x)); }

// `part` (split-K only): per split and row (token * n_heads + head): [m, l, out[head_dim]].
template <typename KV>
static __device__ __forceinline__ void attn_impl(const float* __restrict__ q, const KV* __restrict__ k,
                                                 const KV* __restrict__ v, const int* __restrict__ pos,
                                                 float* __restrict__ out,
                                                 float* __restrict__ part, const attn_params p) {
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
                ks[pp * ATTN_DMAX + d] = ld_kv(kb, (long long)(t0 + pp) * p.k_pos_stride + d);
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
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;

    // Pass 2: probabilities, normalized and rounded, weight the V rows.
    for (int t0 = lo; t0 < hi; t0 += ATTN_TK) {
        const int tn = min(ATTN_TK, hi - t0);
        __syncthreads();
        for (int i = threadIdx.x; i < tn * D; i += blockDim.x) {
            const int pp = i / D, d = i % D;
            ks[pp * ATTN_DMAX + d] = ld_kv(kb, (long long)(t0 + pp) * p.k_pos_stride + d);
            vs[pp * ATTN_DMAX + d] = ld_kv(vb, (long long)(t0 + pp) * p.v_pos_stride + d);
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

RF_KERNEL void attn_f16(const float* q, const __half* k, const __half* v, const int* pos, float* out,
                        float* part, attn_params p) {
    attn_impl<__half>(q, k, v, pos, out, part, p);
}

RF_KERNEL void attn_f32(const float* q, const float* k, const float* v, const int* pos, float* out,
                        float* part, attn_params p) {
    attn_impl<float>(q, k, v, pos, out, part, p);
}

// Adds the `n_splits` shares of each row's output (phase 2's results, already normalized by the
// row's totals): one block per row (token * n_heads + head).
RF_KERNEL void attn_combine_f32(const float* __restrict__ part, float* __restrict__ out, int n_splits,
                                int n_heads, int n_rows, int head_dim, long long o_tok_stride,
                                long long o_head_stride) {
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
RF_KERNEL void attn_softmax_f16(const float* __restrict__ s, __half* __restrict__ p, const int* __restrict__ pos,
                                int n_kv, int n_rows, int tok0, int causal, int window) {
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
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    for (int j = threadIdx.x; j < n_kv; j += blockDim.x)
        pr[j] = __float2half(j >= lo && j < hi && mx != -INFINITY ? expf(sr[j] - mx) * inv : 0.0f);
}
