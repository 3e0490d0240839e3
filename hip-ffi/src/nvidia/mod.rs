//! The NVIDIA provider: HIP's CUDA platform done at run time. Each HIP call maps to the CUDA
//! driver API (`libcuda.so.1`), each hipBLAS call to cuBLAS, and native status codes to HIP's.
//!
//! The driver API needs a current context per thread; HIP's device model is reproduced with each
//! device's primary context, made current by `set_device` (device 0 for a thread that never chose).

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use parking_lot::Mutex;

use crate::amd::{blas_status_name, c_buf_to_string};
use crate::api::*;
use crate::error::{c_int, code, BlasError, Error, HipError, LoadError, Result};
use crate::loader;
use crate::sys::cublas::{self as cb, cublasPointerMode_t, cublasStatus_t, CublasLib};
use crate::sys::cuda::{self as cu, cudaError_enum as ce, CudaLib};

mod codes;
mod memops;
use codes::{cu_attr, cu_op, cu_type, COMPUTE_32F, GEMM_DEFAULT};
pub use codes::{cu_to_hip, cublas_to_hipblas};

/// The CUDA driver API plus a lazily loaded cuBLAS.
pub struct NvidiaProvider {
    cuda: CudaLib,
    cuda_name: String,
    /// Primary context per device ordinal, retained on first use and kept for the process.
    contexts: Mutex<Vec<Option<usize>>>,
    /// Where cuBLAS is looked for when first needed.
    dirs: loader::InstallDirs,
    blas: OnceLock<std::result::Result<(CublasLib, String), Error>>,
}

thread_local! {
    /// The device whose primary context this thread made current through the NVIDIA provider.
    static CURRENT: Cell<i32> = const { Cell::new(-1) };
}

/// The attributes of one `cuLaunchKernelEx` launch (at most the two rocmforge uses).
struct LaunchAttrs {
    attrs: [cu::CUlaunchAttribute; 2],
    len: u32,
}

impl LaunchAttrs {
    /// `cooperative`: all blocks co-resident (`CU_LAUNCH_ATTRIBUTE_COOPERATIVE`); `early`: the
    /// launch may begin before its predecessor on the stream ends
    /// (`CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`).
    fn new(cooperative: bool, early: bool) -> Self {
        use cu::CUlaunchAttributeID_enum as id;
        let blank = cu::CUlaunchAttribute {
            id: id::CU_LAUNCH_ATTRIBUTE_IGNORE,
            pad: [0; 4],
            value: cu::CUlaunchAttributeValue { pad: [0; 64] },
        };
        let mut a = LaunchAttrs {
            attrs: [blank; 2],
            len: 0,
        };
        if cooperative {
            let slot = &mut a.attrs[a.len as usize];
            slot.id = id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
            slot.value.cooperative = 1;
            a.len += 1;
        }
        if early {
            let slot = &mut a.attrs[a.len as usize];
            slot.id = id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
            slot.value.programmaticStreamSerializationAllowed = 1;
            a.len += 1;
        }
        a
    }
}

impl NvidiaProvider {
    /// Loads the CUDA driver library and initialises it; cuBLAS, when first needed, comes from
    /// the loader path, then `dirs`.
    pub fn load(dirs: &loader::InstallDirs) -> Result<Self> {
        let lib = loader::open_first("CUDA driver", &loader::cuda_candidates())?;
        // SAFETY: the library is NVIDIA's driver library (matched by soname); the versioned
        // symbols in the table keep their CUDA 11.8 signatures in every later driver.
        let cuda = unsafe { CudaLib::from_library(lib.library) }.map_err(|e| {
            Error::Load(LoadError {
                what: "CUDA driver",
                tried: vec![(lib.name.clone(), format!("missing symbol: {e}"))],
            })
        })?;
        let p = NvidiaProvider {
            cuda,
            cuda_name: lib.name,
            contexts: Mutex::new(Vec::new()),
            dirs: dirs.clone(),
            blas: OnceLock::new(),
        };
        // SAFETY: flags must be 0.
        p.check("hipInit", unsafe { p.cuda.cuInit(0) })?;
        Ok(p)
    }

