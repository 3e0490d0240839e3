//! The HIP-shaped API both providers implement: thin, `unsafe` where pointer validity or call
//! order matters, every status turned into a `Result`.

use std::ffi::{c_void, CStr};
use std::fmt;

use crate::error::Result;

/// Which vendor stack a provider drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Platform {
    /// AMD: the HIP runtime (`libamdhip64`) and hipBLAS.
    Amd,
    /// NVIDIA: HIP's CUDA platform, i.e. the CUDA driver API and cuBLAS.
    Nvidia,
}

impl Platform {
    /// Lower-case name, as `ROCMFORGE_PLATFORM` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Amd => "amd",
            Platform::Nvidia => "nvidia",
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A device address (`hipDeviceptr_t` / `CUdeviceptr`), kept as an integer so offset arithmetic
/// is checked and never dereferenced on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
#[repr(transparent)]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device pointer.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// `self + bytes`, or `None` on overflow.
    pub fn checked_add(self, bytes: u64) -> Option<DevicePtr> {
        self.0.checked_add(bytes).map(DevicePtr)
    }

    /// True for the null pointer.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }

    /// As the `void*` HIP takes.
    pub fn as_raw(self) -> *mut c_void {
        self.0 as usize as *mut c_void
    }
}

macro_rules! handle {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(transparent)]
        pub struct $name(pub *mut c_void);

        // SAFETY: the handle is an opaque token the vendor runtime accepts from any thread; all
        // access goes through the runtime, which does its own locking.
        unsafe impl Send for $name {}
        // SAFETY: as for Send: sharing the token shares no host memory.
        unsafe impl Sync for $name {}

        impl $name {
            /// The null handle (for streams: the legacy default stream).
            pub const NULL: $name = $name(std::ptr::null_mut());

            /// True for the null handle.
            pub fn is_null(self) -> bool {
                self.0.is_null()
            }
        }
    };
}

handle!(
    /// `hipStream_t` / `CUstream`.
    StreamHandle
);
handle!(
    /// `hipEvent_t` / `CUevent`.
    EventHandle
);
handle!(
    /// `hipModule_t` / `CUmodule`.
    ModuleHandle
);
handle!(
    /// `hipFunction_t` / `CUfunction`.
    FunctionHandle
);
handle!(
    /// `hipGraph_t` / `CUgraph`.
    GraphHandle
);
handle!(
    /// `hipGraphExec_t` / `CUgraphExec`.
    GraphExecHandle
);
handle!(
    /// `hipblasHandle_t` / `cublasHandle_t`.
    BlasHandle
);

/// Device attributes read through `*DeviceGetAttribute` (never the property struct, whose layout
/// changes between releases).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceAttribute {
    /// Compute units (AMD) or streaming multiprocessors (NVIDIA).
    MultiprocessorCount,
    /// Threads per wavefront (32 or 64) or warp (32).
    WarpSize,
    /// The most threads one block may have.
    MaxThreadsPerBlock,
    /// Shared (LDS) memory per block in bytes, without opting in.
    MaxSharedMemoryPerBlock,
    /// Compute capability major (NVIDIA); on AMD, HIP's `gfx` major (9 for gfx90a).
    ComputeCapabilityMajor,
    /// Compute capability minor (NVIDIA); on AMD, HIP's `gfx` minor.
    ComputeCapabilityMinor,
    /// Peak core clock in kHz.
    ClockRateKhz,
    /// Peak memory clock in kHz.
    MemoryClockRateKhz,
    /// Global memory bus width in bits.
    MemoryBusWidthBits,
    /// L2 cache size in bytes.
    L2CacheBytes,
    /// PCI bus number of the device.
    PciBusId,
    /// PCI domain of the device.
    PciDomainId,
    /// PCI device (slot) number of the device.
    PciDeviceId,
    /// 1 when the GPU is integrated with the CPU (an APU sharing system memory), else 0.
    Integrated,
    /// 1 when the device can run cooperative launches
    /// ([`HipApi::launch_kernel_cooperative`]), else 0.
    CooperativeLaunch,
    /// The most dynamic plus static shared memory one block may use after opting in with
    /// [`HipApi::function_set_max_dynamic_shared`]. NVIDIA: `MAX_SHARED_MEMORY_PER_BLOCK_OPTIN`;
    /// AMD has no opt-in (HIP documents its opt-in attribute as CUDA-only), so this is the plain
    /// per-block maximum there.
    MaxSharedMemoryPerBlockOptin,
}

