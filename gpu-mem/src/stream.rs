//! Streams, events and graphs. All synchronisation is stream-ordered: a stream or an event is
//! waited for, never the whole device; cross-stream order goes through events.

use std::ffi::c_void;

use bytemuck::Pod;
use hip_ffi::{CaptureMode, DevicePtr, EventHandle, GraphExecHandle, GraphHandle, StreamHandle};
use parking_lot::Mutex;

use crate::buffer::{DeviceView, DeviceViewMut, PinnedHostBuffer};
use crate::device::Device;
use crate::error::{GpuError, Result};
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
        })
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
        self.device.expect_same(d, "view")
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
    fn stage(&self, src: DevicePtr, bytes: u64) -> Result<(DevicePtr, StagingGuard<'_>)> {
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
        self.device.expect_same(function.device(), "kernel")?;
        self.device.bind()?;
        let mut ptrs = args.pointers()?;
        // SAFETY: the caller guarantees the arguments match the kernel; `ptrs` points into
        // `args`, which outlives the call (the driver copies the values at launch).
        Ok(unsafe {
            self.device.api().launch_kernel(
                function.handle(),
                grid,
                block,
                shared_mem_bytes,
                self.handle,
                ptrs.as_mut_ptr(),
            )
        }?)
    }

    /// Starts capturing this stream's work into a graph (thread-local mode).
    pub fn begin_capture(&self) -> Result<()> {
        self.device.bind()?;
        // SAFETY: the handle is a live, non-null stream.
        Ok(unsafe {
            self.device
                .api()
                .stream_begin_capture(self.handle, CaptureMode::ThreadLocal)
        }?)
    }

    /// Ends the capture begun with [`Stream::begin_capture`].
    pub fn end_capture(&self) -> Result<Graph> {
        self.device.bind()?;
        // SAFETY: the stream is capturing (the driver reports an error otherwise).
        let g = unsafe { self.device.api().stream_end_capture(self.handle) }?;
        Ok(Graph {
            device: self.device.clone(),
            handle: g,
        })
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
/// the memory it touches must outlive it (its owner's responsibility, hence `launch` is unsafe).
pub struct GraphExec {
    device: Device,
    handle: GraphExecHandle,
}

impl std::fmt::Debug for GraphExec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphExec").finish()
    }
}

impl GraphExec {
    /// Queues the graph on `stream`.
    ///
    /// # Safety
    /// Every buffer the captured work used is still allocated and not accessed concurrently by
    /// other work.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        self.device.expect_same(stream.device(), "stream")?;
        self.device.bind()?;
        // SAFETY: both handles are live; the caller guarantees the captured memory is valid.
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
