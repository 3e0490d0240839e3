//! Device choice and layer placement: which repeating layers (and whether the output head) run
//! on the GPU, as llama.cpp's `-ngl` does, and how many fit a memory budget.
//!
//! `-ngl N` puts the last `N` repeating layers (`blk.i` with `i >= n_layer - N`) and their KV
//! cache on the GPU; `N > n_layer` also puts the output norm and logits projection there. The
//! token embedding follows the output (it is the tied output matrix in many models). Everything
//! here is a pure function of names, layer counts and byte counts, so it is tested without a GPU.

use std::fmt;
use std::str::FromStr;

use crate::error::ModelError;

/// Where a session runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The GPU when one is present, with as many layers as fit; the CPU otherwise.
    #[default]
    Auto,
    /// The GPU; fails when there is none.
    Gpu,
    /// The CPU only.
    Cpu,
}

impl FromStr for DeviceChoice {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "gpu" | "hip" | "cuda" => Ok(Self::Gpu),
            "cpu" => Ok(Self::Cpu),
            _ => Err(ModelError::InvalidArgument(format!(
                "device `{s}`: expected auto, gpu or cpu"
            ))),
        }
    }
}

impl fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Gpu => "gpu",
            Self::Cpu => "cpu",
        })
    }
}

/// Index of the GPU in the scheduler's device list.
pub const GPU: usize = 0;
/// Index of the CPU in the scheduler's device list.
pub const CPU: usize = 1;

/// A GPU/CPU split of a model with `n_layer` repeating layers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerSplit {
    /// Repeating layers of the model.
    pub n_layer: usize,
    /// llama.cpp's `-ngl`: `0..=n_layer + 1` (larger values are clamped).
    pub n_gpu_layers: usize,
}

impl LayerSplit {
    /// The split for `ngl` requested layers, clamped to `n_layer + 1`.
    pub fn new(n_layer: usize, ngl: usize) -> Self {
        Self {
            n_layer,
            n_gpu_layers: ngl.min(n_layer + 1),
        }
    }

    /// Repeating layers on the GPU.
    pub fn gpu_layers(&self) -> usize {
        self.n_gpu_layers.min(self.n_layer)
    }

    /// First repeating layer on the GPU.
    pub fn first_gpu_layer(&self) -> usize {
        self.n_layer - self.gpu_layers()
    }

    /// True when layer `il` runs on the GPU.
    pub fn layer_on_gpu(&self, il: usize) -> bool {
        il >= self.first_gpu_layer()
    }

    /// True when the output norm and logits projection run on the GPU.
    pub fn output_on_gpu(&self) -> bool {
        self.n_gpu_layers > self.n_layer
    }

    /// True when nothing runs on the GPU.
    pub fn is_cpu_only(&self) -> bool {
        self.n_gpu_layers == 0
    }

    /// The device ([`GPU`] or [`CPU`]) of a weight or KV-cache leaf; `None` for tensors outside
    /// layers and the output head (such as rope frequency factors), which go where they are read.
    pub fn device_of(&self, name: &str) -> Option<usize> {
        let on = |gpu: bool| Some(if gpu { GPU } else { CPU });
        if let Some(il) = layer_of(name) {
            return on(self.layer_on_gpu(il));
        }
        let head = ["token_embd.", "output.", "output_norm."];
        if head.iter().any(|p| name.starts_with(p)) {
            return on(self.output_on_gpu());
        }
        None
    }
}

/// The layer index of `blk.<i>.*` weights and `cache_k.<i>`/`cache_v.<i>` KV-cache leaves.
pub fn layer_of(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("blk.")
        .or_else(|| name.strip_prefix("cache_k."))
        .or_else(|| name.strip_prefix("cache_v."))?;
    rest.split('.').next()?.parse().ok()
}

/// Weight bytes by repeating layer from a model's `(tensor name, bytes)` table: `blk.<i>.*`
/// tensors go to layer `i < n_layer`, everything else (embedding, output head, norms) to the
/// returned remainder, as `(layers, other)`.
pub fn weights_by_layer<'a>(
    tensors: impl IntoIterator<Item = (&'a str, u64)>,
    n_layer: usize,
) -> (Vec<u64>, u64) {
    let mut layers = vec![0u64; n_layer];
    let mut other = 0u64;
    for (name, bytes) in tensors {
        match layer_of(name).and_then(|i| layers.get_mut(i)) {
            Some(l) => *l = l.saturating_add(bytes),
            None => other = other.saturating_add(bytes),
        }
    }
    (layers, other)
}

