// Batched quantized matrix products ("MMQ"): a weight matrix in a ggml block format times 2..256
// activation vectors quantized to planar Q8_1 (the mat-vecs' layout, see common.h), with integer
// dot products on tiles staged in shared memory.
//
// A block computes a tile of MMQ_ROWS weight rows x NT activation vectors (NT = 16, 32 or 64: one
// kernel each, `mmq_<type>_<NT>`) over a range of 256-value steps of the rows. Per step it
//   - converts each row's 256 values into a common form in shared memory: signed 8-bit values
//     with one float scale `dw` per group of G values (G = 32, or 16 for the K-quants whose
//     sub-scales cover 16 values), plus for the types whose values carry an additive minimum a
//     float `mw` per group, which multiplies the activations' sums of that group;
//   - copies the NT vectors' 256 quantized values and their scales (and group sums) next to it;
//   - each thread accumulates MMQ_RM rows x NT / 16 vectors: per group, the 8-bit dot products
//     (dot4_i8: dp4a on NVIDIA, sdot4 or a byte loop on AMD) of G values, then
//     dw * d_act * dot (+ mw * sum_act) in f32.
// On NVIDIA compute capability 8.0 and later the products run on the tensor cores instead
// (MMQ_MMA, `mmq_tile_mma`): each warp multiplies 16 staged weight rows by NT / 16 tiles of 8
// vectors with mma.sync m16n8k32 (signed 8-bit, 32-bit sums), one per 32 values, and applies the
// group scales to the integer sums in the same place as above; 16-value groups take two products
// with the other half of the vectors' values zeroed. The staging is the same for both; there,
// each step's weight bytes are copied as they lie into a ring of shared-memory slots by cp.async
// (`mmq_ring`, `mmq_issue`; dynamic shared memory of MMQ_SMEM_<NT> bytes) up to MMQ_RING_MAX steps
// ahead, and L2 prefetches run MMQ_PF_AHEAD steps further, so that a block's next loads are in
// flight while it converts and multiplies.
// Staged vectors are MMQ_LD words apart (16-byte aligned, 4 mod 32 words), so lanes read 4 words
// at once and the 8 vectors that a quarter-warp's 16-byte reads at one offset touch fall in 8
// different 4-bank groups; the lanes of a quarter-warp read one staged weight row. Nothing
// depends on the warp size: the block's 256 threads split the tile by thread index and
// synchronize with __syncthreads.
//
// Grid: x = tiles of NT vectors (fastest, so the blocks sharing a weight tile run together and
// read it from L2), y = tiles of MMQ_ROWS rows, z = matrix x split: with `part` null the block
// covers all steps of `w0` and writes out (+ bias); otherwise blocks z = mat * splits + s cover
// the s-th share of the steps of matrix mat (w0 or w1) and write f32 partial results to
// part[(z * m + vector) * nrows + row], which `mmq_combine` adds up (in split order, so every
// run gives the same sums) with the bias or the gated activation.
#include "qdot.h"

#define MMQ_THREADS 256
#define MMQ_ROWS 64
#define MMQ_KT 256
#define MMQ_TN 16                          // threads across a tile's vectors
#define MMQ_TM (MMQ_THREADS / MMQ_TN)      // threads across its rows
#define MMQ_RM (MMQ_ROWS / MMQ_TM)         // rows per thread
#define MMQ_LD (MMQ_KT / 4 + 4)            // words per staged vector (see above)

#if defined(RF_NVIDIA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define MMQ_MMA 1
#endif

// Word w of staged weight row r is stored at word mmq_swz(r, w). The mma fragments' lanes (g, t)
// read word t (+ 4c) of rows g and g + 8 at once: swapping 16-byte pieces by the row's low three
// bits puts those 8 rows x 4 words in 32 different banks without padding (which Q2_K's 64-vector
// tile has no room for). The dp4a path reads one row per quarter-warp and stores rows as they are.
static __device__ __forceinline__ int mmq_swz(int r, int w) {
#if defined(MMQ_MMA)
    return w ^ ((r & 7) << 2);
#else
    (void)r;
    return w;
#endif
}

// A register budget of MINB resident blocks per multiprocessor; on AMD only the block size is
// bounded, as the second argument of __launch_bounds__ means something else there.
#if defined(RF_NVIDIA)
#define MMQ_LB(minb) __launch_bounds__(MMQ_THREADS, minb)
#else
#define MMQ_LB(minb) __launch_bounds__(MMQ_THREADS)
#endif

// Bytes minus c in every byte, for bytes >= c (no borrow crosses a byte).
static __device__ __forceinline__ int mmq_sub_bytes(uint32_t v, uint32_t c) {
    return (int)(((v | 0x80808080u) - c * 0x01010101u) ^ 0x80808080u);
}

static __device__ __forceinline__ uint32_t ld4_a2(const uint8_t* p) { return (uint32_t)ld_i32_a2(p); }
static __device__ __forceinline__ uint32_t ld4_a4(const uint8_t* p) { return (uint32_t)ld_i32_a4(p); }

// Per type: QK values per block, BYTES per block, G values per scale group, MIN whether groups
// carry a minimum. `unit(blk, j, q, d, m)` converts sub-block j (32 values; j = 0 for 32-value
// blocks, 0..7 of a 256-value super-block) into 8 words of signed bytes `q` (values 4w..4w+3 in
// word w), its 32 / G group scales `d` and (MIN) minimums `m`: value i = d[g] q[i] + m[g].

struct mq_q4_0 {
    static constexpr int QK = 32, BYTES = Q4_0_BYTES, G = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const uint8_t* b, int, int* q, float* d, float*) {
        d[0] = ld_f16(b);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t x = ld4_a2(b + 2 + 4 * w);
            q[w] = mmq_sub_bytes(x & 0x0F0F0F0Fu, 8);
            q[w + 4] = mmq_sub_bytes((x >> 4) & 0x0F0F0F0Fu, 8);
        }
    }
};

struct mq_q4_1 {
    static constexpr int QK = 32, BYTES = Q4_1_BYTES, G = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(const uint8_t* b, int, int* q, float* d, float* m) {
        d[0] = ld_f16(b);
        m[0] = ld_f16(b + 2);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t x = ld4_a4(b + 4 + 4 * w);
            q[w] = (int)(x & 0x0F0F0F0Fu);
            q[w + 4] = (int)((x >> 4) & 0x0F0F0F0Fu);
        }
    }
};

// The 5-bit values of a Q5_0/Q5_1 block: `qh` bit i is the fifth bit of value i.
static __device__ __forceinline__ void mmq_nib5(const uint8_t* qs, uint32_t qh, uint32_t off, int* q) {
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const uint32_t x = ld4_a2(qs + 4 * w);
        const uint32_t lo = (x & 0x0F0F0F0Fu) | (uint32_t)spread_bit4((qh >> (4 * w)) & 0xF);
        const uint32_t hi = ((x >> 4) & 0x0F0F0F0Fu) | (uint32_t)spread_bit4((qh >> (16 + 4 * w)) & 0xF);
        q[w] = mmq_sub_bytes(lo, off);
        q[w + 4] = mmq_sub_bytes(hi, off);
    }
}

struct mq_q5_0 {
    static constexpr int QK = 32, BYTES = Q5_0_BYTES, G = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const uint8_t* b, int, int* q, float* d, float*) {
        d[0] = ld_f16(b);
        mmq_nib5(b + 6, ld4_a2(b + 2), 16, q);
    }
};

struct mq_q5_1 {
    static constexpr int QK = 32, BYTES = Q5_1_BYTES, G = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(const uint8_t* b, int, int* q, float* d, float* m) {
        d[0] = ld_f16(b);
        m[0] = ld_f16(b + 2);
        mmq_nib5(b + 8, ld4_a4(b + 4), 0, q);
    }
};

struct mq_q8_0 {
    static constexpr int QK = 32, BYTES = Q8_0_BYTES, G = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const uint8_t* b, int, int* q, float* d, float*) {
        d[0] = ld_f16(b);
#pragma unroll
        for (int w = 0; w < 8; ++w) q[w] = (int)ld4_a2(b + 2 + 4 * w);
    }
};

