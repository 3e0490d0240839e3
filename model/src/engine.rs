//! What runs a session's graphs: the CPU executor, or (feature `hip`) the multi-device
//! scheduler over a GPU and the CPU with a `-ngl`-style layer split, and the choice between them.

use ggml_graph::{CpuBackend, Executor, Graph, GraphError, TensorId};

#[cfg(not(feature = "hip"))]
use crate::arch::KvCacheSpec;
use crate::error::ModelError;
#[cfg(not(feature = "hip"))]
use crate::session::SessionOptions;
use crate::session::{weight_views, DeviceMemory, DevicePlan, Model};

#[cfg(feature = "hip")]
pub(crate) use gpu::place;

/// The executor of a session.
pub(crate) enum Engine {
    /// Everything on the CPU, weights bound zero-copy from the mapped file.
    Cpu(Box<Executor>),
    /// Layers split between a GPU and the CPU.
    #[cfg(feature = "hip")]
    Gpu(Box<gpu::GpuEngine>),
}

impl Engine {
    /// Runs `graph`; equal `key`s promise identical graphs (the scheduler then reuses its
    /// schedule and memory plan).
    pub(crate) fn run(
        &mut self,
        key: Option<u64>,
        graph: &Graph,
        inputs: &[(TensorId, &[u8])],
    ) -> Result<(), GraphError> {
        match self {
            Self::Cpu(e) => {
                let _ = key;
                e.run(graph, inputs)
            }
            #[cfg(feature = "hip")]
            Self::Gpu(g) => g.sched.run_keyed(key, graph, inputs),
        }
    }

    /// Hands `f` an output's f32 values, in place where the executor can show them (a GPU's
    /// logits in the pinned memory their copy landed in).
    pub(crate) fn with_output_f32<R>(
        &self,
        id: TensorId,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, GraphError> {
        match self {
            Self::Cpu(e) => e.with_output_f32(id, f),
            #[cfg(feature = "hip")]
            Self::Gpu(g) => g.sched.with_output_f32(id, f),
        }
    }

    /// Sets the CPU mat-mul column layout of the next passes (see
    /// [`CpuBackend::set_column_layout`]); the GPU's products have no such orders.
    pub(crate) fn set_column_layout(&self, layout: Option<Vec<(u32, u32)>>) {
        match self {
            Self::Cpu(e) => e.backend().set_column_layout(layout),
            #[cfg(feature = "hip")]
            Self::Gpu(_) => {
                let _ = layout;
            }
        }
    }

    /// Turns GPU graph capture of repeated decode steps on or off (no effect on the CPU).
    pub(crate) fn set_graph_capture(&mut self, on: bool) {
        match self {
            Self::Cpu(_) => {
                let _ = on;
            }
            #[cfg(feature = "hip")]
            Self::Gpu(g) => g.sched.set_graph_capture(on),
        }
    }

    /// True when the last decode step's graph is held captured for replay.
    pub(crate) fn has_captured_graph(&self) -> bool {
        match self {
            Self::Cpu(_) => false,
            #[cfg(feature = "hip")]
            Self::Gpu(g) => g.sched.has_captured_graph(),
        }
    }

    /// Runs the graph optimizer as far as the engine's devices take its output.
    pub(crate) fn optimize(&self, g: &mut Graph) {
        match self {
            Self::Cpu(_) => {
                ggml_graph::opt::optimize(g);
            }
            #[cfg(feature = "hip")]
            Self::Gpu(e) => gpu::optimize(g, e.fuse),
        }
    }

    /// GPU memory in use and where the last pass ran; `None` on the CPU.
    pub(crate) fn device_memory(&self) -> Option<DeviceMemory> {
        match self {
            Self::Cpu(_) => None,
            #[cfg(feature = "hip")]
            Self::Gpu(g) => Some(g.memory()),
        }
    }

    /// The GPU's device-to-device copy bandwidth (bytes read + written per second) over two
    /// buffers of at most 1 GiB that the budget has room for; `None` on the CPU.
    pub(crate) fn gpu_copy_bandwidth(&self) -> Option<Result<f64, ModelError>> {
        match self {
            Self::Cpu(_) => None,
            #[cfg(feature = "hip")]
            Self::Gpu(g) => Some(g.copy_bandwidth()),
        }
    }
}

/// The CPU executor: every tensor bound zero-copy, the arena sized for the unoptimized graph
/// `worst` of the largest batch (optimized here), with `reason` in its plan.
fn cpu_only(
    model: &Model,
    backend: CpuBackend,
    worst: Graph,
    reason: String,
) -> Result<(Engine, DevicePlan), ModelError> {
    let mut worst = worst;
    ggml_graph::opt::optimize(&mut worst);
    let mut exec = Executor::new(backend);
    for (name, dtype, dims, bytes) in weight_views(model)? {
        exec.bind_weight(&name, dtype, &dims, bytes)?;
    }
    exec.reserve(&worst)?;
    let plan = DevicePlan::cpu(model.config().n_layer, reason);
    Ok((Engine::Cpu(Box::new(exec)), plan))
}

/// Without the `hip` feature every session runs on the CPU.
#[cfg(not(feature = "hip"))]
pub(crate) fn place(
    model: &Model,
    opts: &SessionOptions,
    _kv: &KvCacheSpec,
    worst: Graph,
    backend: CpuBackend,
    _progress: &mut dyn FnMut(u64, u64),
) -> Result<(Engine, DevicePlan), ModelError> {
    use crate::placement::DeviceChoice;
    let reason = match opts.device {
        DeviceChoice::Gpu if opts.n_gpu_layers != Some(0) => {
            return Err(ModelError::Device(
                "this build has no GPU support (feature `hip`)".into(),
            ))
        }
        DeviceChoice::Cpu => "--device cpu",
        _ => "built without GPU support",
    };
    cpu_only(model, backend, worst, reason.into())
}

#[cfg(feature = "hip")]
mod gpu {
    use std::sync::Arc;