/// Bytes that one session needs, split by layer (the model side of a fit decision).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// Weight bytes of each repeating layer.
    pub layer_weights: Vec<u64>,
    /// Weight bytes outside the layers (embedding, output head, norms).
    pub other_weights: u64,
    /// KV-cache bytes per layer at the session's context.
    pub kv_per_layer: u64,
    /// Activation arena bytes of the worst-case batch (from the graph planner).
    pub activations: u64,
    /// Backend workspace (scratch, read-back staging, copy slots) with only layers on the GPU.
    pub workspace_layers: u64,
    /// Backend workspace with the output head on the GPU too (its matrix is often the largest).
    pub workspace_head: u64,
}

/// Estimated GPU bytes of a split.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuEstimate {
    /// Weights.
    pub weights: u64,
    /// KV cache.
    pub kv: u64,
    /// Activations and backend workspace.
    pub activations: u64,
}

impl GpuEstimate {
    /// Everything.
    pub fn total(&self) -> u64 {
        self.weights
            .saturating_add(self.kv)
            .saturating_add(self.activations)
    }
}

impl Needs {
    /// GPU bytes of `split`: its layers' weights and KV rows, the non-layer weights when the
    /// output is on the GPU, and the activation arena and workspace whenever anything is.
    pub fn gpu_estimate(&self, split: &LayerSplit) -> GpuEstimate {
        if split.is_cpu_only() {
            return GpuEstimate::default();
        }
        let first = split.first_gpu_layer();
        let layers: u64 = self.layer_weights.iter().skip(first).sum();
        let other = if split.output_on_gpu() {
            self.other_weights
        } else {
            0
        };
        GpuEstimate {
            weights: layers.saturating_add(other),
            kv: self.kv_per_layer.saturating_mul(split.gpu_layers() as u64),
            activations: self.activations.saturating_add(if split.output_on_gpu() {
                self.workspace_head
            } else {
                self.workspace_layers
            }),
        }
    }
}

/// The placement chooser: the largest `-ngl` whose estimate fits `available` bytes (`n_layer + 1`
/// when the whole model fits, 0 when not even one layer does). The estimate grows with `-ngl`,
/// so this is also the split with the most GPU layers.
pub fn fit_layers(needs: &Needs, available: u64) -> usize {
    let n_layer = needs.layer_weights.len();
    (0..=n_layer + 1)
        .rev()
        .find(|&ngl| needs.gpu_estimate(&LayerSplit::new(n_layer, ngl)).total() <= available)
        .unwrap_or(0)
}

/// Parses a byte count with an optional binary suffix (`512M`, `1.5G`, `2GiB`, `1024`).
pub fn parse_bytes(s: &str) -> Result<u64, ModelError> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let digits_end = lower
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(lower.len());
    let (num, suffix) = lower.split_at(digits_end);
    let mult: u64 = match suffix.trim() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(ModelError::InvalidArgument(format!(
                "byte count `{s}`: unknown suffix (use K, M, G or T)"
            )))
        }
    };
    let v: f64 = num
        .parse()
        .map_err(|_| ModelError::InvalidArgument(format!("byte count `{s}` is not a number")))?;
    let bytes = v * mult as f64;
    // 2^64 as f64: the first value a u64 cannot hold (the cast would saturate silently).
    if !bytes.is_finite() || !(0.0..18_446_744_073_709_551_616.0).contains(&bytes) {
        return Err(ModelError::InvalidArgument(format!(
            "byte count `{s}` is out of range (at most 16 EiB)"
        )));
    }
    Ok(bytes as u64)
}

