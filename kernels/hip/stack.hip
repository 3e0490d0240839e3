// The persistent decode stack: all the llama-family layers of one decode step (one token) in one
// cooperative launch, so that the weight stream never stops at a kernel boundary.
//
// One block of DS_THREADS threads per multiprocessor runs five phases per layer, with a grid
// barrier between consecutive phases:
//   0  q/k/v: q, k and v projections of rms_norm(x) * attn_norm (plus their biases, Qwen2); q and k
//      roped (adjacent pairs, or NeoX's dims 64 apart), k and v stored in the f16 caches at the
//      step's position, q kept in `q`; with q/k head norms (Qwen3; biases, NeoX and norms in the
//      _qkv kernels only) a head's q or k normed and roped by the group that completes it
//      (ds_qk_norm);
//   1  attention: one head per block and pass (online softmax per warp over every 16th key, the
//      warps' shares combined in shared memory), its output quantized for phase 2; in
//      decode_stack_split (long contexts) one block per KV head and share of its keys instead
//      (all the head's queries at once, tiles of scores in shared memory), the shares combined by
//      the block finishing a head's last one;
//   2  o: o projection plus the residual: x, and x * ffn_norm quantized for phase 3;
//   3  gate/up: gate and up projections of rms_norm(x) * ffn_norm, act(gate) * up quantized for
//      phase 4;
//   4  down: down projection plus the residual: x, and x * the next layer's attn_norm quantized.
// Products run over 32-row groups, block b taking groups b, b + grid, ... (q/k/v's and gate/up's
// partial last round as 16-row halves, see ds_halves), listed once per launch in shared memory
// (ds_build); each warp owns two rows of a group (four for gate and up) and streams them through
// its own ring of DS_STAGES shared-memory slots filled by cp.async. The ring runs ahead of the
// phase being computed, across the barriers (weights are read-only), which is what one launch
// per token buys over separate launches (kernels/PERF.md has the measurements behind this
// design, the variants tried and dropped, and where the step's time goes).
// RMS norms cost no pass: a producer writes its rows times the norm weight in Q8_1 and adds
// their squares to a per-norm sum, and the consumer scales its dot products by
// rsqrt(sum / n + eps) (a Q8_1 vector scaled by r quantizes to the same values with its scales
// times r).
// Data crossing a barrier is read with L2 loads (__ldcg): a multiprocessor's L1 may hold lines
// another one has since rewritten.
//
// Invariants: the grid is co-resident (a cooperative launch; the barrier is a counter that is 0
// between launches); every block walks the phases in the same order and arrives at every barrier;
// the kernel sits at its register limit, so state added to the hot loop slows all of it (measure
// any change, see kernels/PERF.md).
// Limits: weights q, k, o, gate and up in Q4_K; v and down in Q4_K or Q6_K (Q4_K_M). Head size 128;
// every product's input width a multiple of 2048 (whole 8-block Q4_K chunks, 16-byte Q6_K rows);
// NeoX rope over all 128 dims of a head.
// NVIDIA compute capability 8.0 and later only (cp.async); elsewhere the kernel is empty and the
// host never launches it.
//
// The parts, included in this order (each relies on the ones before it):
//   stack/params.h       launch parameters and shared-memory sizes
//   stack/activations.h  item layout flags, activation loads with 16-value Q8 scales
//   stack/items.h        dealing groups to blocks, the work-item list and its cursor
//   stack/ring.h         the per-warp cp.async weight ring
//   stack/exchange.h     the grid barrier, input fetch, L2 prefetch of later items
//   stack/attention.h    phase 1
// and here the kernels: decode_stack and its variants (split, portable, qkv) and head_q6_k.
#include "qdot.h"
#include "stack/params.h"

#include "stack/activations.h"
#include "stack/items.h"
#if defined(RF_CP_ASYNC)
#include "stack/ring.h"
#endif
#include "stack/stream.h"
#include "stack/exchange.h"
#include "stack/attention.h"

