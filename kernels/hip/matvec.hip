// Decode-time matrix-vector products: activations quantized to Q8_1 values on the device (planar
// layout, see common.h), then integer dot products against ggml-quantized weight rows read in
// place.
//
// Each warp computes `R` rows at once, so each activation load serves R rows, and lanes are laid
// out so that a warp's loads cover contiguous bytes. Q4_K/Q5_K blocks (144/176 bytes) are 16-byte
// aligned, so lanes read them directly with 16-byte loads. The other types' blocks (18 to 210
// bytes) are only 2- or 4-byte aligned: a warp first copies its span of each row into shared
// memory with coalesced 16-byte (or 4-byte) loads, then lanes pick their fields out of shared
// memory.
// Offsets that depend on a whole 32-value block (Q4_0's -8, the K-quant minimums) use the Q8_1
// block's precomputed sum `s`.
// On NVIDIA compute capability 8.0 and later, the stage of Q8_0, Q4_0 and Q4_1 is instead a ring
// filled by asynchronous copies (see "Pipelined weight stream"), where that measured faster.
//
// Every mat-vec kernel takes (w, y, out, ncols, row_bytes, out_stride, nrows), runs MV_WARPS warps
// per block (the host passes MV_WARPS * warp size threads) and covers MV_WARPS * R rows per block
// (`kernels::WeightType::matvec_rows_per_block`); grid.y is the activation vector. The kernels
// also loop when grid.x is smaller than the row groups (capping the grid to what stays
// resident measured no faster on an H200, so the host launches one block per row group).
#include "qdot.h"

#define MV_WARPS 4

// x (vectors of ncols floats, x_stride apart; ncols a multiple of 32) -> y (planar Q8_1, see
// common.h). grid.y is the vector. Each 32-lane group quantizes one block: works for any warp
// size that is a multiple of 32, since the reductions use width 32.
RF_KERNEL void quantize_q8_1(const float* __restrict__ x, uint8_t* __restrict__ y, int ncols,
                             long long x_stride) {
    rf_entry();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    const int blk = i / QK8_1;
    if (blk * QK8_1 >= ncols) return;  // whole 32-lane groups leave together
    const float v = x[(long long)blockIdx.y * x_stride + i];
    q8_1_put(v, y + (size_t)blockIdx.y * q8_vec_bytes(ncols), ncols, i);
}

// =============================================================================================
// Mat-vec kernels: R rows per warp, coalesced weight loads.
// =============================================================================================

// Epilogue of the mat-vecs for rows row0 .. row0 + R - 1: warp sums of the lanes' partial
// dot products (NM = 2: gate and up rows), with KS > 1 the sums of the block's KS warps (each
// took every KS-th part of the row; added in warp order through shared memory, so the result is
// the same on every run), then lane r of the storing warp writes
// out = dot (NM = 1) or act(gate) * up (NM = 2), plus bias[row] when a bias is given.
template <int R, int NM, int KS, class EP>
static __device__ __forceinline__ void mv_finish(float (*acc)[R], const float* __restrict__ bias, int act_kind,
                                                 float* __restrict__ out, int lane, int wid, int row0, int nrows,
                                                 int out_stride, const EP& ep) {
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) acc[m][r] = warp_sum(acc[m][r]);
    if (KS > 1) {
        __shared__ float red[KS][NM][R];
        __syncthreads();  // the previous row group's reads are done
        if (lane == 0)
#pragma unroll
            for (int m = 0; m < NM; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r) red[wid][m][r] = acc[m][r];
        __syncthreads();
#pragma unroll
        for (int m = 0; m < NM; ++m)
#pragma unroll
            for (int r = 0; r < R; ++r) {
                float v = red[0][m][r];
#pragma unroll
                for (int k = 1; k < KS; ++k) v += red[k][m][r];
                acc[m][r] = v;
            }
    }
    const bool st = (KS == 1 || wid == 0) && lane < R && row0 + lane < nrows;
    float v = 0.0f;
    if (st) {
        float u = acc[NM - 1][0];
        v = acc[0][0];
#pragma unroll
        for (int r = 1; r < R; ++r)
            if (lane == r) {
                v = acc[0][r];
                u = acc[NM - 1][r];
            }
        if (NM == 2) v = act_fn(act_kind, v) * u;
        if (bias) v += bias[row0 + lane];
        if (EP::PLAIN) out[(size_t)blockIdx.y * out_stride + row0 + lane] = v;
    }
    if (!EP::PLAIN) ep(v, st, out + (size_t)blockIdx.y * out_stride, row0 + lane, wid);
}

// What a mat-vec does with its finished row values: `mv_store` writes them to `out`; an epilogue
// with PLAIN false is called by every thread of the storing warps with `st` true where the lane
// holds the value `v` of row `row` (`out` already offset to the activation vector's output).
struct mv_store {
    static constexpr bool PLAIN = true;
    __device__ __forceinline__ void operator()(float, bool, float*, int, int) const {}
};

// --- 32-value blocks, one block per lane ----------------------------------------------------

struct act32 {
    int4 q0, q1;  // values 0..15, 16..31
    float d, s;
};

static __device__ __forceinline__ void load_act32(q8_vec y, int b, act32& a) {
    a.q0 = ld_b128(y.q + 32 * b);
    a.q1 = ld_b128(y.q + 32 * b + 16);
    const uint32_t ds = *reinterpret_cast<const uint32_t*>(y.ds + 4 * b);
    a.d = lo_f16(ds);
    a.s = hi_f16(ds);
}

// Dot product of 32 unsigned 4-bit values (16 bytes: low nibbles are values 0..15, high nibbles
// 16..31) with a Q8_1 block's quantized values.
static __device__ __forceinline__ int dot_nib32(const uint32_t* q, const act32& a) {
    int s = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        s = dot4_i8((int)q[k] & 0x0F0F0F0F, word(a.q0, k), s);
        s = dot4_i8(((int)q[k] >> 4) & 0x0F0F0F0F, word(a.q1, k), s);
    }
    return s;
}

// As dot_nib32 for 5-bit values: v[0] holds the fifth bits (bit i of value i), v[1..4] the nibbles.
static __device__ __forceinline__ int dot_nib5_32(const uint32_t* v, const act32& a) {
    const uint32_t qh = v[0];
    int s = 0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
        const int lo = ((int)v[k + 1] & 0x0F0F0F0F) | spread_bit4((qh >> (4 * k)) & 0xF);
        const int hi = (((int)v[k + 1] >> 4) & 0x0F0F0F0F) | spread_bit4((qh >> (16 + 4 * k)) & 0xF);
        s = dot4_i8(lo, word(a.q0, k), s);
        s = dot4_i8(hi, word(a.q1, k), s);
    }
    return s;
}

struct mv_q8_0 {
    static constexpr int QK = 32, BYTES = Q8_0_BYTES, LPB = 1, ROUNDS = 1;
    static constexpr bool PIPE = true;
    using Act = act32;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int, Act& a) { load_act32(y, b, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int, const Act& a) {
        uint32_t q[8];
        st_words<8>(st, o + 2, q);
        int s = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) s = dot4_i8((int)q[k], word(a.q0, k), s);
#pragma unroll
        for (int k = 0; k < 4; ++k) s = dot4_i8((int)q[k + 4], word(a.q1, k), s);
        return st_f16(st, o) * a.d * (float)s;
    }
};

struct mv_q5_0 {
    static constexpr int QK = 32, BYTES = Q5_0_BYTES, LPB = 1, ROUNDS = 1;
    static constexpr bool PIPE = false;
    using Act = act32;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int, Act& a) { load_act32(y, b, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int, const Act& a) {
        uint32_t v[5];  // qh, then 4 words of qs
        st_words<5>(st, o + 2, v);
        const int s = dot_nib5_32(v, a);
        return st_f16(st, o) * (a.d * (float)s - 16.0f * a.s);
    }
};

struct mv_q4_0 {
    static constexpr int QK = 32, BYTES = Q4_0_BYTES, LPB = 1, ROUNDS = 1;
    static constexpr bool PIPE = true;
    using Act = act32;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int, Act& a) { load_act32(y, b, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int, const Act& a) {
        uint32_t q[4];
        st_words<4>(st, o + 2, q);
        const int s = dot_nib32(q, a);
        return st_f16(st, o) * (a.d * (float)s - 8.0f * a.s);
    }
};

// Q4_1: d, m, 16 bytes of nibbles; value = d q + m.
struct mv_q4_1 {
    static constexpr int QK = 32, BYTES = Q4_1_BYTES, LPB = 1, ROUNDS = 1;
    static constexpr bool PIPE = true;
    using Act = act32;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int, Act& a) { load_act32(y, b, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int, const Act& a) {
        uint32_t q[4];
        st_words<4>(st, o + 4, q);
        const int s = dot_nib32(q, a);
        return st_f16(st, o) * a.d * (float)s + st_f16(st, o + 2) * a.s;
    }
};

// Q5_1: d, m, the fifth bits (4 bytes), 16 bytes of nibbles; value = d q + m.
struct mv_q5_1 {
    static constexpr int QK = 32, BYTES = Q5_1_BYTES, LPB = 1, ROUNDS = 1;
    static constexpr bool PIPE = false;
    using Act = act32;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int, Act& a) { load_act32(y, b, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int, const Act& a) {
        uint32_t v[5];  // qh, then 4 words of qs
        st_words<5>(st, o + 4, v);
        const int s = dot_nib5_32(v, a);
        return st_f16(st, o) * a.d * (float)s + st_f16(st, o + 2) * a.s;
    }
};

static __device__ __forceinline__ int sub4_bytes(int q) {
    return (int)((((uint32_t)q | 0x80808080u) - 0x04040404u) ^ 0x80808080u);
}

// Q2_K: 2-bit values at shift 2j of qs[32n + l]; scale (low nibble) and min (high nibble) byte
// 8n + 2j + h per 16 values; d and dmin at 80 and 82.
struct mv_q2_k {
    static constexpr int QK = QK_K, BYTES = Q2_K_BYTES, LPB = 4, ROUNDS = 1;
    static constexpr bool PIPE = false;
    using Act = act_h16;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int c, Act& a) { load_act_h16(y, b, c, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int c, const Act& a) {
        const int n = c >> 1, h = c & 1;
        uint32_t q[4], sc[2];
        st_words<4>(st, o + 16 + 32 * n + 16 * h, q);
        st_words<2>(st, o + 8 * n, sc);
        float acc_d = 0.0f, acc_m = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int s = 0, su = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                s = dot4_i8((int)(q[k] >> (2 * j)) & 0x03030303, word(a.q[j], k), s);
                su = dot4_i8(ones(), word(a.q[j], k), su);
            }
            const int sm = (int)(sc[j >> 1] >> (8 * (2 * (j & 1) + h))) & 0xFF;
            acc_d += (float)((sm & 0xF) * s) * a.d[j];
            acc_m += (float)((sm >> 4) * su) * a.d[j];
        }
        uint32_t dm[1];
        st_words<1>(st, o + 80, dm);
        return lo_f16(dm[0]) * acc_d - hi_f16(dm[0]) * acc_m;
    }
};

