//! Weights on the device: the device weight arena and the asynchronous uploader, which fills
//! pinned staging buffers on the host (copy, or dequantize/repack through a closure) while the
//! previous buffer's H2D copy runs on a dedicated upload stream.

use std::marker::PhantomData;
use std::sync::Arc;

use bytemuck::Pod;
use hip_ffi::DevicePtr;

use crate::buffer::{DeviceView, DeviceViewMut, PinnedHostBuffer};
use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::pool::{ArenaSlot, Pool, PoolStats, WeightArena, RAW_ALIGN};
use crate::stream::{Event, Stream};

/// Alignment of tensors inside the weight arena.
pub const TENSOR_ALIGN: u64 = RAW_ALIGN;

/// A weight arena in device memory.
#[derive(Debug)]
pub struct DeviceArena {
    device: Device,
    arena: WeightArena,
}

impl DeviceArena {
    /// An arena sized for `sizes` up front (one driver allocation per chunk of at most
    /// `max_chunk` bytes, none per tensor).
    pub fn for_sizes(device: &Device, sizes: &[u64], max_chunk: u64, tag: &str) -> Result<Self> {
        let arena =
            WeightArena::for_sizes(device.allocator(), sizes, TENSOR_ALIGN, max_chunk, tag)?;
        Ok(DeviceArena {
            device: device.clone(),
            arena,
        })
    }

    /// Carves a tensor's slot.
    pub fn alloc(&self, bytes: u64) -> Result<ArenaSlot> {
        self.arena.alloc_slot(bytes, TENSOR_ALIGN)
    }

    /// The slot as a typed view (its byte size must be a whole number of `T`).
    pub fn view<T: Pod>(&self, slot: &ArenaSlot) -> Result<DeviceView<'_, T>> {
        let size = std::mem::size_of::<T>() as u64;
        if size == 0 || slot.bytes % size != 0 {
            return Err(GpuError::InvalidArgument(format!(
                "slot of {} bytes is not a whole number of {size}-byte elements",
                slot.bytes
            )));
        }
        let (base, chunk_bytes) = self
            .arena
            .chunk(slot.chunk)
            .ok_or_else(|| GpuError::InvalidArgument(format!("no arena chunk {}", slot.chunk)))?;
        if slot.addr != base + slot.offset || slot.offset + slot.bytes > chunk_bytes {
            return Err(GpuError::OutOfBounds {
                start: slot.offset,
                end: slot.offset + slot.bytes,
                len: chunk_bytes,
            });
        }
        let whole = slot.offset == 0 && slot.bytes == chunk_bytes;
        let len = usize::try_from(slot.bytes / size)
            .map_err(|_| GpuError::InvalidArgument("slot too large".into()))?;
        Ok(DeviceView {
            device: &self.device,
            ptr: DevicePtr(slot.addr),
            len,
            whole,
            _t: PhantomData,
        })
    }

    /// Queues a byte fill of every chunk on `stream` (an arena of buffers that must start
    /// zeroed, such as a KV cache's).
    pub fn fill(&self, stream: &Stream, value: u8) -> Result<()> {
        for i in 0..self.arena.chunk_count() {
            let Some((addr, bytes)) = self.arena.chunk(i) else {
                continue;
            };
            let len = usize::try_from(bytes)
                .map_err(|_| GpuError::InvalidArgument("arena chunk too large".into()))?;
            // SAFETY: the chunk is one whole live driver allocation of this arena's device, kept
            // until the arena drops (not while `self` is borrowed). Device memory is written by
            // queued work only, never through host references (as `MemRange::view_mut`).
            let mut view =
                unsafe { DeviceViewMut::<u8>::from_raw(&self.device, DevicePtr(addr), len, true) };
            stream.memset(&mut view, value)?;
        }
        Ok(())
    }

    /// Driver allocations made for the arena.
    pub fn chunk_count(&self) -> usize {
        self.arena.chunk_count()
    }

    /// Pool statistics.
    pub fn stats(&self) -> PoolStats {
        self.arena.stats()
    }
}