/// Formats bytes as MiB with two decimals.
pub fn mib(bytes: u64) -> String {
    format!("{:.2} MiB", bytes as f64 / (1u64 << 20) as f64)
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
    fn ngl_puts_the_last_layers_on_the_gpu() {
        let s = LayerSplit::new(10, 4);
        assert_eq!(s.first_gpu_layer(), 6);
        assert!(!s.layer_on_gpu(5) && s.layer_on_gpu(6) && s.layer_on_gpu(9));
        assert!(!s.output_on_gpu());
        assert_eq!(s.device_of("blk.5.attn_q.weight"), Some(CPU));
        assert_eq!(s.device_of("blk.6.ffn_down.weight"), Some(GPU));
        assert_eq!(s.device_of("cache_k.9"), Some(GPU));
        assert_eq!(s.device_of("cache_v.0"), Some(CPU));
        assert_eq!(s.device_of("output.weight"), Some(CPU));
        assert_eq!(s.device_of("token_embd.weight"), Some(CPU));
        assert_eq!(s.device_of("rope_freqs.weight"), None);
        let all = LayerSplit::new(10, 11);
        assert!(all.output_on_gpu() && all.layer_on_gpu(0));
        assert_eq!(all.device_of("output_norm.weight"), Some(GPU));
        assert_eq!(LayerSplit::new(10, 99).n_gpu_layers, 11);
        assert!(LayerSplit::new(10, 0).is_cpu_only());
        assert_eq!(LayerSplit::new(10, 0).device_of("blk.9.x"), Some(CPU));
    }

    #[test]
    fn layer_names() {
        assert_eq!(layer_of("blk.17.attn_k.weight"), Some(17));
        assert_eq!(layer_of("cache_k.3"), Some(3));
        assert_eq!(layer_of("blk.x.y"), None);
        assert_eq!(layer_of("output.weight"), None);
    }

    #[test]
    fn estimates_count_only_what_is_on_the_gpu() {
        let n = needs();
        let e = n.gpu_estimate(&LayerSplit::new(10, 11));
        assert_eq!((e.weights, e.kv, e.activations), (1050, 100, 50));
        let e = n.gpu_estimate(&LayerSplit::new(10, 3));
        assert_eq!((e.weights, e.kv, e.activations), (300, 30, 40));
        assert_eq!(n.gpu_estimate(&LayerSplit::new(10, 0)).total(), 0);
    }

    #[test]
    fn fit_takes_everything_when_it_fits_and_splits_otherwise() {
        let n = needs();
        assert_eq!(fit_layers(&n, 1 << 40), 11);
        assert_eq!(n.gpu_estimate(&LayerSplit::new(10, 11)).total(), 1200);
        // 1199 bytes: the head (and its larger workspace) no longer fits with 10 layers; 10
        // layers alone take 1140.
        assert_eq!(fit_layers(&n, 1199), 10);
        assert_eq!(fit_layers(&n, 1200), 11);
        // 600 bytes: 40 + 110 l <= 600 -> 5 layers with the head on the CPU.
        assert_eq!(fit_layers(&n, 600), 5);
        assert_eq!(fit_layers(&n, 149), 0);
        assert_eq!(fit_layers(&n, 150), 1);
    }

    #[test]
    fn chooser_takes_the_most_layers_that_fit() {
        let n = needs();
        assert_eq!(fit_layers(&n, 5000), 11);
        // The split keeps the head on the CPU: 40 + 110 l <= 600 -> 5 layers (counting the
        // head's weights and workspace on the GPU would leave room for only 4).
        assert_eq!(fit_layers(&n, 600), 5);
        assert_eq!(fit_layers(&n, 100), 0);
        // A forced small budget always gives a partial offload between the extremes.
        for avail in [200, 400, 800, 1100] {
            let ngl = fit_layers(&n, avail);
            assert!(ngl > 0 && ngl < 11, "{avail}: {ngl}");
            assert!(n.gpu_estimate(&LayerSplit::new(10, ngl)).total() <= avail);
            let more = n.gpu_estimate(&LayerSplit::new(10, ngl + 1)).total();
            assert!(more > avail, "{avail}: {} layers would fit too", ngl + 1);
        }
    }

    #[test]
    fn splits_count_the_last_layers() {
        // Layers of unequal size: a split holds the last ones, so the chooser weighs those.
        let n = Needs {
            layer_weights: vec![10, 10, 10, 100, 100],
            ..Needs::default()
        };
        assert_eq!(fit_layers(&n, 200), 2);
        assert_eq!(fit_layers(&n, 199), 1);
        assert_eq!(fit_layers(&n, 230), 6);
    }

    #[test]
    fn weights_are_grouped_by_layer() {
        let table = [
            ("token_embd.weight", 1000),
            ("blk.0.attn_q.weight", 10),
            ("blk.0.ffn_up.weight", 20),
            ("blk.2.attn_q.weight", 5),
            ("blk.7.attn_q.weight", 3),
            ("output_norm.weight", 4),
        ];
        let (layers, other) = weights_by_layer(table, 3);
        assert_eq!(layers, vec![30, 0, 5]);
        // A block beyond the model's layer count is no layer of it.
        assert_eq!(other, 1007);
    }

    #[test]
    fn byte_counts() {
        assert_eq!(parse_bytes("1024").unwrap(), 1024);
        assert_eq!(parse_bytes("512M").unwrap(), 512 << 20);
        assert_eq!(parse_bytes("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_bytes("2g").unwrap(), 2 << 30);
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("M").is_err());
        // Past u64: refused, not saturated to 16 EiB.
        let e = parse_bytes("99999999999T").expect_err("past u64");
        assert!(e.to_string().contains("out of range"), "{e}");
        assert!(parse_bytes("16777215T").is_ok());
        assert_eq!("gpu".parse::<DeviceChoice>().unwrap(), DeviceChoice::Gpu);
        assert!("tpu".parse::<DeviceChoice>().is_err());
    }
}
