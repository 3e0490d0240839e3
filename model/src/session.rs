//! A loaded model and inference sessions over it: weights bound zero-copy from the mapped file
//! (or uploaded to a GPU), a persistent KV cache, chunked prompt processing and token-by-token
//! decoding.
//!
//! A session runs on the CPU executor, or with feature `hip` on the scheduler over a GPU and the
//! CPU with the layers split as [`crate::placement`] decides (`--device`, `-ngl`, the GPU's free
//! memory). The graphs built by [`crate::arch`] are the same either way.

use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use ggml_graph::{CpuBackend, DType, HipOptions, SchedulerOptions, WeightBytes};
use gguf::GgufFile;

use crate::arch::{
    build_forward, BatchSpec, ForwardGraph, KvCacheSpec, KvType, LogitsMode, WeightTable,
};
use crate::config::ModelConfig;
use crate::engine::Engine;
use crate::error::ModelError;
use crate::placement::{mib, DeviceChoice, GpuEstimate, LayerSplit};

/// The mapped file as a shared byte owner for [`WeightBytes`].
struct FileBytes(Arc<GgufFile>);

impl AsRef<[u8]> for FileBytes {
    fn as_ref(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// How a model file is opened.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadOptions {
    /// Map the file (the default: weights are read on demand and shared with the page cache).
    /// A mapped file must not be truncated or rewritten while the model is in use (the process
    /// would die of SIGBUS or compute with the new bytes); `false` reads it into memory instead.
    pub mmap: bool,
}

impl Default for LoadOptions {
    fn default() -> Self {
        Self { mmap: true }
    }
}

/// A model file opened for inference: configuration and tensor table; weights stay in the map.
#[derive(Debug, Clone)]
pub struct Model {
    file: Arc<GgufFile>,
    cfg: ModelConfig,
    weights: WeightTable,
}

impl Model {
    /// Opens and validates a GGUF model. `progress(done, total)` is called while the weight pages
    /// are read in (so the first tokens do not pay for page faults).
    pub fn load(
        path: impl AsRef<Path>,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        Self::load_with(path, &LoadOptions::default(), progress)
    }

    /// [`Model::load`] with options (`mmap: false` reads the file into memory).
    pub fn load_with(
        path: impl AsRef<Path>,
        opts: &LoadOptions,
        mut progress: impl FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        let path = path.as_ref();
        let open = || -> Result<Self, ModelError> {
            let file = if opts.mmap {
                GgufFile::open(path)?
            } else {
                GgufFile::read(path)?
            };
            Self::from_file(Arc::new(file))
        };
        let model = open().map_err(|e| e.in_file(path))?;
        let total: u64 = model.file.tensors().iter().map(|t| t.size).sum();
        if !opts.mmap {
            progress(total, total);
            return Ok(model);
        }
        let mut done = 0u64;
        for t in model.file.tensors() {
            let data = model.file.tensor_data(t);
            let mut acc = 0u8;
            for chunk in data.chunks(4096) {
                acc ^= chunk[0];
            }
            std::hint::black_box(acc);
            done += t.size;
            progress(done, total);
        }
        Ok(model)
    }

    /// A model over an already opened file.
    pub fn from_file(file: Arc<GgufFile>) -> Result<Self, ModelError> {
        let embd = file
            .tensor("token_embd.weight")
            .ok_or_else(|| ModelError::MissingTensor("token_embd.weight".into()))?;
        let n_vocab = embd.dims.get(1).copied().unwrap_or(0) as usize;
        let cfg = ModelConfig::from_metadata(file.metadata(), n_vocab)?;
        let weights = WeightTable::from_infos(file.tensors());
        crate::arch::validate::validate_weights(&cfg, &weights)?;
        // One dry build of a decode graph (no memory touched) finds a missing or misshapen
        // tensor now, as llama.cpp's loader does, rather than at the first forward pass.
        let kv = KvCacheSpec {
            dtype: KvType::F16,
            n_ctx: 1,
        };
        let batch = BatchSpec {
            n_tok: 1,
            n_past: 0,
            logits: LogitsMode::Last,
        };
        build_forward(&cfg, &weights, &kv, batch)?;
        Ok(Self { file, cfg, weights })
    }

    /// The parsed file.
    pub fn file(&self) -> &Arc<GgufFile> {
        &self.file
    }

    /// Hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Tensor shapes by name.
    pub fn weights(&self) -> &WeightTable {
        &self.weights
    }