// Q2_K: sub-block j = 4n + jj is bits 2jj of qs[32n + l] (l = 0..31); group h of it (16
// values) has scale/min byte 8n + 2jj + h (scale low nibble, min high nibble).
struct mq_q2_k {
    static constexpr int QK = QK_K, BYTES = Q2_K_BYTES, G = 16;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(const uint8_t* b, int j, int* q, float* d, float* m) {
        const int n = j >> 2, jj = j & 3;
        const float dd = ld_f16(b + 80), dm = ld_f16(b + 82);
#pragma unroll
        for (int w = 0; w < 8; ++w) q[w] = (int)((ld4_a4(b + 16 + 32 * n + 4 * w) >> (2 * jj)) & 0x03030303u);
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int s = b[8 * n + 2 * jj + h];
            d[h] = dd * (float)(s & 0xF);
            m[h] = -dm * (float)(s >> 4);
        }
    }
};

// Q3_K: sub-block j = 4n + jj: low bits 2jj of qs[32n + l] (from byte 32), high bit 4n + jj of
// hmask[l] (set: no -4); signed 6-bit scale 8n + 2jj + h per 16 values; d at 108.
struct mq_q3_k {
    static constexpr int QK = QK_K, BYTES = Q3_K_BYTES, G = 16;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const uint8_t* b, int j, int* q, float* d, float*) {
        const int n = j >> 2, jj = j & 3;
        const float dd = ld_f16(b + 108);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const uint32_t lo = (ld4_a2(b + 32 + 32 * n + 4 * w) >> (2 * jj)) & 0x03030303u;
            const uint32_t hb = (ld4_a2(b + 4 * w) >> (4 * n + jj)) & 0x01010101u;
            q[w] = mmq_sub_bytes(lo | (hb << 2), 4);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) d[h] = dd * (float)scale_q3_k(b + 96, 8 * n + 2 * jj + h);
    }
};

// Q4_K: sub-block j is the low (j even) or high nibbles of qs[32 (j / 2) + l]; 6-bit scale and
// min per sub-block.
struct mq_q4_k {
    static constexpr int QK = QK_K, BYTES = Q4_K_BYTES, G = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(const uint8_t* b, int j, int* q, float* d, float* m) {
        int sc, mn;
        scale_min_k4(j, b + 4, sc, mn);
        d[0] = ld_f16(b) * (float)sc;
        m[0] = -ld_f16(b + 2) * (float)mn;
        const int sh = 4 * (j & 1);
        // 144-byte blocks: 16-byte aligned (as the mat-vecs read them).
        const int4 v0 = ld_b128(b + 16 + 32 * (j >> 1)), v1 = ld_b128(b + 32 + 32 * (j >> 1));
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            q[w] = (int)(((uint32_t)word(v0, w) >> sh) & 0x0F0F0F0Fu);
            q[w + 4] = (int)(((uint32_t)word(v1, w) >> sh) & 0x0F0F0F0Fu);
        }
    }
};

// Q5_K: as Q4_K (nibbles from byte 48) with the fifth bit j of qh[l] (from byte 16).
struct mq_q5_k {
    static constexpr int QK = QK_K, BYTES = Q5_K_BYTES, G = 32;
    static constexpr bool MIN = true;
    static __device__ __forceinline__ void unit(const uint8_t* b, int j, int* q, float* d, float* m) {
        int sc, mn;
        scale_min_k4(j, b + 4, sc, mn);
        d[0] = ld_f16(b) * (float)sc;
        m[0] = -ld_f16(b + 2) * (float)mn;
        const int sh = 4 * (j & 1);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const uint32_t lo = (ld4_a4(b + 48 + 32 * (j >> 1) + 4 * w) >> sh) & 0x0F0F0F0Fu;
            const uint32_t hb = (ld4_a4(b + 16 + 4 * w) >> j) & 0x01010101u;
            q[w] = (int)(lo | (hb << 4));
        }
    }
};

// Q6_K: sub-block j = 4n + jj: the low (jj < 2) or high nibbles of ql[64n + 32 (jj & 1) + l], two
// bits 2jj of qh[32n + l] (from byte 128) on top, minus 32; signed 8-bit scale 8n + 2jj + h per
// 16 values (from byte 192); d at 208.
struct mq_q6_k {
    static constexpr int QK = QK_K, BYTES = Q6_K_BYTES, G = 16;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const uint8_t* b, int j, int* q, float* d, float*) {
        const int n = j >> 2, jj = j & 3;
        const float dd = ld_f16(b + 208);
        const int sh = 4 * (jj >> 1);
#pragma unroll
        for (int w = 0; w < 8; ++w) {
            const uint32_t lo = (ld4_a2(b + 64 * n + 32 * (jj & 1) + 4 * w) >> sh) & 0x0F0F0F0Fu;
            const uint32_t hi = (ld4_a2(b + 128 + 32 * n + 4 * w) >> (2 * jj)) & 0x03030303u;
            q[w] = mmq_sub_bytes(lo | (hi << 4), 32);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) d[h] = dd * (float)(int8_t)b[192 + 8 * n + 2 * jj + h];
    }
};

// Shared memory of one block for type T (47.5 KB at most: Q2_K).
template <typename T, int NT>
struct __align__(16) mmq_smem {
    static constexpr int NG = MMQ_KT / T::G;  // scale groups per step
    int qw[MMQ_ROWS][MMQ_KT / 4];  // words swizzled by mmq_swz
    float dw[MMQ_ROWS][NG];
    float mw[MMQ_ROWS][T::MIN ? NG : 1];
    int qa[NT][MMQ_LD];
    float da[NT][MMQ_KT / 32 + 1];
    float sa[NT][T::MIN ? NG + 1 : 1];
};

// Bytes of one weight row per step, and the pitch of a row's copy in a staging ring slot: the
// 16-byte pieces that cover the step's bytes at any address alignment (one more than the bytes
// need when they start mid-piece), so that the copy keeps every byte's address modulo 16 and
// the `unit` readers' aligned loads stay aligned.
template <typename T>
struct mmq_raw {
    static constexpr int SB = (T::QK == 32 ? MMQ_KT / 32 : 1) * T::BYTES;
    static constexpr int PIECES = (SB + 30) / 16;
    static constexpr int RS = 16 * PIECES;
};

// A thread's share of one step's activations (NT vectors x 16 pieces of 16 values), held in
// registers between their loads and their stores to shared memory.
template <int NT>
struct mmq_act {
    static constexpr int AP = (NT * 16 + MMQ_THREADS - 1) / MMQ_THREADS;  // pieces per thread
    int4 v[AP];
    uint32_t ds[AP];  // the half2 (d, d * sum) of the piece's 32 values
};

// Loads this thread's share of step kc of the NT vectors col0.. of `y` (zeros past m or k):
// NA / 16 pieces from p0 on (piece i is the tile's (p0 + i) * MMQ_THREADS + threadIdx.x).
template <int NT, int NA = NT>
static __device__ __forceinline__ void mmq_act_load(mmq_act<NA>& a, const uint8_t* __restrict__ y, int kc, int k,
                                                    int m, int col0, int p0 = 0) {
    const size_t vb = q8_vec_bytes(k);
#pragma unroll
    for (int i = 0; i < mmq_act<NA>::AP; ++i) {
        const int p = threadIdx.x + (p0 + i) * MMQ_THREADS;
        const int c = p >> 4, piece = p & 15;
        const int v0 = kc * MMQ_KT + 16 * piece;  // first value
        a.v[i] = make_int4(0, 0, 0, 0);
        a.ds[i] = 0;
        if (p < NT * 16 && col0 + c < m && v0 < k) {
            const uint8_t* yv = y + (size_t)(col0 + c) * vb;
            a.v[i] = ld_b128(yv + v0);
            a.ds[i] = *reinterpret_cast<const uint32_t*>(yv + k + 4 * (v0 / 32));
        }
    }
}

