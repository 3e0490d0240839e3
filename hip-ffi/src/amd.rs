//! The AMD provider: the HIP runtime (`libamdhip64`) and hipBLAS, called directly.

use std::cell::Cell;
use std::ffi::{c_char, c_void, CStr};
use std::sync::OnceLock;

use crate::api::*;
use crate::error::{c_int, BlasError, Error, HipError, Result};
use crate::loader;
use crate::sys::hip::{self, hipDeviceAttribute_t as attr, hipError_t, HipLib};
use crate::sys::hipblas::{
    self as hb, hipblasGemmAlgo_t::HIPBLAS_GEMM_DEFAULT, hipblasStatus_t as status, HipblasLib,
};
use crate::sys::hipblas_abi::{GemmAbi, GEMM_ABI_V1, GEMM_ABI_V2};

/// The HIP runtime plus a lazily loaded hipBLAS.
pub struct AmdProvider {
    hip: HipLib,
    hip_name: String,
    /// Where hipBLAS is looked for when first needed.
    dirs: loader::InstallDirs,
    blas: OnceLock<std::result::Result<(HipblasLib, String, GemmAbi), Error>>,
}

thread_local! {
    /// The device this thread last made current through the AMD provider.
    static CURRENT: Cell<i32> = const { Cell::new(-1) };
}

impl AmdProvider {
    /// Loads the HIP runtime (from the loader path, then `dirs`) and initialises it.
    pub fn load(dirs: &loader::InstallDirs) -> Result<Self> {
        let lib = loader::open_first("HIP runtime", &loader::hip_candidates(dirs))?;
        // SAFETY: the library is a HIP runtime (matched by soname); its exported symbols have
        // the signatures of the HIP 5.x headers the table was generated from, which later
        // releases kept for these calls.
        let hip = unsafe { HipLib::from_library(lib.library) }.map_err(|e| {
            Error::Load(crate::error::LoadError {
                what: "HIP runtime",
                tried: vec![(lib.name.clone(), format!("missing symbol: {e}"))],
            })
        })?;
        let p = AmdProvider {
            hip,
            hip_name: lib.name,
            dirs: dirs.clone(),
            blas: OnceLock::new(),
        };
        // SAFETY: plain C call with a flags argument that must be 0.
        p.check("hipInit", unsafe { p.hip.hipInit(0) })?;
        Ok(p)
    }

    fn check(&self, call: &'static str, status: hipError_t::Type) -> Result<()> {
        if status == hipError_t::hipSuccess {
            return Ok(());
        }
        // SAFETY: hipGetErrorString returns a static NUL-terminated string for any code.
        let msg = unsafe { self.hip.hipGetErrorString(status) };
        let message = if msg.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null, NUL-terminated, static (see above).
            unsafe { CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned()
        };
        Err(Error::Hip(HipError {
            call,
            code: status as i32,
            native: None,
            message,
        }))
    }

