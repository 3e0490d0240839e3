//! The HIP backend's own memory besides weights, KV cache and the planned activation arena, as
//! byte counts that a placement can budget for before anything is allocated, derived from the
//! graph the device will run: each node asks for what its launch asks the backend for.
//!
//! The launch code grows one scratch buffer (f16 copies for GEMM products, attention partials
//! and probabilities) to the next power of two of the largest request, and one buffer of Q8_1
//! activations for the mat-vecs; this module walks a graph with the same size rules. This file
//! also builds without the `hip` feature (the `fit` command plans without a GPU), so the rules'
//! constants are repeated here and checked against the launch code's where that is compiled.

use super::HipDevice;
use crate::plan::needed_nodes;
use crate::tensor::{DType, Op, Tensor};
use crate::Graph;

/// The scratch never starts below this (`HipDevice::scratch`).
const MIN_SCRATCH: u64 = 1 << 20;
/// The Q8_1 activation buffer never starts below this (`Q8Cache`).
const MIN_Q8: u64 = 1 << 16;
/// Headroom for the small buffers that come and go (decode-stack tables and scratch, graph
/// capture parameters).
const SLACK: u64 = 1 << 20;
/// Columns up to which products run as mat-vecs on Q8_1 activations (`ops::MATVEC_MAX_COLS`).
const MATVEC_MAX_COLS: usize = 8;
/// Columns the integer tile products take on some device (`ops::MMQ_MIN_COLS` to the larger of
/// `ops::MMQ_MAX_COLS` and `ops::MMQ_MMA_MAX_COLS`; the estimate knows no device): their
/// activations go through the Q8_1 buffer too, and split launches write partial sums to the
/// scratch.
const MMQ_MIN_COLS: usize = 5;
const MMQ_MAX_COLS: usize = 128;
/// The same for Q6_K weights (`ops::MMQ_MMA_MAX_COLS_Q6_K`).
const MMQ_MAX_COLS_Q6_K: usize = 64;
/// Columns up to which Q4_K and Q6_K products take the column mat-vecs ahead of the tile
/// products (`matmul::COLS_MAX`, `matmul::takes_cols`): no partial sums.
const COLS_MAX: usize = 4;
/// Most shares a tile product splits its steps into (`kernels::MMQ_MAX_SPLITS`).
const MMQ_MAX_SPLITS: usize = 8;
/// Weight rows per tile, steps' width and resident tiles per multiprocessor by tile width
/// (`kernels::{MMQ_ROWS, MMQ_STEP, MMQ_BLOCKS_PER_SM}`), for the split rule of `kernels::MmqPlan`.
const MMQ_ROWS: usize = 64;
const MMQ_STEP: usize = 256;
const MMQ_BLOCKS_PER_SM: [(usize, usize); 4] = [(16, 4), (32, 4), (64, 2), (128, 2)];
/// Alignment of the areas inside the scratch (`ops::ALIGN`).
const ALIGN: usize = 256;
/// Attention (`attn.rs`): single-token key splits, the GEMM prefill and its chunking.
const SPLIT_K_FROM: usize = 512;
const SPLIT_LEN: usize = 256;
const ATTN_GEMM_FROM: usize = 16;
const ATTN_GEMM_CHUNK: usize = 512;
const ATTN_GEMM_SCRATCH: usize = 64 << 20;
/// Most keys the one-launch decode attention takes (`kernels::ATTN_DEC_MAX_KV`).
const ATTN_DEC_MAX_KV: usize = 4096;
/// f32 weights of up to this many rows run on the float tiles for more than
/// `MATVEC_MAX_COLS` vectors (`matmul::FLOAT_TILES_MAX_ROWS`).
const FLOAT_TILES_MAX_ROWS: usize = 1024;