// Stores loaded activations (as mmq_act_load left them) to the staging: values, scales and
// (types with minimums) group sums.
template <typename T, int NT, int NA = NT>
static __device__ __forceinline__ void mmq_act_store(mmq_smem<T, NT>& s, const mmq_act<NA>& av, int p0 = 0) {
#pragma unroll
    for (int i = 0; i < mmq_act<NA>::AP; ++i) {
        const int p = threadIdx.x + (p0 + i) * MMQ_THREADS;
        if (p >= NT * 16) break;
        const int c = p >> 4, piece = p & 15;
        const int4 a = av.v[i];
        const float d = lo_f16(av.ds[i]), sum = hi_f16(av.ds[i]);
        *reinterpret_cast<int4*>(&s.qa[c][4 * piece]) = a;
        if ((piece & 1) == 0) s.da[c][piece >> 1] = d;
        if (T::MIN) {
            if (T::G == 16) {
                int t = dot4_i8(a.x, 0x01010101, 0);
                t = dot4_i8(a.y, 0x01010101, t);
                t = dot4_i8(a.z, 0x01010101, t);
                t = dot4_i8(a.w, 0x01010101, t);
                s.sa[c][piece] = d * (float)t;
            } else if ((piece & 1) == 0) {
                s.sa[c][piece >> 1] = sum;
            }
        }
    }
}

// Converts step `kc` of rows row0.. of `w` into the staging. With RAW the weight bytes are read
// from `raw` (MMQ_ROWS rows mmq_raw<T>::RS apart, copied there by mmq_issue) instead of from
// `w`; the values staged are the same.
template <typename T, int NT, bool RAW = false>
static __device__ __forceinline__ void mmq_stage_w(mmq_smem<T, NT>& s, const uint8_t* __restrict__ w, int kc, int k,
                                                   long long row_bytes, int nrows, int row0,
                                                   const uint8_t* raw = nullptr) {
    constexpr int GPS = 32 / T::G;  // groups per sub-block
    const int tid = threadIdx.x;
    const int nblk = k / T::QK;
    // MMQ_ROWS rows x 8 sub-blocks of 32 values. From global memory every load is issued before
    // the first conversion; from the ring (shared memory, short latency) one sub-block at a time
    // keeps registers free.
    constexpr int WU = MMQ_ROWS * 8 / MMQ_THREADS, WUNROLL = RAW ? 1 : WU;
#pragma unroll WUNROLL
    for (int i = 0; i < WU; ++i) {
        const int u = tid + i * MMQ_THREADS;
        const int r = u >> 3, j = u & 7;
        const uint8_t* wr = w + (long long)min(row0 + r, nrows - 1) * row_bytes;
        // The step's first byte, in the ring slot or in the matrix.
        const uint8_t* ws = wr + (long long)kc * mmq_raw<T>::SB;
        if (RAW) ws = raw + r * mmq_raw<T>::RS + (int)(reinterpret_cast<uintptr_t>(ws) & 15);
        int q[8];
        float d[GPS], mn[GPS];
        bool ok;
        if (T::QK == 32) {
            const int blk = kc * 8 + j;
            ok = blk < nblk;
            if (ok) T::unit(ws + j * T::BYTES, 0, q, d, mn);
        } else {
            ok = true;
            T::unit(ws, j, q, d, mn);
        }
        *reinterpret_cast<int4*>(&s.qw[r][mmq_swz(r, 8 * j)]) = ok ? make_int4(q[0], q[1], q[2], q[3])
                                                                   : make_int4(0, 0, 0, 0);
        *reinterpret_cast<int4*>(&s.qw[r][mmq_swz(r, 8 * j + 4)]) = ok ? make_int4(q[4], q[5], q[6], q[7])
                                                                       : make_int4(0, 0, 0, 0);
#pragma unroll
        for (int h = 0; h < GPS; ++h) {
            s.dw[r][GPS * j + h] = ok ? d[h] : 0.0f;
            if (T::MIN) s.mw[r][GPS * j + h] = ok ? mn[h] : 0.0f;
        }
    }
}

// Stages step `kc` of rows row0.. of `w` and of vectors col0.. of `y` (NT of them); the
// activations' loads are issued first, so that they are under way while the weights are
// converted.
template <typename T, int NT>
static __device__ __forceinline__ void mmq_stage(mmq_smem<T, NT>& s, const uint8_t* __restrict__ w,
                                                 const uint8_t* __restrict__ y, int kc, int k, long long row_bytes,
                                                 int nrows, int m, int row0, int col0) {
    mmq_act<NT> av;
    mmq_act_load<NT>(av, y, kc, k, m, col0);
    mmq_stage_w<T, NT>(s, w, kc, k, row_bytes, nrows, row0);
    mmq_act_store<T, NT>(s, av);
}

// One tile of vectors col0..: RN = NT / 16 vectors per thread.
template <typename T, int NT>
static __device__ __forceinline__ void mmq_tile(mmq_smem<T, NT>& s, const uint8_t* __restrict__ w,
                                                const float* __restrict__ bias, const uint8_t* __restrict__ y,
                                                float* __restrict__ out, float* __restrict__ part, int k,
                                                long long row_bytes, int out_stride, int nrows, int m,
                                                int splits, int col0) {
    constexpr int RN = NT / MMQ_TN;
    constexpr int NG = mmq_smem<T, NT>::NG;
    constexpr int GW = T::G / 4;  // words per group
    const int tr = threadIdx.x / MMQ_TN, tc = threadIdx.x % MMQ_TN;
    const int row0 = blockIdx.y * MMQ_ROWS;
    const int nch = (k + MMQ_KT - 1) / MMQ_KT;
    int kc0 = 0, kc1 = nch;
    if (part) {
        const int sp = blockIdx.z % splits, per = (nch + splits - 1) / splits;
        kc0 = min(nch, sp * per);
        kc1 = min(nch, kc0 + per);
    }
    float acc[MMQ_RM][RN];
#pragma unroll
    for (int r = 0; r < MMQ_RM; ++r)
#pragma unroll
        for (int c = 0; c < RN; ++c) acc[r][c] = 0.0f;
    for (int kc = kc0; kc < kc1; ++kc) {
        __syncthreads();  // the previous step's reads are done
        mmq_stage<T, NT>(s, w, y, kc, k, row_bytes, nrows, m, row0, col0);
        __syncthreads();
#pragma unroll
        for (int g = 0; g < NG; ++g) {
            int is[MMQ_RM][RN];
#pragma unroll
            for (int r = 0; r < MMQ_RM; ++r)
#pragma unroll
                for (int c = 0; c < RN; ++c) is[r][c] = 0;
#pragma unroll
            for (int x = 0; x < GW; x += 4) {
                int4 a[RN];
#pragma unroll
                for (int c = 0; c < RN; ++c) a[c] = *reinterpret_cast<const int4*>(&s.qa[tc + MMQ_TN * c][GW * g + x]);
#pragma unroll
                for (int r = 0; r < MMQ_RM; ++r) {
                    const int4 b = *reinterpret_cast<const int4*>(&s.qw[tr + MMQ_TM * r][GW * g + x]);
#pragma unroll
                    for (int c = 0; c < RN; ++c) {
                        int t = dot4_i8(b.x, a[c].x, is[r][c]);
                        t = dot4_i8(b.y, a[c].y, t);
                        t = dot4_i8(b.z, a[c].z, t);
                        is[r][c] = dot4_i8(b.w, a[c].w, t);
                    }
                }
            }
            float dac[RN], sac[RN];
#pragma unroll
            for (int c = 0; c < RN; ++c) {
                dac[c] = s.da[tc + MMQ_TN * c][(g * T::G) / 32];
                sac[c] = T::MIN ? s.sa[tc + MMQ_TN * c][g] : 0.0f;
            }
#pragma unroll
            for (int r = 0; r < MMQ_RM; ++r) {
                const float dwr = s.dw[tr + MMQ_TM * r][g];
                const float mwr = T::MIN ? s.mw[tr + MMQ_TM * r][g] : 0.0f;
#pragma unroll
                for (int c = 0; c < RN; ++c) {
                    acc[r][c] += dwr * dac[c] * (float)is[r][c];
                    if (T::MIN) acc[r][c] += mwr * sac[c];
                }
            }
        }
    }
#pragma unroll
    for (int c = 0; c < RN; ++c) {
        const int col = col0 + tc + MMQ_TN * c;
        if (col >= m) continue;
#pragma unroll
        for (int r = 0; r < MMQ_RM; ++r) {
            const int row = row0 + tr + MMQ_TM * r;
            if (row >= nrows) continue;
            if (part) {
                part[((size_t)blockIdx.z * m + col) * nrows + row] = acc[r][c];
            } else {
                out[(size_t)col * out_stride + row] = acc[r][c] + (bias ? bias[row] : 0.0f);
            }
        }
    }
}

