//! The HIP backend of the graph: a [`Device`] that runs nodes with rocmforge's HIP kernels (AMD
//! and NVIDIA) on one stream, with one BLAS handle for that stream, on memory from `gpu-mem`.
//!
//! Design choices:
//! - One stream per device, created once with the device's one BLAS handle bound to it; every
//!   copy and launch is queued on it, so ordering needs no events. Small buffer writes are
//!   queued from pinned memory without waiting and reads go through a reusable pinned buffer
//!   (`gpu-mem`'s `host_io`), which keeps a decode step's host traffic off the critical path.
//!   Buffers and stream handles keep the device state alive, so the stream is destroyed only
//!   after the last of them. [`Stream::synchronize`] waits for that stream only, never for the
//!   whole device.
//! - Buffers are `gpu-mem` allocations (budgeted and tracked); the scheduler uploads each weight
//!   once per device and keeps it across runs. Weights uploaded together
//!   ([`BufferType::alloc_weights`]) share one `gpu-mem` weight arena (a few large allocations,
//!   one slot per tensor) and travel through the pinned double-buffered uploader.
//! - `supports_op` accepts exactly the layouts the launch code handles (dense rows, 2-D weights,
//!   broadcasts the kernels express); everything else stays on the CPU through the scheduler.
//! - Kernels come from the `kernels` crate's embedded code objects, loaded lazily per module.
//!   Launches go through `gpu-mem`'s checked launch: arguments are matched against the
//!   kernel's parameter table (`kernels::KernelId::params`) and device memory is passed as
//!   `MemRange`s borrowed from live buffers, never as raw addresses.
//! - Graph capture ([`Device::begin_capture`]): the stream's launches are recorded as a HIP
//!   graph that the scheduler replays for repeated decode steps. While capturing, the scratch
//!   refuses to grow (growth synchronizes) and the Q8 cache starts empty, so the recording
//!   quantizes its own inputs; the recording keeps the scratch and Q8 buffers it used alive.
//!   Replays are checked by `gpu-mem` (every allocation the recording uses must still be live,
//!   else an error); the scheduler drops a recording before reallocating its arena.

mod attn;
mod collective;
mod group;
mod matmul;
mod moe;
mod ops;
mod peer_reduce;
mod profile;
mod stack;
mod workspace;
pub use workspace::Workspace;

pub use crate::hip_options::{CollectiveOptions, HipOptions, StackKernel};
pub use collective::HipCollective;
#[cfg(any(test, feature = "testing"))]
pub use matmul::mmq_launches;
#[cfg(any(test, feature = "testing"))]
pub use moe::{expert_bias_launches, expert_gate_up_launches, grouped_tile_launches};
#[cfg(any(test, feature = "testing"))]
pub use stack::{head_launches, stack_launches, stack_portable_launches, stack_split_launches};

/// GPUs of the platform `hip-ffi` selects (0 without one); opens no device.
pub fn device_count() -> usize {
    hip_ffi::runtime()
        .and_then(|api| api.device_count())
        .map_or(0, |n| usize::try_from(n).unwrap_or(0))
}

use std::any::Any;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use gpu_mem::pool::ArenaSlot;
use gpu_mem::{
    DeviceArena, DeviceBuffer, KernelArg, MappedHostBuffer, MemRange, ParamKind, WeightUploader,
};
use parking_lot::Mutex;

use crate::backend::{Buffer, BufferType, Captured, Device, GroupNode, Stream, TensorMem};
use crate::error::{GraphError, Result};
use crate::tensor::{Op, Tensor};

/// Wraps a device-layer error (or a message where the backend itself found the fault) as the
/// graph's error type, keeping the error as its source.
pub(crate) fn gpu_err(
    op: &'static str,
    e: impl Into<Box<dyn std::error::Error + Send + Sync>>,
) -> GraphError {
    GraphError::Device {
        backend: "hip",
        op,
        source: e.into(),
    }
}

/// The product of `factors`, a byte count for `what` computed from tensor shapes. Above
/// `isize::MAX / 8` it is more memory than any device has and is refused before the device is
/// asked; below it, a few such counts rounded up to an alignment and added cannot overflow.
pub(crate) fn bytes_of(what: &str, factors: &[usize]) -> Result<usize> {
    const MAX: usize = isize::MAX as usize / 8;
    factors
        .iter()
        .try_fold(1usize, |a, &f| a.checked_mul(f))
        .filter(|&b| b <= MAX)
        .ok_or_else(|| {
            let dims: Vec<String> = factors.iter().map(ToString::to_string).collect();
            GraphError::OutOfMemory {
                what: format!("{what} ({} bytes)", dims.join(" x ")),
                bytes: usize::MAX,
            }
        })
}

struct Inner {
    dev: gpu_mem::Device,
    /// The device's one stream and the BLAS handle bound to it.
    sb: gpu_mem::StreamBlas,
    target: kernels::Device,
    warp: u32,
    name: String,
    modules: Mutex<HashMap<kernels::Module, gpu_mem::Module>>,
    /// Grow-only scratch for quantized activations, f16 operands and attention partials.
    scratch: Mutex<Option<Arc<DeviceBuffer<u8>>>>,
    /// The last activations quantized for the mat-vec kernels (shared by q/k/v, gate/up).
    q8: Mutex<ops::Q8Cache>,
    /// True between `begin_capture` and `end_capture`: nothing may synchronize or allocate.
    capturing: AtomicBool,
    /// Per-node timing (`HipOptions::profile`); `None` when off.
    profile: Option<Mutex<profile::Profiler>>,
    /// Grouped mat-vec launches made (see `group`), for tests and logs.
    grouped: std::sync::atomic::AtomicUsize,
    grouped_nodes: std::sync::atomic::AtomicUsize,
    /// The switches the device was opened with.
    opts: HipOptions,
    /// Whether the q/k/v mat-vec rotates and stores its rows itself now (never without
    /// `HipOptions::qkv_rope`).
    qkv_rope: AtomicBool,
    /// The persistent decode stack (`stack`); off without `HipOptions::stack` and where the
    /// device cannot run it.
    stack: Mutex<stack::State>,
    /// Device bytes of the runtime's context and library handles (see `runtime_bytes`).
    runtime: u64,
}