    /// This model with another weight table (a tensor split's, with each GPU's slices).
    pub(crate) fn with_table(&self, weights: WeightTable) -> Model {
        Model {
            weights,
            ..self.clone()
        }
    }
}

/// Most CPU threads a session accepts: far above any core count this runs on, low enough that
/// a typo cannot start thousands of threads.
pub const MAX_THREADS: usize = 512;

/// Settings of an inference session.
#[derive(Clone, Debug, PartialEq)]
pub struct SessionOptions {
    /// Context length (KV cache positions); 0 means the model's trained maximum.
    pub n_ctx: usize,
    /// KV cache element type.
    pub kv_type: KvType,
    /// Largest number of prompt tokens per forward pass.
    pub n_batch: usize,
    /// CPU threads (0: all cores).
    pub n_threads: usize,
    /// Where to run.
    pub device: DeviceChoice,
    /// llama.cpp's `-ngl`: the last N repeating layers on the GPU (N > layers: the output head
    /// too); `None`: as many as fit the GPU's budget.
    pub n_gpu_layers: Option<usize>,
    /// Caps the GPU memory the session may use (bytes), below the budget from free memory
    /// (on each GPU of a split).
    pub gpu_mem_limit: Option<u64>,
    /// Which GPUs, and how layers spread over several ([`crate::gpus`]).
    pub gpus: crate::gpus::GpuSelection,
    /// Runs whole llama-family decode layers as one persistent GPU kernel per step where the
    /// device (cooperative launches: NVIDIA's own kernel on compute capability 8.0 and later,
    /// the portable one elsewhere, see `hip.stack_kernel`) and the layers (Q4_K weights with Q6_K
    /// v and down allowed, head size 128) fit it; `hip.stack` off vetoes it. On by default: on
    /// an H100 it decodes the 8B Q4_K_M shape about 5% faster than the per-op kernels.
    pub gpu_stack: bool,
    /// Keeps the optimizer's fused nodes in GPU graphs where the GPU runs all of them (the
    /// default); false runs the plain ops, to tell a fused kernel's numerics or speed from theirs.
    pub gpu_fuse: bool,
    /// The HIP backend's switches.
    pub hip: HipOptions,
    /// The scheduler's switches (graph capture, host-mapped outputs).
    pub scheduler: SchedulerOptions,
}

impl Default for SessionOptions {
    fn default() -> Self {
        Self {
            n_ctx: 4096,
            kv_type: KvType::F16,
            n_batch: 512,
            n_threads: 0,
            device: DeviceChoice::Auto,
            n_gpu_layers: None,
            gpu_mem_limit: None,
            gpus: crate::gpus::GpuSelection::default(),
            gpu_stack: true,
            gpu_fuse: true,
            hip: HipOptions::default(),
            scheduler: SchedulerOptions::default(),
        }
    }
}

/// Where a session's layers run and what the GPU part was estimated to need.
#[derive(Clone, Debug, PartialEq)]
pub struct DevicePlan {
    /// The GPU's name, or `cpu`.
    pub device: String,
    /// The layer split (all on the CPU when no GPU is used).
    pub split: LayerSplit,
    /// Estimated GPU bytes of the split.
    pub estimate: GpuEstimate,
    /// Bytes the GPU budget allowed at session creation.
    pub available: Option<u64>,
    /// Why this plan (device choice, fit, `-ngl`, missing GPU).
    pub reason: String,
    /// The KV cache of every layer, wherever it lives.
    pub kv: KvPlan,
    /// Device bytes of the GPU runtime's context and library handles (measured when the
    /// process opened the device; counted against `--gpu-mem-limit`); `None`: no GPU, or not
    /// measured.
    pub runtime: Option<u64>,
    /// Each GPU's part when the layers are split over several (empty otherwise).
    pub gpus: Vec<crate::gpus::GpuShare>,
}

/// The KV cache a session or engine holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvPlan {
    /// Element type.
    pub dtype: KvType,
    /// Positions (tokens) it holds, per layer.
    pub positions: usize,
    /// Bytes of all layers.
    pub bytes: u64,
    /// The batching engine's block size (its pool holds `positions / block_size` blocks).
    pub block_size: Option<usize>,
}

impl KvPlan {
    /// The plan of a contiguous cache of `kv`'s shape for `cfg`.
    pub fn of(kv: &KvCacheSpec, cfg: &crate::config::ModelConfig) -> Self {
        Self {
            dtype: kv.dtype,
            positions: kv.n_ctx,
            bytes: kv.bytes(cfg) as u64,
            block_size: None,
        }
    }
}