// One block per multiprocessor: the whole register file is this block's.
#define DS_ATTRS __launch_bounds__(DS_THREADS, 1)

// The q/k/v row (rows of q, then k, then v) whose sum lane `lane` of warp 0 holds in the
// epilogue of a phase-0 group: a split half's lanes 16..31 repeat lanes 0..15's rows; in a
// DS_NEOX group (EXT kernels only; see ds_build) lane 2i holds the group's row i and lane 2i + 1
// its rope partner, 64 rows on.
template <bool EXT>
static __device__ __forceinline__ int ds_qkv_row(const ds_cursor& cu, int lane) {
    const bool split = cu.kind & DS_SPLIT;
    const int i = split ? lane & 15 : lane;
    if (!EXT || !(cu.kind & DS_NEOX)) return cu.r16 * 16 + i;
    return cu.r16 * 16 - (split ? 8 * (cu.r16 & 7) : 0) + i / 2 + 64 * (i & 1);
}

// Layer l's bias of q/k/v row `row` (DS_QKV_BIAS).
static __device__ __forceinline__ float ds_qkv_bias(const ds_params& p, int l, int row) {
    const int nq = p.n_head * DS_HEAD, nk = p.n_head_kv * DS_HEAD;
    const float* const* b = p.qkv_vec[l];
    return row < nq ? b[0][row] : row < nq + nk ? b[1][row - nq] : b[2][row - nq - nk];
}

// Q/K head norms (DS_QKV_NORM), by warp 0 in the epilogue of a q or k group of one head (`rows`
// 32, or 16 in a split half, whose lanes 16..31 repeat lanes 0..15): lane `lane` holds row qr's
// product v, unroped. The group's rows go to `q` (the keys after the queries), their squares to
// the head's sum, and its rows are counted in (in `bar`, see DS_NORM_AT); the group that
// completes its head's 128 rows scales all of them by rsqrt(sum / 128 + eps) and the norm
// weight (wq or wk), ropes them ((cos, sin) per pair in `cs`), writes the queries back and the
// keys to the f16 cache (kc: key row r - nq at kc[r]), and leaves the head's counter and sum 0.
// The rows travel through L2 (ds_ldcg), ordered by fences.
static __device__ __forceinline__ void ds_qk_norm(float* q, __half* kc, unsigned* bar, const float* wq, const float* wk,
                                                  const float2* cs, int nq, float eps, bool neox, int qr, float v,
                                                  int rows, int lane) {
    const int h = qr / DS_HEAD;
    q[qr] = v;  // a split half's lanes 16..31 store their twins' values again
    const float s2 = warp_sum<32>(v * v) * (rows == 32 ? 1.0f : 0.5f);  // each twin once (exact)
    unsigned* cnt = bar + DS_NORM_AT + 2 * h;
    float* ss = reinterpret_cast<float*>(cnt + 1);
    __threadfence();
    rf_syncwarp();
    int done = 0;
    if (lane == 0) {
        atomicAdd(ss, s2);
        __threadfence();
        done = atomicAdd(cnt, (unsigned)rows) == (unsigned)(DS_HEAD - rows);
    }
#pragma unroll
    for (int m = 1; m < 32; m <<= 1) done |= rf_shfl_xor_int(done, m, 32);
    if (!done) return;
    __threadfence();
    const float r = rsqrtf(ds_ldcg(ss) / DS_HEAD + eps);
    const float* w = qr < nq ? wq : wk;
    for (int j = lane; j < DS_HEAD / 2; j += 32) {
        // Pair j: dims j and j + 64 (NeoX) or 2j and 2j + 1.
        const int a = neox ? j : 2 * j, b = neox ? j + DS_HEAD / 2 : 2 * j + 1;
        const int ra = h * DS_HEAD + a, rb = h * DS_HEAD + b;
        const float xa = ds_ldcg(q + ra) * r * w[a], xb = ds_ldcg(q + rb) * r * w[b];
        const float2 o = cs[j];
        const float ya = xa * o.x - xb * o.y, yb = xa * o.y + xb * o.x;
        if (ra < nq) {
            q[ra] = ya;
            q[rb] = yb;
        } else {
            kc[ra] = __float2half(ya);
            kc[rb] = __float2half(yb);
        }
    }
    rf_syncwarp();
    if (lane == 0) {
        *ss = 0.0f;
        *cnt = 0u;
    }
}

