//! Pools over raw allocators: the weight arena (a few large allocations, aligned
//! sub-allocations) behind the [`Pool`] trait with [`PoolStats`]. Pools see addresses only, so their logic is tested over
//! [`HostAllocator`] exactly as it runs over device memory.

mod arena;

use std::alloc::Layout;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

pub use arena::{ArenaSlot, WeightArena};

use crate::budget::{Budget, Tracker};
use crate::error::{GpuError, Result};

/// Memory every allocation of a raw allocator is aligned to (HIP and CUDA give at least 256).
pub const RAW_ALIGN: u64 = 256;

/// Allocates and frees whole blocks of memory by address.
pub trait RawAllocator: Send + Sync {
    /// Allocates `bytes` (> 0), aligned to [`RAW_ALIGN`]; `tag` names the owner for tracking.
    fn allocate(&self, bytes: u64, tag: &str) -> Result<u64>;
    /// Frees a block returned by `allocate` with the same size. Errors are recorded by the
    /// implementation (this runs from `Drop`).
    fn deallocate(&self, addr: u64, bytes: u64);
    /// Number of successful `allocate` calls so far.
    fn allocation_calls(&self) -> u64;
}

/// Host memory with device-like alignment: the test double for device memory.
#[derive(Debug, Default)]
pub struct HostAllocator {
    calls: AtomicU64,
    frees: AtomicU64,
    /// Failing after this many allocations simulates out-of-memory (`u64::MAX`: never).
    fail_after: Option<u64>,
}

impl HostAllocator {
    /// A host allocator that never fails on purpose.
    pub fn new() -> Self {
        Self::default()
    }

    /// A host allocator whose allocations fail after `n` successes.
    pub fn failing_after(n: u64) -> Self {
        HostAllocator {
            fail_after: Some(n),
            ..Self::default()
        }
    }

    /// Number of frees so far.
    pub fn free_calls(&self) -> u64 {
        self.frees.load(Ordering::Relaxed)
    }
}

impl RawAllocator for HostAllocator {
    fn allocate(&self, bytes: u64, _tag: &str) -> Result<u64> {
        if self
            .fail_after
            .is_some_and(|n| self.calls.load(Ordering::Relaxed) >= n)
        {
            return Err(GpuError::HostAlloc(bytes));
        }
        let layout = host_layout(bytes)?;
        // SAFETY: `layout` has a non-zero size (checked by host_layout).
        let p = unsafe { std::alloc::alloc(layout) };
        if p.is_null() {
            return Err(GpuError::HostAlloc(bytes));
        }
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(p as usize as u64)
    }

    fn deallocate(&self, addr: u64, bytes: u64) {
        if let Ok(layout) = host_layout(bytes) {
            self.frees.fetch_add(1, Ordering::Relaxed);
            // SAFETY: `addr` came from `allocate` with the same size, hence the same layout.
            unsafe { std::alloc::dealloc(addr as usize as *mut u8, layout) };
        }
    }

    fn allocation_calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
}

fn host_layout(bytes: u64) -> Result<Layout> {
    let size = usize::try_from(bytes).map_err(|_| GpuError::HostAlloc(bytes))?;
    if size == 0 {
        return Err(GpuError::InvalidArgument("zero-byte allocation".into()));
    }
    Layout::from_size_align(size, RAW_ALIGN as usize).map_err(|_| GpuError::HostAlloc(bytes))
}

/// A raw allocator with a budget checked before each call and every block tracked.
pub struct Accounted<A: RawAllocator + ?Sized> {
    inner: Arc<A>,
    budget: Arc<Budget>,
    tracker: Arc<Tracker>,
    /// Live blocks: address -> (tracker id, bytes).
    ids: Mutex<std::collections::HashMap<u64, (u64, u64)>>,
    /// Blocks that stopped being live so far (see [`Accounted::ends`]).
    ends: AtomicU64,
}

