// The persistent decode stack: all the llama-family layers of one decode step (one token) in one
// cooperative launch, so that the weight stream never stops at a kernel boundary.
//
// One block of DS_THREADS threads per multiprocessor runs five phases per layer, with a grid
// barrier between consecutive phases:
//   0  q, k and v projections of rms_norm(x) * attn_norm; q and k roped (adjacent pairs), k and v
//      stored in the f16 caches at the step's position, q kept in `q`;
//   1  attention, one head per block and pass (online softmax per warp over every 16th key, the
//      warps' shares combined in shared memory), its output quantized for phase 2;
//   2  o projection plus the residual: x, and x * ffn_norm quantized for phase 3;
//   3  gate and up projections of rms_norm(x) * ffn_norm, act(gate) * up quantized for phase 4;
//   4  down projection plus the residual: x, and x * the next layer's attn_norm quantized.
// Products run over 32-row groups, block b taking groups b, b + grid, ... (q/k/v's and gate/up's
// partial last round as 16-row halves, see ds_halves), listed once per launch in shared memory
// (ds_build); each warp owns two rows of a group (four for gate and up) and streams them through
// its own ring of DS_STAGES shared-memory slots filled by cp.async. The ring runs ahead of the
// phase being computed, across the barriers (weights are read-only), which is what one launch
// per token buys: on an H100 the 8B's products ran at 76% of the copy bandwidth this way against
// 71% as separate launches (see the study at the end of matvec.hip).
// RMS norms cost no pass: a producer writes its rows times the norm weight in Q8_1 and adds
// their squares to a per-norm sum, and the consumer scales its dot products by
// rsqrt(sum / n + eps) (a Q8_1 vector scaled by r quantizes to the same values with its scales
// times r).
// Data crossing a barrier is read with L2 loads (__ldcg): a multiprocessor's L1 may hold lines
// another one has since rewritten.
//
// Measured (H100, synthetic Llama-3-8B Q4_K_M, tg128, `rocmforge bench` with the stack against
// the per-op kernels in the same runs, 2026-11-25):
//   326 t/s at first (per-op 415);
//   381 with the copy loops dividing by constants and each group's matrix looked up once;
//   395 with whole chunks only (no bounds checks), per-group row pointers and the Q6_K offset
//       taken out of the byte loop;
//   407 with the residual and the norm weight of the epilogue asked for a group ahead and no
//       fence after the barrier's acquire load (per-op 414-418);
//   439.7 / 438.6 against 418.8 / 418.7 with copies of whole rows at constant offsets from
//       per-lane row pointers (was a (row, piece) division per piece), the Q4_K scales decoded
//       without a divergent branch and the high nibbles multiplied in place: warp instructions
//       per step from about 1.1 G to 0.76 G (ncu);
//   437 / 439 against 410 / 404 with Q4_K at four lanes per block (0.67 G instructions, 36%
//       issue activity): no longer issue-bound;
//   441 / 448 / 449 against 439 / 444 / 445 (same runs) with the v groups dealt to blocks that
//       take no second q/k/v group (the phase's largest share 4 instead of 4.9 chunk tiles).
// A per-block timeline (globaltimer at each phase's start and end, one step at position 64, 8B)
// put a layer at about 63 us: q/k/v 7.5, attention 3.4 (32 blocks busy), o 5.3, gate/up 26,
// down 16.7, and 0.86 us (median) from a barrier's last arrival to a block's release. Each
// phase's input fetch takes 0.4-0.7 us after the release.
// Where the time goes now (variants of this kernel timed against it, results ignored): without the
// grid barriers' waits 11% faster, without the attention phase 3.4%, without any dot product 4.5%.
// ncu puts 22% of the warps' stall samples at the grid barrier. Tried and slower: L2 prefetches
// running 4-32 chunks ahead of the ring (7-30%), or only while waiting at a barrier (11-21%);
// arriving with atom.acq_rel and polling relaxed (3%), or polling relaxed with a fence after the
// flip (2-3%); the last warp to finish a group running its epilogue instead of a block barrier per
// group (3.5%). Tried and no faster: readiness counters per head instead of the barrier between
// phases 0 and 1, with k and v groups dealt first; the block whose arrival completes a barrier
// going on without polling. Slower too (429 against 418 per op in the same runs, against 437
// before): dealing gate/up by chunks, at most 14 per block instead of 4 groups of 4, a group split
// between two blocks adding up their part sums through global memory. How to win back the barriers'
// 11% is open: waiting on per-slice counters instead keeps each block's own path through the phases
// (the per-head counters above gained nothing), and that variant ran blocks ahead on stale data.
// Also tried and slower (2026-11-25, same runs): gate/up's partial last round of groups as 16-row
// halves over twice as many blocks, their f32 rows quantized by every block after the barrier
// (436 / 438 against 442 / 446): phase 3 ended 2.9 us sooner per layer but phase 4 started 1.7 us
// later and, with no early finishers left to stream its first chunks, ran 2.3 us longer; the
// attention's scores computed per batch of 8 keys before one rescale (434-444 against 441-449);
// the output head as one more phase after the last layer (its input quantized by the last
// phase 4 with the output norm, 4008 groups of 4 Q6_K chunks, a partial last group moved back to
// end at the last row; logits within 0.13 of the per-op kernels'): 437-442 against 443-448, and
// with the head's phase in a loop of its own after the layers' loop (so that their code stays
// as it is) 438-443 against 448. In the first one's timeline the head phase took 160 us (90% of the
// copy bandwidth) but the layers ran 5 us slower each (68 against 63 us), so the head stays a
// kernel of its own (about 165 us of the 2.3 ms step, 78% of the copy bandwidth).
// Between two steps' stack launches 0.25 ms passed (the head, the step's small kernels, the
// logits' copy to the host and the next graph launch). Host probes (2026-11-25, H100) then found
// 63 us of host copies and page faults after the logits' transfer (now read in place) and 24 us
// in the two staged 4-byte input writes before the next launch (now one batched stream write).
// The logits now land in host memory from the head kernel itself (no 16 us transfer after it)
// and the head prefetches whole rows (161 -> 148.5 us). What is left around a 2.18 ms step: the
// get_rows, output norm and head kernels (about 5 + 5 + 148 us in ncu) and the host's path from
// the logits to the next replay, which per-call probes on H100 machines put at 9-21 us (median;
// 5-10 us of it in the graph launch call) with wide spread between machines and runs. Taking it
// off the GPU's path needs the next step queued before the logits are read (a stream wait on a
// host-mapped flag ahead of the replay, its inputs copied from host-mapped memory after it).
// That was built (the gate word, staged inputs, the next step queued while the host samples) and
// measured no faster: 459.6 against 460.0 t/s without it in the same H100 run, so it was left out.
// On an H200 (41% more copy bandwidth, 4262 against 3009 GB/s; same multiprocessors and clocks)
// the same step takes 1.87 ms (535 t/s, 58% of its bandwidth limit against 70.6% on the H100):
// the stack 1.69 ms at 51% of peak DRAM throughput, the head 140 us (ncu). Its timeline puts a
// layer at about 55 us: q/k/v 7.8 (no faster than on the H100), attention 3.5, o 4.7, gate/up
// 21.4, down 13.5 (84% of the copy bandwidth), and 0.86 us (median) per barrier release. The
// busiest block sets each phase's end: q/k/v's 192 groups over 132 blocks leave the largest
// share 27% above the mean, gate/up's 448 groups 19% above it (its longest block 684 us per step
// against a 574 us mean). Balancing those shares and the barriers' fixed cost, not the bytes, is
// what the faster memory needs. ncu there (one step): 38.5% of issue slots busy, 4 warps per
// scheduler (one 512-thread block per multiprocessor: registers and shared memory) of which 0.7
// are eligible, 10.4 cycles between a warp's instructions; the long phases stream about 28 GB/s
// per multiprocessor. More warps in flight per multiprocessor (smaller rings per warp) is the
// other way in.
// ncu's source counters then showed where the shared-memory wavefronts went: three quarters were
// the activation loads' 4-way bank conflicts (see act_swz in qdot.h). With the Q8_1 input
// permuted (2026-11-26, same runs): H200 574 t/s against 536 (58.0% -> 62.2% of the limit),
// H100 466 against 459.4 (70.4% -> 71.5%); excess wavefronts per step 124 M -> 30 M (what is left
// is cp.async writing row pieces that straddle 128-byte lines). After it, on the H200 (variants
// timed against it in the same runs, results ignored where the variant breaks them): without the
// grid barriers' waits 598 t/s (+4%), without the dot products 582 (+1%), without both 740
// (+29%): neither alone bounds the step; the phases' heaviest blocks do (the work per warp is
// serial: a chunk's ~190 instructions at ~9 cycles each put a multiprocessor near 43 GB/s, so the
// few blocks with one more group cannot take the bandwidth the finished ones leave). Also tried
// there, no faster: a ring of 4 stages (575 against 574); the group epilogue rotating over the
// warps (574); the ring filled by bulk copies (cp.async.bulk on per-warp, per-stage mbarriers,
// assembled with ptxas 12.9 since Debian's CUDA 11.8 has no PTX 8.0): 571 against 580 for the
// same source and assembler with cp.async; each warp's two rows streamed as one contiguous range
// per chunk (566-570 against 577). Slower: the groups left after whole rounds (q/k/v 60, gate/up
// 52) split into halves over twice as many blocks, the partial sums meeting in global memory and
// the second block to finish running the epilogue (largest shares 11% and 3% above the mean):
// 466 against 577, and 508 with the cursor's extra fields alone (splitting off): the cursor's
// bookkeeping runs in every warp at every group boundary (every 4 chunks in gate/up), so a few
// divisions there cost 12%. With the split worked out once per launch (kept in shared memory)
// and only gate/up's groups split: 507 against 577, and 578 with splitting off (the
// bookkeeping no longer costs); the halves' meeting (a fence, a counter, two block barriers per
// split group) outweighs the balance. Nor is it the meeting: with the halves' sums put together
// by every block at phase 4's start instead (loaded beside the Q8_1 fetch, no fence, counter or
// extra barrier in phase 3), 509 against 575. Its timeline shows why: gate/up's blocks did end
// together (last arrivals spread over 49 us a step against 157) but every phase ran slower, q/k/v
// and o too (222 -> 258 and 146 -> 167 us a step), and the put-together added 1.8 us to each
// phase 4 fetch: the kernel sits at the register limit (122 of 128 before, 128 and a larger stack
// frame with the split's cursor fields), so any state added to the hot loop slows all of it.
// Balancing needs registers freed first (the consuming cursor needs no pointers; per-phase
// dealing could live in shared memory). Dealing gate/up to 112 blocks (4 groups each, 20 idle)
// 579-580 against 571-575, q/k/v to 96 as well: the same. The timeline says why balance matters
// on the H200: a block streams at about the same rate whatever the others do (gate/up's blocks
// with 4 groups took 17.6 us a layer, those with 3 took 13.5: 1.30, about 4/3), about 33 GB/s
// per multiprocessor, barely above the 32 GB/s that 4.26 TB/s asks of each of 132; blocks that
// finish early leave their share of the bandwidth unused. Reaching 70% there needs every phase
// balanced at no cost per group (and shorter attention and barrier bubbles).
// Per-iteration probes (globaltimer around each chunk's copy request, wait and dot products; H200,
// 2026-11-26) then showed the ring's data always there when a warp came to it (waits of 0-64 ns):
// a chunk took about 0.55 us of dot products and 0.2-0.35 us of requests, and each group change
// about 0.5 us more in every warp, spent looking the next group up from the parameters (the
// phase's matrix, the q/k/v dealing, the row address: some 60 dependent instructions). Listing
// each block's work items once per launch (ds_build; a group change is then one shared-memory
// load): 597-600 t/s against 574-576 (62.2% -> 65.1% of the limit), H100 482 against 467 (71.6% ->
// 74.0%), same runs. The cursor walks a pointer into the list: with an index, the CUDA 11.8 ptxas
// addressed the item after the one asked for (the loop's loads at 32 * i + 0x20 past the list,
// seen in SASS; every launch faulted). Gate/up's partial last round (52 of 448 groups over 132
// blocks) then went out as 104 half groups, the busiest block's share 3.5 groups against 4
// (mean 3.39): 612 against 598 t/s (66.7%). Its FFN activation carries a Q8 scale per 16 values
// (q8_put<16>) so that a half quantizes its 16 rows alone; the down products read the finer
// scales at no extra cost for Q6_K (a scale per 16-value piece already) and two more products per
// row for Q4_K. Tried and slower: the group epilogue without a block barrier (the group's rows
// meeting through named barriers, bar.arrive by 15 warps and bar.sync by the one that finishes it,
// rotating): 594 against 600. What the step still loses on the H200 (a layer about 45 us against
// 32 us of weights at the 4.5 TB/s a read-only cp.async ring reaches over all multiprocessors):
// about 0.8 us per barrier from the last arrival to the release and 0.5-0.7 us per phase fetching
// its input, both L2 round trips, which take 1.2 us while the weight streams run (0.14 us idle:
// a pointer chase beside 131 streaming blocks); the attention phase (3.4 us, 32 blocks busy); and
// q/k/v's share (the busiest block 2 groups against a mean of 1.45). A block streams at what
// the others leave it (the same ring alone on 33 multiprocessors: 119 GB/s each), so balance
// pays only where the bytes are spread evenly. Variants of this kernel timed against it (results
// ignored): without the grid barriers' waits 654 t/s against 612 (70.8% of the limit), without
// the waits and the input fetches 679.5 (73.5%). What the barriers and fetches cost beyond the
// phases' real dependencies is their round trips: a phase's input written with a tag per word
// (an epoch beside the payload) would let a block fetch and check in one round trip instead of a
// fence, an atomic, a poll and a fetch.
// That was built and measured slower (H200, 2026-11-26, same runs, main 610-615 t/s): every
// exchanged vector (queries, x's Q8_1 with per-group partial sums of squares replacing the
// atomics, the attention output, the FFN activation, the position's keys and values) as 8-byte
// words of a 4-byte payload and a 32-bit tag (launch epoch from a device counter the last block
// moves on, and phase), written with plain 64-bit stores and no fence, no grid barrier, a block
// fetching its input with all its words in flight and re-reading the stale ones: 584-586 t/s.
// Its timeline did what was asked of it (last producer's write to a consumer's input in shared
// memory 0.4-0.6 us a phase against 1.3 for release plus fetch) but the streaming phases ran
// slower, gate/up most (mean block 536 against 472 us a step, the busiest 621 against 523), and
// ncu counted 10% more instructions and half again as many L2 read sectors for the kernel (1.52
// against 1.45 ms). Variants, none faster: each thread re-reading its stale words one after the
// other 523; with a 128 ns sleep between reads 489, 256 ns after the first re-read 575; only a
// thread's first stale pair polled 543, or one pair per warp 579-582 (L2 reads barely lower, so
// the polling is not what the extra sectors are); plain, volatile or relaxed stores alike;
// per-phase item counters polled by one thread before the fetch (no fence: the tags still
// decide) 561; the residual kept in the shared memory of the block that owns its rows (the
// output and down products deal group g to the same block) instead of tagged words, no change.
// Where the streaming time goes in those variants is open.
// The output head takes this kernel's streaming too (head_q6_k below): one block per
// multiprocessor, each warp its two rows of 32-row groups through its own ring, no block
// barrier after the input's fetch. H200, 8B tg128, same runs: 622.8 / 625.0 t/s against 614.6 /
// 615.1 with the per-op head (66.9% -> 68.1% of the limit); the H100 was not re-measured.
// The tagged design once more (2026-11-26, H200, same runs): with each block's polling lane on
// a different word and 100 ns between polls 580 t/s, without the sleep 581, against 625 for
// this kernel: the hot polled lines are not what slows its streaming either.
// q/k/v's partial last round as 16-row halves (ds_halves; the columns of a half split between
// warp pairs, DS_SPLIT): 624-626 t/s against 618-624, the q/k/v phase 199 -> 188 us a step (Q4_K
// layers 6.24 -> 5.70 us, Q6_K-v layers 6.20 -> 6.04). Tried and slower: the q/k/v epilogue per
// warp without the group's block barrier (rope pairs are a warp's own two rows; the split
// halves meeting through named barriers): 610 against 621; its q/k/v phase was 4 us faster but
// gate/up and down 7% slower, their loops scheduled differently by ptxas.
// The weight streams stand still during the attention phase (the rings are full, 100 of 132
// blocks have no head). Blocks without a head now ask for the rows of their first two gate/up
// work items into L2 then (ds_prefetch_items; 29 MB on the 8B over 132 blocks, the rings run on
// from it): 640-641 t/s against 621-623 for the kernel before the q/k/v halves, in three runs
// (H200, 69.4% of the limit); o 132 -> 117 us a step, gate/up 522 -> 503, attention 105 -> 116
// (the prefetches compete with its key and value loads). Every block's gate/up time dropped,
// the attention blocks' too: less is left for DRAM during gate/up. Tried, slower: one item
// (629), three (628; 44 MB, more than L2 keeps), every block asking after its attention (621),
// also the attention blocks' first item asked for by 32 idle blocks (637.5), the whole down item
// asked for at the gate/up -> down barrier (587-592) or the next q/k/v items at the down -> q/k/v
// one (623): at a barrier the streams are still running. A 256-byte stride: the same (639);
// a 300 ns sleep before the requests, to let the attention blocks' loads go first: the same
// (639-642 against 639-641); prefetch.global.L2::evict_last: 629-632, with three items 600-602.
// How many items: the host keeps all headless blocks' requests within 60% of the L2
// (kernels::stack_prefetch_items: 2 on the 8B over 132 blocks and 50 MiB, none over 82 and 6 MiB).
// The rope's cosines and sines for the step's position worked out once per launch into shared
// memory instead of in each q/k group's epilogue (a powf and a sincosf in warp 0 while the
// block's next group waits on it): 643.4 / 643.5 t/s against 638.3 / 640.9 (H200, same run);
// q/k/v 190 -> 170 us a step in the timeline (Q4_K-v layers 5.83 -> 4.89 us, Q6_K-v 6.05 ->
// 5.73). Also measured there: the sums of squares loaded ahead of the input's fetch in phases 0
// and 3 (the fetch took 0.70 instead of 0.74 us): 635 against 638-641 alone, the same with the
// rope table.
// Q6_K chunks consumed two at a time (one ring wait, both chunks' dot products, then the two freed
// slots refilled; rows hold whole chunk pairs), in decode_stack and head_q6_k, since a Q6_K ring
// iteration cost about 1 us whatever its bytes: with the rope table, H200 653.3-653.9 t/s against
// 640.0-643.1 for the kernel before both (three runs; 71.2% of the limit against 69.7-70.0%);
// another H200 649.6 / 657.4 against 641.7 / 644.0. The H100 lost a little: 506.6-508.8 against
// 508.8-510.3 (77.7-78.0% against 78.0-78.2%). Also pairing the Q4_K chunks where an item has two
// left (q/k/v, o, then down, then gate/up as well) was slower than the Q6_K pairs alone: 640-648.
// Weights: q, k, o, gate and up in Q4_K; v and down in Q4_K or Q6_K (Q4_K_M). Head size 128;
// every product's input width a multiple of 2048 (whole 8-block Q4_K chunks, 16-byte Q6_K rows).
// NVIDIA compute capability 8.0 and later only (cp.async); elsewhere the kernel is empty and the
// host never launches it.
#include "qdot.h"

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
    float* q;                   // roped queries, n_head * 128
    uint8_t *xq, *aq, *hq;      // Q8_1: x * norm weight, attention output; Q8_16: FFN activation
    float* ss;                  // 2 * n_layer sums of squares of x (before attention, before FFN)
    unsigned* bar;              // grid barrier counter, 0 between launches
    long long kv_stride;        // cache elements between positions
    unsigned v_q6, d_q6;        // bit l: layer l's v (down) projection is Q6_K, else Q4_K
    int n_layer, n_embd, n_ff, n_head, n_head_kv, n_kv, n_dims;
    float eps, attn_scale, base, freq_scale, ext_factor, mscale, corr_lo, corr_hi;
    int prefetch_items;  // gate/up items a headless block asks into L2 during attention
};

