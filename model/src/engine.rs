//! What runs a session's graphs: one multi-device scheduler, over the CPU alone, over a GPU
//! and the CPU with a `-ngl`-style layer split, or over several GPUs (and the CPU) with a layer
//! split ([`crate::gpus`]); or a scheduler per GPU for a tensor split run as ranks
//! ([`crate::ranks`]); and the choice between them. Builds without the
//! `hip` feature go the same way: their HIP backend never opens, which reads as "no GPU".

use std::sync::Arc;

use ggml_graph::backend::{CpuDevice, Device};
use ggml_graph::hip::HipDevice;
use ggml_graph::sched::PlacementRule;
use ggml_graph::{CpuBackend, Graph, GraphError, Scheduler, TensorId};

use crate::arch::KvCacheSpec;
use crate::error::ModelError;
use crate::placement::LayerSplit;
use crate::ranks::{RankGraph, Ranks};
use crate::session::{weight_views, DeviceMemory, DevicePlan, KvPlan, Model, SessionOptions};

pub(crate) use gpu::{gpu_runs_fused_nodes, open_gpu, optimize, place, split_for};

/// The executor of a session: a scheduler over its devices (with a tensor split run as ranks,
/// rank 0's, the other ranks' in `ranks`).
pub(crate) struct Engine {
    sched: Scheduler,
    /// Ranks 1.. of a tensor split run as ranks.
    ranks: Option<Ranks>,
    /// The GPU (the scheduler's first device) when layers run there; `None`: the CPU alone.
    hip: Option<Arc<HipDevice>>,
    /// Every GPU, in the scheduler's order (the CPU follows them); empty on the CPU alone.
    gpus: Vec<Arc<HipDevice>>,
    /// The CPU backend, whose thread pool a CPU-only run enters once.
    cpu: Arc<CpuBackend>,
    /// Whether GPU graphs keep the optimizer's fused nodes (only when the GPU runs them all).
    fuse: bool,
    /// Which layers run on the GPU.
    split: LayerSplit,
    /// A tensor split over the GPUs: graphs keep each GPU's partial results apart.
    tensor: bool,
    /// With a tensor split, the model whose weight table holds the GPUs' slices (see
    /// [`Engine::take_split_model`]).
    split_model: Option<Model>,
}

impl Engine {
    /// Runs `graph`; equal `key`s promise identical graphs (the scheduler then reuses its
    /// schedule and memory plan). With ranks, `graph` is rank 0's and `build` makes the same
    /// pass's graph for the other ranks' models (kept per key).
    pub(crate) fn run(
        &mut self,
        key: Option<u64>,
        graph: &Graph,
        inputs: &[(TensorId, &[u8])],
        build: RankGraph<'_>,
    ) -> Result<(), ModelError> {
        let sched = &mut self.sched;
        if let Some(ranks) = &mut self.ranks {
            return ranks.run(sched, key, graph, inputs, build);
        }
        if self.hip.is_some() {
            return Ok(sched.run_keyed(key, graph, inputs)?);
        }
        // One entry into the pool for the whole run: every node's launch runs inside it then,
        // instead of entering it once per node.
        Ok(self.cpu.install(|| sched.run_keyed(key, graph, inputs))?)
    }

    /// Hands `f` an output's f32 values, in place where the executor can show them (the CPU's
    /// arena, a GPU's logits in the pinned memory their copy landed in).
    pub(crate) fn with_output_f32<R>(
        &self,
        id: TensorId,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, GraphError> {
        self.sched.with_output_f32(id, f)
    }

    /// Sets the CPU mat-mul column layout of the next passes (see
    /// [`CpuBackend::set_column_layout`]) where the CPU runs alone; the GPU's products have no
    /// such orders.
    pub(crate) fn set_column_layout(&self, layout: Option<Vec<(u32, u32)>>) {
        if self.hip.is_none() {
            self.cpu.set_column_layout(layout);
        }
    }

    /// Turns GPU graph capture of repeated decode steps on or off (the CPU records no launches).
    pub(crate) fn set_graph_capture(&mut self, on: bool) {
        self.sched.set_graph_capture(on);
        if let Some(r) = &mut self.ranks {
            r.set_graph_capture(on);
        }
    }

    /// True when the last decode step's graph is held captured for replay.
    pub(crate) fn has_captured_graph(&self) -> bool {
        self.sched.has_captured_graph()
    }

    /// Runs so far that replayed captured GPU launches.
    pub(crate) fn replays(&self) -> u64 {
        self.sched.replays()
    }

    /// True when a GPU runs layers of the model.
    pub(crate) fn on_gpu(&self) -> bool {
        self.hip.is_some()
    }

    /// Runs the graph optimizer as far as the engine's devices take its output.
    pub(crate) fn optimize(&self, g: &mut Graph) {
        match &self.hip {
            None => {
                ggml_graph::opt::optimize(g);
            }
            // A decode layer fused into one node would run on one GPU: not with a tensor split.
            Some(_) if self.tensor => gpu::optimize(g, self.fuse, None),
            Some(hip) => gpu::optimize(g, self.fuse, Some((hip, &self.split))),
        }
    }

    /// With a tensor split, the model the session must build its graphs from (its weight
    /// table names each GPU's slices and carries the split); `None` otherwise.
    pub(crate) fn take_split_model(&mut self) -> Option<Model> {
        self.split_model.take()
    }

    /// The KV cache's persistent buffers created so far: name and bytes per row (position).
    pub(crate) fn kv_buffers(&self) -> Vec<(String, usize)> {
        let others = self.ranks.iter().flat_map(|r| r.schedulers());
        std::iter::once(&self.sched)
            .chain(others)
            .flat_map(|s| s.persistent_leaves())
            .map(|(name, dtype, ne)| (name, ggml_graph::tensor::row_bytes(dtype, ne[0])))
            .collect()
    }

    /// The scheduler holding KV buffer `name`: with ranks, that of the rank it is a part of.
    fn kv_home(&self, name: &str) -> &Scheduler {
        let rank = crate::arch::part_of(name).unwrap_or(0);
        (self.ranks.as_ref())
            .and_then(|r| r.scheduler(rank))
            .unwrap_or(&self.sched)
    }

    /// Copies bytes of a KV buffer to the host (from a GPU through gpu-mem's stream).
    pub(crate) fn read_kv(
        &self,
        name: &str,
        offset: usize,
        out: &mut [u8],
    ) -> Result<(), GraphError> {
        self.kv_home(name).read_persistent(name, offset, out)
    }

    /// Writes bytes into a KV buffer, before the next pass's work.
    pub(crate) fn write_kv(
        &self,
        name: &str,
        offset: usize,
        data: &[u8],
    ) -> Result<(), GraphError> {
        self.kv_home(name).write_persistent(name, offset, data)
    }

    /// GPU memory in use and where the last pass ran; `None` on the CPU.
    pub(crate) fn device_memory(&self) -> Option<DeviceMemory> {
        self.hip.as_ref()?;
        let Some(ranks) = &self.ranks else {
            return Some(gpu::memory(&self.sched, &self.gpus));
        };
        let scheds = std::iter::once(&self.sched).chain(ranks.schedulers());
        let parts = scheds
            .zip(&self.gpus)
            .map(|(s, g)| gpu::memory(s, std::slice::from_ref(g)));
        let mut all = parts.reduce(|a, m| DeviceMemory {
            allocated: a.allocated + m.allocated,
            weights: a.weights + m.weights,
            kv: a.kv + m.kv,
            activations: a.activations + m.activations,
            gpu_nodes: a.gpu_nodes + m.gpu_nodes,
            cpu_nodes: a.cpu_nodes + m.cpu_nodes,
            copies: a.copies + m.copies,
            runtime: (
                a.runtime.0 + m.runtime.0,
                a.runtime.1.zip(m.runtime.1).map(|(x, y)| x + y),
            ),
            by_tag: Vec::new(),
        })?;
        all.by_tag = gpu::by_tag(&self.gpus);
        Some(all)
    }

    /// The GPU's device-to-device copy bandwidth (bytes read + written per second) over two
    /// buffers of at most 1 GiB that the budget has room for; `None` on the CPU.
    pub(crate) fn gpu_copy_bandwidth(&self) -> Option<Result<f64, ModelError>> {
        self.hip.as_ref().map(|h| gpu::copy_bandwidth(h))
    }
}

/// A KV pool whose size the placement picks: at least `min_blocks` (one whole sequence), at most
/// `max_blocks` (every sequence at full length), as many as the GPU budget leaves room for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KvPool {
    /// Positions per block.
    pub block_size: usize,
    /// Blocks the pool needs at least.
    pub min_blocks: usize,
    /// Blocks the pool never exceeds.
    pub max_blocks: usize,
}