// Q3_K: 2 low bits at shift 2j of qs[32n + l] (from byte 32), the high bit (set means "no -4") at
// bit 4n + j of hmask[l]; signed 6-bit scales per 16 values (index 8n + 2j + h: low 4 bits in
// nibble n of byte 2j + h, high 2 bits at bit 2(2n + j / 2) of byte 8 + 2(j % 2) + h, from 96);
// d at 108.
struct mv_q3_k {
    static constexpr int QK = QK_K, BYTES = Q3_K_BYTES, LPB = 4, ROUNDS = 1;
    static constexpr bool PIPE = false;
    using Act = act_h16;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int c, Act& a) { load_act_h16(y, b, c, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int c, const Act& a) {
        const int n = c >> 1, h = c & 1;
        uint32_t q[4], hm[4], sc[3];
        st_words<4>(st, o + 32 + 32 * n + 16 * h, q);
        st_words<4>(st, o + 16 * h, hm);
        st_words<3>(st, o + 96, sc);
        float acc = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            int s = 0;
#pragma unroll
            for (int k = 0; k < 4; ++k) {
                const int lo = (int)(q[k] >> (2 * j)) & 0x03030303;
                const int hb = (int)(hm[k] >> (4 * n + j)) & 0x01010101;
                s = dot4_i8(sub4_bytes(lo | (hb << 2)), word(a.q[j], k), s);
            }
            const int bi = 2 * (j & 1) + h;  // byte 2j + h is byte bi of word j / 2
            const int lo4 = (int)(sc[j >> 1] >> (8 * bi + 4 * n)) & 0xF;
            const int hi2 = (int)(sc[2] >> (8 * bi + 2 * (2 * n + (j >> 1)))) & 3;
            acc += (float)(((lo4 | (hi2 << 4)) - 32) * s) * a.d[j];
        }
        return st_f16(st, o + 108) * acc;
    }
};

// Rows read through shared memory: per step, each of the warp's R rows contributes
// G = ROUNDS * warp / LPB consecutive blocks, which the warp first copies into its stage with
// coalesced loads (all loads of all rows issued before the first store, so each lane has several
// in flight), then each lane reads its part of ROUNDS blocks out of the stage.
template <typename T>
struct stage_dims {
    static constexpr int G = T::ROUNDS * RF_WARP / T::LPB;
    static constexpr int SPAN = G * T::BYTES;
    static constexpr int WORDS = ((SPAN + 3) / 4 + 2 + 3) & ~3;  // + start offset, + slack, 16-byte rows
};

// Dot products of rows row0 .. row0 + R - 1 of `w` with the activation vectors c0 .. c0 + nc - 1
// of `y` (nc at most NC) over the steps kp, kp + KS, ... (each step G blocks), per lane, into acc[column][row]
// (the caller sums across the warp). Each staged weight block serves every column.
template <typename T, int R, int KS, bool A16, int NC = 1>
static __device__ __forceinline__ void staged_rows(const uint8_t* __restrict__ w, const uint8_t* __restrict__ y,
                                                   int c0, int nc, int ncols, long long row_bytes, int nrows, int row0, int lane,
                                                   int wid, int kp, uint32_t (*stage)[R][stage_dims<T>::WORDS],
                                                   float (*acc)[R]) {
    constexpr int G = stage_dims<T>::G;
    constexpr int SPAN = stage_dims<T>::SPAN;
    constexpr int IT = A16 ? (SPAN / 16 + RF_WARP - 1) / RF_WARP : (SPAN / 4 + 2 + RF_WARP - 1) / RF_WARP;
    const uint8_t* wr[R];
#pragma unroll
    for (int r = 0; r < R; ++r) wr[r] = w + (long long)min(row0 + r, nrows - 1) * row_bytes;
    const int nblk = ncols / T::QK;
    const int part = lane % T::LPB, bl = lane / T::LPB;
    for (int b0 = kp * G; b0 < nblk; b0 += KS * G) {
        const int bytes = min(G, nblk - b0) * T::BYTES;
        int off[R];
        if (A16) {
            const int n = (bytes + 15) / 16;
            rf_b128 v[R][IT];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const rf_b128* src = reinterpret_cast<const rf_b128*>(wr[r] + (long long)b0 * T::BYTES);
#pragma unroll
                for (int i = 0; i < IT; ++i)
                    if (lane + i * RF_WARP < n) v[r][i] = src[lane + i * RF_WARP];
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                off[r] = 0;
#pragma unroll
                for (int i = 0; i < IT; ++i)
                    if (lane + i * RF_WARP < n) reinterpret_cast<rf_b128*>(stage[wid][r])[lane + i * RF_WARP] = v[r][i];
            }
        } else {
            uint32_t v[R][IT];
            int n[R];
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const uint8_t* src = wr[r] + (long long)b0 * T::BYTES;
                off[r] = (int)((uintptr_t)src & 3);
                n[r] = (off[r] + bytes + 3) / 4;
                const uint32_t* s4 = reinterpret_cast<const uint32_t*>(src - off[r]);
#pragma unroll
                for (int i = 0; i < IT; ++i)
                    if (lane + i * RF_WARP < n[r]) v[r][i] = s4[lane + i * RF_WARP];
            }
#pragma unroll
            for (int r = 0; r < R; ++r)
#pragma unroll
                for (int i = 0; i < IT; ++i)
                    if (lane + i * RF_WARP < n[r]) stage[wid][r][lane + i * RF_WARP] = v[r][i];
        }
        rf_syncwarp();
#pragma unroll
        for (int k = 0; k < T::ROUNDS; ++k) {
            const int bk = bl + k * (RF_WARP / T::LPB);
            if (b0 + bk < nblk)
#pragma unroll
                for (int j = 0; j < NC; ++j)
                    if (NC == 1 || j < nc) {
                        typename T::Act a;
                        T::load_act(q8_vec_at(y, ncols, c0 + j), b0 + bk, part, a);
#pragma unroll
                        for (int r = 0; r < R; ++r)
                            acc[j][r] += T::dot(stage[wid][r], off[r] + bk * T::BYTES, part, a);
                    }
        }
        rf_syncwarp();
    }
}

// Rows per block: MV_WARPS / KS warps side by side, R rows each (KS warps share each row).
template <int R, int KS>
struct mv_rows {
    static constexpr int PER_BLOCK = MV_WARPS / KS * R;
};

// --- Pipelined weight stream (NVIDIA compute capability 8.0 and later) -----------------------
// Each warp streams its rows through a ring of S shared-memory stages filled by asynchronous
// copies (cp.async): while it computes step k, steps k + 1 .. k + S - 1 are in flight, without
// holding registers. The first S - 1 steps are requested before rf_entry(): weights are
// read-only, so a kernel launched early loads them while the kernel before it finishes.
// Shared-memory bytes per warp the pipeline's stages aim at; the stage count is this over the
// bytes one step takes (all rows), at least 2.
#ifndef MV_PIPE_BYTES
#define MV_PIPE_BYTES 4608
#endif

template <typename T, int NR>
struct pipe_dims {
    static constexpr int G = T::ROUNDS * RF_WARP / T::LPB;  // blocks per row per step
    static constexpr int SPAN = G * T::BYTES;
    static constexpr int WORDS = (SPAN / 4 + 4 + 3) & ~3;  // + slack for st_words, 16-byte rows
    static constexpr int S = MV_PIPE_BYTES / (NR * SPAN) > 2 ? MV_PIPE_BYTES / (NR * SPAN) : 2;
};

// Whether a mat-vec takes the pipeline: one warp per row group (KS = 1) and 16-byte aligned rows
// (every staged type's step spans a multiple of 16 bytes, so no copy crosses a row's end).
template <int KS, bool FITS = true>
static __device__ __forceinline__ bool mv_pipe_ok(const uint8_t* w, const uint8_t* w2, long long row_bytes) {
#if defined(RF_CP_ASYNC)
    return KS == 1 && FITS && (((uintptr_t)w | (uintptr_t)(w2 ? w2 : w) | (uintptr_t)row_bytes) & 15) == 0;
#else
    return false;
#endif
}

// Requests step k (if there is one) of rows wr[0 .. NR) into its stage, as one copy group (an
// empty one past the end, so that the groups keep counting steps).
template <typename T, int NR>
static __device__ __forceinline__ void pipe_issue(const uint8_t* const* wr, int k, int nblk, int lane,
                                                  uint32_t (*ring)[NR][pipe_dims<T, NR>::WORDS]) {
    using D = pipe_dims<T, NR>;
    if (k * D::G < nblk) {
        const int n = (min(D::G, nblk - k * D::G) * T::BYTES + 15) / 16;
#pragma unroll
        for (int r = 0; r < NR; ++r) {
            const uint8_t* src = wr[r] + (long long)k * D::SPAN;
            uint32_t* dst = ring[k % D::S][r];
            for (int i = lane; i < n; i += RF_WARP) cp_async16(dst + 4 * i, src + 16 * i);
        }
    }
    cp_async_commit();
}

// Dot products of rows wr[0 .. NR) with the activation vector, per lane (the caller sums across
// the warp). Calls rf_entry() after requesting the first steps unless `entered`.
template <typename T, int NR>
static __device__ __forceinline__ void pipe_rows(const uint8_t* const* wr, const uint8_t* __restrict__ y, int ncols,
                                                 int lane, uint32_t (*ring)[NR][pipe_dims<T, NR>::WORDS],
                                                 float* acc, bool& entered) {
    using D = pipe_dims<T, NR>;
    const int nblk = ncols / T::QK;
#pragma unroll
    for (int k = 0; k < D::S - 1; ++k) pipe_issue<T, NR>(wr, k, nblk, lane, ring);
    if (!entered) {
        rf_entry();
        entered = true;
    }
    const q8_vec yv = q8_vec_at(y, ncols, blockIdx.y);
    const int part = lane % T::LPB, bl = lane / T::LPB;
    for (int k = 0; k * D::G < nblk; ++k) {
        pipe_issue<T, NR>(wr, k + D::S - 1, nblk, lane, ring);
        // The step's activations load while its weights land.
        typename T::Act a[T::ROUNDS];
#pragma unroll
        for (int j = 0; j < T::ROUNDS; ++j)
            T::load_act(yv, min(k * D::G + bl + j * (RF_WARP / T::LPB), nblk - 1), part, a[j]);
        cp_async_wait<D::S - 1>();  // step k has landed (groups complete in order)
        rf_syncwarp();              // ... for every lane's copies
#pragma unroll
        for (int j = 0; j < T::ROUNDS; ++j) {
            const int bk = bl + j * (RF_WARP / T::LPB);
            if (k * D::G + bk < nblk)
#pragma unroll
                for (int r = 0; r < NR; ++r) acc[r] += T::dot(ring[k % D::S][r], bk * T::BYTES, part, a[j]);
        }
        rf_syncwarp();  // the stage is read before a later step refills it
    }
}

// 32-bit words of shared memory the pipeline of R rows per warp (NM matrices) takes; 0 where
// there is no pipeline, for types that measured faster off it (T::PIPE false), or where two
// stages would not fit next to a block's other static shared memory, which then keeps the
// register stage.
template <typename T, int R, int NM, bool ON = T::PIPE>
struct pipe_smem {
    static constexpr int WORDS = 0;
};

#if defined(RF_CP_ASYNC)
template <typename T, int R, int NM>
struct pipe_smem<T, R, NM, true> {
    static constexpr int NEED = MV_WARPS * pipe_dims<T, NM * R>::S * NM * R * pipe_dims<T, NM * R>::WORDS;
    static constexpr int WORDS = NEED * 4 <= 40 * 1024 ? NEED : 0;
};
#endif

// Whether this mat-vec (R rows per warp, KS warps per row group, NM matrices) runs on the pipeline.
template <typename T, int R, int KS, int NM>
static __device__ __forceinline__ bool mv_piped(const uint8_t* w, const uint8_t* w2, long long row_bytes) {
    return mv_pipe_ok<KS, (pipe_smem<T, R, NM>::WORDS > 0)>(w, w2, row_bytes);
}