    use ggml_graph::backend::{CpuDevice, Device};
    use ggml_graph::hip::HipDevice;
    use ggml_graph::sched::PlacementRule;
    use ggml_graph::{CpuBackend, Graph, Op, Scheduler};

    use super::{cpu_only, Engine};
    use crate::arch::KvCacheSpec;
    use crate::error::ModelError;
    use crate::placement::{fit_layers, layer_of, mib, weights_by_layer, DeviceChoice};
    use crate::placement::{LayerSplit, Needs};
    use crate::placement::{CPU, GPU};
    use crate::session::{DeviceMemory, DevicePlan, Model, SessionOptions};

    /// A scheduler over `[GPU, CPU]` with the model's weights bound and the GPU's share uploaded.
    pub(crate) struct GpuEngine {
        pub(crate) sched: Scheduler,
        hip: Arc<HipDevice>,
        /// Whether graphs keep the optimizer's fused nodes (only when the GPU runs them all).
        pub(crate) fuse: bool,
    }

    impl GpuEngine {
        /// See `Engine::gpu_copy_bandwidth`. Below 64 MiB per buffer the copies would mostly
        /// measure the L2 cache.
        pub(crate) fn copy_bandwidth(&self) -> Result<f64, ModelError> {
            const MIN: u64 = 64 << 20;
            let dev = self.hip.gpu();
            let free = dev.budget().available();
            let bytes = (1u64 << 30).min(free / 4);
            if bytes < MIN {
                return Err(ModelError::Device(format!(
                    "no room to measure the copy bandwidth: {} free in the GPU budget, {} needed",
                    mib(free),
                    mib(2 * MIN)
                )));
            }
            gpu_mem::bandwidth::copy_bandwidth(dev, bytes as usize, 20).map_err(|source| {
                ModelError::Gpu {
                    op: "copy bandwidth",
                    source,
                }
            })
        }