impl KvPool {
    /// Blocks for a GPU part whose estimate with `min_blocks` left `spare` bytes of the budget,
    /// each block taking `block_bytes` on the GPU: the minimum plus what fits, capped.
    pub(crate) fn blocks(&self, spare: u64, block_bytes: u64) -> usize {
        let extra = spare.checked_div(block_bytes).unwrap_or(u64::MAX);
        let room = self.max_blocks.saturating_sub(self.min_blocks) as u64;
        self.min_blocks + extra.min(room) as usize
    }
}

/// The CPU alone: every weight bound zero-copy, the arena sized for the unoptimized graph `worst`
/// of the largest batch (optimized here), with `reason` in its plan.
fn cpu_only(
    model: &Model,
    opts: &SessionOptions,
    kv: &KvCacheSpec,
    backend: CpuBackend,
    worst: Graph,
    reason: String,
) -> Result<(Engine, DevicePlan), ModelError> {
    let mut worst = worst;
    ggml_graph::opt::optimize(&mut worst);
    let cpu = Arc::new(backend);
    let devices: Vec<Arc<dyn Device>> = vec![Arc::new(CpuDevice::new(cpu.clone()))];
    let mut sched = Scheduler::with_options(devices, opts.scheduler)?;
    for (name, dtype, dims, bytes) in weight_views(model)? {
        sched.bind_weight(&name, dtype, &dims, bytes)?;
    }
    // Placed on the CPU, the weights are bound where they are (the mapped file), not copied.
    let rule: PlacementRule = Arc::new(|_: &str| Some(0));
    sched.set_placement(rule);
    sched.upload_placed_weights(&mut |_, _| {})?;
    sched.reserve(&worst)?;
    let plan = DevicePlan::cpu(
        model.config().n_layer,
        KvPlan::of(kv, model.config()),
        reason,
    );
    let engine = Engine {
        sched,
        ranks: None,
        hip: None,
        gpus: Vec::new(),
        cpu,
        fuse: true,
        split: plan.split,
        tensor: false,
        split_model: None,
    };
    Ok((engine, plan))
}

mod gpu {
    use std::sync::Arc;

    use ggml_graph::backend::{Collective, CpuDevice, Device};
    use ggml_graph::hip::{HipCollective, HipDevice};
    use ggml_graph::sched::PlacementRule;
    use ggml_graph::{CpuBackend, Graph, Leaf, Op, Scheduler, Tensor};

    use super::{cpu_only, Engine, KvPool};
    use crate::arch::KvCacheSpec;
    use crate::error::ModelError;
    use crate::gpus::{fit_multi, GpuShare, MultiSplit, SplitMode};
    use crate::placement::{fit_layers, layer_of, mib, weights_by_layer, DeviceChoice};
    use crate::placement::{GpuEstimate, CPU, GPU};
    use crate::placement::{LayerSplit, Needs};
    use crate::session::KvPlan;
    use crate::session::{DeviceMemory, DevicePlan, Model, SessionOptions};

    /// See `Engine::gpu_copy_bandwidth`. Below 64 MiB per buffer the copies would mostly
    /// measure the L2 cache.
    pub(super) fn copy_bandwidth(hip: &HipDevice) -> Result<f64, ModelError> {
        const MIN: u64 = 64 << 20;
        let free = hip.budget_available();
        let bytes = (1u64 << 30).min(free / 4);
        if bytes < MIN {
            return Err(ModelError::Device(format!(
                "no room to measure the copy bandwidth: {} free in the GPU budget, {} needed",
                mib(free),
                mib(2 * MIN)
            )));
        }
        hip.copy_bandwidth(bytes as usize, 20)
            .map_err(ModelError::from)
    }