/// Fills `dst` (a staging piece) with bytes `offset..offset + dst.len()` of tensor `index`'s
/// device form. The default copies raw bytes; a backend can dequantize or repack here.
pub type FillFn<'a> = dyn FnMut(usize, u64, &mut [u8]) -> Result<()> + 'a;

/// Uploads tensors through two pinned staging buffers on its own stream.
#[derive(Debug)]
pub struct WeightUploader {
    device: Device,
    stream: Arc<Stream>,
    staging: [PinnedHostBuffer<u8>; 2],
    done: [Option<Event>; 2],
}

impl WeightUploader {
    /// An uploader with two staging buffers of `staging_bytes` each.
    pub fn new(device: &Device, staging_bytes: usize) -> Result<Self> {
        if staging_bytes == 0 {
            return Err(GpuError::InvalidArgument("staging size 0".into()));
        }
        Ok(WeightUploader {
            device: device.clone(),
            stream: Arc::new(Stream::new(device)?),
            staging: [
                PinnedHostBuffer::new(device, staging_bytes)?,
                PinnedHostBuffer::new(device, staging_bytes)?,
            ],
            done: [None, None],
        })
    }

    /// The upload stream (compute streams wait on [`WeightUploader::upload`]'s event).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Uploads tensors of the given device sizes into their slots; `fill` produces each
    /// piece on the host while the previous piece is in flight. Returns an event recorded after
    /// the last copy: a compute stream that waits on it sees every weight.
    pub fn upload(
        &mut self,
        arena: &DeviceArena,
        slots: &[ArenaSlot],
        fill: &mut FillFn<'_>,
    ) -> Result<Event> {
        self.device.expect_same(&arena.device, "arena")?;
        let mut turn = 0usize;
        for (index, slot) in slots.iter().enumerate() {
            let mut offset = 0u64;
            while offset < slot.bytes {
                let i = turn % 2;
                turn += 1;
                // The buffer's previous copy must finish before the host refills it.
                if let Some(e) = self.done[i].take() {
                    e.synchronize()?;
                }
                let piece = (slot.bytes - offset).min(self.staging[i].len() as u64) as usize;
                let host = self.staging[i].as_mut_slice()?;
                fill(index, offset, &mut host[..piece])?;
                let dst = DevicePtr(slot.addr + offset);
                // SAFETY: `dst..dst+piece` lies in the slot (piece <= bytes - offset), which is
                // arena device memory; the staging piece is pinned and is not touched by the host
                // again until `done[i]` (recorded right after) completes.
                unsafe {
                    self.device.api().memcpy_htod_async(
                        dst,
                        host.as_ptr().cast(),
                        piece,
                        self.stream.handle(),
                    )?;
                }
                let ev = Event::new(&self.device, false)?;
                ev.record(&self.stream)?;
                self.done[i] = Some(ev);
                offset += piece as u64;
            }
        }
        let all = Event::new(&self.device, false)?;
        all.record(&self.stream)?;
        Ok(all)
    }

    /// Plans an arena for `tensors` (host bytes), uploads them as they are, and waits.
    pub fn upload_bytes(
        &mut self,
        tensors: &[&[u8]],
        max_chunk: u64,
        tag: &str,
    ) -> Result<(DeviceArena, Vec<ArenaSlot>)> {
        let sizes: Vec<u64> = tensors.iter().map(|t| t.len() as u64).collect();
        let arena = DeviceArena::for_sizes(&self.device, &sizes, max_chunk, tag)?;
        let slots = sizes
            .iter()
            .map(|&s| arena.alloc(s))
            .collect::<Result<Vec<_>>>()?;
        let mut copy = |i: usize, off: u64, dst: &mut [u8]| -> Result<()> {
            let src = tensors[i]
                .get(off as usize..off as usize + dst.len())
                .ok_or(GpuError::OutOfBounds {
                    start: off,
                    end: off + dst.len() as u64,
                    len: tensors[i].len() as u64,
                })?;
            dst.copy_from_slice(src);
            Ok(())
        };
        let done = self.upload(&arena, &slots, &mut copy)?;
        done.synchronize()?;
        Ok((arena, slots))
    }
}