impl<A: RawAllocator + ?Sized> Accounted<A> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<A>, budget: Arc<Budget>, tracker: Arc<Tracker>) -> Self {
        Accounted {
            inner,
            budget,
            tracker,
            ids: Mutex::new(Default::default()),
            ends: AtomicU64::new(0),
        }
    }

    /// The budget.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// The tracker.
    pub fn tracker(&self) -> &Arc<Tracker> {
        &self.tracker
    }

    /// The live blocks `(address, tracker id)` that contain each of `ranges` (`(address,
    /// bytes)`), without repeats; `None` when a range lies outside every live block.
    pub fn blocks_of(&self, ranges: &[(u64, u64)]) -> Option<Vec<(u64, u64)>> {
        let mut live: Vec<(u64, u64, u64)> = self
            .ids
            .lock()
            .iter()
            .map(|(&addr, &(id, bytes))| (addr, bytes, id))
            .collect();
        live.sort_unstable();
        let mut out = Vec::new();
        for &(addr, bytes) in ranges {
            let i = live.partition_point(|b| b.0 <= addr).checked_sub(1)?;
            let (base, size, id) = live[i];
            if addr.checked_add(bytes)? > base + size {
                return None;
            }
            out.push((base, id));
        }
        out.sort_unstable();
        out.dedup();
        Some(out)
    }

    /// Lists `bytes` at `addr` that are not this allocator's (mapped host memory) as a live
    /// block, so that captured work using them is accepted and its replays check they are still
    /// there; no budget is taken and the tracker's totals leave them out.
    pub(crate) fn add_foreign(&self, addr: u64, bytes: u64) {
        let id = self.tracker.fresh_id();
        self.ids.lock().insert(addr, (id, bytes));
    }

    /// Ends [`Accounted::add_foreign`]'s listing of the block at `addr`.
    pub(crate) fn remove_foreign(&self, addr: u64) {
        self.ids.lock().remove(&addr);
        self.ends.fetch_add(1, Ordering::Release);
    }

    /// How many blocks stopped being live so far: while it stays the same, blocks found live
    /// by [`Accounted::all_live`] still are (a graph replayed every step checks its blocks
    /// once, not on every replay).
    pub fn ends(&self) -> u64 {
        self.ends.load(Ordering::Acquire)
    }

    /// True when every `(address, tracker id)` of `blocks` is still the live block at that
    /// address (a freed block's id is never reused).
    pub fn all_live(&self, blocks: &[(u64, u64)]) -> bool {
        let ids = self.ids.lock();
        blocks
            .iter()
            .all(|(addr, id)| ids.get(addr).is_some_and(|&(live, _)| live == *id))
    }
}

impl<A: RawAllocator + ?Sized> RawAllocator for Accounted<A> {
    fn allocate(&self, bytes: u64, tag: &str) -> Result<u64> {
        self.budget.try_reserve(bytes, tag)?;
        match self.inner.allocate(bytes, tag) {
            Ok(addr) => {
                let id = self.tracker.record(tag, bytes);
                self.ids.lock().insert(addr, (id, bytes));
                Ok(addr)
            }
            Err(e) => {
                self.budget.release(bytes);
                Err(e)
            }
        }
    }

    fn deallocate(&self, addr: u64, bytes: u64) {
        if let Some((id, _)) = self.ids.lock().remove(&addr) {
            self.tracker.forget(id);
        }
        self.ends.fetch_add(1, Ordering::Release);
        self.budget.release(bytes);
        self.inner.deallocate(addr, bytes);
    }

    fn allocation_calls(&self) -> u64 {
        self.inner.allocation_calls()
    }
}

/// Counters every pool keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes handed out and not returned.
    pub bytes_in_use: u64,
    /// Bytes the pool holds from its raw allocator (in use or cached).
    pub bytes_pooled: u64,
    /// Highest `bytes_in_use`.
    pub peak_in_use: u64,
    /// Requests served from memory the pool already held.
    pub hits: u64,
    /// Requests that needed a new raw allocation.
    pub misses: u64,
    /// Raw allocation calls the pool made.
    pub allocation_calls: u64,
    /// Raw free calls the pool made.
    pub free_calls: u64,
}

impl PoolStats {
    pub(crate) fn on_use(&mut self, bytes: u64) {
        self.bytes_in_use += bytes;
        self.peak_in_use = self.peak_in_use.max(self.bytes_in_use);
    }
}

/// A block handed out by a pool: `addr..addr+bytes` (`bytes` >= the request).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    /// Start address.
    pub addr: u64,
    /// Usable bytes from `addr`.
    pub bytes: u64,
}

/// A pool: `alloc(size) -> (ptr, actual)` / `free`, with statistics.
pub trait Pool: Send + Sync {
    /// Hands out at least `bytes` aligned to `align` (a power of two).
    fn alloc(&self, bytes: u64, align: u64) -> Result<Block>;
    /// Takes a block back.
    ///
    /// # Safety
    /// `block` came from this pool's `alloc`, is returned once, and nothing uses it any more
    /// (on a device: no queued work reads or writes it).
    unsafe fn free(&self, block: Block);
    /// Current statistics.
    fn stats(&self) -> PoolStats;
}

/// A pool block returned to its pool on drop.
pub struct Lease {
    pool: Arc<dyn Pool>,
    block: Block,
    requested: u64,
}

impl Lease {
    /// Allocates from `pool`.
    pub fn new(pool: Arc<dyn Pool>, bytes: u64, align: u64) -> Result<Lease> {
        let block = pool.alloc(bytes, align)?;
        Ok(Lease {
            pool,
            block,
            requested: bytes,
        })
    }

    /// The block (its size may exceed the request).
    pub fn block(&self) -> Block {
        self.block
    }

    /// The size asked for.
    pub fn requested(&self) -> u64 {
        self.requested
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("block", &self.block)
            .field("requested", &self.requested)
            .finish()
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        // SAFETY: the block came from this pool and the lease owned it exclusively; device users
        // order their work before dropping the lease (stream-ordered use).
        unsafe { self.pool.free(self.block) };
    }
}

#[cfg(test)]
mod tests;