#if defined(MMQ_MMA)
// D += A (16 x 32 signed bytes, rows) * B (32 x 8 signed bytes, columns). Lane l = 4 g + t holds
// A words (row g, word t), (g + 8, t), (g, t + 4), (g + 8, t + 4), B words (column g, word t),
// (g, t + 4), and D at rows g, g + 8 x columns 2t, 2t + 1 (d0, d1 for row g; d2, d3 for g + 8).
static __device__ __forceinline__ void mma_s8_16x8x32(int (&d)[4], int a0, int a1, int a2, int a3, int b0, int b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four (x4) or two (x2) 8x8 matrices of 16-bit elements from shared memory: lanes 8i..8i + 7 give
// the addresses of matrix i's rows (16 bytes each); lane 4g + t receives word t of row g of each
// matrix, as an mma fragment wants it.
static __device__ __forceinline__ void ldsm_x4(uint32_t addr, int& r0, int& r1, int& r2, int& r3) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(addr));
}
static __device__ __forceinline__ void ldsm_x2(uint32_t addr, int& r0, int& r1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(addr));
}

// One step's products of a staged tile on the tensor cores: warp w takes rows 16 (w % 4).. and
// the vector tiles of 8 starting at 8 (w / 4 + 2 j), j < NJ = NT / 16; acc[j] holds the lane's
// four results of tile j (rows g, g + 8 x vectors 2t, 2t + 1).
template <typename T, int NT>
static __device__ __forceinline__ void mmq_step_mma(const mmq_smem<T, NT>& s, float (&acc)[NT / 16][4]) {
    constexpr int NJ = NT / 16;
    constexpr int GPS = 32 / T::G;  // groups per 32 values
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
    const int ra = 16 * (warp & 3) + g, rb = ra + 8;
    // The fragments come by ldmatrix: the weight fragment's four matrices are rows ra - g.. and
    // rb - g.. at words 8u.. and 8u + 4.. (lane l addresses row 16 (warp % 4) + l % 16, the
    // half l / 16), the vectors' two are vectors cb.. at the same words (lanes l % 16). A row's
    // four words at 8u (+ 4) stay together under the swizzle, which moves whole 16-byte pieces.
    const int lr = 16 * (warp & 3) + (lane & 15), lh = lane >> 4;
    const uint32_t qw0 = (uint32_t)__cvta_generic_to_shared(&s.qw[lr][0]);
    const uint32_t qa0 = (uint32_t)__cvta_generic_to_shared(&s.qa[lane & 7][0]) + 16 * ((lane >> 3) & 1);
#pragma unroll
    for (int u = 0; u < MMQ_KT / 32; ++u) {
        int a0, a1, a2, a3;
        ldsm_x4(qw0 + 4 * mmq_swz(lr, 8 * u + 4 * lh), a0, a1, a2, a3);
        float dwa[GPS], dwb[GPS], mwa[GPS], mwb[GPS];
#pragma unroll
        for (int h = 0; h < GPS; ++h) {
            dwa[h] = s.dw[ra][GPS * u + h];
            dwb[h] = s.dw[rb][GPS * u + h];
            mwa[h] = T::MIN ? s.mw[ra][GPS * u + h] : 0.0f;
            mwb[h] = T::MIN ? s.mw[rb][GPS * u + h] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const int cb = 8 * ((warp >> 2) + 2 * j);  // the tile's first vector
            int b0, b1;
            ldsm_x2(qa0 + 4 * (cb * MMQ_LD + 8 * u), b0, b1);
            const int ca = cb + 2 * t;  // the lane's first result vector
            const float da0 = s.da[ca][u], da1 = s.da[ca + 1][u];
#pragma unroll
            for (int h = 0; h < GPS; ++h) {
                int d[4] = {0, 0, 0, 0};
                // 16-value groups: the first group's values are words 0..3 of the 32 (b0), the
                // second's words 4..7 (b1).
                if (GPS == 1) {
                    mma_s8_16x8x32(d, a0, a1, a2, a3, b0, b1);
                } else {
                    mma_s8_16x8x32(d, a0, a1, a2, a3, h == 0 ? b0 : 0, h == 0 ? 0 : b1);
                }
                acc[j][0] += dwa[h] * da0 * (float)d[0];
                acc[j][1] += dwa[h] * da1 * (float)d[1];
                acc[j][2] += dwb[h] * da0 * (float)d[2];
                acc[j][3] += dwb[h] * da1 * (float)d[3];
                if (T::MIN) {
                    const float sa0 = s.sa[ca][GPS * u + h], sa1 = s.sa[ca + 1][GPS * u + h];
                    acc[j][0] += mwa[h] * sa0;
                    acc[j][1] += mwa[h] * sa1;
                    acc[j][2] += mwb[h] * sa0;
                    acc[j][3] += mwb[h] * sa1;
                }
            }
        }
    }
}

// Asks L2 for the weight bytes of step kc of the block's rows, each thread for the pieces its
// staging reads, so that the step's later loads or copies find them there.
template <typename T>
static __device__ __forceinline__ void mmq_prefetch(const uint8_t* __restrict__ w, int kc, int k, long long row_bytes,
                                                    int nrows, int row0) {
    const int tid = threadIdx.x;
    const int nblk = k / T::QK;
#pragma unroll
    for (int i = 0; i < MMQ_ROWS * 8 / MMQ_THREADS; ++i) {
        const int u = tid + i * MMQ_THREADS;
        const int r = u >> 3, j = u & 7;
        const uint8_t* wr = w + (long long)min(row0 + r, nrows - 1) * row_bytes;
        if (T::QK == 32) {
            const int blk = kc * 8 + j;
            if (blk < nblk) rf_prefetch_l2(wr + (long long)blk * T::BYTES);
        } else {
            rf_prefetch_l2(wr + (long long)kc * T::BYTES + 32 * j);
        }
    }
}

// Steps of weights whose L2 prefetch runs ahead of the ring's copies: the block's next
// STAGES + MMQ_PF_AHEAD steps are always requested.
#ifndef MMQ_PF_AHEAD
#define MMQ_PF_AHEAD 2
#endif

// Bytes of dynamic shared memory the tensor-core kernels of 16, 32, 64 and 128 vectors per tile
// are launched with (`kernels::MMQ_SMEM_BYTES`): the staging (mmq_smem) and ring slots, within what
// MMQ_MIN_BLOCKS_<NT> resident blocks leave per block on H100/H200 (228 KiB per multiprocessor,
// 1 KiB of it reserved per block) and within the 99 KiB per block of compute capability 8.6/8.9.
#define MMQ_SMEM_16 57344
#define MMQ_SMEM_32 57344
#define MMQ_SMEM_64 98304
#define MMQ_SMEM_128 98304

template <int NT>
struct mmq_smem_budget;
template <>
struct mmq_smem_budget<16> {
    static constexpr int BYTES = MMQ_SMEM_16;
};
template <>
struct mmq_smem_budget<32> {
    static constexpr int BYTES = MMQ_SMEM_32;
};
template <>
struct mmq_smem_budget<64> {
    static constexpr int BYTES = MMQ_SMEM_64;
};
template <>
struct mmq_smem_budget<128> {
    static constexpr int BYTES = MMQ_SMEM_128;
};

