//! Test harness for the kernels on a real GPU, over `gpu-mem`'s safe API: a stream, lazily
//! loaded modules, device buffers that hand out kernel arguments, and launches checked against
//! each kernel's parameter table; plus CPU-side helpers (random data, error measures). Without a
//! GPU or without built kernels every test prints why it skipped; with
//! `ROCMFORGE_REQUIRE_GPU=1` (the GPU machine's runner) that is a failure instead.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::HashMap;

use gpu_mem::testing::skip;
use gpu_mem::{DeviceBuffer, MemRange, ParamKind, Stream};
use rocmforge_kernels::{KernelId, Module};

/// One kernel argument: device memory borrowed from a [`DevBuf`], `Arg::Null`, a scalar, or a
/// by-value struct's bytes.
pub use gpu_mem::KernelArg as Arg;

/// A device allocation (through the device's budget and tracker), freed on drop once the work
/// queued on the harness's stream is done.
pub struct DevBuf<'g> {
    gpu: &'g Gpu,
    buf: DeviceBuffer<u8>,
    /// The size asked for (the allocation may be larger).
    pub bytes: usize,
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // Work using the buffer may still be queued: finish it before the buffer is freed. A
        // failure here is the failing launch's, which reports it itself.
        let _ = self.gpu.stream.synchronize();
    }
}

impl DevBuf<'_> {
    /// The whole allocation.
    pub fn range(&self) -> MemRange<'_> {
        MemRange::of_buffer(&self.buf)
    }

    /// Bytes `offset..offset + bytes`.
    pub fn sub(&self, offset: usize, bytes: usize) -> MemRange<'_> {
        self.range()
            .sub(offset, bytes)
            .unwrap_or_else(|e| panic!("sub-range {offset}+{bytes}: {e}"))
    }

    /// The buffer as a kernel's pointer argument.
    pub fn arg(&self) -> Arg<'_> {
        Arg::Mem(self.range())
    }

    /// The buffer from byte `offset` on, as a kernel's pointer argument.
    pub fn arg_at(&self, offset: usize) -> Arg<'_> {
        Arg::Mem(self.sub(offset, self.buf.len().saturating_sub(offset)))
    }
}

pub struct Gpu {
    pub device: gpu_mem::Device,
    pub stream: Stream,
    /// The code-object target of the device.
    pub target: rocmforge_kernels::Device,
    pub warp: u32,
    pub name: String,
    /// Wait for each launch (tests: a fault is reported by the launch that caused it); off for
    /// benchmarks, which time queued work with events.
    sync_launches: bool,
    modules: parking_lot::Mutex<HashMap<Module, gpu_mem::Module>>,
}

/// The GPU, or `None` after printing why the test skips.
pub fn gpu() -> Option<Gpu> {
    if !rocmforge_kernels::built() {
        return skip("kernels not built: run `cargo xtask kernels`");
    }
    // Prints "skipped: no GPU (...)", or panics under ROCMFORGE_REQUIRE_GPU=1.
    let device = gpu_mem::testing::gpu_or_skip()?;
    let info = device.info();
    let arch = info.arch.clone();
    let target = match arch.strip_prefix("sm_") {
        Some(n) => {
            let v: u32 = n.parse().unwrap_or(0);
            rocmforge_kernels::Device::Nvidia {
                major: v / 10,
                minor: v % 10,
            }
        }
        None => rocmforge_kernels::Device::Amd(arch.clone()),
    };
    let warp = info.warp_size as u32;
    let name = format!("{} ({arch}, warp {warp})", info.name);
    let stream = match Stream::new(&device) {
        Ok(s) => s,
        Err(e) => return skip(format_args!("GPU setup failed: {e}")),
    };
    Some(Gpu {
        device,
        stream,
        target,
        warp,
        name,
        sync_launches: true,
        modules: parking_lot::Mutex::new(HashMap::new()),
    })
}

/// `k`'s parameter list (`kernels`' table, tested against the HIP sources) in `gpu-mem`'s
/// terms, for the checked launch.
fn param_kinds(k: KernelId) -> Vec<ParamKind> {
    k.params()
        .iter()
        .map(|&p| match p {
            rocmforge_kernels::Param::Ptr => ParamKind::Ptr,
            rocmforge_kernels::Param::I32 => ParamKind::I32,
            rocmforge_kernels::Param::I64 => ParamKind::I64,
            rocmforge_kernels::Param::F32 => ParamKind::F32,
            rocmforge_kernels::Param::Attn => {
                ParamKind::Bytes(std::mem::size_of::<rocmforge_kernels::AttnParams>())
            }
            rocmforge_kernels::Param::Stack => {
                ParamKind::Bytes(std::mem::size_of::<rocmforge_kernels::StackParams>())
            }
            rocmforge_kernels::Param::Peer => {
                ParamKind::Bytes(std::mem::size_of::<rocmforge_kernels::PeerReduceParams>())
            }
        })
        .collect()
}

