// Phase 1, attention: one block per head over the f16 caches (ds_attention), and the prefetch of
// a head's earlier keys and values into L2 while phase 0 finishes (ds_prefetch_kv).
// Included by stack.hip after exchange.h; not a unit of its own.
#pragma once

// Phase 1 for head h: one pass per warp over keys wid, wid + 16, ... (online softmax; lane i
// holds dims 4i .. 4i + 3), then the warps' shares combined; the output goes out in Q8_1.
static __device__ __forceinline__ void ds_attention(const ds_params& p, int l, int h, int nkv, float* wo, int wid,
                                                    int lane) {
    __shared__ float wm[DS_WARPS], wl[DS_WARPS];
    const int kvh = h / (p.n_head / p.n_head_kv);
    const __half* kc = p.layer[l].kc;
    const __half* vc = p.layer[l].vc;
    const float4 qv = __ldcg(reinterpret_cast<const float4*>(p.q + h * DS_HEAD) + lane);
    float m = -INFINITY, ls = 0.0f, o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
    constexpr int U = 8;
    for (int j0 = wid; j0 < nkv; j0 += U * DS_WARPS) {
        uint2 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + u * DS_WARPS;
            const long long off = (long long)j * p.kv_stride + kvh * DS_HEAD + lane * 4;
            kr[u] = j < nkv ? __ldcg(reinterpret_cast<const uint2*>(kc + off)) : make_uint2(0, 0);
            vr[u] = j < nkv ? __ldcg(reinterpret_cast<const uint2*>(vc + off)) : make_uint2(0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (j0 + u * DS_WARPS >= nkv) break;
            const __half2 k0 = *reinterpret_cast<const __half2*>(&kr[u].x);
            const __half2 k1 = *reinterpret_cast<const __half2*>(&kr[u].y);
            const float sc = warp_sum(__low2float(k0) * qv.x + __high2float(k0) * qv.y + __low2float(k1) * qv.z +
                                      __high2float(k1) * qv.w) *
                             p.attn_scale;
            const float mn = fmaxf(m, sc), cr = expf(m - mn), pr = expf(sc - mn);
            const __half2 v0 = *reinterpret_cast<const __half2*>(&vr[u].x);
            const __half2 v1 = *reinterpret_cast<const __half2*>(&vr[u].y);
            ls = ls * cr + pr;
            o0 = o0 * cr + pr * __low2float(v0);
            o1 = o1 * cr + pr * __high2float(v0);
            o2 = o2 * cr + pr * __low2float(v1);
            o3 = o3 * cr + pr * __high2float(v1);
            m = mn;
        }
    }
    if (lane == 0) {
        wm[wid] = m;
        wl[wid] = ls;
    }
    reinterpret_cast<float4*>(wo + wid * DS_HEAD)[lane] = make_float4(o0, o1, o2, o3);
    __syncthreads();
    if (threadIdx.x < DS_HEAD) {
        float mx = -INFINITY;
        for (int w = 0; w < DS_WARPS; ++w) mx = fmaxf(mx, wm[w]);
        float sl = 0.0f, so = 0.0f;
        for (int w = 0; w < DS_WARPS; ++w) {
            const float e = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - mx);
            sl += wl[w] * e;
            so += wo[w * DS_HEAD + threadIdx.x] * e;
        }
        q8_1_put(so / sl, p.aq, p.n_head * DS_HEAD, h * DS_HEAD + threadIdx.x);
    }
    __syncthreads();
}

// Asks for the earlier keys and values of this block's heads in layer l into L2 while the other
// blocks finish phase 0 (the cache rows before the position are not written this step).
static __device__ __forceinline__ void ds_prefetch_kv(const ds_params& p, int l, int pos) {
    const int grp = p.n_head / p.n_head_kv;
    for (int h = blockIdx.x; h < p.n_head; h += gridDim.x) {
        const int kvh = h / grp, part = h % grp;
        for (int i = threadIdx.x; i < pos * 2; i += DS_THREADS) {  // two 128-byte lines per row
            const int j = i / 2;
            if (j % grp != part) continue;
            const long long off = (long long)j * p.kv_stride + kvh * DS_HEAD + (i & 1) * 64;
            rf_prefetch_l2(p.layer[l].kc + off);
            rf_prefetch_l2(p.layer[l].vc + off);
        }
    }
}
