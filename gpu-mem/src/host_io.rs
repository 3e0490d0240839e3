//! A stream's page-locked host staging for small, frequent transfers: one reusable pinned buffer
//! that reads land in ([`Stream::read_staged`] copies them out, [`Stream::read_pinned_with`]
//! lends them to a closure where they landed) and a ring of pinned blocks that small writes are
//! queued from ([`Stream::queue_write_range`]), so a decode step's inputs (token ids, positions)
//! and output (logits) move without pageable copies and without a synchronize per write.
//!
//! Design choices:
//! - Pageable copies make the driver stage through its own pinned memory and, for writes, force a
//!   stream synchronize before the caller may reuse its slice; copying through our own pinned
//!   memory costs one host memcpy and lets writes return as soon as they are queued.
//! - The read buffer grows (to a power of two, at most [`READ_CHUNK`]) and is never shrunk; a
//!   larger read goes through it in chunks. On NVIDIA a chunk's device-to-host copy is queued in
//!   a few pieces with an event after each, and each piece is copied out as soon as it landed,
//!   which hides most of the host copy behind the transfer (ROCm reads each chunk from the start
//!   of a whole allocation, in one piece: DESIGN.md, section 6). Every read waits for its copies
//!   before returning, so the buffer is idle between calls.
//! - A queued write copies the caller's bytes into the next block of the ring and records the
//!   block's event after the copy; a block is written again only after its event completed, so
//!   a pending transfer never sees its bytes change. Ordering against later work needs nothing
//!   else: everything is queued on the one stream.
//! - A single aligned 32-bit word (a decode step's token id or position) skips the ring: one
//!   stream value write costs the host one call instead of a copy call plus event calls.

use bytemuck::Pod;
use hip_ffi::{DevicePtr, Platform};

use crate::buffer::{DeviceView, PinnedHostBuffer};
use crate::error::{GpuError, Result};
use crate::launch::MemRange;
use crate::stream::{Event, Stream};

/// Largest chunk of a read staged at once (and the largest size the read buffer grows to).
pub const READ_CHUNK: usize = 32 << 20;
/// Smallest read buffer allocated (reads of a few bytes do not reallocate on every growth).
const READ_MIN: usize = 64 << 10;
/// Pieces a read is split into at most, so the host copies finished pieces out of the pinned
/// buffer while the later ones are still in flight.
const READ_PIECES: usize = 4;
/// Smallest piece: reads below twice this size go in one piece.
const PIECE_MIN: usize = 128 << 10;
/// Largest write queued through the ring; larger writes take the blocking path.
pub const QUEUED_WRITE_MAX: usize = 64 << 10;
/// Smallest ring block.
const BLOCK_MIN: usize = 4 << 10;
/// Blocks in the write ring: a block is reused after this many later writes (and only once its
/// copy finished).
pub const WRITE_RING: usize = 8;

const _: () = assert!(BLOCK_MIN <= QUEUED_WRITE_MAX && READ_MIN <= READ_CHUNK && WRITE_RING >= 2);
const _: () = assert!(READ_CHUNK.is_power_of_two() && QUEUED_WRITE_MAX.is_power_of_two());

/// The staging state of one stream.
#[derive(Default)]
pub(crate) struct HostIo {
    /// The read buffer; idle between calls (every read waits for its copies).
    read: Option<PinnedHostBuffer<u8>>,
    /// The write ring; each block's pending copy is tracked by the block itself, so dropping a
    /// block (growth, stream teardown) waits for its copy.
    ring: Vec<PinnedHostBuffer<u8>>,
    next: usize,
    /// Writes queued so far (through the ring or as stream value writes).
    queued: u64,
    /// The device refused a stream value write: words go through the ring too.
    no_value_writes: bool,
    /// One event per piece of a read (see [`Stream::read_pieces`]).
    events: Vec<Event>,
}

