// A one-shot all-reduce of small f32 messages between the GPUs of one process, over peer memory
// (NVLink, xGMI or PCIe peer to peer): each rank runs one launch of all_reduce_peer_f32 on its own
// stream, with the same grid and message length on every rank.
//
// Every rank owns, in its own device memory, an exchange buffer of two phases and a sync area
// (flags written by the peers, per-block epochs, both zeroed once at set-up); `ar_params` holds
// every rank's addresses. Block b of a launch:
//   1. takes the next epoch (its counter + 1; phase = epoch & 1) and copies its slice of the
//      message into this rank's exchange buffer, phase `phase`;
//   2. makes the copy visible system-wide and writes `epoch` into its flag slot at every rank;
//   3. waits until every rank's flag slot here holds `epoch` or later (bounded: on timeout it sets
//      the error word and leaves the message as it was);
//   4. sums the slice over every rank's exchange buffer in rank order, so every rank writes the
//      same bytes, and stores its new epoch.
// The epochs live in device memory, so a captured graph's replays count on. Two phases suffice:
// a rank reuses a phase two launches later only after every peer's flag for the launch between,
// which a peer writes only after its previous launch (the one reading that phase) ended. A flag
// may run one epoch ahead of the waiter (a fast peer already in the next launch), hence "or
// later". Block b waits only for block b of the peers, so the grid must be the same on every
// rank and every launch (AR_BLOCKS), and all blocks of a launch fit on the device at once. A
// message of n floats takes the first ceil(n / AR_MIN_FLOATS) blocks (the same on every rank);
// the rest only advance their epochs, so the phase stays one per launch: a phase is rewritten
// two launches later only after block 0 (active in every launch) of each peer signalled the
// launch between, which a peer starts only after its launch reading that phase ended.
#include "common.h"

// Most ranks (`PEER_MAX_RANKS` in the kernels crate).
#define AR_MAX_RANKS 8
// Blocks of every launch and threads per block (`PEER_BLOCKS`, `PEER_THREADS`).
#define AR_BLOCKS 32
#define AR_THREADS 512
#define AR_BOUND RF_AMD_BOUNDS(AR_THREADS)
// Floats per block below which a message takes fewer blocks (`PEER_MIN_FLOATS`).
#define AR_MIN_FLOATS 512
// The sync area of a rank, in 32-bit words: flags [AR_BLOCKS][AR_MAX_RANKS], then the epochs
// [AR_BLOCKS] (`PEER_SYNC_WORDS`).
#define AR_SYNC_WORDS (AR_BLOCKS * AR_MAX_RANKS + AR_BLOCKS)

// The peer table, passed by value (`PeerReduceParams` in the kernels crate; no implicit padding).
struct ar_params {
    // Device addresses of every rank's exchange buffer (2 phases of `phase_floats` floats) and
    // sync area, indexed by rank.
    unsigned long long bufs[AR_MAX_RANKS];
    unsigned long long sync[AR_MAX_RANKS];
    // A 32-bit word the host reads (mapped host memory): nonzero once a wait timed out.
    unsigned long long error;
    // How long a block waits for its peers, in nanoseconds.
    long long timeout_ns;
    int rank;
    int world;
    // Floats per phase (a multiple of 4, at least the message length).
    int phase_floats;
    int pad;
};

// Nanoseconds since some fixed point. NVIDIA: the global timer. AMD: the constant-rate wall
// clock, which ticks at 100 MHz on the GPUs ROCm supports (hipDeviceAttributeWallClockRate).
static __device__ __forceinline__ long long ar_now_ns() {
#if defined(RF_NVIDIA)
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return (long long)t;
#else
    return (long long)wall_clock64() * 10;
#endif
}

// A load of a flag a peer writes while this block polls: from L2/memory, never a cached copy.
static __device__ __forceinline__ unsigned ar_poll(const unsigned* p) {
    return *(const volatile unsigned*)p;
}