/// Stream-capture modes (`hipStreamCaptureMode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CaptureMode {
    /// Unsafe API calls from any thread fail while any thread captures (`hipStreamCaptureModeGlobal`).
    Global,
    /// Only the capturing thread's unsafe calls fail (`hipStreamCaptureModeThreadLocal`).
    ThreadLocal,
    /// No call is prohibited during capture (`hipStreamCaptureModeRelaxed`).
    Relaxed,
}

/// Transpose flags for BLAS calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Use the matrix as stored (column-major).
    N,
    /// Use its transpose.
    T,
}

/// Element types of `gemmEx` operands; compute is always f32.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GemmType {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
}

/// Where `alpha`/`beta` live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PointerMode {
    /// `alpha`/`beta` are host pointers, read when the call is made.
    Host,
    /// `alpha`/`beta` are device pointers, read when the kernel runs (graph-capture safe).
    Device,
}

/// Arguments of a `gemmEx` (column-major, as BLAS sees it): C = alpha * op(A) op(B) + beta * C,
/// with f32 compute and `alpha`/`beta` f32 in the handle's pointer mode.
#[derive(Debug, Clone, Copy)]
pub struct GemmEx {
    /// Whether A is used as stored or transposed.
    pub trans_a: Op,
    /// Whether B is used as stored or transposed.
    pub trans_b: Op,
    /// Rows of op(A) and C.
    pub m: i32,
    /// Columns of op(B) and C.
    pub n: i32,
    /// Columns of op(A), rows of op(B).
    pub k: i32,
    /// The scale of A·B, in the handle's [`PointerMode`].
    pub alpha: *const f32,
    /// Matrix A.
    pub a: DevicePtr,
    /// Element type of A.
    pub a_type: GemmType,
    /// Leading dimension of A (elements between columns as stored).
    pub lda: i32,
    /// Matrix B.
    pub b: DevicePtr,
    /// Element type of B.
    pub b_type: GemmType,
    /// Leading dimension of B.
    pub ldb: i32,
    /// The scale of C's previous contents, in the handle's [`PointerMode`].
    pub beta: *const f32,
    /// Matrix C, read (when beta is not 0) and written.
    pub c: DevicePtr,
    /// Element type of C.
    pub c_type: GemmType,
    /// Leading dimension of C.
    pub ldc: i32,
}

/// Strides (in elements) and count for a strided-batched `gemmEx`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Batch {
    /// Elements from one A matrix to the next.
    pub stride_a: i64,
    /// Elements from one B matrix to the next.
    pub stride_b: i64,
    /// Elements from one C matrix to the next.
    pub stride_c: i64,
    /// Number of products.
    pub count: i32,
}

/// The HIP API as rocmforge uses it. One implementation per platform; calls act on the calling
/// thread's current device (set with [`HipApi::set_device`], device 0 until then), as in HIP.
///
/// There is deliberately no device-wide synchronisation: callers synchronise the streams they
/// used.
pub trait HipApi: Send + Sync {
    /// Which platform this provider drives.
    fn platform(&self) -> Platform;
    /// File names of the vendor libraries in use (for reports).
    fn library_names(&self) -> Vec<String>;
    /// Driver version as the vendor encodes it.
    fn driver_version(&self) -> Result<i32>;
    /// Number of devices.
    fn device_count(&self) -> Result<i32>;
    /// Makes `device` current for the calling thread.
    fn set_device(&self, device: i32) -> Result<()>;
    /// The calling thread's current device.
    fn current_device(&self) -> Result<i32>;
    /// Makes the device this provider last made current on the calling thread current again, in
    /// case a library that shares the runtime (NCCL/RCCL) switched devices behind its back; a
    /// no-op for a thread that never chose one.
    fn rebind_current(&self) -> Result<()>;
    /// Marketing name of `device`.
    fn device_name(&self, device: i32) -> Result<String>;
    /// One integer attribute of `device`.
    fn device_attribute(&self, attr: DeviceAttribute, device: i32) -> Result<i32>;
    /// Architecture name: `gfx90a`, `sm_90`, ...
    fn device_arch(&self, device: i32) -> Result<String>;
    /// Total memory of `device` in bytes.
    fn device_total_mem(&self, device: i32) -> Result<u64>;
    /// `(free, total)` bytes of the current device.
    fn mem_get_info(&self) -> Result<(u64, u64)>;