    /// GPU memory in use (summed over the GPUs) and where the last pass ran.
    pub(super) fn memory(sched: &Scheduler, gpus: &[Arc<HipDevice>]) -> DeviceMemory {
        let usage = sched.usage();
        // The GPUs are the scheduler's first devices.
        const { assert!(GPU == 0) };
        let on_gpus = &usage[..gpus.len().min(usage.len())];
        let (mut gpu_nodes, mut cpu_nodes) = (0, 0);
        if let Some(s) = sched.last_schedule() {
            for (d, ids) in &s.splits {
                if *d < gpus.len() {
                    gpu_nodes += ids.len();
                } else {
                    cpu_nodes += ids.len();
                }
            }
        }
        DeviceMemory {
            allocated: gpus.iter().map(|h| h.allocated_bytes()).sum(),
            weights: on_gpus.iter().map(|u| u.weights).sum(),
            kv: on_gpus.iter().map(|u| u.persistent).sum(),
            activations: on_gpus.iter().map(|u| u.arena).sum(),
            gpu_nodes,
            cpu_nodes,
            copies: sched.copies_made(),
            runtime: (
                gpus.iter().map(|h| h.runtime_bytes()).sum(),
                gpus.iter().map(|h| h.runtime_bytes_now()).sum(),
            ),
            by_tag: by_tag(gpus),
        }
    }

    /// Every GPU's allocations summed by tag over the GPUs, largest first.
    pub(super) fn by_tag(gpus: &[Arc<HipDevice>]) -> Vec<(String, u64)> {
        let mut sum: Vec<(String, u64)> = Vec::new();
        for (tag, bytes) in gpus.iter().flat_map(|h| h.allocated_by_tag()) {
            match sum.iter_mut().find(|(t, _)| *t == tag) {
                Some(e) => e.1 += bytes,
                None => sum.push((tag, bytes)),
            }
        }
        sum.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        sum
    }

    fn is_fused(op: &Op) -> bool {
        matches!(
            op,
            Op::RmsNormMul { .. } | Op::MulMatAdd | Op::MulMatGated(_) | Op::MoeSum
        )
    }

    /// The optimizer without fusion when the GPU lacks kernels for fused nodes: a fused node
    /// the GPU cannot run would go to the CPU with a copy each way, in every layer. Fused GPU
    /// graphs also fold Gemma's query scale into the attention, and (given the GPU and the
    /// split) whole decode layers on the GPU into the nodes it runs as one kernel.
    pub(crate) fn optimize(g: &mut Graph, fuse: bool, layers: Option<(&HipDevice, &LayerSplit)>) {
        if fuse {
            ggml_graph::opt::optimize(g);
            ggml_graph::opt::fold_query_scale(g);
            if let Some((hip, split)) = layers {
                ggml_graph::opt::fuse_decode_layers(g, &|t, srcs| {
                    // Weights of no layer (Llama 3.1's `rope_freqs`) go where their readers
                    // run; only a layer weight the split keeps on the CPU rules the layer out.
                    let on_gpu = srcs
                        .iter()
                        .filter(|s| s.op == Op::Leaf(Leaf::Weight))
                        .all(|s| split.device_of(&s.name) != Some(CPU));
                    on_gpu && hip.supports_op(t, srcs)
                });
            }
        } else {
            ggml_graph::opt::eliminate_common(g);
            ggml_graph::opt::fold_views(g);
        }
    }