// The mat-vec body on the pipeline: R rows per warp of `w` (and of `w2` when NM = 2: gated),
// one grid-stride row group at a time; `smem` holds pipe_smem's words.
template <typename T, int R, int NM, class EP>
static __device__ __forceinline__ void matvec_pipe(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                   const float* __restrict__ bias, const uint8_t* __restrict__ y,
                                                   float* __restrict__ out, int ncols, long long row_bytes,
                                                   int out_stride, int nrows, int act_kind, uint32_t* smem,
                                                   const EP& ep) {
    constexpr int NR = NM * R;
    using Ring = uint32_t[pipe_dims<T, NM * R>::S][NM * R][pipe_dims<T, NM * R>::WORDS];
    Ring* ring = reinterpret_cast<Ring*>(smem);
    const int lane = threadIdx.x % RF_WARP;
    const int wid = threadIdx.x / RF_WARP;
    bool entered = false;
    if (wid < MV_WARPS) {  // whole warps leave together (the host launches MV_WARPS)
        constexpr int PB = mv_rows<R, 1>::PER_BLOCK;
        for (int row0 = blockIdx.x * PB + wid * R; row0 < nrows; row0 += gridDim.x * PB) {
            const uint8_t* wr[NR];
#pragma unroll
            for (int m = 0; m < NM; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r)
                    wr[m * R + r] = (m ? w2 : w) + (long long)min(row0 + r, nrows - 1) * row_bytes;
            float acc[2][R];
#pragma unroll
            for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = 0.0f;
            pipe_rows<T, NR>(wr, y, ncols, lane, ring[wid], &acc[0][0], entered);
            mv_finish<R, NM, 1>(acc, bias, act_kind, out, lane, wid, row0, nrows, out_stride, ep);
        }
    }
    if (!entered) rf_entry();
}

// `w2` non-null (gated): out = act(w . y) * (w2 . y), both matrices of the same shape and type;
// `bias` non-null: out += bias[row].
template <typename T, int R, int KS, bool A16, class EP>
static __device__ __forceinline__ void matvec_staged_impl(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                          const float* __restrict__ bias,
                                                          const uint8_t* __restrict__ y, float* __restrict__ out,
                                                          int ncols, long long row_bytes, int out_stride, int nrows,
                                                          int act_kind, uint32_t (*stage)[R][stage_dims<T>::WORDS],
                                                          const EP& ep) {
    const int lane = threadIdx.x % RF_WARP;
    const int wid = threadIdx.x / RF_WARP;
    if (wid >= MV_WARPS) return;  // whole warps leave together (the host launches MV_WARPS)
    constexpr int PB = mv_rows<R, KS>::PER_BLOCK;
    const int kp = wid % KS;
    // A grid smaller than the row count loops; with KS > 1 every warp of a block runs the same
    // iterations (the epilogue synchronizes the block).
    for (int row0 = blockIdx.x * PB + (wid / KS) * R; row0 < nrows; row0 += gridDim.x * PB) {
        float acc[2][R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = 0.0f;
        staged_rows<T, R, KS, A16>(w, y, blockIdx.y, 1, ncols, row_bytes, nrows, row0, lane, wid, kp, stage, &acc[0]);
        // (a runtime branch: choosing it at compile time measured 1% slower on an all-Q5_0 8B)
        if (w2) {
            staged_rows<T, R, KS, A16>(w2, y, blockIdx.y, 1, ncols, row_bytes, nrows, row0, lane, wid, kp, stage, &acc[1]);
            mv_finish<R, 2, KS>(acc, bias, act_kind, out, lane, wid, row0, nrows, out_stride, ep);
        } else {
            mv_finish<R, 1, KS>(acc, bias, act_kind, out, lane, wid, row0, nrows, out_stride, ep);
        }
    }
}

// Shared-memory words of the staged mat-vec: the pipeline and the register stage share them.
template <typename T, int R, int KS, int NM>
struct staged_smem {
    static constexpr int STAGE = MV_WARPS * R * stage_dims<T>::WORDS;
    static constexpr int PIPE = KS == 1 ? pipe_smem<T, R, NM>::WORDS : 0;
    static constexpr int WORDS = STAGE > PIPE ? STAGE : PIPE;
};

// NM: 2 when `w2` is given (gated), else 1.
template <typename T, int R, int KS, int NM = 1, class EP = mv_store>
static __device__ __forceinline__ void matvec_staged(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                     const float* __restrict__ bias, const uint8_t* __restrict__ y,
                                                     float* __restrict__ out, int ncols, long long row_bytes,
                                                     int out_stride, int nrows, int act_kind, const EP& ep = EP()) {
    __shared__ __align__(16) uint32_t smem[staged_smem<T, R, KS, NM>::WORDS];
    if (mv_piped<T, R, KS, NM>(w, w2, row_bytes)) {
        matvec_pipe<T, R, NM>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows, act_kind, smem, ep);
        return;
    }
    // 16-byte loads when every row starts 16-byte aligned (a full step's span is a multiple of
    // 16 for every staged type; a last, shorter one reads at most to the end of its 16-byte chunk).
    auto stage = reinterpret_cast<uint32_t(*)[R][stage_dims<T>::WORDS]>(smem);
    if ((((uintptr_t)w | (uintptr_t)(w2 ? w2 : w) | (uintptr_t)row_bytes) & 15) == 0)
        matvec_staged_impl<T, R, KS, true>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows, act_kind, stage,
                                           ep);
    else
        matvec_staged_impl<T, R, KS, false>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows, act_kind, stage,
                                            ep);
}

struct mv_q5_k {
    static constexpr int QK = QK_K, BYTES = Q5_K_BYTES, LPB = 8;
    static constexpr bool PIPE = false;
    using Act = act_k4;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int c, Act& a) { load_act_k4(y, b, c, a); }
    struct Raw {
        int4 hdr, qh, q;
    };
    template <bool A16>
    static __device__ __forceinline__ Raw load(const uint8_t* blk, int c) {
        return Raw{ld_w128<A16>(blk), ld_w128<A16>(blk + 16 + 16 * (c & 1)), ld_w128<A16>(blk + 48 + 16 * c)};
    }
    static __device__ __forceinline__ float compute(const Raw& w, int c, const Act& a) {
        const int u = c >> 1;
        const int4 hdr = w.hdr, qh = w.qh, q = w.q;
        int slo = 0, shi = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int lo = (word(q, k) & 0x0F0F0F0F) | (((word(qh, k) >> (2 * u)) & 0x01010101) << 4);
            const int hi = ((word(q, k) >> 4) & 0x0F0F0F0F) | (((word(qh, k) >> (2 * u + 1)) & 0x01010101) << 4);
            slo = dot4_i8(lo, word(a.lo, k), slo);
            shi = dot4_i8(hi, word(a.hi, k), shi);
        }
        return k4_finish(hdr, u, slo, shi, a);
    }
};

// Dot products of rows row0 .. row0 + R - 1 of the NM matrices `ws` (gate and up: their loads
// in flight together) with the activation vector over the block groups kp, kp + KS, ... (U * G
// blocks each), per lane (the caller sums across the warp).
template <typename T, int R, int U, int NM, int KS, bool A16>
static __device__ __forceinline__ void direct_rows(const uint8_t* const* ws, q8_vec yv, int ncols,
                                                   long long row_bytes, int nrows, int row0, int lane, int kp,
                                                   float (*acc)[R]) {
    constexpr int G = RF_WARP / T::LPB;
    const uint8_t* wr[NM][R];
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int r = 0; r < R; ++r) wr[m][r] = ws[m] + (long long)min(row0 + r, nrows - 1) * row_bytes;
    const int nblk = ncols / T::QK;
    const int part = lane % T::LPB;
    // U blocks per lane per step, every load issued before the first dot product.
    for (int b0 = kp * U * G + lane / T::LPB; b0 < nblk; b0 += KS * U * G) {
        typename T::Act a[U];
        typename T::Raw raw[U][NM][R];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int b = min(b0 + u * G, nblk - 1);
            T::load_act(yv, b, part, a[u]);
#pragma unroll
            for (int m = 0; m < NM; ++m)
#pragma unroll
                for (int r = 0; r < R; ++r) raw[u][m][r] = T::template load<A16>(wr[m][r] + (size_t)b * T::BYTES, part);
        }
#pragma unroll
        for (int u = 0; u < U; ++u)
            if (b0 + u * G < nblk)
#pragma unroll
                for (int m = 0; m < NM; ++m)
#pragma unroll
                    for (int r = 0; r < R; ++r) acc[m][r] += T::compute(raw[u][m][r], part, a[u]);
    }
}

// `w2` non-null (gated): out = act(w . y) * (w2 . y), both matrices of the same shape and type;
// `bias` non-null: out += bias[row].
template <typename T, int R, int U, int KS, int NM, bool A16, class EP>
static __device__ __forceinline__ void matvec_direct_impl(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                          const float* __restrict__ bias,
                                                          const uint8_t* __restrict__ y, float* __restrict__ out,
                                                          int ncols, long long row_bytes, int out_stride, int nrows,
                                                          int act_kind, const EP& ep) {
    const int lane = threadIdx.x % RF_WARP;
    const int wid = threadIdx.x / RF_WARP;
    if (wid >= MV_WARPS) return;  // whole warps leave together (the host launches MV_WARPS)
    const q8_vec yv = q8_vec_at(y, ncols, blockIdx.y);
    constexpr int PB = mv_rows<R, KS>::PER_BLOCK;
    const int kp = wid % KS;
    const uint8_t* ws[2] = {w, w2};
    for (int row0 = blockIdx.x * PB + (wid / KS) * R; row0 < nrows; row0 += gridDim.x * PB) {
        float acc[2][R];
#pragma unroll
        for (int r = 0; r < R; ++r) acc[0][r] = acc[1][r] = 0.0f;
        direct_rows<T, R, U, NM, KS, A16>(ws, yv, ncols, row_bytes, nrows, row0, lane, kp, acc);
        mv_finish<R, NM, KS>(acc, bias, act_kind, out, lane, wid, row0, nrows, out_stride, ep);
    }
}

template <typename T, int R, int KS, int NM = 1, int U = 1, class EP = mv_store>
static __device__ __forceinline__ void matvec_direct(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                     const float* __restrict__ bias, const uint8_t* __restrict__ y,
                                                     float* __restrict__ out, int ncols, long long row_bytes,
                                                     int out_stride, int nrows, int act_kind, const EP& ep = EP()) {
    if ((((uintptr_t)w | (uintptr_t)(w2 ? w2 : w) | (uintptr_t)row_bytes) & 15) == 0)
        matvec_direct_impl<T, R, U, KS, NM, true>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows, act_kind,
                                                  ep);
    else
        matvec_direct_impl<T, R, U, KS, NM, false>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows, act_kind,
                                                   ep);
}

// Blocks per lane in flight of the plain Q4_K/Q5_K mat-vecs.
#ifndef MV_DIRECT_U
#define MV_DIRECT_U 2
#endif

template <typename T, int R, int KS, int NM = 1, class EP = mv_store>
static __device__ __forceinline__ void matvec_direct2(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                      const float* __restrict__ bias, const uint8_t* __restrict__ y,
                                                      float* __restrict__ out, int ncols, long long row_bytes,
                                                      int out_stride, int nrows, int act_kind, const EP& ep = EP()) {
    matvec_direct<T, R, KS, NM, MV_DIRECT_U, EP>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows, act_kind,
                                                 ep);
}

// Up to three matrices of one type and row length times the same activations in one launch (the
// q, k and v projections of a decode step): blocks [0, b1) take w0's rows, [b1, b2) w1's, the rest
// w2's (n2 = 0 and w2 null for two). Each block runs the plain kernel's body with the matrix and
// output shifted back by its first row, so that its blockIdx.x lands on that matrix's row 0 and
// the grid-stride loop ends after one round (the grid covers every row of all three).
struct mv_pick {
    const uint8_t* w;  // the matrix, shifted back by `shift` rows
    float* out;        // its output, shifted back by `shift` values
    int n;             // its rows (the output stride between activation vectors)
    int shift;         // rows before this matrix's first block
    int m;             // which matrix: 0, 1 or 2
};

static __device__ __forceinline__ mv_pick mv_multi_pick(int per_block, const uint8_t* w0, const uint8_t* w1,
                                                        const uint8_t* w2, float* o0, float* o1, float* o2,
                                                        long long row_bytes, int n0, int n1, int n2) {
    const int b1 = (n0 + per_block - 1) / per_block;
    const int b2 = b1 + (n1 + per_block - 1) / per_block;
    const int bx = blockIdx.x;
    const uint8_t* w = bx < b1 ? w0 : bx < b2 ? w1 : w2;
    float* o = bx < b1 ? o0 : bx < b2 ? o1 : o2;
    const int n = bx < b1 ? n0 : bx < b2 ? n1 : n2;
    const int shift = (bx < b1 ? 0 : bx < b2 ? b1 : b2) * per_block;
    // Integer arithmetic: the shifted addresses are never dereferenced below row `shift`.
    return {reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(w) - (uintptr_t)(shift * row_bytes)),
            reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(o) - (uintptr_t)shift * sizeof(float)), n, shift,
            bx < b1 ? 0 : bx < b2 ? 1 : 2};
}