impl Stream {
    /// Copies device data to `dst` through the stream's reusable pinned buffer and waits for it
    /// (as [`Stream::read`], without a pageable copy). Sub-allocation views are staged through
    /// a whole allocation first, as in [`Stream::read`].
    pub fn read_staged<T: Pod>(&self, src: &DeviceView<'_, T>, dst: &mut [T]) -> Result<()> {
        self.device().expect_same(src.device, "view")?;
        self.note_unknown("a memory copy");
        if src.len != dst.len() {
            return Err(GpuError::LengthMismatch {
                src: src.len,
                dst: dst.len(),
            });
        }
        let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
        let total = dst.len();
        if total == 0 {
            return Ok(());
        }
        // SAFETY: the same memory as `src` (a checked view of `total` bytes), seen as bytes.
        let bytes = unsafe { DeviceView::<u8>::from_raw(src.device, src.ptr, total, src.whole) };
        let mut io = self.host_io.lock();
        let Some(buf) = self.take_read_buffer(&mut io, total.min(READ_CHUNK)) else {
            drop(io);
            return self.read(&bytes, dst);
        };
        let chunk = buf.len().min(total);
        // Pieces read from offsets inside an allocation, which plain device-to-host copies did
        // not survive on ROCm (DESIGN.md, section 6): there each chunk goes in one piece.
        let pieces = match self.device().info().platform {
            Platform::Nvidia => READ_PIECES,
            _ => 1,
        };
        self.device().bind()?;
        let mut off = 0;
        while off < total {
            let n = (total - off).min(chunk);
            let part = if n == total {
                bytes
            } else {
                bytes.slice(off..off + n)?
            };
            let staged = if part.whole {
                None
            } else {
                Some(self.stage(part.ptr, n as u64)?)
            };
            let from = staged.as_ref().map_or(part.ptr, |(p, _)| *p);
            let out = &mut dst[off..off + n];
            let done = self.read_pieces(&mut io.events, &buf, from, out, pieces);
            if let Err(e) = done {
                self.keep_after_failed_read(&mut io, buf);
                return Err(e);
            }
            drop(staged);
            off += n;
        }
        io.read = Some(buf);
        Ok(())
    }

    /// Puts the read buffer back after a failed read: copies may still be running into it, so
    /// it is kept only once the stream drained, and leaked (never freed under a copy) otherwise.
    fn keep_after_failed_read(&self, io: &mut HostIo, buf: PinnedHostBuffer<u8>) {
        if self.synchronize().is_ok() {
            put_read_buffer(io, buf);
        } else {
            std::mem::forget(buf);
        }
    }

    /// The idle read buffer, grown to hold `want` bytes; `None` when page-locked memory for it
    /// cannot be had (the caller then reads the pageable way).
    fn take_read_buffer(&self, io: &mut HostIo, want: usize) -> Option<PinnedHostBuffer<u8>> {
        match io.read.take() {
            Some(b) if b.len() >= want => Some(b),
            old => {
                // An old buffer is idle: free it before allocating the larger one.
                drop(old);
                let size = want.next_power_of_two().clamp(READ_MIN, READ_CHUNK);
                match PinnedHostBuffer::new(self.device(), size) {
                    Ok(b) => Some(b),
                    Err(e) => {
                        // Page-locked memory is a limited resource.
                        tracing::debug!("pinned read buffer of {size} bytes: {e}; pageable read");
                        None
                    }
                }
            }
        }
    }

    /// Copies device data into the stream's reusable pinned buffer, waits for it and hands `f`
    /// the values there: no host copy at all, which is what a decode step's logits want (their
    /// copy out of the pinned buffer cost more than the transfer). Reads larger than
    /// [`READ_CHUNK`], or when no page-locked memory can be had, land in a vector first.
    pub fn read_pinned_with<T: Pod, R>(
        &self,
        src: &DeviceView<'_, T>,
        f: impl FnOnce(&[T]) -> R,
    ) -> Result<R> {
        self.device().expect_same(src.device, "view")?;
        self.note_unknown("a memory copy");
        let total = src.len * std::mem::size_of::<T>();
        // The buffer leaves the stream's state while in use, so `f` runs without the lock (it
        // may read from this stream itself); a read meanwhile takes a buffer of its own.
        let buf = if total == 0 || total > READ_CHUNK {
            None
        } else {
            self.take_read_buffer(&mut self.host_io.lock(), total)
        };
        let Some(buf) = buf else {
            let mut v = vec![T::zeroed(); src.len];
            self.read_staged(src, &mut v)?;
            return Ok(f(&v));
        };
        self.device().bind()?;
        // SAFETY: the same memory as `src` (a checked view of `total` bytes), seen as bytes.
        let bytes = unsafe { DeviceView::<u8>::from_raw(src.device, src.ptr, total, src.whole) };
        // On ROCm device-to-host copies read from the start of a whole allocation (see
        // `read_staged`).
        let staged = if bytes.whole || self.device().info().platform == Platform::Nvidia {
            None
        } else {
            Some(self.stage(bytes.ptr, total as u64)?)
        };
        let from = staged.as_ref().map_or(bytes.ptr, |(p, _)| *p);
        // SAFETY: `total` bytes fit the pinned buffer (taken for at least `total`) and lie at
        // `from` on the device; the buffer is this call's alone until it goes back below, after
        // the stream synchronized.
        let queued = unsafe {
            self.device()
                .api()
                .memcpy_dtoh_async(buf.host_ptr().cast(), from, total, self.handle())
        };
        let done = queued
            .map_err(GpuError::from)
            .and_then(|()| self.synchronize());
        drop(staged);
        if let Err(e) = done {
            self.keep_after_failed_read(&mut self.host_io.lock(), buf);
            return Err(e);
        }
        // SAFETY: the copy of `total` bytes into the buffer finished; the buffer is page
        // aligned, so its start is aligned for `T`, and `total` is `src.len` values of `T`.
        let values = unsafe { std::slice::from_raw_parts(buf.host_ptr().cast::<T>(), src.len) };
        let r = f(values);
        put_read_buffer(&mut self.host_io.lock(), buf);
        Ok(r)
    }