/// One small f16 product through the BLAS handle, waited for: the library allocates its
/// workspace at its first product (cuBLAS), which the runtime's share must include.
fn warm_blas(dev: &gpu_mem::Device, sb: &gpu_mem::StreamBlas) -> gpu_mem::Result<()> {
    const N: usize = 64;
    let a = DeviceBuffer::<half::f16>::new(dev, N * N, "blas warm-up")?;
    let b = DeviceBuffer::<half::f16>::new(dev, N * N, "blas warm-up")?;
    let mut c = DeviceBuffer::<f32>::new(dev, N * N, "blas warm-up")?;
    let shape = gpu_mem::GemmShape {
        trans_a: gpu_mem::Op::T,
        trans_b: gpu_mem::Op::N,
        m: N,
        n: N,
        k: N,
        lda: N,
        ldb: N,
        ldc: N,
    };
    sb.blas()
        .gemm_ex(&shape, 1.0, &a.view(), &b.view(), 0.0, &mut c.view_mut())?;
    sb.stream().synchronize()
}

/// Device bytes the runtime holds for this process before it allocates anything itself, by
/// ordinal, measured when the process first opens the device (a later open would see this
/// process's own allocations too).
///
/// `warm` runs first, only at that first open: later opens of the device skip its work (the
/// library handles of later opens then allocate at their first use, as any run does).
fn runtime_bytes_of(dev: &gpu_mem::Device, warm: impl FnOnce()) -> u64 {
    static SEEN: std::sync::OnceLock<Mutex<HashMap<i32, u64>>> = std::sync::OnceLock::new();
    let mut seen = SEEN.get_or_init(|| Mutex::new(HashMap::new())).lock();
    *seen.entry(dev.ordinal()).or_insert_with(|| {
        warm();
        // The context exists (the device is open) and the BLAS handle too: what the card has
        // in use beyond our own tracked allocations is theirs (and other processes', which a
        // dedicated card has none of).
        match untracked_bytes(dev) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("cannot measure the GPU runtime's memory: {e}");
                0
            }
        }
    })
}

/// What the card has in use beyond `dev`'s tracked allocations.
fn untracked_bytes(dev: &gpu_mem::Device) -> hip_ffi::Result<u64> {
    let (free, total) = dev.api().mem_get_info()?;
    Ok(total
        .saturating_sub(free)
        .saturating_sub(dev.tracker().live_bytes()))
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Err(e) = self.sb.stream().synchronize() {
            tracing::warn!("hip backend: stream sync at shutdown failed: {e}");
        }
        if let Some(p) = self.profile.as_mut() {
            p.get_mut().report();
        }
        self.scratch.get_mut().take();
        self.modules.get_mut().clear();
    }
}

/// A GPU as a graph [`Device`].
#[derive(Clone)]
pub struct HipDevice {
    inner: Arc<Inner>,
    bt: HipBufferType,
}

impl HipDevice {
    /// An event recorded now on the device's stream, for the profiler's per-node times.
    fn timing_event(&self) -> Result<gpu_mem::Event> {
        let e = gpu_mem::Event::new(&self.inner.dev, true).map_err(|e| gpu_err("profile", e))?;
        e.record(self.inner.sb.stream())
            .map_err(|e| gpu_err("profile", e))?;
        Ok(e)
    }

    /// Opens GPU `ordinal` of the platform `hip-ffi` selects with the default options. Fails
    /// with the reason when there is no GPU or the kernels were not built (`cargo xtask kernels`).
    pub fn new(ordinal: i32) -> Result<Self> {
        Self::with_options(ordinal, HipOptions::default())
    }

    /// [`HipDevice::new`] with the backend switches `opts`.
    pub fn with_options(ordinal: i32, opts: HipOptions) -> Result<Self> {
        // The device first: without a GPU, "no GPU" is the news, not the missing kernels.
        let dev = gpu_mem::Device::open(ordinal).map_err(|e| gpu_err("open", e))?;
        if !kernels::built() {
            return Err(gpu_err(
                "open",
                "kernels not built: run `cargo xtask kernels`",
            ));
        }
        let api = dev.api();
        let arch = api.device_arch(ordinal).map_err(|e| gpu_err("open", e))?;
        let target = match arch.strip_prefix("sm_").and_then(|n| n.parse::<u32>().ok()) {
            Some(v) => kernels::Device::Nvidia {
                major: v / 10,
                minor: v % 10,
            },
            None => kernels::Device::Amd(arch.clone()),
        };
        let warp = api
            .device_attribute(hip_ffi::DeviceAttribute::WarpSize, ordinal)
            .map_err(|e| gpu_err("open", e))? as u32;
        let name = format!("hip:{ordinal} {} ({arch})", dev.info().name);
        let sb = gpu_mem::StreamBlas::new(&dev).map_err(|e| gpu_err("open", e))?;
        // Kernels may start while the one before them finishes where every module's code waits
        // for its predecessors first (`HipOptions::early_launch`).
        let early = opts.early_launch
            && kernels::Module::ALL
                .iter()
                .all(|&m| kernels::image(m, &target).is_ok_and(|i| i.waits_for_predecessors()));
        let early = sb.stream().set_early_launch(early);
        tracing::debug!("hip backend: early kernel launches {early}");
        let stack = Self::stack_state(&dev, &sb, &target, ordinal, &opts)?;
        // Every module of the target is loaded before the runtime's share is measured: their
        // code takes device memory that no tracked allocation counts (about 2 MiB per module
        // on NVIDIA), and nearly all of them run in the first pass anyway. One that fails to load is retried, and its
        // error reported, at first use.
        let mut modules = HashMap::new();
        for &m in kernels::Module::ALL {
            let Ok(img) = kernels::image(m, &target) else {
                continue;
            };
            match gpu_mem::Module::load(&dev, img.bytes) {
                Ok(loaded) => {
                    // Looking every kernel up loads its code now where the driver loads
                    // modules lazily (CUDA's default); a kernel the image lacks is reported at
                    // its first launch.
                    for k in kernels::KernelId::ALL.iter().filter(|k| k.module() == m) {
                        let _ = loaded.function(k.name());
                    }
                    modules.insert(m, loaded);
                }
                Err(e) => tracing::debug!("hip backend: module {m:?} not loaded at open: {e}"),
            }
        }
        let runtime = runtime_bytes_of(&dev, || {
            if let Err(e) = warm_blas(&dev, &sb) {
                tracing::debug!("hip backend: BLAS warm-up product failed: {e}");
            }
        });
        let inner = Arc::new(Inner {
            runtime,
            dev,
            sb,
            target,
            warp,
            name,
            modules: Mutex::new(modules),
            scratch: Mutex::new(None),
            q8: Mutex::new(ops::Q8Cache::default()),
            capturing: AtomicBool::new(false),
            profile: opts
                .profile
                .then(|| Mutex::new(profile::Profiler::default())),
            grouped: std::sync::atomic::AtomicUsize::new(0),
            grouped_nodes: std::sync::atomic::AtomicUsize::new(0),
            opts,
            qkv_rope: AtomicBool::new(opts.qkv_rope),
            stack: Mutex::new(stack),
        });
        Ok(Self {
            bt: HipBufferType {
                inner: inner.clone(),
            },
            inner,
        })
    }

