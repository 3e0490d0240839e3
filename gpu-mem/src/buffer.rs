//! Owned device buffers (`DeviceBuffer<T>` ~ `Vec<T>`), borrowed views with checked ranges
//! (`DeviceView` ~ `&[T]`, `DeviceViewMut` ~ `&mut [T]`) and page-locked host buffers.

use std::marker::PhantomData;
use std::ops::Range;

use bytemuck::Pod;
use hip_ffi::DevicePtr;

use crate::device::Device;
use crate::error::{check_range, GpuError, Result};
use crate::pool::RawAllocator;
use crate::stream::Event;

fn byte_len<T>(len: usize) -> Result<u64> {
    (len as u64)
        .checked_mul(std::mem::size_of::<T>() as u64)
        .ok_or_else(|| GpuError::InvalidArgument(format!("{len} elements overflow a byte count")))
}

/// A typed device allocation, freed on drop.
pub struct DeviceBuffer<T: Pod> {
    device: Device,
    ptr: DevicePtr,
    len: usize,
    bytes: u64,
    _t: PhantomData<T>,
}

impl<T: Pod> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Pod> DeviceBuffer<T> {
    /// Allocates `len` elements (contents undefined until written), through the budget.
    pub fn new(device: &Device, len: usize, tag: &str) -> Result<Self> {
        let bytes = byte_len::<T>(len)?;
        let ptr = if bytes == 0 {
            DevicePtr::NULL
        } else {
            DevicePtr(device.inner.raw.allocate(bytes, tag)?)
        };
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            len,
            bytes,
            _t: PhantomData,
        })
    }

    /// Element count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.bytes
    }

    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The whole buffer as a view.
    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView {
            device: &self.device,
            ptr: self.ptr,
            len: self.len,
            whole: true,
            _t: PhantomData,
        }
    }

    /// The whole buffer as a mutable view.
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut {
            device: &self.device,
            ptr: self.ptr,
            len: self.len,
            whole: true,
            _t: PhantomData,
        }
    }

    /// Elements `range` as a view.
    pub fn slice(&self, range: Range<usize>) -> Result<DeviceView<'_, T>> {
        self.view().slice(range)
    }

    /// Elements `range` as a mutable view.
    pub fn slice_mut(&mut self, range: Range<usize>) -> Result<DeviceViewMut<'_, T>> {
        let whole = self.view_mut();
        let (ptr, len, w) = sub_range::<T>(whole.ptr, whole.len, range)?;
        Ok(DeviceViewMut {
            device: &self.device,
            ptr,
            len,
            whole: w,
            _t: PhantomData,
        })
    }
}

impl<T: Pod> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            // The raw allocator records a failing free in the device's error log.
            self.device.inner.raw.deallocate(self.ptr.0, self.bytes);
        }
    }
}

fn sub_range<T>(
    ptr: DevicePtr,
    len: usize,
    range: Range<usize>,
) -> Result<(DevicePtr, usize, bool)> {
    if range.start > range.end {
        return Err(GpuError::OutOfBounds {
            start: range.start as u64,
            end: range.end as u64,
            len: len as u64,
        });
    }
    let n = range.end - range.start;
    check_range(range.start as u64, n as u64, len as u64)?;
    let off = byte_len::<T>(range.start)?;
    let p = ptr.checked_add(off).ok_or(GpuError::OutOfBounds {
        start: range.start as u64,
        end: range.end as u64,
        len: len as u64,
    })?;
    Ok((p, n, range.start == 0 && n == len))
}

/// A read-only device range borrowed from its owner.
#[derive(Clone, Copy)]
pub struct DeviceView<'a, T: Pod> {
    pub(crate) device: &'a Device,
    pub(crate) ptr: DevicePtr,
    pub(crate) len: usize,
    /// Covers a whole driver allocation (D2H may read it directly, see `Stream::read`).
    pub(crate) whole: bool,
    pub(crate) _t: PhantomData<&'a T>,
}

impl<T: Pod> std::fmt::Debug for DeviceView<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceView")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .field("whole", &self.whole)
            .finish()
    }
}

impl<'a, T: Pod> DeviceView<'a, T> {
    /// A view over raw device memory owned elsewhere (kernel outputs, other crates' pools).
    ///
    /// # Safety
    /// `ptr..ptr + len * size_of::<T>()` is device memory of `device`, stays allocated for `'a`,
    /// and `whole` is true only if it is exactly one driver allocation.
    pub unsafe fn from_raw(device: &'a Device, ptr: DevicePtr, len: usize, whole: bool) -> Self {
        DeviceView {
            device,
            ptr,
            len,
            whole,
            _t: PhantomData,
        }
    }

    /// Element count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.len as u64 * std::mem::size_of::<T>() as u64
    }

    /// True if this view is a whole driver allocation.
    pub fn is_whole_allocation(&self) -> bool {
        self.whole
    }

    /// The device.
    pub fn device(&self) -> &'a Device {
        self.device
    }

    /// A sub-range, checked.
    pub fn slice(&self, range: Range<usize>) -> Result<DeviceView<'a, T>> {
        let (ptr, len, w) = sub_range::<T>(self.ptr, self.len, range)?;
        Ok(DeviceView {
            device: self.device,
            ptr,
            len,
            whole: self.whole && w,
            _t: PhantomData,
        })
    }
}