// The staging ring of a block: STAGES slots, each one step's weight bytes of the block's rows as
// they lie in the matrix (mmq_raw), copied by cp.async while earlier steps are converted and
// multiplied; as many as the budget leaves room for beside mmq_smem (at BASE), at most
// MMQ_RING_MAX.
#ifndef MMQ_RING_MAX
#define MMQ_RING_MAX 3
#endif
template <typename T, int NT>
struct mmq_ring_dims {
    static constexpr int SLOT = MMQ_ROWS * mmq_raw<T>::RS;
    static constexpr int BASE = ((int)sizeof(mmq_smem<T, NT>) + 15) & ~15;
    static constexpr int FIT = (mmq_smem_budget<NT>::BYTES - BASE) / SLOT;
    static constexpr int STAGES = FIT < MMQ_RING_MAX ? FIT : MMQ_RING_MAX;
    static constexpr int BYTES = BASE + STAGES * SLOT;
    static_assert(STAGES >= 1, "the budget holds the staging and one ring slot");
};

template <typename T, int NT>
struct __align__(16) mmq_ring {
    uint8_t raw[mmq_ring_dims<T, NT>::STAGES][mmq_ring_dims<T, NT>::SLOT];
};

// Copies step kc of the block's rows into ring slot `raw` (row r at r * mmq_raw<T>::RS): the
// 16-byte pieces covering each row's bytes of the step, lanes taking consecutive pieces. Pieces
// may reach up to 15 bytes past either end of those bytes, never past the 16-byte-aligned piece
// holding a byte of the matrix, so never onto another page. The 32-value types' last step of a
// row may hold fewer than 8 blocks: only those are copied.
template <typename T>
static __device__ __forceinline__ void mmq_issue(uint8_t* raw, const uint8_t* __restrict__ w, int kc, int k,
                                                 long long row_bytes, int nrows, int row0) {
    constexpr int P = mmq_raw<T>::PIECES, N = MMQ_ROWS * P;
    const int len = T::QK == 32 ? min(MMQ_KT / 32, k / 32 - kc * 8) * T::BYTES : T::BYTES;
#pragma unroll
    for (int i = 0; i < (N + MMQ_THREADS - 1) / MMQ_THREADS; ++i) {
        const int p = threadIdx.x + i * MMQ_THREADS;
        if (N % MMQ_THREADS != 0 && p >= N) break;
        const int r = p / P, c = p % P;
        const uint8_t* a = w + (long long)min(row0 + r, nrows - 1) * row_bytes + (long long)kc * mmq_raw<T>::SB;
        const int off = (int)(reinterpret_cast<uintptr_t>(a) & 15);
        if (16 * c < off + len) cp_async16(raw + r * mmq_raw<T>::RS + 16 * c, a - off + 16 * c);
    }
}

// mmq_tile on the tensor cores (same arguments and results). The copies of the next STAGES steps
// are in flight while a step is converted and multiplied; the conversion and the products are
// those of the ring-less staging, so the results are the same bits.
template <typename T, int NT>
static __device__ __forceinline__ void mmq_tile_mma(mmq_smem<T, NT>& s, mmq_ring<T, NT>& ring,
                                                    const uint8_t* __restrict__ w, const float* __restrict__ bias,
                                                    const uint8_t* __restrict__ y, float* __restrict__ out,
                                                    float* __restrict__ part, int k, long long row_bytes,
                                                    int out_stride, int nrows, int m, int splits) {
    constexpr int NJ = NT / 16;
    constexpr int ST = mmq_ring_dims<T, NT>::STAGES;
    const int col0 = blockIdx.x * NT, row0 = blockIdx.y * MMQ_ROWS;
    const int nch = (k + MMQ_KT - 1) / MMQ_KT;
    int kc0 = 0, kc1 = nch;
    if (part) {
        const int sp = blockIdx.z % splits, per = (nch + splits - 1) / splits;
        kc0 = min(nch, sp * per);
        kc1 = min(nch, kc0 + per);
    }
    float acc[NJ][4];
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[j][i] = 0.0f;
    // The first steps: copies into the ring, then L2 requests for the ones after them.
#pragma unroll
    for (int st = 0; st < ST; ++st) {
        if (kc0 + st < kc1) mmq_issue<T>(ring.raw[st], w, kc0 + st, k, row_bytes, nrows, row0);
        cp_async_commit();
    }
#pragma unroll
    for (int st = ST; st < ST + MMQ_PF_AHEAD; ++st)
        if (kc0 + st < kc1) mmq_prefetch<T>(w, kc0 + st, k, row_bytes, nrows, row0);
    // The 16-vector tiles load a step's activations while the step before it is multiplied (one
    // piece per thread); 32- and 64-vector ones, whose registers are spoken for by then, while
    // its weights are converted; 128-vector ones (8 pieces per thread) after that.
    constexpr int AP = mmq_act<NT>::AP;
    constexpr bool ACT_AHEAD = AP == 1;
    mmq_act<NT> av;
    if constexpr (ACT_AHEAD) mmq_act_load<NT>(av, y, kc0, k, m, col0);
    for (int kc = kc0; kc < kc1; ++kc) {
        const int slot = (kc - kc0) % ST;
        cp_async_wait<ST - 1>();  // this thread's copies of step kc have landed
        __syncthreads();          // everyone's, and the previous step's reads are done
        if constexpr (!ACT_AHEAD && AP <= 4) mmq_act_load<NT>(av, y, kc, k, m, col0);
        mmq_stage_w<T, NT, true>(s, w, kc, k, row_bytes, nrows, row0, ring.raw[slot]);
        if constexpr (AP > 4) {
            // Two pieces at a time (a 32-vector share), so that the wide accumulators keep
            // their registers.
#pragma unroll 1
            for (int p0 = 0; p0 < AP; p0 += 2) {
                mmq_act<32> a2;
                mmq_act_load<NT, 32>(a2, y, kc, k, m, col0, p0);
                mmq_act_store<T, NT, 32>(s, a2, p0);
            }
        } else {
            mmq_act_store<T, NT>(s, av);
        }
        __syncthreads();
        // The slot is converted: it takes step kc + ST (an empty group past the end, so that
        // the wait above keeps counting steps).
        if (kc + ST < kc1) mmq_issue<T>(ring.raw[slot], w, kc + ST, k, row_bytes, nrows, row0);
        cp_async_commit();
        if (ACT_AHEAD && kc + 1 < kc1) mmq_act_load<NT>(av, y, kc + 1, k, m, col0);
        if (kc + ST + MMQ_PF_AHEAD < kc1) mmq_prefetch<T>(w, kc + ST + MMQ_PF_AHEAD, k, row_bytes, nrows, row0);
        mmq_step_mma<T, NT>(s, acc);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int col = col0 + 8 * ((warp >> 2) + 2 * j) + 2 * t + (i & 1);
            const int row = row0 + 16 * (warp & 3) + g + 8 * (i >> 1);
            if (col >= m || row >= nrows) continue;
            if (part) {
                part[((size_t)blockIdx.z * m + col) * nrows + row] = acc[j][i];
            } else {
                out[(size_t)col * out_stride + row] = acc[j][i] + (bias ? bias[row] : 0.0f);
            }
        }
    }
}
#endif

template <typename T, int NT>
static __device__ __forceinline__ void mmq_body(const uint8_t* w0, const uint8_t* w1, const float* bias,
                                                const uint8_t* y, float* out, float* part, int k,
                                                long long row_bytes, int out_stride, int nrows, int m,
                                                int splits) {
    const uint8_t* w = (part && (int)blockIdx.z >= splits) ? w1 : w0;
#if defined(MMQ_MMA)
    // Dynamic shared memory (more than the 48 KiB static limit): the staging, then the ring. A
    // launch with less than the budget is the host's mistake: stop rather than overrun.
    using D = mmq_ring_dims<T, NT>;
    static_assert(D::BYTES <= mmq_smem_budget<NT>::BYTES, "staging and ring fit the budget");
    extern __shared__ __align__(16) uint8_t mmq_dyn[];
    uint32_t dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if (dyn < (uint32_t)D::BYTES) __trap();
    mmq_tile_mma<T, NT>(*reinterpret_cast<mmq_smem<T, NT>*>(mmq_dyn),
                        *reinterpret_cast<mmq_ring<T, NT>*>(mmq_dyn + D::BASE), w, bias, y, out, part, k,
                        row_bytes, out_stride, nrows, m, splits);
#else
    // Without tensor cores the tiles are of at most 64 vectors (wider ones would exceed AMD's
    // 64 KiB of shared memory): a wider tile is computed as that many tiles of 64 in turn.
    constexpr int NS = NT < 64 ? NT : 64;
    __shared__ mmq_smem<T, NS> s;
#pragma unroll 1
    for (int c = 0; c < NT / NS; ++c)
        mmq_tile<T, NS>(s, w, bias, y, out, part, k, row_bytes, out_stride, nrows, m, splits,
                        blockIdx.x * NT + c * NS);
#endif
}