    /// Copies `out.len()` bytes at `from` (at most the pinned buffer's size) to `out` through
    /// `buf`: queued in up to `max_pieces` pieces, each followed by an event, so the host
    /// copies a finished piece out while the later ones are still in flight. On error, copies
    /// may still be running into `buf`.
    fn read_pieces(
        &self,
        events: &mut Vec<Event>,
        buf: &PinnedHostBuffer<u8>,
        from: DevicePtr,
        out: &mut [u8],
        max_pieces: usize,
    ) -> Result<()> {
        let n = out.len();
        if n > buf.len() {
            return Err(GpuError::InvalidArgument(format!(
                "{n} bytes into a {}-byte read buffer",
                buf.len()
            )));
        }
        let pieces = (n / PIECE_MIN).clamp(1, max_pieces.max(1));
        let piece = n.div_ceil(pieces);
        while events.len() < pieces {
            events.push(Event::new(self.device(), false)?);
        }
        let range = |i: usize| {
            let start = (i * piece).min(n);
            start..(start + piece).min(n)
        };
        for (i, e) in events[..pieces].iter().enumerate() {
            let r = range(i);
            // SAFETY: `r` lies inside the pinned buffer (n <= its size, checked) and inside the
            // `n` device bytes at `from`; no other copy uses these bytes of the buffer, and the
            // caller keeps the buffer allocated until every piece's event completed (or the
            // stream drained).
            unsafe {
                self.device().api().memcpy_dtoh_async(
                    buf.host_ptr().add(r.start).cast(),
                    DevicePtr(from.0 + r.start as u64),
                    r.len(),
                    self.handle(),
                )?;
            }
            e.record(self)?;
        }
        for (i, e) in events[..pieces].iter().enumerate() {
            let r = range(i);
            e.synchronize()?;
            // SAFETY: piece `i`'s copy finished (its event completed); the copies still in
            // flight write other bytes of the buffer, never these.
            let done = unsafe { std::slice::from_raw_parts(buf.host_ptr().add(r.start), r.len()) };
            out[r].copy_from_slice(done);
        }
        Ok(())
    }