#[cfg(feature = "hip")]
const _: () = {
    assert!(MATVEC_MAX_COLS == super::ops::MATVEC_MAX_COLS);
    assert!(MMQ_MIN_COLS == super::ops::MMQ_MIN_COLS);
    assert!(COLS_MAX == super::matmul::COLS_MAX);
    assert!(MMQ_MAX_COLS == super::ops::MMQ_MMA_MAX_COLS);
    assert!(MMQ_MAX_COLS_Q6_K == super::ops::MMQ_MMA_MAX_COLS_Q6_K);
    assert!(MMQ_MAX_COLS_Q6_K >= super::ops::MMQ_MAX_COLS);
    assert!(MMQ_MAX_COLS >= super::ops::MMQ_MAX_COLS);
    assert!(MMQ_MAX_SPLITS == kernels::MMQ_MAX_SPLITS);
    assert!(MMQ_ROWS == kernels::MMQ_ROWS);
    assert!(MMQ_STEP == kernels::MMQ_STEP);
    assert!(MMQ_BLOCKS_PER_SM[0].0 == kernels::MMQ_BLOCKS_PER_SM[0].0);
    assert!(MMQ_BLOCKS_PER_SM[0].1 == kernels::MMQ_BLOCKS_PER_SM[0].1);
    assert!(MMQ_BLOCKS_PER_SM[1].0 == kernels::MMQ_BLOCKS_PER_SM[1].0);
    assert!(MMQ_BLOCKS_PER_SM[1].1 == kernels::MMQ_BLOCKS_PER_SM[1].1);
    assert!(MMQ_BLOCKS_PER_SM[2].0 == kernels::MMQ_BLOCKS_PER_SM[2].0);
    assert!(MMQ_BLOCKS_PER_SM[2].1 == kernels::MMQ_BLOCKS_PER_SM[2].1);
    assert!(MMQ_BLOCKS_PER_SM[3].0 == kernels::MMQ_BLOCKS_PER_SM[3].0);
    assert!(MMQ_BLOCKS_PER_SM[3].1 == kernels::MMQ_BLOCKS_PER_SM[3].1);
    assert!(ALIGN == super::ops::ALIGN);
    assert!(FLOAT_TILES_MAX_ROWS == super::matmul::FLOAT_TILES_MAX_ROWS);
    assert!(ATTN_DEC_MAX_KV == kernels::ATTN_DEC_MAX_KV);
    assert!(SPLIT_K_FROM == super::attn::SPLIT_K_FROM);
    assert!(SPLIT_LEN == super::attn::SPLIT_LEN);
    assert!(ATTN_GEMM_FROM == super::attn::ATTN_GEMM_FROM);
    assert!(ATTN_GEMM_CHUNK == super::attn::ATTN_GEMM_CHUNK);
    assert!(ATTN_GEMM_SCRATCH == super::attn::ATTN_GEMM_SCRATCH);
};

/// Bytes of `ncols` values quantized to Q8_1 (`kernels::q8_1_vector_bytes`).
fn q8_1_vector_bytes(ncols: usize) -> usize {
    (ncols / 32 * 36).div_ceil(16) * 16
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// The backend's memory for a graph, by kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Workspace {
    /// The scratch buffer as it grows: the largest request rounded up to a power of two.
    pub scratch: u64,
    /// The Q8_1 activation buffer of the mat-vecs.
    pub q8: u64,
    /// The scheduler's copy slot on this device for the activations crossing to it.
    pub copies: u64,
    /// Headroom for small buffers.
    pub slack: u64,
}

impl Workspace {
    /// Device bytes in all.
    pub fn total(&self) -> u64 {
        self.scratch
            .saturating_add(self.q8)
            .saturating_add(self.copies)
            .saturating_add(self.slack)
    }
}