#if defined(RF_CP_ASYNC)

// Work item layouts (kind & 3): two rows per warp in Q4_K or Q6_K, or two gate and two up rows.
// Flags: DS_HALF, a 16-row gate/up half group (one gate and one up row per warp, laid out as
// DS_Q4); DS_A16, a product over the FFN activation, whose Q8 scales cover 16 values (q8_put<16>:
// the halves write theirs alone); DS_SPLIT, a 16-row q/k/v half group, warps w and w + 8 taking
// the same two rows, w the first half of their chunks and w + 8 the second (the epilogue adds
// the two sums).
enum { DS_Q4 = 0, DS_Q6 = 1, DS_GATED = 2, DS_HALF = 4, DS_A16 = 8, DS_SPLIT = 16 };

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
    int rb;             // bytes per row
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
static __device__ int ds_build(const ds_params& p, ds_item* items) {
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
    const uint8_t *w, *w2;
    __device__ void load(const ds_item* end, int nq) {
        if (it < end) {
            const ds_item t = *it;
            q = t.q;
            r16 = t.r16;
            kind = t.kind;
            rb = t.rb;
            const int rows = t.kind & DS_HALF ? 1 : 2;  // per warp, of each matrix
            int pair = (int)(threadIdx.x / 32);
            c = 0;
            n = t.n;
            if (t.kind & DS_SPLIT) {
                c = (pair >> 3) * (t.n >> 1);
                n = c + (t.n >> 1);
                pair &= 7;
            }
            const int off = rows * pair * t.rb + 16 * (int)(threadIdx.x % 32);
            w = t.w + off;
            w2 = t.w2 + off;
        } else {
            q = nq;
        }
    }
    __device__ void first(const ds_item* items, const ds_item* end, int nq) {
        it = items;
        load(end, nq);
    }
    __device__ void next(const ds_item* end, int nq) {
        if (++c < n) return;
        ++it;
        load(end, nq);
    }
};

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