    /// True when the GPU runs every fused node the optimizer makes of `worst`.
    pub(crate) fn gpu_runs_fused_nodes(hip: &HipDevice, worst: &Graph) -> bool {
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

    /// The HIP backend's workspace for the optimized graph `g` of the largest batch (see
    /// [`HipDevice::workspace_for`]): with only the repeating layers on the GPU (the head's
    /// nodes on the CPU, `n_batch` activation rows crossing over) or with everything there.
    fn workspace(
        model: &Model,
        g: &Graph,
        n_batch: usize,
        attn_dec: bool,
        head: bool,
        sms: usize,
    ) -> ggml_graph::hip::Workspace {
        let on_gpu = |_: &Tensor, srcs: &[&Tensor]| {
            head || srcs
                .iter()
                .filter(|s| s.op == Op::Leaf(Leaf::Weight))
                .all(|s| layer_of(&s.name).is_some())
        };
        let copy_rows = if head { 0 } else { n_batch };
        HipDevice::workspace_for(g, &on_gpu, attn_dec, copy_rows, model.config().n_embd, sms)
    }

    /// What the GPU part of a session needs: weights by layer, KV rows per layer, the
    /// planner's activation arena for the worst-case batch, and the backend's workspace for it
    /// on a GPU of `sms` multiprocessors (0: unknown).
    fn needs(
        opts: &SessionOptions,
        model: &Model,
        kv: &KvCacheSpec,
        g: &Graph,
        n_batch: usize,
        activations: u64,
        sms: usize,
    ) -> Needs {
        let cfg = model.config();
        let sizes = model
            .file()
            .tensors()
            .iter()
            .map(|t| (t.name.as_str(), t.size));
        let (layer_weights, other_weights) = weights_by_layer(sizes, cfg.n_layer);
        let layers = workspace(model, g, n_batch, opts.hip.attn_dec, false, sms);
        let head = workspace(model, g, n_batch, opts.hip.attn_dec, true, sms);
        tracing::debug!(
            ?layers,
            ?head,
            activations,
            n_batch,
            "GPU workspace estimate"
        );
        Needs {
            layer_weights,
            other_weights,
            kv_per_layer: kv.bytes(cfg).checked_div(cfg.n_layer).unwrap_or(0) as u64,
            activations,
            workspace_layers: layers.total(),
            workspace_head: head.total(),
        }
    }

    /// Chooses the device and layer split and builds the engine that runs it. `worst` is the
    /// unoptimized graph of the largest batch.
    /// With `pool`, `kv` is the pool at its largest (`pool.max_blocks`): the CPU keeps that
    /// size, the GPU part takes what its budget leaves (see [`KvPool`]); the plan's `kv` says
    /// which.
    pub(crate) fn place(
        model: &Model,
        opts: &SessionOptions,
        kv: &KvCacheSpec,
        pool: Option<KvPool>,
        worst: Graph,
        backend: CpuBackend,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Engine, DevicePlan), ModelError> {
        if opts.device == DeviceChoice::Cpu {
            return cpu_only(model, opts, kv, backend, worst, "--device cpu".into());
        }
        if opts.n_gpu_layers == Some(0) {
            return cpu_only(model, opts, kv, backend, worst, "-ngl 0".into());
        }
        // The GPUs the flags allow; the session opens the one it would use alone first.
        let count = ggml_graph::hip::device_count();
        let ordinals = if count == 0 {
            // Opening GPU 0 below reports why there is none.
            vec![0]
        } else {
            opts.gpus.ordinals(count)?
        };
        let layer_mode = opts.gpus.split_mode != Some(SplitMode::None);
        let first = if layer_mode && opts.gpus.wants_several() {
            ordinals[0]
        } else {
            ordinals[opts.gpus.single().min(ordinals.len() - 1)]
        };
        let hip = match open_gpu(opts, first) {
            Ok(h) => h,
            // A rank without its GPU would leave the other ranks waiting.
            Err(e) if opts.device == DeviceChoice::Auto && opts.gpus.dist.is_none() => {
                tracing::info!("no GPU, running on the CPU: {e}");
                return cpu_only(model, opts, kv, backend, worst, format!("no GPU: {e}"));
            }
            Err(e) => return Err(e),
        };
        let fuse = opts.gpu_fuse && gpu_runs_fused_nodes(&hip, &worst);
        let stack = hip.set_stack(opts.gpu_stack);
        tracing::debug!("gpu decode stack {stack}");
        let mut g = worst;
        optimize(&mut g, fuse, None);
        let available = hip.placeable_bytes();
        let fit = split_for(model, opts, kv, pool, &g, available, hip.multiprocessors())?;
        let n_layer = model.config().n_layer;
        // Several GPUs when the flags ask for them, or when the model does not fit this one.
        let several = layer_mode
            && ordinals.len() > 1
            && (opts.gpus.wants_several()
                || (opts.n_gpu_layers.is_none() && fit_layers(&fit.needs, available) <= n_layer));
        if opts.gpus.split_mode == Some(SplitMode::Tensor) && ordinals.len() == 1 {
            tracing::info!("--split-mode tensor with one GPU: the model runs on it whole");
        }
        let tensor_split = opts.gpus.split_mode == Some(SplitMode::Tensor) && ordinals.len() > 1;
        if opts.gpus.dist.is_some() || tensor_split || several {
            let kv_min = fit.kv_min;
            let parts = Parts {
                first: hip,
                ordinals: &ordinals,
                needs: &fit.needs,
                fuse,
                kv,
                kv_min: &kv_min,
                pool,
            };
            return match &opts.gpus.dist {
                Some(dist) => tensor_rank(model, opts, dist, parts, backend, progress),
                None if tensor_split => tensor(model, opts, parts, backend, progress),
                None => multi(model, opts, parts, g, backend, progress),
            };
        }
        let Some((split, reason, kv, estimate)) = fit.gpu else {
            if opts.device == DeviceChoice::Gpu {
                return Err(ModelError::Device(fit.reason));
            }
            return cpu_only(model, opts, kv, backend, g, fit.reason);
        };
        let plan = DevicePlan {
            device: hip.name().to_string(),
            split,
            estimate,
            available: Some(available),
            reason: format!("{reason}{}", if fuse { "" } else { "; unfused graph" }),
            kv: KvPlan::of(&kv, model.config()),
            runtime: Some(hip.runtime_bytes()),
            gpus: Vec::new(),
        };
        // Device order is the placement's: GPU first, then the CPU.
        const { assert!(GPU == 0 && CPU == 1) };
        let cpu = Arc::new(backend);
        let devices: Vec<Arc<dyn Device>> =
            vec![hip.clone(), Arc::new(CpuDevice::new(cpu.clone()))];
        let mut sched = Scheduler::with_options(devices, opts.scheduler)?;
        for (name, dtype, dims, bytes) in crate::session::weight_views(model)? {
            sched.bind_weight(&name, dtype, &dims, bytes)?;
        }
        let rule: PlacementRule = Arc::new(move |name: &str| split.device_of(name));
        sched.set_placement(rule);
        sched.upload_placed_weights(progress)?;
        let engine = Engine {
            sched,
            ranks: None,
            hip: Some(hip.clone()),
            gpus: vec![hip],
            cpu,
            fuse,
            split,
            tensor: false,
            split_model: None,
        };
        Ok((engine, plan))
    }

    /// What [`place`] found before it chose several GPUs.
    struct Parts<'a> {
        /// The GPU opened first (one of `ordinals`).
        first: Arc<HipDevice>,
        /// The GPUs to split over, in order.
        ordinals: &'a [usize],
        /// The session's needs with the KV cache at `kv_min` (the same on every GPU but for
        /// the layers).
        needs: &'a Needs,
        /// Whether graphs keep fused nodes.
        fuse: bool,
        /// The KV cache asked for (a sized pool at its largest).
        kv: &'a KvCacheSpec,
        /// The KV cache the needs count (a sized pool at its smallest).
        kv_min: &'a KvCacheSpec,
        /// The sized pool, if any.
        pool: Option<KvPool>,
    }

    /// Opens the GPUs of `ordinals` (`first` is open already) and lets each reach the others'
    /// memory.
    fn open_all(
        opts: &SessionOptions,
        first: &Arc<HipDevice>,
        ordinals: &[usize],
    ) -> Result<Vec<Arc<HipDevice>>, ModelError> {
        let mut gpus = Vec::with_capacity(ordinals.len());
        for &o in ordinals {
            if o as i32 == first.ordinal() {
                gpus.push(first.clone());
            } else {
                let h = open_gpu(opts, o)?;
                h.set_stack(opts.gpu_stack);
                gpus.push(h);
            }
        }
        for a in &gpus {
            for b in gpus.iter().filter(|b| b.ordinal() != a.ordinal()) {
                match a.enable_peer_access(b) {
                    Ok(true) => {}
                    Ok(false) => tracing::info!(
                        "{} cannot reach {} directly; copies between them are staged by the driver",
                        a.name(),
                        b.name()
                    ),
                    Err(e) => tracing::warn!("peer access {} -> {}: {e}", a.name(), b.name()),
                }
            }
        }
        Ok(gpus)
    }

