// Phase 1, attention, as two kernels take it: decode_stack (and decode_stack_portable) one block
// per query head over the f16 caches (ds_attention); decode_stack_split, for long contexts, each
// KV head's keys in ds_attn_splits() shares, one block per (KV head, share) item
// (ds_attention_split), the shares combined by the block that finishes a head's last one. And the
// prefetch of a block's earlier keys and values into L2 while phase 0 finishes (ds_prefetch_kv,
// ds_prefetch_kv_split).
// Included by stack.hip after exchange.h; not a unit of its own.
#pragma once

// Keys per tile of an item: their scores (every query head of the KV head) sit in shared memory
// between the scoring pass and the value pass.
#define DS_ATTN_TILE 256
// Most query heads per KV head the phase takes (`kernels::STACK_MAX_GQA`).
#define DS_ATTN_MAX_GRP 8
// Floats of the attention's shared memory (queries, then the outputs; one tile's scores), within
// the dynamic area's attention floor (`kernels::STACK_ATTN_BYTES`).
#define DS_ATTN_FLOATS (DS_ATTN_MAX_GRP * DS_HEAD + DS_ATTN_MAX_GRP * DS_ATTN_TILE)
static_assert(DS_ATTN_FLOATS * 4 <= 16384, "attention shared memory past its floor");
// Most KV heads: their completion counters follow the grid barrier's word in `bar`.
#define DS_ATTN_MAX_KV 64
// Most shares times query heads per KV head (`kernels::stack_attn_splits` keeps within it): the
// combination's weights and sums, 2 * DS_ATTN_MAX_COMBINE floats, sit in the attention's area.
#define DS_ATTN_MAX_COMBINE 1024
static_assert(DS_THREADS == 2 * DS_ATTN_TILE, "a tile's prefetch takes one line of each row per thread");
static_assert(2 * DS_ATTN_MAX_COMBINE <= DS_ATTN_FLOATS, "the combination's weights past the attention's area");

// Shares per KV head for nkv keys: enough that every block works on long contexts, one per
// tile of keys so that short ones stay one item per head.
static __device__ __forceinline__ int ds_attn_splits(const ds_params& p, int nkv) {
    const int want = (nkv + DS_ATTN_TILE - 1) / DS_ATTN_TILE;
    return max(1, min(p.attn_splits, want));
}

// Keys [j0, j1) of share s of S over nkv keys.
static __device__ __forceinline__ int2 ds_attn_range(int s, int S, int nkv) {
    const int chunk = (nkv + S - 1) / S;
    const int j0 = min(nkv, s * chunk);
    return make_int2(j0, min(nkv, j0 + chunk));
}

// Four f16 values of a packed word pair.
static __device__ __forceinline__ void ds_f16x4(int a, int b, float* o) {
    o[0] = lo_f16((uint32_t)a);
    o[1] = hi_f16((uint32_t)a);
    o[2] = lo_f16((uint32_t)b);
    o[3] = hi_f16((uint32_t)b);
}

// 8 bytes of a cache row (four f16) in registers: on AMD a clang vector, since HIP's uint2 is
// a struct whose arrays, filled under a condition, stay in scratch memory (see rf_b128).
#if defined(RF_NVIDIA)
typedef uint2 ds_b64;
#else
typedef unsigned ds_b64 __attribute__((ext_vector_type(2)));
#endif

