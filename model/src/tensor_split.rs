//! A model's weights cut for a tensor split (`--split-mode tensor`): each GPU's rows of the q,
//! k, v, gate and up projections (zero-copy ranges of the mapped file), its columns of the
//! attention output and down projections (repacked at load, whole quantization blocks per
//! row), and the weight table the plans build per-GPU partial results from.

use std::ops::Range;
use std::sync::Arc;

use ggml_graph::WeightBytes;

use crate::arch::{part_of, part_suffix, WeightTable};
use crate::config::Architecture;
use crate::error::ModelError;
use crate::gpus::{SplitShape, TensorSplit};
use crate::session::{weight_views, Model, WeightView};

/// Per-layer tensors a split cuts by output rows: `(name in the layer, what their rows are)`.
const ROW_SPLIT: [(&str, Rows); 5] = [
    ("attn_q", Rows::QHeads),
    ("attn_k", Rows::KvHeads),
    ("attn_v", Rows::VHeads),
    ("ffn_gate", Rows::Ff),
    ("ffn_up", Rows::Ff),
];

/// Per-layer tensors a split cuts by input columns.
const COL_SPLIT: [(&str, Rows); 2] = [("attn_output", Rows::VQHeads), ("ffn_down", Rows::Ff)];

/// Per-layer weights every GPU with attention heads gets a copy of.
const PER_HEAD: [&str; 2] = ["attn_q_norm", "attn_k_norm"];

/// Which index range of a [`TensorSplit`] a cut follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Rows {
    /// Query heads times the key head size.
    QHeads,
    /// KV heads times the key head size.
    KvHeads,
    /// KV heads times the value head size.
    VHeads,
    /// Query heads times the value head size (the output projection's input).
    VQHeads,
    /// Feed-forward columns.
    Ff,
}

/// The shape facts a split needs that the configuration does not hold.
struct Dims {
    head_dim: usize,
    head_dim_v: usize,
}

impl Rows {
    fn range(self, ts: &TensorSplit, k: usize, d: &Dims) -> Range<usize> {
        let scale = |r: Range<usize>, n: usize| r.start * n..r.end * n;
        match self {
            Rows::QHeads => scale(ts.q_heads(k), d.head_dim),
            Rows::KvHeads => scale(ts.kv_heads[k].clone(), d.head_dim),
            Rows::VHeads => scale(ts.kv_heads[k].clone(), d.head_dim_v),
            Rows::VQHeads => scale(ts.q_heads(k), d.head_dim_v),
            Rows::Ff => ts.ff[k].clone(),
        }
    }

    /// Whether GPU `k` computes the part this range belongs to.
    fn has_part(self, ts: &TensorSplit, k: usize) -> bool {
        match self {
            Rows::Ff => !ts.ff[k].is_empty(),
            _ => !ts.kv_heads[k].is_empty(),
        }
    }

    /// The GPU whose partial carries a column-split tensor's bias (added once to the sum).
    fn bias_part(self, ts: &TensorSplit) -> Option<usize> {
        let parts = match self {
            Rows::Ff => &ts.ff,
            _ => &ts.kv_heads,
        };
        ts.order(parts).first().copied()
    }
}

/// `name` (`blk.3.attn_q.weight`) as GPU `k`'s slice (`blk.3.attn_q.tp1.weight`).
pub fn part_name(name: &str, k: usize) -> String {
    match name.rsplit_once('.') {
        Some((stem, ext)) => format!("{stem}{}.{ext}", part_suffix(k)),
        None => format!("{name}{}", part_suffix(k)),
    }
}

/// True for the file tensors a split replaces by slices (never bound in tensor mode).
fn is_split_original(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("blk.") else {
        return false;
    };
    let Some((_, t)) = rest.split_once('.') else {
        return false;
    };
    let stem = t.rsplit_once('.').map_or(t, |(s, _)| s);
    ROW_SPLIT
        .iter()
        .chain(&COL_SPLIT)
        .map(|(n, _)| *n)
        .chain(PER_HEAD)
        .any(|n| n == stem)
}

/// The device (index into the split's GPUs) of a weight or KV cache leaf in tensor mode:
/// slices and cache parts on their GPU, everything else on the main GPU.
pub fn device_of(ts: &TensorSplit, name: &str) -> Option<usize> {
    match part_of(name) {
        Some(k) if k < ts.n_gpus() => Some(k),
        Some(_) => None,
        None => Some(ts.main),
    }
}

