//! Memory estimates: model weights from a GGUF tensor table (exact, arena padding included),
//! KV-cache bytes, and the placement chooser (whole model on a GPU, a GPU/CPU layer split, or
//! the CPU).

use crate::error::{align_up, GpuError, Result};
use crate::pool::{WeightArena, RAW_ALIGN};

/// Alignment of tensors inside the weight arena.
pub const TENSOR_ALIGN: u64 = RAW_ALIGN;

/// Weight bytes of a GGUF file: the sum of its tensors' data sizes.
pub fn model_weight_bytes(file: &gguf::GgufFile) -> u64 {
    file.tensors().iter().map(|t| t.size).sum()
}

/// Bytes the weight arena needs for these tensor sizes (alignment padding included), in chunks
/// of at most `max_chunk` bytes.
pub fn arena_bytes(sizes: &[u64], max_chunk: u64) -> Result<u64> {
    Ok(WeightArena::plan_chunks(sizes, TENSOR_ALIGN, max_chunk)?
        .iter()
        .sum())
}

/// Per-layer weight bytes: tensors named `blk.<i>.*` go to layer `i`; the rest (embeddings,
/// output, final norm) is returned separately as `(layers, other)`.
pub fn weight_bytes_by_layer(file: &gguf::GgufFile) -> (Vec<u64>, u64) {
    let mut layers: Vec<u64> = Vec::new();
    let mut other = 0u64;
    for t in file.tensors() {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|n| n.parse::<usize>().ok());
        match layer {
            Some(i) if i < 100_000 => {
                if layers.len() <= i {
                    layers.resize(i + 1, 0);
                }
                layers[i] += t.size;
            }
            _ => other += t.size,
        }
    }
    (layers, other)
}

/// KV-cache bytes: keys and values for every layer, KV head, head dimension and position.
pub fn kv_cache_bytes(
    layers: u64,
    kv_heads: u64,
    head_dim: u64,
    context: u64,
    elem_bytes: u64,
) -> Result<u64> {
    [layers, kv_heads, head_dim, context, elem_bytes]
        .iter()
        .try_fold(2u64, |acc, &x| acc.checked_mul(x))
        .ok_or_else(|| GpuError::InvalidArgument("KV-cache size overflows".into()))
}

/// What a model needs, split by layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelNeeds {
    /// Weight bytes of each repeating layer.
    pub layer_weights: Vec<u64>,
    /// Weight bytes outside the layers (embeddings, output head, norms).
    pub other_weights: u64,
    /// KV-cache bytes per layer at the chosen context.
    pub kv_per_layer: u64,
    /// Activation and workspace bytes (from the graph planner when it exists).
    pub activations: u64,
}

impl ModelNeeds {
    /// Bytes for the first `gpu_layers` layers on the GPU, with the non-layer weights and
    /// activations.
    pub fn gpu_bytes(&self, gpu_layers: usize) -> u64 {
        let layers: u64 = self.layer_weights.iter().take(gpu_layers).sum();
        let kv = self
            .kv_per_layer
            .saturating_mul(gpu_layers.min(self.layer_weights.len()) as u64);
        layers
            .saturating_add(kv)
            .saturating_add(self.other_weights)
            .saturating_add(self.activations)
    }
}

impl ModelNeeds {
    /// Needs of a GGUF model at `context` positions with `kv_elem_bytes` per cached element
    /// (2 for f16). KV shape comes from `{arch}.block_count`, `attention.head_count_kv` (else
    /// `attention.head_count`) and `attention.key_length`/`value_length` (else
    /// `embedding_length / head_count`);
    /// sliding-window layers are counted at full context, an upper bound.
    pub fn from_gguf(
        file: &gguf::GgufFile,
        context: u64,
        kv_elem_bytes: u64,
        activations: u64,
    ) -> Result<Self> {
        let g = |e: gguf::GgufError| GpuError::Gguf(e.to_string());
        let blocks = file.arch_u32("block_count").map_err(g)? as u64;
        let heads = file.arch_u32("attention.head_count").map_err(g)? as u64;
        let kv_heads = file
            .arch_u32_opt("attention.head_count_kv")
            .map_err(g)?
            .map_or(heads, u64::from);
        let embd = file.arch_u32("embedding_length").map_err(g)? as u64;
        let fallback = embd.checked_div(heads).unwrap_or(0);
        let k_len = file
            .arch_u32_opt("attention.key_length")
            .map_err(g)?
            .map_or(fallback, u64::from);
        let v_len = file
            .arch_u32_opt("attention.value_length")
            .map_err(g)?
            .map_or(k_len, u64::from);
        // K and V may differ in width: average them into kv_cache_bytes' "2 x head_dim".
        let kv_per_layer = kv_cache_bytes(1, kv_heads, k_len + v_len, context, kv_elem_bytes)? / 2;
        let (mut layer_weights, other_weights) = weight_bytes_by_layer(file);
        layer_weights.resize(blocks as usize, 0);
        Ok(ModelNeeds {
            layer_weights,
            other_weights,
            kv_per_layer,
            activations,
        })
    }
}