    /// The decode stack's state: off (see [`HipDevice::set_stack`]), with its kernel chosen
    /// (`HipOptions::stack_kernel`: `decode_stack` on NVIDIA compute capability 8.0 and later,
    /// else `decode_stack_portable`) and its barrier counter zeroed here, outside any capture,
    /// where the device runs one (cooperative launches, a code object for it) unless
    /// `HipOptions::stack` is off.
    fn stack_state(
        dev: &gpu_mem::Device,
        sb: &gpu_mem::StreamBlas,
        target: &kernels::Device,
        ordinal: i32,
        opts: &HipOptions,
    ) -> Result<stack::State> {
        // The multiprocessor count gpu-mem checks cooperative grids against.
        let sms = u32::try_from(dev.info().compute_units).unwrap_or(0);
        let cooperative = dev
            .api()
            .device_attribute(hip_ffi::DeviceAttribute::CooperativeLaunch, ordinal)
            .is_ok_and(|v| v != 0);
        let native = matches!(target, kernels::Device::Nvidia { major, .. } if *major >= 8);
        let nvidia = native.then_some(kernels::KernelId::DecodeStack);
        let by_kv = Some(kernels::STACK_SPLIT_MIN_KV);
        let (kernel, split_from) = match opts.stack_kernel {
            StackKernel::Auto if native => (nvidia, by_kv),
            StackKernel::Native => (nvidia, by_kv),
            StackKernel::Short => (nvidia, None),
            StackKernel::Split => (nvidia, Some(0)),
            StackKernel::Auto | StackKernel::Portable => {
                (Some(kernels::KernelId::DecodeStackPortable), None)
            }
        };
        let can = opts.stack
            && kernel.is_some()
            && cooperative
            && sms > 0
            && kernels::image(kernels::Module::Stack, target).is_ok();
        let bar = if can {
            let mut b =
                DeviceBuffer::<u32>::new(dev, kernels::STACK_BARRIER_WORDS, "decode stack barrier")
                    .map_err(|e| gpu_err("open", e))?;
            sb.stream()
                .memset(&mut b.view_mut(), 0)
                .and_then(|()| sb.stream().synchronize())
                .map_err(|e| gpu_err("open", e))?;
            Some(b)
        } else {
            None
        };
        let kernel = kernel.unwrap_or(kernels::KernelId::DecodeStack);
        tracing::debug!(
            "hip backend: persistent decode stack available: {can} ({})",
            kernel.name()
        );
        // Unknown counts as none: the stack then asks nothing into L2 ahead of its reads.
        let l2_bytes = dev
            .api()
            .device_attribute(hip_ffi::DeviceAttribute::L2CacheBytes, ordinal)
            .ok()
            .and_then(|v| usize::try_from(v).ok())
            .unwrap_or(0);
        Ok(stack::State {
            on: false,
            kernel,
            split_from,
            bar,
            smem_allowed: Vec::new(),
            fits: Vec::new(),
            sms,
            l2_bytes,
        })
    }

    /// Lets whole decode layers run as one persistent `decode_stack` launch or leaves them to
    /// the per-op kernels (the default of a new device; sessions turn it on, see
    /// `SessionOptions::gpu_stack` in the model crate); returns whether they now do (never where
    /// the device cannot run it or without `HipOptions::stack`).
    pub fn set_stack(&self, on: bool) -> bool {
        let mut st = self.inner.stack.lock();
        st.on = on && self.inner.opts.stack && st.bar.is_some();
        st.on
    }

    /// Lets the q/k/v mat-vec rotate and store its rows itself (the default) or leaves that to
    /// the rope launch after it; returns whether it now does (never with
    /// `HipOptions::qkv_rope` off).
    pub fn set_qkv_rope(&self, on: bool) -> bool {
        let on = on && self.inner.opts.qkv_rope;
        self.inner.qkv_rope.store(on, Ordering::Relaxed);
        on
    }

    /// Grouped launches (q, k and v projections in one kernel, rope/cache-write and norm chains)
    /// made so far.
    pub fn grouped_launches(&self) -> usize {
        self.inner.grouped.load(Ordering::Relaxed)
    }

    /// Graph nodes those grouped launches ran.
    pub fn grouped_nodes(&self) -> usize {
        self.inner.grouped_nodes.load(Ordering::Relaxed)
    }

    /// Buffer writes queued from pinned memory without waiting so far (small writes; larger
    /// ones block).
    pub fn queued_writes(&self) -> u64 {
        self.inner.sb.stream().queued_writes()
    }

    /// Bytes of the pinned buffer that reads go through (0 before the first read).
    pub fn read_buffer_bytes(&self) -> usize {
        self.inner.sb.stream().read_buffer_bytes()
    }