// Bytes at the start of each weight row that a mat-vec prefetches before it waits. Whole rows
// measured slower on the 8B shapes (the prefetches of later steps queue ahead of the loads the
// warps wait for); the sizes tried are in kernels/PERF.md.
#ifndef MV_PREFETCH_BYTES
#define MV_PREFETCH_BYTES 512
#endif
// Matrices of at least MV_PREFETCH_TALL_ROWS rows (output heads) prefetch up to
// MV_PREFETCH_TALL_BYTES of each row instead (whole rows of 4096-wide heads): their blocks come
// in many waves, and a block's rows requested at once keep more bytes in flight than the staged
// loads alone; the cap keeps the resident blocks' prefetches well inside L2 (kernels/PERF.md).
// Where the decode stack runs, tall Q6_K heads of one vector go to head_q6_k (stack.hip), which
// streams them as the stack does its products.
#ifndef MV_PREFETCH_TALL_ROWS
#define MV_PREFETCH_TALL_ROWS 65536
#endif
#ifndef MV_PREFETCH_TALL_BYTES
#define MV_PREFETCH_TALL_BYTES 4096
#endif

// Kernel entry of the mat-vecs: prefetch the first bytes of this block's rows of `w` (and
// `w2`) toward L2, then rf_entry(). Weights are read-only, so they may be fetched before the
// previous kernel ends.
// Nothing on the pipeline, which loads its first steps and calls rf_entry() itself.
template <typename T, int R, int KS, int NM>
static __device__ __forceinline__ void mv_entry(const uint8_t* w, const uint8_t* w2, long long row_bytes, int nrows) {
    if (mv_piped<T, R, KS, NM>(w, w2, row_bytes)) return;
    constexpr int PB = mv_rows<R, KS>::PER_BLOCK;
    const int row0 = blockIdx.x * PB;
    const int rows = max(0, min(PB, nrows - row0));
    const long long cap = nrows >= MV_PREFETCH_TALL_ROWS ? MV_PREFETCH_TALL_BYTES : MV_PREFETCH_BYTES;
    const int lines = (int)((min(row_bytes, cap) + 127) / 128);
    for (int i = threadIdx.x; i < rows * lines; i += blockDim.x) {
        const long long o = (long long)(row0 + i / lines) * row_bytes + 128 * (i % lines);
        rf_prefetch_l2(w + o);
        if (w2) rf_prefetch_l2(w2 + o);
    }
    rf_entry();
}

// A register budget of MINB resident blocks per multiprocessor (`__launch_bounds__`); on AMD only
// the block size is bounded, as the second argument means something else there.
#if defined(RF_NVIDIA)
#define RF_LB(minb) __launch_bounds__(MV_WARPS * RF_WARP, minb)
#else
#define RF_LB(minb) __launch_bounds__(MV_WARPS * RF_WARP)
#endif

// The block size alone, for the mat-vecs without a register bound (only AMD needs it).
#define MV_BOUND RF_AMD_BOUNDS(MV_WARPS * RF_WARP)

// `name_gated` (two matrices of the same shape, act(gate) * up) with R rows per warp; `attrs`
// MV_BOUND or a register bound (RF_LB).
#define RF_MATVEC_GATED(name, attrs, shape, T, R)                                                                \
    RF_KERNEL void attrs name##_gated(const uint8_t* wg, const uint8_t* wu, const uint8_t* y, float* out,        \
                                      int ncols, long long row_bytes, int out_stride, int nrows, int act_kind) { \
        mv_entry<T, R, 1, 2>(wg, wu, row_bytes, nrows);                                                          \
        shape<T, R, 1, 2>(wg, wu, nullptr, y, out, ncols, row_bytes, out_stride, nrows, act_kind);               \
    }

// Each mat-vec comes as `name` (plain), `name_add` (plus a bias row), the K-split `name_ks` /
// `name_ks_add` (all MV_WARPS warps of a block share R rows, each taking every MV_WARPS-th part of
// them: for long rows and few of them) and `name_multi` (up to three matrices in one grid, see
// `mv_multi_pick`); `attrs` empty or a register bound (RF_LB).
#define RF_MATVEC_FAST(name, attrs, shape, T, R)                                                                     \
    RF_KERNEL void attrs name(const uint8_t* w, const uint8_t* y, float* out, int ncols, long long row_bytes,        \
                              int out_stride, int nrows) {                                                           \
        mv_entry<T, R, 1, 1>(w, nullptr, row_bytes, nrows);                                                          \
        shape<T, R, 1>(w, nullptr, nullptr, y, out, ncols, row_bytes, out_stride, nrows, 0);                         \
    }                                                                                                                \
    RF_KERNEL void attrs name##_add(const uint8_t* w, const float* bias, const uint8_t* y, float* out, int ncols,    \
                                    long long row_bytes, int out_stride, int nrows) {                                \
        mv_entry<T, R, 1, 1>(w, nullptr, row_bytes, nrows);                                                          \
        shape<T, R, 1>(w, nullptr, bias, y, out, ncols, row_bytes, out_stride, nrows, 0);                            \
    }                                                                                                                \
    RF_KERNEL void attrs name##_ks(const uint8_t* w, const uint8_t* y, float* out, int ncols, long long row_bytes,   \
                                   int out_stride, int nrows) {                                                      \
        mv_entry<T, R, MV_WARPS, 1>(w, nullptr, row_bytes, nrows);                                                   \
        shape<T, R, MV_WARPS>(w, nullptr, nullptr, y, out, ncols, row_bytes, out_stride, nrows, 0);                  \
    }                                                                                                                \
    RF_KERNEL void attrs name##_ks_add(const uint8_t* w, const float* bias, const uint8_t* y, float* out, int ncols, \
                                       long long row_bytes, int out_stride, int nrows) {                             \
        mv_entry<T, R, MV_WARPS, 1>(w, nullptr, row_bytes, nrows);                                                   \
        shape<T, R, MV_WARPS>(w, nullptr, bias, y, out, ncols, row_bytes, out_stride, nrows, 0);                     \
    }                                                                                                                \
    RF_KERNEL void attrs name##_multi(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2, const uint8_t* y,     \
                                      float* o0, float* o1, float* o2, int ncols, long long row_bytes,               \
                                      int n0, int n1, int n2) {                                                      \
        const mv_pick p = mv_multi_pick(MV_WARPS * R, w0, w1, w2, o0, o1, o2, row_bytes, n0, n1, n2);                \
        mv_entry<T, R, 1, 1>(p.w, nullptr, row_bytes, p.shift + p.n);                                                \
        shape<T, R, 1>(p.w, nullptr, nullptr, y, p.out, ncols, row_bytes, p.n, p.shift + p.n, 0);                    \
    }

// Rows per warp (R) of each mat-vec; `kernels::WeightType::matvec_rows_per_block` is
// MV_WARPS * R. Chosen with `cargo bench -p rocmforge-kernels --bench decode` (kernels/PERF.md): Q4_K/Q5_K
// read directly, one row per warp and two blocks per lane in flight; the 2-byte aligned types go
// through the stage with two rows.
RF_MATVEC_FAST(matvec_q4_0, MV_BOUND, matvec_staged, mv_q4_0, 2)
RF_MATVEC_FAST(matvec_q5_0, MV_BOUND, matvec_staged, mv_q5_0, 2)
RF_MATVEC_FAST(matvec_q8_0, MV_BOUND, matvec_staged, mv_q8_0, 2)
// Q4_1 / Q5_1 likewise.
RF_MATVEC_FAST(matvec_q4_1, MV_BOUND, matvec_staged, mv_q4_1, 2)
RF_MATVEC_FAST(matvec_q5_1, MV_BOUND, matvec_staged, mv_q5_1, 2)
// Q2_K / Q3_K likewise (they went through one warp per row with scattered loads before: less
// than half the speed).
RF_MATVEC_FAST(matvec_q2_k, MV_BOUND, matvec_staged, mv_q2_k, 2)
RF_MATVEC_FAST(matvec_q3_k, MV_BOUND, matvec_staged, mv_q3_k, 2)
// Q6_K stage rounds per step (8 blocks of each row staged per round): one measured fastest.
#ifndef MV_Q6K_ROUNDS
#define MV_Q6K_ROUNDS 1
#endif
RF_MATVEC_FAST(matvec_q6_k, MV_BOUND, matvec_staged, mv_q6_k<MV_Q6K_ROUNDS>, 2)
// Q4_K within 64 registers (8 blocks of 128 threads per SM): the 8B's 4096-row products (1024
// blocks) then run in one wave instead of 1.1 (72 registers, 7 blocks per SM).
RF_MATVEC_FAST(matvec_q4_k, RF_LB(8), matvec_direct2, mv_q4_k, 1)
RF_MATVEC_FAST(matvec_q5_k, MV_BOUND, matvec_direct2, mv_q5_k, 1)
RF_MATVEC_GATED(matvec_q4_0, MV_BOUND, matvec_staged, mv_q4_0, 2)
RF_MATVEC_GATED(matvec_q5_0, MV_BOUND, matvec_staged, mv_q5_0, 2)
RF_MATVEC_GATED(matvec_q8_0, MV_BOUND, matvec_staged, mv_q8_0, 2)
RF_MATVEC_GATED(matvec_q4_1, MV_BOUND, matvec_staged, mv_q4_1, 2)
RF_MATVEC_GATED(matvec_q5_1, MV_BOUND, matvec_staged, mv_q5_1, 2)
RF_MATVEC_GATED(matvec_q2_k, MV_BOUND, matvec_staged, mv_q2_k, 2)
RF_MATVEC_GATED(matvec_q3_k, MV_BOUND, matvec_staged, mv_q3_k, 2)
// Q6_K gated stages two rounds per step on NVIDIA (measured); on AMD two rounds of gate and up
// rows exceed the register file (wave32: 256 VGPRs and spills), so one.
#ifndef MV_Q6K_GATED_ROUNDS
#if defined(RF_NVIDIA)
#define MV_Q6K_GATED_ROUNDS 2
#else
#define MV_Q6K_GATED_ROUNDS 1
#endif
#endif
RF_MATVEC_GATED(matvec_q6_k, MV_BOUND, matvec_staged, mv_q6_k<MV_Q6K_GATED_ROUNDS>, 2)
RF_MATVEC_GATED(matvec_q5_k, MV_BOUND, matvec_direct2, mv_q5_k, 1)
// Q4_K gated: two rows per warp and one block per lane in flight (four weight rows per activation
// load) within 64 registers (8 blocks of 128 threads per SM);
// `kernels::WeightType::matvec_gated_rows_per_block` is 8.
RF_MATVEC_GATED(matvec_q4_k, RF_LB(8), matvec_direct, mv_q4_k, 2)

// =============================================================================================
// Mat-vecs of a few activation vectors (a batched decode step, 2 to 4 columns): each block takes
// NC columns (grid.y = ceil(m / NC)) and dots every weight block it reads with all of them, where
// the kernels above read the weights once per column (one vector per grid row; L2 does not hold
// an 8B's matrices between the columns' blocks).
// =============================================================================================

