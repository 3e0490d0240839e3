//! Test harness for the kernels on a real GPU: a stream, lazily loaded modules, RAII device
//! buffers and typed kernel arguments over `hip-ffi`, plus CPU-side helpers (random data, error
//! measures). Without a GPU or without built kernels every test prints why it skipped; with
//! `ROCMFORGE_REQUIRE_GPU=1` (the GPU machine's runner) that is a failure instead.

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::HashMap;
use std::ffi::{c_void, CString};

use hip_ffi::{DevicePtr, HipApi, ModuleHandle, StreamHandle};
use kernels::{AttnParams, Device, KernelId, Module};

/// One kernel argument, stored by value; launches pass a pointer to each.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    Ptr(DevicePtr),
    I32(i32),
    I64(i64),
    F32(f32),
    Attn(AttnParams),
}

/// An allocation freed on drop.
pub struct DevBuf<'g> {
    gpu: &'g Gpu,
    pub ptr: DevicePtr,
    pub bytes: usize,
}

impl Drop for DevBuf<'_> {
    fn drop(&mut self) {
        // Work using the buffer may still be queued: finish it before freeing.
        // SAFETY: the stream is live for the Gpu's lifetime, which outlives the buffer.
        let _ = unsafe { self.gpu.api.stream_synchronize(self.gpu.stream) };
        // SAFETY: `ptr` came from this provider's malloc and nothing queued uses it any more.
        let _ = unsafe { self.gpu.api.free(self.ptr) };
    }
}

impl DevBuf<'_> {
    pub fn arg(&self) -> Arg {
        Arg::Ptr(self.ptr)
    }
}

pub struct Gpu {
    pub api: &'static dyn HipApi,
    pub stream: StreamHandle,
    pub device: Device,
    pub warp: u32,
    pub name: String,
    /// Wait for each launch (tests: a fault is reported by the launch that caused it); off for
    /// benchmarks, which time queued work with events.
    sync_launches: bool,
    modules: parking_lot::Mutex<HashMap<Module, ModuleHandle>>,
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: the stream is live; every buffer borrowing this Gpu was dropped before it.
        let _ = unsafe { self.api.stream_synchronize(self.stream) };
        for (_, m) in self.modules.lock().drain() {
            // SAFETY: the stream is idle, so no launch of the module is pending.
            let _ = unsafe { self.api.module_unload(m) };
        }
        // SAFETY: the stream is idle and not used afterwards.
        let _ = unsafe { self.api.stream_destroy(self.stream) };
    }
}

fn skip(reason: &str) -> Option<Gpu> {
    if std::env::var("ROCMFORGE_REQUIRE_GPU").is_ok_and(|v| v == "1") {
        panic!("ROCMFORGE_REQUIRE_GPU=1 but {reason}");
    }
    println!("skipped: {reason}");
    None
}

/// The GPU, or `None` after printing why the test skips.
pub fn gpu() -> Option<Gpu> {
    if !kernels::built() {
        return skip("kernels not built: run `cargo xtask kernels`");
    }
    let api = match hip_ffi::runtime() {
        Ok(a) => a,
        Err(e) => return skip(&format!("no GPU ({e})")),
    };
    let setup = || -> hip_ffi::Result<Gpu> {
        api.set_device(0)?;
        let arch = api.device_arch(0)?;
        let device = match arch.strip_prefix("sm_") {
            Some(n) => {
                let v: u32 = n.parse().unwrap_or(0);
                Device::Nvidia {
                    major: v / 10,
                    minor: v % 10,
                }
            }
            None => Device::Amd(arch.clone()),
        };
        let warp = api.device_attribute(hip_ffi::DeviceAttribute::WarpSize, 0)? as u32;
        let name = format!("{} ({arch}, warp {warp})", api.device_name(0)?);
        let stream = api.stream_create()?;
        Ok(Gpu {
            api,
            stream,
            device,
            warp,
            name,
            sync_launches: true,
            modules: parking_lot::Mutex::new(HashMap::new()),
        })
    };
    match setup() {
        Ok(g) => Some(g),
        Err(e) => skip(&format!("GPU setup failed: {e}")),
    }
}

impl Gpu {
    /// The same GPU, with launches left queued (for timing with events).
    pub fn no_sync(mut self) -> Self {
        self.sync_launches = false;
        self
    }