static __device__ __forceinline__ unsigned ds_ld_acquire(const unsigned* p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Asks for the rows of the first `ng` work items of phase q (from `it` on) into L2, one request
// per 128-byte line spread over the block's threads. The blocks without a head run this during
// phase 1, while the weight streams stand still (see the note at the top).
static __device__ __forceinline__ void ds_prefetch_items(const ds_item* it, const ds_item* end, int q, int ng) {
    for (; it < end && it->q < q; ++it) {
    }
    for (int j = 0; j < ng && it < end && it->q == q; ++j, ++it) {
        const ds_item t = *it;
        const int bytes = (t.kind & DS_HALF ? 16 : 32) * t.rb;  // rows from t.w (gate) and t.w2 (up)
        for (int o = threadIdx.x * 128; o < bytes; o += DS_THREADS * 128) {
            rf_prefetch_l2(t.w + o);
            rf_prefetch_l2(t.w2 + o);
        }
    }
}

// Copies a Q8 vector of `ncols` values (`bytes` with its scales) from L2 into shared memory, its
// values' 16-byte pieces permuted by act_swz (see qdot.h), four 16-byte loads per thread in
// flight.
static __device__ __forceinline__ void ds_fetch(const uint8_t* src, uint8_t* dst, int ncols, size_t bytes) {
    const int n = (int)bytes / 16, nq = ncols / 16;
    for (int base = 0; base < n; base += 4 * DS_THREADS) {
        int4 v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * DS_THREADS + threadIdx.x;
            if (i < n) v[j] = __ldcg(reinterpret_cast<const int4*>(src) + i);
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int i = base + j * DS_THREADS + threadIdx.x;
            if (i < n) reinterpret_cast<int4*>(dst)[i < nq ? act_swz(i) : i] = v[j];
        }
    }
}