impl fmt::Display for KvPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KV cache: {} positions", self.positions)?;
        if let Some(bs) = self.block_size {
            write!(f, " ({} blocks of {bs})", self.positions / bs.max(1))?;
        }
        write!(f, ", {}, {}", self.dtype, mib(self.bytes))?;
        if self.dtype != KvType::F16 {
            // What the default type would take, so the saving (or the cost) is visible.
            let f16 = self.bytes as u128 * KvType::F16.row_bytes(256) as u128
                / self.dtype.row_bytes(256) as u128;
            write!(f, " (f16: {})", mib(f16 as u64))?;
        }
        Ok(())
    }
}

impl DevicePlan {
    pub(crate) fn cpu(n_layer: usize, kv: KvPlan, reason: String) -> Self {
        Self {
            device: "cpu".into(),
            split: LayerSplit::new(n_layer, 0),
            estimate: GpuEstimate::default(),
            available: None,
            reason,
            kv,
            runtime: None,
            gpus: Vec::new(),
        }
    }

    /// True when some layers run on a GPU.
    pub fn uses_gpu(&self) -> bool {
        !self.split.is_cpu_only()
    }
}

impl fmt::Display for DevicePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = &self.split;
        if !self.uses_gpu() {
            return write!(
                f,
                "device: cpu; all {} layers on the CPU ({})\n{}",
                s.n_layer, self.reason, self.kv
            );
        }
        let gpu_range = if s.gpu_layers() == 0 {
            String::new()
        } else {
            format!(" (blk.{}..{})", s.first_gpu_layer(), s.n_layer - 1)
        };
        write!(
            f,
            "device: {}; layers on GPU: {}/{}{}{}, on CPU: {}; output head on {} ({})\n\
             estimated GPU bytes: weights {}, KV cache {}, activations+workspace {}, total {}",
            self.device,
            s.gpu_layers(),
            s.n_layer,
            gpu_range,
            if s.output_on_gpu() { " + output" } else { "" },
            s.n_layer - s.gpu_layers(),
            if s.output_on_gpu() { "GPU" } else { "CPU" },
            self.reason,
            mib(self.estimate.weights),
            mib(self.estimate.kv),
            mib(self.estimate.activations),
            mib(self.estimate.total()),
        )?;
        if let Some(a) = self.available {
            write!(f, " of {} available", mib(a))?;
        }
        if let Some(r) = self.runtime {
            write!(
                f,
                "; runtime context and handles {} (measured), {} more kept free for their growth",
                mib(r),
                mib(ggml_graph::RUNTIME_GROWTH)
            )?;
        }
        for g in &self.gpus {
            write!(f, "\n  {g}")?;
        }
        write!(f, "\n{}", self.kv)
    }
}

/// GPU memory a session holds, measured, and where the last pass ran.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceMemory {
    /// Every live allocation on the device (the `gpu-mem` tracker: weights, KV cache,
    /// activations, scratch and staging).
    pub allocated: u64,
    /// Weight bytes held by the scheduler on the GPU.
    pub weights: u64,
    /// KV-cache bytes on the GPU.
    pub kv: u64,
    /// Activation arena bytes on the GPU.
    pub activations: u64,
    /// Nodes of the last pass launched on the GPU.
    pub gpu_nodes: usize,
    /// Nodes of the last pass launched on the CPU.
    pub cpu_nodes: usize,
    /// Tensors copied between the devices so far.
    pub copies: usize,
    /// The runtime's share of the GPUs (context, library handles) as measured at open, and as
    /// it stands now (`None` where the driver cannot say).
    pub runtime: (u64, Option<u64>),
    /// The allocations summed by what their owners named them, largest first (what
    /// `allocated` is made of, as the allocator tracks it).
    pub by_tag: Vec<(String, u64)>,
}