// Phase 1 for head h: one pass per warp over keys wid, wid + 16, ... (online softmax; lane i
// holds dims 4i .. 4i + 3), then the warps' shares combined; the output goes out in Q8_1.
// PORTABLE (decode_stack_portable): the f16 pairs taken apart by shifts, where decode_stack
// reads them through pointer casts (which keep AMD's registers in memory).
template <bool PORTABLE>
static __device__ __forceinline__ void ds_attention(const ds_params& p, int l, int h, int nkv, float* wo, int wid,
                                                    int lane, int tid) {
    __shared__ float wm[DS_WARPS], wl[DS_WARPS];
    const int kvh = h / (p.n_head / p.n_head_kv);
    const __half* kc = p.layer[l].kc;
    const __half* vc = p.layer[l].vc;
    const float4 qv = ds_ldcg(reinterpret_cast<const float4*>(p.q + h * DS_HEAD) + lane);
    float m = -INFINITY, ls = 0.0f, o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
    constexpr int U = 8;
    for (int j0 = wid; j0 < nkv; j0 += U * DS_WARPS) {
        ds_b64 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + u * DS_WARPS;
            const long long off = (long long)j * p.kv_stride + kvh * DS_HEAD + lane * 4;
            kr[u] = j < nkv ? ds_ldcg(reinterpret_cast<const ds_b64*>(kc + off)) : ds_b64{0u, 0u};
            vr[u] = j < nkv ? ds_ldcg(reinterpret_cast<const ds_b64*>(vc + off)) : ds_b64{0u, 0u};
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (j0 + u * DS_WARPS >= nkv) break;
            float k[4], v[4];
#if defined(RF_NVIDIA)
            if constexpr (!PORTABLE) {
                const __half2 k0 = *reinterpret_cast<const __half2*>(&kr[u].x);
                const __half2 k1 = *reinterpret_cast<const __half2*>(&kr[u].y);
                const __half2 v0 = *reinterpret_cast<const __half2*>(&vr[u].x);
                const __half2 v1 = *reinterpret_cast<const __half2*>(&vr[u].y);
                k[0] = __low2float(k0);
                k[1] = __high2float(k0);
                k[2] = __low2float(k1);
                k[3] = __high2float(k1);
                v[0] = __low2float(v0);
                v[1] = __high2float(v0);
                v[2] = __low2float(v1);
                v[3] = __high2float(v1);
            } else
#endif
            {
                k[0] = lo_f16(kr[u].x);
                k[1] = hi_f16(kr[u].x);
                k[2] = lo_f16(kr[u].y);
                k[3] = hi_f16(kr[u].y);
                v[0] = lo_f16(vr[u].x);
                v[1] = hi_f16(vr[u].x);
                v[2] = lo_f16(vr[u].y);
                v[3] = hi_f16(vr[u].y);
            }
            const float sc = warp_sum<32>(k[0] * qv.x + k[1] * qv.y + k[2] * qv.z + k[3] * qv.w) * p.attn_scale;
            const float mn = fmaxf(m, sc), cr = expf(m - mn), pr = expf(sc - mn);
            ls = ls * cr + pr;
            o0 = o0 * cr + pr * v[0];
            o1 = o1 * cr + pr * v[1];
            o2 = o2 * cr + pr * v[2];
            o3 = o3 * cr + pr * v[3];
            m = mn;
        }
    }
    if (lane == 0) {
        wm[wid] = m;
        wl[wid] = ls;
    }
    reinterpret_cast<float4*>(wo + wid * DS_HEAD)[lane] = make_float4(o0, o1, o2, o3);
    __syncthreads();
    if (tid < DS_HEAD) {
        float mx = -INFINITY;
        for (int w = 0; w < DS_WARPS; ++w) mx = fmaxf(mx, wm[w]);
        float sl = 0.0f, so = 0.0f;
        for (int w = 0; w < DS_WARPS; ++w) {
            const float e = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - mx);
            sl += wl[w] * e;
            so += wo[w * DS_HEAD + tid] * e;
        }
        q8_1_put(so / sl, p.aq, p.n_head * DS_HEAD, h * DS_HEAD + tid);
    }
    __syncthreads();
}

// Asks for the earlier keys and values of this block's heads in layer l into L2 while the other
// blocks finish phase 0 (the cache rows before the position are not written this step).
static __device__ __forceinline__ void ds_prefetch_kv(const ds_params& p, int l, int pos, int tid) {
    const int grp = p.n_head / p.n_head_kv;
    for (int h = blockIdx.x; h < p.n_head; h += gridDim.x) {
        const int kvh = h / grp, part = h % grp;
        for (int i = tid; i < pos * 2; i += DS_THREADS) {  // two 128-byte lines per row
            const int j = i / 2;
            if (j % grp != part) continue;
            const long long off = (long long)j * p.kv_stride + kvh * DS_HEAD + (i & 1) * 64;
            rf_prefetch_l2(p.layer[l].kc + off);
            rf_prefetch_l2(p.layer[l].vc + off);
        }
    }
}

