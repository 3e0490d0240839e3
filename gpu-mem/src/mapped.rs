//! Page-locked host memory that a device's kernels write in place, through its device address.
//!
//! A small result the host reads after every launch (a decode step's logits) then arrives with
//! the kernel that computes it: the kernel's stores cross the bus while it runs, and no copy
//! queued after it delays the host. Large or device-read data belongs in device memory (bus
//! bandwidth is a fraction of the device's).
//!
//! The host side is reached only through a stream: [`MappedHostBuffer::read_with`] and
//! [`MappedHostBuffer::write`] wait for the stream first, so work queued on it before the call
//! has finished with the bytes. Work queued on other streams is the owner's to order.

use hip_ffi::DevicePtr;
use parking_lot::Mutex;

use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::launch::MemRange;
use crate::stream::Stream;

/// Page-locked host memory with a device address (see the module documentation).
pub struct MappedHostBuffer {
    device: Device,
    host: *mut u8,
    dev: DevicePtr,
    bytes: usize,
    /// Held while the host reads or writes, so that a host write never overlaps a host read.
    host_access: Mutex<()>,
}

// SAFETY: the buffer owns its allocation; the host touches it only under `host_access`.
unsafe impl Send for MappedHostBuffer {}
// SAFETY: as above; `&self` methods serialize host access through the mutex.
unsafe impl Sync for MappedHostBuffer {}

impl std::fmt::Debug for MappedHostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MappedHostBuffer")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl MappedHostBuffer {
    /// `bytes` zeroed bytes of page-locked memory that `device`'s kernels can address.
    pub fn new(device: &Device, bytes: usize) -> Result<Self> {
        device.bind()?;
        if bytes == 0 {
            return Ok(Self {
                device: device.clone(),
                host: std::ptr::NonNull::<u8>::dangling().as_ptr(),
                dev: DevicePtr::NULL,
                bytes,
                host_access: Mutex::new(()),
            });
        }
        let host = device
            .api()
            .host_malloc(bytes)
            .map_err(|e| crate::error::alloc_err("mapped host buffer", bytes as u64, e))?
            .cast::<u8>();
        // SAFETY: `host` is a fresh allocation of `bytes` bytes from host_malloc.
        let dev = unsafe {
            std::ptr::write_bytes(host, 0, bytes);
            device.api().host_device_ptr(host.cast())
        };
        let dev = match dev {
            Ok(d) => d,
            Err(e) => {
                // SAFETY: the fresh allocation above, never shared.
                if let Err(f) = unsafe { device.api().host_free(host.cast()) } {
                    device.record_error("hipHostFree", f);
                }
                return Err(e.into());
            }
        };
        // Captured launches may write it; replays check it is still allocated.
        device.inner.raw.add_foreign(dev.0, bytes as u64);
        Ok(Self {
            device: device.clone(),
            host,
            dev,
            bytes,
            host_access: Mutex::new(()),
        })
    }

    /// Bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The whole buffer as device memory, for kernel arguments.
    pub fn range(&self) -> MemRange<'_> {
        MemRange::from_parts(&self.device, self.dev, self.bytes)
    }

    fn check(&self, stream: &Stream, offset: usize, len: usize) -> Result<()> {
        stream.device().expect_same(&self.device, "mapped buffer")?;
        if offset.checked_add(len).is_none_or(|e| e > self.bytes) {
            return Err(GpuError::OutOfBounds {
                start: offset as u64,
                end: (offset as u64).saturating_add(len as u64),
                len: self.bytes as u64,
            });
        }
        Ok(())
    }

    /// Waits for `stream`, then hands `f` the `len` bytes at `offset` where the device wrote
    /// them.
    pub fn read_with<R>(
        &self,
        stream: &Stream,
        offset: usize,
        len: usize,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R> {
        self.check(stream, offset, len)?;
        stream.synchronize()?;
        let _host = self.host_access.lock();
        // SAFETY: `offset..offset + len` lies in the live allocation (checked). The work queued
        // on `stream` before this call has finished; other host access waits for the lock.
        // Bytes have no invalid values, so a kernel the owner failed to order before this read
        // could make the values stale or torn, never the slice invalid.
        let bytes = unsafe { std::slice::from_raw_parts(self.host.add(offset), len) };
        Ok(f(bytes))
    }

    /// The 32-bit word at `offset` as it is now, without waiting for any stream: for a flag that
    /// kernels set while the host keeps queueing work (a value written by a kernel still running
    /// may arrive later). `offset` must be 4-byte aligned.
    pub fn peek_u32(&self, offset: usize) -> Result<u32> {
        if offset & 3 != 0 || offset.checked_add(4).is_none_or(|e| e > self.bytes) {
            return Err(GpuError::OutOfBounds {
                start: offset as u64,
                end: (offset as u64).saturating_add(4),
                len: self.bytes as u64,
            });
        }
        // SAFETY: the word lies in the live allocation (checked) and is 4-byte aligned (host
        // allocations are page aligned, `offset` checked); devices write it only with whole-word
        // atomics, and the atomic load never forms a reference that a device write could alias
        // in a way Rust forbids.
        let v = unsafe {
            std::sync::atomic::AtomicU32::from_ptr(self.host.add(offset).cast::<u32>())
                .load(std::sync::atomic::Ordering::Acquire)
        };
        Ok(v)
    }

    /// Waits for `stream` (work queued before may still read or write the bytes), then copies
    /// `data` in at `offset`; work queued on `stream` afterwards sees it.
    pub fn write(&self, stream: &Stream, offset: usize, data: &[u8]) -> Result<()> {
        self.check(stream, offset, data.len())?;
        stream.synchronize()?;
        let _host = self.host_access.lock();
        // SAFETY: the destination lies in the live allocation (checked) and no host reference
        // to it is alive (the lock); `data` is a distinct host slice.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.host.add(offset), data.len());
        }
        Ok(())
    }
}

impl Drop for MappedHostBuffer {
    fn drop(&mut self) {
        if self.bytes == 0 {
            return;
        }
        self.device.inner.raw.remove_foreign(self.dev.0);
        // SAFETY: `host` came from host_malloc; the owner has waited for the work that uses the
        // buffer (as for device buffers, whose frees do not wait either).
        if let Err(e) = unsafe { self.device.api().host_free(self.host.cast()) } {
            self.device.record_error("hipHostFree", e);
        }
    }
}
