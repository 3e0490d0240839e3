// The portable weight stream (decode_stack_portable): each lane loads the weight bytes its own
// dot products read straight into registers, one chunk ahead of the chunk it computes, with
// plain 16-byte and 4-byte global loads. No shared-memory ring: an AMD workgroup's 64 KiB of
// LDS cannot hold the NVIDIA kernel's 180 KiB one, and without asynchronous copies a ring
// filled through registers costs the same registers plus the shared-memory traffic.
// Included by stack.hip after items.h; not a unit of its own.
#pragma once

// `v`, which the compiler may no longer take for a known value (AMD: an empty asm statement
// that claims to rewrite the register; no instruction). See ds_step.
static __device__ __forceinline__ int ds_opaque(int v) {
#if defined(RF_AMD)
    __asm__ volatile("" : "+v"(v));
#endif
    return v;
}

// One lane's bytes of one chunk: Q4_K (and gated) two blocks' header and 32 qs bytes, words
// 12r .. 12r + 11 for the lane's row r; Q6_K the lane's four windows of one block (see
// ds_load), words 0..18.
struct ds_raw {
    uint32_t w[24];
};

static __device__ __forceinline__ void ds_put4(uint32_t* w, const int4& v) {
    w[0] = (uint32_t)v.x;
    w[1] = (uint32_t)v.y;
    w[2] = (uint32_t)v.z;
    w[3] = (uint32_t)v.w;
}

static __device__ __forceinline__ int4 ds_get4(const uint32_t* w) {
    return make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
}

// Loads this lane's bytes of the issue cursor's chunk into `r` and steps the cursor (nothing
// past the last item). The lanes' parts mirror the products' (decode_stack's ring layout):
// Q4_K, 8 blocks per chunk, lane 4k + c block k, qs bytes [32c, 32c + 32), of both rows;
// gated, 4 blocks, lanes 0..15 the two gate rows, 16..31 the two up rows; Q6_K, 4 blocks,
// lanes 16r .. 16r + 15 row r, four lanes per block. A Q6_K block is 2-byte aligned (210
// bytes): its windows are read as whole 4-byte words from the word holding the block's start
// (rows start 16-byte aligned, so block b starts 2 (b & 1) bytes into one) and shifted into
// place by the product, none past the block's end.
static __device__ __forceinline__ void ds_load(ds_cursor& is, const ds_item* end, int nq, int lane, ds_raw& r) {
    if (is.q >= nq) return;
    const int lay = is.kind & 3, c = lane % 4;
    // The cursor's row pointers hold the ring's 16 * lane.
    const uint8_t* w = is.w - 16 * lane;
    const uint8_t* w2 = is.w2 - 16 * lane;
    if (lay == DS_Q6) {
        const int b = is.c * 4 + (lane / 4) % 4, n = c >> 1, h = c & 1;
        const uint8_t* blk = (lane >= 16 ? w2 : w) + b * Q6_K_BYTES;
        const uint32_t* p = reinterpret_cast<const uint32_t*>(blk - 2 * (b & 1));
        const int o0 = (64 * n + 16 * h) / 4, o1 = o0 + 8, o2 = (128 + 32 * n + 16 * h) / 4, o3 = (192 + 8 * n) / 4;
#pragma unroll
        for (int k = 0; k < 5; ++k) {
            r.w[k] = p[o0 + k];
            r.w[5 + k] = p[o1 + k];
            r.w[10 + k] = p[o2 + k];
        }
        r.w[15] = p[o3];
        r.w[16] = p[o3 + 1];
        r.w[17] = (b & 1) ? p[o3 + 2] : 0u;  // shifted in only at odd blocks
        r.w[18] = *reinterpret_cast<const uint16_t*>(blk + 208);
    } else {
        const bool gated = lay == DS_GATED;
        const int b = gated ? is.c * 4 + (lane / 4) % 4 : is.c * 8 + lane / 4;
        const uint8_t* r0 = gated ? (lane >= 16 ? w2 : w) : w;
        const uint8_t* r1 = gated ? r0 + is.rb : w2;
        const uint8_t* b0 = r0 + b * Q4_K_BYTES;
        const uint8_t* b1 = r1 + b * Q4_K_BYTES;
        ds_put4(r.w, ld_b128(b0));
        ds_put4(r.w + 4, ld_b128(b0 + 16 + 32 * c));
        ds_put4(r.w + 8, ld_b128(b0 + 32 + 32 * c));
        ds_put4(r.w + 12, ld_b128(b1));
        ds_put4(r.w + 16, ld_b128(b1 + 16 + 32 * c));
        ds_put4(r.w + 20, ld_b128(b1 + 32 + 32 * c));
    }
    is.next(end, nq);
}

