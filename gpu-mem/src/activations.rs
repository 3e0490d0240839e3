//! Device activations from the caching allocator: typed leases that hand out views and return
//! their block to the pool on drop.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use hip_ffi::DevicePtr;

use crate::buffer::{DeviceView, DeviceViewMut};
use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::pool::{CachingAllocator, Lease, Pool, PoolStats, RAW_ALIGN};

/// A caching allocator over one device's budgeted memory.
#[derive(Debug, Clone)]
pub struct ActivationPool {
    device: Device,
    pool: Arc<CachingAllocator>,
}

impl ActivationPool {
    /// A pool whose returned blocks are released when the device budget is under pressure.
    pub fn new(device: &Device, tag: &str) -> Self {
        let pool = CachingAllocator::new(device.allocator(), Some(device.budget().clone()), tag);
        ActivationPool {
            device: device.clone(),
            pool: Arc::new(pool),
        }
    }

    /// `len` elements (contents undefined until written).
    pub fn alloc<T: Pod>(&self, len: usize) -> Result<ActivationBuffer<T>> {
        let bytes = (len as u64)
            .checked_mul(std::mem::size_of::<T>() as u64)
            .filter(|&b| b > 0)
            .ok_or_else(|| GpuError::InvalidArgument(format!("activation of {len} elements")))?;
        let pool: Arc<dyn Pool> = self.pool.clone();
        let lease = Lease::new(pool, bytes, RAW_ALIGN)?;
        Ok(ActivationBuffer {
            device: self.device.clone(),
            lease,
            len,
            _t: PhantomData,
        })
    }

    /// Releases cached (returned) blocks; returns the bytes freed.
    pub fn release_cached(&self) -> u64 {
        self.pool.release_cached()
    }

    /// Pool statistics.
    pub fn stats(&self) -> PoolStats {
        self.pool.stats()
    }
}

/// A typed block of an [`ActivationPool`]; the block goes back to the pool on drop, so work
/// queued on it must be ordered before the drop (stream order), as for any device buffer.
#[derive(Debug)]
pub struct ActivationBuffer<T: Pod> {
    device: Device,
    lease: Lease,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Pod> ActivationBuffer<T> {
    /// Element count.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty (never: empty activations are refused).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A read-only view. It starts at a driver allocation's base but may be shorter than the
    /// size-class block, so reads take the staging path like any partial view.
    pub fn view(&self) -> DeviceView<'_, T> {
        DeviceView {
            device: &self.device,
            ptr: DevicePtr(self.lease.block().addr),
            len: self.len,
            whole: false,
            _t: PhantomData,
        }
    }

    /// A writable view.
    pub fn view_mut(&mut self) -> DeviceViewMut<'_, T> {
        DeviceViewMut {
            device: &self.device,
            ptr: DevicePtr(self.lease.block().addr),
            len: self.len,
            whole: false,
            _t: PhantomData,
        }
    }
}