// Register budgets per tile width (resident blocks per multiprocessor): narrow tiles need few
// registers, so more blocks overlap one another's staging loads and products (kernels/PERF.md,
// "Batched products").
#ifndef MMQ_MIN_BLOCKS_16
#define MMQ_MIN_BLOCKS_16 4
#endif
#ifndef MMQ_MIN_BLOCKS_32
#define MMQ_MIN_BLOCKS_32 4
#endif
#ifndef MMQ_MIN_BLOCKS_64
#define MMQ_MIN_BLOCKS_64 2
#endif
#ifndef MMQ_MIN_BLOCKS_128
#define MMQ_MIN_BLOCKS_128 2
#endif

// name_16, name_32, name_64, name_128: tiles of 16, 32, 64 or 128 vectors, each with (w0, w1, bias, y, out,
// part, k, row_bytes, out_stride, nrows, m, splits): see the top of the file; w1 is read only
// with `part` and blockIdx.z >= splits, bias only without `part`.
#define RF_MMQ_NT(name, T, NT)                                                                                  \
    RF_KERNEL void MMQ_LB(MMQ_MIN_BLOCKS_##NT)                                                                  \
        name##_##NT(const uint8_t* w0, const uint8_t* w1, const float* bias, const uint8_t* y, float* out,       \
                    float* part, int k, long long row_bytes, int out_stride, int nrows, int m, int splits) {     \
        rf_entry();                                                                                            \
        mmq_body<T, NT>(w0, w1, bias, y, out, part, k, row_bytes, out_stride, nrows, m, splits);             \
    }
#define RF_MMQ(name, T) \
    RF_MMQ_NT(name, T, 16) RF_MMQ_NT(name, T, 32) RF_MMQ_NT(name, T, 64) RF_MMQ_NT(name, T, 128)

RF_MMQ(mmq_q4_0, mq_q4_0)
RF_MMQ(mmq_q4_1, mq_q4_1)
RF_MMQ(mmq_q5_0, mq_q5_0)
RF_MMQ(mmq_q5_1, mq_q5_1)
RF_MMQ(mmq_q8_0, mq_q8_0)
RF_MMQ(mmq_q2_k, mq_q2_k)
RF_MMQ(mmq_q3_k, mq_q3_k)
RF_MMQ(mmq_q4_k, mq_q4_k)
RF_MMQ(mmq_q5_k, mq_q5_k)
RF_MMQ(mmq_q6_k, mq_q6_k)

// Sums the partial results of `splits` shares (in order) for vector blockIdx.y, rows
// blockIdx.x * blockDim.x + threadIdx.x: out = sum (gated 0) or act(gate sum) * (up sum), the up
// partials following the gate ones (gated 1), plus bias[row] when given.
RF_KERNEL void mmq_combine(const float* __restrict__ part, const float* __restrict__ bias, float* __restrict__ out,
                           int nrows, int m, int out_stride, int splits, int gated, int act_kind) {
    rf_entry();
    const int row = blockIdx.x * blockDim.x + threadIdx.x, col = blockIdx.y;
    if (row >= nrows) return;
    float v = 0.0f;
    for (int s = 0; s < splits; ++s) v += part[((size_t)s * m + col) * nrows + row];
    if (gated) {
        float u = 0.0f;
        for (int s = 0; s < splits; ++s) u += part[((size_t)(splits + s) * m + col) * nrows + row];
        v = act_fn(act_kind, v) * u;
    }
    if (bias) v += bias[row];
    out[(size_t)col * out_stride + row] = v;
}

// ---------------------------------------------------------------------------------------------
// Expert-grouped batched products (llama.cpp's `mul_mat_id` over a prompt) on integer tiles, with
// no host round trip: `moe_group` sorts the (token, slot) pairs by expert on the device, then one
// `mmq_id_<type>_<NT>` launch covers every expert: each block takes one tile of MMQ_ROWS rows of
// one expert's matrix times up to NT of the pairs that chose it, stages those pairs' activation
// vectors through the sorted pair list, and writes each result to its pair's output row. For a
// gated product (`w1` given) the block multiplies the gate and the up matrix with the same staged
// activations and writes act(gate) * up. A float tile product for small float weights (a router's
// `[k, n_experts]`, `gemm_f32_part`) closes the file.
// The weights are staged by `mmq_stage_w`, the activations as `mmq_stage` stages them, with the
// rows looked up per pair.

#define MOE_GROUP_THREADS 256
#define MOE_GROUP_MAX_EXPERTS 1024
#define MOE_GROUP_BOUND __launch_bounds__(MOE_GROUP_THREADS)

// Pairs grouped by expert, stable (pair order within each expert), for column tiles of `nt`
// pairs. Grid: n_mat + 1 blocks. Block e < n_mat writes off[e] (expert e's first position in
// the sorted order), tiles[e] (its first column tile) and rows[off[e] + i] = the i-th pair that
// chose e; block n_mat writes the totals off[n_mat] and tiles[n_mat] and zeroes the output rows
// (`nrows` f32 each) of pairs whose id lies outside 0..n_mat, which no tile writes (the per-pair
// kernels do the same). `ids` holds the `pairs` ids in pair order (token-major).
RF_KERNEL void MOE_GROUP_BOUND moe_group(const int* __restrict__ ids, int* __restrict__ rows, int* __restrict__ off,
                                         int* __restrict__ tiles, float* __restrict__ out, int pairs, int n_mat,
                                         int nt, int nrows) {
    rf_entry();
    __shared__ int hist[MOE_GROUP_MAX_EXPERTS];
    __shared__ int scan[MOE_GROUP_THREADS];
    __shared__ int base;
    const int tid = threadIdx.x, e = blockIdx.x;
    for (int i = tid; i < n_mat; i += MOE_GROUP_THREADS) hist[i] = 0;
    __syncthreads();
    for (int p = tid; p < pairs; p += MOE_GROUP_THREADS) {
        const int id = ids[p];
        if (id >= 0 && id < n_mat) atomicAdd(&hist[id], 1);
    }
    __syncthreads();
    if (tid == 0) {
        int o = 0, t = 0;
        for (int i = 0; i < e; ++i) {
            o += hist[i];
            t += (hist[i] + nt - 1) / nt;
        }
        off[e] = o;
        tiles[e] = t;
        base = o;
    }
    if (e == n_mat) {
        for (int p = tid; p < pairs; p += MOE_GROUP_THREADS) {
            const int id = ids[p];
            if (id < 0 || id >= n_mat)
                for (int r = 0; r < nrows; ++r) out[(size_t)p * nrows + r] = 0.0f;
        }
        return;
    }
    // Each thread takes a contiguous share of the pairs, so that the prefix sum of the shares'
    // counts keeps the pair order.
    const int per = (pairs + MOE_GROUP_THREADS - 1) / MOE_GROUP_THREADS;
    const int p0 = min(pairs, tid * per), p1 = min(pairs, p0 + per);
    int c = 0;
    for (int p = p0; p < p1; ++p) c += ids[p] == e;
    scan[tid] = c;
    __syncthreads();
    for (int s = 1; s < MOE_GROUP_THREADS; s <<= 1) {
        const int v = tid >= s ? scan[tid - s] : 0;
        __syncthreads();
        scan[tid] += v;
        __syncthreads();
    }
    int at = base + scan[tid] - c;
    for (int p = p0; p < p1; ++p)
        if (ids[p] == e) rows[at++] = p;
}