/// The split of `model` over GPUs in proportion to `shares`, with the main GPU `main`; a clear
/// error for architectures whose layers it cannot cut (mixtures of experts, fused q/k/v or
/// gate/up tensors, whole-vector q/k norms, attention sinks).
pub fn plan(model: &Model, shares: &[f64], main: usize) -> Result<TensorSplit, ModelError> {
    let cfg = model.config();
    let refuse = |why: &str| {
        Err(ModelError::InvalidArgument(format!(
            "--split-mode tensor does not support {:?} models: {why}; use --split-mode layer",
            cfg.arch
        )))
    };
    if cfg.moe.is_some() {
        return refuse("mixture-of-experts layers");
    }
    if cfg.arch == Architecture::Olmo2 {
        return refuse("q/k norms over whole vectors");
    }
    let w = model.weights();
    let mut attn_block = 1;
    let mut ffn_block = 1;
    for il in 0..cfg.n_layer {
        let has = |t: &str| w.contains(&format!("blk.{il}.{t}.weight"));
        if has("attn_qkv") || !has("ffn_gate") {
            return refuse("fused q/k/v or gate/up tensors");
        }
        if has("attn_sinks") {
            return refuse("attention sinks");
        }
        let block = |t: &str| {
            w.get(&format!("blk.{il}.{t}.weight"))
                .map_or(1, |(d, _)| d.block_size())
        };
        attn_block = attn_block.max(block("attn_output"));
        ffn_block = ffn_block.max(block("ffn_down"));
    }
    let shape = SplitShape {
        n_head: cfg.n_head,
        n_head_kv: cfg.n_head_kv,
        head_dim_v: cfg.head_dim_v,
        n_ff: cfg.n_ff,
        attn_block,
        ffn_block,
    };
    TensorSplit::new(shape, shares, main)
}

/// Weights of a tensor split: the table the plans build from and every tensor to bind (the
/// file's tensors that are not cut, and each GPU's slices).
pub struct SplitWeights {
    /// The model's table with the slices and the split.
    pub table: WeightTable,
    /// `(name, type, dims, bytes)` of every tensor to bind.
    pub views: Vec<WeightView>,
    /// Bytes of the bound tensors per GPU (by [`device_of`]).
    pub bytes: Vec<u64>,
}

fn bad(name: &str, reason: String) -> ModelError {
    ModelError::BadTensor {
        name: name.to_owned(),
        reason,
    }
}

/// Rows `r` of a 2-D tensor (or values `r` of a 1-D one), zero-copy.
fn cut_rows(v: &WeightView, r: &Range<usize>) -> Result<WeightView, ModelError> {
    let (name, dtype, dims, bytes) = v;
    let (row, n_rows, out_dims) = match dims.as_slice() {
        [n] if dtype.block_size() == 1 => (dtype.type_size(), *n, vec![r.len()]),
        [ne0, ne1] => (
            ggml_graph::tensor::row_bytes(*dtype, *ne0),
            *ne1,
            vec![*ne0, r.len()],
        ),
        _ => return Err(bad(name, format!("cannot cut rows of dims {dims:?}"))),
    };
    if r.end > n_rows {
        return Err(bad(name, format!("rows {r:?} of {n_rows}")));
    }
    let b = bytes.sub(r.start * row..r.end * row)?;
    Ok((name.clone(), *dtype, out_dims, b))
}

/// Columns `c` of every row of a 2-D tensor, repacked (whole blocks of the type).
fn cut_columns(v: &WeightView, c: &Range<usize>) -> Result<WeightView, ModelError> {
    let (name, dtype, dims, bytes) = v;
    let [ne0, ne1] = dims.as_slice() else {
        return Err(bad(name, format!("cannot cut columns of dims {dims:?}")));
    };
    let bs = dtype.block_size();
    if c.end > *ne0 || !c.start.is_multiple_of(bs) || !c.end.is_multiple_of(bs) {
        return Err(bad(
            name,
            format!("columns {c:?} of {ne0} do not fall on {bs}-value blocks"),
        ));
    }
    let row = ggml_graph::tensor::row_bytes(*dtype, *ne0);
    let (from, to) = (
        c.start / bs * dtype.type_size(),
        c.end / bs * dtype.type_size(),
    );
    let src = bytes.bytes();
    let mut out = Vec::with_capacity((to - from) * ne1);
    for r in 0..*ne1 {
        out.extend_from_slice(&src[r * row + from..r * row + to]);
    }
    Ok((
        name.clone(),
        *dtype,
        vec![c.len(), *ne1],
        WeightBytes::from_vec(out),
    ))
}

