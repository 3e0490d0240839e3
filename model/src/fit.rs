//! The placement of a model under a GPU memory budget and the bytes behind it, computed as a
//! session computes them but without uploading or running anything (`rocmforge fit`).

use std::fmt;

use ggml_graph::Device;

use crate::arch::{build_forward, BatchSpec, KvCacheSpec, LogitsMode};
use crate::error::ModelError;
use crate::placement::{mib, GpuEstimate, LayerSplit, Needs};
use crate::session::{KvPlan, Model, SessionOptions};

/// The GPU to plan for.
#[derive(Clone, Debug, PartialEq)]
pub enum FitTarget {
    /// GPU 0 as the session would open it (its free memory, `gpu_mem_limit`, the measured
    /// runtime context).
    Device,
    /// A GPU budget of this many bytes, planned without a device: the runtime context's share
    /// is unknown and not counted.
    Budget {
        /// Bytes the placement may use.
        available: u64,
        /// What the budget was made of (printed).
        note: String,
    },
}

/// A fit: the split a session would choose and the bytes on each side.
#[derive(Clone, Debug, PartialEq)]
pub struct FitReport {
    /// The GPU's name, or what was assumed.
    pub device: String,
    /// Context and tokens of the largest batch planned for.
    pub n_ctx: usize,
    /// Tokens of the largest batch.
    pub n_batch: usize,
    /// The split (all on the CPU when not even one layer fits).
    pub split: LayerSplit,
    /// Why this split.
    pub reason: String,
    /// GPU bytes of the split.
    pub estimate: GpuEstimate,
    /// The bytes behind the estimate.
    pub needs: Needs,
    /// The GPU budget planned against.
    pub available: u64,
    /// The runtime context and handles: measured on the device, `None` without one.
    pub runtime: Option<u64>,
    /// What the budget was made of, without a device.
    pub note: Option<String>,
    /// The KV cache (every layer).
    pub kv: KvPlan,
}

/// Plans `model` under `opts` (context, batch, KV type, `-ngl`, device options) for `target`,
/// on one GPU (the multi-GPU split is not planned here).
pub fn fit(
    model: &Model,
    opts: &SessionOptions,
    target: &FitTarget,
) -> Result<FitReport, ModelError> {
    let cfg = model.config();
    let n_ctx = if opts.n_ctx == 0 {
        cfg.n_ctx_train
    } else {
        opts.n_ctx
    };
    if n_ctx > cfg.n_ctx_train || opts.n_batch == 0 {
        return Err(ModelError::InvalidArgument(format!(
            "context {n_ctx} (at most {}) and batch {} (at least 1)",
            cfg.n_ctx_train, opts.n_batch
        )));
    }
    let kv = KvCacheSpec {
        dtype: opts.kv_type,
        n_ctx,
    };
    let n_batch = opts.n_batch.min(n_ctx);
    // The session's worst case: a full batch at the end of the context.
    let worst = BatchSpec {
        n_tok: n_batch,
        n_past: n_ctx - n_batch,
        logits: LogitsMode::Last,
    };
    let mut g = build_forward(cfg, model.weights(), &kv, worst)?.graph;
    let (device, available, runtime, note, sms) = match target {
        FitTarget::Device => {
            // The GPU a session alone would use (`--main-gpu` among the allowed ones).
            let count = ggml_graph::hip::device_count();
            let ordinals = if count == 0 {
                vec![0]
            } else {
                opts.gpus.ordinals(count)?
            };
            let ordinal = ordinals[opts.gpus.single().min(ordinals.len().saturating_sub(1))];
            let hip = crate::engine::open_gpu(opts, ordinal)?;
            let fuse = opts.gpu_fuse && crate::engine::gpu_runs_fused_nodes(&hip, &g);
            crate::engine::optimize(&mut g, fuse, None);
            (
                hip.name().to_string(),
                hip.placeable_bytes(),
                Some(hip.runtime_bytes()),
                None,
                hip.multiprocessors(),
            )
        }
        FitTarget::Budget { available, note } => {
            crate::engine::optimize(&mut g, opts.gpu_fuse, None);
            (
                "planned without a GPU".to_string(),
                *available,
                None,
                Some(note.clone()),
                0,
            )
        }
    };
    let f = crate::engine::split_for(model, opts, &kv, None, &g, available, sms)?;
    let (split, reason, estimate) = match f.gpu {
        Some((split, reason, _, estimate)) => (split, reason, estimate),
        None => (
            LayerSplit::new(cfg.n_layer, 0),
            f.reason,
            GpuEstimate::default(),
        ),
    };
    Ok(FitReport {
        device,
        n_ctx,
        n_batch: f.n_batch,
        split,
        reason,
        estimate,
        needs: f.needs,
        available,
        runtime,
        note,
        kv: KvPlan::of(&kv, cfg),
    })
}

