//! Several GPUs in one process: which GPUs a session uses and how its repeating layers spread
//! over them, by layer or by tensor (llama.cpp's `--split-mode layer|row`, `--tensor-split`,
//! `--main-gpu`, and `--devices`).
//!
//! A layer split gives each GPU a run of consecutive layers, in GPU order, in proportion to the
//! split (`--tensor-split`, else each GPU's free memory); the output head and the token
//! embedding go to the head GPU (`--main-gpu`, else the GPU of the last layer, which saves a
//! copy). Layers that fit no GPU stay on the CPU, first layers first, as with `-ngl`. Each GPU
//! holds the KV cache of its own layers; the scheduler passes activations GPU to GPU at the
//! boundaries. A tensor split ([`TensorSplit`]) instead divides every layer's heads and
//! feed-forward columns among the GPUs. Everything here is a pure function of counts and byte
//! sizes, tested without GPUs.

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use crate::error::ModelError;
use crate::placement::{layer_of, mib, GpuEstimate, LayerSplit, Needs};

/// How a model spreads over several GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    /// One GPU only (`--main-gpu` picks it).
    None,
    /// Consecutive layers on each GPU.
    Layer,
    /// Every layer on every GPU: attention heads and feed-forward columns divided among them
    /// (Megatron style; see [`TensorSplit`]).
    Tensor,
}

impl FromStr for SplitMode {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "layer" => Ok(Self::Layer),
            "row" | "tensor" => Ok(Self::Tensor),
            _ => Err(ModelError::InvalidArgument(format!(
                "--split-mode `{s}`: expected none, layer or tensor (row)"
            ))),
        }
    }
}

impl fmt::Display for SplitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Layer => "layer",
            Self::Tensor => "tensor",
        })
    }
}

/// The GPUs a session may use and how to split over them (all `None`: decide from the model).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSelection {
    /// GPU ordinals to use, in split order (`--devices 0,2`); `None`: every GPU.
    pub devices: Option<Vec<usize>>,
    /// `--split-mode`; `None`: one GPU when the model fits it, else a layer split over all.
    pub split_mode: Option<SplitMode>,
    /// Share of the layers (or with [`SplitMode::Tensor`] of the heads and feed-forward
    /// columns) per GPU of [`GpuSelection::devices`] (`--tensor-split 3,1`); `None`: in
    /// proportion to free memory.
    pub tensor_split: Option<Vec<f64>>,
    /// Index into the GPU list of the GPU that holds the output head (layer split; with a
    /// tensor split also the embeddings, norms and sums) or the one GPU used (split mode none);
    /// `None`: the last GPU of a layer split, else the first.
    pub main_gpu: Option<usize>,
    /// How a tensor split sums its GPUs' partial results (NCCL/RCCL all-reduces where the
    /// library loads, else peer copies to the main GPU).
    pub collectives: ggml_graph::CollectiveOptions,
    /// One process per GPU (`--dist-init`): this process's rank of a tensor split whose other
    /// parts run in other processes; `None`: this process drives all its GPUs.
    pub dist: Option<crate::dist::DistSpec>,
}

/// Parses a comma-separated list (`0,2`, `3,1`).
fn parse_list<T: FromStr>(what: &str, s: &str) -> Result<Vec<T>, ModelError> {
    s.split([',', '/'])
        .map(|p| {
            p.trim().parse::<T>().map_err(|_| {
                ModelError::InvalidArgument(format!("{what} `{s}`: `{p}` is not a number"))
            })
        })
        .collect()
}

impl GpuSelection {
    /// Parses `--devices` (`0,2`).
    pub fn parse_devices(s: &str) -> Result<Vec<usize>, ModelError> {
        parse_list("--devices", s)
    }