    fn check(&self, call: &'static str, status: cu::CUresult) -> Result<()> {
        if status == ce::CUDA_SUCCESS {
            return Ok(());
        }
        let mut name: *const c_char = std::ptr::null();
        // SAFETY: writes one pointer to a static string (or leaves it null for unknown codes).
        unsafe { self.cuda.cuGetErrorString(status, &mut name) };
        let message = if name.is_null() {
            "unknown CUDA error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated, static.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        Err(Error::Hip(HipError {
            call,
            code: cu_to_hip(status),
            native: Some(("CUresult", status as i32)),
            message,
        }))
    }

    /// The primary context of `device` (index `idx`), retained on first use.
    fn primary_ctx(&self, idx: usize, device: i32) -> Result<cu::CUcontext> {
        let mut contexts = self.contexts.lock();
        if contexts.len() <= idx {
            contexts.resize(idx + 1, None);
        }
        let ctx = match contexts[idx] {
            Some(c) => c as cu::CUcontext,
            None => {
                let mut dev: cu::CUdevice = 0;
                // SAFETY: writes one int; the driver validates the ordinal.
                self.check("hipSetDevice", unsafe {
                    self.cuda.cuDeviceGet(&mut dev, device)
                })?;
                let mut c: cu::CUcontext = std::ptr::null_mut();
                // SAFETY: writes one handle. The primary context is retained for the life of
                // the process (HIP's device model has no release either).
                self.check("hipSetDevice", unsafe {
                    self.cuda.cuDevicePrimaryCtxRetain(&mut c, dev)
                })?;
                contexts[idx] = Some(c as usize);
                c
            }
        };
        Ok(ctx)
    }

    /// Makes sure the calling thread has a current context (device 0 unless it chose one).
    fn ctx(&self) -> Result<()> {
        if CURRENT.with(Cell::get) >= 0 {
            return Ok(());
        }
        self.set_device(0)
    }

    fn blas(&self) -> Result<&(CublasLib, String)> {
        self.blas
            .get_or_init(|| {
                let lib = loader::open_first("cuBLAS", &loader::cublas_candidates(&self.dirs))?;
                // SAFETY: the library is cuBLAS (matched by soname); the `_v2` and `Ex` entry
                // points keep their CUDA 11 signatures in cuBLAS 12 and 13.
                let table = unsafe { CublasLib::from_library(lib.library) }.map_err(|e| {
                    Error::Load(LoadError {
                        what: "cuBLAS",
                        tried: vec![(lib.name.clone(), format!("missing symbol: {e}"))],
                    })
                })?;
                Ok((table, lib.name))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn blas_check(&self, call: &'static str, status: cublasStatus_t::Type) -> Result<()> {
        if status == cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Ok(());
        }
        let hip_status = cublas_to_hipblas(status);
        let message = match self.blas() {
            Ok((b, _)) => {
                // SAFETY: returns a static NUL-terminated string for any status.
                let p = unsafe { b.cublasGetStatusString(status) };
                if p.is_null() {
                    blas_status_name(hip_status).to_owned()
                } else {
                    // SAFETY: non-null, NUL-terminated, static.
                    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                }
            }
            Err(_) => blas_status_name(hip_status).to_owned(),
        };
        Err(Error::Blas(BlasError {
            call,
            status: hip_status,
            native: Some(status as i32),
            message,
        }))
    }

    /// Queues `function` through `cuLaunchKernelEx` with `attrs`, reporting failures as `call`.
    ///
    /// # Safety
    /// As [`HipApi::launch_kernel`], plus whatever the attributes demand of the kernel.
    #[allow(clippy::too_many_arguments, reason = "a launch's own parameters")]
    unsafe fn launch_ex(
        &self,
        call: &'static str,
        function: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamHandle,
        params: *mut *mut c_void,
        attrs: &mut LaunchAttrs,
    ) -> Result<()> {
        self.ctx()?;
        let config = cu::CUlaunchConfig {
            gridDimX: grid[0],
            gridDimY: grid[1],
            gridDimZ: grid[2],
            blockDimX: block[0],
            blockDimY: block[1],
            blockDimZ: block[2],
            sharedMemBytes: shared_mem_bytes,
            hStream: stream.0.cast(),
            attrs: attrs.attrs.as_mut_ptr(),
            numAttrs: attrs.len,
        };
        // SAFETY: `config` and the attributes it points to live across the call (the driver
        // copies them); the caller guarantees `params` matches the kernel and that the kernel
        // keeps what the attributes ask of it.
        self.check(call, unsafe {
            self.cuda
                .cuLaunchKernelEx(&config, function.0.cast(), params, std::ptr::null_mut())
        })
    }
}

impl HipApi for NvidiaProvider {
    fn platform(&self) -> Platform {
        Platform::Nvidia
    }

    fn library_names(&self) -> Vec<String> {
        let mut v = vec![self.cuda_name.clone()];
        if let Some(Ok((_, name))) = self.blas.get() {
            v.push(name.clone());
        }
        v
    }

    fn driver_version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDriverGetVersion", unsafe {
            self.cuda.cuDriverGetVersion(&mut v)
        })?;
        Ok(v)
    }

    fn device_count(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: writes one int.
        self.check("hipGetDeviceCount", unsafe {
            self.cuda.cuDeviceGetCount(&mut n)
        })?;
        Ok(n)
    }

    fn set_device(&self, device: i32) -> Result<()> {
        if CURRENT.with(Cell::get) == device {
            return Ok(());
        }
        let idx = usize::try_from(device).map_err(|_| {
            Error::Hip(HipError {
                call: "hipSetDevice",
                code: code::INVALID_DEVICE,
                native: None,
                message: format!("invalid device ordinal {device}"),
            })
        })?;
        let ctx = self.primary_ctx(idx, device)?;
        // SAFETY: `ctx` is a retained primary context.
        self.check("hipSetDevice", unsafe { self.cuda.cuCtxSetCurrent(ctx) })?;
        CURRENT.with(|c| c.set(device));
        Ok(())
    }

    fn rebind_current(&self) -> Result<()> {
        let d = CURRENT.with(Cell::get);
        let Ok(idx) = usize::try_from(d) else {
            return Ok(());
        };
        let ctx = self.primary_ctx(idx, d)?;
        // SAFETY: `ctx` is a retained primary context.
        self.check("hipSetDevice", unsafe { self.cuda.cuCtxSetCurrent(ctx) })
    }

    fn current_device(&self) -> Result<i32> {
        self.ctx()?;
        Ok(CURRENT.with(Cell::get))
    }

    fn device_name(&self, device: i32) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; the driver NUL-terminates within it.
        self.check("hipDeviceGetName", unsafe {
            self.cuda
                .cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device)
        })?;
        Ok(c_buf_to_string(&buf))
    }

    fn device_attribute(&self, a: DeviceAttribute, device: i32) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDeviceGetAttribute", unsafe {
            self.cuda.cuDeviceGetAttribute(&mut v, cu_attr(a), device)
        })?;
        Ok(v)
    }

    fn device_arch(&self, device: i32) -> Result<String> {
        let major = self.device_attribute(DeviceAttribute::ComputeCapabilityMajor, device)?;
        let minor = self.device_attribute(DeviceAttribute::ComputeCapabilityMinor, device)?;
        Ok(format!("sm_{major}{minor}"))
    }

    fn device_total_mem(&self, device: i32) -> Result<u64> {
        let mut v = 0usize;
        // SAFETY: writes one size_t.
        self.check("hipDeviceTotalMem", unsafe {
            self.cuda.cuDeviceTotalMem_v2(&mut v, device)
        })?;
        Ok(v as u64)
    }

    fn mem_get_info(&self) -> Result<(u64, u64)> {
        self.ctx()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        self.check("hipMemGetInfo", unsafe {
            self.cuda.cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        self.ctx()?;
        let mut p: cu::CUdeviceptr = 0;
        // SAFETY: writes one device pointer.
        self.check("hipMalloc", unsafe {
            self.cuda.cuMemAlloc_v2(&mut p, bytes)
        })?;
        Ok(DevicePtr(p))
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees `ptr` is a live allocation no queued work uses.
        self.check("hipFree", unsafe { self.cuda.cuMemFree_v2(ptr.0) })
    }

    fn host_malloc(&self, bytes: usize) -> Result<*mut c_void> {
        self.ctx()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        self.check("hipHostMalloc", unsafe {
            self.cuda.cuMemAllocHost_v2(&mut p, bytes)
        })?;
        Ok(p)
    }

    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees `ptr` is a live pinned allocation.
        self.check("hipHostFree", unsafe { self.cuda.cuMemFreeHost(ptr) })
    }

    unsafe fn host_device_ptr(&self, ptr: *mut c_void) -> Result<DevicePtr> {
        self.ctx()?;
        let mut d: cu::CUdeviceptr = 0;
        // SAFETY: writes one address; the caller guarantees `ptr` is in a live allocation of
        // cuMemAllocHost (mapped for the context's device); flags must be 0.
        self.check("hipHostGetDevicePointer", unsafe {
            self.cuda.cuMemHostGetDevicePointer_v2(&mut d, ptr, 0)
        })?;
        Ok(DevicePtr(d))
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const c_void,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees both ranges are valid for `bytes`.
        self.check("hipMemcpyHtoDAsync", unsafe {
            self.cuda
                .cuMemcpyHtoDAsync_v2(dst.0, src, bytes, stream.0.cast())
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut c_void,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees both ranges are valid for `bytes`.
        self.check("hipMemcpyDtoHAsync", unsafe {
            self.cuda
                .cuMemcpyDtoHAsync_v2(dst, src.0, bytes, stream.0.cast())
        })
    }

    unsafe fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees both ranges are valid device memory.
        self.check("hipMemcpyDtoDAsync", unsafe {
            self.cuda
                .cuMemcpyDtoDAsync_v2(dst.0, src.0, bytes, stream.0.cast())
        })
    }

    fn device_can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let (mut a, mut b): (cu::CUdevice, cu::CUdevice) = (0, 0);
        // SAFETY: each call writes one int; the driver validates the ordinals.
        self.check("hipDeviceCanAccessPeer", unsafe {
            self.cuda.cuDeviceGet(&mut a, device)
        })?;
        // SAFETY: as above.
        self.check("hipDeviceCanAccessPeer", unsafe {
            self.cuda.cuDeviceGet(&mut b, peer)
        })?;
        let mut can = 0;
        // SAFETY: writes one int.
        self.check("hipDeviceCanAccessPeer", unsafe {
            self.cuda.cuDeviceCanAccessPeer(&mut can, a, b)
        })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        self.ctx()?;
        let idx = usize::try_from(peer).map_err(|_| Error::InvalidArgument {
            call: "hipDeviceEnablePeerAccess",
            what: format!("peer device {peer}"),
        })?;
        let peer_ctx = self.primary_ctx(idx, peer)?;
        // SAFETY: `peer_ctx` is a retained primary context; flags must be 0.
        let s = unsafe { self.cuda.cuCtxEnablePeerAccess(peer_ctx, 0) };
        if s == ce::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        self.check("hipDeviceEnablePeerAccess", s)
    }

    unsafe fn memcpy_peer_async(
        &self,
        dst: DevicePtr,
        dst_device: i32,
        src: DevicePtr,
        src_device: i32,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.ctx()?;
        let ordinal = |d: i32| {
            usize::try_from(d).map_err(|_| Error::InvalidArgument {
                call: "hipMemcpyPeerAsync",
                what: format!("device {d}"),
            })
        };
        let dst_ctx = self.primary_ctx(ordinal(dst_device)?, dst_device)?;
        let src_ctx = self.primary_ctx(ordinal(src_device)?, src_device)?;
        // SAFETY: the caller guarantees both ranges and their devices; the contexts are the
        // devices' retained primary contexts.
        self.check("hipMemcpyPeerAsync", unsafe {
            self.cuda
                .cuMemcpyPeerAsync(dst.0, dst_ctx, src.0, src_ctx, bytes, stream.0.cast())
        })
    }

    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the range is device memory.
        self.check("hipMemsetD8Async", unsafe {
            self.cuda
                .cuMemsetD8Async(dst.0, value, bytes, stream.0.cast())
        })
    }

    unsafe fn write_value32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        stream: StreamHandle,
    ) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees an aligned word of device memory; flag 0
        // (CU_STREAM_WRITE_VALUE_DEFAULT) fences the write after earlier work.
        self.check("hipStreamWriteValue32", unsafe {
            self.cuda
                .cuStreamWriteValue32_v2(stream.0.cast(), dst.0, value, 0)
        })
    }

    unsafe fn write_values32_async(
        &self,
        words: &[(DevicePtr, u32)],
        stream: StreamHandle,
    ) -> Result<()> {
        self.ctx()?;
        for chunk in words.chunks(memops::BATCH_MAX) {
            let ops = memops::write_ops(chunk);
            let n = u32::try_from(ops.len()).unwrap_or(u32::MAX);
            // SAFETY: `ops` holds `n` write operations on aligned device words (the caller's
            // guarantee), read by the driver during the call; flags 0 order each write after
            // earlier work, as single value writes.
            self.check("hipStreamBatchMemOp", unsafe {
                self.cuda
                    .cuStreamBatchMemOp_v2(stream.0.cast(), n, ops.as_ptr().cast_mut(), 0)
            })?;
        }
        Ok(())
    }

    fn stream_create(&self) -> Result<StreamHandle> {
        self.ctx()?;
        let mut s: cu::CUstream = std::ptr::null_mut();
        // SAFETY: writes one handle.
        self.check("hipStreamCreateWithFlags", unsafe {
            self.cuda
                .cuStreamCreate(&mut s, cu::CUstream_flags_enum::CU_STREAM_NON_BLOCKING)
        })?;
        Ok(StreamHandle(s.cast()))
    }

    unsafe fn stream_destroy(&self, stream: StreamHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the stream is live and unused afterwards.
        self.check("hipStreamDestroy", unsafe {
            self.cuda.cuStreamDestroy_v2(stream.0.cast())
        })
    }

    unsafe fn stream_synchronize(&self, stream: StreamHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the stream is live.
        self.check("hipStreamSynchronize", unsafe {
            self.cuda.cuStreamSynchronize(stream.0.cast())
        })
    }

    unsafe fn stream_query(&self, stream: StreamHandle) -> Result<bool> {
        self.ctx()?;
        // SAFETY: the caller guarantees the stream is live.
        let s = unsafe { self.cuda.cuStreamQuery(stream.0.cast()) };
        if s == ce::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.check("hipStreamQuery", s).map(|()| true)
    }

    unsafe fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees both are live; flags must be 0.
        self.check("hipStreamWaitEvent", unsafe {
            self.cuda
                .cuStreamWaitEvent(stream.0.cast(), event.0.cast(), 0)
        })
    }

    fn event_create(&self, timing: bool) -> Result<EventHandle> {
        self.ctx()?;
        let mut e: cu::CUevent = std::ptr::null_mut();
        let flags = if timing {
            cu::CUevent_flags_enum::CU_EVENT_DEFAULT
        } else {
            cu::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING
        };
        // SAFETY: writes one handle.
        self.check("hipEventCreateWithFlags", unsafe {
            self.cuda.cuEventCreate(&mut e, flags)
        })?;
        Ok(EventHandle(e.cast()))
    }

    unsafe fn event_destroy(&self, event: EventHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the event is live and unused afterwards.
        self.check("hipEventDestroy", unsafe {
            self.cuda.cuEventDestroy_v2(event.0.cast())
        })
    }

    unsafe fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees both are live.
        self.check("hipEventRecord", unsafe {
            self.cuda.cuEventRecord(event.0.cast(), stream.0.cast())
        })
    }

    unsafe fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the event is live.
        self.check("hipEventSynchronize", unsafe {
            self.cuda.cuEventSynchronize(event.0.cast())
        })
    }

    unsafe fn event_query(&self, event: EventHandle) -> Result<bool> {
        self.ctx()?;
        // SAFETY: the caller guarantees the event is live.
        let s = unsafe { self.cuda.cuEventQuery(event.0.cast()) };
        if s == ce::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        self.check("hipEventQuery", s).map(|()| true)
    }

    unsafe fn event_elapsed_ms(&self, start: EventHandle, stop: EventHandle) -> Result<f32> {
        self.ctx()?;
        let mut ms = 0f32;
        // SAFETY: the caller guarantees both are live timing events; writes one float.
        self.check("hipEventElapsedTime", unsafe {
            self.cuda
                .cuEventElapsedTime(&mut ms, start.0.cast(), stop.0.cast())
        })?;
        Ok(ms)
    }

    unsafe fn module_load_data(&self, image: &[u8]) -> Result<ModuleHandle> {
        self.ctx()?;
        let mut m: cu::CUmodule = std::ptr::null_mut();
        // SAFETY: the caller guarantees a valid cubin/fatbin/NUL-terminated PTX image; the
        // driver reads it during the call only.
        self.check("hipModuleLoadData", unsafe {
            self.cuda.cuModuleLoadData(&mut m, image.as_ptr().cast())
        })?;
        Ok(ModuleHandle(m.cast()))
    }

    unsafe fn module_unload(&self, module: ModuleHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the module is live and unused afterwards.
        self.check("hipModuleUnload", unsafe {
            self.cuda.cuModuleUnload(module.0.cast())
        })
    }

    unsafe fn module_get_function(
        &self,
        module: ModuleHandle,
        name: &CStr,
    ) -> Result<FunctionHandle> {
        self.ctx()?;
        let mut f: cu::CUfunction = std::ptr::null_mut();
        // SAFETY: the caller guarantees the module is live; `name` is NUL-terminated.
        self.check("hipModuleGetFunction", unsafe {
            self.cuda
                .cuModuleGetFunction(&mut f, module.0.cast(), name.as_ptr())
        })?;
        Ok(FunctionHandle(f.cast()))
    }

    unsafe fn launch_kernel(
        &self,
        function: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamHandle,
        params: *mut *mut c_void,
    ) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees `params` matches the kernel's parameters.
        self.check("hipModuleLaunchKernel", unsafe {
            self.cuda.cuLaunchKernel(
                function.0.cast(),
                grid[0],
                grid[1],
                grid[2],
                block[0],
                block[1],
                block[2],
                shared_mem_bytes,
                stream.0.cast(),
                params,
                std::ptr::null_mut(),
            )
        })
    }

    fn early_launch_supported(&self, device: i32) -> bool {
        self.device_attribute(DeviceAttribute::ComputeCapabilityMajor, device)
            .is_ok_and(|major| major >= 9)
    }

    unsafe fn launch_kernel_early(
        &self,
        function: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamHandle,
        params: *mut *mut c_void,
    ) -> Result<()> {
        let mut attrs = LaunchAttrs::new(false, true);
        // SAFETY: the caller guarantees `params` matches the kernel and that the kernel waits
        // for its predecessors before touching their memory.
        unsafe {
            self.launch_ex(
                "hipLaunchKernelExC",
                function,
                grid,
                block,
                shared_mem_bytes,
                stream,
                params,
                &mut attrs,
            )
        }
    }

    unsafe fn launch_kernel_cooperative(
        &self,
        function: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamHandle,
        params: *mut *mut c_void,
        early: bool,
    ) -> Result<()> {
        let early = early && self.early_launch_supported(self.current_device()?);
        let mut attrs = LaunchAttrs::new(true, early);
        // SAFETY: the caller guarantees `params` matches the kernel and, with `early`, that the
        // kernel waits for its predecessors before touching their memory; the driver refuses a
        // grid whose blocks cannot all be resident.
        unsafe {
            self.launch_ex(
                "hipModuleLaunchCooperativeKernel",
                function,
                grid,
                block,
                shared_mem_bytes,
                stream,
                params,
                &mut attrs,
            )
        }
    }

    unsafe fn function_set_max_dynamic_shared(
        &self,
        function: FunctionHandle,
        bytes: u32,
    ) -> Result<()> {
        const CALL: &str = "hipFuncSetAttribute";
        self.ctx()?;
        let bytes = c_int(CALL, "dynamic shared memory bytes", bytes.into())?;
        // SAFETY: the caller guarantees the function belongs to a live module of the current
        // context; the attribute takes a byte count (the driver checks it against the limit).
        self.check(CALL, unsafe {
            self.cuda.cuFuncSetAttribute(
                function.0.cast(),
                cu::CUfunction_attribute_enum::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                bytes,
            )
        })
    }

    unsafe fn occupancy_max_blocks_per_sm(
        &self,
        function: FunctionHandle,
        block_threads: u32,
        shared_mem_bytes: u32,
    ) -> Result<u32> {
        const CALL: &str = "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor";
        self.ctx()?;
        let threads = c_int(CALL, "block threads", block_threads.into())?;
        let mut n = 0;
        // SAFETY: the caller guarantees the function belongs to a live module of the current
        // context; writes one int.
        self.check(CALL, unsafe {
            self.cuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                function.0.cast(),
                threads,
                shared_mem_bytes as usize,
            )
        })?;
        // A count, never negative.
        Ok(u32::try_from(n).unwrap_or(0))
    }

    unsafe fn stream_begin_capture(&self, stream: StreamHandle, mode: CaptureMode) -> Result<()> {
        use cu::CUstreamCaptureMode_enum as m;
        self.ctx()?;
        let mode = match mode {
            CaptureMode::Global => m::CU_STREAM_CAPTURE_MODE_GLOBAL,
            CaptureMode::ThreadLocal => m::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
            CaptureMode::Relaxed => m::CU_STREAM_CAPTURE_MODE_RELAXED,
        };
        // SAFETY: the caller guarantees the stream is live and not the null stream.
        self.check("hipStreamBeginCapture", unsafe {
            self.cuda.cuStreamBeginCapture_v2(stream.0.cast(), mode)
        })
    }

    unsafe fn stream_end_capture(&self, stream: StreamHandle) -> Result<GraphHandle> {
        self.ctx()?;
        let mut g: cu::CUgraph = std::ptr::null_mut();
        // SAFETY: the caller guarantees the stream is capturing; writes one handle.
        self.check("hipStreamEndCapture", unsafe {
            self.cuda.cuStreamEndCapture(stream.0.cast(), &mut g)
        })?;
        Ok(GraphHandle(g.cast()))
    }

    unsafe fn graph_instantiate(&self, graph: GraphHandle) -> Result<GraphExecHandle> {
        self.ctx()?;
        let mut e: cu::CUgraphExec = std::ptr::null_mut();
        // SAFETY: the caller guarantees the graph is live; writes one handle.
        self.check("hipGraphInstantiate", unsafe {
            self.cuda
                .cuGraphInstantiateWithFlags(&mut e, graph.0.cast(), 0)
        })?;
        Ok(GraphExecHandle(e.cast()))
    }

    unsafe fn graph_launch(&self, exec: GraphExecHandle, stream: StreamHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees both handles are live.
        self.check("hipGraphLaunch", unsafe {
            self.cuda.cuGraphLaunch(exec.0.cast(), stream.0.cast())
        })
    }

    unsafe fn graph_destroy(&self, graph: GraphHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the graph is live and unused afterwards.
        self.check("hipGraphDestroy", unsafe {
            self.cuda.cuGraphDestroy(graph.0.cast())
        })
    }

    unsafe fn graph_exec_destroy(&self, exec: GraphExecHandle) -> Result<()> {
        self.ctx()?;
        // SAFETY: the caller guarantees the exec is live and unused afterwards.
        self.check("hipGraphExecDestroy", unsafe {
            self.cuda.cuGraphExecDestroy(exec.0.cast())
        })
    }

    fn blas_create(&self) -> Result<BlasHandle> {
        self.ctx()?;
        let (b, _) = self.blas()?;
        let mut h: cb::cublasHandle_t = std::ptr::null_mut();
        // SAFETY: writes one handle; the thread's current context is the device's primary one.
        self.blas_check("hipblasCreate", unsafe { b.cublasCreate_v2(&mut h) })?;
        Ok(BlasHandle(h.cast()))
    }

    unsafe fn blas_destroy(&self, handle: BlasHandle) -> Result<()> {
        self.ctx()?;
        let (b, _) = self.blas()?;
        // SAFETY: the caller guarantees the handle is live and unused afterwards.
        self.blas_check("hipblasDestroy", unsafe {
            b.cublasDestroy_v2(handle.0.cast())
        })
    }

    unsafe fn blas_set_stream(&self, handle: BlasHandle, stream: StreamHandle) -> Result<()> {
        let (b, _) = self.blas()?;
        // SAFETY: the caller guarantees both handles are live.
        self.blas_check("hipblasSetStream", unsafe {
            b.cublasSetStream_v2(handle.0.cast(), stream.0.cast())
        })
    }

    unsafe fn blas_set_pointer_mode(&self, handle: BlasHandle, mode: PointerMode) -> Result<()> {
        let (b, _) = self.blas()?;
        let mode = match mode {
            PointerMode::Host => cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST,
            PointerMode::Device => cublasPointerMode_t::CUBLAS_POINTER_MODE_DEVICE,
        };
        // SAFETY: the caller guarantees the handle is live.
        self.blas_check("hipblasSetPointerMode", unsafe {
            b.cublasSetPointerMode_v2(handle.0.cast(), mode)
        })
    }

    unsafe fn sgemm(
        &self,
        handle: BlasHandle,
        trans_a: Op,
        trans_b: Op,
        m: i32,
        n: i32,
        k: i32,
        alpha: *const f32,
        a: DevicePtr,
        lda: i32,
        b: DevicePtr,
        ldb: i32,
        beta: *const f32,
        c: DevicePtr,
        ldc: i32,
    ) -> Result<()> {
        self.ctx()?;
        let (lib, _) = self.blas()?;
        // SAFETY: the caller guarantees the handle, scalars and matrices are valid.
        self.blas_check("hipblasSgemm", unsafe {
            lib.cublasSgemm_v2(
                handle.0.cast(),
                cu_op(trans_a),
                cu_op(trans_b),
                m,
                n,
                k,
                alpha,
                a.0 as usize as *const f32,
                lda,
                b.0 as usize as *const f32,
                ldb,
                beta,
                c.0 as usize as *mut f32,
                ldc,
            )
        })
    }

    unsafe fn gemm_ex(&self, handle: BlasHandle, g: &GemmEx) -> Result<()> {
        self.ctx()?;
        let (lib, _) = self.blas()?;
        // SAFETY: the caller guarantees the handle, scalars and matrices are valid.
        self.blas_check("hipblasGemmEx", unsafe {
            lib.cublasGemmEx(
                handle.0.cast(),
                cu_op(g.trans_a),
                cu_op(g.trans_b),
                g.m,
                g.n,
                g.k,
                g.alpha.cast(),
                g.a.as_raw(),
                cu_type(g.a_type),
                g.lda,
                g.b.as_raw(),
                cu_type(g.b_type),
                g.ldb,
                g.beta.cast(),
                g.c.as_raw(),
                cu_type(g.c_type),
                g.ldc,
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        })
    }

    unsafe fn gemm_strided_batched_ex(
        &self,
        handle: BlasHandle,
        g: &GemmEx,
        batch: &Batch,
    ) -> Result<()> {
        self.ctx()?;
        let (lib, _) = self.blas()?;
        let count = c_int(
            "hipblasGemmStridedBatchedEx",
            "batch count",
            batch.count.into(),
        )?;
        // SAFETY: the caller guarantees the handle, scalars and every matrix are valid.
        self.blas_check("hipblasGemmStridedBatchedEx", unsafe {
            lib.cublasGemmStridedBatchedEx(
                handle.0.cast(),
                cu_op(g.trans_a),
                cu_op(g.trans_b),
                g.m,
                g.n,
                g.k,
                g.alpha.cast(),
                g.a.as_raw(),
                cu_type(g.a_type),
                g.lda,
                batch.stride_a,
                g.b.as_raw(),
                cu_type(g.b_type),
                g.ldb,
                batch.stride_b,
                g.beta.cast(),
                g.c.as_raw(),
                cu_type(g.c_type),
                g.ldc,
                batch.stride_c,
                count,
                COMPUTE_32F,
                GEMM_DEFAULT,
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_attributes_ask_for_what_the_launch_needs() {
        use cu::CUlaunchAttributeID_enum as id;
        let ids = |a: &LaunchAttrs| -> Vec<u32> {
            a.attrs[..a.len as usize].iter().map(|x| x.id).collect()
        };
        let early = LaunchAttrs::new(false, true);
        assert_eq!(
            ids(&early),
            [id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION]
        );
        let coop = LaunchAttrs::new(true, false);
        assert_eq!(ids(&coop), [id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE]);
        let both = LaunchAttrs::new(true, true);
        assert_eq!(
            ids(&both),
            [
                id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE,
                id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            ]
        );
        for a in &both.attrs {
            // SAFETY: both attributes set the union's leading `int` (and zeroed the rest).
            let (on, rest) = unsafe { (a.value.cooperative, &a.value.pad[4..]) };
            assert_eq!(on, 1);
            assert!(rest.iter().all(|&b| b == 0));
        }
        assert_eq!(LaunchAttrs::new(false, false).len, 0);
        // The values the driver reads (CUDA 11.8's cuda.h).
        assert_eq!(id::CU_LAUNCH_ATTRIBUTE_COOPERATIVE, 2);
        assert_eq!(id::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION, 6);
    }
}