// Phase 1 for item (KV head g, share s of S): the grp query heads of g over the share's keys, a
// tile at a time: scores (eight lanes per key, each 16 dims, for every query head, the queries
// read from shared memory, two keys per lane group in flight), the tile's online-softmax update
// per head (one warp per head), then the value sums: thread t takes 8 dims (chunk t / NS, 16-byte
// loads) of its head over keys t % NS, t % NS + NS, ... (NS streams side by side in a warp, four
// rows in flight), the streams added by shuffles at the end. With one share the output goes out
// in Q8_1; else the share's maxima, sums and unnormalised outputs go to `attn_part`, and the
// block that completes the head's last share combines them (its counter back to 0 for the next
// layer).
static __device__ __forceinline__ void ds_attention_split(const ds_params& p, int l, int g, int s, int S, int nkv,
                                                          float* sm, int wid, int lane, int tid) {
    __shared__ float hm[DS_ATTN_MAX_GRP], hl[DS_ATTN_MAX_GRP], hc[DS_ATTN_MAX_GRP];
    __shared__ int last;
    const int grp = p.n_head / p.n_head_kv;
    const int O = grp * DS_HEAD;
    // Value streams per 8-dim chunk: a power of two up to 32 with O / 8 chunks in DS_THREADS.
    int NS = 32;
    while (NS > 1 && (O / 8) * NS > DS_THREADS) NS /= 2;
    const int r = tid % NS, c = tid / NS;
    const bool vact = c < O / 8;
    const int vi = vact ? c / (DS_HEAD / 8) : 0;                // the chunk's head
    const int vd = (c % (DS_HEAD / 8)) * 8;                      // its first dim
    float* qs = sm;
    float* sc = qs + DS_ATTN_MAX_GRP * DS_HEAD;
    const long long stride = p.kv_stride;
    const __half* kc = p.layer[l].kc + g * DS_HEAD;
    const __half* vc = p.layer[l].vc + g * DS_HEAD + vd;
    const int2 range = ds_attn_range(s, S, nkv);
    for (int i = tid; i < O; i += DS_THREADS) qs[i] = ds_ldcg(p.q + g * O + i) * p.attn_scale;
    if (tid < grp) {
        hm[tid] = -INFINITY;
        hl[tid] = 0.0f;
    }
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.0f;
    __syncthreads();
    const int sub = lane & 7;
    for (int t0 = range.x; t0 < range.y; t0 += DS_ATTN_TILE) {
        const int nt = min(DS_ATTN_TILE, range.y - t0);
        // The next tile's keys and values asked into L2 while this one is worked on (its value
        // pass has four rows in flight per thread: from memory it would wait on each round).
        // Two 128-byte lines per row, one row's per thread pair (DS_THREADS == 2 * DS_ATTN_TILE).
        if (tid < 2 * (range.y - t0 - DS_ATTN_TILE)) {
            const long long off = (long long)(t0 + DS_ATTN_TILE + tid / 2) * stride + (tid & 1) * 64;
            rf_prefetch_l2(kc + off);
            rf_prefetch_l2(vc - vd + off);
        }
        // Scores: each warp eight keys per round (two per group of eight lanes).
        for (int base = wid * 8; base < nt; base += DS_WARPS * 8) {
            rf_b128 kr[2][2];
            int jj[2];
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                jj[h] = base + h * 4 + (lane >> 3);
                kr[h][0] = kr[h][1] = rf_b128{0, 0, 0, 0};
                if (jj[h] < nt) {
                    const rf_b128* src =
                        reinterpret_cast<const rf_b128*>(kc + (long long)(t0 + jj[h]) * stride + sub * 16);
                    kr[h][0] = ds_ldcg(src);
                    kr[h][1] = ds_ldcg(src + 1);
                }
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                float k[16];
                ds_f16x4(kr[h][0].x, kr[h][0].y, k);
                ds_f16x4(kr[h][0].z, kr[h][0].w, k + 4);
                ds_f16x4(kr[h][1].x, kr[h][1].y, k + 8);
                ds_f16x4(kr[h][1].z, kr[h][1].w, k + 12);
                for (int i = 0; i < grp; ++i) {
                    const float4* qv = reinterpret_cast<const float4*>(qs + i * DS_HEAD + sub * 16);
                    float d = 0.0f;
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const float4 q4 = qv[e];
                        d += k[4 * e] * q4.x + k[4 * e + 1] * q4.y + k[4 * e + 2] * q4.z + k[4 * e + 3] * q4.w;
                    }
                    d = warp_sum<8>(d);
                    if (jj[h] < nt && sub == 0) sc[i * DS_ATTN_TILE + jj[h]] = d;
                }
            }
        }
        __syncthreads();
        // The tile's softmax update: warp i takes query head i.
        if (wid < grp) {
            float* row = sc + wid * DS_ATTN_TILE;
            float mx = -INFINITY;
            for (int jj = lane; jj < nt; jj += 32) mx = fmaxf(mx, row[jj]);
            mx = warp_max<32>(mx);
            const float mo = hm[wid], mn = fmaxf(mo, mx);
            float sum = 0.0f;
            for (int jj = lane; jj < nt; jj += 32) {
                const float e = expf(row[jj] - mn);
                row[jj] = e;
                sum += e;
            }
            sum = warp_sum<32>(sum);
            if (lane == 0) {
                const float cr = mo == -INFINITY ? 0.0f : expf(mo - mn);
                hc[wid] = cr;
                hl[wid] = hl[wid] * cr + sum;
                hm[wid] = mn;
            }
        }
        __syncthreads();
        // Values: four rows of this stream in flight, then their weighted sums.
        if (vact) {
            const float cr = hc[vi];
#pragma unroll
            for (int e = 0; e < 8; ++e) acc[e] *= cr;
            const float* pr = sc + vi * DS_ATTN_TILE;
            for (int j = r; j < nt; j += 4 * NS) {
                rf_b128 vr[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int jj = j + u * NS;
                    vr[u] = jj < nt ? ds_ldcg(reinterpret_cast<const rf_b128*>(vc + (long long)(t0 + jj) * stride))
                                    : rf_b128{0, 0, 0, 0};
                }
#pragma unroll
                for (int u = 0; u < 4; ++u) {
                    const int jj = j + u * NS;
                    const float pw = jj < nt ? pr[jj] : 0.0f;
                    float v[8];
                    ds_f16x4(vr[u].x, vr[u].y, v);
                    ds_f16x4(vr[u].z, vr[u].w, v + 4);
#pragma unroll
                    for (int e = 0; e < 8; ++e) acc[e] += pw * v[e];
                }
            }
        }
        __syncthreads();
    }
    // The NS streams of each chunk add up (they are neighbouring lanes); the sums go through
    // shared memory (over the queries) so that whole warps hold consecutive values below.