    /// Parses `--tensor-split` (`3,1`): non-negative, finite, not all zero.
    pub fn parse_tensor_split(s: &str) -> Result<Vec<f64>, ModelError> {
        let v: Vec<f64> = parse_list("--tensor-split", s)?;
        let sum: f64 = v.iter().sum();
        // A finite sum too: `1e308,1e308` would make every share 0 after normalising.
        if v.iter().any(|x| !x.is_finite() || *x < 0.0) || !(sum > 0.0 && sum.is_finite()) {
            return Err(ModelError::InvalidArgument(format!(
                "--tensor-split `{s}`: shares must be non-negative, not all zero, and sum to a \
                 finite number"
            )));
        }
        Ok(v)
    }

    /// The GPU ordinals to use where `count` GPUs exist: `--devices` checked (in range, no
    /// repeats), else all of them; the tensor split and main GPU checked against the list.
    pub fn ordinals(&self, count: usize) -> Result<Vec<usize>, ModelError> {
        let list: Vec<usize> = match &self.devices {
            Some(d) => d.clone(),
            None => (0..count).collect(),
        };
        if let Some(&bad) = list.iter().find(|&&d| d >= count) {
            return Err(ModelError::InvalidArgument(format!(
                "--devices: GPU {bad} does not exist ({count} GPUs present)"
            )));
        }
        let mut seen = list.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != list.len() {
            return Err(ModelError::InvalidArgument(format!(
                "--devices {list:?} names a GPU twice"
            )));
        }
        if let Some(ts) = &self.tensor_split {
            if ts.len() != list.len() {
                return Err(ModelError::InvalidArgument(format!(
                    "--tensor-split has {} shares for {} GPUs",
                    ts.len(),
                    list.len()
                )));
            }
        }
        if let Some(m) = self.main_gpu.filter(|&m| m >= list.len().max(1)) {
            return Err(ModelError::InvalidArgument(format!(
                "--main-gpu {m}: only {} GPUs in use",
                list.len()
            )));
        }
        Ok(list)
    }

    /// True when the flags ask for a split over several GPUs whether or not the model fits one.
    pub fn wants_several(&self) -> bool {
        matches!(self.split_mode, Some(SplitMode::Layer | SplitMode::Tensor))
            || self.tensor_split.is_some()
            || self.devices.as_ref().is_some_and(|d| d.len() > 1)
    }

    /// Index (into the GPU list) of the GPU a single-GPU session uses.
    pub fn single(&self) -> usize {
        self.main_gpu.unwrap_or(0)
    }
}

/// A model's repeating layers over several GPUs (and the CPU).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MultiSplit {
    /// Which layers run on some GPU (the last `n_gpu_layers`) and whether the head does.
    pub split: LayerSplit,
    /// Repeating layers per GPU, in GPU order: consecutive runs that end at the last layer.
    pub counts: Vec<usize>,
    /// The GPU (index into the list) holding the output head and token embedding.
    pub head: usize,
}

impl MultiSplit {
    /// GPUs in the split.
    pub fn n_gpus(&self) -> usize {
        self.counts.len()
    }

    /// The scheduler's index of the CPU: after the GPUs.
    pub fn cpu(&self) -> usize {
        self.counts.len()
    }

    /// The layers of GPU `k`.
    pub fn range(&self, k: usize) -> Range<usize> {
        let start = self.split.first_gpu_layer() + self.counts[..k].iter().sum::<usize>();
        start..start + self.counts[k]
    }

    /// The GPU of layer `il`, or `None` when it runs on the CPU.
    pub fn gpu_of_layer(&self, il: usize) -> Option<usize> {
        (0..self.n_gpus()).find(|&k| self.range(k).contains(&il))
    }

    /// The device (GPU index, or [`MultiSplit::cpu`]) of a weight or KV-cache leaf; `None` for
    /// tensors outside layers and the head, which go where they are read.
    pub fn device_of(&self, name: &str) -> Option<usize> {
        if let Some(il) = layer_of(name) {
            return Some(self.gpu_of_layer(il).unwrap_or(self.cpu()));
        }
        let head = ["token_embd.", "output.", "output_norm."];
        if head.iter().any(|p| name.starts_with(p)) {
            return Some(if self.split.output_on_gpu() {
                self.head
            } else {
                self.cpu()
            });
        }
        None
    }