// 16 bytes another GPU wrote before its flag: fetched again rather than from this multiprocessor's
// L1 (NVIDIA); on AMD the system-scope fence after the wait invalidated the vector caches.
static __device__ __forceinline__ float4 ar_load4(const float* p) {
#if defined(RF_NVIDIA)
    return __ldcv((const float4*)p);
#else
    return *(const float4*)p;
#endif
}

static __device__ __forceinline__ float ar_load(const float* p) {
#if defined(RF_NVIDIA)
    return __ldcv(p);
#else
    return *p;
#endif
}

RF_KERNEL void AR_BOUND all_reduce_peer_f32(float* x, int n, ar_params p) {
    rf_entry();
    __shared__ unsigned s_epoch;
    __shared__ int s_late;
    const int b = blockIdx.x;
    const int t = threadIdx.x;
    unsigned* own = (unsigned*)p.sync[p.rank];
    unsigned* epochs = own + AR_BLOCKS * AR_MAX_RANKS;
    if (t == 0) {
        s_epoch = epochs[b] + 1u;
        s_late = 0;
    }
    __syncthreads();
    const unsigned epoch = s_epoch;
    const int phase = (int)(epoch & 1u);
    // A small message takes fewer blocks (fewer flags to exchange); the others only count the
    // call, so that every block's epoch, and with it the phase, stays the same.
    const int active = min(AR_BLOCKS, (n + AR_MIN_FLOATS - 1) / AR_MIN_FLOATS);
    if (b >= active) {
        if (t == 0) epochs[b] = epoch;
        return;
    }
    // Block b's slice: whole float4s, so every slice but the last starts 16-byte aligned.
    const int per = (((n + active - 1) / active) + 3) & ~3;
    const int lo = min(n, b * per);
    const int hi = min(n, lo + per);
    const bool vec = ((unsigned long long)x & 15ull) == 0;
    const int vhi = vec ? lo + ((hi - lo) & ~3) : lo;
    float* mine = (float*)p.bufs[p.rank] + (long long)phase * p.phase_floats;

    for (int i = lo + 4 * t; i < vhi; i += 4 * AR_THREADS) *(float4*)(mine + i) = *(const float4*)(x + i);
    for (int i = vhi + t; i < hi; i += AR_THREADS) mine[i] = x[i];
    // The block's copies, ordered before the signalling threads' system-scope fences by the
    // barrier (as a cooperative grid barrier orders a block's writes before its arrival).
    __syncthreads();

    if (t < p.world) {
        __threadfence_system();
        unsigned* flag = (unsigned*)p.sync[t] + b * AR_MAX_RANKS + p.rank;
        atomicExch_system(flag, epoch);
        const unsigned* got = own + b * AR_MAX_RANKS + t;
        const long long start = ar_now_ns();
        unsigned polls = 0;
        while ((int)(ar_poll(got) - epoch) < 0) {
            // The clock is read every 64 polls only: polling the flag is the fast path.
            if ((++polls & 63u) == 0 && ar_now_ns() - start > p.timeout_ns) {
                s_late = 1;
                break;
            }
        }
        // Orders the reads of the peer's buffer below after its flag.
        __threadfence_system();
    }
    __syncthreads();

    if (s_late) {
        if (t == 0) {
            atomicOr_system((unsigned*)p.error, 1u);
            epochs[b] = epoch;
        }
        return;
    }
    for (int i = lo + 4 * t; i < vhi; i += 4 * AR_THREADS) {
        float4 s = ar_load4((const float*)p.bufs[0] + (long long)phase * p.phase_floats + i);
        for (int r = 1; r < p.world; ++r) {
            const float4 v = ar_load4((const float*)p.bufs[r] + (long long)phase * p.phase_floats + i);
            s.x += v.x;
            s.y += v.y;
            s.z += v.z;
            s.w += v.w;
        }
        *(float4*)(x + i) = s;
    }
    for (int i = vhi + t; i < hi; i += AR_THREADS) {
        float s = ar_load((const float*)p.bufs[0] + (long long)phase * p.phase_floats + i);
        for (int r = 1; r < p.world; ++r) s += ar_load((const float*)p.bufs[r] + (long long)phase * p.phase_floats + i);
        x[i] = s;
    }
    if (t == 0) epochs[b] = epoch;
}