// The expert whose column tiles hold tile `slot` (tiles[e] <= slot < tiles[e + 1]: a non-empty
// expert), or -1 past the last tile.
static __device__ __forceinline__ int mmq_id_expert(const int* __restrict__ tiles, int n_mat, int slot) {
    if (slot >= tiles[n_mat]) return -1;
    int lo = 0, hi = n_mat;  // tiles[lo] <= slot < tiles[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (tiles[mid] <= slot)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

// The activation vector pair p multiplies: token p / n_used's vector (p % n_used) % n_x.
static __device__ __forceinline__ int mmq_id_vector(int p, int n_used, int n_x) {
    return (p / n_used) * n_x + (p % n_used) % n_x;
}

// Stages step `kc` of the tile's `m` pairs (sorted positions pos.. of `rows`): each pair's
// activation vector of `y` (as mmq_stage stages vectors col0..).
template <typename T, int NT>
static __device__ __forceinline__ void mmq_id_stage_a(mmq_smem<T, NT>& s, const uint8_t* __restrict__ y,
                                                      const int* __restrict__ rows, int pos, int m, int kc, int k,
                                                      int n_used, int n_x) {
    const int tid = threadIdx.x;
    const size_t vb = q8_vec_bytes(k);
#pragma unroll
    for (int i = 0; i < (NT * 16 + MMQ_THREADS - 1) / MMQ_THREADS; ++i) {
        const int p = tid + i * MMQ_THREADS;
        if (p >= NT * 16) break;
        const int c = p >> 4, piece = p & 15;
        const int v0 = kc * MMQ_KT + 16 * piece;  // first value
        const bool ok = c < m && v0 < k;
        int4 a = make_int4(0, 0, 0, 0);
        float d = 0.0f, sum = 0.0f;
        if (ok) {
            const uint8_t* yv = y + (size_t)mmq_id_vector(rows[pos + c], n_used, n_x) * vb;
            a = ld_b128(yv + v0);
            const uint32_t ds = *reinterpret_cast<const uint32_t*>(yv + k + 4 * (v0 / 32));
            d = lo_f16(ds);
            sum = hi_f16(ds);
        }
        *reinterpret_cast<int4*>(&s.qa[c][4 * piece]) = a;
        if ((piece & 1) == 0) s.da[c][piece >> 1] = d;
        if (T::MIN) {
            if (T::G == 16) {
                int t = dot4_i8(a.x, 0x01010101, 0);
                t = dot4_i8(a.y, 0x01010101, t);
                t = dot4_i8(a.z, 0x01010101, t);
                t = dot4_i8(a.w, 0x01010101, t);
                s.sa[c][piece] = d * (float)t;
            } else if ((piece & 1) == 0) {
                s.sa[c][piece >> 1] = sum;
            }
        }
    }
}

#if defined(MMQ_MMA)
// Tensor cores: the lane's results are acc[j][i] (mmq_step_mma's layout).
#define MMQ_ID_ACC(NT) float acc[2][NT / 16][4] = {}
#define MMQ_ID_STEP(T, NT, s, a) mmq_step_mma<T, NT>(s, a)
#else
#define MMQ_ID_ACC(NT) float acc[2][MMQ_RM][NT / MMQ_TN] = {}
#define MMQ_ID_STEP(T, NT, s, a) mmq_id_step_dp4a<T, NT>(s, a)

// One step's 8-bit dot products of a staged tile (mmq_tile's loop body): thread (tr, tc) adds
// rows tr + MMQ_TM r times vectors tc + MMQ_TN c into acc[r][c].
template <typename T, int NT>
static __device__ __forceinline__ void mmq_id_step_dp4a(const mmq_smem<T, NT>& s, float (&acc)[MMQ_RM][NT / MMQ_TN]) {
    constexpr int RN = NT / MMQ_TN;
    constexpr int NG = mmq_smem<T, NT>::NG;
    constexpr int GW = T::G / 4;  // words per group
    const int tr = threadIdx.x / MMQ_TN, tc = threadIdx.x % MMQ_TN;
#pragma unroll
    for (int g = 0; g < NG; ++g) {
        int is[MMQ_RM][RN];
#pragma unroll
        for (int r = 0; r < MMQ_RM; ++r)
#pragma unroll
            for (int c = 0; c < RN; ++c) is[r][c] = 0;
#pragma unroll
        for (int x = 0; x < GW; x += 4) {
            int4 a[RN];
#pragma unroll
            for (int c = 0; c < RN; ++c) a[c] = *reinterpret_cast<const int4*>(&s.qa[tc + MMQ_TN * c][GW * g + x]);
#pragma unroll
            for (int r = 0; r < MMQ_RM; ++r) {
                const int4 b = *reinterpret_cast<const int4*>(&s.qw[tr + MMQ_TM * r][GW * g + x]);
#pragma unroll
                for (int c = 0; c < RN; ++c) {
                    int t = dot4_i8(b.x, a[c].x, is[r][c]);
                    t = dot4_i8(b.y, a[c].y, t);
                    t = dot4_i8(b.z, a[c].z, t);
                    is[r][c] = dot4_i8(b.w, a[c].w, t);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < MMQ_RM; ++r) {
            const float dwr = s.dw[tr + MMQ_TM * r][g];
            const float mwr = T::MIN ? s.mw[tr + MMQ_TM * r][g] : 0.0f;
#pragma unroll
            for (int c = 0; c < RN; ++c) {
                const float dac = s.da[tc + MMQ_TN * c][(g * T::G) / 32];
                acc[r][c] += dwr * dac * (float)is[r][c];
                if (T::MIN) acc[r][c] += mwr * s.sa[tc + MMQ_TN * c][g];
            }
        }
    }
}
#endif

// One block of mmq_id_<type>_<NT>: column tile blockIdx.x (of every expert's tiles in expert
// order), rows blockIdx.y * MMQ_ROWS.. of that expert's matrix (`mat_bytes` apart in w0 and w1).
template <typename T, int NT>
static __device__ __forceinline__ void mmq_id_body(const uint8_t* __restrict__ w0, const uint8_t* __restrict__ w1,
                                                   const int* __restrict__ rows, const int* __restrict__ off,
                                                   const int* __restrict__ tiles, const uint8_t* __restrict__ y,
                                                   float* __restrict__ out, int k, long long row_bytes,
                                                   long long mat_bytes, int nrows, int n_used, int n_x, int n_mat,
                                                   int act_kind) {
    __shared__ mmq_smem<T, NT> s;
    const int e = mmq_id_expert(tiles, n_mat, (int)blockIdx.x);
    if (e < 0) return;
    const int pos = off[e] + ((int)blockIdx.x - tiles[e]) * NT;  // the tile's first sorted pair
    const int m = min(NT, off[e + 1] - pos);
    const int row0 = blockIdx.y * MMQ_ROWS;
    const bool gated = w1 != nullptr;
    const uint8_t* wg = w0 + (long long)e * mat_bytes;
    const uint8_t* wu = gated ? w1 + (long long)e * mat_bytes : nullptr;
    const int nch = (k + MMQ_KT - 1) / MMQ_KT;
    MMQ_ID_ACC(NT);
    for (int kc = 0; kc < nch; ++kc) {
        __syncthreads();  // the previous step's reads are done
        mmq_stage_w<T, NT>(s, wg, kc, k, row_bytes, nrows, row0);
        mmq_id_stage_a<T, NT>(s, y, rows, pos, m, kc, k, n_used, n_x);
#if defined(MMQ_MMA)
        if (kc + 1 < nch) {
            mmq_prefetch<T>(wg, kc + 1, k, row_bytes, nrows, row0);
            if (gated) mmq_prefetch<T>(wu, kc + 1, k, row_bytes, nrows, row0);
        }
#endif
        __syncthreads();
        MMQ_ID_STEP(T, NT, s, acc[0]);
        if (gated) {
            // The up rows over the same staged activations.
            __syncthreads();
            mmq_stage_w<T, NT>(s, wu, kc, k, row_bytes, nrows, row0);
            __syncthreads();
            MMQ_ID_STEP(T, NT, s, acc[1]);
        }
    }
#if defined(MMQ_MMA)
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < NT / 16; ++j) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int col = 8 * ((warp >> 2) + 2 * j) + 2 * t + (i & 1);
            const int row = row0 + 16 * (warp & 3) + g + 8 * (i >> 1);
            if (col >= m || row >= nrows) continue;
            const float v = gated ? act_fn(act_kind, acc[0][j][i]) * acc[1][j][i] : acc[0][j][i];
            out[(size_t)rows[pos + col] * nrows + row] = v;
        }
    }
#else
    const int tr = threadIdx.x / MMQ_TN, tc = threadIdx.x % MMQ_TN;
#pragma unroll
    for (int c = 0; c < NT / MMQ_TN; ++c) {
        const int col = tc + MMQ_TN * c;
        if (col >= m) continue;
        float* o = out + (size_t)rows[pos + col] * nrows;
#pragma unroll
        for (int r = 0; r < MMQ_RM; ++r) {
            const int row = row0 + tr + MMQ_TM * r;
            if (row >= nrows) continue;
            o[row] = gated ? act_fn(act_kind, acc[0][r][c]) * acc[1][r][c] : acc[0][r][c];
        }
    }
#endif
}