/// Where the model runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Everything on GPU `device`.
    Gpu { device: i32, bytes: u64 },
    /// The first `gpu_layers` layers on GPU `device`, the rest on the CPU.
    Split {
        device: i32,
        gpu_layers: usize,
        bytes: u64,
    },
    /// Everything on the CPU.
    Cpu { reason: String },
}

/// Picks the device that fits the whole model (most room first), else the split with the most
/// GPU layers, else the CPU. `available` is `(ordinal, budget bytes available)` per device.
pub fn choose_placement(needs: &ModelNeeds, available: &[(i32, u64)]) -> Placement {
    let mut devs: Vec<(i32, u64)> = available.to_vec();
    devs.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    let all = needs.layer_weights.len();
    if let Some(&(device, _)) = devs.iter().find(|d| needs.gpu_bytes(all) <= d.1) {
        return Placement::Gpu {
            device,
            bytes: needs.gpu_bytes(all),
        };
    }
    let mut best: Option<(i32, usize)> = None;
    for &(device, avail) in &devs {
        let layers = (0..all).rev().find(|&l| needs.gpu_bytes(l) <= avail);
        if let Some(l) = layers.filter(|&l| l > 0) {
            if best.is_none_or(|(_, b)| l > b) {
                best = Some((device, l));
            }
        }
    }
    match best {
        Some((device, gpu_layers)) => Placement::Split {
            device,
            gpu_layers,
            bytes: needs.gpu_bytes(gpu_layers),
        },
        None if devs.is_empty() => Placement::Cpu {
            reason: "no GPU".into(),
        },
        None => Placement::Cpu {
            reason: format!(
                "not even one layer fits: {} bytes needed, {} available",
                needs.gpu_bytes(1),
                devs[0].1
            ),
        },
    }
}

/// Rounds a tensor's size up to the arena alignment.
pub fn padded(bytes: u64) -> Result<u64> {
    align_up(bytes, TENSOR_ALIGN)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn needs() -> ModelNeeds {
        ModelNeeds {
            layer_weights: vec![100; 10],
            other_weights: 50,
            kv_per_layer: 10,
            activations: 40,
        }
    }

    #[test]
    fn kv_cache_formula() {
        // Gemma 3 270M: 18 layers, 1 KV head, head dim 256, 4096 context, f16.
        assert_eq!(
            kv_cache_bytes(18, 1, 256, 4096, 2).unwrap(),
            2 * 18 * 256 * 4096 * 2
        );
        assert!(kv_cache_bytes(u64::MAX, 2, 1, 1, 1).is_err());
    }

    #[test]
    fn whole_model_goes_to_the_roomiest_gpu_that_fits() {
        let n = needs();
        assert_eq!(n.gpu_bytes(10), 1000 + 100 + 50 + 40);
        assert_eq!(
            choose_placement(&n, &[(0, 500), (1, 5000)]),
            Placement::Gpu {
                device: 1,
                bytes: 1190
            }
        );
    }

    #[test]
    fn too_small_gpu_gets_a_split() {
        let n = needs();
        // 600 bytes: 50 + 40 + 110 * l <= 600 -> l = 4.
        assert_eq!(
            choose_placement(&n, &[(0, 600)]),
            Placement::Split {
                device: 0,
                gpu_layers: 4,
                bytes: 530
            }
        );
    }

    #[test]
    fn nothing_fits_means_cpu() {
        assert!(matches!(
            choose_placement(&needs(), &[(0, 100)]),
            Placement::Cpu { .. }
        ));
        assert!(matches!(
            choose_placement(&needs(), &[]),
            Placement::Cpu { .. }
        ));
    }

    #[test]
    fn arena_padding_is_counted() {
        assert_eq!(arena_bytes(&[1, 1, 1], 1 << 30).unwrap(), 256 * 2 + 1);
    }

    #[test]
    fn gemma_weight_bytes_from_the_real_file() {
        let Ok(path) = std::env::var("ROCMFORGE_TEST_MODEL") else {
            println!("skipped: ROCMFORGE_TEST_MODEL not set");
            return;
        };
        let file = gguf::GgufFile::open(&path).expect("open the test model");
        let total = model_weight_bytes(&file);
        let (layers, other) = weight_bytes_by_layer(&file);
        assert_eq!(layers.len(), 18, "Gemma 3 270M has 18 layers");
        assert_eq!(layers.iter().sum::<u64>() + other, total);
        // Tensor data is the file minus its header, less at most the data-section padding.
        let data = file.file_size() - file.data_offset();
        assert!(
            total <= data && data - total < 32 * file.tensors().len() as u64,
            "{total} vs {data}"
        );
        let sizes: Vec<u64> = file.tensors().iter().map(|t| t.size).collect();
        assert!(arena_bytes(&sizes, 1 << 30).unwrap() >= total);
        // Gemma 3 270M: one KV head of width 256 for K and for V, 18 layers.
        let needs = ModelNeeds::from_gguf(&file, 4096, 2, 0).unwrap();
        assert_eq!(needs.kv_per_layer, 2 * 256 * 4096 * 2);
        assert_eq!(needs.layer_weights.len(), 18);
        assert_eq!(needs.gpu_bytes(18), total + 18 * needs.kv_per_layer);
        assert!(matches!(
            choose_placement(&needs, &[(0, 1 << 30)]),
            Placement::Gpu { device: 0, .. }
        ));
    }
}