    /// Estimated bytes on each GPU: its layers' weights and KV rows, the head's weights on the
    /// head GPU, and the activation arena with the backend's workspace on every GPU that runs
    /// anything (each device plans the whole graph's arena).
    pub fn estimates(&self, needs: &Needs) -> Vec<GpuEstimate> {
        (0..self.n_gpus())
            .map(|k| {
                let r = self.range(k);
                let head = k == self.head && self.split.output_on_gpu();
                let mut weights: u64 = needs
                    .layer_weights
                    .get(r.clone())
                    .map_or(0, |l| l.iter().sum());
                if head {
                    weights = weights.saturating_add(needs.other_weights);
                }
                let busy = !r.is_empty() || head;
                let work = if head {
                    needs.workspace_head
                } else {
                    needs.workspace_layers
                };
                GpuEstimate {
                    weights,
                    kv: needs.kv_per_layer.saturating_mul(r.len() as u64),
                    activations: if busy {
                        needs.activations.saturating_add(work)
                    } else {
                        0
                    },
                }
            })
            .collect()
    }
}

/// `n` items in consecutive runs proportional to `shares` (cumulative rounding, so the runs
/// add up to `n` and a zero share gets none).
pub fn proportional(n: usize, shares: &[f64]) -> Vec<usize> {
    let total: f64 = shares.iter().map(|s| s.max(0.0)).sum();
    if shares.is_empty() {
        return Vec::new();
    }
    if total <= 0.0 {
        let mut v = vec![0; shares.len()];
        v[shares.len() - 1] = n;
        return v;
    }
    let mut cum = 0.0;
    let mut prev = 0usize;
    shares
        .iter()
        .enumerate()
        .map(|(i, s)| {
            cum += s.max(0.0);
            let end = if i + 1 == shares.len() {
                n
            } else {
                ((cum / total) * n as f64).round() as usize
            };
            let end = end.clamp(prev, n);
            let c = end - prev;
            prev = end;
            c
        })
        .collect()
}

/// The layer split over GPUs with `available` bytes each: `ngl` layers when given (llama.cpp's
/// `-ngl`, unchecked), else the most layers whose per-GPU estimates all fit. Layers go in
/// proportion to `shares` when given, else to what each GPU has left after the parts every
/// busy GPU holds (activations, workspace) and the head GPU's head. `head`: the head GPU, else
/// the last one.
pub fn fit_multi(
    needs: &Needs,
    available: &[u64],
    shares: Option<&[f64]>,
    head: Option<usize>,
    ngl: Option<usize>,
) -> MultiSplit {
    let n_layer = needs.layer_weights.len();
    let n = available.len();
    let head = head.unwrap_or(n.saturating_sub(1)).min(n.saturating_sub(1));
    let room: Vec<f64> = match shares {
        Some(s) => s.to_vec(),
        None => available
            .iter()
            .enumerate()
            .map(|(k, &a)| {
                let mut fixed = needs.activations.saturating_add(needs.workspace_layers);
                if k == head {
                    fixed = needs
                        .activations
                        .saturating_add(needs.workspace_head)
                        .saturating_add(needs.other_weights);
                }
                a.saturating_sub(fixed) as f64
            })
            .collect(),
    };
    let make = |ngl: usize| {
        let split = LayerSplit::new(n_layer, ngl);
        MultiSplit {
            split,
            counts: proportional(split.gpu_layers(), &room),
            head,
        }
    };
    if let Some(ngl) = ngl {
        return make(ngl);
    }
    (0..=n_layer + 1)
        .rev()
        .map(make)
        .find(|m| {
            m.estimates(needs)
                .iter()
                .zip(available)
                .all(|(e, &a)| e.total() <= a)
        })
        .unwrap_or_else(|| make(0))
}

/// One GPU's part of a session's plan (for the printout).
#[derive(Clone, Debug, PartialEq)]
pub struct GpuShare {
    /// The GPU's name.
    pub device: String,
    /// Its repeating layers.
    pub layers: Range<usize>,
    /// Whether it holds the output head.
    pub output: bool,
    /// Estimated bytes.
    pub estimate: GpuEstimate,
    /// Bytes its budget allowed.
    pub available: u64,
}