impl FitReport {
    /// Backend workspace in the estimate (the rest of its activations term is the planner's
    /// arena).
    pub fn workspace(&self) -> u64 {
        if self.split.is_cpu_only() {
            return 0;
        }
        self.estimate
            .activations
            .saturating_sub(self.needs.activations)
    }

    /// The estimate plus the runtime's share: what the process holds on the card.
    pub fn process_total(&self) -> u64 {
        self.estimate
            .total()
            .saturating_add(self.runtime.unwrap_or(0))
    }
}

impl fmt::Display for FitReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.split;
        writeln!(
            f,
            "device: {}; context {}, batch {}",
            self.device, self.n_ctx, self.n_batch
        )?;
        writeln!(
            f,
            "layers on GPU: {}/{}{}, output head on {} ({})",
            s.gpu_layers(),
            s.n_layer,
            if s.output_on_gpu() { " + output" } else { "" },
            if s.output_on_gpu() { "GPU" } else { "CPU" },
            self.reason
        )?;
        writeln!(f, "{}", self.kv)?;
        writeln!(f, "GPU bytes:")?;
        let e = &self.estimate;
        let rows = [
            ("weights", e.weights),
            ("KV cache", e.kv),
            (
                "activations (planner peak)",
                self.needs.activations * u64::from(!s.is_cpu_only()),
            ),
            ("backend workspace", self.workspace()),
            ("total allocated", e.total()),
        ];
        for (what, b) in rows {
            writeln!(f, "  {what:<28} {:>14}", mib(b))?;
        }
        match self.runtime {
            Some(r) => {
                writeln!(
                    f,
                    "  {:<28} {:>14} (measured; {} more kept free for their growth)",
                    "runtime context, handles",
                    mib(r),
                    mib(ggml_graph::RUNTIME_GROWTH)
                )?;
                writeln!(
                    f,
                    "  {:<28} {:>14}",
                    "process total",
                    mib(self.process_total())
                )?;
            }
            None => writeln!(
                f,
                "  {:<28} {:>14} (unknown without a GPU: not counted)",
                "runtime context, handles", "?"
            )?,
        }
        write!(f, "  {:<28} {:>14}", "budget", mib(self.available))?;
        if let Some(n) = &self.note {
            write!(f, " ({n})")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::SynthOptions;

    fn model() -> Model {
        let dir = std::env::temp_dir().join(format!("rocmforge-fit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("llama-tiny.gguf");
        let o = SynthOptions::parse("llama", "tiny", "q4_k_m", 5).expect("options");
        crate::synth::write(&o, None, &path).expect("write");
        Model::load(&path, |_, _| {}).expect("load")
    }

    #[test]
    fn fit_without_a_gpu_adds_up_and_shrinks_with_the_budget() {
        let m = model();
        let opts = SessionOptions {
            n_ctx: 1024,
            n_batch: 64,
            ..SessionOptions::default()
        };
        let budget = |available: u64| FitTarget::Budget {
            available,
            note: "test".into(),
        };
        let all = fit(&m, &opts, &budget(1 << 40)).expect("fit");
        let n_layer = m.config().n_layer;
        assert_eq!(all.split.n_gpu_layers, n_layer + 1);
        let weights: u64 = m.file().tensors().iter().map(|t| t.size).sum();
        assert_eq!(all.estimate.weights, weights);
        assert_eq!(all.estimate.kv, all.kv.bytes);
        assert_eq!(
            all.estimate.total(),
            all.estimate.weights + all.kv.bytes + all.needs.activations + all.workspace()
        );
        assert!(all.workspace() > 0 && all.needs.activations > 0);
        assert!(all.runtime.is_none());
        let text = all.to_string();
        assert!(text.contains("unknown without a GPU"), "{text}");
        // One byte short of the whole model: the head goes back to the CPU.
        let less = fit(&m, &opts, &budget(all.estimate.total() - 1)).expect("fit");
        assert!(less.split.n_gpu_layers <= n_layer);
        assert!(less.estimate.total() < all.estimate.total());
        // Nothing fits: all on the CPU, with the reason.
        let none = fit(&m, &opts, &budget(1)).expect("fit");
        assert!(none.split.is_cpu_only());
        assert!(
            none.reason.contains("not even one layer"),
            "{}",
            none.reason
        );
        // q8_0 KV: 17/32 of the f16 cache's bytes.
        let q8 = SessionOptions {
            kv_type: crate::arch::KvType::Q8_0,
            ..opts.clone()
        };
        let q = fit(&m, &q8, &budget(1 << 40)).expect("fit q8_0");
        assert_eq!(q.kv.bytes * 32, all.kv.bytes * 17);
    }
}
