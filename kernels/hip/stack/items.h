// Dealing the work: which 32-row groups (and 16-row halves) of which matrix each block takes per
// phase, the list of a block's work items built once per launch (ds_build), and the cursor that
// walks it (ds_cursor).
// Included by stack.hip after activations.h; not a unit of its own.
#pragma once

// The rows one 32-row group of phase `k` of layer `l` reads: matrix, first row, layout.
struct ds_mat {
    const uint8_t* w;
    const uint8_t* w2;  // up rows (gated)
    long long rb;       // bytes per row
    int row, kind, nblk;
};

static __device__ __forceinline__ int ds_groups(const ds_params& p, int k) {
    switch (k) {
        case 0: return (p.n_head + 2 * p.n_head_kv) * DS_HEAD / 32;
        case 2: return p.n_embd / 32;
        case 3: return p.n_ff / 32;
        case 4: return p.n_embd / 32;
        default: return 0;
    }
}

// Half groups of phase kind k: the q/k/v and gate/up groups of the last, partial round, when at
// most half the grid, go out as 16-row halves to twice as many blocks. 8B over 132 blocks:
// gate/up's 52 groups, the busiest block's share 3.5 groups instead of 4 against a mean of 3.39;
// q/k/v's 60 (the last 28 k groups and the v groups), the busiest share 1.5 Q4_K groups instead
// of 2 (mean 1.45), or with Q6_K v one Q4_K group and a v half. A q/k/v half is split by
// columns between warp pairs (DS_SPLIT), which takes an even number of chunks per row whose
// second half starts at a Q6_K chunk pair: inputs a multiple of 4096 wide.
static __device__ __forceinline__ int ds_halves(const ds_params& p, int k) {
    if (k != 3 && (k != 0 || p.n_embd % 4096 != 0)) return 0;
    const int r = ds_groups(p, k) % (int)gridDim.x;
    return r > 0 && 2 * r <= (int)gridDim.x ? 2 * r : 0;
}

// Phase 0's group in dealing place g. The v groups (Q6_K in Q4_K_M, the heaviest) go to blocks
// that take no second group where that is possible: q and k groups fill the places before and
// after them, so that no block takes v and another group (on the 8B over 132 blocks the largest
// share drops from 4.9 to 4 chunk-sized tiles). In order where the last round goes out as
// halves (ds_halves).
static __device__ __forceinline__ int ds_qkv_group(const ds_params& p, int g) {
    const int n = ds_groups(p, 0), nv = p.n_head_kv * DS_HEAD / 32, r = n - (int)gridDim.x;
    if (r <= 0 || r + nv > (int)gridDim.x || g < r || ds_halves(p, 0) > 0) return g;
    return g < r + nv ? n - nv + (g - r) : g - nv;
}

static __device__ __forceinline__ long long ds_row_bytes(int kind, int nblk) {
    return (long long)nblk * (kind == DS_Q6 ? Q6_K_BYTES : Q4_K_BYTES);
}

static __device__ __forceinline__ ds_mat ds_matrix(const ds_params& p, int l, int k, int g) {
    const ds_layer& L = p.layer[l];
    ds_mat m{nullptr, nullptr, 0, (k == 0 ? ds_qkv_group(p, g) : g) * 32, DS_Q4, p.n_embd / QK_K};
    if (k == 0) {
        const int nq = p.n_head * DS_HEAD, nk = p.n_head_kv * DS_HEAD;
        if (m.row < nq) {
            m.w = L.wq;
        } else if (m.row < nq + nk) {
            m.w = L.wk;
            m.row -= nq;
        } else {
            m.w = L.wv;
            m.row -= nq + nk;
            m.kind = (p.v_q6 >> l) & 1 ? DS_Q6 : DS_Q4;
        }
    } else if (k == 2) {
        m.w = L.wo;
        m.nblk = p.n_head * DS_HEAD / QK_K;
    } else if (k == 3) {
        m.w = L.wg;
        m.w2 = L.wu;
        m.kind = DS_GATED;
    } else {
        m.w = L.wd;
        m.nblk = p.n_ff / QK_K;
        m.kind = (p.d_q6 >> l) & 1 ? DS_Q6 : DS_Q4;
    }
    m.rb = ds_row_bytes(m.kind, m.nblk);
    return m;
}

// One of a block's work items, a 32-row group (or gate/up half group) of one phase of one layer,
// as its cursors need it.
// The block lists its items once per launch (ds_build), so that moving to the next group is a
// shared-memory load: looking a group up from the parameters (the phase's matrix, the q/k/v
// dealing, the row's address) took the warps about 0.5 us at each group change.
struct ds_item {
    const uint8_t* w;   // the group's first row (its first gate row when gated)
    const uint8_t* w2;  // its second row (Q4_K, Q6_K) or its first up row (gated)
    int rb;             // bytes per row (half that in a DS_NEOX group, see ds_build)
    short q, r16;       // phase (layer * DS_PHASES + kind) and first output row / 16
    unsigned char kind, n;  // layout and chunks (ring slots per warp)
    unsigned char pad[6];
};