impl fmt::Display for GpuShare {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layers = if self.layers.is_empty() {
            "no layers".to_owned()
        } else {
            format!(
                "{} layers (blk.{}..{})",
                self.layers.len(),
                self.layers.start,
                self.layers.end - 1
            )
        };
        write!(
            f,
            "{}: {layers}{}; weights {}, KV cache {}, activations+workspace {}, total {} of {} available",
            self.device,
            if self.output { " + output" } else { "" },
            mib(self.estimate.weights),
            mib(self.estimate.kv),
            mib(self.estimate.activations),
            mib(self.estimate.total()),
            mib(self.available),
        )
    }
}

/// Feed-forward columns go to GPUs in runs of this many (when the width allows), so that the
/// down projection's column slices start on block boundaries of every quantized type.
pub const FF_UNIT: usize = 256;

/// How a tensor split (`--split-mode tensor`) divides every layer among GPUs: each GPU gets a
/// run of KV heads with their query heads (rows of the q, k and v projections, the matching
/// columns of the output projection and its share of the KV cache) and a run of feed-forward
/// columns (rows of gate and up, columns of down). Each GPU's partial attention output and
/// partial feed-forward output are summed; everything else runs on the main GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSplit {
    /// KV heads per GPU, consecutive, in GPU order.
    pub kv_heads: Vec<Range<usize>>,
    /// Query heads per KV head.
    pub group: usize,
    /// Feed-forward columns per GPU, consecutive, in GPU order.
    pub ff: Vec<Range<usize>>,
    /// The GPU (index into the list) holding the embeddings, norms, sums and output head.
    pub main: usize,
}

/// The shape a [`TensorSplit`] divides.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SplitShape {
    /// Query heads.
    pub n_head: usize,
    /// Key/value heads.
    pub n_head_kv: usize,
    /// Value head size (columns of the output projection per query head).
    pub head_dim_v: usize,
    /// Feed-forward width.
    pub n_ff: usize,
    /// Largest block (values along a row) of the output projections' types: their column
    /// slices must start on block boundaries.
    pub attn_block: usize,
    /// Largest block of the down projections' types.
    pub ffn_block: usize,
}