// The step, all variants: RING, decode_stack's cp.async ring (NVIDIA only); else
// decode_stack_portable's register stream (stream.h). SPLIT: phase 1 by KV head and share of its
// keys (ds_attention_split, decode_stack_split), else by query head (ds_attention); two kernels
// rather than a branch, since each phase's code costs the others registers (kernels/PERF.md,
// "attention at depth"). EXT: the ds_params::qkv flags are read (the _qkv kernels); else they
// are taken as 0. `lane` and `wid` are a logical 32-lane warp's: on wave64 targets each wave
// holds two of them, which share nothing but the wave's barrier (rf_syncwarp) and take every
// shuffle within their 32 lanes.
template <bool RING, bool SPLIT, bool EXT>
static __device__ __forceinline__ void ds_step(const ds_params& p) {
    extern __shared__ __align__(16) uint8_t ds_sm[];
    uint8_t* sm = ds_sm;
    __shared__ float rowv2[2][32];
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    __shared__ float2 rope_cs[DS_HEAD / 2];  // (cos, sin) per dimension pair at the step's position
    constexpr int ring_bytes = RING ? DS_STAGES * DS_TILE : 0;
    ds_item* items = reinterpret_cast<ds_item*>(sm + ring_bytes);
    uint8_t* act = sm + ring_bytes + DS_MAX_ITEMS * sizeof(ds_item);
    const int nq = DS_PHASES * p.n_layer;
    int lane = threadIdx.x % 32, wid = threadIdx.x / 32, tid = threadIdx.x;
    // Prologue: list this block's work items and start its warps' weight streams before waiting
    // for the kernel before (the weights are read-only, nothing else is touched until
    // rf_entry()).
    const ds_item* end = items + ds_build<EXT>(p, items);
    __syncthreads();
    ds_cursor is, cu;
    is.first(items, end, nq);
    cu = is;
    // Byte offsets of the ring stage being consumed and of the one issued next.
    uint32_t st_use = 0, st_put = (DS_STAGES - 1) * DS_TILE;
#if defined(RF_CP_ASYNC)
    uint8_t* ring = sm;
    // This lane's place in stage 0 of its warp's ring; the stages are DS_TILE apart.
    const uint32_t ring_lane = (uint32_t)__cvta_generic_to_shared(ring) + wid * DS_SLOT + lane * 16;
    if constexpr (RING)
        for (int s = 0; s < DS_STAGES - 1; ++s) ds_issue(is, end, nq, ring_lane + s * DS_TILE, lane);
#endif
    // The portable stream's chunk in registers: the one computed next.
    ds_raw cur;
    if constexpr (!RING) ds_load(is, end, nq, lane, cur);
    rf_entry();
    // The sums of squares are added to from phase 2 on, two barriers after block 0 clears them.
    if (blockIdx.x == 0)
        for (int i = threadIdx.x; i < 2 * p.n_layer; i += DS_THREADS) p.ss[i] = 0.0f;
    const int pos = p.pos[0];
    const int nkv = min(pos + 1, p.n_kv);
    // Layer 0's input: every block quantizes x * attn_norm itself and sums its squares.
    float scale0;
    {
        float s = 0.0f;
        for (int i = threadIdx.x; i < p.n_embd; i += DS_THREADS) {
            const float v = ds_ldcg(p.x_in + i);
            s += v * v;
            q8_1_put(v * p.layer[0].attn_norm[i], act, p.n_embd, i, 16 * act_swz(i / 16) + i % 16);
        }
        s = block_sum(s, scratch);
        scale0 = rsqrtf(s / p.n_embd + p.eps);
    }
    // The position is the launch's: the rope's angles are worked out once, not per group.
    if (threadIdx.x < DS_HEAD / 2) {
        const rope_rot o = rope_angle(threadIdx.x, (float)pos, p.n_dims, p.base, p.freq_scale, p.freq_factors, 0,
                                      p.ext_factor, p.mscale, p.corr_lo, p.corr_hi);
        rope_cs[threadIdx.x] = o.rot ? make_float2(o.c, o.s) : make_float2(1.0f, 0.0f);
    }
    __syncthreads();
    // The phases, layer by layer: q = layer * DS_PHASES + phase.
    unsigned bar_old = 0;
    int ngrp = 0;
    float acc[2] = {0.0f, 0.0f};
    float res = 0.0f, nwv = 0.0f;
    for (int q = 0; q < nq; ++q) {
        const int l = q / DS_PHASES, k = q % DS_PHASES;
        if constexpr (!RING) {
            // The thread's index anew per phase, opaque to the compiler: AMD's otherwise hoists
            // every per-thread offset of every phase (shared-memory addresses, row offsets)
            // above this loop, where they stay live through all of it and spill.
            tid = ds_opaque((int)threadIdx.x);
            lane = tid % 32;
            wid = tid / 32;
            is.tid = cu.tid = tid;
        }
        if (k == 1) {
            if constexpr (SPLIT) ds_prefetch_kv_split(p, l, nkv, pos, tid);
            else ds_prefetch_kv(p, l, min(pos, nkv), tid);
        }
        // Grid barrier: wait until every block has arrived at the end of the phase before.
        if (q > 0) {
            if (threadIdx.x == 0) {
#if defined(RF_NVIDIA)
                if constexpr (RING) ds_barrier_wait(p.bar, bar_old);
                else ds_barrier_wait_portable(p.bar, bar_old);
#else
                ds_barrier_wait_portable(p.bar, bar_old);
#endif
            }
            __syncthreads();
        }
        if (k == 1) {
            // Phase 1, attention; the blocks without a head (or item; and past as many blocks as
            // heads, which `prefetch_items` is sized for) ask L2 for their next gate/up rows.
            int busy = p.n_head;
            if constexpr (SPLIT) {
                const int S = ds_attn_splits(p, nkv);
                busy = max(busy, p.n_head_kv * S);
                for (int it = blockIdx.x; it < p.n_head_kv * S; it += gridDim.x)
                    ds_attention_split(p, l, it / S, it % S, S, nkv, reinterpret_cast<float*>(act), wid, lane, tid);
            } else {
                for (int h = blockIdx.x; h < p.n_head; h += gridDim.x)
                    ds_attention<!RING>(p, l, h, nkv, reinterpret_cast<float*>(act), wid, lane, tid);
            }
            if ((int)blockIdx.x >= busy) ds_prefetch_items(cu.it, end, q + 2, p.prefetch_items, tid);
        } else if (cu.q == q) {
            // Phases 0 (q/k/v), 2 (o), 3 (gate/up) and 4 (down): a product. Fetch its Q8 input
            // into shared memory, then stream this block's groups of the phase through the rings.
            float scale = 1.0f;
            int ncols = p.n_embd;
            if (k == 0) {
                if (l > 0) ds_fetch<!RING>(p.xq, act, p.n_embd, q8_vec_bytes(p.n_embd), tid);
                scale = l > 0 ? rsqrtf(ds_ldcg(p.ss + 2 * l) / p.n_embd + p.eps) : scale0;
            } else if (k == 2) {
                ncols = p.n_head * DS_HEAD;
                ds_fetch<!RING>(p.aq, act, ncols, q8_vec_bytes(ncols), tid);
            } else if (k == 3) {
                ds_fetch<!RING>(p.xq, act, p.n_embd, q8_vec_bytes(p.n_embd), tid);
                scale = rsqrtf(ds_ldcg(p.ss + 2 * l + 1) / p.n_embd + p.eps);
            } else {
                ncols = p.n_ff;
                ds_fetch<!RING>(p.hq, act, ncols, q8_16_vec_bytes(ncols), tid);
            }
            __syncthreads();
            const q8_vec yv{act, act + ncols};
            const float* xr = (k == 2 && l == 0) ? p.x_in : p.x_out;
            while (cu.q == q) {
                // The next chunk's loads go out before this one's products (portable stream).
                ds_raw nxt;
#if defined(RF_CP_ASYNC)
                if constexpr (RING) {
                    ds_issue(is, end, nq, ring_lane + st_put, lane);
                    st_put = ds_next_stage(st_put);
                }
#endif
                if constexpr (!RING) ds_load(is, end, nq, lane, nxt);
                if (wid == 0 && cu.c == 0 && (k == 2 || k == 4)) {
                    // The residual and the next norm's weight, asked for a group ahead of the
                    // epilogue that needs them (a miss there would hold up the phase's end).
                    const int row = cu.r16 * 16 + lane;
                    res = ds_ldcg(xr + row);
                    const bool last = k == 4 && l + 1 == p.n_layer;
                    nwv = last ? 0.0f : (k == 2 ? p.layer[l].ffn_norm : p.layer[l + 1].attn_norm)[row];
                }
                const int lay = cu.kind & 3;
                if constexpr (!RING) ds_stream_dot(yv, cur, cu, lane, acc);
#if defined(RF_CP_ASYNC)
                if constexpr (RING) {
                    // Q6_K chunks go two at a time (rows hold whole chunk pairs): the second must
                    // have landed too, and its slot's refill is asked for after both are used.
                    if (lay == DS_Q6) cp_async_wait<DS_STAGES - 2>();
                    else cp_async_wait<DS_STAGES - 1>();
                    __syncwarp();
                    const uint8_t* tile = ring + st_use + wid * DS_SLOT;
                    st_use = ds_next_stage(st_use);
                    if (lay == DS_GATED) {
                        // Four lanes per block; lanes 0..15 take the gate rows, 16..31 the up rows.
                        const int bl = (lane / 4) % 4, c = lane % 4, b = cu.c * 4 + bl, up = lane / 16;
                        mv_q4_kw::Act a;
                        mv_q4_kw::load_act(yv, b, c, a);
    #pragma unroll
                        for (int r = 0; r < 2; ++r)
                            acc[r] += mv_q4_kw::compute(
                                mv_q4_kw::load(tile + (2 * up + r) * 4 * Q4_K_BYTES + bl * Q4_K_BYTES, c), c, a);
                    } else if (lay == DS_Q4) {
                        // Half groups: acc[0] the gate row, acc[1] the up row.
                        const int bl = lane / 4, c = lane % 4, b = cu.c * 8 + bl;
                        if (cu.kind & DS_A16) {
                            act_k4w16 a;
                            load_act_k4w16(yv, b, c, a);
    #pragma unroll
                            for (int r = 0; r < 2; ++r)
                                acc[r] += k4w_compute16(mv_q4_kw::load(tile + r * 8 * Q4_K_BYTES + bl * Q4_K_BYTES, c), c,
                                                        a);
                        } else {
                            mv_q4_kw::Act a;
                            mv_q4_kw::load_act(yv, b, c, a);
    #pragma unroll
                            for (int r = 0; r < 2; ++r)
                                acc[r] += mv_q4_kw::compute(
                                    mv_q4_kw::load(tile + r * 8 * Q4_K_BYTES + bl * Q4_K_BYTES, c), c, a);
                        }
                    } else {
                        const uint8_t* tile2 = ring + st_use + wid * DS_SLOT;
                        st_use = ds_next_stage(st_use);
                        acc[0] += ds_q6_chunk(yv, tile, cu.c, cu.kind & DS_A16, lane) +
                                  ds_q6_chunk(yv, tile2, cu.c + 1, cu.kind & DS_A16, lane);  // row lane / 16
                        __syncwarp();
                        cu.next(end, nq);  // the pair's first chunk, never an item's last
                        ds_issue(is, end, nq, ring_lane + st_put, lane);
                        st_put = ds_next_stage(st_put);
                    }
                }
#endif
                if (cu.c == cu.n - 1) {
                    // Group epilogue, at a group's last chunk: the warps' row sums meet in shared
                    // memory, then phase 0 ropes and stores q, k and v, phase 3 quantizes
                    // act(gate) * up, phases 2 and 4 add the residual and quantize the next input.
                    // Two rows per warp: Q4_K rows in acc[0] and acc[1]; Q6_K row r in acc[0] of
                    // lanes 16r..16r + 15; gated: gate row r in acc[r] of lanes 0..15, up row r
                    // in acc[r] of lanes 16..31; a half group's one gate and one up row in acc[0]
                    // and acc[1].
                    const bool half = cu.kind & DS_HALF;
                    // Phase 0's biases: asked for before the block's barrier, used after it.
                    const bool biased = EXT && k == 0 && (p.qkv & DS_QKV_BIAS) && wid == 0;
                    const float bias = biased ? ds_qkv_bias(p, l, ds_qkv_row<EXT>(cu, lane)) : 0.0f;
                    float up0 = 0.0f, up1 = 0.0f;
                    if (lay == DS_GATED) {
                        acc[0] = warp_sum<16>(acc[0]) * scale;
                        acc[1] = warp_sum<16>(acc[1]) * scale;
                        up0 = rf_shfl_xor(acc[0], 16, 32);
                        up1 = rf_shfl_xor(acc[1], 16, 32);
                    } else if (lay == DS_Q6) {
                        acc[0] = warp_sum<16>(acc[0]) * scale;
                        acc[1] = rf_shfl_xor(acc[0], 16, 32);
                    } else {
                        acc[0] = warp_sum<32>(acc[0]) * scale;
                        acc[1] = warp_sum<32>(acc[1]) * scale;
                    }
                    float* rowv = rowv2[ngrp++ & 1];
                    if (lane == 0) {
                        if (lay == DS_GATED) {
                            rowv[2 * wid] = silu(acc[0]) * up0;
                            rowv[2 * wid + 1] = silu(acc[1]) * up1;
                        } else if (half) {
                            rowv[wid] = silu(acc[0]) * acc[1];
                        } else {
                            rowv[2 * wid] = acc[0];
                            rowv[2 * wid + 1] = acc[1];
                        }
                    }
                    acc[0] = acc[1] = 0.0f;
                    __syncthreads();
                    if (wid == 0) {
                        // A split half's 16 rows: each lane of both halves of the warp takes
                        // row lane % 16, summing the two warps' column halves; lanes < 16 write.
                        const bool split = cu.kind & DS_SPLIT;
                        const int i = split ? lane & 15 : lane;
                        float v = split ? rowv[i] + rowv[i + 16] : rowv[i];
                        const int row = cu.r16 * 16 + i;
                        if (k == 0) {
                            const int nq_rows = p.n_head * DS_HEAD, nk_rows = p.n_head_kv * DS_HEAD;
                            const bool put = !split || lane < 16;
                            const int qr = ds_qkv_row<EXT>(cu, lane);
                            if constexpr (EXT) v += bias;
                            if (qr < nq_rows + nk_rows) {  // whole warps: groups never straddle q, k, v
                                if (EXT && (p.qkv & DS_QKV_NORM)) {
                                    // Normed and roped once the head is whole.
                                    const ds_layer& L = p.layer[l];
                                    ds_qk_norm(p.q, L.kc + pos * p.kv_stride - nq_rows, p.bar, p.qkv_vec[l][0],
                                               p.qkv_vec[l][1], rope_cs, nq_rows, p.eps, p.qkv & DS_QKV_NEOX, qr, v,
                                               split ? 16 : 32, lane);
                                } else {
                                    // The rope: this lane's dim d and its pair's other one, in
                                    // the next lane or the one before, adjacent (normal) or 64
                                    // apart (DS_NEOX).
                                    const int d = qr % DS_HEAD;
                                    const bool neox = EXT && (cu.kind & DS_NEOX);
                                    const float other = rf_shfl_xor(v, 1, 32);
                                    const float2 o = rope_cs[neox ? d % 64 : d / 2];
                                    v = (neox ? d >= 64 : d & 1) ? other * o.y + v * o.x : v * o.x - other * o.y;
                                    if (put && qr < nq_rows) p.q[qr] = v;
                                    else if (put) p.layer[l].kc[pos * p.kv_stride + qr - nq_rows] = __float2half(v);
                                }
                            } else if (put) {
                                p.layer[l].vc[pos * p.kv_stride + qr - nq_rows - nk_rows] = __float2half(v);
                            }
                        } else if (k == 3) {
                            q8_put<16>(v, p.hq, p.n_ff, row, row, !half || lane < 16);
                        } else {
                            v += res;
                            p.x_out[row] = v;
                            const bool last = k == 4 && l + 1 == p.n_layer;
                            if (!last) {
                                q8_1_put(v * nwv, p.xq, p.n_embd, row);
                                const float s2 = warp_sum<32>(v * v);
                                if (lane == 0) atomicAdd(p.ss + (k == 2 ? 2 * l + 1 : 2 * l + 2), s2);
                            }
                        }
                    }
                }
                rf_syncwarp();
                cu.next(end, nq);
                if constexpr (!RING) cur = nxt;
            }
        }
        __syncthreads();
        if (threadIdx.x == 0 && q + 1 < nq) bar_old = ds_barrier_arrive(p);
    }
}

