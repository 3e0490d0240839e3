// Phase 1, attention: one block per head over the f16 caches (ds_attention), and the prefetch of
// a head's earlier keys and values into L2 while phase 0 finishes (ds_prefetch_kv).
// Included by stack.hip after exchange.h; not a unit of its own.
#pragma once

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