// Warp sums of the N values v[0 .. N) (N a power of two up to the warp size) in N - 1 +
// log2(warp / N) shuffles instead of N log2(warp): each halving step, lanes with the step's lane
// bit set keep the upper half of their values and the others the lower half, each adding its
// partner's copy of the half it keeps. Returns the total of value lane / (warp / N), which every
// lane of that group of warp / N lanes holds.
template <int N>
static __device__ __forceinline__ float warp_sum_many(float* v, int lane) {
    static_assert(N >= 1 && N <= RF_WARP && (N & (N - 1)) == 0, "N: a power of two up to the warp size");
    constexpr int STEPS = N >= 32 ? 5 : N >= 16 ? 4 : N >= 8 ? 3 : N >= 4 ? 2 : N >= 2 ? 1 : 0;
#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
        const int half = N >> (st + 1), o = RF_WARP >> (st + 1);
        // A bit mask, not `up ? v[i + half] : v[i]`, which compilers may turn into a select of
        // addresses and so put v in local memory.
        const int sel = (lane & o) != 0 ? -1 : 0;
#pragma unroll
        for (int i = 0; i < half; ++i) {
            const int lo = __float_as_int(v[i]), hi = __float_as_int(v[i + half]);
            const float keep = __int_as_float((hi & sel) | (lo & ~sel));
            const float send = __int_as_float((lo & sel) | (hi & ~sel));
            v[i] = keep + rf_shfl_xor(send, o);
        }
    }
#pragma unroll
    for (int o = RF_WARP >> (STEPS + 1); o > 0; o /= 2) v[0] += rf_shfl_xor(v[0], o);
    return v[0];
}

// Epilogue of the column mat-vecs for rows row0 .. row0 + R - 1 and columns c0 .. c0 + nc - 1:
// warp sums of the lanes' acc[matrix][column][row] (warp_sum_many: value (m NC + j) R + r ends
// in lane group (m NC + j) R + r, so a gate's up value is warp / 2 lanes away), then the first
// lane of each group writes out = dot (NM = 1) or act(gate) * up (NM = 2), plus bias[row] when a
// bias is given.
template <int R, int NM, int NC>
static __device__ __forceinline__ void mv_finish_cols(float (*acc)[NC][R], const float* __restrict__ bias,
                                                      int act_kind, float* __restrict__ out, int lane, int row0,
                                                      int nrows, int out_stride, int c0, int nc) {
    constexpr int N = NM * NC * R, GROUP = RF_WARP / N;
    float v[N];
#pragma unroll
    for (int m = 0; m < NM; ++m)
#pragma unroll
        for (int j = 0; j < NC; ++j)
#pragma unroll
            for (int r = 0; r < R; ++r) v[(m * NC + j) * R + r] = acc[m][j][r];
    float s = warp_sum_many<N>(v, lane);
    const float u = NM == 2 ? rf_shfl_xor(s, RF_WARP / 2) : 0.0f;
    const int idx = lane / GROUP, j = idx / R, r = idx % R;
    if (lane % GROUP == 0 && idx < NC * R && j < nc && row0 + r < nrows) {
        if (NM == 2) s = act_fn(act_kind, s) * u;
        if (bias) s += bias[row0 + r];
        out[(size_t)(c0 + j) * out_stride + row0 + r] = s;
    }
}

// Q4_K/Q5_K read directly: one row per warp, U blocks per lane in flight, each block's raw words
// kept in registers while every column's activations are dotted with them.
template <typename T, int NC, int NM, int U, bool A16>
static __device__ __forceinline__ void matvec_direct_cols_impl(const uint8_t* __restrict__ w,
                                                               const uint8_t* __restrict__ w2,
                                                               const float* __restrict__ bias,
                                                               const uint8_t* __restrict__ y, float* __restrict__ out,
                                                               int ncols, long long row_bytes, int out_stride,
                                                               int nrows, int act_kind, int m) {
    const int lane = threadIdx.x % RF_WARP;
    const int wid = threadIdx.x / RF_WARP;
    if (wid >= MV_WARPS) return;  // whole warps leave together (the host launches MV_WARPS)
    const int c0 = blockIdx.y * NC, nc = min(NC, m - c0);
    constexpr int G = RF_WARP / T::LPB;
    const int nblk = ncols / T::QK, part = lane % T::LPB;
    const uint8_t* ws[2] = {w, w2};
    for (int row = blockIdx.x * MV_WARPS + wid; row < nrows; row += gridDim.x * MV_WARPS) {
        float acc[NM][NC][1];
#pragma unroll
        for (int k = 0; k < NM; ++k)
#pragma unroll
            for (int j = 0; j < NC; ++j) acc[k][j][0] = 0.0f;
        const uint8_t* wr[NM];
#pragma unroll
        for (int k = 0; k < NM; ++k) wr[k] = ws[k] + (long long)row * row_bytes;
        for (int b0 = lane / T::LPB; b0 < nblk; b0 += U * G) {
            typename T::Raw raw[U][NM];
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int b = min(b0 + u * G, nblk - 1);
#pragma unroll
                for (int k = 0; k < NM; ++k) raw[u][k] = T::template load<A16>(wr[k] + (size_t)b * T::BYTES, part);
            }
#pragma unroll
            for (int u = 0; u < U; ++u)
                if (b0 + u * G < nblk)
#pragma unroll
                    for (int j = 0; j < NC; ++j)
                        if (j < nc) {
                            typename T::Act a;
                            T::load_act(q8_vec_at(y, ncols, c0 + j), b0 + u * G, part, a);
#pragma unroll
                            for (int k = 0; k < NM; ++k) acc[k][j][0] += T::compute(raw[u][k], part, a);
                        }
        }
        mv_finish_cols<1, NM, NC>(acc, bias, act_kind, out, lane, row, nrows, out_stride, c0, nc);
    }
}

template <typename T, int NC, int NM, int U>
static __device__ __forceinline__ void matvec_direct_cols(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                          const float* __restrict__ bias,
                                                          const uint8_t* __restrict__ y, float* __restrict__ out,
                                                          int ncols, long long row_bytes, int out_stride, int nrows,
                                                          int act_kind, int m) {
    if ((((uintptr_t)w | (uintptr_t)(w2 ? w2 : w) | (uintptr_t)row_bytes) & 15) == 0)
        matvec_direct_cols_impl<T, NC, NM, U, true>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows,
                                                    act_kind, m);
    else
        matvec_direct_cols_impl<T, NC, NM, U, false>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows,
                                                     act_kind, m);
}

// The staged types (Q6_K): R rows per warp through the shared-memory stage (no cp.async
// pipeline), each staged block dotted with every column.
template <typename T, int R, int NC, int NM, bool A16>
static __device__ __forceinline__ void matvec_staged_cols_impl(const uint8_t* __restrict__ w,
                                                               const uint8_t* __restrict__ w2,
                                                               const float* __restrict__ bias,
                                                               const uint8_t* __restrict__ y, float* __restrict__ out,
                                                               int ncols, long long row_bytes, int out_stride,
                                                               int nrows, int act_kind, int m,
                                                               uint32_t (*stage)[R][stage_dims<T>::WORDS]) {
    const int lane = threadIdx.x % RF_WARP;
    const int wid = threadIdx.x / RF_WARP;
    if (wid >= MV_WARPS) return;  // whole warps leave together (the host launches MV_WARPS)
    const int c0 = blockIdx.y * NC, nc = min(NC, m - c0);
    constexpr int PB = MV_WARPS * R;
    for (int row0 = blockIdx.x * PB + wid * R; row0 < nrows; row0 += gridDim.x * PB) {
        float acc[NM][NC][R];
#pragma unroll
        for (int k = 0; k < NM; ++k)
#pragma unroll
            for (int j = 0; j < NC; ++j)
#pragma unroll
                for (int r = 0; r < R; ++r) acc[k][j][r] = 0.0f;
        staged_rows<T, R, 1, A16, NC>(w, y, c0, nc, ncols, row_bytes, nrows, row0, lane, wid, 0, stage, acc[0]);
        if (NM == 2)
            staged_rows<T, R, 1, A16, NC>(w2, y, c0, nc, ncols, row_bytes, nrows, row0, lane, wid, 0, stage,
                                          acc[NM - 1]);
        mv_finish_cols<R, NM, NC>(acc, bias, act_kind, out, lane, row0, nrows, out_stride, c0, nc);
    }
}

template <typename T, int R, int NC, int NM>
static __device__ __forceinline__ void matvec_staged_cols(const uint8_t* __restrict__ w, const uint8_t* __restrict__ w2,
                                                          const float* __restrict__ bias,
                                                          const uint8_t* __restrict__ y, float* __restrict__ out,
                                                          int ncols, long long row_bytes, int out_stride, int nrows,
                                                          int act_kind, int m) {
    static_assert(pipe_smem<T, R, NM>::WORDS == 0, "the kernels' mv_entry must not leave the wait to a pipeline");
    __shared__ __align__(16) uint32_t smem[MV_WARPS * R * stage_dims<T>::WORDS];
    auto stage = reinterpret_cast<uint32_t(*)[R][stage_dims<T>::WORDS]>(smem);
    if ((((uintptr_t)w | (uintptr_t)(w2 ? w2 : w) | (uintptr_t)row_bytes) & 15) == 0)
        matvec_staged_cols_impl<T, R, NC, NM, true>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows,
                                                    act_kind, m, stage);
    else
        matvec_staged_cols_impl<T, R, NC, NM, false>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows,
                                                     act_kind, m, stage);
}

// The column mat-vec bodies of each type: Q4_K two blocks per lane in flight for one matrix of
// two columns, else one (more columns' activations in registers instead); Q6_K two rows per warp,
// one stage round.
template <int NC, int NM>
static __device__ __forceinline__ void mv_cols_q4_k(const uint8_t* w, const uint8_t* w2, const float* bias,
                                                    const uint8_t* y, float* out, int ncols, long long row_bytes,
                                                    int out_stride, int nrows, int act_kind, int m) {
    matvec_direct_cols<mv_q4_k, NC, NM, NM == 1 && NC == 2 ? 2 : 1>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows,
                                                         act_kind, m);
}

using mv_cols_q6_k_t = mv_q6_k<1>;

template <int NC, int NM>
static __device__ __forceinline__ void mv_cols_q6_k(const uint8_t* w, const uint8_t* w2, const float* bias,
                                                    const uint8_t* y, float* out, int ncols, long long row_bytes,
                                                    int out_stride, int nrows, int act_kind, int m) {
    matvec_staged_cols<mv_cols_q6_k_t, 2, NC, NM>(w, w2, bias, y, out, ncols, row_bytes, out_stride, nrows, act_kind,
                                                  m);
}

// `name_cNC` (w, y, out, ncols, row_bytes, out_stride, nrows, m), `name_cNC_add` (bias after w)
// and `name_cNC_gated` (wg, wu, y, out, ncols, row_bytes, out_stride, nrows, act_kind, m): the
// plain, biased and gated mat-vecs of m vectors, NC per grid row (grid.y = ceil(m / NC)); grid x
// ceil(nrows / `kernels::WeightType::matvec_cols_rows_per_block`), which is MV_WARPS * R. `body`
// is mv_cols_<type>, T its weight type.
#define RF_MATVEC_COLS(name, NC, T, R, body)                                                                         \
    RF_KERNEL void MV_BOUND name##_c##NC(const uint8_t* w, const uint8_t* y, float* out, int ncols,                 \
                                         long long row_bytes, int out_stride, int nrows, int m) {                    \
        mv_entry<T, R, 1, 1>(w, nullptr, row_bytes, nrows);                                                          \
        body<NC, 1>(w, nullptr, nullptr, y, out, ncols, row_bytes, out_stride, nrows, 0, m);                         \
    }                                                                                                                \
    RF_KERNEL void MV_BOUND name##_c##NC##_add(const uint8_t* w, const float* bias, const uint8_t* y, float* out,   \
                                               int ncols, long long row_bytes, int out_stride, int nrows, int m) {  \
        mv_entry<T, R, 1, 1>(w, nullptr, row_bytes, nrows);                                                          \
        body<NC, 1>(w, nullptr, bias, y, out, ncols, row_bytes, out_stride, nrows, 0, m);                            \
    }                                                                                                                \
    RF_KERNEL void MV_BOUND name##_c##NC##_gated(const uint8_t* wg, const uint8_t* wu, const uint8_t* y, float* out, \
                                                 int ncols, long long row_bytes, int out_stride, int nrows,         \
                                                 int act_kind, int m) {                                             \
        mv_entry<T, R, 1, 2>(wg, wu, row_bytes, nrows);                                                              \
        body<NC, 2>(wg, wu, nullptr, y, out, ncols, row_bytes, out_stride, nrows, act_kind, m);                      \
    }

