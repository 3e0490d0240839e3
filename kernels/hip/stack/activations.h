// Work item layout flags, and the activation loads for products over the FFN activation, whose
// Q8 scales cover 16 values (q8_put<16>) instead of Q8_1's 32.
// Included by stack.hip after params.h, inside RF_CP_ASYNC; not a unit of its own.
#pragma once

// Work item layouts (kind & 3): two rows per warp in Q4_K or Q6_K, or two gate and two up rows.
// Flags: DS_HALF, a 16-row gate/up half group (one gate and one up row per warp, laid out as
// DS_Q4); DS_A16, a product over the FFN activation, whose Q8 scales cover 16 values (q8_put<16>:
// the halves write theirs alone); DS_SPLIT, a 16-row q/k/v half group, warps w and w + 8 taking
// the same two rows, w the first half of their chunks and w + 8 the second (the epilogue adds
// the two sums); DS_NEOX, a q or k group (or half) under NeoX rope: rows of a head and their rope
// partners 64 rows on, one of each per warp (w2 the first partner row; see ds_build), so that
// both dims of every rotated pair meet in the group's epilogue.
enum { DS_Q4 = 0, DS_Q6 = 1, DS_GATED = 2, DS_HALF = 4, DS_A16 = 8, DS_SPLIT = 16, DS_NEOX = 32 };

// The FFN activation's Q8 (q8_put<16>: a scale per 16 values, so that a 16-row gate/up half group
// quantizes its rows by itself): `ncols` int8, then `ncols / 16` half2 (d, s).
static __device__ __forceinline__ size_t q8_16_vec_bytes(int ncols) {
    return ((size_t)ncols + (size_t)ncols / 16 * 4 + 15) & ~(size_t)15;
}

// Q6_K activations (see load_act_h16) from a stack Q8 vector with 16-value scales: values
// 128n + 32j + 16h + [0, 16) of block b are scale block 16b + 8n + 2j + h.
static __device__ __forceinline__ void load_act_h16_a16(q8_vec y, int b, int c, act_h16& a) {
    const int n = c >> 1, h = c & 1;
#pragma unroll
    for (int j = 0; j < 4; ++j) a.q[j] = ld_act_piece<true>(y, 16 * b + 8 * n + h + 2 * j);
    const uint32_t* ds = reinterpret_cast<const uint32_t*>(y.ds) + 16 * b + 8 * n + h;
#pragma unroll
    for (int j = 0; j < 4; ++j) a.d[j] = lo_f16(ds[2 * j]);
}

// Q4_K activations (see load_act_k4w) with 16-value scales: sub-block 2c is scale blocks
// 16b + 4c and + 1, sub-block 2c + 1 is + 2 and + 3.
struct act_k4w16 {
    int4 lo[2], hi[2];
    float d0[2], d1[2], s0, s1;
};

static __device__ __forceinline__ void load_act_k4w16(q8_vec y, int b, int c, act_k4w16& a) {
    const int u = 16 * b + 4 * c;
    a.lo[0] = ld_act_piece<true>(y, u);
    a.lo[1] = ld_act_piece<true>(y, u + 1);
    a.hi[0] = ld_act_piece<true>(y, u + 2);
    a.hi[1] = ld_act_piece<true>(y, u + 3);
    const int4 ds = ld_b128(y.ds + 4 * u);
    const float k = RF_K4_HI16 ? 0.0625f : 1.0f;
    a.d0[0] = lo_f16((uint32_t)ds.x);
    a.d0[1] = lo_f16((uint32_t)ds.y);
    a.d1[0] = lo_f16((uint32_t)ds.z) * k;
    a.d1[1] = lo_f16((uint32_t)ds.w) * k;
    a.s0 = hi_f16((uint32_t)ds.x) + hi_f16((uint32_t)ds.y);
    a.s1 = hi_f16((uint32_t)ds.z) + hi_f16((uint32_t)ds.w);
}

static __device__ __forceinline__ float k4w_compute16(const mv_q4_kw::Raw& w, int c, const act_k4w16& a) {
    int slo0 = 0, shi0 = 0, slo1 = 0, shi1 = 0;
    k4_dot16(w.q[0], a.lo[0], a.hi[0], slo0, shi0);
    k4_dot16(w.q[1], a.lo[1], a.hi[1], slo1, shi1);
    int sc0, m0, sc1, m1;
    k4_scales(c, (uint32_t)w.hdr.y, (uint32_t)w.hdr.z, (uint32_t)w.hdr.w, sc0, m0, sc1, m1);
    return lo_f16((uint32_t)w.hdr.x) * ((float)sc0 * ((float)slo0 * a.d0[0] + (float)slo1 * a.d0[1]) +
                                        (float)sc1 * ((float)shi0 * a.d1[0] + (float)shi1 * a.d1[1])) -
           hi_f16((uint32_t)w.hdr.x) * ((float)m0 * a.s0 + (float)m1 * a.s1);
}