/// A writable device range borrowed exclusively from its owner.
pub struct DeviceViewMut<'a, T: Pod> {
    pub(crate) device: &'a Device,
    pub(crate) ptr: DevicePtr,
    pub(crate) len: usize,
    pub(crate) whole: bool,
    pub(crate) _t: PhantomData<&'a mut T>,
}

impl<T: Pod> std::fmt::Debug for DeviceViewMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceViewMut")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish()
    }
}

impl<'a, T: Pod> DeviceViewMut<'a, T> {
    /// A mutable view over raw device memory owned elsewhere.
    ///
    /// # Safety
    /// As [`DeviceView::from_raw`], and nothing else reads or writes the range during `'a`.
    pub unsafe fn from_raw(device: &'a Device, ptr: DevicePtr, len: usize, whole: bool) -> Self {
        DeviceViewMut {
            device,
            ptr,
            len,
            whole,
            _t: PhantomData,
        }
    }

    /// Element count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    /// Size in bytes.
    pub fn byte_len(&self) -> u64 {
        self.len as u64 * std::mem::size_of::<T>() as u64
    }

    /// Reborrows as read-only.
    pub fn as_view(&self) -> DeviceView<'_, T> {
        DeviceView {
            device: self.device,
            ptr: self.ptr,
            len: self.len,
            whole: self.whole,
            _t: PhantomData,
        }
    }

    /// A mutable sub-range, checked (reborrows `self`).
    pub fn slice_mut(&mut self, range: Range<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (ptr, len, w) = sub_range::<T>(self.ptr, self.len, range)?;
        Ok(DeviceViewMut {
            device: self.device,
            ptr,
            len,
            whole: self.whole && w,
            _t: PhantomData,
        })
    }
}

/// Page-locked host memory for fast, truly asynchronous copies. Host access waits for the last
/// copy queued on it, so a pending transfer can never be observed half done.
pub struct PinnedHostBuffer<T: Pod> {
    device: Device,
    ptr: *mut T,
    len: usize,
    pending: Option<Event>,
}

// SAFETY: the buffer owns its allocation exclusively; the raw pointer is not shared.
unsafe impl<T: Pod + Send> Send for PinnedHostBuffer<T> {}
// SAFETY: shared access only reads through `&self` after waiting; no interior mutation of data.
unsafe impl<T: Pod + Sync> Sync for PinnedHostBuffer<T> {}

impl<T: Pod> std::fmt::Debug for PinnedHostBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedHostBuffer")
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Pod> PinnedHostBuffer<T> {
    /// Allocates `len` zeroed elements of page-locked memory.
    pub fn new(device: &Device, len: usize) -> Result<Self> {
        let bytes = usize::try_from(byte_len::<T>(len)?)
            .map_err(|_| GpuError::InvalidArgument("pinned buffer too large".into()))?;
        device.bind()?;
        let ptr = if bytes == 0 {
            std::ptr::NonNull::<T>::dangling().as_ptr()
        } else {
            let p = device
                .api()
                .host_malloc(bytes)
                .map_err(|e| crate::error::alloc_err("pinned host buffer", bytes as u64, e))?
                .cast::<T>();
            // SAFETY: `p` is a fresh allocation of `bytes` bytes; zero bytes are a valid T (Pod).
            unsafe { std::ptr::write_bytes(p.cast::<u8>(), 0, bytes) };
            p
        };
        Ok(PinnedHostBuffer {
            device: device.clone(),
            ptr,
            len,
            pending: None,
        })
    }

    /// Element count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn wait(&mut self) -> Result<()> {
        if let Some(e) = self.pending.take() {
            e.synchronize()?;
        }
        Ok(())
    }

    /// The contents, after any queued copy into or out of the buffer finished.
    pub fn as_slice(&mut self) -> Result<&[T]> {
        self.wait()?;
        // SAFETY: `ptr` holds `len` initialised elements and no copy is pending.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr, self.len) })
    }

    /// The contents for writing, after any queued copy finished.
    pub fn as_mut_slice(&mut self) -> Result<&mut [T]> {
        self.wait()?;
        // SAFETY: as `as_slice`, with exclusive access through `&mut self`.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }

    pub(crate) fn host_ptr(&self) -> *mut T {
        self.ptr
    }

    /// Waits for the queued copy (if any) and hands back its event, for recording again.
    pub(crate) fn take_pending(&mut self) -> Result<Option<Event>> {
        if let Some(e) = &self.pending {
            e.synchronize()?;
        }
        Ok(self.pending.take())
    }

    /// Marks a copy queued on the buffer; host access waits for `event`.
    pub(crate) fn set_pending(&mut self, event: Event) -> Result<()> {
        self.wait()?;
        self.pending = Some(event);
        Ok(())
    }

    pub(crate) fn device(&self) -> &Device {
        &self.device
    }
}

impl<T: Pod> Drop for PinnedHostBuffer<T> {
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            // A copy may still be in flight: leaking is safer than freeing under it.
            self.device
                .record_error("waiting for a pinned buffer's copy (buffer leaked)", e);
            return;
        }
        if self.len == 0 || std::mem::size_of::<T>() == 0 {
            return;
        }
        // SAFETY: `ptr` came from host_malloc and no copy is pending (waited above).
        if let Err(e) = unsafe { self.device.api().host_free(self.ptr.cast()) } {
            self.device.record_error("hipHostFree", e);
        }
    }
}