RF_MATVEC_COLS(matvec_q4_k, 2, mv_q4_k, 1, mv_cols_q4_k)
RF_MATVEC_COLS(matvec_q4_k, 4, mv_q4_k, 1, mv_cols_q4_k)
RF_MATVEC_COLS(matvec_q6_k, 2, mv_cols_q6_k_t, 2, mv_cols_q6_k)
RF_MATVEC_COLS(matvec_q6_k, 4, mv_cols_q6_k_t, 2, mv_cols_q6_k)

// Q4_K_M keeps some layers' v projection in Q6_K: q and k (Q4_K, `rb` bytes per row) and v
// (Q6_K, `rb2`) in one launch. Blocks [0, b2) run the Q4_K multi kernel's body over w0 and w1,
// the rest the plain Q6_K body over w2, shifted back as `mv_multi_pick` does.
// Bound to 80 registers (6 blocks per SM; 4 bytes spill on sm_90): faster than unbounded or
// RF_LB(8).
#ifndef MV_MIX_ATTRS
#define MV_MIX_ATTRS RF_LB(6)
#endif
// No weight prefetch before the wait: it measured neutral and raised the kernel's stack under
// its register bound.
RF_KERNEL void MV_MIX_ATTRS matvec_q4_k_q6_k_multi(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2,
                                                   const uint8_t* y, float* o0, float* o1, float* o2, int ncols,
                                                   long long rb, long long rb2, int n0, int n1, int n2) {
    rf_entry();  // (no prefetch: see above)
    constexpr int PB4 = MV_WARPS * 1, PB6 = MV_WARPS * 2;  // rows per block of each type
    const int b2 = (n0 + PB4 - 1) / PB4 + (n1 + PB4 - 1) / PB4;
    if ((int)blockIdx.x < b2) {
        const mv_pick p = mv_multi_pick(PB4, w0, w1, nullptr, o0, o1, nullptr, rb, n0, n1, 0);
        matvec_direct2<mv_q4_k, 1, 1>(p.w, nullptr, nullptr, y, p.out, ncols, rb, p.n, p.shift + p.n, 0);
    } else {
        const int shift = b2 * PB6;
        // Integer arithmetic: the shifted addresses are never dereferenced below row `shift`.
        const uint8_t* w = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(w2) - (uintptr_t)(shift * rb2));
        float* o = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(o2) - (uintptr_t)shift * sizeof(float));
        matvec_staged<mv_q6_k<MV_Q6K_ROUNDS>, 2, 1>(w, nullptr, nullptr, y, o, ncols, rb2, n2, shift + n2, 0);
    }
}

// The q, k and v projections of a decode step with the work of the `rope_kv_*` launch after them
// done in their epilogue (normal-mode rope, f16 caches): q rows are rotated into `yq`, k rows into
// `yk` and the K cache row idx[token], v rows go into the V cache row; the plain projections are
// written too. A rope pair (2i, 2i + 1) is two rows of one block, in warps w and w ^ 1, which trade
// their values through shared memory (R = 1; the host makes every warp of every block own a row:
// q and k row counts are multiples of the block's rows).
struct mv_rope_kv {
    static constexpr bool PLAIN = false;
    int kind;  // 0: q rows, 1: k rows, 2: v rows
    int shift;  // the matrix's first row in the grid's row numbering
    float* y;  // rotated q or k, dense rows per token
    __half* cache;  // K (kind 1) or V (kind 2) cache
    long long cache_stride;  // elements between cache rows
    const int* pos;
    const int* idx;
    int head_dim, n_dims;
    float base, freq_scale;
    const float* freq_factors;
    float ext_factor, mscale, corr_lo, corr_hi;

    __device__ __forceinline__ void operator()(float v, bool st, float* out, int row, int wid) const {
        const int tok = blockIdx.y, r = row - shift;
        if (st) out[row] = v;
        if (kind == 2) {
            if (st) cache[(long long)idx[tok] * cache_stride + r] = __float2half(v);
            return;
        }
        __shared__ float pv[MV_WARPS];
        if (st) pv[wid] = v;
        __syncthreads();
        if (!st) return;
        const int d = r % head_dim;
        const rope_rot o = rope_angle(d / 2, (float)pos[tok], n_dims, base, freq_scale, freq_factors, 0, ext_factor,
                                      mscale, corr_lo, corr_hi);
        const float other = pv[wid ^ 1];
        const float yv = !o.rot ? v : (d & 1) ? other * o.s + v * o.c : v * o.c - other * o.s;
        y[r] = yv;
        if (kind == 1) cache[(long long)idx[tok] * cache_stride + r] = __float2half(yv);
    }
};

// The epilogue of a block of matrix `kind` (its first row `shift`) for token blockIdx.y, from the
// rope and cache arguments of the kernels below.
#define MV_ROPE_KV_EP(kind, shift, n0, n1)                                                                   \
    mv_rope_kv {                                                                                            \
        kind, shift, (kind) == 0 ? yq + (long long)blockIdx.y * (n0) : yk + (long long)blockIdx.y * (n1),   \
            (kind) == 1 ? kc : vc, (kind) == 1 ? kc_stride : vc_stride, pos, idx, head_dim, n_dims, base,   \
            freq_scale, freq_factors, ext_factor, mscale, corr_lo, corr_hi                                  \
    }

// The plain Q4_K mat-vec's register bound.
// (A row split over two warps, to fill the resident blocks in more, shorter waves, measured
// slower.)
#define MV_ROPE_ATTRS RF_LB(8)

RF_KERNEL void MV_ROPE_ATTRS matvec_q4_k_rope_kv(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2,
                                                 const uint8_t* y, float* o0, float* o1, float* o2, int ncols,
                                                 long long row_bytes, int n0, int n1, int n2, float* yq, float* yk,
                                                 const int* pos, int head_dim, int n_dims, float base, float freq_scale,
                                                 const float* freq_factors, float ext_factor, float mscale,
                                                 float corr_lo, float corr_hi, __half* kc, long long kc_stride,
                                                 __half* vc, long long vc_stride, const int* idx) {
    const mv_pick p = mv_multi_pick(MV_WARPS * 1, w0, w1, w2, o0, o1, o2, row_bytes, n0, n1, n2);
    mv_entry<mv_q4_k, 1, 1, 1>(p.w, nullptr, row_bytes, p.shift + p.n);
    matvec_direct2<mv_q4_k, 1, 1>(p.w, nullptr, nullptr, y, p.out, ncols, row_bytes, p.n, p.shift + p.n, 0,
                                  MV_ROPE_KV_EP(p.m, p.shift, n0, n1));
}

// matvec_q4_k_q6_k_multi's grid (q and k in Q4_K, v in Q6_K) with the epilogue above.
RF_KERNEL void MV_MIX_ATTRS matvec_q4_k_q6_k_rope_kv(const uint8_t* w0, const uint8_t* w1, const uint8_t* w2,
                                                     const uint8_t* y, float* o0, float* o1, float* o2, int ncols,
                                                     long long rb, long long rb2, int n0, int n1, int n2,
                                                     float* yq, float* yk, const int* pos, int head_dim, int n_dims,
                                                     float base, float freq_scale, const float* freq_factors,
                                                     float ext_factor, float mscale, float corr_lo, float corr_hi,
                                                     __half* kc, long long kc_stride, __half* vc, long long vc_stride,
                                                     const int* idx) {
    rf_entry();
    constexpr int PB4 = MV_WARPS * 1, PB6 = MV_WARPS * 2;
    const int b2 = (n0 + PB4 - 1) / PB4 + (n1 + PB4 - 1) / PB4;
    if ((int)blockIdx.x < b2) {
        const mv_pick p = mv_multi_pick(PB4, w0, w1, nullptr, o0, o1, nullptr, rb, n0, n1, 0);
        matvec_direct2<mv_q4_k, 1, 1>(p.w, nullptr, nullptr, y, p.out, ncols, rb, p.n, p.shift + p.n, 0,
                                      MV_ROPE_KV_EP(p.m, p.shift, n0, n1));
    } else {
        const int shift = b2 * PB6;
        // Integer arithmetic: the shifted addresses are never dereferenced below row `shift`.
        const uint8_t* w = reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(w2) - (uintptr_t)(shift * rb2));
        float* o = reinterpret_cast<float*>(reinterpret_cast<uintptr_t>(o2) - (uintptr_t)shift * sizeof(float));
        matvec_staged<mv_q6_k<MV_Q6K_ROUNDS>, 2, 1>(w, nullptr, nullptr, y, o, ncols, rb2, n2, shift + n2, 0,
                                                    MV_ROPE_KV_EP(2, shift, n0, n1));
    }
}

// Which types take the cp.async pipeline (T::PIPE), and the candidates measured against these
// kernels and dropped: kernels/PERF.md.

// Float weights (F32/F16 rows) times float activations, same grid as the quantized kernels.
template <typename W>
static __device__ __forceinline__ float ld_w(const W* p, int i);
template <>
__device__ __forceinline__ float ld_w<float>(const float* p, int i) { return p[i]; }
template <>
__device__ __forceinline__ float ld_w<__half>(const __half* p, int i) { return __half2float(p[i]); }

// Four weights from `p + i` (aligned to four of them).
template <typename W>
static __device__ __forceinline__ float4 ld_w4(const W* p, int i);
template <>
__device__ __forceinline__ float4 ld_w4<float>(const float* p, int i) {
    return *reinterpret_cast<const float4*>(p + i);
}
template <>
__device__ __forceinline__ float4 ld_w4<__half>(const __half* p, int i) {
    const uint2 u = *reinterpret_cast<const uint2*>(p + i);
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&u.x));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&u.y));
    return make_float4(a.x, a.y, b.x, b.y);
}

template <typename W>
static __device__ __forceinline__ void matvec_f(const W* __restrict__ w, const float* __restrict__ x,
                                                float* __restrict__ out, int ncols, long long row_stride,
                                                int out_stride) {
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const int row = blockIdx.x, col = blockIdx.y;
    const W* wr = w + (long long)row * row_stride;
    const float* xc = x + (size_t)col * ncols;
    float acc = 0.0f;
    // Four values per load where the rows allow it: one row per block leaves few blocks for a
    // short output (a router's 128 experts), so each thread must have several loads in flight.
    const bool v4 = ncols % 4 == 0 && (reinterpret_cast<uintptr_t>(wr) % (4 * sizeof(W))) == 0 &&
                    (reinterpret_cast<uintptr_t>(xc) % 16) == 0;
    if (v4) {
#pragma unroll 4
        for (int i = 4 * threadIdx.x; i < ncols; i += 4 * blockDim.x) {
            const float4 xv = *reinterpret_cast<const float4*>(xc + i);
            const float4 wv = ld_w4(wr, i);
            acc += wv.x * xv.x + wv.y * xv.y + wv.z * xv.z + wv.w * xv.w;
        }
    } else {
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) acc += ld_w(wr, i) * xc[i];
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[(size_t)col * out_stride + row] = acc;
}

RF_KERNEL void matvec_f32(const float* w, const float* x, float* out, int ncols, long long row_stride,
                          int out_stride) {
    rf_entry();
    matvec_f<float>(w, x, out, ncols, row_stride, out_stride);
}

RF_KERNEL void matvec_f16(const __half* w, const float* x, float* out, int ncols, long long row_stride,
                          int out_stride) {
    rf_entry();
    matvec_f<__half>(w, x, out, ncols, row_stride, out_stride);
}

// =============================================================================================
// MXFP4 and the expert mat-vecs (mixture of experts).
// =============================================================================================