/// f32 partial sums a tile product of `mats` matrices of `n` rows over `m` vectors of `k` values
/// writes on a device of `sms` multiprocessors, by `kernels::MmqPlan`'s rule (0 multiprocessors:
/// unknown, the most splits).
fn mmq_partials(n: usize, m: usize, k: usize, mats: usize, sms: usize) -> usize {
    let splits = if sms == 0 {
        MMQ_MAX_SPLITS
    } else {
        let nt = match m {
            0..=16 => 16,
            17..=32 => 32,
            33..=64 => 64,
            _ => 128,
        };
        let tiles = m.div_ceil(nt).max(1) * n.div_ceil(MMQ_ROWS).max(1) * mats;
        let per_sm = MMQ_BLOCKS_PER_SM
            .iter()
            .find(|&&(w, _)| w == nt)
            .map_or(1, |&(_, b)| b);
        (per_sm * sms / tiles)
            .min((k.div_ceil(MMQ_STEP) / 2).max(1))
            .clamp(1, MMQ_MAX_SPLITS)
    };
    if mats > 1 || splits > 1 {
        mats * splits * m * n
    } else {
        0
    }
}

/// Scratch and Q8_1 bytes one node asks for, as its launch does on a device of `sms`
/// multiprocessors (0: unknown).
fn node_needs(t: &Tensor, srcs: &[&Tensor], attn_dec: bool, sms: usize) -> (usize, usize) {
    match (&t.op, srcs) {
        (Op::MulMat | Op::MulMatAdd, [w, x, ..]) | (Op::MulMatGated(_), [w, _, x]) => {
            let (k, n, m) = (w.ne[0], w.ne[1], x.nrows());
            let gated = matches!(t.op, Op::MulMatGated(_));
            let cols = matches!(w.dtype, DType::Q4_K | DType::Q6_K)
                && (2..=COLS_MAX).contains(&m)
                && (!gated || (srcs[1].dtype == w.dtype && srcs[1].nb[1] == w.nb[1]));
            // Mat-vecs quantize the activations; a decode pass (one column) always does.
            let most = if w.dtype == DType::Q6_K {
                MMQ_MAX_COLS_Q6_K
            } else {
                MMQ_MAX_COLS
            };
            let mmq = !cols && w.dtype.is_quantized() && (MMQ_MIN_COLS..=most).contains(&m);
            // Mat-vecs and tile products read Q8_1 activations; GEMM products do not.
            let q8 = if w.dtype.is_quantized() && (mmq || cols || m <= MATVEC_MAX_COLS) {
                m.max(1) * q8_1_vector_bytes(k)
            } else {
                0
            };
            if mmq {
                let mats = if gated { 2 } else { 1 };
                return (mmq_partials(n, m, k, mats, sms) * 4, q8);
            }
            if w.dtype == DType::F32 && m > MATVEC_MAX_COLS && n <= FLOAT_TILES_MAX_ROWS {
                // Float tiles: partial sums per share of the rows' values, counted for the
                // most shares `kernels::GemmF32Plan` makes.
                let splits = (k / 256).clamp(1, MMQ_MAX_SPLITS);
                return (splits * m * n * 4, q8);
            }
            if m <= MATVEC_MAX_COLS || w.dtype == DType::F32 {
                return (0, q8);
            }
            // GEMM: f16 copies of the activations and (unless f16 already) of the weight; a
            // gated product keeps the up product after them.
            let x_bytes = align(m * k * 2);
            let w_bytes = if w.dtype == DType::F16 { 0 } else { n * k * 2 };
            let scratch = if gated {
                x_bytes + align(n * k * 2) + n * m * 4
            } else {
                x_bytes + w_bytes
            };
            (scratch, q8)
        }
        (Op::MulMatId, [w, x, ids]) if w.dtype.is_quantized() => {
            // Per pair or grouped on tiles, the activations go out quantized; grouped on tiles
            // the sorted pairs and each expert's offsets and first tile sit in the scratch.
            let (n_mat, pairs) = (w.ne[2], ids.ne[0] * ids.ne[1]);
            let q8 = x.ne[1] * x.ne[2] * q8_1_vector_bytes(w.ne[0]);
            (align(pairs * 4) + 2 * align((n_mat + 1) * 4), q8)
        }
        (Op::RmsNormMul { .. }, [x, ..]) if x.nrows() <= MATVEC_MAX_COLS => {
            (0, x.nrows() * q8_1_vector_bytes(x.ne[0]))
        }
        (Op::Attention(_), [q, k, ..]) => {
            let (hd, n_heads, n_tok) = (q.ne[0], q.ne[1], q.ne[2]);
            let (n_kv_heads, n_kv) = (k.ne[1], k.ne[2]);
            let dec = attn_dec && n_kv <= ATTN_DEC_MAX_KV && k.dtype != DType::Q8_0;
            let q8 = if dec && n_tok <= MATVEC_MAX_COLS && hd % 32 == 0 {
                n_tok * q8_1_vector_bytes(n_heads * hd)
            } else {
                0
            };
            // A one-token pass over the same cache (decode at this depth) splits the keys.
            let splits = n_kv.div_ceil(SPLIT_LEN);
            let partials = if !dec && n_kv >= SPLIT_K_FROM && splits > 1 {
                splits * n_heads * (hd + 2) * 4
            } else {
                0
            };
            let gemm = if n_tok >= ATTN_GEMM_FROM && k.dtype == DType::F16 && n_kv > 0 {
                let chunk = (ATTN_GEMM_SCRATCH / (n_kv_heads * n_kv * 6).max(1))
                    .clamp(1, ATTN_GEMM_CHUNK.min(n_tok));
                align(n_tok * n_heads * hd * 2)
                    + align(n_kv_heads * chunk * n_kv * 4)
                    + n_kv_heads * chunk * n_kv * 2
            } else {
                0
            };
            (partials.max(gemm), q8)
        }
        _ => (0, 0),
    }
}

