// The weight stream: each warp's ring of DS_STAGES shared-memory slots, filled by cp.async
// (ds_issue) and consumed by the dot products (ds_q6_chunk here; the Q4_K paths in decode_stack).
// Included by stack.hip after items.h; not a unit of its own.
#pragma once

// Warp `wid` requests its rows of the cursor's chunk into its part of a ring stage (dst: the
// stage's shared-memory address for this warp plus 16 * lane), as one copy group (an empty one
// past the last item, so that the groups keep counting items), and the cursor steps on. Each
// row's piece of the chunk is copied whole in 16-byte pieces, lane i taking pieces i, i + 32,
// ...: the row pointers already include 16 * lane, so a piece costs one copy with constant
// offsets. Rows hold whole chunks (the host checks the widths); a Q6_K chunk's 840 bytes are
// copied from their 16-byte aligned start, 53 pieces (rows hold whole chunk pairs, 1680 bytes,
// so the last chunk ends at the row's end).
static __device__ __forceinline__ void ds_issue(ds_cursor& is, const ds_item* end, int nq, uint32_t dst, int lane) {
    if (is.q < nq) {
        const int c = is.c, lay = is.kind & 3;
        if (lay == DS_Q6) {
            constexpr int P = 53 - 32;  // pieces past the first 32
            const int o = c * 4 * Q6_K_BYTES - 8 * (c & 1);
            const uint8_t* a = is.w + o;
            const uint8_t* b = is.w2 + o;
            cp_async16_s(dst, a);
            cp_async16_s(dst + DS_Q6_ROW, b);
            if (lane < P) {
                cp_async16_s(dst + 512, a + 512);
                cp_async16_s(dst + DS_Q6_ROW + 512, b + 512);
            }
        } else if (lay == DS_GATED) {
            constexpr int R = 4 * Q4_K_BYTES, P = R / 16 - 32;
            const uint8_t* g0 = is.w + c * R;
            const uint8_t* g1 = g0 + is.rb;
            const uint8_t* u0 = is.w2 + c * R;
            const uint8_t* u1 = u0 + is.rb;
            cp_async16_s(dst, g0);
            cp_async16_s(dst + R, g1);
            cp_async16_s(dst + 2 * R, u0);
            cp_async16_s(dst + 3 * R, u1);
            if (lane < P) {
                cp_async16_s(dst + 512, g0 + 512);
                cp_async16_s(dst + R + 512, g1 + 512);
                cp_async16_s(dst + 2 * R + 512, u0 + 512);
                cp_async16_s(dst + 3 * R + 512, u1 + 512);
            }
        } else {
            constexpr int R = 8 * Q4_K_BYTES, P = R / 16 - 64;
            const uint8_t* a = is.w + c * R;
            const uint8_t* b = is.w2 + c * R;
            cp_async16_s(dst, a);
            cp_async16_s(dst + 512, a + 512);
            cp_async16_s(dst + R, b);
            cp_async16_s(dst + R + 512, b + 512);
            if (lane < P) {
                cp_async16_s(dst + 1024, a + 1024);
                cp_async16_s(dst + R + 1024, b + 1024);
            }
        }
        is.next(end, nq);
    }
    cp_async_commit();
}

// The ring stage after byte offset `st` (stages DS_TILE apart, DS_STAGES of them).
static __device__ __forceinline__ uint32_t ds_next_stage(uint32_t st) {
    return st == (DS_STAGES - 1) * DS_TILE ? 0 : st + DS_TILE;
}

// This lane's share of two Q6_K rows' dot products over ring chunk `chunk` (tile: the warp's
// slot, rows DS_Q6_ROW apart from their 16-byte aligned start): lanes 16r .. 16r + 15 take row
// r, four lanes per block. `a16`: the input's Q8 scales cover 16 values (q8_put<16>).
static __device__ __forceinline__ float ds_q6_chunk(q8_vec yv, const uint8_t* tile, int chunk, bool a16, int lane) {
    const int pair = lane / 4, c = lane % 4, r = pair / 4, bl = pair % 4, b = chunk * 4 + bl;
    act_h16 a;
    if (a16) load_act_h16_a16(yv, b, c, a);
    else load_act_h16<true>(yv, b, c, a);
    const int o = b * Q6_K_BYTES - ((chunk * 4 * Q6_K_BYTES) & ~15);
    return mv_q6_k<1>::dot<true>(reinterpret_cast<const uint32_t*>(tile + r * DS_Q6_ROW), o, c, a);
}