RF_KERNEL void DS_ATTRS decode_stack(ds_params p) {
#if defined(RF_CP_ASYNC)
    ds_step<true, false, false>(p);
#endif
}

// decode_stack with phase 1 split by KV head and share of its keys: the host takes it for long
// contexts (`kernels::STACK_SPLIT_MIN_KV`), where one block per query head leaves most blocks
// idle and reads each KV head's keys once per query head.
RF_KERNEL void DS_ATTRS decode_stack_split(ds_params p) {
#if defined(RF_CP_ASYNC)
    ds_step<true, true, false>(p);
#endif
}

// The portable variant (AMD, and NVIDIA on request): no inline assembly, the weights streamed
// through registers (stream.h), the grid barrier by volatile loads and fences.
RF_KERNEL void DS_ATTRS decode_stack_portable(ds_params p) { ds_step<false, false, false>(p); }

// Both for layers with ds_params::qkv flags (EXT: Qwen2's biases, NeoX rope, Qwen3's q/k norms),
// as kernels of their own: the llama kernels' code and register allocation stay as they were
// (the q/k norms raised decode_stack to 128 registers, see kernels/PERF.md).
RF_KERNEL void DS_ATTRS decode_stack_qkv(ds_params p) {
#if defined(RF_CP_ASYNC)
    ds_step<true, false, true>(p);
#endif
}

