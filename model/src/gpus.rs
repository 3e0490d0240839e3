//! Several GPUs in one process: which GPUs a session uses and how its repeating layers spread
//! over them by layer (llama.cpp's `--split-mode layer`, `--tensor-split`, `--main-gpu`, and
//! `--devices`).
//!
//! A layer split gives each GPU a run of consecutive layers, in GPU order, in proportion to the
//! split (`--tensor-split`, else each GPU's free memory); the output head and the token
//! embedding go to the head GPU (`--main-gpu`, else the GPU of the last layer, which saves a
//! copy). Layers that fit no GPU stay on the CPU, first layers first, as with `-ngl`. Each GPU
//! holds the KV cache of its own layers; the scheduler passes activations GPU to GPU at the
//! boundaries. Everything here is a pure function of counts and byte sizes, tested without GPUs.

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
}

impl FromStr for SplitMode {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "none" => Ok(Self::None),
            "layer" => Ok(Self::Layer),
            "row" | "tensor" => Err(ModelError::InvalidArgument(format!(
                "--split-mode {s}: tensor parallelism is not built yet; use layer"
            ))),
            _ => Err(ModelError::InvalidArgument(format!(
                "--split-mode `{s}`: expected none or layer"
            ))),
        }
    }
}

impl fmt::Display for SplitMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Layer => "layer",
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
    /// Share of the layers per GPU of [`GpuSelection::devices`] (`--tensor-split 3,1`);
    /// `None`: in proportion to free memory.
    pub tensor_split: Option<Vec<f64>>,
    /// Index into the GPU list of the GPU that holds the output head (layer split) or the one
    /// GPU used (split mode none); `None`: the last GPU of a layer split, the first one alone.
    pub main_gpu: Option<usize>,
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
        self.split_mode == Some(SplitMode::Layer)
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
        let e = "tensor".parse::<SplitMode>().unwrap_err().to_string();
        assert!(e.contains("not built"), "{e}");
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
}