    /// The `gpu-mem` device (budget, tracker, leak report).
    pub fn gpu(&self) -> &gpu_mem::Device {
        &self.inner.dev
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> i32 {
        self.inner.dev.ordinal()
    }

    /// Lets this GPU reach `peer`'s memory directly (copies between them then go over
    /// NVLink/xGMI/PCIe peer to peer); returns whether it can.
    pub fn enable_peer_access(&self, peer: &HipDevice) -> Result<bool> {
        self.inner
            .dev
            .enable_peer_access(&peer.inner.dev)
            .map_err(|e| gpu_err("peer access", e))
    }

    /// Bytes the device's budget has left.
    pub fn budget_available(&self) -> u64 {
        self.inner.dev.budget().available()
    }

    /// What a placement may plan to allocate: the budget's available bytes less
    /// [`crate::RUNTIME_GROWTH`], so that what the runtime adds after the open stays inside a cap.
    pub fn placeable_bytes(&self) -> u64 {
        self.budget_available()
            .saturating_sub(crate::RUNTIME_GROWTH)
    }

    /// Lowers the device's budget to at most `bytes` (never raises it).
    pub fn cap_budget(&self, bytes: u64) {
        let b = self.inner.dev.budget();
        b.set_limit(b.limit().min(bytes));
    }

    /// Device bytes the runtime's context and library handles (the BLAS handle and its
    /// workspace) hold for this process, measured when the process first opened the device:
    /// what `nvidia-smi` / `rocm-smi` count for the process beyond [`HipDevice::allocated_bytes`].
    pub fn runtime_bytes(&self) -> u64 {
        self.inner.runtime
    }

    /// What the card has in use now beyond this device's tracked allocations (the runtime's
    /// share as it stands, plus other processes' and other `HipDevice`s' of this ordinal):
    /// beside [`HipDevice::runtime_bytes`], whether the runtime grew after the open. `None`
    /// when the driver cannot say.
    pub fn runtime_bytes_now(&self) -> Option<u64> {
        untracked_bytes(&self.inner.dev).ok()
    }

    /// The device's multiprocessors (compute units), which set how the tile products split
    /// (and so their workspace, [`HipDevice::workspace_for`]).
    pub fn multiprocessors(&self) -> usize {
        usize::try_from(self.inner.dev.info().compute_units).unwrap_or(0)
    }

    /// Device bytes allocated now (every tracked allocation).
    pub fn allocated_bytes(&self) -> u64 {
        self.inner.dev.tracker().live_bytes()
    }

    /// The tracked allocations live now, summed by what their owners named them (`gpu-mem`'s
    /// tags: the weight arena, the scheduler's arena and KV buffers, the backend's scratch...),
    /// largest first: where [`HipDevice::allocated_bytes`] goes.
    pub fn allocated_by_tag(&self) -> Vec<(String, u64)> {
        let mut by: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
        for e in self.inner.dev.tracker().report().entries {
            *by.entry(e.tag).or_default() += e.bytes;
        }
        let mut v: Vec<(String, u64)> = by.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        v
    }

    /// The device-to-device copy bandwidth (bytes read + written per second) over two buffers
    /// of `bytes`, from `reps` copies.
    pub fn copy_bandwidth(&self, bytes: usize, reps: u32) -> Result<f64> {
        gpu_mem::bandwidth::copy_bandwidth(&self.inner.dev, bytes, reps)
            .map_err(|e| gpu_err("copy bandwidth", e))
    }

    /// Queues the longest leading run of `group` one kernel takes (consecutive decode layers as
    /// one `decode_stack`, else the grouped kernels of `group`) and returns its length, counted
    /// in the grouped launch statistics; 0 when no kernel takes two or more nodes.
    fn launch_grouped(&self, group: &[GroupNode<'_>]) -> Result<usize> {
        let n = match group.first().map(|g| &g.tensor.op) {
            Some(Op::DecodeLayer(_)) => stack::launch(self, group)?,
            _ => group::launch(self, group)?,
        };
        if n > 0 {
            self.inner.grouped.fetch_add(1, Ordering::Relaxed);
            self.inner.grouped_nodes.fetch_add(n, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Runs `f` with kernel `k`, loading its module on first use.
    fn with_kernel<R>(
        &self,
        k: kernels::KernelId,
        f: impl FnOnce(&gpu_mem::Function<'_>) -> Result<R>,
    ) -> Result<R> {
        let inner = &self.inner;
        let mut mods = inner.modules.lock();
        let m = match mods.entry(k.module()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let img =
                    kernels::image(k.module(), &inner.target).map_err(|e| gpu_err("load", e))?;
                e.insert(
                    gpu_mem::Module::load(&inner.dev, img.bytes).map_err(|e| gpu_err("load", e))?,
                )
            }
        };
        f(&m.function(k.name()).map_err(|e| gpu_err("load", e))?)
    }

    /// Queues `k` over `grid` blocks of `block` threads (see [`HipDevice::launch_kernel_smem`]).
    ///
    /// # Safety
    /// As for [`HipDevice::launch_kernel_smem`].
    unsafe fn launch_kernel(
        &self,
        k: kernels::KernelId,
        grid: [u32; 3],
        block: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        // SAFETY: the caller's promise, with no dynamic shared memory.
        unsafe { self.launch_kernel_smem(k, grid, block, 0, args) }
    }

    /// Whether `decode_stack` can have one resident block per multiprocessor with `smem` bytes
    /// of dynamic shared memory here (the ring alone takes 180 KiB: an A100's 163 KiB per block
    /// cannot hold it, nor an H100's 227 KiB the input of a very wide FFN); answered once per
    /// size. Where it cannot, the layers go to the per-op kernels.
    pub(crate) fn stack_fits(&self, k: kernels::KernelId, smem: u32) -> bool {
        self.kernel_fits(k, kernels::STACK_THREADS, smem, "its work runs per op")
    }

    /// Whether `k` can have one resident block of `threads` threads with `smem` bytes of
    /// dynamic shared memory here, opting the kernel in to them where they exceed the default;
    /// answered once per size. `otherwise` says what runs instead (for the log).
    pub(crate) fn kernel_fits(
        &self,
        k: kernels::KernelId,
        threads: u32,
        smem: u32,
        otherwise: &str,
    ) -> bool {
        let known = self
            .inner
            .stack
            .lock()
            .fits
            .iter()
            .find(|(kk, s, _)| *kk == k && *s == smem)
            .map(|f| f.2);
        if let Some(ok) = known {
            return ok;
        }
        let ok = self
            .with_kernel(k, |f| {
                let mut st = self.inner.stack.lock();
                let allowed = st.smem_allowed.iter().find(|a| a.0 == k).map_or(0, |a| a.1);
                if smem > allowed {
                    if let Err(e) = f.set_max_dynamic_shared(smem) {
                        tracing::debug!("{}: {smem} bytes of shared memory refused: {e}", k.name());
                        return Ok(false);
                    }
                    st.smem_allowed.retain(|a| a.0 != k);
                    st.smem_allowed.push((k, smem));
                }
                Ok(f.max_active_blocks_per_sm(threads, smem)
                    .is_ok_and(|b| b >= 1))
            })
            .unwrap_or(false);
        if !ok {
            tracing::info!(
                "hip backend: {} cannot keep a block per multiprocessor with {smem} bytes of shared \
                 memory; {otherwise}",
                k.name()
            );
        }
        self.inner.stack.lock().fits.push((k, smem, ok));
        ok
    }

    /// Queues `k` over `grid` blocks of `block` threads with `smem` bytes of dynamic shared
    /// memory (beyond 48 KiB only where [`HipDevice::kernel_fits`] has opted the kernel in), after
    /// `gpu-mem`'s checks of the arguments against the kernel's parameter table.
    ///
    /// # Safety
    /// `args` meet kernel `k`'s contract (its HIP source in `kernels/hip`): for the integer
    /// arguments, grid and block given, every memory argument covers all the bytes the kernel
    /// reads or writes through it, and a null pointer stands only where the kernel takes one.
    unsafe fn launch_kernel_smem(
        &self,
        k: kernels::KernelId,
        grid: [u32; 3],
        block: u32,
        smem: u32,
        args: &[KernelArg<'_>],
    ) -> Result<()> {
        self.with_kernel(k, |f| {
            let stream = self.inner.sb.stream();
            // SAFETY: `param_kinds(k)` is the kernel's own list (tested against the HIP sources
            // in `kernels`), the arguments meet its contract (the caller's promise), and
            // `kernel_fits` opted the kernel in to `smem` where it exceeds the default.
            unsafe {
                stream.launch_checked(f, k.name(), param_kinds(k), grid, [block, 1, 1], smem, args)
            }
            .map_err(|e| gpu_err(k.name(), e))
        })
    }

    /// Queues cooperative launch of `k` (every block resident at once: the kernel's blocks wait
    /// for each other) over `grid` blocks of `block` threads with `smem` bytes of dynamic shared
    /// memory, which [`HipDevice::stack_fits`] has opted the kernel in to; `uses` is the memory
    /// the kernel reaches through pointers inside its by-value arguments (recorded for graph
    /// capture like pointer arguments).
    ///
    /// # Safety
    /// As for [`HipDevice::launch_kernel_smem`], with `uses` covering all memory the kernel
    /// reaches through pointers inside its by-value arguments.
    unsafe fn launch_cooperative(
        &self,
        k: kernels::KernelId,
        grid: u32,
        block: u32,
        smem: u32,
        args: &[KernelArg<'_>],
        uses: &[gpu_mem::MemRange<'_>],
    ) -> Result<()> {
        self.with_kernel(k, |f| {
            let stream = self.inner.sb.stream();
            // SAFETY: as in `launch_kernel_smem`, with `uses` as the caller promises.
            unsafe {
                stream.launch_checked_cooperative(
                    f,
                    k.name(),
                    param_kinds(k),
                    [grid, 1, 1],
                    [block, 1, 1],
                    smem,
                    args,
                    uses,
                )
            }
            .map_err(|e| gpu_err(k.name(), e))
        })
    }

    /// A scratch area of at least `bytes`, kept alive by the returned handle; the next call may
    /// replace it (growing first waits for queued work that may still use the old one).
    fn scratch(&self, bytes: usize) -> Result<Arc<DeviceBuffer<u8>>> {
        let mut s = self.inner.scratch.lock();
        if s.as_ref().is_none_or(|b| b.len() < bytes) {
            if self.inner.capturing.load(Ordering::Relaxed) {
                // Growing synchronizes the stream, which a capture forbids: the caller falls
                // back to plain launches (the scratch is then sized for the next capture).
                return Err(gpu_err(
                    "scratch",
                    "scratch would grow during graph capture",
                ));
            }
            self.inner
                .sb
                .stream()
                .synchronize()
                .map_err(|e| gpu_err("scratch", e))?;
            *s = None;
            let grown = bytes
                .checked_next_power_of_two()
                .ok_or_else(|| GraphError::OutOfMemory {
                    what: "the HIP backend's scratch".into(),
                    bytes,
                })?
                .max(1 << 20);
            *s = Some(Arc::new(
                DeviceBuffer::new(&self.inner.dev, grown, "hip-backend scratch")
                    .map_err(|e| gpu_err("scratch", e))?,
            ));
        }
        s.clone()
            .ok_or_else(|| gpu_err("scratch", "scratch allocation missing"))
    }
}

/// `k`'s parameter list in `gpu-mem`'s terms, converted once per kernel.
fn param_kinds(k: kernels::KernelId) -> &'static [ParamKind] {
    static TABLE: std::sync::OnceLock<HashMap<kernels::KernelId, Vec<ParamKind>>> =
        std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        kernels::KernelId::ALL
            .iter()
            .map(|&id| {
                let kinds = id
                    .params()
                    .iter()
                    .map(|p| match p {
                        kernels::Param::Ptr => ParamKind::Ptr,
                        kernels::Param::I32 => ParamKind::I32,
                        kernels::Param::I64 => ParamKind::I64,
                        kernels::Param::F32 => ParamKind::F32,
                        kernels::Param::Attn => {
                            ParamKind::Bytes(std::mem::size_of::<kernels::AttnParams>())
                        }
                        kernels::Param::Stack => {
                            ParamKind::Bytes(std::mem::size_of::<kernels::StackParams>())
                        }
                        kernels::Param::Peer => {
                            ParamKind::Bytes(std::mem::size_of::<kernels::PeerReduceParams>())
                        }
                    })
                    .collect();
                (id, kinds)
            })
            .collect()
    });
    table.get(&k).map_or(&[], Vec::as_slice)
}

/// Device memory from `gpu-mem`.
#[derive(Clone)]
pub struct HipBufferType {
    inner: Arc<Inner>,
}

impl BufferType for HipBufferType {
    fn name(&self) -> &str {
        "hip"
    }
    fn alignment(&self) -> usize {
        256
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        self.inner.q8.lock().clear();
        let mut buf = DeviceBuffer::<u8>::new(&self.inner.dev, size.max(1), "graph buffer")
            .map_err(|e| gpu_err("alloc", e))?;
        self.inner
            .sb
            .stream()
            .memset(&mut buf.view_mut(), 0)
            .map_err(|e| gpu_err("alloc", e))?;
        Ok(Box::new(HipBuffer {
            mem: Mem::Owned(buf),
            inner: self.inner.clone(),
            size,
        }))
    }
    fn is_host(&self) -> bool {
        false
    }
    fn alloc_mapped(&self, size: usize) -> Result<Option<Box<dyn Buffer>>> {
        let buf = MappedHostBuffer::new(&self.inner.dev, size.max(1))
            .map_err(|e| gpu_err("alloc mapped", e))?;
        Ok(Some(Box::new(HipBuffer {
            mem: Mem::Mapped(buf),
            inner: self.inner.clone(),
            size,
        })))
    }
    fn alloc_many(&self, sizes: &[usize]) -> Result<Vec<Box<dyn Buffer>>> {
        self.inner.q8.lock().clear();
        let dev = &self.inner.dev;
        let bytes: Vec<u64> = sizes.iter().map(|&s| s.max(1) as u64).collect();
        let arena = Arc::new(
            DeviceArena::for_sizes(dev, &bytes, WEIGHT_CHUNK, "persistent buffers")
                .map_err(|e| gpu_err("alloc", e))?,
        );
        arena
            .fill(self.inner.sb.stream(), 0)
            .map_err(|e| gpu_err("alloc", e))?;
        bytes
            .iter()
            .zip(sizes)
            .map(|(&b, &size)| {
                let slot = arena.alloc(b).map_err(|e| gpu_err("alloc", e))?;
                Ok(Box::new(HipBuffer {
                    size,
                    mem: Mem::Slot {
                        arena: arena.clone(),
                        slot,
                    },
                    inner: self.inner.clone(),
                }) as Box<dyn Buffer>)
            })
            .collect()
    }
    fn alloc_weights(
        &self,
        tensors: &[&[u8]],
        progress: &mut dyn FnMut(u64),
    ) -> Result<Vec<Box<dyn Buffer>>> {
        let dev = &self.inner.dev;
        let sizes: Vec<u64> = tensors.iter().map(|t| t.len() as u64).collect();
        let arena = Arc::new(
            DeviceArena::for_sizes(dev, &sizes, WEIGHT_CHUNK, "weights")
                .map_err(|e| gpu_err("upload", e))?,
        );
        let slots = sizes
            .iter()
            .map(|&s| arena.alloc(s))
            .collect::<gpu_mem::Result<Vec<_>>>()
            .map_err(|e| gpu_err("upload", e))?;
        let mut uploader =
            WeightUploader::new(dev, UPLOAD_STAGING).map_err(|e| gpu_err("upload", e))?;
        let mut done = 0u64;
        let mut fill = |i: usize, off: u64, dst: &mut [u8]| -> gpu_mem::Result<()> {
            let off = off as usize;
            let src = tensors[i].get(off..off + dst.len()).ok_or_else(|| {
                gpu_mem::GpuError::InvalidArgument(format!(
                    "weight {i}: bytes {off}+{} beyond {}",
                    dst.len(),
                    tensors[i].len()
                ))
            })?;
            dst.copy_from_slice(src);
            done += dst.len() as u64;
            progress(done);
            Ok(())
        };
        let uploaded = uploader
            .upload(&arena, &slots, &mut fill)
            .map_err(|e| gpu_err("upload", e))?;
        // Compute runs on the device's own stream: wait here so every later launch sees the
        // weights (session creation, not the hot path).
        uploaded.synchronize().map_err(|e| gpu_err("upload", e))?;
        Ok(slots
            .into_iter()
            .map(|slot| {
                Box::new(HipBuffer {
                    size: slot.bytes as usize,
                    mem: Mem::Slot {
                        arena: arena.clone(),
                        slot,
                    },
                    inner: self.inner.clone(),
                }) as Box<dyn Buffer>
            })
            .collect())
    }
}

/// Largest weight-arena chunk (one driver allocation each).
const WEIGHT_CHUNK: u64 = 1 << 30;
/// Bytes of each of the uploader's two pinned staging buffers.
const UPLOAD_STAGING: usize = 16 << 20;

/// Where a buffer's bytes live.
enum Mem {
    /// An allocation of its own.
    Owned(DeviceBuffer<u8>),
    /// A slot of a shared weight arena (freed with the last slot of the arena).
    Slot {
        arena: Arc<DeviceArena>,
        slot: ArenaSlot,
    },
    /// Page-locked host memory the kernels write in place (a step's logits).
    Mapped(MappedHostBuffer),
}

/// One device allocation, or one tensor's slot of a weight arena.
pub struct HipBuffer {
    mem: Mem,
    inner: Arc<Inner>,
    size: usize,
}

impl HipBuffer {
    fn range(
        &self,
        what: &'static str,
        offset: usize,
        len: usize,
    ) -> Result<std::ops::Range<usize>> {
        offset
            .checked_add(len)
            .filter(|&e| e <= self.size)
            .map(|e| offset..e)
            .ok_or_else(|| gpu_err(what, format!("{offset}+{len} beyond {} bytes", self.size)))
    }
}

impl Buffer for HipBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.inner.q8.lock().clear();
        let r = self.range("write", offset, data.len())?;
        if let Mem::Mapped(m) = &self.mem {
            return m
                .write(self.inner.sb.stream(), r.start, data)
                .map_err(|e| gpu_err("write", e));
        }
        let dst = self
            .device_range(r.start, r.len())?
            .ok_or_else(|| gpu_err("write", "not device memory"))?;
        // Small writes (a step's token ids and positions) are queued from pinned memory without
        // waiting; the stream orders them before every later launch, copy and read.
        self.inner
            .sb
            .stream()
            .queue_write_range(data, dst)
            .map_err(|e| gpu_err("write", e))
    }
    fn write_batch(&self, writes: &[(usize, &[u8])]) -> Result<()> {
        // A decode step's inputs (token ids, positions) as aligned words of an owned buffer go
        // to the device in one call; anything else one write at a time.
        let aligned_words: Option<Vec<(usize, u32)>> = writes
            .iter()
            .map(|&(offset, data)| {
                let word = <[u8; 4]>::try_from(data).ok().filter(|_| offset % 4 == 0)?;
                Some((offset, u32::from_ne_bytes(word)))
            })
            .collect();
        let (Mem::Owned(b), Some(aligned_words)) = (&self.mem, aligned_words) else {
            return writes.iter().try_for_each(|&(o, d)| self.write(o, d));
        };
        let mut words = Vec::with_capacity(aligned_words.len());
        for (offset, value) in aligned_words {
            let r = self.range("write", offset, 4)?;
            let dst = MemRange::of_buffer(b)
                .sub(r.start, 4)
                .map_err(|e| gpu_err("write", e))?;
            words.push((dst, value));
        }
        self.inner.q8.lock().clear();
        self.inner
            .sb
            .stream()
            .queue_write_words(&words)
            .map_err(|e| gpu_err("write", e))
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let r = self.range("read", offset, out.len())?;
        // Reads land in the stream's reusable pinned buffer (a pageable D2H of a step's logits
        // is several times slower) and wait for the copy; sub-allocation views are staged
        // through a whole allocation inside `read_staged`.
        match &self.mem {
            Mem::Owned(b) => {
                let view = b.slice(r).map_err(|e| gpu_err("read", e))?;
                self.inner.sb.stream().read_staged(&view, out)
            }
            Mem::Slot { arena, slot } => {
                let whole = arena.view::<u8>(slot).map_err(|e| gpu_err("read", e))?;
                let view = whole.slice(r).map_err(|e| gpu_err("read", e))?;
                self.inner.sb.stream().read_staged(&view, out)
            }
            Mem::Mapped(m) => m.read_with(self.inner.sb.stream(), r.start, r.len(), |b| {
                out.copy_from_slice(b)
            }),
        }
        .map_err(|e| gpu_err("read", e))
    }
    fn read_with(&self, offset: usize, len: usize, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        let r = self.range("read", offset, len)?;
        let stream = self.inner.sb.stream();
        match &self.mem {
            Mem::Owned(b) => {
                let view = b.slice(r).map_err(|e| gpu_err("read", e))?;
                stream.read_pinned_with(&view, f)
            }
            Mem::Slot { arena, slot } => {
                let whole = arena.view::<u8>(slot).map_err(|e| gpu_err("read", e))?;
                let view = whole.slice(r).map_err(|e| gpu_err("read", e))?;
                stream.read_pinned_with(&view, f)
            }
            Mem::Mapped(m) => m.read_with(stream, r.start, r.len(), f),
        }
        .map_err(|e| gpu_err("read", e))
    }
    fn copy_from(
        &self,
        offset: usize,
        src: &dyn Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<bool> {
        let Some(src) = src.as_any().downcast_ref::<HipBuffer>() else {
            return Ok(false);
        };
        let (Some(from), Some(to)) = (
            src.device_range(src_offset, len)?,
            self.device_range(offset, len)?,
        ) else {
            return Ok(false);
        };
        self.inner.q8.lock().written(to.addr(), to.len());
        // Queued on this device's stream, behind the work that may still read the old bytes,
        // and waited for: the source's device may overwrite them as soon as this returns.
        let stream = self.inner.sb.stream();
        let src_view = from.view::<u8>().map_err(|e| gpu_err("copy", e))?;
        let mut dst_view = to.view_mut::<u8>().map_err(|e| gpu_err("copy", e))?;
        stream
            .copy_peer(&src_view, &mut dst_view)
            .and_then(|()| stream.synchronize())
            .map_err(|e| gpu_err("copy", e))?;
        Ok(true)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl HipBuffer {
    /// The device memory of `len` bytes at `offset`; `None` for host-mapped memory.
    fn device_range(&self, offset: usize, len: usize) -> Result<Option<MemRange<'_>>> {
        let r = self.range("copy", offset, len)?;
        let whole = match &self.mem {
            Mem::Owned(b) => MemRange::of_buffer(b),
            Mem::Slot { arena, slot } => {
                let v = arena.view::<u8>(slot).map_err(|e| gpu_err("copy", e))?;
                MemRange::of_view(&v)
            }
            Mem::Mapped(_) => return Ok(None),
        };
        whole
            .sub(r.start, r.len())
            .map(Some)
            .map_err(|e| gpu_err("copy", e))
    }
}

/// The device's one stream, seen through the graph's trait.
pub struct HipStream {
    inner: Arc<Inner>,
}

impl Stream for HipStream {
    fn synchronize(&self) -> Result<()> {
        self.inner
            .sb
            .stream()
            .synchronize()
            .map_err(|e| gpu_err("synchronize", e))
    }
}

/// True when `a` and `b` are the same bytes of the same buffer.
pub(crate) fn same_mem(a: &TensorMem<'_>, b: &TensorMem<'_>) -> bool {
    std::ptr::eq(a.buffer, b.buffer) && a.offset == b.offset
}

/// `g`'s destination, which the launch being queued rewrites: the quantization cache forgets
/// what it held of those bytes.
pub(crate) fn rewritten<'a>(d: &HipDevice, g: &GroupNode<'a>) -> Result<MemRange<'a>> {
    let out = addr(&g.dst)?;
    d.inner.q8.lock().written(out.addr(), out.len());
    Ok(out)
}

/// The device memory of an operand: exactly its extent inside its buffer.
pub(crate) fn addr<'a>(m: &TensorMem<'a>) -> Result<MemRange<'a>> {
    let b: &'a HipBuffer = m
        .buffer
        .as_any()
        .downcast_ref::<HipBuffer>()
        .ok_or_else(|| gpu_err("launch", "buffer was not allocated by the hip buffer type"))?;
    if m.offset
        .checked_add(m.tensor.extent())
        .is_none_or(|e| e > b.size)
    {
        return Err(gpu_err(
            "launch",
            format!("`{}` exceeds its buffer", m.tensor.name),
        ));
    }
    let whole = match &b.mem {
        Mem::Owned(buf) => MemRange::of_buffer(buf),
        Mem::Slot { arena, slot } => {
            MemRange::of_view(&arena.view::<u8>(slot).map_err(|e| gpu_err("launch", e))?)
        }
        Mem::Mapped(m) => m.range(),
    };
    whole
        .sub(m.offset, m.tensor.extent())
        .map_err(|e| gpu_err("launch", e))
}

impl Device for HipDevice {
    fn name(&self) -> &str {
        &self.inner.name
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &self.bt
    }
    fn supports_op(&self, t: &Tensor, srcs: &[&Tensor]) -> bool {
        match t.op {
            // Whole layers run only as launch groups do (not with `HipOptions::group` off).
            Op::DecodeLayer(_) => self.inner.opts.group && stack::takes(self, t, srcs),
            _ => ops::supports(t, srcs),
        }
    }
    fn new_stream(&self) -> Result<Box<dyn Stream>> {
        Ok(Box::new(HipStream {
            inner: self.inner.clone(),
        }))
    }
    fn launch(
        &self,
        _stream: &dyn Stream,
        t: &Tensor,
        dst: TensorMem<'_>,
        srcs: &[TensorMem<'_>],
    ) -> Result<()> {
        let run = || match t.op {
            Op::DecodeLayer(_) => stack::launch_one(self, t, dst, srcs),
            _ => ops::launch(self, t, dst, srcs),
        };
        let Some(prof) = &self.inner.profile else {
            return run();
        };
        let start = self.timing_event()?;
        run()?;
        let end = self.timing_event()?;
        let ts: Vec<&Tensor> = srcs.iter().map(|m| m.tensor).collect();
        prof.lock()
            .push(profile::key(t, &ts), start, end)
            .map_err(|e| gpu_err("profile", e))
    }
    fn launch_group(&self, _stream: &dyn Stream, group: &[GroupNode<'_>]) -> Result<usize> {
        if !self.inner.opts.group {
            return Ok(0);
        }
        let Some(prof) = &self.inner.profile else {
            return self.launch_grouped(group);
        };
        let start = self.timing_event()?;
        let n = self.launch_grouped(group)?;
        if n == 0 {
            return Ok(0);
        }
        let end = self.timing_event()?;
        let keys: Vec<String> = group[..n]
            .iter()
            .map(|g| {
                let ts: Vec<&Tensor> = g.srcs.iter().map(|m| m.tensor).collect();
                profile::key(g.tensor, &ts)
            })
            .collect();
        prof.lock()
            .push(format!("group of {n}: {}", keys.join(" + ")), start, end)
            .map_err(|e| gpu_err("profile", e))?;
        Ok(n)
    }
    fn begin_capture(&self) -> Result<bool> {
        if self.inner.profile.is_some() {
            // Timing events go around every node, which needs plain launches.
            return Ok(false);
        }
        // A captured run must quantize its own mat-vec inputs: a cache hit on work done before
        // the capture would leave the quantization out of the graph.
        self.inner.q8.lock().clear();
        if let Err(e) = self.inner.sb.stream().begin_capture() {
            tracing::debug!("hip backend: stream capture unavailable: {e}");
            return Ok(false);
        }
        self.inner.capturing.store(true, Ordering::Relaxed);
        Ok(true)
    }
    fn end_capture(&self) -> Result<Box<dyn Captured>> {
        self.inner.capturing.store(false, Ordering::Relaxed);
        // Launches recorded but not run may have filled the cache (a failed capture is
        // followed by plain launches, which must quantize for real).
        self.inner.q8.lock().clear();
        let stream = self.inner.sb.stream();
        let graph = stream
            .end_capture()
            .map_err(|e| gpu_err("end capture", e))?;
        let exec = graph
            .instantiate()
            .map_err(|e| gpu_err("instantiate graph", e))?;
        // The scratch and quantization buffers may be replaced by later (larger) runs: the
        // graph keeps the ones it recorded.
        let keep = [
            self.inner.scratch.lock().clone(),
            self.inner.q8.lock().buffer(),
        ]
        .into_iter()
        .flatten()
        .collect();
        Ok(Box::new(HipCaptured {
            exec,
            inner: self.inner.clone(),
            _keep: keep,
        }))
    }
}

/// A captured run of launches on the device's stream.
struct HipCaptured {
    exec: gpu_mem::GraphExec,
    inner: Arc<Inner>,
    /// Backend-owned buffers the recorded launches use.
    _keep: Vec<Arc<DeviceBuffer<u8>>>,
}

impl Captured for HipCaptured {
    fn replay(&self) -> Result<()> {
        // `gpu-mem` refuses the replay when an allocation the recording uses was freed; the
        // backend's own buffers are kept alive in `_keep`, the owner's outlive the replay by
        // `Captured`'s contract.
        self.exec
            .launch(self.inner.sb.stream())
            .map_err(|e| gpu_err("graph launch", e))?;
        // The replay rewrote the quantization buffer behind the cache's back.
        self.inner.q8.lock().clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests;