    fn blas(&self) -> Result<&(HipblasLib, String, GemmAbi)> {
        self.blas
            .get_or_init(|| {
                let lib = loader::open_first("hipBLAS", &loader::hipblas_candidates(&self.dirs))?;
                let abi = if lib.name.contains("libhipblas.so.3") {
                    GEMM_ABI_V2
                } else {
                    GEMM_ABI_V1
                };
                // SAFETY: the library is hipBLAS (matched by soname) and exports these C calls.
                let table = unsafe { HipblasLib::from_library(lib.library) }.map_err(|e| {
                    Error::Load(crate::error::LoadError {
                        what: "hipBLAS",
                        tried: vec![(lib.name.clone(), format!("missing symbol: {e}"))],
                    })
                })?;
                Ok((table, lib.name, abi))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn blas_check(call: &'static str, code: status::Type) -> Result<()> {
        if code == status::HIPBLAS_STATUS_SUCCESS {
            return Ok(());
        }
        // hipBLAS's codes are small enum values: they fit an i32.
        let code = i32::try_from(code).unwrap_or(i32::MAX);
        Err(Error::Blas(BlasError {
            call,
            status: code,
            native: None,
            message: blas_status_name(code).to_owned(),
        }))
    }

    fn gemm_type(abi: &GemmAbi, t: GemmType) -> hb::hipblasDatatype_t::Type {
        match t {
            GemmType::F32 => abi.r_32f,
            GemmType::F16 => abi.r_16f,
            GemmType::BF16 => abi.r_16bf,
        }
    }
}

/// Names of hipBLAS status codes.
pub fn blas_status_name(code: i32) -> &'static str {
    let Ok(code) = status::Type::try_from(code) else {
        return "HIPBLAS_STATUS_UNKNOWN";
    };
    match code {
        status::HIPBLAS_STATUS_SUCCESS => "HIPBLAS_STATUS_SUCCESS",
        status::HIPBLAS_STATUS_NOT_INITIALIZED => "HIPBLAS_STATUS_NOT_INITIALIZED",
        status::HIPBLAS_STATUS_ALLOC_FAILED => "HIPBLAS_STATUS_ALLOC_FAILED",
        status::HIPBLAS_STATUS_INVALID_VALUE => "HIPBLAS_STATUS_INVALID_VALUE",
        status::HIPBLAS_STATUS_MAPPING_ERROR => "HIPBLAS_STATUS_MAPPING_ERROR",
        status::HIPBLAS_STATUS_EXECUTION_FAILED => "HIPBLAS_STATUS_EXECUTION_FAILED",
        status::HIPBLAS_STATUS_INTERNAL_ERROR => "HIPBLAS_STATUS_INTERNAL_ERROR",
        status::HIPBLAS_STATUS_NOT_SUPPORTED => "HIPBLAS_STATUS_NOT_SUPPORTED",
        status::HIPBLAS_STATUS_ARCH_MISMATCH => "HIPBLAS_STATUS_ARCH_MISMATCH",
        status::HIPBLAS_STATUS_HANDLE_IS_NULLPTR => "HIPBLAS_STATUS_HANDLE_IS_NULLPTR",
        status::HIPBLAS_STATUS_INVALID_ENUM => "HIPBLAS_STATUS_INVALID_ENUM",
        _ => "HIPBLAS_STATUS_UNKNOWN",
    }
}

fn hip_attr(a: DeviceAttribute) -> attr::Type {
    match a {
        DeviceAttribute::MultiprocessorCount => attr::hipDeviceAttributeMultiprocessorCount,
        DeviceAttribute::WarpSize => attr::hipDeviceAttributeWarpSize,
        DeviceAttribute::MaxThreadsPerBlock => attr::hipDeviceAttributeMaxThreadsPerBlock,
        DeviceAttribute::MaxSharedMemoryPerBlock => attr::hipDeviceAttributeMaxSharedMemoryPerBlock,
        DeviceAttribute::ComputeCapabilityMajor => attr::hipDeviceAttributeComputeCapabilityMajor,
        DeviceAttribute::ComputeCapabilityMinor => attr::hipDeviceAttributeComputeCapabilityMinor,
        DeviceAttribute::ClockRateKhz => attr::hipDeviceAttributeClockRate,
        DeviceAttribute::MemoryClockRateKhz => attr::hipDeviceAttributeMemoryClockRate,
        DeviceAttribute::MemoryBusWidthBits => attr::hipDeviceAttributeMemoryBusWidth,
        DeviceAttribute::L2CacheBytes => attr::hipDeviceAttributeL2CacheSize,
        DeviceAttribute::PciBusId => attr::hipDeviceAttributePciBusId,
        DeviceAttribute::PciDomainId => attr::hipDeviceAttributePciDomainID,
        DeviceAttribute::PciDeviceId => attr::hipDeviceAttributePciDeviceId,
        DeviceAttribute::Integrated => attr::hipDeviceAttributeIntegrated,
        DeviceAttribute::CooperativeLaunch => attr::hipDeviceAttributeCooperativeLaunch,
        // HIP documents `hipDeviceAttributeSharedMemPerBlockOptin` as CUDA-only: AMD has no
        // opt-in, the per-block maximum is the ceiling.
        DeviceAttribute::MaxSharedMemoryPerBlockOptin => {
            attr::hipDeviceAttributeMaxSharedMemoryPerBlock
        }
    }
}

/// AMD has no dynamic shared memory opt-in (`hipFuncSetAttribute` takes host function
/// pointers, not module kernels): a request within the per-block maximum needs no call, and a
/// larger one cannot be met.
fn dynamic_shared_within_limit(bytes: u32, max_per_block: i32) -> Result<()> {
    if i64::from(bytes) <= i64::from(max_per_block) {
        return Ok(());
    }
    Err(Error::InvalidArgument {
        call: "hipFuncSetAttribute",
        what: format!(
            "{bytes} bytes of dynamic shared memory exceed the device's {max_per_block} bytes \
             per block (AMD has no opt-in beyond it)"
        ),
    })
}

/// `gcnArch` integers name the target in decimal except for the hex-digit steppings.
pub fn gcn_arch_name(gcn_arch: i32) -> String {
    match gcn_arch {
        910 => "gfx90a".to_owned(),
        n if n > 0 => format!("gfx{n}"),
        _ => "gfx(unknown)".to_owned(),
    }
}

fn hip_op(op: Op) -> hb::hipblasOperation_t::Type {
    match op {
        Op::N => hb::hipblasOperation_t::HIPBLAS_OP_N,
        Op::T => hb::hipblasOperation_t::HIPBLAS_OP_T,
    }
}

impl HipApi for AmdProvider {
    fn platform(&self) -> Platform {
        Platform::Amd
    }

    fn library_names(&self) -> Vec<String> {
        let mut v = vec![self.hip_name.clone()];
        if let Some(Ok((_, name, _))) = self.blas.get() {
            v.push(name.clone());
        }
        v
    }

    fn driver_version(&self) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDriverGetVersion", unsafe {
            self.hip.hipDriverGetVersion(&mut v)
        })?;
        Ok(v)
    }

    fn device_count(&self) -> Result<i32> {
        let mut n = 0;
        // SAFETY: writes one int.
        let s = unsafe { self.hip.hipGetDeviceCount(&mut n) };
        if s == hipError_t::hipErrorNoDevice {
            return Ok(0);
        }
        self.check("hipGetDeviceCount", s)?;
        Ok(n)
    }

    fn set_device(&self, device: i32) -> Result<()> {
        if CURRENT.with(Cell::get) == device {
            return Ok(());
        }
        // SAFETY: plain C call; the runtime validates the ordinal.
        self.check("hipSetDevice", unsafe { self.hip.hipSetDevice(device) })?;
        CURRENT.with(|c| c.set(device));
        Ok(())
    }

    fn rebind_current(&self) -> Result<()> {
        let d = CURRENT.with(Cell::get);
        if d < 0 {
            return Ok(());
        }
        // SAFETY: plain C call with an ordinal that was valid when it was chosen.
        self.check("hipSetDevice", unsafe { self.hip.hipSetDevice(d) })
    }

    fn current_device(&self) -> Result<i32> {
        let mut d = 0;
        // SAFETY: writes one int.
        self.check("hipGetDevice", unsafe { self.hip.hipGetDevice(&mut d) })?;
        Ok(d)
    }

    fn device_name(&self, device: i32) -> Result<String> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: the buffer holds `len` bytes; HIP NUL-terminates within it.
        self.check("hipDeviceGetName", unsafe {
            self.hip
                .hipDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, device)
        })?;
        Ok(c_buf_to_string(&buf))
    }

    fn device_attribute(&self, a: DeviceAttribute, device: i32) -> Result<i32> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDeviceGetAttribute", unsafe {
            self.hip.hipDeviceGetAttribute(&mut v, hip_attr(a), device)
        })?;
        Ok(v)
    }

    fn device_arch(&self, device: i32) -> Result<String> {
        let mut v = 0;
        // SAFETY: writes one int.
        self.check("hipDeviceGetAttribute", unsafe {
            self.hip
                .hipDeviceGetAttribute(&mut v, attr::hipDeviceAttributeGcnArch, device)
        })?;
        Ok(gcn_arch_name(v))
    }

    fn device_total_mem(&self, device: i32) -> Result<u64> {
        let mut v = 0usize;
        // SAFETY: writes one size_t.
        self.check("hipDeviceTotalMem", unsafe {
            self.hip.hipDeviceTotalMem(&mut v, device)
        })?;
        Ok(v as u64)
    }

    fn mem_get_info(&self) -> Result<(u64, u64)> {
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two size_t.
        self.check("hipMemGetInfo", unsafe {
            self.hip.hipMemGetInfo(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn malloc(&self, bytes: usize) -> Result<DevicePtr> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer.
        self.check("hipMalloc", unsafe { self.hip.hipMalloc(&mut p, bytes) })?;
        Ok(DevicePtr(p as usize as u64))
    }

    unsafe fn free(&self, ptr: DevicePtr) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` is a live allocation no queued work uses.
        self.check("hipFree", unsafe { self.hip.hipFree(ptr.as_raw()) })
    }

    fn host_malloc(&self, bytes: usize) -> Result<*mut c_void> {
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; flags 0 = hipHostMallocDefault.
        self.check("hipHostMalloc", unsafe {
            self.hip.hipHostMalloc(&mut p, bytes, 0)
        })?;
        Ok(p)
    }

    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()> {
        // SAFETY: the caller guarantees `ptr` is a live pinned allocation.
        self.check("hipHostFree", unsafe { self.hip.hipHostFree(ptr) })
    }

    unsafe fn host_device_ptr(&self, ptr: *mut c_void) -> Result<DevicePtr> {
        let mut d: *mut c_void = std::ptr::null_mut();
        // SAFETY: writes one pointer; the caller guarantees `ptr` is in a live pinned
        // allocation (hipHostMalloc maps it for every device); flags must be 0.
        self.check("hipHostGetDevicePointer", unsafe {
            self.hip.hipHostGetDevicePointer(&mut d, ptr, 0)
        })?;
        Ok(DevicePtr(d as usize as u64))
    }

    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const c_void,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller guarantees both ranges are valid for `bytes`.
        self.check("hipMemcpyHtoDAsync", unsafe {
            self.hip
                .hipMemcpyHtoDAsync(dst.as_raw(), src as *mut c_void, bytes, stream.0.cast())
        })
    }

    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut c_void,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller guarantees both ranges are valid for `bytes`.
        self.check("hipMemcpyDtoHAsync", unsafe {
            self.hip
                .hipMemcpyDtoHAsync(dst, src.as_raw(), bytes, stream.0.cast())
        })
    }

    unsafe fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller guarantees both ranges are valid device memory.
        self.check("hipMemcpyDtoDAsync", unsafe {
            self.hip
                .hipMemcpyDtoDAsync(dst.as_raw(), src.as_raw(), bytes, stream.0.cast())
        })
    }

    fn device_can_access_peer(&self, device: i32, peer: i32) -> Result<bool> {
        let mut can = 0;
        // SAFETY: writes one int; the runtime validates the ordinals.
        self.check("hipDeviceCanAccessPeer", unsafe {
            self.hip.hipDeviceCanAccessPeer(&mut can, device, peer)
        })?;
        Ok(can != 0)
    }

    fn enable_peer_access(&self, peer: i32) -> Result<()> {
        // SAFETY: plain C call; flags must be 0.
        let s = unsafe { self.hip.hipDeviceEnablePeerAccess(peer, 0) };
        if s == hipError_t::hipErrorPeerAccessAlreadyEnabled {
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
        // SAFETY: the caller guarantees both ranges and their devices.
        self.check("hipMemcpyPeerAsync", unsafe {
            self.hip.hipMemcpyPeerAsync(
                dst.as_raw(),
                dst_device,
                src.as_raw().cast_const(),
                src_device,
                bytes,
                stream.0.cast(),
            )
        })
    }

    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller guarantees the range is device memory.
        self.check("hipMemsetD8Async", unsafe {
            self.hip
                .hipMemsetD8Async(dst.as_raw(), value, bytes, stream.0.cast())
        })
    }

    unsafe fn write_value32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller guarantees an aligned word of device memory; flag 0 keeps the
        // write ordered after earlier work.
        self.check("hipStreamWriteValue32", unsafe {
            self.hip
                .hipStreamWriteValue32(stream.0.cast(), dst.as_raw(), value, 0)
        })
    }

    fn stream_create(&self) -> Result<StreamHandle> {
        let mut s: hip::hipStream_t = std::ptr::null_mut();
        // SAFETY: writes one handle; flag 1 = hipStreamNonBlocking.
        self.check("hipStreamCreateWithFlags", unsafe {
            self.hip.hipStreamCreateWithFlags(&mut s, 1)
        })?;
        Ok(StreamHandle(s.cast()))
    }

    unsafe fn stream_destroy(&self, stream: StreamHandle) -> Result<()> {
        // SAFETY: the caller guarantees the stream is live and unused afterwards.
        self.check("hipStreamDestroy", unsafe {
            self.hip.hipStreamDestroy(stream.0.cast())
        })
    }

    unsafe fn stream_synchronize(&self, stream: StreamHandle) -> Result<()> {
        // SAFETY: the caller guarantees the stream is live.
        self.check("hipStreamSynchronize", unsafe {
            self.hip.hipStreamSynchronize(stream.0.cast())
        })
    }

    unsafe fn stream_query(&self, stream: StreamHandle) -> Result<bool> {
        // SAFETY: the caller guarantees the stream is live.
        let s = unsafe { self.hip.hipStreamQuery(stream.0.cast()) };
        if s == hipError_t::hipErrorNotReady {
            return Ok(false);
        }
        self.check("hipStreamQuery", s).map(|()| true)
    }

    unsafe fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()> {
        // SAFETY: the caller guarantees both are live; flags must be 0.
        self.check("hipStreamWaitEvent", unsafe {
            self.hip
                .hipStreamWaitEvent(stream.0.cast(), event.0.cast(), 0)
        })
    }

    fn event_create(&self, timing: bool) -> Result<EventHandle> {
        let mut e: hip::hipEvent_t = std::ptr::null_mut();
        // hipEventDisableTiming = 2.
        let flags = if timing { 0 } else { 2 };
        // SAFETY: writes one handle.
        self.check("hipEventCreateWithFlags", unsafe {
            self.hip.hipEventCreateWithFlags(&mut e, flags)
        })?;
        Ok(EventHandle(e.cast()))
    }

    unsafe fn event_destroy(&self, event: EventHandle) -> Result<()> {
        // SAFETY: the caller guarantees the event is live and unused afterwards.
        self.check("hipEventDestroy", unsafe {
            self.hip.hipEventDestroy(event.0.cast())
        })
    }

    unsafe fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()> {
        // SAFETY: the caller guarantees both are live.
        self.check("hipEventRecord", unsafe {
            self.hip.hipEventRecord(event.0.cast(), stream.0.cast())
        })
    }

    unsafe fn event_synchronize(&self, event: EventHandle) -> Result<()> {
        // SAFETY: the caller guarantees the event is live.
        self.check("hipEventSynchronize", unsafe {
            self.hip.hipEventSynchronize(event.0.cast())
        })
    }

    unsafe fn event_query(&self, event: EventHandle) -> Result<bool> {
        // SAFETY: the caller guarantees the event is live.
        let s = unsafe { self.hip.hipEventQuery(event.0.cast()) };
        if s == hipError_t::hipErrorNotReady {
            return Ok(false);
        }
        self.check("hipEventQuery", s).map(|()| true)
    }

    unsafe fn event_elapsed_ms(&self, start: EventHandle, stop: EventHandle) -> Result<f32> {
        let mut ms = 0f32;
        // SAFETY: the caller guarantees both events are live timing events; writes one float.
        self.check("hipEventElapsedTime", unsafe {
            self.hip
                .hipEventElapsedTime(&mut ms, start.0.cast(), stop.0.cast())
        })?;
        Ok(ms)
    }

    unsafe fn module_load_data(&self, image: &[u8]) -> Result<ModuleHandle> {
        let mut m: hip::hipModule_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees `image` is a valid code object; HIP reads it during the
        // call only.
        self.check("hipModuleLoadData", unsafe {
            self.hip.hipModuleLoadData(&mut m, image.as_ptr().cast())
        })?;
        Ok(ModuleHandle(m.cast()))
    }

    unsafe fn module_unload(&self, module: ModuleHandle) -> Result<()> {
        // SAFETY: the caller guarantees the module is live and unused afterwards.
        self.check("hipModuleUnload", unsafe {
            self.hip.hipModuleUnload(module.0.cast())
        })
    }

    unsafe fn module_get_function(
        &self,
        module: ModuleHandle,
        name: &CStr,
    ) -> Result<FunctionHandle> {
        let mut f: hip::hipFunction_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees the module is live; `name` is NUL-terminated.
        self.check("hipModuleGetFunction", unsafe {
            self.hip
                .hipModuleGetFunction(&mut f, module.0.cast(), name.as_ptr())
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
        // SAFETY: the caller guarantees `params` matches the kernel's parameters.
        self.check("hipModuleLaunchKernel", unsafe {
            self.hip.hipModuleLaunchKernel(
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

    // `launch_kernel_cooperative`: the trait's default (unsupported). HIP 5.2's headers, which
    // the bindings come from, declare no cooperative launch of module kernels
    // (`hipModuleLaunchCooperativeKernel` came with ROCm 5.5), and `hipLaunchCooperativeKernel`
    // takes host function pointers only.

    unsafe fn function_set_max_dynamic_shared(
        &self,
        _function: FunctionHandle,
        bytes: u32,
    ) -> Result<()> {
        let device = self.current_device()?;
        let max = self.device_attribute(DeviceAttribute::MaxSharedMemoryPerBlock, device)?;
        dynamic_shared_within_limit(bytes, max)
    }

    unsafe fn occupancy_max_blocks_per_sm(
        &self,
        function: FunctionHandle,
        block_threads: u32,
        shared_mem_bytes: u32,
    ) -> Result<u32> {
        const CALL: &str = "hipModuleOccupancyMaxActiveBlocksPerMultiprocessor";
        let threads = c_int(CALL, "block threads", block_threads.into())?;
        let mut n = 0;
        // SAFETY: the caller guarantees the function belongs to a live module of the current
        // device; writes one int.
        self.check(CALL, unsafe {
            self.hip.hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(
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
        use hip::hipStreamCaptureMode as m;
        let mode = match mode {
            CaptureMode::Global => m::hipStreamCaptureModeGlobal,
            CaptureMode::ThreadLocal => m::hipStreamCaptureModeThreadLocal,
            CaptureMode::Relaxed => m::hipStreamCaptureModeRelaxed,
        };
        // SAFETY: the caller guarantees the stream is live and not the null stream.
        self.check("hipStreamBeginCapture", unsafe {
            self.hip.hipStreamBeginCapture(stream.0.cast(), mode)
        })
    }

    unsafe fn stream_end_capture(&self, stream: StreamHandle) -> Result<GraphHandle> {
        let mut g: hip::hipGraph_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees the stream is capturing; writes one handle.
        self.check("hipStreamEndCapture", unsafe {
            self.hip.hipStreamEndCapture(stream.0.cast(), &mut g)
        })?;
        Ok(GraphHandle(g.cast()))
    }

    unsafe fn graph_instantiate(&self, graph: GraphHandle) -> Result<GraphExecHandle> {
        let mut e: hip::hipGraphExec_t = std::ptr::null_mut();
        // SAFETY: the caller guarantees the graph is live; no error-node/log buffers requested.
        self.check("hipGraphInstantiate", unsafe {
            self.hip.hipGraphInstantiate(
                &mut e,
                graph.0.cast(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        })?;
        Ok(GraphExecHandle(e.cast()))
    }

    unsafe fn graph_launch(&self, exec: GraphExecHandle, stream: StreamHandle) -> Result<()> {
        // SAFETY: the caller guarantees both handles are live.
        self.check("hipGraphLaunch", unsafe {
            self.hip.hipGraphLaunch(exec.0.cast(), stream.0.cast())
        })
    }

    unsafe fn graph_destroy(&self, graph: GraphHandle) -> Result<()> {
        // SAFETY: the caller guarantees the graph is live and unused afterwards.
        self.check("hipGraphDestroy", unsafe {
            self.hip.hipGraphDestroy(graph.0.cast())
        })
    }

    unsafe fn graph_exec_destroy(&self, exec: GraphExecHandle) -> Result<()> {
        // SAFETY: the caller guarantees the exec is live and unused afterwards.
        self.check("hipGraphExecDestroy", unsafe {
            self.hip.hipGraphExecDestroy(exec.0.cast())
        })
    }

    fn blas_create(&self) -> Result<BlasHandle> {
        let (b, _, _) = self.blas()?;
        let mut h: hb::hipblasHandle_t = std::ptr::null_mut();
        // SAFETY: writes one handle.
        Self::blas_check("hipblasCreate", unsafe { (b.hipblasCreate)(&mut h) })?;
        Ok(BlasHandle(h))
    }

    unsafe fn blas_destroy(&self, handle: BlasHandle) -> Result<()> {
        let (b, _, _) = self.blas()?;
        // SAFETY: the caller guarantees the handle is live and unused afterwards.
        Self::blas_check("hipblasDestroy", unsafe { (b.hipblasDestroy)(handle.0) })
    }

    unsafe fn blas_set_stream(&self, handle: BlasHandle, stream: StreamHandle) -> Result<()> {
        let (b, _, _) = self.blas()?;
        // SAFETY: the caller guarantees both handles are live.
        Self::blas_check("hipblasSetStream", unsafe {
            // The same `ihipStream_t*`, declared once per generated module.
            (b.hipblasSetStream)(handle.0, stream.0.cast())
        })
    }

    unsafe fn blas_set_pointer_mode(&self, handle: BlasHandle, mode: PointerMode) -> Result<()> {
        let (b, _, _) = self.blas()?;
        let mode = match mode {
            PointerMode::Host => hb::hipblasPointerMode_t::HIPBLAS_POINTER_MODE_HOST,
            PointerMode::Device => hb::hipblasPointerMode_t::HIPBLAS_POINTER_MODE_DEVICE,
        };
        // SAFETY: the caller guarantees the handle is live.
        Self::blas_check("hipblasSetPointerMode", unsafe {
            (b.hipblasSetPointerMode)(handle.0, mode)
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
        let (lib, _, _) = self.blas()?;
        // SAFETY: the caller guarantees the handle, scalars and matrices are valid.
        Self::blas_check("hipblasSgemm", unsafe {
            (lib.hipblasSgemm)(
                handle.0,
                hip_op(trans_a),
                hip_op(trans_b),
                m,
                n,
                k,
                alpha,
                a.as_raw().cast(),
                lda,
                b.as_raw().cast(),
                ldb,
                beta,
                c.as_raw().cast(),
                ldc,
            )
        })
    }

    unsafe fn gemm_ex(&self, handle: BlasHandle, g: &GemmEx) -> Result<()> {
        let (lib, _, abi) = self.blas()?;
        // SAFETY: the caller guarantees the handle, scalars and matrices are valid.
        Self::blas_check("hipblasGemmEx", unsafe {
            (lib.hipblasGemmEx)(
                handle.0,
                hip_op(g.trans_a),
                hip_op(g.trans_b),
                g.m,
                g.n,
                g.k,
                g.alpha.cast(),
                g.a.as_raw(),
                Self::gemm_type(abi, g.a_type),
                g.lda,
                g.b.as_raw(),
                Self::gemm_type(abi, g.b_type),
                g.ldb,
                g.beta.cast(),
                g.c.as_raw(),
                Self::gemm_type(abi, g.c_type),
                g.ldc,
                abi.compute_32f,
                HIPBLAS_GEMM_DEFAULT,
            )
        })
    }

    unsafe fn gemm_strided_batched_ex(
        &self,
        handle: BlasHandle,
        g: &GemmEx,
        batch: &Batch,
    ) -> Result<()> {
        let (lib, _, abi) = self.blas()?;
        // SAFETY: the caller guarantees the handle, scalars and every matrix are valid.
        Self::blas_check("hipblasGemmStridedBatchedEx", unsafe {
            (lib.hipblasGemmStridedBatchedEx)(
                handle.0,
                hip_op(g.trans_a),
                hip_op(g.trans_b),
                g.m,
                g.n,
                g.k,
                g.alpha.cast(),
                g.a.as_raw(),
                Self::gemm_type(abi, g.a_type),
                g.lda,
                batch.stride_a,
                g.b.as_raw(),
                Self::gemm_type(abi, g.b_type),
                g.ldb,
                batch.stride_b,
                g.beta.cast(),
                g.c.as_raw(),
                Self::gemm_type(abi, g.c_type),
                g.ldc,
                batch.stride_c,
                batch.count,
                abi.compute_32f,
                HIPBLAS_GEMM_DEFAULT,
            )
        })
    }
}

/// A NUL-terminated C string in a fixed buffer, as a `String`.
pub(crate) fn c_buf_to_string(buf: &[c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gcn_arch_names() {
        assert_eq!(gcn_arch_name(1030), "gfx1030");
        assert_eq!(gcn_arch_name(910), "gfx90a");
        assert_eq!(gcn_arch_name(0), "gfx(unknown)");
    }

    #[test]
    fn dynamic_shared_memory_is_checked_against_the_per_block_maximum() {
        assert!(dynamic_shared_within_limit(0, 65_536).is_ok());
        assert!(dynamic_shared_within_limit(65_536, 65_536).is_ok());
        let e = dynamic_shared_within_limit(65_537, 65_536).expect_err("over the maximum");
        assert!(
            matches!(
                e,
                Error::InvalidArgument {
                    call: "hipFuncSetAttribute",
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("65537 bytes"), "{e}");
        // A negative maximum (a runtime fault) admits nothing.
        assert!(dynamic_shared_within_limit(1, -1).is_err());
    }

    #[test]
    fn new_device_attributes_map_to_hip_attributes() {
        assert_eq!(
            hip_attr(DeviceAttribute::CooperativeLaunch),
            attr::hipDeviceAttributeCooperativeLaunch
        );
        assert_eq!(
            hip_attr(DeviceAttribute::MaxSharedMemoryPerBlockOptin),
            hip_attr(DeviceAttribute::MaxSharedMemoryPerBlock)
        );
    }

    #[test]
    fn hipblas_status_names() {
        assert_eq!(blas_status_name(3), "HIPBLAS_STATUS_INVALID_VALUE");
        assert_eq!(blas_status_name(77), "HIPBLAS_STATUS_UNKNOWN");
    }
}