impl fmt::Display for DeviceMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "GPU memory allocated: {} (weights {}, KV cache {}, activations {}, other {})",
            mib(self.allocated),
            mib(self.weights),
            mib(self.kv),
            mib(self.activations),
            mib(self
                .allocated
                .saturating_sub(self.weights + self.kv + self.activations)),
        )?;
        write!(
            f,
            "; last pass: {} nodes on the GPU, {} on the CPU; {} cross-device copies so far",
            self.gpu_nodes, self.cpu_nodes, self.copies
        )?;
        write!(f, "; runtime share {} at open", mib(self.runtime.0))?;
        if let Some(now) = self.runtime.1 {
            write!(f, ", {} now", mib(now))?;
        }
        if !self.by_tag.is_empty() {
            write!(f, "\n  allocated by owner:")?;
            for (i, (tag, bytes)) in self.by_tag.iter().enumerate() {
                let sep = if i == 0 { " " } else { ", " };
                write!(f, "{sep}{tag} {}", mib(*bytes))?;
            }
        }
        Ok(())
    }
}

/// A tensor as `(name, type, dims, zero-copy bytes of the map)`.
pub(crate) type WeightView = (String, DType, Vec<usize>, WeightBytes);

/// Every tensor of the model.
pub(crate) fn weight_views(model: &Model) -> Result<Vec<WeightView>, ModelError> {
    let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = Arc::new(FileBytes(Arc::clone(model.file())));
    let base = model.file().data_offset() as usize;
    model
        .file()
        .tensors()
        .iter()
        .map(|t| {
            let start = base + t.offset as usize;
            let bytes = WeightBytes::new(Arc::clone(&owner), start..start + t.size as usize)?;
            let dims: Vec<usize> = t.dims.iter().map(|&d| d as usize).collect();
            Ok((t.name.clone(), t.ggml_type, dims, bytes))
        })
        .collect()
}

/// Timing of the forward passes run so far.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EvalStats {
    /// Seconds spent building graphs.
    pub build_s: f64,
    /// Seconds spent executing graphs.
    pub run_s: f64,
    /// Forward passes.
    pub passes: u64,
}

/// Called once after the first forward pass with the GPU memory then in use.
pub type FirstPassHook = Box<dyn FnMut(&DeviceMemory) + Send>;

/// An inference session: an executor with the model's weights bound and a KV cache.
pub struct Session {
    model: Model,
    engine: Engine,
    n_threads: usize,
    plan: DevicePlan,
    first_pass: Option<FirstPassHook>,
    kv: KvCacheSpec,
    n_batch: usize,
    n_past: usize,
    /// The tokens at positions `0..n_past`.
    history: Vec<u32>,
    stats: EvalStats,
    /// The optimized single-token decode graph of one KV bucket (see [`KV_BUCKET`]).
    decode: Option<(usize, ForwardGraph)>,
}

/// Single-token decode graphs attend over the KV cache rounded up to a multiple of this many
/// positions: keys past the query's position are masked by causality (and skipped by both
/// backends' attention), so the result is unchanged, while the graph stays the same for this
/// many steps and is built, optimized, scheduled and planned once per bucket.
pub const KV_BUCKET: usize = 256;

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("kv", &self.kv)
            .field("n_past", &self.n_past)
            .finish()
    }
}

impl Session {
    /// Binds every tensor of the model to a new executor (no copies on the CPU; one upload on a
    /// GPU) and sizes the arena for a full prompt batch.
    pub fn new(model: &Model, opts: &SessionOptions) -> Result<Self, ModelError> {
        Self::with_progress(model, opts, &mut |_, _| {})
    }

    /// [`Session::new`], reporting weight upload progress as `(bytes done, total)`.
    pub fn with_progress(
        model: &Model,
        opts: &SessionOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        let cfg = model.config();
        if cfg.arch.is_embedding() {
            // A session decodes token by token over a KV cache; an encoder reads a whole text
            // at once and has no head to make logits with.
            return Err(ModelError::InvalidArgument(format!(
                "`{}` is an embedding model: use `rocmforge embed` or the server's /v1/embeddings",
                cfg.arch.name()
            )));
        }
        let n_ctx = if opts.n_ctx == 0 {
            cfg.n_ctx_train
        } else {
            opts.n_ctx
        };
        if n_ctx > cfg.n_ctx_train {
            return Err(ModelError::InvalidArgument(format!(
                "context {n_ctx} exceeds the model's maximum of {}",
                cfg.n_ctx_train
            )));
        }
        if opts.n_batch == 0 {
            return Err(ModelError::InvalidArgument(
                "batch size must be at least 1".into(),
            ));
        }
        let kv = KvCacheSpec {
            dtype: opts.kv_type,
            n_ctx,
        };
        let n_batch = opts.n_batch.min(n_ctx);
        // Worst case: a full batch at the end of the context.
        let worst = BatchSpec {
            n_tok: n_batch,
            n_past: n_ctx - n_batch,
            logits: LogitsMode::Last,
        };
        let fg = build_forward(cfg, model.weights(), &kv, worst)?;
        if opts.n_threads > MAX_THREADS {
            return Err(ModelError::InvalidArgument(format!(
                "{} CPU threads asked for, at most {MAX_THREADS} are supported (0 uses one per core)",
                opts.n_threads
            )));
        }
        let backend = CpuBackend::new(opts.n_threads)?;
        let n_threads = backend.n_threads();
        let (mut engine, plan) =
            crate::engine::place(model, opts, &kv, None, fg.graph, backend, progress)?;
        let model = engine.take_split_model().unwrap_or_else(|| model.clone());
        Ok(Self {
            model,
            engine,
            n_threads,
            plan,
            first_pass: None,
            kv,
            n_batch,
            n_past: 0,
            history: Vec::new(),
            stats: EvalStats::default(),
            decode: None,
        })
    }