impl TensorSplit {
    /// Divides `shape` among `shares.len()` GPUs in proportion to `shares` (in whole units of
    /// heads and columns that keep every column slice on block boundaries).
    pub fn new(shape: SplitShape, shares: &[f64], main: usize) -> Result<Self, ModelError> {
        let SplitShape {
            n_head,
            n_head_kv,
            head_dim_v,
            n_ff,
            attn_block,
            ffn_block,
        } = shape;
        if shares.is_empty() || main >= shares.len() {
            return Err(ModelError::InvalidArgument(format!(
                "tensor split over {} GPUs with main GPU {main}",
                shares.len()
            )));
        }
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(ModelError::InvalidArgument(format!(
                "--split-mode tensor: {n_head} query heads are no whole number per each of \
                 {n_head_kv} KV heads"
            )));
        }
        let group = n_head / n_head_kv;
        let (attn_block, ffn_block) = (attn_block.max(1), ffn_block.max(1));
        // The fewest KV heads whose output-projection columns fill whole blocks.
        let kv_unit = (1..=n_head_kv)
            .find(|g| n_head_kv % g == 0 && (g * group * head_dim_v) % attn_block == 0)
            .ok_or_else(|| {
                ModelError::InvalidArgument(format!(
                    "--split-mode tensor: the attention output's {}-value blocks do not fall \
                     on head boundaries ({n_head} heads of {head_dim_v})",
                    attn_block
                ))
            })?;
        let ff_unit = if n_ff.is_multiple_of(FF_UNIT) && FF_UNIT.is_multiple_of(ffn_block) {
            FF_UNIT
        } else {
            ffn_block
        };
        if n_ff == 0 || n_ff % ff_unit != 0 {
            return Err(ModelError::InvalidArgument(format!(
                "--split-mode tensor: feed-forward width {n_ff} is no whole number of the down \
                 projection's {ffn_block}-value blocks"
            )));
        }
        let runs = |n_units: usize, unit: usize| -> Vec<Range<usize>> {
            let mut start = 0;
            proportional(n_units, shares)
                .into_iter()
                .map(|c| {
                    let r = start * unit..(start + c) * unit;
                    start += c;
                    r
                })
                .collect()
        };
        Ok(Self {
            kv_heads: runs(n_head_kv / kv_unit, kv_unit),
            group,
            ff: runs(n_ff / ff_unit, ff_unit),
            main,
        })
    }

    /// GPUs in the split.
    pub fn n_gpus(&self) -> usize {
        self.kv_heads.len()
    }

    /// The query heads of GPU `k`.
    pub fn q_heads(&self, k: usize) -> Range<usize> {
        self.kv_heads[k].start * self.group..self.kv_heads[k].end * self.group
    }

    /// The order partial results are built in: the GPUs with a share of `what` (KV heads or
    /// feed-forward columns), the main GPU last, so that the sum of the partials (which runs
    /// where its newest operand was computed) lands on the main GPU.
    pub fn order(&self, parts: &[Range<usize>]) -> Vec<usize> {
        let mut v: Vec<usize> = (0..parts.len())
            .filter(|&k| k != self.main && !parts[k].is_empty())
            .collect();
        if !parts[self.main].is_empty() {
            v.push(self.main);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs() -> Needs {
        Needs {
            layer_weights: vec![100; 10],
            other_weights: 50,
            kv_per_layer: 10,
            activations: 30,
            workspace_layers: 10,
            workspace_head: 20,
        }
    }

    #[test]
    fn proportional_runs_add_up() {
        assert_eq!(proportional(10, &[1.0, 1.0]), vec![5, 5]);
        assert_eq!(proportional(8, &[3.0, 1.0]), vec![6, 2]);
        assert_eq!(proportional(7, &[1.0, 0.0, 1.0]), vec![4, 0, 3]);
        assert_eq!(proportional(5, &[0.0, 0.0]), vec![0, 5]);
        assert_eq!(proportional(0, &[1.0, 2.0]), vec![0, 0]);
        for n in 0..40 {
            for s in [[1.0, 2.0, 3.0], [5.0, 0.1, 1.0], [0.0, 1.0, 0.0]] {
                assert_eq!(proportional(n, &s).iter().sum::<usize>(), n, "{n} {s:?}");
            }
        }
    }

    #[test]
    fn layers_are_consecutive_per_gpu_and_the_head_is_on_the_last() {
        let m = MultiSplit {
            split: LayerSplit::new(10, 11),
            counts: vec![6, 4],
            head: 1,
        };
        assert_eq!((m.range(0), m.range(1)), (0..6, 6..10));
        assert_eq!(m.device_of("blk.5.attn_q.weight"), Some(0));
        assert_eq!(m.device_of("cache_v.6"), Some(1));
        assert_eq!(m.device_of("output.weight"), Some(1));
        assert_eq!(m.device_of("token_embd.weight"), Some(1));
        assert_eq!(m.device_of("rope_freqs.weight"), None);
        // 8 GPU layers, no head: the first two layers and the head stay on the CPU (index 2).
        let p = MultiSplit {
            split: LayerSplit::new(10, 8),
            counts: vec![4, 4],
            head: 1,
        };
        assert_eq!(p.range(0), 2..6);
        assert_eq!(p.device_of("blk.1.ffn_up.weight"), Some(2));
        assert_eq!(p.device_of("blk.2.ffn_up.weight"), Some(0));
        assert_eq!(p.device_of("output_norm.weight"), Some(2));
        assert_eq!(p.gpu_of_layer(9), Some(1));
    }

    #[test]
    fn estimates_split_weights_kv_and_head() {
        let m = MultiSplit {
            split: LayerSplit::new(10, 11),
            counts: vec![6, 4],
            head: 1,
        };
        let e = m.estimates(&needs());
        assert_eq!((e[0].weights, e[0].kv, e[0].activations), (600, 60, 40));
        assert_eq!((e[1].weights, e[1].kv, e[1].activations), (450, 40, 50));
        // A GPU with nothing on it needs nothing.
        let idle = MultiSplit {
            split: LayerSplit::new(10, 4),
            counts: vec![0, 4],
            head: 1,
        };
        assert_eq!(idle.estimates(&needs())[0].total(), 0);
    }

    #[test]
    fn fit_spreads_what_one_gpu_cannot_hold() {
        let n = needs();
        // The whole model needs 1200 bytes on one GPU; two of 700 hold it between them.
        let m = fit_multi(&n, &[700, 700], None, None, None);
        assert_eq!(m.split.n_gpu_layers, 11, "{m:?}");
        assert_eq!(m.counts.iter().sum::<usize>(), 10);
        assert_eq!(m.head, 1);
        for (e, a) in m.estimates(&n).iter().zip([700, 700]) {
            assert!(e.total() <= a, "{e:?}");
        }
        // The head GPU has the head's bytes less room for layers.
        assert!(m.counts[0] >= m.counts[1], "{m:?}");
        // Too little for everything: the first layers go to the CPU, never a GPU over budget.
        let small = fit_multi(&n, &[300, 300], None, None, None);
        assert!(small.split.n_gpu_layers < 10, "{small:?}");
        for e in small.estimates(&n) {
            assert!(e.total() <= 300, "{e:?}");
        }
        // A given split and -ngl are taken as they are.
        let ts = fit_multi(&n, &[1 << 20, 1 << 20], Some(&[3.0, 1.0]), Some(0), None);
        assert_eq!((ts.counts.clone(), ts.head), (vec![8, 2], 0));
        let ngl = fit_multi(&n, &[1, 1], Some(&[1.0, 1.0]), None, Some(4));
        assert_eq!((ngl.split.gpu_layers(), ngl.counts), (4, vec![2, 2]));
    }

    #[test]
    fn selection_flags() {
        assert_eq!(GpuSelection::parse_devices("0,2").unwrap(), vec![0, 2]);
        assert!(GpuSelection::parse_devices("0,x").is_err());
        assert_eq!(
            GpuSelection::parse_tensor_split("3,1").unwrap(),
            vec![3.0, 1.0]
        );
        assert!(GpuSelection::parse_tensor_split("0,0").is_err());
        assert!(GpuSelection::parse_tensor_split("-1,2").is_err());
        assert!(GpuSelection::parse_tensor_split("1e308,1e308").is_err());
        assert_eq!("layer".parse::<SplitMode>().unwrap(), SplitMode::Layer);
        assert_eq!("tensor".parse::<SplitMode>().unwrap(), SplitMode::Tensor);
        assert_eq!("row".parse::<SplitMode>().unwrap(), SplitMode::Tensor);
        assert!("rows".parse::<SplitMode>().is_err());
        let all = GpuSelection::default();
        assert_eq!(all.ordinals(2).unwrap(), vec![0, 1]);
        assert!(!all.wants_several());
        let sel = GpuSelection {
            devices: Some(vec![2, 0]),
            tensor_split: Some(vec![1.0, 1.0]),
            main_gpu: Some(1),
            ..GpuSelection::default()
        };
        assert_eq!(sel.ordinals(3).unwrap(), vec![2, 0]);
        assert!(sel.wants_several());
        assert!(sel.ordinals(2).is_err(), "GPU 2 of 2");
        let twice = GpuSelection {
            devices: Some(vec![1, 1]),
            ..GpuSelection::default()
        };
        assert!(twice.ordinals(2).is_err());
        let short = GpuSelection {
            tensor_split: Some(vec![1.0]),
            ..GpuSelection::default()
        };
        assert!(short.ordinals(2).is_err());
        let main = GpuSelection {
            main_gpu: Some(2),
            ..GpuSelection::default()
        };
        assert!(main.ordinals(2).is_err());
    }

    fn shape_8b() -> SplitShape {
        SplitShape {
            n_head: 32,
            n_head_kv: 8,
            head_dim_v: 128,
            n_ff: 14336,
            attn_block: 256,
            ffn_block: 256,
        }
    }

    #[test]
    fn tensor_split_divides_heads_and_columns_on_block_boundaries() {
        let even = TensorSplit::new(shape_8b(), &[1.0, 1.0], 0).unwrap();
        assert_eq!(even.kv_heads, vec![0..4, 4..8]);
        assert_eq!((even.q_heads(0), even.q_heads(1)), (0..16, 16..32));
        assert_eq!(even.ff, vec![0..7168, 7168..14336]);
        let ts = TensorSplit::new(shape_8b(), &[3.0, 1.0], 1).unwrap();
        assert_eq!(ts.kv_heads, vec![0..6, 6..8]);
        assert_eq!(ts.ff, vec![0..10752, 10752..14336]);
        // Every column slice starts on a 256-value block of the down and output projections.
        for r in ts.ff.iter().chain(&even.ff) {
            assert_eq!(r.start % 256, 0);
        }
        // The main GPU's partial comes last (its sum lands there).
        assert_eq!(ts.order(&ts.kv_heads), vec![0, 1]);
        let m0 = TensorSplit::new(shape_8b(), &[3.0, 1.0], 0).unwrap();
        assert_eq!(m0.order(&m0.ff), vec![1, 0]);
        // Four GPUs, uneven width (Qwen2-7B: 18944 = 74 x 256).
        let q = SplitShape {
            n_head: 28,
            n_head_kv: 4,
            n_ff: 18944,
            ..shape_8b()
        };
        let four = TensorSplit::new(q, &[1.0; 4], 0).unwrap();
        // Seven query heads of 128 per KV head fill whole blocks only in pairs of KV heads.
        assert_eq!(four.kv_heads, vec![0..2, 2..2, 2..4, 4..4]);
        assert_eq!(four.group, 7);
        assert_eq!(four.ff.iter().map(|r| r.len() / 256).sum::<usize>(), 74);
        assert_eq!(four.ff.last().unwrap().end, 18944);
    }

    #[test]
    fn tensor_split_keeps_head_groups_whole_blocks() {
        // Two query heads of 64 per KV head: 128 columns, half a 256-value block, so KV heads
        // go in pairs; with 2 KV heads one GPU gets both.
        let tiny = SplitShape {
            n_head: 4,
            n_head_kv: 2,
            head_dim_v: 64,
            n_ff: 512,
            attn_block: 256,
            ffn_block: 256,
        };
        let t = TensorSplit::new(tiny, &[1.0, 1.0], 0).unwrap();
        assert_eq!(t.kv_heads, vec![0..2, 2..2]);
        assert_eq!(t.order(&t.kv_heads), vec![0]);
        assert_eq!(t.ff, vec![0..256, 256..512]);
        // Q8_0 (32-value blocks) splits them by head.
        let q8 = SplitShape {
            attn_block: 32,
            ffn_block: 32,
            ..tiny
        };
        assert_eq!(
            TensorSplit::new(q8, &[1.0, 1.0], 0).unwrap().kv_heads,
            vec![0..1, 1..2]
        );
        // A width that is no whole number of blocks, or heads that do not group, are refused.
        let odd = SplitShape { n_ff: 500, ..tiny };
        assert!(TensorSplit::new(odd, &[1.0, 1.0], 0).is_err());
        let ng = SplitShape { n_head: 5, ..tiny };
        assert!(TensorSplit::new(ng, &[1.0, 1.0], 0).is_err());
        let blocky = SplitShape {
            head_dim_v: 96,
            n_head: 2,
            n_head_kv: 2,
            attn_block: 256,
            ..tiny
        };
        assert!(TensorSplit::new(blocky, &[1.0, 1.0], 0).is_err());
        assert!(TensorSplit::new(tiny, &[1.0, 1.0], 2).is_err());
    }
}
