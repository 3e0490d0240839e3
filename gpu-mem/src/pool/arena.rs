//! The weight arena: few large raw allocations, carved into aligned sub-allocations that live
//! until the arena is dropped (weights are loaded once and never freed one by one).

use std::sync::Arc;

use parking_lot::Mutex;

use super::{Block, Pool, PoolStats, RawAllocator, RAW_ALIGN};
use crate::error::{align_up, GpuError, Result};

#[derive(Debug, Clone, Copy)]
struct Chunk {
    addr: u64,
    bytes: u64,
    used: u64,
}

#[derive(Debug, Default)]
struct Inner {
    chunks: Vec<Chunk>,
    stats: PoolStats,
}

/// A sub-allocation of the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaSlot {
    /// Which chunk (raw allocation) it lies in.
    pub chunk: usize,
    /// Byte offset inside that chunk.
    pub offset: u64,
    /// Absolute address (chunk base + offset).
    pub addr: u64,
    /// Size in bytes.
    pub bytes: u64,
}

/// A bump allocator over large chunks from a raw allocator.
pub struct WeightArena {
    raw: Arc<dyn RawAllocator>,
    chunk_bytes: u64,
    tag: String,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for WeightArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WeightArena")
            .field("tag", &self.tag)
            .field("chunk_bytes", &self.chunk_bytes)
            .field("stats", &self.stats())
            .finish()
    }
}

impl WeightArena {
    /// An empty arena that grows by chunks of at least `chunk_bytes`.
    pub fn new(
        raw: Arc<dyn RawAllocator>,
        chunk_bytes: u64,
        tag: impl Into<String>,
    ) -> Result<Self> {
        if chunk_bytes == 0 {
            return Err(GpuError::InvalidArgument("arena chunk size 0".into()));
        }
        Ok(WeightArena {
            raw,
            chunk_bytes,
            tag: tag.into(),
            inner: Mutex::new(Inner::default()),
        })
    }

    /// An arena sized for `sizes` (each aligned to `align`) in as few chunks as `max_chunk`
    /// allows, allocated up front: one raw allocation per chunk, none per tensor.
    pub fn for_sizes(
        raw: Arc<dyn RawAllocator>,
        sizes: &[u64],
        align: u64,
        max_chunk: u64,
        tag: impl Into<String>,
    ) -> Result<Self> {
        let plan = Self::plan_chunks(sizes, align, max_chunk)?;
        let arena = WeightArena::new(raw, max_chunk.max(1), tag)?;
        for bytes in plan {
            arena.add_chunk(bytes)?;
        }
        Ok(arena)
    }

    /// Chunk sizes that hold `sizes` in order, each aligned to `align`, no chunk above
    /// `max_chunk` unless one item alone is larger.
    pub fn plan_chunks(sizes: &[u64], align: u64, max_chunk: u64) -> Result<Vec<u64>> {
        let mut chunks = Vec::new();
        let mut cur = 0u64;
        for &s in sizes {
            let start = align_up(cur, align)?;
            let end = start
                .checked_add(s)
                .ok_or_else(|| GpuError::InvalidArgument("arena size overflows".into()))?;
            if cur > 0 && end > max_chunk {
                chunks.push(cur);
                cur = s;
            } else {
                cur = end;
            }
        }
        if cur > 0 {
            chunks.push(cur);
        }
        Ok(chunks)
    }

    fn add_chunk(&self, bytes: u64) -> Result<usize> {
        let bytes = align_up(bytes.max(1), RAW_ALIGN)?;
        let addr = self.raw.allocate(bytes, &self.tag)?;
        let mut g = self.inner.lock();
        g.chunks.push(Chunk {
            addr,
            bytes,
            used: 0,
        });
        g.stats.bytes_pooled += bytes;
        g.stats.allocation_calls += 1;
        Ok(g.chunks.len() - 1)
    }

    /// Carves `bytes` aligned to `align` (at most [`RAW_ALIGN`]) out of the arena, adding a chunk
    /// when no existing one has room.
    pub fn alloc_slot(&self, bytes: u64, align: u64) -> Result<ArenaSlot> {
        if align > RAW_ALIGN || align == 0 || !align.is_power_of_two() {
            return Err(GpuError::InvalidArgument(format!(
                "arena alignment {align} must be a power of two up to {RAW_ALIGN}"
            )));
        }
        if let Some(slot) = self.try_fit(bytes, align)? {
            self.inner.lock().stats.hits += 1;
            return Ok(slot);
        }
        self.inner.lock().stats.misses += 1;
        self.add_chunk(bytes.max(self.chunk_bytes))?;
        self.try_fit(bytes, align)?.ok_or_else(|| {
            GpuError::InvalidArgument(format!("{bytes} bytes do not fit a fresh arena chunk"))
        })
    }

    fn try_fit(&self, bytes: u64, align: u64) -> Result<Option<ArenaSlot>> {
        let mut g = self.inner.lock();
        let Inner { chunks, stats } = &mut *g;
        for (i, c) in chunks.iter_mut().enumerate() {
            let offset = align_up(c.used, align)?;
            let Some(end) = offset.checked_add(bytes) else {
                continue;
            };
            if end <= c.bytes {
                c.used = end;
                stats.on_use(bytes);
                return Ok(Some(ArenaSlot {
                    chunk: i,
                    offset,
                    addr: c.addr + offset,
                    bytes,
                }));
            }
        }
        Ok(None)
    }

    /// Number of raw allocations (chunks).
    pub fn chunk_count(&self) -> usize {
        self.inner.lock().chunks.len()
    }

    /// `(base address, size)` of chunk `i`: the whole allocation a slot lies in.
    pub fn chunk(&self, i: usize) -> Option<(u64, u64)> {
        self.inner.lock().chunks.get(i).map(|c| (c.addr, c.bytes))
    }
}

impl Pool for WeightArena {
    fn alloc(&self, bytes: u64, align: u64) -> Result<Block> {
        self.alloc_slot(bytes, align).map(|s| Block {
            addr: s.addr,
            bytes: s.bytes,
        })
    }

    unsafe fn free(&self, block: Block) {
        // Arena memory is reclaimed when the arena goes; a freed slot only leaves the in-use count.
        let mut g = self.inner.lock();
        g.stats.bytes_in_use = g.stats.bytes_in_use.saturating_sub(block.bytes);
    }

    fn stats(&self) -> PoolStats {
        self.inner.lock().stats
    }
}

impl Drop for WeightArena {
    fn drop(&mut self) {
        let chunks = std::mem::take(&mut self.inner.get_mut().chunks);
        for c in chunks {
            self.raw.deallocate(c.addr, c.bytes);
        }
    }
}