    /// Where the layers run and the GPU estimate.
    pub fn device_plan(&self) -> &DevicePlan {
        &self.plan
    }

    /// GPU memory in use now; `None` on the CPU.
    pub fn device_memory(&self) -> Option<DeviceMemory> {
        self.engine.device_memory()
    }

    /// The GPU's device-to-device copy bandwidth in bytes per second (read + written), measured
    /// now with up to 2 GiB of the GPU budget; `None` when the session runs on the CPU. A
    /// decode step that reads each weight once cannot go faster than this over the weight bytes.
    pub fn gpu_copy_bandwidth(&self) -> Option<Result<f64, ModelError>> {
        self.engine.gpu_copy_bandwidth()
    }

    /// Calls `hook` once after the next forward pass (the first one for a new session) with the
    /// GPU memory then in use; never called on the CPU.
    pub fn on_first_pass(&mut self, hook: FirstPassHook) {
        self.first_pass = Some(hook);
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// CPU threads the executor uses.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Context length.
    pub fn n_ctx(&self) -> usize {
        self.kv.n_ctx
    }

    /// Largest number of tokens per forward pass.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Positions filled in the KV cache.
    pub fn n_past(&self) -> usize {
        self.n_past
    }

    /// Accumulated timing.
    pub fn stats(&self) -> EvalStats {
        self.stats
    }

    /// Turns replay of captured GPU decode steps on or off (initially
    /// `SessionOptions::scheduler.graph_capture`); results are the same either way, replay saves host time.
    pub fn set_gpu_graphs(&mut self, on: bool) {
        self.engine.set_graph_capture(on);
    }

    /// True when the last decode step's GPU graph is held captured for replay.
    pub fn has_gpu_graph(&self) -> bool {
        self.engine.has_captured_graph()
    }

    /// Forgets the context (the cache rows are simply overwritten later).
    pub fn reset(&mut self) {
        self.n_past = 0;
        self.history.clear();
    }

    /// Drops positions `n..` from the context (e.g. to re-run from a common prefix).
    pub fn truncate(&mut self, n: usize) {
        self.n_past = self.n_past.min(n);
        self.history.truncate(self.n_past);
    }

    /// The tokens in the context, in position order.
    pub fn history(&self) -> &[u32] {
        &self.history
    }

    /// Keeps the longest prefix of the context that `tokens` starts with (at least one token of
    /// `tokens` is always left to evaluate) and returns how many of `tokens` are already cached.
    pub fn reuse_prefix(&mut self, tokens: &[u32]) -> usize {
        let common = self
            .history
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count()
            .min(tokens.len().saturating_sub(1));
        self.truncate(common);
        common
    }

    /// Feeds `tokens` at the next positions, in chunks of at most the batch size, and returns
    /// logits: the last position's (`[n_vocab]`) with [`LogitsMode::Last`], every position's
    /// (`[n_tokens * n_vocab]`, position-major) with [`LogitsMode::All`].
    pub fn eval(&mut self, tokens: &[u32], mode: LogitsMode) -> Result<Vec<f32>, ModelError> {
        self.eval_with(tokens, mode, <[f32]>::to_vec)
    }

    /// [`Session::eval`] that hands the logits to `f` instead of returning a copy: a GPU's
    /// decode-step logits are seen where their device-to-host copy landed (page-locked memory),
    /// so a sampler reading them costs no host copy (the copy out cost more than the transfer).
    pub fn eval_with<R>(
        &mut self,
        tokens: &[u32],
        mode: LogitsMode,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, ModelError> {
        let n_vocab = self.model.config().n_vocab;
        if tokens.is_empty() {
            return Err(ModelError::InvalidArgument("no tokens to evaluate".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(ModelError::BadToken { id: bad, n_vocab });
        }
        if self.n_past + tokens.len() > self.kv.n_ctx {
            return Err(ModelError::ContextFull {
                needed: self.n_past + tokens.len(),
                n_ctx: self.kv.n_ctx,
            });
        }
        let n_chunks = tokens.len().div_ceil(self.n_batch);
        if n_chunks == 1 {
            // One forward pass (every decode step): its logits go to `f` as they are.
            return self.forward(tokens, mode, f);
        }
        let mut out = Vec::new();
        let n_out = match mode {
            LogitsMode::All => tokens.len(),
            LogitsMode::Last => 1,
        };
        let n_logits = n_out.saturating_mul(n_vocab);
        out.try_reserve_exact(n_logits).map_err(|_| {
            ModelError::Graph(ggml_graph::GraphError::OutOfMemory {
                what: format!("the logits of {n_out} positions"),
                bytes: n_logits.saturating_mul(4),
            })
        })?;
        for (ci, chunk) in tokens.chunks(self.n_batch).enumerate() {
            let last_chunk = ci + 1 == n_chunks;
            let want = match mode {
                LogitsMode::All => Some(LogitsMode::All),
                LogitsMode::Last if last_chunk => Some(LogitsMode::Last),
                LogitsMode::Last => None,
            };
            let keep = want.is_some();
            self.forward(chunk, want.unwrap_or(LogitsMode::Last), |logits| {
                if keep {
                    out.extend_from_slice(logits);
                }
            })?;
        }
        Ok(f(&out))
    }

    fn forward<R>(
        &mut self,
        tokens: &[u32],
        mode: LogitsMode,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, ModelError> {
        let t0 = Instant::now();
        let bucket = (tokens.len() == 1 && mode == LogitsMode::Last).then(|| {
            (self.n_past + 1)
                .next_multiple_of(KV_BUCKET)
                .min(self.kv.n_ctx)
        });
        let built;
        let batch = match bucket {
            Some(n_kv) => BatchSpec {
                n_tok: 1,
                n_past: n_kv - 1,
                logits: LogitsMode::Last,
            },
            None => BatchSpec {
                n_tok: tokens.len(),
                n_past: self.n_past,
                logits: mode,
            },
        };
        let fg = match bucket {
            Some(n_kv) => {
                if self.decode.as_ref().is_none_or(|(k, _)| *k != n_kv) {
                    let mut g =
                        build_forward(self.model.config(), self.model.weights(), &self.kv, batch)?;
                    self.engine.optimize(&mut g.graph);
                    self.decode = Some((n_kv, g));
                }
                match &self.decode {
                    Some((_, g)) => g,
                    None => return Err(ModelError::InvalidArgument("no decode graph".into())),
                }
            }
            None => {
                let mut g =
                    build_forward(self.model.config(), self.model.weights(), &self.kv, batch)?;
                // The optimizer keeps tensor ids valid.
                self.engine.optimize(&mut g.graph);
                built = g;
                &built
            }
        };
        let ids: Vec<u8> = tokens
            .iter()
            .flat_map(|&t| (t as i32).to_le_bytes())
            .collect();
        let pos: Vec<u8> = (self.n_past..self.n_past + tokens.len())
            .flat_map(|p| (p as i32).to_le_bytes())
            .collect();
        let t1 = Instant::now();
        let kv = self.kv;
        // A tensor split's other ranks build the same pass from their models.
        let rank_graph = |m: &Model| Ok(build_forward(m.config(), m.weights(), &kv, batch)?.graph);
        self.engine.run(
            bucket.map(|b| b as u64),
            &fg.graph,
            &[(fg.tokens, &ids), (fg.pos, &pos)],
            &rank_graph,
        )?;
        let r = self.engine.with_output_f32(fg.logits, f)?;
        let t2 = Instant::now();
        self.stats.build_s += (t1 - t0).as_secs_f64();
        self.stats.run_s += (t2 - t1).as_secs_f64();
        self.stats.passes += 1;
        self.n_past += tokens.len();
        self.history.extend_from_slice(tokens);
        if let Some(mut hook) = self.first_pass.take() {
            if let Some(m) = self.device_memory() {
                hook(&m);
            }
        }
        Ok(r)
    }
}
