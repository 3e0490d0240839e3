// The decode stack's launch parameters and sizes: what the host fills in (`kernels::StackParams`
// mirrors `ds_params` field for field) and the compile-time shape of a block's shared memory.
// Included by stack.hip after qdot.h; not a unit of its own.
#pragma once

#define DS_THREADS 512
#define DS_WARPS (DS_THREADS / 32)
#define DS_MAX_LAYERS 32
#define DS_STAGES 5
// Bytes per warp per ring slot: two Q4_K rows of 8 blocks, four of 4 (gate and up), or two Q6_K
// rows of 4 blocks copied from their 16-byte aligned start (DS_Q6_ROW bytes each).
#define DS_SLOT 2304
#define DS_TILE (DS_WARPS * DS_SLOT)
#define DS_Q6_ROW 864
#define DS_HEAD 128
#define DS_PHASES 5
// Most work items (32-row groups) one block takes in a launch: its list sits in shared memory.
#define DS_MAX_ITEMS 512

// ds_params::qkv flags. DS_QKV_BIAS: each layer adds its qkv_vec rows (biases) to the q, k and
// v projections (Qwen2). DS_QKV_NEOX: the rope rotates dims i and i + 64 of a head (NeoX, all
// 128 dims rotated), else 2i and 2i + 1. DS_QKV_NORM: each q and k head is RMS-normed (eps)
// times qkv_vec[0] (q) or [1] (k) before the rope (Qwen3).
#define DS_QKV_BIAS 1
#define DS_QKV_NEOX 2
#define DS_QKV_NORM 4
// The barrier buffer (ds_params::bar), u32 words all 0 between launches: the grid barrier's
// counter at 0; decode_stack_split's per-KV-head counters from DS_ATTN_MAX_KV (64) on; from
// DS_NORM_AT, per q head and then k head (DS_QKV_NORM), the count of its
// rows done and the f32 sum of their squares.
#define DS_NORM_AT 128

// One layer's weights (GGUF rows in place) and caches.
struct ds_layer {
    const uint8_t *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    const float *attn_norm, *ffn_norm;
    __half *kc, *vc;
};

// Passed by value (under the 4 KB parameter limit); `kernels::StackParams` mirrors it.
struct ds_params {
    ds_layer layer[DS_MAX_LAYERS];
    const float* freq_factors;  // rope frequency factors, or null
    const int* pos;             // the step's position (one token)
    const float* x_in;          // the residual before the first layer
    float* x_out;               // ... after the last one (also the running residual)
    float* q;                   // roped queries, n_head * 128 (then the keys: DS_QKV_NORM)
    uint8_t *xq, *aq, *hq;      // Q8_1: x * norm weight, attention output; Q8_16: FFN activation
    float* ss;                  // 2 * n_layer sums of squares of x (before attention, before FFN)
    unsigned* bar;              // grid barrier counter, then decode_stack_split's per-KV-head
                                // counters (from DS_ATTN_MAX_KV on), the q/k norms' (DS_NORM_AT);
                                // all 0 between launches
    long long kv_stride;        // cache elements between positions
    unsigned v_q6, d_q6;        // bit l: layer l's v (down) projection is Q6_K, else Q4_K
    int n_layer, n_embd, n_ff, n_head, n_head_kv, n_kv, n_dims;
    float eps, attn_scale, base, freq_scale, ext_factor, mscale, corr_lo, corr_hi;
    int prefetch_items;  // gate/up items a headless block asks into L2 during attention
    // decode_stack_split only (the others leave them unread):
    int attn_splits;          // most shares of a KV head's keys (one block each)
    int attn_prefetch_rows;   // rows at the start of each share asked into L2 during phase 0
    float* attn_part;         // the shares' partial outputs, attn_splits * n_head * (DS_HEAD + 2)
    // Read by the _qkv kernels only (after the fields above, whose offsets stay as they were):
    const float* qkv_vec[DS_MAX_LAYERS][3];  // per layer: q, k, v biases (DS_QKV_BIAS) or q, k
                                             // norm weights (DS_QKV_NORM)
    unsigned qkv;                            // DS_QKV_* flags
    unsigned pad;                            // 0: no implicit padding in the block
};
