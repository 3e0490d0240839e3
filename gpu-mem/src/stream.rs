//! Streams, events and graphs. All synchronisation is stream-ordered: a stream or an event is
//! waited for, never the whole device; cross-stream order goes through events.

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytemuck::Pod;
use hip_ffi::{CaptureMode, DevicePtr, EventHandle, GraphExecHandle, GraphHandle, StreamHandle};
use parking_lot::Mutex;

use crate::buffer::{DeviceView, DeviceViewMut, PinnedHostBuffer};
use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::host_io::HostIo;
use crate::module::{Function, KernelArgs};
use crate::pool::{RawAllocator, RAW_ALIGN};

/// The locked staging slot: `(address, size)` of the stream's whole staging allocation.
type StagingGuard<'a> = parking_lot::MutexGuard<'a, Option<(DevicePtr, u64)>>;

/// A non-blocking stream, destroyed (after finishing its work) on drop.
pub struct Stream {
    device: Device,
    handle: StreamHandle,
    /// A whole allocation that reads from sub-allocations are staged through (see [`Stream::read`]).
    staging: Mutex<Option<(DevicePtr, u64)>>,
    /// While capturing: the memory the captured work uses (see [`Stream::end_capture`]).
    capture_log: Mutex<Option<CaptureLog>>,
    /// Pinned host staging for reads and queued small writes (see [`crate::host_io`]).
    pub(crate) host_io: Mutex<HostIo>,
    /// Whether kernel launches may begin before their predecessor ends (see
    /// [`Stream::set_early_launch`]).
    early_launch: AtomicBool,
}

/// How a kernel is launched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LaunchMode {
    /// An ordinary launch.
    Plain,
    /// A cooperative launch: all blocks resident at once, or the launch fails.
    Cooperative,
}

/// What a capture recorded: the device ranges `(address, bytes)` of its checked launches, or the
/// first operation whose memory it cannot account for.
#[derive(Default)]
struct CaptureLog {
    ranges: Vec<(u64, u64)>,
    unknown: Option<&'static str>,
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.device.ordinal())
            .finish()
    }
}

impl Stream {
    /// Creates a stream on `device`.
    pub fn new(device: &Device) -> Result<Stream> {
        device.bind()?;
        let handle = device.api().stream_create()?;
        Ok(Stream {
            device: device.clone(),
            handle,
            staging: Mutex::new(None),
            capture_log: Mutex::new(None),
            host_io: Mutex::new(HostIo::default()),
            early_launch: AtomicBool::new(false),
        })
    }

    /// Lets the kernels launched on this stream from now on begin while the kernel before them
    /// is still finishing (NVIDIA's programmatic dependent launch, compute capability 9.0 and
    /// later), which hides most of the gap between small dependent kernels. Returns whether it
    /// is on: asking for it where the device cannot do it leaves plain launches.
    ///
    /// Only for streams whose kernels all begin by waiting for the grids before them
    /// (`griddepcontrol.wait`, as every kernel of the `kernels` crate does) before they touch
    /// memory: a kernel that does not would race with its predecessor.
    pub fn set_early_launch(&self, on: bool) -> bool {
        let on = on
            && self
                .device
                .api()
                .early_launch_supported(self.device.ordinal());
        self.early_launch.store(on, Ordering::Relaxed);
        on
    }

    /// Whether launches on this stream may begin early (see [`Stream::set_early_launch`]).
    pub fn early_launch(&self) -> bool {
        self.early_launch.load(Ordering::Relaxed)
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle (for BLAS and kernel launchers).
    pub fn handle(&self) -> StreamHandle {
        self.handle
    }

    /// Blocks until everything queued so far is done.
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the handle is live for `self`'s life.
        Ok(unsafe { self.device.api().stream_synchronize(self.handle) }?)
    }

    /// True when everything queued so far is done.
    pub fn query(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: the handle is live.
        Ok(unsafe { self.device.api().stream_query(self.handle) }?)
    }

    /// Makes later work on this stream wait for `event`.
    pub fn wait_event(&self, event: &Event) -> Result<()> {
        self.device.bind()?;
        // SAFETY: both handles are live.
        Ok(unsafe {
            self.device
                .api()
                .stream_wait_event(self.handle, event.handle)
        }?)
    }