// N 32-bit words starting at any byte offset `o` of a shared-memory stage (MXFP4's 17-byte
// blocks leave odd offsets, which `st_words` does not take).
template <int N>
static __device__ __forceinline__ void st_words_b(const uint32_t* st, int o, uint32_t* out) {
    const uint32_t* p = st + (o >> 2);
    const int sh = (o & 3) * 8;
    uint32_t w[N + 1];
#pragma unroll
    for (int k = 0; k <= N; ++k) w[k] = p[k];
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = (uint32_t)(((((uint64_t)w[k + 1]) << 32) | w[k]) >> sh);
}

// MXFP4: the E8M0 exponent byte, then 16 bytes of E2M1 nibbles (values 0..15 low, 16..31 high),
// looked up as doubled integers so that the dot product stays in dp4a.
struct mv_mxfp4 {
    static constexpr int QK = 32, BYTES = MXFP4_BYTES, LPB = 1, ROUNDS = 1;
    static constexpr bool PIPE = false;
    using Act = act32;
    static __device__ __forceinline__ void load_act(q8_vec y, int b, int, Act& a) { load_act32(y, b, a); }
    static __device__ __forceinline__ float dot(const uint32_t* st, int o, int, const Act& a) {
        uint32_t v[5];  // the exponent in byte 0 of v[0] after the shift, then the nibbles
        st_words_b<5>(st, o, v);
        int s = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const uint32_t q = (v[k] >> 8) | (v[k + 1] << 24);
            s = dot4_i8(mxfp4_bytes(q & 0x0F0F0F0F), word(a.q0, k), s);
            s = dot4_i8(mxfp4_bytes((q >> 4) & 0x0F0F0F0F), word(a.q1, k), s);
        }
        return e8m0_half(v[0] & 0xFF) * a.d * (float)s;
    }
};

RF_KERNEL void MV_BOUND matvec_mxfp4(const uint8_t* w, const uint8_t* y, float* out, int ncols, long long row_bytes,
                                     int out_stride, int nrows) {
    mv_entry<mv_mxfp4, 2, 1, 1>(w, nullptr, row_bytes, nrows);
    matvec_staged<mv_mxfp4, 2, 1>(w, nullptr, nullptr, y, out, ncols, row_bytes, out_stride, nrows, 0);
}

// Expert products (ggml's mul_mat_id): grid.y runs over the (token, slot) pairs p = t * n_used +
// i; pair p multiplies matrix ids[p] (matrices `mat_bytes` apart) with activation vector
// t * n_x + i % n_x, into output row p of `nrows` values. Only the chosen matrices are read.
// The body is the plain mat-vec's, with the activations shifted so that its grid.y lands on the
// pair's vector (integer arithmetic: the shifted address is never dereferenced itself).
static __device__ __forceinline__ const uint8_t* mv_id_vec(const uint8_t* y, int ncols, int n_used, int n_x) {
    const int p = blockIdx.y;
    const long long vec = (long long)(p / n_used) * n_x + (p % n_used) % n_x;
    return reinterpret_cast<const uint8_t*>(reinterpret_cast<uintptr_t>(y) +
                                            (uintptr_t)((vec - p) * (long long)q8_vec_bytes(ncols)));
}

// The expert a pair reads, or -1 (its output row zeroed) for an id outside the stack.
static __device__ __forceinline__ int mv_id_expert(const int* ids, float* out, int nrows, int n_mat) {
    const int e = ids[blockIdx.y];
    if (e >= 0 && e < n_mat) return e;
    if (blockIdx.x == 0)
        for (int r = threadIdx.x; r < nrows; r += blockDim.x) out[(size_t)blockIdx.y * nrows + r] = 0.0f;
    return -1;
}

#define RF_MATVEC_ID(name, shape, T, R)                                                                           \
    RF_KERNEL void MV_BOUND name##_id(const uint8_t* w, const int* ids, const uint8_t* y, float* out, int ncols,  \
                                      long long row_bytes, long long mat_bytes, int nrows, int n_used, int n_x,   \
                                      int n_mat) {                                                                \
        rf_entry();                                                                                               \
        const int e = mv_id_expert(ids, out, nrows, n_mat);                                                       \
        if (e < 0) return;                                                                                        \
        const uint8_t* we = w + (long long)e * mat_bytes;                                                         \
        mv_entry<T, R, 1, 1>(we, nullptr, row_bytes, nrows);                                                      \
        shape<T, R, 1>(we, nullptr, nullptr, mv_id_vec(y, ncols, n_used, n_x), out, ncols, row_bytes, nrows,      \
                       nrows, 0);                                                                                 \
    }

RF_MATVEC_ID(matvec_q4_0, matvec_staged, mv_q4_0, 2)
RF_MATVEC_ID(matvec_q4_1, matvec_staged, mv_q4_1, 2)
RF_MATVEC_ID(matvec_q5_0, matvec_staged, mv_q5_0, 2)
RF_MATVEC_ID(matvec_q5_1, matvec_staged, mv_q5_1, 2)
RF_MATVEC_ID(matvec_q8_0, matvec_staged, mv_q8_0, 2)
RF_MATVEC_ID(matvec_q2_k, matvec_staged, mv_q2_k, 2)
RF_MATVEC_ID(matvec_q3_k, matvec_staged, mv_q3_k, 2)
RF_MATVEC_ID(matvec_q4_k, matvec_direct2, mv_q4_k, 1)
RF_MATVEC_ID(matvec_q5_k, matvec_direct2, mv_q5_k, 1)
RF_MATVEC_ID(matvec_q6_k, matvec_staged, mv_q6_k<MV_Q6K_ROUNDS>, 2)
RF_MATVEC_ID(matvec_mxfp4, matvec_staged, mv_mxfp4, 2)

// Biased expert products (gpt-oss): `name_id_add` is `name_id` plus row `ids[p]` of `bias` (f32
// `[nrows, n_mat]`: one row of `nrows` per expert) on pair p's output row.
#define RF_MATVEC_ID_ADD(name, shape, T, R)                                                                        \
    RF_KERNEL void MV_BOUND name##_id_add(const uint8_t* w, const float* bias, const int* ids, const uint8_t* y,  \
                                          float* out, int ncols, long long row_bytes, long long mat_bytes,        \
                                          int nrows, int n_used, int n_x, int n_mat) {                            \
        rf_entry();                                                                                               \
        const int e = mv_id_expert(ids, out, nrows, n_mat);                                                       \
        if (e < 0) return;                                                                                        \
        const uint8_t* we = w + (long long)e * mat_bytes;                                                         \
        mv_entry<T, R, 1, 1>(we, nullptr, row_bytes, nrows);                                                      \
        shape<T, R, 1>(we, nullptr, bias + (long long)e * nrows, mv_id_vec(y, ncols, n_used, n_x), out, ncols,    \
                       row_bytes, nrows, nrows, 0);                                                               \
    }

RF_MATVEC_ID_ADD(matvec_q4_0, matvec_staged, mv_q4_0, 2)
RF_MATVEC_ID_ADD(matvec_q4_1, matvec_staged, mv_q4_1, 2)
RF_MATVEC_ID_ADD(matvec_q5_0, matvec_staged, mv_q5_0, 2)
RF_MATVEC_ID_ADD(matvec_q5_1, matvec_staged, mv_q5_1, 2)
RF_MATVEC_ID_ADD(matvec_q8_0, matvec_staged, mv_q8_0, 2)
RF_MATVEC_ID_ADD(matvec_q2_k, matvec_staged, mv_q2_k, 2)
RF_MATVEC_ID_ADD(matvec_q3_k, matvec_staged, mv_q3_k, 2)
RF_MATVEC_ID_ADD(matvec_q4_k, matvec_direct2, mv_q4_k, 1)
RF_MATVEC_ID_ADD(matvec_q5_k, matvec_direct2, mv_q5_k, 1)
RF_MATVEC_ID_ADD(matvec_q6_k, matvec_staged, mv_q6_k<MV_Q6K_ROUNDS>, 2)
RF_MATVEC_ID_ADD(matvec_mxfp4, matvec_staged, mv_mxfp4, 2)

// Gated expert products: `name_id_gated` is `name_gated` (act(gate) * up, the same shapes and rows
// per warp, so `matvec_gated_grid`) over the pairs of `name_id`: pair p multiplies gate and up
// matrix ids[p] of their stacks (both `mat_bytes` apart) with its activation vector, into output
// row p. One launch for a mixture of experts' gate and up products and their activation.
#define RF_MATVEC_ID_GATED(name, attrs, shape, T, R)                                                             \
    RF_KERNEL void attrs name##_id_gated(const uint8_t* wg, const uint8_t* wu, const int* ids, const uint8_t* y, \
                                         float* out, int ncols, long long row_bytes, long long mat_bytes,        \
                                         int nrows, int n_used, int n_x, int n_mat, int act_kind) {              \
        rf_entry();                                                                                              \
        const int e = mv_id_expert(ids, out, nrows, n_mat);                                                      \
        if (e < 0) return;                                                                                       \
        const uint8_t* ge = wg + (long long)e * mat_bytes;                                                       \
        const uint8_t* ue = wu + (long long)e * mat_bytes;                                                       \
        mv_entry<T, R, 1, 2>(ge, ue, row_bytes, nrows);                                                          \
        shape<T, R, 1, 2>(ge, ue, nullptr, mv_id_vec(y, ncols, n_used, n_x), out, ncols, row_bytes, nrows, nrows, \
                          act_kind);                                                                             \
    }

RF_MATVEC_ID_GATED(matvec_q4_0, MV_BOUND, matvec_staged, mv_q4_0, 2)
RF_MATVEC_ID_GATED(matvec_q5_0, MV_BOUND, matvec_staged, mv_q5_0, 2)
RF_MATVEC_ID_GATED(matvec_q8_0, MV_BOUND, matvec_staged, mv_q8_0, 2)
RF_MATVEC_ID_GATED(matvec_q4_1, MV_BOUND, matvec_staged, mv_q4_1, 2)
RF_MATVEC_ID_GATED(matvec_q5_1, MV_BOUND, matvec_staged, mv_q5_1, 2)
RF_MATVEC_ID_GATED(matvec_q2_k, MV_BOUND, matvec_staged, mv_q2_k, 2)
RF_MATVEC_ID_GATED(matvec_q3_k, MV_BOUND, matvec_staged, mv_q3_k, 2)
RF_MATVEC_ID_GATED(matvec_q6_k, MV_BOUND, matvec_staged, mv_q6_k<MV_Q6K_GATED_ROUNDS>, 2)
RF_MATVEC_ID_GATED(matvec_q5_k, MV_BOUND, matvec_direct2, mv_q5_k, 1)
RF_MATVEC_ID_GATED(matvec_q4_k, RF_LB(8), matvec_direct, mv_q4_k, 2)

// --- Expert mat-vecs over short rows ----------------------------------------------------------
// The bodies above lay a warp's lanes along one row's k, which rows of a few blocks leave mostly
// idle (a fine-grained mixture of experts' down product, k = 768: three K-quant blocks, so 12 of
// Q6_K's 32 lanes and 24 of Q4_K's), and each warp reads a few hundred bytes per round trip. The
// `_id_short` kernels give a warp MV_SHORT_ROWS consecutive rows of the chosen matrix instead:
// one contiguous span of it, which the warp copies into its stage with coalesced 16-byte loads
// (all issued before the first store), then LPR lanes per row (T::LPB per block, each lane taking
// every (LPR / LPB)-th block of its row) take their dot products out of the stage, summed across
// those lanes. Plain and biased products of the K-quant types; their gated products stay on the
// per-row kernels, which measured faster (kernels/PERF.md).
// They take the activations as f32 and quantize their pair's vector into shared memory
// themselves (quantize_q8_1's arithmetic, so the same Q8_1 values), which saves the decode step a
// quantization launch before each expert product; the block's first weights are requested toward
// L2 meanwhile.
// Contract: MV_SHORT_ROWS rows and their start's offset in its 16-byte chunk fit the stage, i.e.
// row_bytes <= (MV_SHORT_BYTES - 16) / MV_SHORT_ROWS (`kernels::MATVEC_ID_SHORT_ROW_BYTES`), and
// ncols <= MV_SHORT_MAX_COLS; `kernels::MATVEC_ID_SHORT_ROWS_PER_BLOCK` is MV_WARPS *
// MV_SHORT_ROWS.
#define MV_SHORT_ROWS 8
#define MV_SHORT_BYTES 5120
#define MV_SHORT_MAX_COLS 1792