/// Cuts `model`'s layer tensors for `ts`.
pub fn split_weights(model: &Model, ts: Arc<TensorSplit>) -> Result<SplitWeights, ModelError> {
    let cfg = model.config();
    let d = Dims {
        head_dim: cfg.head_dim,
        head_dim_v: cfg.head_dim_v,
    };
    let all = weight_views(model)?;
    let find = |name: &str| all.iter().find(|v| v.0 == name);
    let mut views: Vec<WeightView> = Vec::new();
    let mut slices: Vec<WeightView> = Vec::new();
    for v in &all {
        if !is_split_original(&v.0) {
            views.push(v.clone());
        }
    }
    for il in 0..cfg.n_layer {
        for k in 0..ts.n_gpus() {
            for (t, rows) in ROW_SPLIT {
                if !rows.has_part(&ts, k) {
                    continue;
                }
                let r = rows.range(&ts, k, &d);
                for ext in ["weight", "bias"] {
                    let name = format!("blk.{il}.{t}.{ext}");
                    if let Some(v) = find(&name) {
                        let (_, dt, dims, b) = cut_rows(v, &r)?;
                        slices.push((part_name(&name, k), dt, dims, b));
                    }
                }
            }
            for (t, cols) in COL_SPLIT {
                if !cols.has_part(&ts, k) {
                    continue;
                }
                let c = cols.range(&ts, k, &d);
                let name = format!("blk.{il}.{t}.weight");
                let v = find(&name).ok_or_else(|| ModelError::MissingTensor(name.clone()))?;
                let (_, dt, dims, b) = cut_columns(v, &c)?;
                slices.push((part_name(&name, k), dt, dims, b));
                let bias = format!("blk.{il}.{t}.bias");
                if let Some(v) = find(&bias).filter(|_| cols.bias_part(&ts) == Some(k)) {
                    slices.push((part_name(&bias, k), v.1, v.2.clone(), v.3.clone()));
                }
            }
            if !ts.kv_heads[k].is_empty() {
                for t in PER_HEAD {
                    let name = format!("blk.{il}.{t}.weight");
                    if let Some(v) = find(&name) {
                        slices.push((part_name(&name, k), v.1, v.2.clone(), v.3.clone()));
                    }
                }
            }
        }
    }
    let table = model.weights().with_split(
        Arc::clone(&ts),
        slices.iter().map(|(n, t, d, _)| (n.clone(), *t, d.clone())),
    );
    views.extend(slices);
    let mut bytes = vec![0u64; ts.n_gpus()];
    for (name, _, _, b) in &views {
        if let Some(k) = device_of(&ts, name) {
            bytes[k] += b.bytes().len() as u64;
        }
    }
    Ok(SplitWeights {
        table,
        views,
        bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ggml_graph::DType;

    fn f32_values(b: &WeightBytes) -> Vec<f32> {
        b.bytes()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    fn le(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn view(name: &str, dtype: DType, dims: Vec<usize>, data: Vec<u8>) -> WeightView {
        (name.into(), dtype, dims, WeightBytes::from_vec(data))
    }

    #[test]
    fn names_of_parts() {
        assert_eq!(
            part_name("blk.3.attn_q.weight", 1),
            "blk.3.attn_q.tp1.weight"
        );
        assert_eq!(
            part_name("blk.0.ffn_down.bias", 0),
            "blk.0.ffn_down.tp0.bias"
        );
        assert_eq!(part_of("blk.3.attn_q.tp1.weight"), Some(1));
        assert_eq!(part_of("cache_v.12.tp3"), Some(3));
        assert_eq!(part_of("blk.3.attn_q.weight"), None);
        assert_eq!(part_of("output.weight"), None);
        assert!(is_split_original("blk.3.attn_q.weight"));
        assert!(is_split_original("blk.3.attn_v.bias"));
        assert!(is_split_original("blk.3.ffn_down.weight"));
        assert!(is_split_original("blk.3.attn_k_norm.weight"));
        assert!(!is_split_original("blk.3.attn_norm.weight"));
        assert!(!is_split_original("blk.3.post_attention_norm.weight"));
        assert!(!is_split_original("output.weight"));
        let ts = TensorSplit {
            kv_heads: vec![0..1, 1..2],
            group: 2,
            ff: vec![0..256, 256..512],
            main: 1,
        };
        assert_eq!(device_of(&ts, "blk.0.ffn_up.tp0.weight"), Some(0));
        assert_eq!(device_of(&ts, "cache_k.1.tp1"), Some(1));
        assert_eq!(device_of(&ts, "blk.0.attn_norm.weight"), Some(1));
        assert_eq!(device_of(&ts, "token_embd.weight"), Some(1));
        assert_eq!(device_of(&ts, "cache_k.1.tp2"), None);
    }

    #[test]
    fn rows_are_ranges_and_columns_whole_blocks() {
        // f32 [3, 4]: rows 1..3 are values 3..9.
        let vals: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let v = view("w", DType::F32, vec![3, 4], le(&vals));
        let r = cut_rows(&v, &(1..3)).unwrap();
        assert_eq!(r.2, vec![3, 2]);
        assert_eq!(f32_values(&r.3), vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0]);
        let c = cut_columns(&v, &(1..3)).unwrap();
        assert_eq!(c.2, vec![2, 4]);
        assert_eq!(
            f32_values(&c.3),
            vec![1.0, 2.0, 4.0, 5.0, 7.0, 8.0, 10.0, 11.0]
        );
        assert!(cut_rows(&v, &(2..5)).is_err());
        // A bias: values 1..3.
        let b = view("b", DType::F32, vec![4], le(&vals[..4]));
        assert_eq!(
            f32_values(&cut_rows(&b, &(1..3)).unwrap().3),
            vec![1.0, 2.0]
        );
        // Q8_0 rows of 64 values are two 34-byte blocks: columns 32..64 are each row's second.
        let q: Vec<u8> = (0..3 * 68).map(|i| i as u8).collect();
        let qv = view("q", DType::Q8_0, vec![64, 3], q.clone());
        let qc = cut_columns(&qv, &(32..64)).unwrap();
        let want: Vec<u8> = (0..3)
            .flat_map(|r| q[r * 68 + 34..r * 68 + 68].to_vec())
            .collect();
        assert_eq!(qc.3.bytes(), want.as_slice());
        assert!(
            cut_columns(&qv, &(16..64)).is_err(),
            "not on a block boundary"
        );
    }

    /// A collective over host buffers (what NCCL does on GPUs): sums the parts and writes the
    /// sum into each; counts its calls.
    struct HostSum {
        n_dev: usize,
        calls: std::sync::atomic::AtomicUsize,
    }

    impl ggml_graph::Collective for HostSum {
        fn name(&self) -> &str {
            "host"
        }
        fn spans(&self, devices: &[usize]) -> bool {
            devices.iter().copied().eq(0..self.n_dev)
        }
        fn all_reduce(
            &self,
            parts: &[(usize, ggml_graph::TensorMem<'_>)],
        ) -> ggml_graph::Result<()> {
            let n = parts[0].1.tensor.nelements();
            let mut sum = vec![0f32; n];
            for (_, m) in parts {
                let mut b = vec![0u8; n * 4];
                m.buffer.read(m.offset, &mut b)?;
                for (s, c) in sum.iter_mut().zip(b.chunks_exact(4)) {
                    *s += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            let bytes: Vec<u8> = sum.iter().flat_map(|x| x.to_le_bytes()).collect();
            for (_, m) in parts {
                m.buffer.write(m.offset, &bytes)?;
            }
            self.calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        }
    }

    /// Logits of `tokens` after `past` (fed first) through `model`'s plans, run by a scheduler
    /// over `n_dev` CPU devices placed by `rule` (with `coll` summing the partials in place).
    fn run_on(
        model: &Model,
        views: Vec<WeightView>,
        n_dev: usize,
        rule: ggml_graph::sched::PlacementRule,
        steps: &[&[u32]],
        coll: Option<Arc<HostSum>>,
    ) -> Vec<Vec<f32>> {
        use crate::arch::{build_forward, BatchSpec, KvCacheSpec, KvType, LogitsMode};
        let mut sched = cpu_scheduler(views, n_dev, rule);
        if let Some(c) = &coll {
            sched.set_collective(Some(c.clone()));
        }
        let kv = KvCacheSpec {
            dtype: KvType::F32,
            n_ctx: 64,
        };
        let mut n_past = 0;
        let mut out = Vec::new();
        for toks in steps {
            let batch = BatchSpec {
                n_tok: toks.len(),
                n_past,
                logits: LogitsMode::All,
            };
            let mut fg = build_forward(model.config(), model.weights(), &kv, batch).unwrap();
            ggml_graph::opt::optimize(&mut fg.graph);
            let ids: Vec<u8> = toks
                .iter()
                .flat_map(|&t| (t as i32).to_le_bytes())
                .collect();
            let pos: Vec<u8> = (n_past..n_past + toks.len())
                .flat_map(|p| (p as i32).to_le_bytes())
                .collect();
            sched
                .run(&fg.graph, &[(fg.tokens, &ids), (fg.pos, &pos)])
                .unwrap();
            out.push(sched.with_output_f32(fg.logits, |v| v.to_vec()).unwrap());
            let reduces = fg
                .graph
                .tensors()
                .iter()
                .filter(|t| t.op == ggml_graph::Op::AllReduce)
                .count();
            let cfg = model.config();
            if n_dev > 1 {
                // Every layer's feed-forward sums two partials (its attention too where both
                // GPUs hold heads).
                assert!(reduces >= cfg.n_layer, "{reduces} all-reduces");
            }
            if let Some(c) = &coll {
                let by_coll = sched.last_schedule().unwrap().collective.iter();
                assert_eq!(by_coll.filter(|&&b| b).count(), reduces);
                assert!(c.calls.load(std::sync::atomic::Ordering::Relaxed) >= reduces);
            }
            let used: std::collections::HashSet<usize> = sched
                .last_schedule()
                .unwrap()
                .splits
                .iter()
                .map(|(d, _)| *d)
                .collect();
            assert_eq!(used.len(), n_dev, "every device runs a part");
            n_past += toks.len();
        }
        out
    }

    /// The meeting point of [`ThreadSum`] ranks.
    struct Pool {
        parts: std::sync::Mutex<Vec<Option<Vec<u8>>>>,
        barrier: std::sync::Barrier,
    }

    /// A collective between threads (each one rank's process): every rank deposits its part,
    /// all wait, each takes the sum (in rank order, the same bits everywhere).
    struct ThreadSum {
        pool: Arc<Pool>,
        rank: usize,
    }

    impl ggml_graph::Collective for ThreadSum {
        fn name(&self) -> &str {
            "threads"
        }
        fn spans(&self, devices: &[usize]) -> bool {
            devices == [0]
        }
        fn all_reduce(
            &self,
            parts: &[(usize, ggml_graph::TensorMem<'_>)],
        ) -> ggml_graph::Result<()> {
            let m = &parts[0].1;
            let n = m.tensor.nelements() * 4;
            let mut b = vec![0u8; n];
            m.buffer.read(m.offset, &mut b)?;
            let pool = &self.pool;
            pool.parts.lock().unwrap()[self.rank] = Some(b);
            pool.barrier.wait();
            let mut sum = vec![0f32; n / 4];
            for p in pool.parts.lock().unwrap().iter().flatten() {
                for (s, c) in sum.iter_mut().zip(p.chunks_exact(4)) {
                    *s += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
                }
            }
            pool.barrier.wait();
            pool.parts.lock().unwrap()[self.rank] = None;
            let bytes: Vec<u8> = sum.iter().flat_map(|x| x.to_le_bytes()).collect();
            m.buffer.write(m.offset, &bytes)
        }
    }

    /// One process per part (`--dist-init`): each rank's graph holds only its part and the
    /// unsplit layers, runs on its own device with only its weights, and all-reduces with the
    /// other ranks; every rank's logits equal the whole model's.
    #[test]
    fn ranks_in_separate_schedulers_give_the_whole_model_logits() {
        let dir = std::env::temp_dir().join(format!("rocmforge-tp-rank-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for arch in ["llama", "gemma3"] {
            let o = crate::synth::SynthOptions::parse(arch, "tiny", "q8_0", 3).unwrap();
            let path = dir.join(format!("{arch}.gguf"));
            crate::synth::write(&o, None, &path).unwrap();
            let m = Model::load(&path, |_, _| {}).unwrap();
            let steps: [&[u32]; 2] = [&[1, 17, 145, 2, 99], &[7]];
            let whole = run_on(
                &m,
                weight_views(&m).unwrap(),
                1,
                Arc::new(|_: &str| Some(0)),
                &steps,
                None,
            );
            let ts = Arc::new(plan(&m, &[1.0, 1.0], 0).unwrap());
            assert!(ts.kv_heads.iter().all(|r| !r.is_empty()), "{arch}: {ts:?}");
            let cut = split_weights(&m, Arc::clone(&ts)).unwrap();
            let pool = Arc::new(Pool {
                parts: std::sync::Mutex::new(vec![None, None]),
                barrier: std::sync::Barrier::new(2),
            });
            let ranks: Vec<_> = (0..2)
                .map(|r| {
                    let mine = move |n: &str| part_of(n).is_none_or(|k| k == r);
                    let views: Vec<WeightView> =
                        cut.views.iter().filter(|v| mine(&v.0)).cloned().collect();
                    let model = m.with_table(cut.table.clone().for_rank(r));
                    let coll = Arc::new(ThreadSum {
                        pool: Arc::clone(&pool),
                        rank: r,
                    });
                    (model, views, coll)
                })
                .collect();
            let logits: Vec<Vec<Vec<f32>>> = std::thread::scope(|sc| {
                let hs: Vec<_> = ranks
                    .into_iter()
                    .map(|(model, views, coll)| {
                        let steps = &steps;
                        sc.spawn(move || {
                            run_rank(&model, views, Arc::new(|_: &str| Some(0)), steps, coll)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            for (r, got) in logits.iter().enumerate() {
                for (a, b) in whole.iter().zip(got) {
                    let d = rel_diff(a, b);
                    assert!(
                        d <= 1e-3,
                        "{arch} rank {r}: logits differ by {d} (relative)"
                    );
                }
            }
            assert_eq!(
                logits[0], logits[1],
                "{arch}: the ranks' logits are the same bits"
            );
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// The in-process executor of ranks ([`crate::ranks::Ranks`]): each rank a one-device
    /// scheduler with its slices and a copy of the rest, its graph built from its own table,
    /// ranks 1.. on threads, the partials summed by a collective between the threads. Two
    /// ranks and four, even and uneven shares; rank 0's logits are the whole model's, through
    /// the session's plans and the batching engine's paged ones, and a keyed pass repeated (its
    /// rank graphs kept) gives the same bits.
    #[test]
    fn ranks_run_by_one_executor_give_the_whole_model_logits() {
        let dir = std::env::temp_dir().join(format!("rocmforge-tp-exec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // 8 KV heads of 32 values and 8 feed-forward units of 256: four ranks get some of
        // each, even with uneven shares.
        let wide = |arch: &str| {
            let mut o = crate::synth::SynthOptions::parse(arch, "tiny", "q8_0", 5).unwrap();
            (o.shape.n_head, o.shape.n_head_kv, o.shape.head_dim) = (8, 8, 32);
            o.shape.n_ff = 2048;
            o
        };
        let cases: Vec<(crate::synth::SynthOptions, Vec<f64>)> = vec![
            (
                crate::synth::SynthOptions::parse("llama", "tiny", "q8_0", 3).unwrap(),
                vec![1.0, 1.0],
            ),
            (
                crate::synth::SynthOptions::parse("gemma3", "tiny", "q8_0", 3).unwrap(),
                vec![1.0, 1.0],
            ),
            (wide("qwen2"), vec![1.0, 1.0, 1.0, 1.0]),
            (wide("llama"), vec![1.0, 2.0, 1.0, 3.0]),
        ];
        for (o, shares) in cases {
            let what = format!("{:?} over {shares:?}", o.arch);
            let path = dir.join(format!("{:?}-{}.gguf", o.arch, shares.len()));
            crate::synth::write(&o, None, &path).unwrap();
            let m = Model::load(&path, |_, _| {}).unwrap();
            let steps: [&[u32]; 2] = [&[1, 17, 145, 2, 99], &[7]];
            let whole = run_on(
                &m,
                weight_views(&m).unwrap(),
                1,
                Arc::new(|_: &str| Some(0)),
                &steps,
                None,
            );
            let n = shares.len();
            let ts = Arc::new(plan(&m, &shares, 0).unwrap());
            assert!(
                (0..n).all(|k| !ts.kv_heads[k].is_empty() && !ts.ff[k].is_empty()),
                "{what}: {ts:?}"
            );
            if shares.iter().any(|&x| x != shares[0]) {
                assert!(
                    (1..n).any(|k| ts.ff[k].len() != ts.ff[0].len()),
                    "{what}: uneven shares, even parts {ts:?}"
                );
            }
            let cut = split_weights(&m, Arc::clone(&ts)).unwrap();
            // Rank 0's scheduler and the executor of the others, with a fresh KV cache.
            let make_ranks = || {
                let pool = Arc::new(Pool {
                    parts: std::sync::Mutex::new(vec![None; n]),
                    barrier: std::sync::Barrier::new(n),
                });
                let mut scheds: Vec<ggml_graph::Scheduler> = (0..n)
                    .map(|r| {
                        let mine = move |name: &str| part_of(name).is_none_or(|k| k == r);
                        let views: Vec<WeightView> =
                            cut.views.iter().filter(|v| mine(&v.0)).cloned().collect();
                        let mut sched =
                            cpu_scheduler(views, 1, Arc::new(move |n: &str| mine(n).then_some(0)));
                        sched.set_collective(Some(Arc::new(ThreadSum {
                            pool: Arc::clone(&pool),
                            rank: r,
                        })));
                        sched
                    })
                    .collect();
                let first = scheds.remove(0);
                let rest = scheds
                    .into_iter()
                    .enumerate()
                    .map(|(i, sched)| crate::ranks::Rank {
                        sched,
                        model: m.with_table(cut.table.clone().for_rank(i + 1)),
                    })
                    .collect();
                let ranks = crate::ranks::Ranks::new(
                    rest,
                    Box::new(|g: &mut ggml_graph::Graph| {
                        ggml_graph::opt::optimize(g);
                    }),
                    Box::new(|why: &str| panic!("a rank failed: {why}")),
                );
                (first, ranks)
            };
            let (mut first, mut ranks) = make_ranks();
            let model0 = m.with_table(cut.table.clone().for_rank(0));
            let kv = crate::arch::KvCacheSpec {
                dtype: crate::arch::KvType::F32,
                n_ctx: 64,
            };
            let mut got = Vec::new();
            // The decode step twice at the same position, keyed: the second reuses the kept
            // rank graphs.
            let passes = [
                (steps[0], 0, None),
                (steps[1], 5, Some(9)),
                (steps[1], 5, Some(9)),
            ];
            for (toks, n_past, key) in passes {
                let batch = crate::arch::BatchSpec {
                    n_tok: toks.len(),
                    n_past,
                    logits: crate::arch::LogitsMode::All,
                };
                let build = |m: &Model| -> Result<crate::arch::ForwardGraph, ModelError> {
                    let mut g = crate::arch::build_forward(m.config(), m.weights(), &kv, batch)?;
                    ggml_graph::opt::optimize(&mut g.graph);
                    Ok(g)
                };
                let fg = build(&model0).unwrap();
                let rank_graph = |m: &Model| Ok(build(m)?.graph);
                let ids: Vec<u8> = toks
                    .iter()
                    .flat_map(|&t| (t as i32).to_le_bytes())
                    .collect();
                let pos: Vec<u8> = (n_past..n_past + toks.len())
                    .flat_map(|p| (p as i32).to_le_bytes())
                    .collect();
                ranks
                    .run(
                        &mut first,
                        key,
                        &fg.graph,
                        &[(fg.tokens, &ids), (fg.pos, &pos)],
                        &rank_graph,
                    )
                    .unwrap();
                got.push(first.with_output_f32(fg.logits, |v| v.to_vec()).unwrap());
            }
            for (a, b) in whole.iter().zip(&got) {
                let d = rel_diff(a, b);
                assert!(d <= 1e-3, "{what}: logits differ by {d} (relative)");
            }
            assert_eq!(got[1], got[2], "{what}: the repeated keyed pass");
            // The paged plans (the batching engine's), keyed by pass.
            let whole = run_paged_on(
                &m,
                weight_views(&m).unwrap(),
                1,
                Arc::new(|_: &str| Some(0)),
            );
            let (mut first, mut ranks) = make_ranks();
            let mut key = 0;
            let got = paged_passes(&model0, &mut |g, inputs, build| {
                key += 1;
                ranks
                    .run(&mut first, Some(key), &g.graph, inputs, build)
                    .unwrap();
                first.with_output_f32(g.logits, |v| v.to_vec()).unwrap()
            });
            for (a, b) in whole.iter().zip(&got) {
                let d = rel_diff(a, b);
                assert!(d <= 1e-3, "{what} paged: logits differ by {d} (relative)");
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    /// [`run_on`] of one rank: one device, the graph of its part, `coll` summing with the
    /// other ranks.
    fn run_rank(
        model: &Model,
        views: Vec<WeightView>,
        rule: ggml_graph::sched::PlacementRule,
        steps: &[&[u32]],
        coll: Arc<ThreadSum>,
    ) -> Vec<Vec<f32>> {
        use crate::arch::{build_forward, BatchSpec, KvCacheSpec, KvType, LogitsMode};
        let mut sched = cpu_scheduler(views, 1, rule);
        sched.set_collective(Some(coll));
        let kv = KvCacheSpec {
            dtype: KvType::F32,
            n_ctx: 64,
        };
        let mut n_past = 0;
        let mut out = Vec::new();
        for toks in steps {
            let batch = BatchSpec {
                n_tok: toks.len(),
                n_past,
                logits: LogitsMode::All,
            };
            let mut fg = build_forward(model.config(), model.weights(), &kv, batch).unwrap();
            ggml_graph::opt::optimize(&mut fg.graph);
            let reduces = fg
                .graph
                .tensors()
                .iter()
                .filter(|t| t.op == ggml_graph::Op::AllReduce && t.src.len() == 1)
                .count();
            assert_eq!(
                reduces,
                2 * model.config().n_layer,
                "one part per all-reduce"
            );
            let ids: Vec<u8> = toks
                .iter()
                .flat_map(|&t| (t as i32).to_le_bytes())
                .collect();
            let pos: Vec<u8> = (n_past..n_past + toks.len())
                .flat_map(|p| (p as i32).to_le_bytes())
                .collect();
            sched
                .run(&fg.graph, &[(fg.tokens, &ids), (fg.pos, &pos)])
                .unwrap();
            out.push(sched.with_output_f32(fg.logits, |v| v.to_vec()).unwrap());
            n_past += toks.len();
        }
        out
    }

    #[test]
    fn a_tensor_split_refuses_mixtures_of_experts() {
        let dir = std::env::temp_dir().join(format!("rocmforge-tp-moe-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("moe.gguf");
        let o = crate::synth::SynthOptions::parse("mixtral", "tiny-moe", "q8_0", 3).unwrap();
        crate::synth::write(&o, None, &path).unwrap();
        let m = Model::load(&path, |_, _| {}).unwrap();
        let e = plan(&m, &[1.0, 1.0], 0).unwrap_err().to_string();
        assert!(e.contains("mixture-of-experts"), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A scheduler over `n_dev` CPU devices sharing one thread pool, with `views` bound and
    /// placed by `rule`.
    fn cpu_scheduler(
        views: Vec<WeightView>,
        n_dev: usize,
        rule: ggml_graph::sched::PlacementRule,
    ) -> ggml_graph::Scheduler {
        use ggml_graph::backend::{CpuDevice, Device};
        let cpu = Arc::new(ggml_graph::CpuBackend::new(2).unwrap());
        let devices: Vec<Arc<dyn Device>> = (0..n_dev)
            .map(|_| Arc::new(CpuDevice::new(cpu.clone())) as Arc<dyn Device>)
            .collect();
        let mut sched = ggml_graph::Scheduler::new(devices).unwrap();
        for (name, dtype, dims, bytes) in views {
            sched.bind_weight(&name, dtype, &dims, bytes).unwrap();
        }
        sched.set_placement(rule);
        sched
    }

    /// Logits of two sequences through `model`'s paged plans (a prompt pass of both, then one
    /// decode step of each), run by a scheduler over `n_dev` CPU devices placed by `rule`.
    fn run_paged_on(
        model: &Model,
        views: Vec<WeightView>,
        n_dev: usize,
        rule: ggml_graph::sched::PlacementRule,
    ) -> Vec<Vec<f32>> {
        let mut sched = cpu_scheduler(views, n_dev, rule);
        paged_passes(model, &mut |g, inputs, _| {
            sched.run(&g.graph, inputs).unwrap();
            sched.with_output_f32(g.logits, |v| v.to_vec()).unwrap()
        })
    }

    /// The passes of [`run_paged_on`] through `model`'s plans, each run by `run` (given the
    /// graph, its inputs and a builder of the same pass for another model), which returns the
    /// logits.
    #[allow(clippy::type_complexity)]
    fn paged_passes(
        model: &Model,
        run: &mut dyn FnMut(
            &crate::arch::PagedGraph,
            &[(ggml_graph::TensorId, &[u8])],
            &dyn Fn(&Model) -> Result<ggml_graph::Graph, ModelError>,
        ) -> Vec<f32>,
    ) -> Vec<Vec<f32>> {
        use crate::arch::{build_paged_forward, KvType, PagedBatch, PagedKvSpec};
        let spec = PagedKvSpec {
            dtype: KvType::F32,
            n_blocks: 4,
            block_size: 4,
            max_blocks: 2,
        };
        let tables = [0i32, 1, 2, 3];
        let bytes = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        // (tokens, positions, pool rows, [column, one-token flag] per token)
        let passes: [[&[i32]; 4]; 2] = [
            [
                &[1, 17, 145, 2, 99, 7, 8, 9],
                &[0, 1, 2, 3, 4, 0, 1, 2],
                &[0, 1, 2, 3, 4, 8, 9, 10],
                &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0],
            ],
            [&[5, 11], &[5, 3], &[5, 11], &[0, 1, 1, 1]],
        ];
        let mut out = Vec::new();
        for [toks, pos, slots, seq] in passes {
            let n = toks.len();
            let batch = PagedBatch {
                n_tok: n,
                n_seqs: 2,
                n_out: n,
                hidden: false,
                n_copy: 0,
            };
            let mut g = build_paged_forward(model.config(), model.weights(), &spec, batch).unwrap();
            ggml_graph::opt::optimize(&mut g.graph);
            let rows: Vec<i32> = (0..n as i32).collect();
            let (t, p, sl, sq, tb, r) = (
                bytes(toks),
                bytes(pos),
                bytes(slots),
                bytes(seq),
                bytes(&tables),
                bytes(&rows),
            );
            let inputs = [
                (g.tokens, t.as_slice()),
                (g.pos, &p),
                (g.slots, &sl),
                (g.seq, &sq),
                (g.tables, &tb),
                (g.out_rows, &r),
            ];
            let build = |m: &Model| {
                let mut h = build_paged_forward(m.config(), m.weights(), &spec, batch)?;
                ggml_graph::opt::optimize(&mut h.graph);
                Ok(h.graph)
            };
            out.push(run(&g, &inputs, &build));
        }
        out
    }

    /// Largest |a - b| over the largest |a| (at least 1).
    fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
        assert_eq!(a.len(), b.len());
        assert!(
            a.iter().chain(b).all(|x| x.is_finite()),
            "non-finite logits"
        );
        let scale = a.iter().fold(0f32, |m, x| m.max(x.abs()));
        let diff = a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        diff / scale.max(1.0)
    }

    /// A tensor split over two (CPU) devices computes the whole model's logits: every
    /// slice, part and sum in its place, the KV cache parts kept across passes. Synthetic
    /// llama (Q8_0: heads split one by one; Q4_K_M: the attention's 256-value blocks keep
    /// both KV-head groups on one device), qwen2 (biases) and gemma3 (q/k and post norms).
    #[test]
    fn a_tensor_split_over_two_devices_gives_the_whole_model_logits() {
        let dir = std::env::temp_dir().join(format!("rocmforge-tp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cases = [
            ("llama", "q8_0", [1.0, 1.0], 0, [1usize, 1]),
            ("llama", "q4_k_m", [1.0, 1.0], 1, [1, 0]),
            ("qwen2", "q8_0", [1.0, 1.0], 1, [1, 1]),
            ("gemma3", "q8_0", [1.0, 1.0], 0, [1, 1]),
        ];
        // The 8B-like shape of the GPU tests (model/tests/multi_gpu.rs): 4 query heads of 128
        // per KV head fill whole Q4_K blocks.
        let shaped = {
            let mut o = crate::synth::SynthOptions::parse("gemma3", "tiny", "q4_k_m", 3).unwrap();
            o.shape.n_embd = 512;
            (o.shape.n_head, o.shape.n_head_kv, o.shape.head_dim) = (4, 2, 256);
            o.shape.n_ff = 768;
            o
        };
        let mut runs: Vec<_> = cases
            .iter()
            .map(|&(arch, ftype, shares, main, kv_parts)| {
                let o = crate::synth::SynthOptions::parse(arch, "tiny", ftype, 3).unwrap();
                (o, shares, main, kv_parts)
            })
            .collect();
        runs.push((shaped, [1.0, 2.0], 0, [1, 1]));
        for (o, shares, main, kv_parts) in runs {
            let (arch, ftype) = (o.preset.clone(), format!("{:?} {:?}", o.arch, o.ftype));
            let path = dir.join(format!(
                "{:?}-{:?}-{}.gguf",
                o.arch, o.ftype, o.shape.n_embd
            ));
            crate::synth::write(&o, None, &path).unwrap();
            let m = Model::load(&path, |_, _| {}).unwrap();
            let ts = Arc::new(plan(&m, &shares, main).unwrap());
            let has: Vec<usize> = ts
                .kv_heads
                .iter()
                .map(|r| usize::from(!r.is_empty()))
                .collect();
            assert_eq!(has, kv_parts, "{arch} {ftype}: {ts:?}");
            let cut = split_weights(&m, Arc::clone(&ts)).unwrap();
            assert!(cut.bytes.iter().all(|&b| b > 0), "{arch}: {:?}", cut.bytes);
            let tp = m.with_table(cut.table);
            let steps: [&[u32]; 2] = [&[1, 17, 145, 2, 99], &[7]];
            let whole = run_on(
                &m,
                weight_views(&m).unwrap(),
                1,
                Arc::new(|_: &str| Some(0)),
                &steps,
                None,
            );
            let rule_ts = Arc::clone(&ts);
            let split = run_on(
                &tp,
                cut.views.clone(),
                2,
                Arc::new(move |n: &str| device_of(&rule_ts, n)),
                &steps,
                None,
            );
            for (a, b) in whole.iter().zip(&split) {
                let d = rel_diff(a, b);
                assert!(d <= 1e-3, "{arch} {ftype}: logits differ by {d} (relative)");
            }
            // The same through a collective: the partials summed in place on both devices.
            let rule_ts = Arc::clone(&ts);
            let coll = Arc::new(HostSum {
                n_dev: 2,
                calls: Default::default(),
            });
            let reduced = run_on(
                &tp,
                cut.views,
                2,
                Arc::new(move |n: &str| device_of(&rule_ts, n)),
                &steps,
                Some(coll),
            );
            for (a, b) in split.iter().zip(&reduced) {
                let d = rel_diff(a, b);
                assert!(d <= 1e-6, "{arch} {ftype} collective: logits differ by {d}");
            }
            // The paged plans (the batching engine's), each GPU with its heads' share of the
            // pool.
            let whole = run_paged_on(
                &m,
                weight_views(&m).unwrap(),
                1,
                Arc::new(|_: &str| Some(0)),
            );
            let rule_ts = Arc::clone(&ts);
            let cut = split_weights(&m, Arc::clone(&ts)).unwrap();
            let split = run_paged_on(
                &tp,
                cut.views,
                2,
                Arc::new(move |n: &str| device_of(&rule_ts, n)),
            );
            for (a, b) in whole.iter().zip(&split) {
                let d = rel_diff(a, b);
                assert!(
                    d <= 1e-3,
                    "{arch} {ftype} paged: logits differ by {d} (relative)"
                );
            }
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