    /// Records a fresh (non-timing) event here and returns it.
    pub fn record_event(&self) -> Result<Event> {
        let e = Event::new(&self.device, false)?;
        e.record(self)?;
        Ok(e)
    }

    fn check_view(&self, d: &Device) -> Result<()> {
        // Copies and fills are not recorded: a capture holding one cannot be replayed safely.
        self.note_unknown("a memory copy or fill");
        self.device.expect_same(d, "view")
    }

    /// Records device memory `(address, bytes)` the work queued next uses, while capturing.
    pub(crate) fn note_use(&self, ranges: impl IntoIterator<Item = (u64, u64)>) {
        if let Some(log) = self.capture_log.lock().as_mut() {
            log.ranges.extend(ranges.into_iter().filter(|r| r.1 > 0));
        }
    }

    /// True between [`Stream::begin_capture`] and [`Stream::end_capture`].
    pub(crate) fn capturing(&self) -> bool {
        self.capture_log.lock().is_some()
    }

    /// Marks the capture under way (if any) as using memory it cannot account for.
    pub(crate) fn note_unknown(&self, what: &'static str) {
        if let Some(log) = self.capture_log.lock().as_mut() {
            log.unknown.get_or_insert(what);
        }
    }

    /// Copies host data to the device and waits for it (pageable source: the blocking path).
    pub fn write<T: Pod>(&self, src: &[T], dst: &mut DeviceViewMut<'_, T>) -> Result<()> {
        self.check_view(dst.device)?;
        if src.len() != dst.len {
            return Err(GpuError::LengthMismatch {
                src: src.len(),
                dst: dst.len,
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        self.device.bind()?;
        let bytes = std::mem::size_of_val(src);
        // SAFETY: `src` is a live slice of `bytes` bytes, kept borrowed until the stream is
        // synchronised below; `dst` is device memory of that size (checked view).
        unsafe {
            self.device.api().memcpy_htod_async(
                dst.ptr,
                src.as_ptr().cast(),
                bytes,
                self.handle,
            )?;
        }
        self.synchronize()
    }

    /// Copies device data to the host and waits for it. A view that is only part of an
    /// allocation is first copied device-side into a whole staging allocation, then read from
    /// there: plain D2H reads from sub-buffer offsets failed on ROCm (DESIGN.md, section 6).
    pub fn read<T: Pod>(&self, src: &DeviceView<'_, T>, dst: &mut [T]) -> Result<()> {
        self.check_view(src.device)?;
        if src.len != dst.len() {
            return Err(GpuError::LengthMismatch {
                src: src.len,
                dst: dst.len(),
            });
        }
        if dst.is_empty() {
            return Ok(());
        }
        self.device.bind()?;
        let bytes = std::mem::size_of_val(dst);
        let guard = if src.whole {
            None
        } else {
            Some(self.stage(src.ptr, bytes as u64)?)
        };
        let from = guard.as_ref().map_or(src.ptr, |(p, _)| *p);
        // SAFETY: `dst` is a live exclusive slice of `bytes` bytes, borrowed until the stream is
        // synchronised below; `from` is device memory of at least `bytes` bytes.
        unsafe {
            self.device.api().memcpy_dtoh_async(
                dst.as_mut_ptr().cast(),
                from,
                bytes,
                self.handle,
            )?;
        }
        let r = self.synchronize();
        drop(guard);
        r
    }

    /// Reads a view into a new vector.
    pub fn read_to_vec<T: Pod>(&self, src: &DeviceView<'_, T>) -> Result<Vec<T>> {
        let mut v = vec![T::zeroed(); src.len];
        self.read(src, &mut v)?;
        Ok(v)
    }

    /// Queues a device-side copy of `bytes` from `src` into the stream's staging allocation and
    /// returns it (locked until the caller drops the guard).
    pub(crate) fn stage(
        &self,
        src: DevicePtr,
        bytes: u64,
    ) -> Result<(DevicePtr, StagingGuard<'_>)> {
        let mut g = self.staging.lock();
        if g.is_none_or(|(_, size)| size < bytes) {
            if let Some((p, size)) = g.take() {
                // The stream may still read the old staging block: finish before freeing it.
                self.synchronize()?;
                self.device.inner.raw.deallocate(p.0, size);
            }
            let size = crate::error::align_up(bytes, RAW_ALIGN)?;
            let p = self.device.inner.raw.allocate(size, "d2h staging")?;
            *g = Some((DevicePtr(p), size));
        }
        let (p, _) =
            g.ok_or_else(|| GpuError::InvalidArgument("staging allocation missing".into()))?;
        // SAFETY: `p` holds at least `bytes`; `src` is a checked view of `bytes` bytes; the
        // staging block never overlaps user memory.
        unsafe {
            self.device
                .api()
                .memcpy_dtod_async(p, src, bytes as usize, self.handle)?
        };
        Ok((p, g))
    }

    /// Queues a device-to-device copy.
    pub fn copy<T: Pod>(
        &self,
        src: &DeviceView<'_, T>,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        self.check_view(src.device)?;
        self.check_view(dst.device)?;
        if src.len != dst.len {
            return Err(GpuError::LengthMismatch {
                src: src.len,
                dst: dst.len,
            });
        }
        if src.len == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: both are checked views of equal size; a shared and an exclusive borrow cannot
        // alias the same owner.
        Ok(unsafe {
            self.device.api().memcpy_dtod_async(
                dst.ptr,
                src.ptr,
                src.byte_len() as usize,
                self.handle,
            )
        }?)
    }

    /// Queues a byte fill of a view.
    pub fn memset<T: Pod>(&self, dst: &mut DeviceViewMut<'_, T>, value: u8) -> Result<()> {
        self.check_view(dst.device)?;
        if dst.len == 0 {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: a checked view of `byte_len` bytes.
        Ok(unsafe {
            self.device
                .api()
                .memset_async(dst.ptr, value, dst.byte_len() as usize, self.handle)
        }?)
    }

    /// Queues a copy from pinned memory (`src[range_start..][..dst.len()]`); host access to
    /// `src` waits until the copy is done.
    pub fn write_pinned<T: Pod>(
        &self,
        src: &mut PinnedHostBuffer<T>,
        src_start: usize,
        dst: &mut DeviceViewMut<'_, T>,
    ) -> Result<()> {
        self.check_view(dst.device)?;
        self.device.expect_same(src.device(), "pinned buffer")?;
        crate::error::check_range(src_start as u64, dst.len as u64, src.len() as u64)?;
        if dst.len == 0 {
            return Ok(());
        }
        self.device.bind()?;
        let bytes = dst.byte_len() as usize;
        // SAFETY: the range lies inside the pinned buffer (checked); the buffer is marked pending
        // below, so its memory stays untouched and allocated until the copy finished.
        unsafe {
            let from = src.host_ptr().add(src_start);
            self.device.api().memcpy_htod_async(
                dst.ptr,
                from.cast::<c_void>(),
                bytes,
                self.handle,
            )?;
        }
        src.set_pending(self.record_event()?)
    }

    /// Queues a copy into pinned memory (`dst[..src.len()]`); host access to `dst` waits until
    /// the copy is done. Sub-allocation sources are staged as in [`Stream::read`].
    pub fn read_pinned<T: Pod>(
        &self,
        src: &DeviceView<'_, T>,
        dst: &mut PinnedHostBuffer<T>,
    ) -> Result<()> {
        self.check_view(src.device)?;
        self.device.expect_same(dst.device(), "pinned buffer")?;
        crate::error::check_range(0, src.len as u64, dst.len() as u64)?;
        if src.len == 0 {
            return Ok(());
        }
        self.device.bind()?;
        let bytes = src.byte_len();
        let guard = if src.whole {
            None
        } else {
            Some(self.stage(src.ptr, bytes)?)
        };
        let from = guard.as_ref().map_or(src.ptr, |(p, _)| *p);
        // SAFETY: the pinned buffer holds at least `bytes` (checked) and is marked pending below.
        unsafe {
            self.device.api().memcpy_dtoh_async(
                dst.host_ptr().cast(),
                from,
                bytes as usize,
                self.handle,
            )?;
        }
        let ev = self.record_event()?;
        drop(guard);
        dst.set_pending(ev)
    }

    /// Queues a kernel launch.
    ///
    /// # Safety
    /// `args` match the kernel's parameters in number, order and type, and every device pointer
    /// among them is valid for what the kernel reads and writes while the launch runs.
    pub unsafe fn launch(
        &self,
        function: &Function<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &mut KernelArgs,
    ) -> Result<()> {
        // Raw arguments: a capture holding this launch cannot be replayed safely.
        self.note_unknown("a raw kernel launch");
        // SAFETY: the caller's guarantees are `launch_unrecorded`'s.
        unsafe {
            self.launch_unrecorded(
                function,
                grid,
                block,
                shared_mem_bytes,
                args,
                LaunchMode::Plain,
            )
        }
    }

    /// [`Stream::launch`] without marking a capture (for checked launches, which record their
    /// memory themselves), plain or cooperative.
    ///
    /// # Safety
    /// As [`Stream::launch`].
    pub(crate) unsafe fn launch_unrecorded(
        &self,
        function: &Function<'_>,
        grid: [u32; 3],
        block: [u32; 3],
        shared_mem_bytes: u32,
        args: &mut KernelArgs,
        mode: LaunchMode,
    ) -> Result<()> {
        self.device.expect_same(function.device(), "kernel")?;
        self.device.bind()?;
        let mut ptrs = args.pointers()?;
        let api = self.device.api();
        // Early launches are on only for streams whose kernels wait for their predecessors.
        let early = self.early_launch();
        let (f, stream, params) = (function.handle(), self.handle, ptrs.as_mut_ptr());
        // SAFETY: the caller guarantees the arguments match the kernel; `ptrs` points into
        // `args`, which outlives the call (the driver copies the values at launch).
        unsafe {
            match mode {
                LaunchMode::Plain if early => {
                    api.launch_kernel_early(f, grid, block, shared_mem_bytes, stream, params)
                }
                LaunchMode::Plain => {
                    api.launch_kernel(f, grid, block, shared_mem_bytes, stream, params)
                }
                LaunchMode::Cooperative => api.launch_kernel_cooperative(
                    f,
                    grid,
                    block,
                    shared_mem_bytes,
                    stream,
                    params,
                    early,
                ),
            }
        }?;
        Ok(())
    }

    /// Starts capturing this stream's work into a graph (thread-local mode). Checked launches
    /// ([`Stream::launch_checked`]) record the memory they use; anything else queued while
    /// capturing makes [`Stream::end_capture`] refuse the graph.
    pub fn begin_capture(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the handle is a live, non-null stream.
        unsafe {
            self.device
                .api()
                .stream_begin_capture(self.handle, CaptureMode::ThreadLocal)
        }?;
        *self.capture_log.lock() = Some(CaptureLog::default());
        Ok(())
    }

    /// Ends the capture begun with [`Stream::begin_capture`]. The graph knows the live
    /// allocations its launches use, which [`GraphExec::launch`] checks before each replay;
    /// a capture with work whose memory is unknown (raw launches, copies, BLAS calls) or
    /// outside every live allocation is an error.
    pub fn end_capture(&self) -> Result<Graph> {
        let log = self.capture_log.lock().take();
        self.device.bind()?;
        // SAFETY: the stream is capturing (the driver reports an error otherwise).
        let g = unsafe { self.device.api().stream_end_capture(self.handle) }?;
        let mut graph = Graph {
            device: self.device.clone(),
            handle: g,
            blocks: Vec::new(),
        };
        let log = log
            .ok_or_else(|| GpuError::InvalidArgument("end_capture without begin_capture".into()))?;
        if let Some(what) = log.unknown {
            return Err(GpuError::InvalidArgument(format!(
                "the capture holds {what}, whose memory a replay cannot check"
            )));
        }
        graph.blocks = self
            .device
            .inner
            .raw
            .blocks_of(&log.ranges)
            .ok_or_else(|| {
                GpuError::InvalidArgument(
                    "a captured launch used memory outside every live allocation".into(),
                )
            })?;
        Ok(graph)
    }

    /// Captures the work `record` queues on this stream and instantiates it; the capture is
    /// ended even when `record` fails.
    pub fn capture<F>(&self, record: F) -> Result<GraphExec>
    where
        F: FnOnce(&Stream) -> Result<()>,
    {
        self.begin_capture()?;
        let recorded = record(self);
        let graph = self.end_capture();
        recorded?;
        graph?.instantiate()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize() {
            self.device
                .record_error("hipStreamSynchronize before destroy", e);
        }
        if let Some((p, size)) = self.staging.get_mut().take() {
            self.device.inner.raw.deallocate(p.0, size);
        }
        // SAFETY: the handle is live and no longer used.
        if let Err(e) = unsafe { self.device.api().stream_destroy(self.handle) } {
            self.device.record_error("hipStreamDestroy", e);
        }
    }
}

/// An event: ordering between streams, completion checks and GPU-side timing.
pub struct Event {
    device: Device,
    handle: EventHandle,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event").finish()
    }
}

impl Event {
    /// Creates an event; `timing` enables [`Event::elapsed_ms`].
    pub fn new(device: &Device, timing: bool) -> Result<Event> {
        device.bind()?;
        let handle = device.api().event_create(timing)?;
        Ok(Event {
            device: device.clone(),
            handle,
        })
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.device.expect_same(stream.device(), "stream")?;
        self.device.bind()?;
        // SAFETY: both handles are live.
        Ok(unsafe { self.device.api().event_record(self.handle, stream.handle) }?)
    }

    /// Blocks until the recorded work is done.
    pub fn synchronize(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the handle is live.
        Ok(unsafe { self.device.api().event_synchronize(self.handle) }?)
    }

    /// True when the recorded work is done.
    pub fn query(&self) -> Result<bool> {
        self.device.bind()?;
        // SAFETY: the handle is live.
        Ok(unsafe { self.device.api().event_query(self.handle) }?)
    }

    /// Milliseconds from `self` to `end` (both timing events, both completed).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.device.bind()?;
        // SAFETY: both handles are live.
        Ok(unsafe { self.device.api().event_elapsed_ms(self.handle, end.handle) }?)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the handle is live and no longer used; destroying a pending event is allowed
        // (the runtime releases it once it completes).
        if let Err(e) = unsafe { self.device.api().event_destroy(self.handle) } {
            self.device.record_error("hipEventDestroy", e);
        }
    }
}

/// A captured graph.
pub struct Graph {
    device: Device,
    handle: GraphHandle,
    /// `(address, tracker id)` of every allocation the captured work uses.
    blocks: Vec<(u64, u64)>,
}

impl std::fmt::Debug for Graph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Graph").finish()
    }
}