// Phase 1 for head h: one pass per warp over keys wid, wid + 16, ... (online softmax; lane i
// holds dims 4i .. 4i + 3), then the warps' shares combined; the output goes out in Q8_1.
static __device__ __forceinline__ void ds_attention(const ds_params& p, int l, int h, int nkv, float* wo, int wid,
                                                    int lane) {
    __shared__ float wm[DS_WARPS], wl[DS_WARPS];
    const int kvh = h / (p.n_head / p.n_head_kv);
    const __half* kc = p.layer[l].kc;
    const __half* vc = p.layer[l].vc;
    const float4 qv = __ldcg(reinterpret_cast<const float4*>(p.q + h * DS_HEAD) + lane);
    float m = -INFINITY, ls = 0.0f, o0 = 0.0f, o1 = 0.0f, o2 = 0.0f, o3 = 0.0f;
    constexpr int U = 8;
    for (int j0 = wid; j0 < nkv; j0 += U * DS_WARPS) {
        uint2 kr[U], vr[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int j = j0 + u * DS_WARPS;
            const long long off = (long long)j * p.kv_stride + kvh * DS_HEAD + lane * 4;
            kr[u] = j < nkv ? __ldcg(reinterpret_cast<const uint2*>(kc + off)) : make_uint2(0, 0);
            vr[u] = j < nkv ? __ldcg(reinterpret_cast<const uint2*>(vc + off)) : make_uint2(0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
            if (j0 + u * DS_WARPS >= nkv) break;
            const __half2 k0 = *reinterpret_cast<const __half2*>(&kr[u].x);
            const __half2 k1 = *reinterpret_cast<const __half2*>(&kr[u].y);
            const float sc = warp_sum(__low2float(k0) * qv.x + __high2float(k0) * qv.y + __low2float(k1) * qv.z +
                                      __high2float(k1) * qv.w) *
                             p.attn_scale;
            const float mn = fmaxf(m, sc), cr = expf(m - mn), pr = expf(sc - mn);
            const __half2 v0 = *reinterpret_cast<const __half2*>(&vr[u].x);
            const __half2 v1 = *reinterpret_cast<const __half2*>(&vr[u].y);
            ls = ls * cr + pr;
            o0 = o0 * cr + pr * __low2float(v0);
            o1 = o1 * cr + pr * __high2float(v0);
            o2 = o2 * cr + pr * __low2float(v1);
            o3 = o3 * cr + pr * __high2float(v1);
            m = mn;
        }
    }
    if (lane == 0) {
        wm[wid] = m;
        wl[wid] = ls;
    }
    reinterpret_cast<float4*>(wo + wid * DS_HEAD)[lane] = make_float4(o0, o1, o2, o3);
    __syncthreads();
    if (threadIdx.x < DS_HEAD) {
        float mx = -INFINITY;
        for (int w = 0; w < DS_WARPS; ++w) mx = fmaxf(mx, wm[w]);
        float sl = 0.0f, so = 0.0f;
        for (int w = 0; w < DS_WARPS; ++w) {
            const float e = wm[w] == -INFINITY ? 0.0f : expf(wm[w] - mx);
            sl += wl[w] * e;
            so += wo[w * DS_HEAD + threadIdx.x] * e;
        }
        q8_1_put(so / sl, p.aq, p.n_head * DS_HEAD, h * DS_HEAD + threadIdx.x);
    }
    __syncthreads();
}

// Asks for the earlier keys and values of this block's heads in layer l into L2 while the other
// blocks finish phase 0 (the cache rows before the position are not written this step).
static __device__ __forceinline__ void ds_prefetch_kv(const ds_params& p, int l, int pos) {
    const int grp = p.n_head / p.n_head_kv;
    for (int h = blockIdx.x; h < p.n_head; h += gridDim.x) {
        const int kvh = h / grp, part = h % grp;
        for (int i = threadIdx.x; i < pos * 2; i += DS_THREADS) {  // two 128-byte lines per row
            const int j = i / 2;
            if (j % grp != part) continue;
            const long long off = (long long)j * p.kv_stride + kvh * DS_HEAD + (i & 1) * 64;
            rf_prefetch_l2(p.layer[l].kc + off);
            rf_prefetch_l2(p.layer[l].vc + off);
        }
    }
}

#endif  // RF_CP_ASYNC

// One block per multiprocessor: the whole register file is this block's.
#define DS_ATTRS __launch_bounds__(DS_THREADS, 1)

RF_KERNEL void DS_ATTRS decode_stack(ds_params p) {
#if defined(RF_CP_ASYNC)
    extern __shared__ __align__(16) uint8_t sm[];
    uint8_t* ring = sm;
    __shared__ float rowv2[2][32];
    __shared__ float scratch[RF_MAX_WARPS_PER_BLOCK];
    __shared__ float2 rope_cs[DS_HEAD / 2];  // (cos, sin) per dimension pair at the step's position
    ds_item* items = reinterpret_cast<ds_item*>(sm + DS_STAGES * DS_TILE);
    uint8_t* act = sm + DS_STAGES * DS_TILE + DS_MAX_ITEMS * sizeof(ds_item);
    const int nq = DS_PHASES * p.n_layer;
    const int lane = threadIdx.x % 32, wid = threadIdx.x / 32;
    const ds_item* end = items + ds_build(p, items);
    __syncthreads();
    ds_cursor is, cu;
    is.first(items, end, nq);
    cu = is;
    // This lane's place in stage 0 of its warp's ring; the stages are DS_TILE apart.
    const uint32_t ring_lane = (uint32_t)__cvta_generic_to_shared(ring) + wid * DS_SLOT + lane * 16;
    for (int s = 0; s < DS_STAGES - 1; ++s) ds_issue(is, end, nq, ring_lane + s * DS_TILE, lane);
    rf_entry();
    // Byte offsets of the stage being consumed and of the one issued next.
    uint32_t st_use = 0, st_put = (DS_STAGES - 1) * DS_TILE;
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
            const float v = __ldcg(p.x_in + i);
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
    unsigned bar_old = 0;
    int ngrp = 0;
    float acc[2] = {0.0f, 0.0f};
    float res = 0.0f, nwv = 0.0f;
    for (int q = 0; q < nq; ++q) {
        const int l = q / DS_PHASES, k = q % DS_PHASES;
        if (k == 1) ds_prefetch_kv(p, l, min(pos, nkv));
        if (q > 0) {
            if (threadIdx.x == 0) {
                // The acquire load orders this block's reads after the other blocks' writes.
                while (((bar_old ^ ds_ld_acquire(p.bar)) & 0x80000000u) == 0) {
                }
            }
            __syncthreads();
        }
        if (k == 1) {
            for (int h = blockIdx.x; h < p.n_head; h += gridDim.x)
                ds_attention(p, l, h, nkv, reinterpret_cast<float*>(act), wid, lane);
            if ((int)blockIdx.x >= p.n_head) ds_prefetch_items(cu.it, end, q + 2, p.prefetch_items);
        } else if (cu.q == q) {
            float scale = 1.0f;
            int ncols = p.n_embd;
            if (k == 0) {
                if (l > 0) ds_fetch(p.xq, act, p.n_embd, q8_vec_bytes(p.n_embd));
                scale = l > 0 ? rsqrtf(__ldcg(p.ss + 2 * l) / p.n_embd + p.eps) : scale0;
            } else if (k == 2) {
                ncols = p.n_head * DS_HEAD;
                ds_fetch(p.aq, act, ncols, q8_vec_bytes(ncols));
            } else if (k == 3) {
                ds_fetch(p.xq, act, p.n_embd, q8_vec_bytes(p.n_embd));
                scale = rsqrtf(__ldcg(p.ss + 2 * l + 1) / p.n_embd + p.eps);
            } else {
                ncols = p.n_ff;
                ds_fetch(p.hq, act, ncols, q8_16_vec_bytes(ncols));
            }
            __syncthreads();
            const q8_vec yv{act, act + ncols};
            const float* xr = (k == 2 && l == 0) ? p.x_in : p.x_out;
            while (cu.q == q) {
                ds_issue(is, end, nq, ring_lane + st_put, lane);
                st_put = ds_next_stage(st_put);
                if (wid == 0 && cu.c == 0 && (k == 2 || k == 4)) {
                    // The residual and the next norm's weight, asked for a group ahead of the
                    // epilogue that needs them (a miss there would hold up the phase's end).
                    const int row = cu.r16 * 16 + lane;
                    res = __ldcg(xr + row);
                    const bool last = k == 4 && l + 1 == p.n_layer;
                    nwv = last ? 0.0f : (k == 2 ? p.layer[l].ffn_norm : p.layer[l + 1].attn_norm)[row];
                }
                const int lay = cu.kind & 3;
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
                if (cu.c == cu.n - 1) {
                    // Two rows per warp: Q4_K rows in acc[0] and acc[1]; Q6_K row r in acc[0] of
                    // lanes 16r..16r + 15; gated: gate row r in acc[r] of lanes 0..15, up row r
                    // in acc[r] of lanes 16..31; a half group's one gate and one up row in acc[0]
                    // and acc[1].
                    const bool half = cu.kind & DS_HALF;
                    float up0 = 0.0f, up1 = 0.0f;
                    if (lay == DS_GATED) {
                        acc[0] = warp_sum<16>(acc[0]) * scale;
                        acc[1] = warp_sum<16>(acc[1]) * scale;
                        up0 = rf_shfl_xor(acc[0], 16);
                        up1 = rf_shfl_xor(acc[1], 16);
                    } else if (lay == DS_Q6) {
                        acc[0] = warp_sum<16>(acc[0]) * scale;
                        acc[1] = rf_shfl_xor(acc[0], 16);
                    } else {
                        acc[0] = warp_sum(acc[0]) * scale;
                        acc[1] = warp_sum(acc[1]) * scale;
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
                            if (row < nq_rows + nk_rows) {  // whole warps: groups never straddle q, k, v
                                const int d = row % DS_HEAD;
                                const float other = rf_shfl_xor(v, 1);
                                const float2 o = rope_cs[d / 2];
                                v = (d & 1) ? other * o.y + v * o.x : v * o.x - other * o.y;
                                if (put && row < nq_rows) p.q[row] = v;
                                else if (put) p.layer[l].kc[pos * p.kv_stride + row - nq_rows] = __float2half(v);
                            } else if (put) {
                                p.layer[l].vc[pos * p.kv_stride + row - nq_rows - nk_rows] = __float2half(v);
                            }
                        } else if (k == 3) {
                            q8_put<16>(v, p.hq, p.n_ff, row, row, !half || lane < 16);
                        } else {
                            v += res;
                            p.x_out[row] = v;
                            const bool last = k == 4 && l + 1 == p.n_layer;
                            if (!last) {
                                q8_1_put(v * nwv, p.xq, p.n_embd, row);
                                const float s2 = warp_sum(v * v);
                                if (lane == 0) atomicAdd(p.ss + (k == 2 ? 2 * l + 1 : 2 * l + 2), s2);
                            }
                        }
                    }
                }
                __syncwarp();
                cu.next(end, nq);
            }
        }
        __syncthreads();
        if (threadIdx.x == 0 && q + 1 < nq) {
            __threadfence();
            bar_old = atomicAdd(p.bar, blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1) : 1u);
        }
    }
#endif
}

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
    ds_fetch(y, act, ncols, q8_vec_bytes(ncols));
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