template <typename T>
struct short_dims {
    // Lanes per row: at least one block's lanes, and all lanes busy with MV_SHORT_ROWS rows.
    static constexpr int LPR = T::LPB > RF_WARP / MV_SHORT_ROWS ? T::LPB : RF_WARP / MV_SHORT_ROWS;
    static constexpr int RW = RF_WARP / LPR;              // rows per pass
    static constexpr int PASSES = MV_SHORT_ROWS / RW;     // passes over a warp's rows
    static constexpr int BS = LPR / T::LPB;               // a lane's block stride along its row
    static constexpr int IT = (MV_SHORT_BYTES / 16 + RF_WARP - 1) / RF_WARP;  // 16-byte loads per lane
    static constexpr int WORDS = MV_SHORT_BYTES / 4 + 4;  // + slack for st_words past the span
};

// 16 bytes at the 2-byte aligned byte offset `o` of a stage (one load where 16-byte aligned).
static __device__ __forceinline__ int4 st_b128(const uint32_t* st, int o) {
    if ((o & 15) == 0) return *reinterpret_cast<const int4*>(st + (o >> 2));
    uint32_t w[4];
    st_words<4>(st, o, w);
    return make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
}

// The dot product of the block at byte `o` of a stage (part `c`) with activation fragment `a`:
// the staged types' own; Q4_K and Q5_K read their blocks' words out of the stage.
template <typename T>
struct short_dot {
    static __device__ __forceinline__ float run(const uint32_t* st, int o, int c, const typename T::Act& a) {
        return T::dot(st, o, c, a);
    }
};
template <>
struct short_dot<mv_q4_k> {
    static __device__ __forceinline__ float run(const uint32_t* st, int o, int c, const act_k4& a) {
        return mv_q4_k::compute(mv_q4_k::Raw{st_b128(st, o), st_b128(st, o + 16 + 16 * c)}, c, a);
    }
};
template <>
struct short_dot<mv_q5_k> {
    static __device__ __forceinline__ float run(const uint32_t* st, int o, int c, const act_k4& a) {
        return mv_q5_k::compute(
            mv_q5_k::Raw{st_b128(st, o), st_b128(st, o + 16 + 16 * (c & 1)), st_b128(st, o + 48 + 16 * c)}, c, a);
    }
};

// Copies the `bytes` bytes at `src` (any alignment) into the warp's stage `st` as the 16-byte
// chunks that hold them (reading at most to the end of the last chunk); returns where they start
// in the stage (src's offset in its chunk).
template <int IT>
static __device__ __forceinline__ int short_fill(const uint8_t* __restrict__ src, int bytes, uint32_t* st, int lane) {
    const int off = (int)((uintptr_t)src & 15);
    const rf_b128* s = reinterpret_cast<const rf_b128*>(src - off);
    const int n = (off + bytes + 15) >> 4;
    rf_b128 v[IT];
#pragma unroll
    for (int i = 0; i < IT; ++i)
        if (lane + i * RF_WARP < n) v[i] = s[lane + i * RF_WARP];
    rf_syncwarp();  // every lane is done with the stage's previous contents
#pragma unroll
    for (int i = 0; i < IT; ++i)
        if (lane + i * RF_WARP < n) reinterpret_cast<rf_b128*>(st)[lane + i * RF_WARP] = v[i];
    rf_syncwarp();
    return off;
}

// out = w . yv, plus bias[row] when `bias` is non-null; output rows `nrows` apart per activation
// vector (grid.y).
template <typename T>
static __device__ __forceinline__ void matvec_short(const uint8_t* __restrict__ w, const float* __restrict__ bias,
                                                    q8_vec yv, float* __restrict__ out, int ncols, long long row_bytes,
                                                    int nrows) {
    using D = short_dims<T>;
    __shared__ __align__(16) uint32_t stage[MV_WARPS][D::WORDS];
    const int lane = threadIdx.x % RF_WARP;
    const int wid = threadIdx.x / RF_WARP;
    if (wid >= MV_WARPS) return;  // whole warps leave together (the host launches MV_WARPS)
    const int nblk = ncols / T::QK;
    const int rb = (int)row_bytes;  // at most MATVEC_ID_SHORT_ROW_BYTES (the contract above)
    const int lr = lane / D::LPR, part = lane % T::LPB, bo = (lane % D::LPR) / T::LPB;
    constexpr int PB = MV_WARPS * MV_SHORT_ROWS;
    for (int row0 = blockIdx.x * PB + wid * MV_SHORT_ROWS; row0 < nrows; row0 += gridDim.x * PB) {
        const int nr = min(MV_SHORT_ROWS, nrows - row0);
        float acc[D::PASSES];
#pragma unroll
        for (int p = 0; p < D::PASSES; ++p) acc[p] = 0.0f;
        const int off = short_fill<D::IT>(w + (long long)row0 * rb, nr * rb, stage[wid], lane);
        for (int b = bo; b < nblk; b += D::BS) {
            typename T::Act a;
            T::load_act(yv, b, part, a);
#pragma unroll
            for (int p = 0; p < D::PASSES; ++p) {
                const int r = p * D::RW + lr;
                if (r < nr) acc[p] += short_dot<T>::run(stage[wid], off + r * rb + b * T::BYTES, part, a);
            }
        }
#pragma unroll
        for (int p = 0; p < D::PASSES; ++p) {
#pragma unroll
            for (int o = D::LPR / 2; o > 0; o >>= 1) acc[p] += rf_shfl_xor(acc[p], o);
            const int r = p * D::RW + lr;
            if (lane % D::LPR == 0 && r < nr) {
                float v = acc[p];
                if (bias) v += bias[row0 + r];
                out[(size_t)blockIdx.y * nrows + row0 + r] = v;
            }
        }
    }
}

// The entry of the short-row expert mat-vecs (after rf_entry()): pair blockIdx.y's expert (or
// -1, its output row zeroed), its activation vector (f32, `ncols` values; vector t * n_x + i %
// n_x of x for pair p = t * n_used + i) quantized into `yq`, and the block's first span of `w`
// requested toward L2 while it quantizes.
static __device__ __forceinline__ int short_entry(const uint8_t* w, const int* ids,
                                                  const float* __restrict__ x, float* out, uint8_t* yq, int ncols,
                                                  long long row_bytes, long long mat_bytes, int nrows, int n_used,
                                                  int n_x, int n_mat) {
    const int e = mv_id_expert(ids, out, nrows, n_mat);
    if (e < 0) return -1;
    constexpr int PB = MV_WARPS * MV_SHORT_ROWS;
    const int row0 = blockIdx.x * PB;
    const long long first = (long long)e * mat_bytes + (long long)row0 * row_bytes;
    const int lines = (int)((max(0, min(PB, nrows - row0)) * row_bytes + 127) / 128);
    for (int i = threadIdx.x; i < lines; i += blockDim.x) rf_prefetch_l2(w + first + 128 * i);
    const int p = blockIdx.y;
    const float* xv = x + ((long long)(p / n_used) * n_x + (p % n_used) % n_x) * ncols;
    // Whole 32-lane groups per Q8_1 block (ncols and the block size are multiples of 32).
    for (int i = threadIdx.x; i < ncols; i += blockDim.x) q8_1_put(xv[i], yq, ncols, i);
    __syncthreads();
    return e;
}

// Q8_1 bytes of the largest vector the short-row kernels quantize.
#define MV_SHORT_Q8_BYTES (MV_SHORT_MAX_COLS / QK8_1 * Q8_1_BYTES)

// `name_id_short` and `name_id_add_short`: `name_id` and `name_id_add` over short rows, with the
// f32 activations `x` (dense vectors of ncols) in place of their Q8_1 `y`; grid x
// ceil(nrows / MATVEC_ID_SHORT_ROWS_PER_BLOCK), grid y the pairs.
#define RF_MATVEC_ID_SHORT(name, T)                                                                              \
    RF_KERNEL void MV_BOUND name##_id_short(const uint8_t* w, const int* ids, const float* x, float* out,        \
                                            int ncols, long long row_bytes, long long mat_bytes, int nrows,      \
                                            int n_used, int n_x, int n_mat) {                                    \
        rf_entry();                                                                                              \
        __shared__ __align__(16) uint8_t yq[MV_SHORT_Q8_BYTES];                                                  \
        const int e = short_entry(w, ids, x, out, yq, ncols, row_bytes, mat_bytes, nrows, n_used, n_x, n_mat);   \
        if (e < 0) return;                                                                                       \
        matvec_short<T>(w + (long long)e * mat_bytes, nullptr, q8_vec_at(yq, ncols, 0), out, ncols, row_bytes,   \
                        nrows);                                                                                  \
    }                                                                                                            \
    RF_KERNEL void MV_BOUND name##_id_add_short(const uint8_t* w, const float* bias, const int* ids,             \
                                                const float* x, float* out, int ncols, long long row_bytes,      \
                                                long long mat_bytes, int nrows, int n_used, int n_x, int n_mat) { \
        rf_entry();                                                                                              \
        __shared__ __align__(16) uint8_t yq[MV_SHORT_Q8_BYTES];                                                  \
        const int e = short_entry(w, ids, x, out, yq, ncols, row_bytes, mat_bytes, nrows, n_used, n_x, n_mat);   \
        if (e < 0) return;                                                                                       \
        matvec_short<T>(w + (long long)e * mat_bytes, bias + (long long)e * nrows, q8_vec_at(yq, ncols, 0), out, \
                        ncols, row_bytes, nrows);                                                                \
    }

// The K-quant types (four or eight lanes per 256-value block): the 32-value block types measured
// slower on them than on their per-row kernels (kernels/PERF.md).
RF_MATVEC_ID_SHORT(matvec_q2_k, mv_q2_k)
RF_MATVEC_ID_SHORT(matvec_q3_k, mv_q3_k)
RF_MATVEC_ID_SHORT(matvec_q4_k, mv_q4_k)
RF_MATVEC_ID_SHORT(matvec_q5_k, mv_q5_k)
RF_MATVEC_ID_SHORT(matvec_q6_k, mv_q6_k<1>)

// Float expert products: one block per output row (grid.x) and pair (grid.y), x f32 vectors of
// `ncols` values; strides in elements.
template <typename W>
static __device__ __forceinline__ void matvec_f_id(const W* __restrict__ w, const int* __restrict__ ids,
                                                   const float* __restrict__ x, float* __restrict__ out, int ncols,
                                                   long long row_stride, long long mat_stride, int nrows, int n_used,
                                                   int n_x, int n_mat) {
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    const int p = blockIdx.y, row = blockIdx.x;
    const int e = ids[p];
    float acc = 0.0f;
    if (e >= 0 && e < n_mat) {
        const W* wr = w + (long long)e * mat_stride + (long long)row * row_stride;
        const float* xc = x + ((long long)(p / n_used) * n_x + (p % n_used) % n_x) * ncols;
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) acc += ld_w(wr, i) * xc[i];
    }
    acc = block_sum(acc, scratch);
    if (threadIdx.x == 0) out[(size_t)p * nrows + row] = acc;
}

RF_KERNEL void matvec_f32_id(const float* w, const int* ids, const float* x, float* out, int ncols,
                             long long row_stride, long long mat_stride, int nrows, int n_used, int n_x, int n_mat) {
    rf_entry();
    matvec_f_id<float>(w, ids, x, out, ncols, row_stride, mat_stride, nrows, n_used, n_x, n_mat);
}

RF_KERNEL void matvec_f16_id(const __half* w, const int* ids, const float* x, float* out, int ncols,
                             long long row_stride, long long mat_stride, int nrows, int n_used, int n_x, int n_mat) {
    rf_entry();
    matvec_f_id<__half>(w, ids, x, out, ncols, row_stride, mat_stride, nrows, n_used, n_x, n_mat);
}