    /// A layer split over several GPUs (and the CPU for layers that fit none): opens the other
    /// GPUs, lets each reach the others' memory, chooses the split, sizes a KV pool by what
    /// every GPU has left, and builds the engine.
    fn multi(
        model: &Model,
        opts: &SessionOptions,
        parts: Parts<'_>,
        worst: Graph,
        backend: CpuBackend,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Engine, DevicePlan), ModelError> {
        let Parts {
            first,
            ordinals,
            needs,
            fuse,
            kv,
            kv_min,
            pool,
        } = parts;
        let gpus = open_all(opts, &first, ordinals)?;
        let available: Vec<u64> = gpus.iter().map(|h| h.placeable_bytes()).collect();
        let ms = fit_multi(
            needs,
            &available,
            opts.gpus.tensor_split.as_deref(),
            opts.gpus.main_gpu,
            opts.n_gpu_layers,
        );
        let n_layer = ms.split.n_layer;
        if ms.split.is_cpu_only() {
            let why = format!(
                "not even one layer fits the GPUs: {} needed on one, {} available",
                mib(needs.gpu_estimate(&LayerSplit::new(n_layer, 1)).total()),
                available
                    .iter()
                    .map(|&a| mib(a))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if opts.device == DeviceChoice::Gpu {
                return Err(ModelError::Device(why));
            }
            return cpu_only(model, opts, kv, backend, worst, why);
        }
        let (kv, estimates) = pool_over_gpus(model, &ms, needs, &available, kv, kv_min, pool);
        let shares: Vec<GpuShare> = (0..ms.n_gpus())
            .map(|k| GpuShare {
                device: gpus[k].name().to_string(),
                layers: ms.range(k),
                output: k == ms.head && ms.split.output_on_gpu(),
                estimate: estimates[k],
                available: available[k],
            })
            .collect();
        let total = estimates
            .iter()
            .fold(GpuEstimate::default(), |a, e| GpuEstimate {
                weights: a.weights + e.weights,
                kv: a.kv + e.kv,
                activations: a.activations + e.activations,
            });
        let how = match (&opts.gpus.tensor_split, opts.n_gpu_layers) {
            (_, Some(n)) => format!("-ngl {n}"),
            (Some(ts), None) => format!("--tensor-split {ts:?}"),
            (None, None) => "layers in proportion to free memory".to_owned(),
        };
        let plan = DevicePlan {
            device: format!("{} GPUs", gpus.len()),
            split: ms.split,
            estimate: total,
            available: Some(available.iter().sum()),
            reason: format!(
                "split mode layer over GPUs {ordinals:?}, {how}{}",
                if fuse { "" } else { "; unfused graph" }
            ),
            kv: KvPlan::of(&kv, model.config()),
            runtime: Some(gpus.iter().map(|h| h.runtime_bytes()).sum()),
            gpus: shares,
        };
        let cpu = Arc::new(backend);
        let mut devices: Vec<Arc<dyn Device>> = Vec::with_capacity(gpus.len() + 1);
        for h in &gpus {
            devices.push(h.clone());
        }
        devices.push(Arc::new(CpuDevice::new(cpu.clone())));
        let mut sched = Scheduler::with_options(devices, opts.scheduler)?;
        for (name, dtype, dims, bytes) in crate::session::weight_views(model)? {
            sched.bind_weight(&name, dtype, &dims, bytes)?;
        }
        let split = ms.split;
        let rule: PlacementRule = Arc::new(move |name: &str| ms.device_of(name));
        sched.set_placement(rule);
        sched.upload_placed_weights(progress)?;
        let engine = Engine {
            sched,
            ranks: None,
            hip: Some(gpus[0].clone()),
            gpus,
            cpu,
            fuse,
            split,
            tensor: false,
            split_model: None,
        };
        Ok((engine, plan))
    }

    /// A tensor split over several GPUs (`--split-mode tensor`): every layer on every GPU, its
    /// heads and feed-forward columns divided among them (see [`crate::gpus::TensorSplit`]).
    /// Where every GPU gets heads and columns and the collective library loads, the GPUs run as
    /// ranks ([`crate::ranks`]): each holds a copy of the embeddings, norms and output head and
    /// runs its whole graph (captured for replay) with no copies between GPUs. Otherwise one
    /// scheduler runs the embeddings, norms, sums of the partial results and the output head on
    /// the main GPU. Sizes a KV pool by what every GPU has left for its heads' share of each
    /// block.
    fn tensor(
        model: &Model,
        opts: &SessionOptions,
        parts: Parts<'_>,
        backend: CpuBackend,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Engine, DevicePlan), ModelError> {
        let Parts {
            first,
            ordinals,
            needs,
            fuse,
            kv,
            kv_min,
            pool,
        } = parts;
        if let Some(n) = opts.n_gpu_layers {
            return Err(ModelError::InvalidArgument(format!(
                "-ngl {n} with --split-mode tensor: a tensor split puts every layer on every \
                 GPU; use --split-mode layer to keep layers on the CPU"
            )));
        }
        let gpus = open_all(opts, &first, ordinals)?;
        let available: Vec<u64> = gpus.iter().map(|h| h.placeable_bytes()).collect();
        let shares: Vec<f64> = match &opts.gpus.tensor_split {
            Some(s) => s.clone(),
            None => available.iter().map(|&a| a as f64).collect(),
        };
        let main = opts.gpus.main_gpu.unwrap_or(0);
        let ts = Arc::new(crate::tensor_split::plan(model, &shares, main)?);
        let cut = crate::tensor_split::split_weights(model, Arc::clone(&ts))?;
        let n = gpus.len();
        let ranked = if (0..n).all(|k| !ts.kv_heads[k].is_empty() && !ts.ff[k].is_empty()) {
            rank_collectives(&gpus, &opts.gpus.collectives)
        } else {
            None
        };
        // As ranks, each GPU holds its slices and a copy of every tensor not split.
        let weights: Vec<u64> = match ranked {
            Some(_) => {
                let mut b = vec![0u64; n];
                for (name, _, _, bytes) in &cut.views {
                    let len = bytes.bytes().len() as u64;
                    match crate::arch::part_of(name) {
                        Some(k) if k < n => b[k] += len,
                        Some(_) => {}
                        None => b.iter_mut().for_each(|x| *x += len),
                    }
                }
                b
            }
            None => cut.bytes.clone(),
        };
        let cfg = model.config();
        let n_kv = cfg.n_head_kv.max(1) as u64;
        // Each GPU holds its heads' share of every layer's KV rows.
        let kv_share = |spec: &KvCacheSpec, k: usize| {
            (spec.bytes(cfg) as u64).saturating_mul(ts.kv_heads[k].len() as u64) / n_kv
        };
        let estimate = |k: usize, spec: &KvCacheSpec| GpuEstimate {
            weights: weights[k],
            kv: kv_share(spec, k),
            activations: needs
                .activations
                .saturating_add(if ranked.is_some() || k == ts.main {
                    needs.workspace_head
                } else {
                    needs.workspace_layers
                }),
        };
        let kv = match pool {
            Some(p) => {
                let blocks = (0..n)
                    .filter(|&k| !ts.kv_heads[k].is_empty())
                    .map(|k| {
                        let block_bytes = kv_share(kv_min, k) / p.min_blocks.max(1) as u64;
                        let used = estimate(k, kv_min).total();
                        p.blocks(available[k].saturating_sub(used), block_bytes)
                    })
                    .min()
                    .unwrap_or(p.min_blocks);
                KvCacheSpec {
                    n_ctx: blocks * p.block_size,
                    ..*kv
                }
            }
            None => *kv,
        };
        let estimates: Vec<GpuEstimate> = (0..n).map(|k| estimate(k, &kv)).collect();
        if let Some(k) = (0..n).find(|&k| estimates[k].total() > available[k]) {
            return Err(ModelError::Device(format!(
                "--split-mode tensor: {} needs {} (weights {}, KV cache {}), {} available",
                gpus[k].name(),
                mib(estimates[k].total()),
                mib(estimates[k].weights),
                mib(estimates[k].kv),
                mib(available[k])
            )));
        }
        let n_layer = cfg.n_layer;
        let split = LayerSplit::new(n_layer, n_layer + 1);
        let shares_plan: Vec<GpuShare> = (0..n)
            .map(|k| GpuShare {
                device: gpus[k].name().to_string(),
                layers: 0..n_layer,
                output: ranked.is_some() || k == ts.main,
                estimate: estimates[k],
                available: available[k],
            })
            .collect();
        let total = estimates
            .iter()
            .fold(GpuEstimate::default(), |a, e| GpuEstimate {
                weights: a.weights + e.weights,
                kv: a.kv + e.kv,
                activations: a.activations + e.activations,
            });
        let heads: Vec<String> = (0..n)
            .map(|k| format!("{}/{}", ts.q_heads(k).len(), ts.ff[k].len()))
            .collect();
        let (collective, reduction) = match &ranked {
            Some(c) => (
                None,
                format!(
                    "as {n} ranks (a scheduler per GPU, the output head on each), partial sums \
                     by {} all-reduce",
                    c[0].name().split(" rank ").next().unwrap_or_default()
                ),
            ),
            None => collective(&gpus, &opts.gpus.collectives),
        };
        let plan = DevicePlan {
            device: format!("{n} GPUs"),
            split,
            estimate: total,
            available: Some(available.iter().sum()),
            reason: format!(
                "split mode tensor over GPUs {ordinals:?} (query heads/feed-forward columns \
                 per GPU {}), main GPU {}, {reduction}{}",
                heads.join(", "),
                ts.main,
                if fuse { "" } else { "; unfused graph" }
            ),
            kv: KvPlan::of(&kv, cfg),
            runtime: Some(gpus.iter().map(|h| h.runtime_bytes()).sum()),
            gpus: shares_plan,
        };
        let cpu = Arc::new(backend);
        if let Some(colls) = ranked {
            let engine = ranks_engine(opts, gpus, cpu, cut, colls, fuse, model, progress)?;
            return Ok((engine, plan));
        }
        let mut devices: Vec<Arc<dyn Device>> = Vec::with_capacity(n + 1);
        for h in &gpus {
            devices.push(h.clone());
        }
        devices.push(Arc::new(CpuDevice::new(cpu.clone())));
        let mut sched = Scheduler::with_options(devices, opts.scheduler)?;
        sched.set_collective(collective);
        for (name, dtype, dims, bytes) in cut.views {
            sched.bind_weight(&name, dtype, &dims, bytes)?;
        }
        let rule_split = Arc::clone(&ts);
        let rule: PlacementRule =
            Arc::new(move |name: &str| crate::tensor_split::device_of(&rule_split, name));
        sched.set_placement(rule);
        sched.upload_placed_weights(progress)?;
        let engine = Engine {
            sched,
            ranks: None,
            hip: Some(gpus[ts.main].clone()),
            gpus,
            cpu,
            fuse,
            split,
            tensor: true,
            split_model: Some(model.with_table(cut.table)),
        };
        Ok((engine, plan))
    }

    /// One collective per GPU of `gpus` (ranks of one communicator made here), unless
    /// collectives are off or the library does not load (warned once per process).
    fn rank_collectives(
        gpus: &[Arc<HipDevice>],
        opts: &ggml_graph::CollectiveOptions,
    ) -> Option<Vec<Arc<HipCollective>>> {
        if opts.off {
            return None;
        }
        match HipCollective::per_rank(gpus, opts) {
            Ok(c) => Some(c.into_iter().map(Arc::new).collect()),
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!(
                        "--split-mode tensor: no collective library ({e}); one scheduler over \
                         the GPUs"
                    )
                });
                None
            }
        }
    }

    /// The engine of a tensor split run as ranks: per GPU a scheduler over it (and the CPU)
    /// with its slices, a copy of every tensor not split, and its rank's collective.
    #[allow(clippy::too_many_arguments)]
    fn ranks_engine(
        opts: &SessionOptions,
        gpus: Vec<Arc<HipDevice>>,
        cpu: Arc<CpuBackend>,
        cut: crate::tensor_split::SplitWeights,
        colls: Vec<Arc<HipCollective>>,
        fuse: bool,
        model: &Model,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Engine, ModelError> {
        let n = gpus.len();
        let mut scheds = Vec::with_capacity(n);
        for (r, (gpu, coll)) in gpus.iter().zip(&colls).enumerate() {
            let mine = move |name: &str| crate::arch::part_of(name).is_none_or(|k| k == r);
            let devices: Vec<Arc<dyn Device>> =
                vec![gpu.clone(), Arc::new(CpuDevice::new(cpu.clone()))];
            let mut sched = Scheduler::with_options(devices, opts.scheduler)?;
            sched.set_collective(Some(coll.clone() as Arc<dyn Collective>));
            for (name, dtype, dims, bytes) in cut.views.iter().filter(|v| mine(&v.0)) {
                sched.bind_weight(name, *dtype, dims, bytes.clone())?;
            }
            sched.set_placement(Arc::new(move |name: &str| mine(name).then_some(0)));
            sched.upload_placed_weights(progress)?;
            scheds.push(sched);
        }
        let mut scheds = scheds.into_iter();
        let first = scheds
            .next()
            .ok_or_else(|| ModelError::InvalidArgument("a tensor split over no GPU".into()))?;
        let rest = scheds
            .enumerate()
            .map(|(i, sched)| crate::ranks::Rank {
                sched,
                model: model.with_table(cut.table.clone().for_rank(i + 1)),
            })
            .collect();
        let abort = colls.clone();
        let ranks = crate::ranks::Ranks::new(
            rest,
            Box::new(move |g: &mut Graph| optimize(g, fuse, None)),
            Box::new(move |why: &str| {
                for c in &abort {
                    c.abort(format!("another rank failed: {why}"));
                }
            }),
        );
        let n_layer = model.config().n_layer;
        Ok(Engine {
            sched: first,
            ranks: Some(ranks),
            hip: Some(gpus[0].clone()),
            gpus,
            cpu,
            fuse,
            split: LayerSplit::new(n_layer, n_layer + 1),
            tensor: true,
            split_model: Some(model.with_table(cut.table.for_rank(0))),
        })
    }

    /// One rank of a tensor split whose parts run in separate processes (`--dist-init`): this
    /// process's GPU holds its part of every layer (its heads, KV cache and feed-forward
    /// columns) plus a copy of everything not split (embeddings, norms, output head), and sums
    /// its partials with the other ranks' by NCCL/RCCL all-reduces, so every rank computes the
    /// same logits. The rendezvous at `dist.addr` hands rank 0's communicator id to the others;
    /// a watchdog aborts the communicator when a collective errs or outlives `dist.timeout`.
    fn tensor_rank(
        model: &Model,
        opts: &SessionOptions,
        dist: &crate::dist::DistSpec,
        parts: Parts<'_>,
        backend: CpuBackend,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<(Engine, DevicePlan), ModelError> {
        let Parts {
            first,
            needs,
            fuse,
            kv,
            pool,
            ..
        } = parts;
        if opts.n_gpu_layers.is_some() || pool.is_some() {
            return Err(ModelError::InvalidArgument(
                "--dist-init runs a tensor split over whole GPUs for one sequence: no -ngl, \
                 and not the batching engine yet"
                    .into(),
            ));
        }
        let (r, world) = (dist.rank, dist.world);
        let shares = opts
            .gpus
            .tensor_split
            .clone()
            .unwrap_or_else(|| vec![1.0; world]);
        if shares.len() != world {
            return Err(ModelError::InvalidArgument(format!(
                "--tensor-split gives {} shares for --world-size {world}",
                shares.len()
            )));
        }
        let ts = Arc::new(crate::tensor_split::plan(model, &shares, 0)?);
        if let Some(k) = (0..world).find(|&k| ts.kv_heads[k].is_empty() || ts.ff[k].is_empty()) {
            return Err(ModelError::InvalidArgument(format!(
                "--dist-init: rank {k} gets no attention heads or no feed-forward columns of \
                 this model ({:?}); use fewer ranks",
                *ts
            )));
        }
        let cut = crate::tensor_split::split_weights(model, Arc::clone(&ts))?;
        let mine = move |name: &str| crate::arch::part_of(name).is_none_or(|k| k == r);
        let views: Vec<_> = cut.views.into_iter().filter(|v| mine(&v.0)).collect();
        let cfg = model.config();
        let weights: u64 = views.iter().map(|v| v.3.bytes().len() as u64).sum();
        let kv_bytes = (kv.bytes(cfg) as u64).saturating_mul(ts.kv_heads[r].len() as u64)
            / cfg.n_head_kv.max(1) as u64;
        let estimate = GpuEstimate {
            weights,
            kv: kv_bytes,
            activations: needs.activations.saturating_add(needs.workspace_head),
        };
        let available = first.placeable_bytes();
        if estimate.total() > available {
            return Err(ModelError::Device(format!(
                "--dist-init rank {r}: {} needs {} (weights {}, KV cache {}), {} available",
                first.name(),
                mib(estimate.total()),
                mib(estimate.weights),
                mib(estimate.kv),
                mib(available)
            )));
        }
        let coll = HipCollective::for_rank(
            (0, first.clone()),
            r,
            world,
            &opts.gpus.collectives,
            &mut |id| dist.exchange(id, hip_id_bytes()).map_err(|e| e.to_string()),
        )?;
        let coll = Arc::new(coll);
        coll.watch(dist.timeout);
        let n_layer = cfg.n_layer;
        let split = LayerSplit::new(n_layer, n_layer + 1);
        let plan = DevicePlan {
            device: format!("rank {r} of {world}"),
            split,
            estimate,
            available: Some(available),
            reason: format!(
                "split mode tensor, rank {r} of {world} (rendezvous {}): query heads/feed-forward \
                 columns {}/{}, partial sums by {} all-reduce{}",
                dist.addr,
                ts.q_heads(r).len(),
                ts.ff[r].len(),
                coll.name(),
                if fuse { "" } else { "; unfused graph" }
            ),
            kv: KvPlan::of(kv, cfg),
            runtime: Some(first.runtime_bytes()),
            gpus: vec![GpuShare {
                device: first.name().to_string(),
                layers: 0..n_layer,
                output: true,
                estimate,
                available,
            }],
        };
        let cpu = Arc::new(backend);
        let devices: Vec<Arc<dyn Device>> =
            vec![first.clone(), Arc::new(CpuDevice::new(cpu.clone()))];
        let mut sched = Scheduler::with_options(devices, opts.scheduler)?;
        sched.set_collective(Some(coll));
        for (name, dtype, dims, bytes) in views {
            sched.bind_weight(&name, dtype, &dims, bytes)?;
        }
        sched.set_placement(Arc::new(move |name: &str| mine(name).then_some(0)));
        sched.upload_placed_weights(progress)?;
        let engine = Engine {
            sched,
            ranks: None,
            hip: Some(first.clone()),
            gpus: vec![first],
            cpu,
            fuse,
            split,
            tensor: true,
            split_model: Some(model.with_table(cut.table.for_rank(r))),
        };
        Ok((engine, plan))
    }

    /// Bytes of a collective library's communicator id.
    fn hip_id_bytes() -> usize {
        128
    }

    /// What sums a tensor split's partial results over `gpus` (the scheduler's first devices):
    /// the platform's collective library, all-reducing in place on every GPU, or (where it is
    /// off or does not load; warned once per process) peer copies to the main GPU; with the
    /// words the device plan says it in.
    fn collective(
        gpus: &[Arc<HipDevice>],
        opts: &ggml_graph::CollectiveOptions,
    ) -> (Option<Arc<dyn Collective>>, String) {
        const PEER: &str = "partial sums by peer copies to the main GPU";
        if gpus.len() < 2 {
            return (None, "one GPU".to_owned());
        }
        if opts.off {
            return (None, format!("{PEER} (collectives off)"));
        }
        let ranks: Vec<(usize, Arc<HipDevice>)> = gpus.iter().cloned().enumerate().collect();
        match HipCollective::new(&ranks, opts) {
            Ok(c) => {
                let how = format!("partial sums by {} all-reduce on every GPU", c.name());
                (Some(Arc::new(c)), how)
            }
            Err(e) => {
                static WARNED: std::sync::Once = std::sync::Once::new();
                WARNED.call_once(|| {
                    tracing::warn!("--split-mode tensor: no collective library ({e}); {PEER}")
                });
                (None, format!("{PEER} (no collective library: {e})"))
            }
        }
    }

    /// The KV cache of a split over GPUs and each GPU's estimate with it: `kv` as asked, or a
    /// sized pool with as many blocks as the fullest GPU leaves room for (every block holds
    /// every layer, so each GPU stores its layers' share of each block).
    fn pool_over_gpus(
        model: &Model,
        ms: &MultiSplit,
        needs: &Needs,
        available: &[u64],
        kv: &KvCacheSpec,
        kv_min: &KvCacheSpec,
        pool: Option<KvPool>,
    ) -> (KvCacheSpec, Vec<GpuEstimate>) {
        let Some(p) = pool else {
            return (*kv, ms.estimates(needs));
        };
        let cfg = model.config();
        let n_layer = ms.split.n_layer.max(1);
        let layer_block = (kv_min.bytes(cfg) / n_layer) as u64 / p.min_blocks.max(1) as u64;
        let blocks = ms
            .estimates(needs)
            .iter()
            .zip(available)
            .enumerate()
            .map(|(k, (e, &a))| {
                let block_bytes = layer_block * ms.range(k).len() as u64;
                p.blocks(a.saturating_sub(e.total()), block_bytes)
            })
            .min()
            .unwrap_or(p.min_blocks);
        let kv = KvCacheSpec {
            n_ctx: blocks * p.block_size,
            ..*kv
        };
        let sized = Needs {
            kv_per_layer: (kv.bytes(cfg) / n_layer) as u64,
            ..needs.clone()
        };
        (kv, ms.estimates(&sized))
    }

    /// What the GPU part of a placement comes to: the split, why, the KV cache (a sized pool
    /// grown to what the budget leaves) and the estimate; `gpu: None` with the reason when not
    /// even one layer fits.
    pub(crate) struct SplitFit {
        /// `(split, reason, KV cache, estimate)`.
        pub gpu: Option<(LayerSplit, String, KvCacheSpec, GpuEstimate)>,
        /// Why no layer goes to the GPU (when `gpu` is `None`).
        pub reason: String,
        /// The bytes behind the estimate (the pool at its minimum).
        pub needs: Needs,
        /// Tokens of the largest batch.
        pub n_batch: usize,
        /// The KV cache the needs count (a sized pool at its smallest).
        pub kv_min: KvCacheSpec,
    }

    /// The split and estimate for the optimized graph `g` of the largest batch under
    /// `available` GPU bytes on a GPU of `sms` multiprocessors (0: unknown): the arithmetic of
    /// [`place`], without a device.
    pub(crate) fn split_for(
        model: &Model,
        opts: &SessionOptions,
        kv: &KvCacheSpec,
        pool: Option<KvPool>,
        g: &Graph,
        available: u64,
        sms: usize,
    ) -> Result<SplitFit, ModelError> {
        let n_layer = model.config().n_layer;
        let activations = ggml_graph::sched::planned_peak(g) as u64;
        let n_batch = g
            .tensors()
            .iter()
            .find(|t| t.name == "tokens")
            .map_or(1, |t| t.ne[0]);
        // A sized pool is placed at its minimum; what the split leaves of the budget grows it.
        let kv_min = match pool {
            Some(p) => KvCacheSpec {
                n_ctx: p.min_blocks * p.block_size,
                ..*kv
            },
            None => *kv,
        };
        let needs = needs(opts, model, &kv_min, g, n_batch, activations, sms);
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
            return Ok(SplitFit {
                gpu: None,
                reason: why,
                needs,
                n_batch,
                kv_min,
            });
        }
        let (kv, estimate) = match pool {
            Some(p) => {
                let est = needs.gpu_estimate(&split);
                let block_bytes = (kv_min.bytes(model.config()) / n_layer.max(1)) as u64
                    / p.min_blocks.max(1) as u64
                    * split.gpu_layers() as u64;
                let blocks = p.blocks(available.saturating_sub(est.total()), block_bytes);
                let kv = KvCacheSpec {
                    n_ctx: blocks * p.block_size,
                    ..*kv
                };
                let sized = Needs {
                    kv_per_layer: (kv.bytes(model.config()) / n_layer.max(1)) as u64,
                    ..needs.clone()
                };
                (kv, sized.gpu_estimate(&split))
            }
            None => (*kv, needs.gpu_estimate(&split)),
        };
        Ok(SplitFit {
            gpu: Some((split, reason, kv, estimate)),
            reason: String::new(),
            needs,
            n_batch,
            kv_min,
        })
    }

    /// Opens GPU `ordinal` with the session's backend options, its budget capped at the
    /// session's limit (when given).
    pub(crate) fn open_gpu(
        opts: &SessionOptions,
        ordinal: usize,
    ) -> Result<Arc<HipDevice>, ModelError> {
        let ordinal = i32::try_from(ordinal)
            .map_err(|_| ModelError::InvalidArgument(format!("GPU {ordinal}")))?;
        let hip = HipDevice::with_options(ordinal, opts.hip)?;
        if let Some(l) = opts.gpu_mem_limit {
            // The limit bounds what the process holds on the card, the runtime's own share
            // included.
            hip.cap_budget(l.saturating_sub(hip.runtime_bytes()));
        }
        Ok(Arc::new(hip))
    }
}

#[cfg(test)]
mod tests {
    use super::KvPool;

    #[test]
    fn a_sized_pool_takes_the_spare_budget_between_its_bounds() {
        let p = KvPool {
            block_size: 16,
            min_blocks: 8,
            max_blocks: 64,
        };
        // 1000 spare bytes at 100 per block: 10 more than the minimum.
        assert_eq!(p.blocks(1000, 100), 18);
        assert_eq!(p.blocks(99, 100), 8);
        assert_eq!(p.blocks(1 << 40, 100), 64);
        // No KV on the GPU (every layer on the CPU): the largest pool.
        assert_eq!(p.blocks(0, 0), 64);
    }
}