impl HipDevice {
    /// What this backend allocates to run `graph` (optimized as the device runs it) besides
    /// weights, KV cache and the planned arena, counting the nodes `on_device` accepts: the
    /// scratch and Q8_1 buffers its launches ask for, `copy_rows` rows of `row_width` f32
    /// values crossing devices (zero when nothing does), and small headroom. `attn_dec`: the
    /// one-launch decode attention is on ([`crate::HipOptions::attn_dec`]). `sms`: the
    /// device's multiprocessors ([`HipDevice::multiprocessors`]; 0 when planning without a
    /// device, which counts the most a tile product may split into).
    pub fn workspace_for(
        graph: &Graph,
        on_device: &dyn Fn(&Tensor, &[&Tensor]) -> bool,
        attn_dec: bool,
        copy_rows: usize,
        row_width: usize,
        sms: usize,
    ) -> Workspace {
        let nodes = graph.tensors();
        let needed = needed_nodes(graph);
        let (mut scratch, mut q8) = (0usize, 0usize);
        for (i, t) in nodes.iter().enumerate() {
            if !needed[i] {
                continue;
            }
            let srcs: Vec<&Tensor> = t.src.iter().map(|s| &nodes[s.index()]).collect();
            if !on_device(t, &srcs) {
                continue;
            }
            let (s, q) = node_needs(t, &srcs, attn_dec, sms);
            scratch = scratch.max(s);
            q8 = q8.max(q);
        }
        let scratch = (scratch as u64)
            .checked_next_power_of_two()
            .unwrap_or(u64::MAX)
            .max(MIN_SCRATCH);
        Workspace {
            scratch,
            q8: (q8 as u64).max(MIN_Q8),
            // One slot on this device: the activations entering it (what leaves it lands in a
            // slot on the receiving device).
            copies: (copy_rows as u64)
                .saturating_mul(row_width as u64)
                .saturating_mul(4),
            slack: SLACK,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::{contiguous_strides, Act, AttnParams, Leaf};

    fn tensor(dtype: DType, ne: [usize; 4], op: Op) -> Tensor {
        Tensor {
            name: String::new(),
            dtype,
            ne,
            nb: contiguous_strides(dtype, &ne),
            op,
            src: Vec::new(),
            view_of: None,
        }
    }

    fn graph(n_tok: usize, head: usize) -> (Graph, usize) {
        // One llama-like layer's products (8B shapes) and its attention, then the head on
        // `head` columns.
        let (e, ff, voc, nkv) = (4096, 14336, 128256, 1024);
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[e, n_tok]).unwrap();
        let wq = g
            .weight("blk.0.attn_q.weight", DType::Q4_K, &[e, e])
            .unwrap();
        let wg = g
            .weight("blk.0.ffn_gate.weight", DType::Q4_K, &[e, ff])
            .unwrap();
        let wu = g
            .weight("blk.0.ffn_up.weight", DType::Q4_K, &[e, ff])
            .unwrap();
        let wo = g.weight("output.weight", DType::Q6_K, &[e, voc]).unwrap();
        let q = g.mul_mat(wq, x).unwrap();
        let gate = g.mul_mat(wg, x).unwrap();
        let up = g.mul_mat(wu, x).unwrap();
        let h = g.gated(Act::Silu, gate, up).unwrap();
        let q3 = g.reshape(q, &[128, 32, n_tok]).unwrap();
        let k = g.input("k", DType::F16, &[128, 8, nkv]).unwrap();
        let pos = g.input("pos", DType::I32, &[n_tok]).unwrap();
        let p = AttnParams {
            scale: 1.0,
            causal: true,
            window: None,
            softcap: None,
            sinks: false,
        };
        let a = g.attention(q3, k, k, pos, None, p).unwrap();
        let last = g
            .view(x, &[e, head], &[e * 4], (n_tok - head) * e * 4)
            .unwrap();
        let logits = g.mul_mat(wo, last).unwrap();
        for o in [h, a, logits] {
            g.mark_output(o).unwrap();
        }
        (g, ff)
    }

    #[test]
    fn workspace_follows_the_graph_not_the_largest_weight() {
        // A 512-token prompt: the gate/up product's f16 weight copy (112 MiB) and activations,
        // and (fused) the gated product's up rows, rounded to 256 MiB; the 1-column head adds
        // only its Q8_1 vector, never an f16 copy of its 1 GiB matrix.
        let (mut g, ff) = graph(512, 1);
        let all = |_: &Tensor, _: &[&Tensor]| true;
        // Unfused gate: the plain product's f16 copies only (x 4 MiB + w 112 MiB -> 128 MiB).
        let w = HipDevice::workspace_for(&g, &all, true, 0, 4096, 0);
        let need = align(512 * 4096 * 2) + ff * 4096 * 2;
        assert!(need > 64 << 20 && need <= 128 << 20);
        assert_eq!(w.scratch, 128 << 20);
        crate::opt::optimize(&mut g);
        let w = HipDevice::workspace_for(&g, &all, true, 0, 4096, 0);
        assert_eq!(w.scratch, 256 << 20);
        // GEMM products quantize nothing; the 1-column head's Q8_1 vector fits the minimum.
        assert!(q8_1_vector_bytes(4096) < MIN_Q8 as usize);
        assert_eq!(w.q8, MIN_Q8);
        assert_eq!(w.copies, 0);
        assert_eq!(w.total(), (256 << 20) + MIN_Q8 + SLACK);
        // Decode (one column): no scratch beyond the minimum, the Q8_1 vector of the widest k.
        let (g1, _) = graph(1, 1);
        let w1 = HipDevice::workspace_for(&g1, &all, true, 0, 4096, 0);
        assert_eq!(w1.scratch, MIN_SCRATCH);
        assert_eq!(w1.q8, MIN_Q8);
        // Nodes off the device count nothing; the copy slot holds one f32 per crossing value.
        let none = |_: &Tensor, _: &[&Tensor]| false;
        let w0 = HipDevice::workspace_for(&g, &none, true, 512, 4096, 0);
        assert_eq!((w0.scratch, w0.q8), (MIN_SCRATCH, MIN_Q8));
        assert_eq!(w0.copies, 512 * 4096 * 4);
    }

    /// The tile products' partial sums are what the kernels' plan launches, for devices of
    /// several sizes (0 multiprocessors: the bound of the most splits).
    #[cfg(feature = "hip")]
    #[test]
    fn tile_partials_follow_the_kernels_plan() {
        for (n, m, k, mats) in [(5632, 64, 2048, 2), (4096, 8, 4096, 1), (512, 17, 512, 1)] {
            for sms in [1, 40, 132, 304] {
                let plan = kernels::MmqPlan::new(n, m, k, mats, sms);
                assert_eq!(
                    mmq_partials(n, m, k, mats, sms),
                    plan.partial_values(n, m),
                    "{n}x{k} by {m}, {mats} matrices, {sms} multiprocessors"
                );
            }
            assert_eq!(
                mmq_partials(n, m, k, mats, 0),
                mats * MMQ_MAX_SPLITS * m * n
            );
        }
    }

    /// Q4_K and Q6_K products of 2 to 4 vectors take the column mat-vecs (Q8_1 vectors, no tile
    /// partials), gated ones too; another type's 4 vectors take the mat-vecs, and 5 vectors the
    /// tile products.
    #[test]
    fn column_mat_vecs_need_no_tile_partials() {
        let input = Op::Leaf(Leaf::Input);
        // The column mat-vecs' widest, and the tile products' first width.
        for (m, cols) in [(COLS_MAX, true), (MMQ_MIN_COLS, false)] {
            let x = tensor(DType::F32, [4096, m, 1, 1], input.clone());
            for dt in [DType::Q4_K, DType::Q6_K, DType::Q8_0] {
                let w = tensor(dt, [4096, 1024, 1, 1], input.clone());
                let tiles = usize::from(!cols);
                for (op, srcs, mats) in [
                    (Op::MulMat, vec![&w, &x], 1),
                    (Op::MulMatGated(Act::Silu), vec![&w, &w, &x], 2),
                ] {
                    let t = tensor(DType::F32, [1024, m, 1, 1], op);
                    let (scratch, q8) = node_needs(&t, &srcs, true, 0);
                    assert_eq!(q8, m * q8_1_vector_bytes(4096), "{dt}");
                    assert_eq!(
                        scratch,
                        tiles * mats * MMQ_MAX_SPLITS * m * 1024 * 4,
                        "{dt} m={m}"
                    );
                }
            }
        }
    }

    #[test]
    fn attention_partials_and_gemm_scratch() {
        let input = Op::Leaf(Leaf::Input);
        let q = tensor(DType::F32, [128, 32, 1, 1], input.clone());
        let k = tensor(DType::F16, [128, 8, 8192, 1], input.clone());
        let p = AttnParams {
            scale: 1.0,
            causal: true,
            window: None,
            softcap: None,
            sinks: false,
        };
        let t = tensor(DType::F32, [128, 32, 1, 1], Op::Attention(p));
        // Past the decode kernel's 4096 keys: 32 splits of partials.
        assert_eq!(node_needs(&t, &[&q, &k], true, 0).0, 32 * 32 * 130 * 4);
        // Prefill of 512 tokens over 8192 f16 keys: the GEMM path's chunked scratch.
        let q = tensor(DType::F32, [128, 32, 512, 1], input);
        let chunk = (64usize << 20) / (8 * 8192 * 6);
        let want = align(512 * 32 * 128 * 2) + align(8 * chunk * 8192 * 4) + 8 * chunk * 8192 * 2;
        assert_eq!(node_needs(&t, &[&q, &k], true, 0).0, want);
    }
}