// Work items of phase kind k that block b takes: groups b, b + grid, ... (of q/k/v and gate/up,
// the whole ones), then half b.
static __device__ __forceinline__ int ds_share(const ds_params& p, int k) {
    const int b = (int)blockIdx.x, h = ds_halves(p, k), n = ds_groups(p, k) - h / 2;
    return (b < n ? (n - 1 - b) / (int)gridDim.x + 1 : 0) + (b < h ? 1 : 0);
}

// Lists this block's work items in order (phases in order, groups b, b + grid, ... within one)
// and returns their count; the host keeps it within DS_MAX_ITEMS (kernels::stack_items).
// Inlined: on AMD a call would take the address of the kernel's parameter block, which then
// gets copied into scratch memory per lane.
template <bool EXT>
static __device__ __forceinline__ int ds_build(const ds_params& p, ds_item* items) {
    int per = 0;
    for (int k = 0; k < DS_PHASES; ++k) per += ds_share(p, k);
    const int ni = min(per * p.n_layer, DS_MAX_ITEMS);
    for (int i = threadIdx.x; i < ni; i += DS_THREADS) {
        const int l = i / per;
        int r = i - l * per, k = 0;
        while (r >= ds_share(p, k)) r -= ds_share(p, k++);
        const int g = (int)blockIdx.x + r * (int)gridDim.x, nh = ds_halves(p, k);
        const int nfull = ds_groups(p, k) - nh / 2;
        const bool half = g >= nfull;  // the block's half group (its last item of the phase)
        const int hrow = nfull * 32 + 16 * (int)blockIdx.x;  // the half's first row
        ds_mat m = ds_matrix(p, l, k, half ? hrow / 32 : g);
        int kind = m.kind;
        if (half && k == 0) {
            m.row += hrow % 32;
            kind |= DS_SPLIT;
        } else if (half) {
            m.row = hrow;
            kind = DS_Q4 | DS_HALF;
        }
        ds_item t;
        t.w = m.w + (long long)m.row * m.rb;
        t.w2 = m.w2 ? m.w2 + (long long)m.row * m.rb : t.w + m.rb;
        t.rb = (int)m.rb;
        t.q = (short)(l * DS_PHASES + k);
        t.r16 = (short)(half ? hrow / 16 : 2 * (k == 0 ? ds_qkv_group(p, g) : g));
        t.kind = (unsigned char)(kind | (k == 4 ? DS_A16 : 0));
        t.n = (unsigned char)((kind & 3) == DS_Q4 ? m.nblk / 8 : m.nblk / 4);
        if (EXT && k == 0 && (p.qkv & DS_QKV_NEOX) && t.r16 * 16 < (p.n_head + p.n_head_kv) * DS_HEAD) {
            // A q or k group under NeoX rope (DS_NEOX): group j of a head takes rows 16j .. 16j + 15
            // and their partners 64 on, half u (a split half, rows 16u .. 16u + 15 of the head in
            // the dealing) rows 8u .. 8u + 7 and theirs, so that the halves take what the whole
            // groups leave. One row of each per warp (pair): the cursor's two-row stride halved
            // (rb is read for nothing else in a Q4_K item). A half keeps its r16 (ds_qkv_row).
            const int j = half ? 0 : (t.r16 / 2) & 3, u = half ? t.r16 & 7 : 0;
            t.w -= (16 * j + 8 * u) * m.rb;
            t.w2 = t.w + 64 * m.rb;
            t.rb = (int)m.rb / 2;
            t.r16 = (short)(t.r16 - j);
            t.kind |= DS_NEOX;
        }
        items[i] = t;
    }
    return ni;
}

// Position in this block's work items: the item `it` (`end` past the last), its chunk c, and the
// item's fields (q = nq past the last item; n past this warp's last chunk, c its first). The row
// pointers are this warp's first row of each pair plus 16 * lane, this lane's first piece of it
// (see ds_issue). A pointer, not an index: with an index, CUDA 11.8's ptxas loaded the item after
// the one asked for.
struct ds_cursor {
    const ds_item* it;
    int c, q, r16, kind, n, rb;
    int tid;  // threadIdx.x (see ds_step on why it is a field)
    const uint8_t *w, *w2;
    __device__ void load(const ds_item* end, int nq) {
        if (it < end) {
            const ds_item t = *it;
            q = t.q;
            r16 = t.r16;
            kind = t.kind;
            rb = t.rb;
            const int rows = t.kind & DS_HALF ? 1 : 2;  // per warp, of each matrix
            int pair = tid / 32;
            c = 0;
            n = t.n;
            if (t.kind & DS_SPLIT) {
                c = (pair >> 3) * (t.n >> 1);
                n = c + (t.n >> 1);
                pair &= 7;
            }
            const int off = rows * pair * t.rb + 16 * (tid % 32);
            w = t.w + off;
            w2 = t.w2 + off;
        } else {
            q = nq;
        }
    }
    __device__ void first(const ds_item* items, const ds_item* end, int nq) {
        it = items;
        tid = (int)threadIdx.x;
        load(end, nq);
    }
    __device__ void next(const ds_item* end, int nq) {
        if (++c < n) return;
        ++it;
        load(end, nq);
    }
};
