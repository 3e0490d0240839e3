//! The caching activation allocator: blocks rounded to size classes, returned blocks kept for
//! reuse, cached blocks released when the budget is under pressure or an allocation fails.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::{Block, Pool, PoolStats, RawAllocator, RAW_ALIGN};
use crate::budget::{Budget, Pressure};
use crate::error::{GpuError, Result};

/// The size class of a request: 512 bytes minimum, powers of two up to 1 MiB, then multiples of
/// 2 MiB (so large activations waste at most 2 MiB each).
pub fn size_class(bytes: u64) -> Option<u64> {
    const SMALL: u64 = 512;
    const MID: u64 = 1 << 20;
    const STEP: u64 = 2 << 20;
    if bytes <= SMALL {
        Some(SMALL)
    } else if bytes <= MID {
        bytes.checked_next_power_of_two()
    } else {
        bytes.checked_add(STEP - 1).map(|b| b / STEP * STEP)
    }
}

#[derive(Debug, Default)]
struct Inner {
    free: BTreeMap<u64, Vec<u64>>,
    cached_bytes: u64,
    stats: PoolStats,
}

/// A caching allocator over a raw allocator.
pub struct CachingAllocator {
    raw: Arc<dyn RawAllocator>,
    budget: Option<Arc<Budget>>,
    tag: String,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for CachingAllocator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachingAllocator")
            .field("tag", &self.tag)
            .field("stats", &self.stats())
            .finish()
    }
}

impl CachingAllocator {
    /// A caching allocator; with a `budget`, returned blocks are released instead of cached while
    /// its pressure is high.
    pub fn new(
        raw: Arc<dyn RawAllocator>,
        budget: Option<Arc<Budget>>,
        tag: impl Into<String>,
    ) -> Self {
        CachingAllocator {
            raw,
            budget,
            tag: tag.into(),
            inner: Mutex::new(Inner::default()),
        }
    }

    /// Bytes held in the cache (returned, not in use).
    pub fn cached_bytes(&self) -> u64 {
        self.inner.lock().cached_bytes
    }

    /// Frees every cached block; returns the bytes released.
    pub fn release_cached(&self) -> u64 {
        let blocks: Vec<(u64, u64)> = {
            let mut g = self.inner.lock();
            let free = std::mem::take(&mut g.free);
            let released = g.cached_bytes;
            g.cached_bytes = 0;
            g.stats.bytes_pooled -= released;
            free.into_iter()
                .flat_map(|(class, v)| v.into_iter().map(move |a| (a, class)))
                .collect()
        };
        let mut total = 0;
        for (addr, class) in &blocks {
            self.raw.deallocate(*addr, *class);
            total += class;
        }
        self.inner.lock().stats.free_calls += blocks.len() as u64;
        total
    }

    /// Releases cached memory according to a pressure level: everything at `High` or above.
    pub fn trim(&self, pressure: Pressure) -> u64 {
        if pressure >= Pressure::High {
            self.release_cached()
        } else {
            0
        }
    }
}

impl Pool for CachingAllocator {
    fn alloc(&self, bytes: u64, align: u64) -> Result<Block> {
        if bytes == 0 {
            return Err(GpuError::InvalidArgument("zero-byte allocation".into()));
        }
        if align == 0 || !align.is_power_of_two() || align > RAW_ALIGN {
            return Err(GpuError::InvalidArgument(format!(
                "alignment {align} must be a power of two up to {RAW_ALIGN}"
            )));
        }
        let class = size_class(bytes)
            .ok_or_else(|| GpuError::InvalidArgument(format!("{bytes} bytes has no size class")))?;
        {
            let mut g = self.inner.lock();
            let reused = g.free.get_mut(&class).and_then(Vec::pop);
            if let Some(addr) = reused {
                if g.free.get(&class).is_some_and(Vec::is_empty) {
                    g.free.remove(&class);
                }
                g.cached_bytes -= class;
                g.stats.hits += 1;
                g.stats.on_use(class);
                return Ok(Block { addr, bytes: class });
            }
        }
        let addr = match self.raw.allocate(class, &self.tag) {
            Ok(a) => a,
            Err(e) if e.is_out_of_memory() && self.cached_bytes() > 0 => {
                tracing::debug!(
                    bytes = class,
                    "allocation failed, releasing the cache and retrying"
                );
                self.release_cached();
                self.raw.allocate(class, &self.tag)?
            }
            Err(e) => return Err(e),
        };
        let mut g = self.inner.lock();
        g.stats.misses += 1;
        g.stats.allocation_calls += 1;
        g.stats.bytes_pooled += class;
        g.stats.on_use(class);
        Ok(Block { addr, bytes: class })
    }

    unsafe fn free(&self, block: Block) {
        {
            let mut g = self.inner.lock();
            g.stats.bytes_in_use = g.stats.bytes_in_use.saturating_sub(block.bytes);
            g.free.entry(block.bytes).or_default().push(block.addr);
            g.cached_bytes += block.bytes;
        }
        if let Some(b) = &self.budget {
            self.trim(b.pressure());
        }
    }

    fn stats(&self) -> PoolStats {
        self.inner.lock().stats
    }
}

impl Drop for CachingAllocator {
    fn drop(&mut self) {
        self.release_cached();
    }
}