// N words of a Q6_K window from N + 1 loaded ones, shifted right by `sh` bits (0 or 16).
template <int N>
static __device__ __forceinline__ void ds_funnel(const uint32_t* w, int sh, uint32_t* out) {
#pragma unroll
    for (int k = 0; k < N; ++k) out[k] = (uint32_t)(((((uint64_t)w[k + 1]) << 32) | w[k]) >> sh);
}

// mv_q6_k::dot over the lane's words already gathered (low bits ql0 and ql1, high bits qh,
// scales sc), before the block's scale; SPLIT as there (the -32 offset taken out of the byte
// loop). A copy of its loop: sharing one changed decode_stack's code.
static __device__ __forceinline__ float ds_q6_words(const uint32_t* ql0, const uint32_t* ql1, const uint32_t* qh,
                                                    const uint32_t* sc, int c, const act_h16& a) {
    const int h = c & 1;
    float acc = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const uint32_t* ql = (j & 1) ? ql1 : ql0;
        int s = 0, sa = 0;
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            const int lo = (int)(ql[k] >> (4 * (j >> 1))) & 0x0F0F0F0F;
            const int hi = (int)(qh[k] >> (2 * j)) & 0x03030303;
            s = dot4_i8(lo | (hi << 4), word(a.q[j], k), s);
            sa = dot4_i8(ones(), word(a.q[j], k), sa);
        }
        const int scale = (int)(int8_t)(sc[j >> 1] >> (8 * (2 * (j & 1) + h)));
        acc += (float)(scale * (s - 32 * sa)) * a.d[j];
    }
    return acc;
}

// This lane's share of the use cursor's chunk, from its registers `r`, added to acc[0] and
// acc[1] as decode_stack's ring products add theirs (Q6_K: acc[0] only, row lane / 16).
static __device__ __forceinline__ void ds_stream_dot(q8_vec yv, const ds_raw& r, const ds_cursor& cu, int lane,
                                                     float* acc) {
    const int lay = cu.kind & 3, c = lane % 4;
    const bool a16 = cu.kind & DS_A16;
    if (lay == DS_Q6) {
        const int b = cu.c * 4 + (lane / 4) % 4, sh = 16 * (b & 1);
        // load_act_h16<true> or load_act_h16_a16: the same values, their scales from 32- or
        // 16-value blocks (one loader, not two that fill `a` under a condition: on AMD that
        // keeps it in scratch memory).
        act_h16 a;
        const int n = c >> 1, h = c & 1;
#pragma unroll
        for (int j = 0; j < 4; ++j) a.q[j] = ld_act_piece<true>(yv, 16 * b + 8 * n + h + 2 * j);
        const uint32_t* ds = reinterpret_cast<const uint32_t*>(yv.ds);
#pragma unroll
        for (int j = 0; j < 4; ++j) a.d[j] = lo_f16(a16 ? ds[16 * b + 8 * n + h + 2 * j] : ds[8 * b + 4 * n + j]);
        uint32_t ql0[4], ql1[4], qh[4], sc[2];
        ds_funnel<4>(r.w, sh, ql0);
        ds_funnel<4>(r.w + 5, sh, ql1);
        ds_funnel<4>(r.w + 10, sh, qh);
        ds_funnel<2>(r.w + 15, sh, sc);
        acc[0] += lo_f16(r.w[18]) * ds_q6_words(ql0, ql1, qh, sc, c, a);
        return;
    }
    const mv_q4_kw::Raw w0{ds_get4(r.w), {ds_get4(r.w + 4), ds_get4(r.w + 8)}};
    const mv_q4_kw::Raw w1{ds_get4(r.w + 12), {ds_get4(r.w + 16), ds_get4(r.w + 20)}};
    const int b = lay == DS_GATED ? cu.c * 4 + (lane / 4) % 4 : cu.c * 8 + lane / 4;
    if (a16) {
        act_k4w16 a;
        load_act_k4w16(yv, b, c, a);
        acc[0] += k4w_compute16(w0, c, a);
        acc[1] += k4w_compute16(w1, c, a);
    } else {
        mv_q4_kw::Act a;
        mv_q4_kw::load_act(yv, b, c, a);
        acc[0] += mv_q4_kw::compute(w0, c, a);
        acc[1] += mv_q4_kw::compute(w1, c, a);
    }
}