// Register budgets (resident blocks per multiprocessor) of the grouped kernels, which hold the
// gate's and the up product's sums: the 32-vector tiles spill at 64 registers (4 blocks).
#ifndef MMQ_ID_MIN_BLOCKS_16
#define MMQ_ID_MIN_BLOCKS_16 4
#endif
#ifndef MMQ_ID_MIN_BLOCKS_32
#define MMQ_ID_MIN_BLOCKS_32 3
#endif
#ifndef MMQ_ID_MIN_BLOCKS_64
#define MMQ_ID_MIN_BLOCKS_64 2
#endif

// name_16, name_32, name_64 with (w0, w1, rows, off, tiles, y, out, k, row_bytes, mat_bytes,
// nrows, n_used, n_x, n_mat, act_kind): `moe_group`'s rows, off and tiles for tiles of NT pairs,
// `y` the n_x * n_tok planar Q8_1 activation vectors, `out` one row of `nrows` f32 per pair; grid
// x covers tiles[n_mat] (more blocks leave at once), y the row tiles.
#define RF_MMQ_ID_NT(name, T, NT)                                                                              \
    RF_KERNEL void MMQ_LB(MMQ_ID_MIN_BLOCKS_##NT)                                                              \
        name##_##NT(const uint8_t* w0, const uint8_t* w1, const int* rows, const int* off, const int* tiles,    \
                    const uint8_t* y, float* out, int k, long long row_bytes, long long mat_bytes, int nrows,    \
                    int n_used, int n_x, int n_mat, int act_kind) {                                             \
        rf_entry();                                                                                           \
        mmq_id_body<T, NT>(w0, w1, rows, off, tiles, y, out, k, row_bytes, mat_bytes, nrows, n_used, n_x,     \
                           n_mat, act_kind);                                                                  \
    }
#define RF_MMQ_ID(name, T) RF_MMQ_ID_NT(name, T, 16) RF_MMQ_ID_NT(name, T, 32) RF_MMQ_ID_NT(name, T, 64)

// MXFP4 (gpt-oss's experts): 17-byte blocks, so byte loads; the E2M1 values doubled as signed
// bytes (Q4_0's nibble order) and the E8M0 scale halved to match (common.h).
struct mq_mxfp4 {
    static constexpr int QK = 32, BYTES = MXFP4_BYTES, G = 32;
    static constexpr bool MIN = false;
    static __device__ __forceinline__ void unit(const uint8_t* b, int, int* q, float* d, float*) {
        d[0] = e8m0_half(b[0]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint8_t* p = b + 1 + 4 * w;
            const uint32_t x = (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
            q[w] = mxfp4_bytes(x & 0x0F0F0F0Fu);
            q[w + 4] = mxfp4_bytes((x >> 4) & 0x0F0F0F0Fu);
        }
    }
};

RF_MMQ_ID(mmq_id_q4_0, mq_q4_0)
RF_MMQ_ID(mmq_id_q4_1, mq_q4_1)
RF_MMQ_ID(mmq_id_q5_0, mq_q5_0)
RF_MMQ_ID(mmq_id_q5_1, mq_q5_1)
RF_MMQ_ID(mmq_id_q8_0, mq_q8_0)
RF_MMQ_ID(mmq_id_q2_k, mq_q2_k)
RF_MMQ_ID(mmq_id_q3_k, mq_q3_k)
RF_MMQ_ID(mmq_id_q4_k, mq_q4_k)
RF_MMQ_ID(mmq_id_q5_k, mq_q5_k)
RF_MMQ_ID(mmq_id_q6_k, mq_q6_k)
RF_MMQ_ID(mmq_id_mxfp4, mq_mxfp4)

// Float products for small float weights times many vectors (a router's `[k, n_experts]` f32
// matrix times a prompt), which the BLAS library runs on a handful of blocks: tiles of
// GEMM_F32_TILE rows x GEMM_F32_TILE vectors, each block over one share of the row (split z of
// `splits`, `kper` values each), writing part[(z * m + vector) * nrows + row] for `mmq_combine`
// (with splits = 1 too, so that the bias goes in there). `w`: nrows rows of k f32, `ldw` apart;
// `x`: m vectors of k f32, `ldx` apart. 256 threads, each 4 rows x 4 vectors.
#define GEMM_F32_TILE 64
#define GEMM_F32_KS 16
#define GEMM_F32_LD (GEMM_F32_TILE + 4)
#define GEMM_F32_THREADS 256
#define GEMM_F32_BOUND __launch_bounds__(GEMM_F32_THREADS)

RF_KERNEL void GEMM_F32_BOUND gemm_f32_part(const float* __restrict__ w, const float* __restrict__ x,
                                            float* __restrict__ part, int k, long long ldw, long long ldx, int nrows,
                                            int m, int kper) {
    rf_entry();
    __shared__ __align__(16) float ws[GEMM_F32_KS][GEMM_F32_LD];
    __shared__ __align__(16) float xs[GEMM_F32_KS][GEMM_F32_LD];
    const int tid = threadIdx.x;
    const int ty = tid / 16, tx = tid % 16;
    const int row0 = blockIdx.y * GEMM_F32_TILE, col0 = blockIdx.x * GEMM_F32_TILE;
    const int k0 = blockIdx.z * kper, k1 = min(k, k0 + kper);
    float acc[4][4] = {};
    for (int kb = k0; kb < k1; kb += GEMM_F32_KS) {
        __syncthreads();  // the previous slab's reads are done
#pragma unroll
        for (int i = 0; i < GEMM_F32_TILE * GEMM_F32_KS / 256; ++i) {
            const int u = tid + 256 * i;
            const int r = u / GEMM_F32_KS, kk = u % GEMM_F32_KS;
            const int kv = kb + kk;
            const bool kin = kv < k1;
            ws[kk][r] = (kin && row0 + r < nrows) ? w[(long long)(row0 + r) * ldw + kv] : 0.0f;
            xs[kk][r] = (kin && col0 + r < m) ? x[(long long)(col0 + r) * ldx + kv] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < GEMM_F32_KS; ++kk) {
            const float4 a = *reinterpret_cast<const float4*>(&ws[kk][4 * ty]);
            const float4 b = *reinterpret_cast<const float4*>(&xs[kk][4 * tx]);
            const float av[4] = {a.x, a.y, a.z, a.w}, bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int r = 0; r < 4; ++r)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[r][c] = fmaf(av[r], bv[c], acc[r][c]);
        }
    }
#pragma unroll
    for (int c = 0; c < 4; ++c) {
        const int col = col0 + 4 * tx + c;
        if (col >= m) continue;
#pragma unroll
        for (int r = 0; r < 4; ++r) {
            const int row = row0 + 4 * ty + r;
            if (row < nrows) part[((size_t)blockIdx.z * m + col) * nrows + row] = acc[r][c];
        }
    }
}
