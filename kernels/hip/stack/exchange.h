// What crosses a grid barrier: the barrier itself (ds_barrier_arrive, ds_barrier_wait), a
// phase's Q8 input fetched from L2 into shared memory (ds_fetch), and the L2 prefetch of the next
// gate/up items during attention.
// Included by stack.hip after items.h (and ring.h); not a unit of its own.
#pragma once

// A load of data another block wrote before a grid barrier. NVIDIA: from L2 (__ldcg), since a
// multiprocessor's L1 may hold lines another one has since rewritten. AMD: a plain load, the
// barrier's agent-scope acquire having invalidated the compute unit's vector cache.
template <typename T>
static __device__ __forceinline__ T ds_ldcg(const T* p) {
#if defined(RF_NVIDIA)
    return __ldcg(p);
#else
    return *p;
#endif
}

#if defined(RF_NVIDIA)
static __device__ __forceinline__ unsigned ds_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
#endif

// The grid barrier, one thread per block. Arriving: block 0 adds 2^31 - (grid - 1), the others
// 1, so the counter's top bit flips when the last block arrives; returns the value before.
static __device__ __forceinline__ unsigned ds_barrier_arrive(const ds_params& p) {
    __threadfence();
    return atomicAdd(p.bar, blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u);
}

// Waiting: until the top bit differs from the value this block's arrival saw. The acquire load
// orders this block's reads after the other blocks' writes.
#if defined(RF_NVIDIA)
static __device__ __forceinline__ void ds_barrier_wait(const unsigned* bar, unsigned old) {
    while (((old ^ ds_ld_acquire(bar)) & 0x80000000u) == 0) {
    }
}
#endif

// The same without inline assembly (decode_stack_portable): volatile loads, which reach the
// device-coherent level on both vendors (L2; on AMD they bypass the vector cache), then a
// device-scope fence, which orders this block's later reads after them and on AMD invalidates
// the compute unit's cache.
static __device__ __forceinline__ void ds_barrier_wait_portable(const unsigned* bar, unsigned old) {
    while (((old ^ *reinterpret_cast<const volatile unsigned*>(bar)) & 0x80000000u) == 0) {
    }
    __threadfence();
}

// Asks for the rows of the first `ng` work items of phase q (from `it` on) into L2, one request
// per 128-byte line spread over the block's threads. The blocks without a head run this during
// phase 1, while the weight streams stand still (kernels/PERF.md, decode stack).
static __device__ __forceinline__ void ds_prefetch_items(const ds_item* it, const ds_item* end, int q, int ng,
                                                         int tid) {
    for (; it < end && it->q < q; ++it) {
    }
    for (int j = 0; j < ng && it < end && it->q == q; ++j, ++it) {
        const ds_item t = *it;
        const int bytes = (t.kind & DS_HALF ? 16 : 32) * t.rb;  // rows from t.w (gate) and t.w2 (up)
        for (int o = tid * 128; o < bytes; o += DS_THREADS * 128) {
            rf_prefetch_l2(t.w + o);
            rf_prefetch_l2(t.w2 + o);
        }
    }
}

// Copies a Q8 vector of `ncols` values (`bytes` with its scales) from L2 into shared memory, its
// values' 16-byte pieces permuted by act_swz (see qdot.h), four 16-byte loads per thread in
// flight. `tid`: threadIdx.x (see ds_step on why it is passed).
template <bool ZERO = false>
static __device__ __forceinline__ void ds_fetch(const uint8_t* src, uint8_t* dst, int ncols, size_t bytes, int tid) {
    const int n = (int)bytes / 16, nq = ncols / 16;
    for (int base = 0; base < n; base += 4 * DS_THREADS) {
        rf_b128 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * DS_THREADS + tid;
            if (ZERO) v[j] = i < n ? ds_ldcg(reinterpret_cast<const rf_b128*>(src) + i) : rf_b128{};
            else if (i < n) v[j] = ds_ldcg(reinterpret_cast<const rf_b128*>(src) + i);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * DS_THREADS + tid;
            if (i < n) reinterpret_cast<rf_b128*>(dst)[i < nq ? act_swz(i) : i] = v[j];
        }
    }
}