        pub(crate) fn memory(&self) -> DeviceMemory {
            let usage = self.sched.usage();
            let gpu = usage.get(GPU).copied().unwrap_or_default();
            let (mut gpu_nodes, mut cpu_nodes) = (0, 0);
            if let Some(s) = self.sched.last_schedule() {
                for (d, ids) in &s.splits {
                    if *d == GPU {
                        gpu_nodes += ids.len();
                    } else {
                        cpu_nodes += ids.len();
                    }
                }
            }
            DeviceMemory {
                allocated: self.hip.gpu().tracker().live_bytes(),
                weights: gpu.weights,
                kv: gpu.persistent,
                activations: gpu.arena,
                gpu_nodes,
                cpu_nodes,
                copies: self.sched.copies_made(),
            }
        }
    }

    fn is_fused(op: &Op) -> bool {
        matches!(
            op,
            Op::RmsNormMul { .. } | Op::MulMatAdd | Op::MulMatGated(_)
        )
    }

    /// The optimizer without fusion when the GPU lacks kernels for fused nodes: a fused node
    /// the GPU cannot run would go to the CPU with a copy each way, in every layer. Fused GPU
    /// graphs also fold Gemma's query scale into the attention.
    pub(super) fn optimize(g: &mut Graph, fuse: bool) {
        if fuse {
            ggml_graph::opt::optimize(g);
            ggml_graph::opt::fold_query_scale(g);
        } else {
            ggml_graph::opt::eliminate_common(g);
            ggml_graph::opt::fold_views(g);
        }
    }

    /// True when the GPU runs every fused node the optimizer makes of `worst`.
    fn gpu_runs_fused_nodes(hip: &HipDevice, worst: &Graph) -> bool {
        // ROCMFORGE_GPU_FUSE=0 keeps the GPU graph unfused, to tell a fused kernel's numerics or
        // speed from the plain ops' (as ROCMFORGE_GPU_GROUP=0 does for launch groups).
        if std::env::var("ROCMFORGE_GPU_FUSE").is_ok_and(|v| v == "0") {
            return false;
        }
        let mut g = worst.clone();
        ggml_graph::opt::optimize(&mut g);
        let nodes = g.tensors();
        let needed = ggml_graph::plan::needed_nodes(&g);
        nodes.iter().enumerate().all(|(i, t)| {
            if !needed[i] || !is_fused(&t.op) {
                return true;
            }
            let srcs: Vec<_> = t.src.iter().map(|s| &nodes[s.index()]).collect();
            hip.supports_op(t, &srcs)
        })
    }

    /// The HIP backend's workspace for `n_batch` tokens (see [`HipDevice::workspace_bytes`]),
    /// with the weights of the repeating layers and, when `head`, of the output head too.
    fn workspace(model: &Model, n_batch: usize, head: bool) -> u64 {
        let cfg = model.config();
        let weights = model
            .file()
            .tensors()
            .iter()
            .filter(|t| head || layer_of(&t.name).is_some())
            .map(|t| t.dims.as_slice());
        HipDevice::workspace_bytes(weights, n_batch, cfg.n_embd, cfg.n_vocab)
    }

    /// What the GPU part of a session needs: weights by layer, KV rows per layer, the
    /// planner's activation arena for the worst-case batch, and the backend's workspace.
    fn needs(model: &Model, kv: &KvCacheSpec, n_batch: usize, activations: u64) -> Needs {
        let cfg = model.config();
        let sizes = model
            .file()
            .tensors()
            .iter()
            .map(|t| (t.name.as_str(), t.size));
        let (layer_weights, other_weights) = weights_by_layer(sizes, cfg.n_layer);
        Needs {
            layer_weights,
            other_weights,
            kv_per_layer: kv.bytes(cfg).checked_div(cfg.n_layer).unwrap_or(0) as u64,
            activations,
            workspace_layers: workspace(model, n_batch, false),
            workspace_head: workspace(model, n_batch, true),
        }
    }