    /// Copies host bytes into `dst` (same length). Writes of at most [`QUEUED_WRITE_MAX`] bytes
    /// are queued without waiting (`src` may be reused at once; work queued later on this
    /// stream sees the data): an aligned 4-byte word as a stream value write where the device
    /// has those, anything else copied into a pinned block of the stream first. Larger writes,
    /// and writes while a capture is under way, take the blocking [`Stream::write_range`].
    pub fn queue_write_range(&self, src: &[u8], dst: MemRange<'_>) -> Result<()> {
        if src.len() > QUEUED_WRITE_MAX || self.capturing() {
            return self.write_range(src, dst);
        }
        self.note_unknown("a memory copy");
        self.device().expect_same(dst.device, "copy destination")?;
        if src.len() != dst.bytes {
            return Err(GpuError::LengthMismatch {
                src: src.len(),
                dst: dst.bytes,
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        let mut guard = self.host_io.lock();
        let io = &mut *guard;
        if let (Ok(word), true) = (<[u8; 4]>::try_from(src), dst.ptr.0 % 4 == 0) {
            // A decode step's token id or position: one stream write instead of a staged copy
            // and its event (on an H100 a staged 4-byte write held the host about 11 us, twice
            // per decode step while the GPU waited).
            // SAFETY: `dst` is 4 live, aligned bytes of device memory on this stream's device.
            if unsafe { self.value_writes(io, &[(dst.ptr, u32::from_ne_bytes(word))]) }? {
                return Ok(());
            }
        }
        let i = io.next.min(io.ring.len());
        io.next = (i + 1) % WRITE_RING;
        let need = src.len().next_power_of_two().max(BLOCK_MIN);
        if io.ring.get(i).is_none_or(|b| b.len() < need) {
            let block = match PinnedHostBuffer::new(self.device(), need) {
                Ok(b) => b,
                Err(e) => {
                    // Page-locked memory is a limited resource: write the slow way.
                    tracing::debug!("pinned write block of {need} bytes: {e}; blocking write");
                    drop(guard);
                    return self.write_range(src, dst);
                }
            };
            if i == io.ring.len() {
                io.ring.push(block);
            } else {
                // Dropping the old block waits for its pending copy.
                io.ring[i] = block;
            }
        }
        let block = &mut io.ring[i];
        // Waits for the block's previous copy; its event is recorded again below.
        let event = match block.take_pending()? {
            Some(e) => e,
            None => Event::new(self.device(), false)?,
        };
        block.as_mut_slice()?[..src.len()].copy_from_slice(src);
        self.device().bind()?;
        // SAFETY: the block holds `src.len()` initialised bytes and is marked pending below (or
        // the stream is drained), so it stays unchanged and allocated until the copy finished;
        // `dst` is live device memory of exactly that many bytes on this stream's device.
        unsafe {
            self.device().api().memcpy_htod_async(
                dst.ptr,
                block.host_ptr().cast(),
                src.len(),
                self.handle(),
            )?;
        }
        if let Err(e) = event.record(self) {
            // Without its event the block cannot tell when the copy is done: wait for it here,
            // and give the block up if even that fails.
            if self.synchronize().is_err() {
                std::mem::forget(io.ring.swap_remove(i));
            }
            return Err(e);
        }
        block.set_pending(event)?;
        io.queued += 1;
        Ok(())
    }

    /// Queues 4-byte writes of `words` (an aligned word of device memory and its value) in
    /// order, as [`Stream::queue_write_range`] would one by one, in a single driver call where
    /// the device has stream value writes (a decode step's token id and position: one call on
    /// the host's path to the next launch instead of one per input). Anything but aligned
    /// 4-byte ranges of this stream's device is refused before any write is queued.
    pub fn queue_write_words(&self, words: &[(MemRange<'_>, u32)]) -> Result<()> {
        for (m, _) in words {
            self.device().expect_same(m.device, "copy destination")?;
            if m.bytes != 4 || m.ptr.0 % 4 != 0 {
                return Err(GpuError::InvalidArgument(format!(
                    "a queued word write needs 4 aligned bytes, got {} at {:#x}",
                    m.bytes, m.ptr.0
                )));
            }
        }
        if words.is_empty() {
            return Ok(());
        }
        if !self.capturing() {
            self.note_unknown("a memory copy");
            let raw: Vec<(DevicePtr, u32)> = words.iter().map(|(m, v)| (m.ptr, *v)).collect();
            // SAFETY: every address is 4 live, aligned bytes of device memory on this stream's
            // device (checked above).
            if unsafe { self.value_writes(&mut self.host_io.lock(), &raw) }? {
                return Ok(());
            }
        }
        for (m, v) in words {
            self.queue_write_range(&v.to_ne_bytes(), *m)?;
        }
        Ok(())
    }

    /// Queues `words` as stream value writes (one driver call for one word or a batch) and
    /// counts them; false, with nothing queued, where the device refuses them (remembered: words
    /// then go through the ring).
    ///
    /// # Safety
    /// Every address is 4 live, aligned bytes of device memory on this stream's device.
    unsafe fn value_writes(&self, io: &mut HostIo, words: &[(DevicePtr, u32)]) -> Result<bool> {
        if io.no_value_writes {
            return Ok(false);
        }
        self.device().bind()?;
        let api = self.device().api();
        // SAFETY: the caller's guarantee.
        let r = unsafe {
            match words {
                [(dst, value)] => api.write_value32_async(*dst, *value, self.handle()),
                _ => api.write_values32_async(words, self.handle()),
            }
        };
        match r {
            Ok(()) => {
                io.queued += words.len() as u64;
                Ok(true)
            }
            Err(e) => {
                tracing::debug!("stream value writes unavailable ({e}); staged copies");
                io.no_value_writes = true;
                Ok(false)
            }
        }
    }

    /// Writes queued through the pinned ring so far (the others took the blocking path).
    pub fn queued_writes(&self) -> u64 {
        self.host_io.lock().queued
    }

    /// Bytes of the pinned read buffer (0 before the first staged read).
    pub fn read_buffer_bytes(&self) -> usize {
        self.host_io.lock().read.as_ref().map_or(0, |b| b.len())
    }
}

/// Makes `buf` the stream's read buffer again, unless a read that ran meanwhile left a larger
/// one there (then `buf` is freed: idle, no copy runs into it).
fn put_read_buffer(io: &mut HostIo, buf: PinnedHostBuffer<u8>) {
    if io.read.as_ref().is_none_or(|b| b.len() < buf.len()) {
        io.read = Some(buf);
    }
}