#pragma unroll
    for (int e = 0; e < 8; ++e)
        for (int m = 1; m < NS; m *= 2) acc[e] += rf_shfl_xor(acc[e], m, 32);
    float* out = qs;
    if (vact && r == 0)
#pragma unroll
        for (int e = 0; e < 8; ++e) out[vi * DS_HEAD + vd + e] = acc[e];
    __syncthreads();
    const int nq = p.n_head * DS_HEAD;
    if (S == 1) {
        // Whole warps of consecutive values: each Q8_1 block is one logical warp's.
        for (int o = tid; o < O; o += DS_THREADS) q8_1_put(out[o] / hl[o / DS_HEAD], p.aq, nq, g * O + o);
        __syncthreads();
        return;
    }
    // This share's part: grp x DS_HEAD outputs, then grp maxima and grp sums.
    const int part_floats = grp * (DS_HEAD + 2);
    float* part = p.attn_part + (long long)(g * S + s) * part_floats;
    for (int o = tid; o < O; o += DS_THREADS) part[o] = out[o];
    if (tid < grp) {
        part[O + tid] = hm[tid];
        part[O + grp + tid] = hl[tid];
    }
    __threadfence();
    __syncthreads();
    if (tid == 0) last = atomicAdd(p.bar + DS_ATTN_MAX_KV + g, 1u) == (unsigned)(S - 1);
    __syncthreads();
    if (last) {
        __threadfence();
        const float* parts = p.attn_part + (long long)g * S * part_floats;
        // Every share's maxima and sums, one load per thread (a thread looping over the shares
        // would wait for each load in turn, on the layer's critical path), then per head the
        // shares' weights exp(m_t - max) / sum, in shared memory over the queries and scores
        // (S * grp <= DS_ATTN_MAX_COMBINE).
        float* wt = sm;
        float* lt = sm + S * grp;
        for (int i = tid; i < S * grp; i += DS_THREADS) {
            const float* pt = parts + (i / grp) * part_floats + O + i % grp;
            wt[i] = ds_ldcg(pt);
            lt[i] = ds_ldcg(pt + grp);
        }
        __syncthreads();
        if (tid < grp) {
            float mx = -INFINITY;
            for (int t = 0; t < S; ++t) mx = fmaxf(mx, wt[t * grp + tid]);
            float ls = 0.0f;
            for (int t = 0; t < S; ++t) {
                const float mt = wt[t * grp + tid];
                const float e = mt == -INFINITY ? 0.0f : expf(mt - mx);
                wt[t * grp + tid] = e;
                ls += lt[t * grp + tid] * e;
            }
            for (int t = 0; t < S; ++t) wt[t * grp + tid] /= ls;
        }
        __syncthreads();
        // The outputs: four shares' loads in flight per step.
        for (int o = tid; o < O; o += DS_THREADS) {
            const int i = o / DS_HEAD;
            float os = 0.0f;
            int t = 0;
            for (; t + 4 <= S; t += 4) {
                float v[4];
#pragma unroll
                for (int u = 0; u < 4; ++u) v[u] = ds_ldcg(parts + (t + u) * part_floats + o);
#pragma unroll
                for (int u = 0; u < 4; ++u) os += v[u] * wt[(t + u) * grp + i];
            }
            for (; t < S; ++t) os += ds_ldcg(parts + t * part_floats + o) * wt[t * grp + i];
            q8_1_put(os, p.aq, nq, g * O + o);
        }
        if (tid == 0) p.bar[DS_ATTN_MAX_KV + g] = 0u;
    }
    __syncthreads();
}

// Asks for the earlier keys and values of this block's items (ds_attention_split) in layer l into
// L2 while the other blocks finish phase 0: the first `attn_prefetch_rows` of each share (the
// ones its block reads first), so that every item's requests together stay within the L2 share
// the host sized them for (more would evict the first rows before they are read, and read them
// from memory twice).
static __device__ __forceinline__ void ds_prefetch_kv_split(const ds_params& p, int l, int nkv, int pos, int tid) {
    const int S = ds_attn_splits(p, nkv);
    for (int it = blockIdx.x; it < p.n_head_kv * S; it += gridDim.x) {
        const int g = it / S;
        const int2 range = ds_attn_range(it % S, S, nkv);
        const int end = min(min(range.y, pos), range.x + p.attn_prefetch_rows);
        for (int i = range.x * 2 + tid; i < end * 2; i += DS_THREADS) {  // two 128-byte lines per row
            const long long off = (long long)(i / 2) * p.kv_stride + g * DS_HEAD + (i & 1) * 64;
            rf_prefetch_l2(p.layer[l].kc + off);
            rf_prefetch_l2(p.layer[l].vc + off);
        }
    }
}