    pub fn alloc(&self, bytes: usize) -> DevBuf<'_> {
        // 16 readable bytes past the end, as gpu-mem gives every allocation
        // (`gpu_mem::device::ALLOC_TAIL_SLACK`): mat-vec kernels load a row's last bytes with
        // the aligned word that holds them.
        let ptr = self.api.malloc(bytes.max(4) + 16).expect("device malloc");
        let b = DevBuf {
            gpu: self,
            ptr,
            bytes,
        };
        // Fill with NaN-ish garbage so kernels that skip writes are caught.
        // SAFETY: the range was just allocated on this device.
        unsafe { self.api.memset_async(ptr, 0xFF, bytes.max(4), self.stream) }.expect("memset");
        b
    }

    pub fn upload<T: bytemuck::Pod>(&self, data: &[T]) -> DevBuf<'_> {
        let bytes: &[u8] = bytemuck::cast_slice(data);
        let b = self.alloc(bytes.len());
        // SAFETY: `bytes` stays alive until the synchronize below; the destination was just
        // allocated with at least this size.
        unsafe {
            self.api
                .memcpy_htod_async(b.ptr, bytes.as_ptr().cast(), bytes.len(), self.stream)
                .expect("upload");
            self.api
                .stream_synchronize(self.stream)
                .expect("sync after upload");
        }
        b
    }

    pub fn download<T: bytemuck::Pod + Default>(&self, buf: &DevBuf<'_>, n: usize) -> Vec<T> {
        let mut out = vec![T::default(); n];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut out);
        assert!(bytes.len() <= buf.bytes, "download past the buffer");
        // SAFETY: `out` is writable for its length and untouched until the synchronize returns;
        // the source range lies within the allocation.
        unsafe {
            self.api
                .memcpy_dtoh_async(bytes.as_mut_ptr().cast(), buf.ptr, bytes.len(), self.stream)
                .expect("download");
            self.api
                .stream_synchronize(self.stream)
                .expect("sync after download");
        }
        out
    }

    fn function(&self, module: Module, name: &str) -> hip_ffi::FunctionHandle {
        let mut mods = self.modules.lock();
        let m = *mods.entry(module).or_insert_with(|| {
            let img = kernels::image(module, &self.device).unwrap_or_else(|e| panic!("{e}"));
            // SAFETY: the image was built for this platform and architecture family.
            unsafe { self.api.module_load_data(img.bytes) }
                .unwrap_or_else(|e| panic!("loading {module:?}: {e}"))
        });
        let cname = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: the module is live (held in the cache until drop).
        unsafe { self.api.module_get_function(m, &cname) }.unwrap_or_else(|e| panic!("{name}: {e}"))
    }

    /// Launches `k` and (unless `no_sync`) waits for it, so a fault is reported by the launch
    /// that caused it.
    pub fn launch(&self, k: KernelId, grid: [u32; 3], block: u32, args: &[Arg]) {
        self.launch_named(k.module(), k.name(), grid, block, args);
    }

    /// [`Gpu::launch`] by symbol, for kernel variants that have no [`KernelId`] (benchmarks).
    pub fn launch_named(
        &self,
        module: Module,
        name: &str,
        grid: [u32; 3],
        block: u32,
        args: &[Arg],
    ) {
        let f = self.function(module, name);
        let mut vals: Vec<Arg> = args.to_vec();
        let mut ptrs: Vec<*mut c_void> = vals
            .iter_mut()
            .map(|a| match a {
                Arg::Ptr(p) => (&mut p.0 as *mut u64).cast(),
                Arg::I32(v) => (v as *mut i32).cast(),
                Arg::I64(v) => (v as *mut i64).cast(),
                Arg::F32(v) => (v as *mut f32).cast(),
                Arg::Attn(v) => (v as *mut AttnParams).cast(),
            })
            .collect();
        // SAFETY: one pointer per parameter, each to a value of the type the kernel's signature
        // declares (the tests mirror the .hip signatures); `vals` outlives the synchronize.
        unsafe {
            self.api
                .launch_kernel(f, grid, [block, 1, 1], 0, self.stream, ptrs.as_mut_ptr())
                .unwrap_or_else(|e| panic!("launch {name}: {e}"));
            if self.sync_launches {
                self.api
                    .stream_synchronize(self.stream)
                    .unwrap_or_else(|e| panic!("{name} failed: {e}"));
            }
        }
        // The driver copied the argument values at launch; they may go now.
        drop(vals);
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