    /// Chooses the device and layer split and builds the engine that runs it. `worst` is the
    /// unoptimized graph of the largest batch.
    pub(crate) fn place(
        model: &Model,
        opts: &SessionOptions,
        kv: &KvCacheSpec,
        worst: Graph,
        backend: CpuBackend,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Engine, DevicePlan), ModelError> {
        let n_layer = model.config().n_layer;
        if opts.device == DeviceChoice::Cpu {
            return cpu_only(model, backend, worst, "--device cpu".into());
        }
        if opts.n_gpu_layers == Some(0) {
            return cpu_only(model, backend, worst, "-ngl 0".into());
        }
        let hip = match open_gpu(opts.gpu_mem_limit) {
            Ok(h) => h,
            Err(e) if opts.device == DeviceChoice::Auto => {
                tracing::info!("no GPU, running on the CPU: {e}");
                return cpu_only(model, backend, worst, format!("no GPU: {e}"));
            }
            Err(e) => return Err(e),
        };
        let fuse = gpu_runs_fused_nodes(&hip, &worst);
        let stack = hip.set_stack(opts.gpu_stack);
        tracing::debug!("gpu decode stack {stack}");
        let mut g = worst;
        optimize(&mut g, fuse);
        let available = hip.gpu().budget().available();
        let activations = ggml_graph::plan::plan(&g).peak as u64;
        let n_batch = g
            .tensors()
            .iter()
            .find(|t| t.name == "tokens")
            .map_or(1, |t| t.ne[0]);
        let needs = needs(model, kv, n_batch, activations);
        let (ngl, reason) = match opts.n_gpu_layers {
            Some(n) => (n, format!("-ngl {n}")),
            None => {
                let n = fit_layers(&needs, available);
                (
                    n,
                    format!("--device {}: as many layers as fit", opts.device),
                )
            }
        };
        let split = LayerSplit::new(n_layer, ngl);
        if split.is_cpu_only() {
            let why = format!(
                "not even one layer fits the GPU: {} needed, {} available",
                mib(needs.gpu_estimate(&LayerSplit::new(n_layer, 1)).total()),
                mib(available)
            );
            if opts.device == DeviceChoice::Gpu {
                return Err(ModelError::Device(why));
            }
            return cpu_only(model, backend, g, why);
        }
        let plan = DevicePlan {
            device: hip.name().to_string(),
            split,
            estimate: needs.gpu_estimate(&split),
            available: Some(available),
            reason: format!("{reason}{}", if fuse { "" } else { "; unfused graph" }),
        };
        // Device order is the placement's: GPU first, then the CPU.
        const { assert!(GPU == 0 && CPU == 1) };
        let devices: Vec<Arc<dyn Device>> =
            vec![hip.clone(), Arc::new(CpuDevice::new(Arc::new(backend)))];
        let mut sched = Scheduler::new(devices)?;
        for (name, dtype, dims, bytes) in crate::session::weight_views(model)? {
            sched.bind_weight(&name, dtype, &dims, bytes)?;
        }
        let rule: PlacementRule = Arc::new(move |name: &str| split.device_of(name));
        sched.set_placement(rule);
        sched.upload_placed_weights(progress)?;
        let engine = GpuEngine { sched, hip, fuse };
        Ok((Engine::Gpu(Box::new(engine)), plan))
    }

    /// Opens GPU 0 with its budget capped at `limit` bytes (when given).
    fn open_gpu(limit: Option<u64>) -> Result<Arc<HipDevice>, ModelError> {
        let hip = HipDevice::new(0)?;
        if let Some(l) = limit {
            let b = hip.gpu().budget();
            b.set_limit(b.limit().min(l));
        }
        Ok(Arc::new(hip))
    }
}