impl Graph {
    /// Instantiates the graph for launching.
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.device.bind()?;
        // SAFETY: the graph is live.
        let h = unsafe { self.device.api().graph_instantiate(self.handle) }?;
        Ok(GraphExec {
            device: self.device.clone(),
            handle: h,
            blocks: self.blocks.clone(),
            checked_at: AtomicU64::new(u64::MAX),
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: live and no longer used (an instantiated copy does not depend on it).
        if let Err(e) = unsafe { self.device.api().graph_destroy(self.handle) } {
            self.device.record_error("hipGraphDestroy", e);
        }
    }
}

/// An instantiated graph. Replaying it reuses the captured kernel arguments and addresses, so
/// [`GraphExec::launch`] first checks that the allocations it uses are still the live ones.
pub struct GraphExec {
    device: Device,
    handle: GraphExecHandle,
    /// `(address, tracker id)` of every allocation the captured work uses.
    blocks: Vec<(u64, u64)>,
    /// The device's count of ended blocks when `blocks` were last found live (`u64::MAX`:
    /// never): a replay checks them again only after some block ended.
    checked_at: AtomicU64,
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec").finish()
    }
}

impl GraphExec {
    /// Queues the graph on `stream`, unless an allocation the captured work uses was freed
    /// since (an error then: the owner must capture again). Ordering against other streams'
    /// work on the same memory is the caller's, as for any launch.
    pub fn launch(&self, stream: &Stream) -> Result<()> {
        self.device.expect_same(stream.device(), "stream")?;
        let raw = &self.device.inner.raw;
        let ends = raw.ends();
        if self.checked_at.load(Ordering::Relaxed) != ends {
            if !raw.all_live(&self.blocks) {
                return Err(GpuError::InvalidArgument(
                    "graph replay: an allocation the captured work uses was freed".into(),
                ));
            }
            self.checked_at.store(ends, Ordering::Relaxed);
        }
        self.device.bind()?;
        // SAFETY: both handles are live, and every allocation the captured launches use is
        // still allocated (checked just above; `end_capture` refused captures holding work
        // whose memory it could not record).
        Ok(unsafe { self.device.api().graph_launch(self.handle, stream.handle) }?)
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: live and no longer used; launches are stream-ordered and the runtime keeps
        // the executable alive until pending launches finish.
        if let Err(e) = unsafe { self.device.api().graph_exec_destroy(self.handle) } {
            self.device.record_error("hipGraphExecDestroy", e);
        }
    }
}