RF_KERNEL void DS_ATTRS decode_stack_portable_qkv(ds_params p) { ds_step<false, false, true>(p); }

// The output head (or any tall Q6_K mat-vec over one Q8_1 vector): out[r] = w[r] . y, with
// decode_stack's weight streaming. One block per multiprocessor takes the 32-row groups b,
// b + grid, ...; each warp streams its two rows of a group through its own cp.async ring, the
// ring running on from group to group, and writes their sums itself (no block barrier after the
// input's fetch). The per-op mat-vec reached 64% of the H200's peak DRAM throughput here: its
// blocks come in waves of four warps, each warp waiting on its own loads.
// `nrows` a multiple of 32, `ncols` of 2048 (whole Q6_K chunk pairs, 16-byte aligned rows),
// at most DS_MAX_ITEMS groups per block (the host checks).
RF_KERNEL void DS_ATTRS head_q6_k(const uint8_t* w, const uint8_t* y, float* out, int ncols, long long row_bytes,
                                  int out_stride, int nrows) {
#if defined(RF_CP_ASYNC)
    (void)out_stride;  // one vector
    extern __shared__ __align__(16) uint8_t sm[];
    uint8_t* ring = sm;
    ds_item* items = reinterpret_cast<ds_item*>(sm + DS_STAGES * DS_TILE);
    uint8_t* act = sm + DS_STAGES * DS_TILE + DS_MAX_ITEMS * sizeof(ds_item);
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32, b = (int)blockIdx.x, ng = nrows / 32;
    const int ni = b < ng ? min((ng - 1 - b) / (int)gridDim.x + 1, DS_MAX_ITEMS) : 0;
    for (int i = threadIdx.x; i < ni; i += DS_THREADS) {
        const int g = b + i * (int)gridDim.x;
        ds_item t;
        t.w = w + (long long)g * 32 * row_bytes;
        t.w2 = t.w + row_bytes;
        t.rb = (int)row_bytes;
        t.q = 0;
        t.r16 = (short)(2 * g);
        t.kind = DS_Q6;
        t.n = (unsigned char)(ncols / QK_K / 4);
        items[i] = t;
    }
    __syncthreads();
    const ds_item* end = items + ni;
    ds_cursor is, cu;
    is.first(items, end, 1);
    cu = is;
    const uint32_t ring_lane = (uint32_t)__cvta_generic_to_shared(ring) + wid * DS_SLOT + lane * 16;
    for (int s = 0; s < DS_STAGES - 1; ++s) ds_issue(is, end, 1, ring_lane + s * DS_TILE, lane);
    rf_entry();
    ds_fetch(y, act, ncols, q8_vec_bytes(ncols), threadIdx.x);
    __syncthreads();
    const q8_vec yv{act, act + ncols};
    uint32_t st_use = 0, st_put = (DS_STAGES - 1) * DS_TILE;
    float acc = 0.0f;
    while (cu.q == 0) {
        // Chunks two at a time, as decode_stack's Q6_K products take them.
        ds_issue(is, end, 1, ring_lane + st_put, lane);
        st_put = ds_next_stage(st_put);
        cp_async_wait<DS_STAGES - 2>();
        __syncwarp();
        const uint8_t* tile = ring + st_use + wid * DS_SLOT;
        st_use = ds_next_stage(st_use);
        const uint8_t* tile2 = ring + st_use + wid * DS_SLOT;
        st_use = ds_next_stage(st_use);
        // Row lane / 16 of the warp's two.
        acc += ds_q6_chunk(yv, tile, cu.c, false, lane) + ds_q6_chunk(yv, tile2, cu.c + 1, false, lane);
        __syncwarp();
        cu.next(end, 1);  // the pair's first chunk, never an item's last
        ds_issue(is, end, 1, ring_lane + st_put, lane);
        st_put = ds_next_stage(st_put);
        if (cu.c == cu.n - 1) {
            acc = warp_sum<16>(acc);
            if ((lane & 15) == 0) out[cu.r16 * 16 + 2 * wid + lane / 16] = acc;
            acc = 0.0f;
        }
        __syncwarp();
        cu.next(end, 1);
    }
#endif
}