    /// Allocates `bytes` of device memory on the current device.
    fn malloc(&self, bytes: usize) -> Result<DevicePtr>;
    /// Frees device memory.
    ///
    /// # Safety
    /// `ptr` came from [`HipApi::malloc`] of this provider, is not freed yet, and no queued work
    /// still uses it.
    unsafe fn free(&self, ptr: DevicePtr) -> Result<()>;
    /// Allocates page-locked host memory.
    fn host_malloc(&self, bytes: usize) -> Result<*mut c_void>;
    /// Frees page-locked host memory.
    ///
    /// # Safety
    /// `ptr` came from [`HipApi::host_malloc`], is not freed yet, and no queued copy uses it.
    unsafe fn host_free(&self, ptr: *mut c_void) -> Result<()>;
    /// The device address of page-locked host memory from [`HipApi::host_malloc`]: kernels of
    /// the current device read and write the host's bytes through it (over the bus, no copy).
    ///
    /// # Safety
    /// `ptr` lies in a live allocation from [`HipApi::host_malloc`] of this provider.
    unsafe fn host_device_ptr(&self, ptr: *mut c_void) -> Result<DevicePtr>;

    /// Queues a host-to-device copy on `stream`.
    ///
    /// # Safety
    /// `src` is readable for `bytes` until the copy completes (pageable memory: the call returns
    /// after the source was read); `dst..dst+bytes` is device memory of the current device.
    unsafe fn memcpy_htod_async(
        &self,
        dst: DevicePtr,
        src: *const c_void,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Queues a device-to-host copy on `stream`.
    ///
    /// # Safety
    /// `dst` is writable for `bytes` and not otherwise accessed until the stream passes the copy;
    /// `src..src+bytes` is device memory.
    unsafe fn memcpy_dtoh_async(
        &self,
        dst: *mut c_void,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Queues a device-to-device copy on `stream`.
    ///
    /// # Safety
    /// Both ranges are device memory; they do not overlap.
    unsafe fn memcpy_dtod_async(
        &self,
        dst: DevicePtr,
        src: DevicePtr,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Whether `device` can read and write `peer`'s memory directly (over NVLink, xGMI or PCIe).
    fn device_can_access_peer(&self, device: i32, peer: i32) -> Result<bool>;
    /// Lets the current device reach `peer`'s memory directly (copies and kernels); enabling
    /// it again is no error.
    fn enable_peer_access(&self, peer: i32) -> Result<()>;
    /// Queues a copy from `src` on device `src_device` to `dst` on device `dst_device` on
    /// `stream` (a stream of the current device, which is one of the two); direct where peer
    /// access is enabled, staged by the driver otherwise.
    ///
    /// # Safety
    /// `src..src+bytes` is memory of `src_device`, `dst..dst+bytes` of `dst_device`; neither is
    /// touched by other work until the stream passes the copy.
    unsafe fn memcpy_peer_async(
        &self,
        dst: DevicePtr,
        dst_device: i32,
        src: DevicePtr,
        src_device: i32,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Queues a byte fill on `stream`.
    ///
    /// # Safety
    /// `dst..dst+bytes` is device memory.
    unsafe fn memset_async(
        &self,
        dst: DevicePtr,
        value: u8,
        bytes: usize,
        stream: StreamHandle,
    ) -> Result<()>;
    /// Queues a write of one 32-bit word on `stream` (a stream memory operation: no host
    /// staging, no copy engine), ordered after the work queued before it. Devices without
    /// stream memory operations answer with an error and write nothing.
    ///
    /// # Safety
    /// `dst..dst+4` is device memory, 4-byte aligned.
    unsafe fn write_value32_async(
        &self,
        dst: DevicePtr,
        value: u32,
        stream: StreamHandle,
    ) -> Result<()>;

    /// Queues 4-byte writes of `words` (address, value) on `stream`, in order, as
    /// [`HipApi::write_value32_async`] does one by one; a platform that batches stream memory
    /// operations takes them in one call (a decode step's token id and position).
    ///
    /// # Safety
    /// Every address is 4 aligned bytes of device memory of the current device.
    unsafe fn write_values32_async(
        &self,
        words: &[(DevicePtr, u32)],
        stream: StreamHandle,
    ) -> Result<()> {
        for &(dst, value) in words {
            // SAFETY: the caller's guarantee, word by word.
            unsafe { self.write_value32_async(dst, value, stream)? };
        }
        Ok(())
    }

    /// Creates a non-blocking stream on the current device.
    fn stream_create(&self) -> Result<StreamHandle>;
    /// Destroys a stream.
    ///
    /// # Safety
    /// `stream` is live and not used afterwards.
    unsafe fn stream_destroy(&self, stream: StreamHandle) -> Result<()>;
    /// Blocks until all work queued on `stream` is done.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_synchronize(&self, stream: StreamHandle) -> Result<()>;
    /// True when all work on `stream` is done.
    ///
    /// # Safety
    /// `stream` is live.
    unsafe fn stream_query(&self, stream: StreamHandle) -> Result<bool>;
    /// Makes later work on `stream` wait for `event`'s last record.
    ///
    /// # Safety
    /// Both handles are live.
    unsafe fn stream_wait_event(&self, stream: StreamHandle, event: EventHandle) -> Result<()>;

    /// Creates an event; `timing` false gives a cheaper event without timestamps.
    fn event_create(&self, timing: bool) -> Result<EventHandle>;
    /// Destroys an event.
    ///
    /// # Safety
    /// `event` is live and not used afterwards.
    unsafe fn event_destroy(&self, event: EventHandle) -> Result<()>;
    /// Records `event` on `stream`.
    ///
    /// # Safety
    /// Both handles are live.
    unsafe fn event_record(&self, event: EventHandle, stream: StreamHandle) -> Result<()>;
    /// Blocks until `event`'s last record completed.
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_synchronize(&self, event: EventHandle) -> Result<()>;
    /// True when `event`'s last record completed.
    ///
    /// # Safety
    /// `event` is live.
    unsafe fn event_query(&self, event: EventHandle) -> Result<bool>;
    /// Milliseconds between two completed timing events.
    ///
    /// # Safety
    /// Both events are live timing events.
    unsafe fn event_elapsed_ms(&self, start: EventHandle, stop: EventHandle) -> Result<f32>;

    /// Loads a code object (AMD: HSACO; NVIDIA: cubin, fatbin, or NUL-terminated PTX).
    ///
    /// # Safety
    /// `image` is a valid code object for this platform.
    unsafe fn module_load_data(&self, image: &[u8]) -> Result<ModuleHandle>;
    /// Unloads a module.
    ///
    /// # Safety
    /// `module` is live; no function of it is used afterwards and no launch of it is pending.
    unsafe fn module_unload(&self, module: ModuleHandle) -> Result<()>;
    /// Looks a kernel up by its (mangled or `extern "C"`) name.
    ///
    /// # Safety
    /// `module` is live.
    unsafe fn module_get_function(
        &self,
        module: ModuleHandle,
        name: &CStr,
    ) -> Result<FunctionHandle>;
    /// Queues a kernel launch.
    ///
    /// # Safety
    /// `params` points to one pointer per kernel parameter, each to a value of the parameter's
    /// type; every device pointer among them is valid for what the kernel does.
    unsafe fn launch_kernel(
        &self,
        function: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamHandle,
        params: *mut *mut c_void,
    ) -> Result<()>;
    /// Whether [`HipApi::launch_kernel_early`] can start a kernel before its predecessor on the
    /// stream has finished on `device` (NVIDIA's programmatic dependent launch, compute
    /// capability 9.0 and later).
    fn early_launch_supported(&self, _device: i32) -> bool {
        false
    }
    /// Queues a kernel launch that may begin (be scheduled, run its first instructions) while
    /// the kernel queued before it on `stream` is still running, which hides the gap between
    /// dependent kernels. Where [`HipApi::early_launch_supported`] is false this is
    /// [`HipApi::launch_kernel`].
    ///
    /// # Safety
    /// As [`HipApi::launch_kernel`]; in addition the kernel waits for the grids it depends on
    /// (`griddepcontrol.wait`) before it reads or writes any memory that earlier work on the
    /// stream writes or reads.
    unsafe fn launch_kernel_early(
        &self,
        function: FunctionHandle,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        stream: StreamHandle,
        params: *mut *mut c_void,
    ) -> Result<()> {
        // SAFETY: the caller's guarantees include `launch_kernel`'s.
        unsafe { self.launch_kernel(function, grid, block, shared_mem_bytes, stream, params) }
    }
    /// Queues a cooperative kernel launch: every block of the grid is resident on the device at
    /// once, so blocks may wait for each other (a grid barrier), or the launch fails with
    /// `hipErrorCooperativeLaunchTooLarge` and nothing runs. With `early` it may also begin
    /// before its predecessor on `stream` has finished, as [`HipApi::launch_kernel_early`],
    /// where [`HipApi::early_launch_supported`] holds for the current device (ignored
    /// elsewhere). Works while `stream` is capturing. The default reports
    /// [`Error::Unsupported`](crate::Error::Unsupported): HIP 5.2's runtime, whose headers the
    /// AMD bindings come from, has no cooperative launch of module kernels
    /// (`hipModuleLaunchCooperativeKernel` came with ROCm 5.5).
    ///
    /// # Safety
    /// As [`HipApi::launch_kernel`]; with `early`, also as [`HipApi::launch_kernel_early`].
    #[allow(clippy::too_many_arguments, reason = "a launch's own parameters")]
    unsafe fn launch_kernel_cooperative(
        &self,
        _function: FunctionHandle,
        _grid: [u32; 3],
        _block: [u32; 3],
        _shared_mem_bytes: u32,
        _stream: StreamHandle,
        _params: *mut *mut c_void,
        _early: bool,
    ) -> Result<()> {
        Err(crate::Error::Unsupported {
            what: "cooperative kernel launch",
            platform: self.platform().name(),
        })
    }
    /// Lets launches of `function` use up to `bytes` of dynamic shared memory per block (NVIDIA
    /// needs this opt-in above 48 KiB, up to [`DeviceAttribute::MaxSharedMemoryPerBlockOptin`]
    /// less the kernel's static shared memory). AMD has no opt-in: there it only checks `bytes`
    /// against the current device's shared memory per block.
    ///
    /// # Safety
    /// `function` belongs to a live module of the current device.
    unsafe fn function_set_max_dynamic_shared(
        &self,
        function: FunctionHandle,
        bytes: u32,
    ) -> Result<()>;
    /// How many blocks of `function` with `block_threads` threads and `shared_mem_bytes` of
    /// dynamic shared memory fit on one multiprocessor (compute unit) of the current device at
    /// once; 0 when not even one does.
    ///
    /// # Safety
    /// `function` belongs to a live module of the current device.
    unsafe fn occupancy_max_blocks_per_sm(
        &self,
        function: FunctionHandle,
        block_threads: u32,
        shared_mem_bytes: u32,
    ) -> Result<u32>;

    /// Starts capturing the work queued on `stream` into a graph.
    ///
    /// # Safety
    /// `stream` is live and not the null stream.
    unsafe fn stream_begin_capture(&self, stream: StreamHandle, mode: CaptureMode) -> Result<()>;
    /// Ends a capture and returns the captured graph.
    ///
    /// # Safety
    /// `stream` is capturing.
    unsafe fn stream_end_capture(&self, stream: StreamHandle) -> Result<GraphHandle>;
    /// Instantiates a graph for launching.
    ///
    /// # Safety
    /// `graph` is live.
    unsafe fn graph_instantiate(&self, graph: GraphHandle) -> Result<GraphExecHandle>;
    /// Queues an instantiated graph on `stream`.
    ///
    /// # Safety
    /// Both handles are live; the memory the graph's nodes use is still allocated.
    unsafe fn graph_launch(&self, exec: GraphExecHandle, stream: StreamHandle) -> Result<()>;
    /// Destroys a graph.
    ///
    /// # Safety
    /// `graph` is live and not used afterwards.
    unsafe fn graph_destroy(&self, graph: GraphHandle) -> Result<()>;
    /// Destroys an instantiated graph.
    ///
    /// # Safety
    /// `exec` is live, not used afterwards, and no launch of it is pending.
    unsafe fn graph_exec_destroy(&self, exec: GraphExecHandle) -> Result<()>;

    /// Loads the BLAS library if needed and creates a handle on the current device.
    fn blas_create(&self) -> Result<BlasHandle>;
    /// Destroys a BLAS handle.
    ///
    /// # Safety
    /// `handle` is live and not used afterwards.
    unsafe fn blas_destroy(&self, handle: BlasHandle) -> Result<()>;
    /// Binds a BLAS handle to a stream.
    ///
    /// # Safety
    /// Both handles are live.
    unsafe fn blas_set_stream(&self, handle: BlasHandle, stream: StreamHandle) -> Result<()>;
    /// Sets where `alpha`/`beta` are read from.
    ///
    /// # Safety
    /// `handle` is live.
    unsafe fn blas_set_pointer_mode(&self, handle: BlasHandle, mode: PointerMode) -> Result<()>;
    /// f32 GEMM, column-major.
    ///
    /// # Safety
    /// `handle` is live; `alpha`/`beta` point to f32 in the handle's pointer mode; the matrices are
    /// device memory of the sizes `m`,`n`,`k` and the leading dimensions imply.
    #[allow(clippy::too_many_arguments, reason = "mirrors the BLAS signature")]
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
    ) -> Result<()>;
    /// Mixed-precision GEMM with f32 compute.
    ///
    /// # Safety
    /// As [`HipApi::sgemm`], for the element types given.
    unsafe fn gemm_ex(&self, handle: BlasHandle, args: &GemmEx) -> Result<()>;
    /// Strided-batched mixed-precision GEMM with f32 compute.
    ///
    /// # Safety
    /// As [`HipApi::gemm_ex`], for every matrix of the batch.
    unsafe fn gemm_strided_batched_ex(
        &self,
        handle: BlasHandle,
        args: &GemmEx,
        batch: &Batch,
    ) -> Result<()>;
}