impl Gpu {
    /// The same GPU, with launches left queued (for timing with events).
    pub fn no_sync(mut self) -> Self {
        self.sync_launches = false;
        self
    }

    pub fn alloc(&self, bytes: usize) -> DevBuf<'_> {
        // At least 4 bytes; gpu-mem adds 16 readable bytes past the end of every allocation
        // (`gpu_mem::device::ALLOC_TAIL_SLACK`) for the mat-vec kernels' aligned tail loads.
        let mut buf = DeviceBuffer::<u8>::new(&self.device, bytes.max(4), "kernels test")
            .expect("device malloc");
        // Fill with NaN-ish garbage so kernels that skip writes are caught.
        self.stream
            .memset(&mut buf.view_mut(), 0xFF)
            .expect("memset");
        DevBuf {
            gpu: self,
            buf,
            bytes,
        }
    }

    pub fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> DevBuf<'_> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let mut b = self.alloc(bytes.len());
        let mut dst = b.buf.slice_mut(0..bytes.len()).expect("upload range");
        // Waits for the copy.
        self.stream.write(bytes, &mut dst).expect("upload");
        b
    }

    pub fn download<T: bytemuck::Pod>(&self, buf: &DevBuf<'_>, n: usize) -> Vec<T> {
        let mut out = vec![T::zeroed(); n];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        assert!(bytes.len() <= buf.bytes, "download past the buffer");
        let src = buf.buf.slice(0..bytes.len()).expect("download range");
        // Waits for the copy (and so for every launch queued before it).
        self.stream.read(&src, bytes).expect("download");
        out
    }

    /// Launches `k` after checking `args` against its parameter table and (unless `no_sync`)
    /// waits for it, so a fault is reported by the launch that caused it.
    ///
    /// # Safety
    /// `args` meet `k`'s contract (its HIP source): for the integer arguments and grid given,
    /// every buffer covers all the bytes the kernel reads or writes through it.
    pub unsafe fn launch(&self, k: KernelId, grid: [u32; 3], block: u32, args: &[Arg<'_>]) {
        // SAFETY: the caller's promise, with no dynamic shared memory.
        unsafe { self.launch_smem(k, grid, block, 0, args) }
    }

    /// Calls `f` with kernel `k`'s function, its module loaded at the first use.
    fn with_function<R>(&self, k: KernelId, f: impl FnOnce(&gpu_mem::Function<'_>) -> R) -> R {
        let name = k.name();
        let mut mods = self.modules.lock();
        let module = mods.entry(k.module()).or_insert_with(|| {
            let img = rocmforge_kernels::image(k.module(), &self.target)
                .unwrap_or_else(|e| panic!("{e}"));
            gpu_mem::Module::load(&self.device, img.bytes)
                .unwrap_or_else(|e| panic!("loading {:?}: {e}", k.module()))
        });
        let func = module
            .function(name)
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        f(&func)
    }

    /// Opts `k` in to `smem` bytes of dynamic shared memory (needed beyond 48 KiB on NVIDIA;
    /// not while a stream captures).
    pub fn allow_smem(&self, k: KernelId, smem: u32) {
        let name = k.name();
        self.with_function(k, |f| {
            f.set_max_dynamic_shared(smem)
                .unwrap_or_else(|e| panic!("{name}: {smem} bytes of shared memory: {e}"))
        });
    }

    /// [`Gpu::launch`] with `smem` bytes of dynamic shared memory (beyond 48 KiB only after
    /// [`Gpu::allow_smem`]).
    ///
    /// # Safety
    /// As for [`Gpu::launch`].
    pub unsafe fn launch_smem(
        &self,
        k: KernelId,
        grid: [u32; 3],
        block: u32,
        smem: u32,
        args: &[Arg<'_>],
    ) {
        let name = k.name();
        self.with_function(k, |f| {
            let params = param_kinds(k);
            // SAFETY: the parameter list is the kernel's own (see `param_kinds`); the arguments
            // meet its contract (the caller's promise).
            unsafe {
                self.stream
                    .launch_checked(f, name, &params, grid, [block, 1, 1], smem, args)
            }
            .unwrap_or_else(|e| panic!("launch {name}: {e}"));
        });
        if self.sync_launches {
            self.stream
                .synchronize()
                .unwrap_or_else(|e| panic!("{name} failed: {e}"));
        }
    }
}

/// Deterministic xorshift random numbers.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Normalized mean squared error of `got` against `want` (ggml's test-backend-ops measure).
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let mut err = 0.0f64;
    let mut norm = 0.0f64;
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        err += (f64::from(g) - f64::from(w)).powi(2);
        norm += f64::from(w).powi(2);
    }
    err / norm.max(1e-30)
}

pub fn assert_nmse(what: &str, got: &[f32], want: &[f32], bound: f64) {
    let e = nmse(got, want);
    assert!(
        e <= bound,
        "{what}: NMSE {e:.3e} > {bound:.1e} (first values got {:?} want {:?})",
        &got[..got.len().min(4)],
        &want[..want.len().min(4)]
    );
}

pub fn f16_bits(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}
