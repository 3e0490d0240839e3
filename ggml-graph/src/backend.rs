//! Backend traits in ggml's split (buffer type / buffer / stream / device), with the CPU device
//! and a dummy device that records allocations and launches without computing.
//!
//! The [`crate::sched::Scheduler`] runs one graph over several devices through these traits:
//! each node goes to the first device whose [`Device::supports_op`] accepts it, and tensors that
//! cross devices are copied through [`Buffer::read`]/[`Buffer::write`]. A GPU backend implements
//! the same four traits.

use std::any::Any;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::cpu::{self, CpuBackend, SrcView};
use crate::error::{GraphError, Result};
use crate::exec::{lines, with_io, Lines, Loc, WeightBytes};
use crate::tensor::{Op, Tensor};

/// Allocates buffers of one kind of memory.
pub trait BufferType: Send + Sync {
    /// Name for logs.
    fn name(&self) -> &str;
    /// Alignment of every allocation, in bytes.
    fn alignment(&self) -> usize;
    /// A zeroed buffer of `size` bytes.
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>>;
    /// True when buffers are host memory.
    fn is_host(&self) -> bool;
    /// A zeroed buffer of `size` bytes in host memory that this device's kernels write in
    /// place, read by the host with no transfer after the kernel (for small results read after
    /// every run, such as a decode step's logits); `None` (the default) where the device has
    /// no such memory or its buffers are host memory already.
    fn alloc_mapped(&self, size: usize) -> Result<Option<Box<dyn Buffer>>> {
        let _ = size;
        Ok(None)
    }
    /// One buffer per tensor holding a copy of `tensors` (weights, uploaded once). The default
    /// makes one allocation per tensor; a device buffer type overrides it to carve every tensor
    /// out of a few large allocations. `progress(bytes)` reports the bytes copied so far.
    fn alloc_weights(
        &self,
        tensors: &[&[u8]],
        progress: &mut dyn FnMut(u64),
    ) -> Result<Vec<Box<dyn Buffer>>> {
        let mut done = 0u64;
        tensors
            .iter()
            .map(|t| {
                let b = self.alloc(t.len())?;
                b.write(0, t)?;
                done += t.len() as u64;
                progress(done);
                Ok(b)
            })
            .collect()
    }
    /// Zeroed buffers of `sizes` that live and die together (a KV cache's layers). The default
    /// makes one allocation each; a device buffer type overrides it to carve them out of one
    /// allocation, since a driver rounds every allocation up to its granularity (2 MiB on
    /// NVIDIA) and a size of whole granules plus the tail slack wastes almost one granule.
    fn alloc_many(&self, sizes: &[usize]) -> Result<Vec<Box<dyn Buffer>>> {
        sizes.iter().map(|&s| self.alloc(s)).collect()
    }
    /// One buffer per tensor that reads `tensors` where they are (e.g. in the mapped model
    /// file), for a device that computes on host memory; `None` (the default) when the device
    /// needs its own copies through [`BufferType::alloc_weights`].
    fn bind_weights(&self, tensors: &[WeightBytes]) -> Option<Vec<Box<dyn Buffer>>> {
        let _ = tensors;
        None
    }
}

/// One allocation.
pub trait Buffer: Send + Sync {
    /// Bytes.
    fn size(&self) -> usize;
    /// Copies `data` in at `offset`.
    fn write(&self, offset: usize, data: &[u8]) -> Result<()>;
    /// Copies each `(offset, data)` in, in order (a run's inputs); a device buffer may queue
    /// them together.
    fn write_batch(&self, writes: &[(usize, &[u8])]) -> Result<()> {
        writes
            .iter()
            .try_for_each(|&(offset, data)| self.write(offset, data))
    }
    /// Copies `out.len()` bytes out from `offset`.
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()>;
    /// Hands `f` the `len` bytes at `offset`, without a copy where the buffer can show them in
    /// place (host memory; a device's pinned read buffer), else read into a vector first.
    fn read_with(&self, offset: usize, len: usize, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        let mut v = vec![0u8; len];
        self.read(offset, &mut v)?;
        f(&v);
        Ok(())
    }
    /// Copies `len` bytes of `src` from `src_offset` to `offset` in this buffer directly (GPU to
    /// GPU over the peer link, host memory to host memory) and waits for the copy; `Ok(false)`
    /// (the default) when the two buffers cannot, and the caller stages the bytes through
    /// [`Buffer::read`] and [`Buffer::write`]. The caller has waited for the work that wrote the
    /// source.
    fn copy_from(
        &self,
        offset: usize,
        src: &dyn Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<bool> {
        let _ = (offset, src, src_offset, len);
        Ok(false)
    }
    /// For downcasting by the device that made the buffer.
    fn as_any(&self) -> &dyn Any;
}

/// An ordered queue of work on a device.
pub trait Stream: Send + Sync {
    /// Waits until everything queued has finished.
    fn synchronize(&self) -> Result<()>;
}

/// One node of a [`Device::launch_group`] call: what [`Device::launch`] would take for it.
pub struct GroupNode<'a> {
    /// The node.
    pub tensor: &'a Tensor,
    /// Its destination.
    pub dst: TensorMem<'a>,
    /// Its read operands, in source order.
    pub srcs: Vec<TensorMem<'a>>,
}

/// An operand of a launch: its descriptor, a buffer of the device running the op and the byte
/// offset of its first byte.
#[derive(Clone, Copy)]
pub struct TensorMem<'a> {
    /// Shape, strides and type.
    pub tensor: &'a Tensor,
    /// The buffer.
    pub buffer: &'a dyn Buffer,
    /// Byte offset of the tensor's first byte.
    pub offset: usize,
}

/// Launches recorded by [`Device::begin_capture`] .. [`Device::end_capture`], replayable as a
/// whole (a GPU graph). It reads and writes the same memory as the recorded launches, so its
/// owner drops it before any of those buffers is freed or reallocated.
pub trait Captured: Send {
    /// Queues the recorded launches again on the device's stream.
    fn replay(&self) -> Result<()>;
}

/// A collective library over several of a scheduler's devices (NCCL or RCCL over GPUs): what
/// runs an [`crate::Op::AllReduce`] whose operands live on different devices without copying
/// them to one device.
pub trait Collective: Send + Sync {
    /// Name for logs and the device plan (`NCCL 2.28.9`).
    fn name(&self) -> &str;
    /// True when `devices` (indices into the scheduler's devices, ascending) are exactly its
    /// ranks' devices: every rank must join each collective, or the ones that did wait forever.
    fn spans(&self, devices: &[usize]) -> bool;
    /// Queues an in-place sum of `parts` (one per device, `(device index, dense f32 memory of
    /// that device)`, all of one length), each on its device's stream, so that every part holds
    /// the sum; returns without waiting for it.
    fn all_reduce(&self, parts: &[(usize, TensorMem<'_>)]) -> Result<()>;
    /// Told after a run's streams were waited for: every collective it queued has finished
    /// (what a watchdog times in-flight collectives by).
    fn settled(&self) {}
    /// True when its all-reduces may be recorded in a device's graph capture and replayed: each
    /// run queues one part, on one device, with no host wait (a rank whose other ranks run
    /// elsewhere).
    fn capturable(&self) -> bool {
        false
    }
    /// Told when a replayed capture queued its collectives again (until [`Collective::settled`]);
    /// an error when the collective failed (the replay queued its collectives all the same).
    fn replayed(&self) -> Result<()> {
        Ok(())
    }
    /// An error once the collective failed (a rank gone, a watchdog's abort): results read
    /// since may hold sums that never happened.
    fn status(&self) -> Result<()> {
        Ok(())
    }
}

/// A compute device.
pub trait Device: Send + Sync {
    /// Name for logs and errors.
    fn name(&self) -> &str;
    /// The memory this device computes on.
    fn buffer_type(&self) -> &dyn BufferType;
    /// True when the device can run `t` (with operands `srcs`).
    fn supports_op(&self, t: &Tensor, srcs: &[&Tensor]) -> bool;
    /// A new stream.
    fn new_stream(&self) -> Result<Box<dyn Stream>>;
    /// Queues node `t` on `stream`: writes `dst`, reads `srcs` (in the node's source order, minus
    /// the written destination of `cpy`/`set_rows`). All buffers come from this device's type.
    fn launch(
        &self,
        stream: &dyn Stream,
        t: &Tensor,
        dst: TensorMem<'_>,
        srcs: &[TensorMem<'_>],
    ) -> Result<()>;
    /// Queues the longest leading run of `group` (consecutive scheduled nodes of one kind:
    /// `mul_mat`s reading the same activations, ropes of the same positions and parameters, or
    /// `set_rows` of the same indices; each as [`Device::launch`] takes it) that the device
    /// computes in one launch, and returns its length; 0 (nothing queued) when it groups fewer
    /// than two of them.
    fn launch_group(&self, _stream: &dyn Stream, _group: &[GroupNode<'_>]) -> Result<usize> {
        Ok(0)
    }
    /// Starts recording the launches queued from now on instead of running them; `false` when
    /// the device cannot record (then launches run as usual). Nothing may synchronize or
    /// allocate until [`Device::end_capture`].
    fn begin_capture(&self) -> Result<bool> {
        Ok(false)
    }
    /// Ends the recording begun by [`Device::begin_capture`]; the recorded launches have not
    /// run yet (replay them once for this run's results).
    fn end_capture(&self) -> Result<Box<dyn Captured>> {
        Err(crate::error::GraphError::Unsupported {
            backend: "device",
            op: "capture",
            detail: format!("{} records no launches", self.name()),
        })
    }
}

fn out_of_range(what: &str, offset: usize, len: usize, size: usize) -> GraphError {
    GraphError::Unsupported {
        backend: "buffer",
        op: "copy",
        detail: format!("{what} {offset}+{len} beyond {size} bytes"),
    }
}

/// Host memory, 64-byte aligned.
pub struct HostBuffer {
    data: Mutex<Lines>,
    size: usize,
}

impl Buffer for HostBuffer {
    fn size(&self) -> usize {
        self.size
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let mut g = self.data.lock();
        let bytes = g.bytes_mut();
        let end = offset.checked_add(data.len()).filter(|&e| e <= self.size);
        let end = end.ok_or_else(|| out_of_range("write", offset, data.len(), self.size))?;
        bytes[offset..end].copy_from_slice(data);
        Ok(())
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let g = self.data.lock();
        let bytes = g.bytes();
        let end = offset.checked_add(out.len()).filter(|&e| e <= self.size);
        let end = end.ok_or_else(|| out_of_range("read", offset, out.len(), self.size))?;
        out.copy_from_slice(&bytes[offset..end]);
        Ok(())
    }
    fn read_with(&self, offset: usize, len: usize, f: &mut dyn FnMut(&[u8])) -> Result<()> {
        let g = self.data.lock();
        let bytes = g.bytes();
        let end = offset.checked_add(len).filter(|&e| e <= self.size);
        let end = end.ok_or_else(|| out_of_range("read", offset, len, self.size))?;
        f(&bytes[offset..end]);
        Ok(())
    }
    fn copy_from(
        &self,
        offset: usize,
        src: &dyn Buffer,
        src_offset: usize,
        len: usize,
    ) -> Result<bool> {
        let Some(src) = src.as_any().downcast_ref::<HostBuffer>() else {
            return Ok(false);
        };
        let src_end = src_offset.checked_add(len).filter(|&e| e <= src.size);
        let src_end = src_end.ok_or_else(|| out_of_range("read", src_offset, len, src.size))?;
        let end = offset.checked_add(len).filter(|&e| e <= self.size);
        let end = end.ok_or_else(|| out_of_range("write", offset, len, self.size))?;
        if std::ptr::eq(self, src) {
            self.data
                .lock()
                .bytes_mut()
                .copy_within(src_offset..src_end, offset);
            return Ok(true);
        }
        let from = src.data.lock();
        let mut to = self.data.lock();
        to.bytes_mut()[offset..end].copy_from_slice(&from.bytes()[src_offset..src_end]);
        Ok(true)
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Weight bytes bound where they live (a mapped file, a shared vector): read-only, no copy.
pub struct WeightBuffer {
    bytes: WeightBytes,
}

impl Buffer for WeightBuffer {
    fn size(&self) -> usize {
        self.bytes.bytes().len()
    }
    fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        Err(GraphError::Unsupported {
            backend: "host",
            op: "write",
            detail: format!(
                "{} bytes at {offset} into read-only weight bytes (bound, not copied)",
                data.len()
            ),
        })
    }
    fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let bytes = self.bytes.bytes();
        let end = offset.checked_add(out.len()).filter(|&e| e <= bytes.len());
        let end = end.ok_or_else(|| out_of_range("read", offset, out.len(), bytes.len()))?;
        out.copy_from_slice(&bytes[offset..end]);
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Host memory buffer type.
pub struct HostBufferType;

impl BufferType for HostBufferType {
    fn name(&self) -> &str {
        "host"
    }
    fn alignment(&self) -> usize {
        64
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        Ok(Box::new(HostBuffer {
            data: Mutex::new(lines(size, "a host buffer")?),
            size,
        }))
    }
    fn is_host(&self) -> bool {
        true
    }
    fn bind_weights(&self, tensors: &[WeightBytes]) -> Option<Vec<Box<dyn Buffer>>> {
        Some(
            tensors
                .iter()
                .map(|b| Box::new(WeightBuffer { bytes: b.clone() }) as Box<dyn Buffer>)
                .collect(),
        )
    }
}

/// The CPU stream runs work at launch, so there is nothing to wait for.
pub struct ImmediateStream;

impl Stream for ImmediateStream {
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

/// The CPU backend as a [`Device`].
pub struct CpuDevice {
    backend: Arc<CpuBackend>,
}

impl CpuDevice {
    /// Wraps a CPU backend.
    pub fn new(backend: Arc<CpuBackend>) -> Self {
        Self { backend }
    }
}

fn host(b: &dyn Buffer) -> Result<&HostBuffer> {
    b.as_any()
        .downcast_ref::<HostBuffer>()
        .ok_or_else(|| GraphError::Unsupported {
            backend: "cpu",
            op: "launch",
            detail: "buffer was not allocated by the host buffer type".into(),
        })
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        "cpu"
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &HostBufferType
    }
    fn supports_op(&self, t: &Tensor, srcs: &[&Tensor]) -> bool {
        self.backend.supports(t, srcs)
    }
    fn new_stream(&self) -> Result<Box<dyn Stream>> {
        Ok(Box::new(ImmediateStream))
    }
    fn launch(
        &self,
        _stream: &dyn Stream,
        t: &Tensor,
        dst: TensorMem<'_>,
        srcs: &[TensorMem<'_>],
    ) -> Result<()> {
        // Lock each distinct buffer once; operands in the same buffer share its guard. Bound
        // weights are read where they are.
        let mut distinct: Vec<&HostBuffer> = vec![host(dst.buffer)?];
        let mut weights: Vec<&[u8]> = Vec::new();
        let mut locs = Vec::with_capacity(srcs.len());
        for m in srcs {
            if let Some(w) = m.buffer.as_any().downcast_ref::<WeightBuffer>() {
                locs.push(Loc::Weight {
                    idx: weights.len(),
                    off: m.offset,
                });
                weights.push(w.bytes.bytes());
                continue;
            }
            let h = host(m.buffer)?;
            let pool = match distinct.iter().position(|d| std::ptr::eq(*d, h)) {
                Some(p) => p,
                None => {
                    distinct.push(h);
                    distinct.len() - 1
                }
            };
            locs.push(Loc::Pool {
                pool,
                off: m.offset,
            });
        }
        let mut guards: Vec<_> = distinct.iter().map(|h| h.data.lock()).collect();
        let pairs: Vec<(&Tensor, Loc)> = srcs.iter().map(|m| m.tensor).zip(locs).collect();
        let be = &self.backend;
        with_io(
            crate::plan::in_place_op(&t.op),
            &mut guards,
            &weights,
            (0, dst.offset),
            t.extent(),
            &pairs,
            |out, views: &[SrcView<'_>]| be.install(|| cpu::compute(be, t, out, views)),
        )
    }
}

/// What the dummy device saw.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DummyLog {
    /// Sizes of the buffers allocated.
    pub allocs: Vec<usize>,
    /// Names of the ops launched, in order.
    pub launches: Vec<&'static str>,
}

/// A device that allocates host memory, records allocations and launches, and computes nothing;
/// for scheduler and planner logic tests.
pub struct DummyDevice {
    name: String,
    supported: Box<dyn Fn(&Tensor) -> bool + Send + Sync>,
    log: Arc<Mutex<DummyLog>>,
    bt: DummyBufferType,
}

struct DummyBufferType {
    log: Arc<Mutex<DummyLog>>,
}

impl BufferType for DummyBufferType {
    fn name(&self) -> &str {
        "dummy"
    }
    fn alignment(&self) -> usize {
        64
    }
    fn alloc(&self, size: usize) -> Result<Box<dyn Buffer>> {
        self.log.lock().allocs.push(size);
        HostBufferType.alloc(size)
    }
    fn is_host(&self) -> bool {
        false
    }
}

impl DummyDevice {
    /// A dummy device accepting the nodes for which `supported` is true.
    pub fn new(name: &str, supported: impl Fn(&Tensor) -> bool + Send + Sync + 'static) -> Self {
        let log = Arc::new(Mutex::new(DummyLog::default()));
        Self {
            name: name.to_string(),
            supported: Box::new(supported),
            bt: DummyBufferType { log: log.clone() },
            log,
        }
    }

    /// A copy of the log so far.
    pub fn log(&self) -> DummyLog {
        self.log.lock().clone()
    }
}

impl Device for DummyDevice {
    fn name(&self) -> &str {
        &self.name
    }
    fn buffer_type(&self) -> &dyn BufferType {
        &self.bt
    }
    fn supports_op(&self, t: &Tensor, _srcs: &[&Tensor]) -> bool {
        !matches!(t.op, Op::Leaf(_)) && (self.supported)(t)
    }
    fn new_stream(&self) -> Result<Box<dyn Stream>> {
        Ok(Box::new(ImmediateStream))
    }
    fn launch(
        &self,
        _stream: &dyn Stream,
        t: &Tensor,
        _dst: TensorMem<'_>,
        _srcs: &[TensorMem<'_>],
    ) -> Result<()> {
        self.log.lock().launches.push(t.op.name());
        Ok(())
    }
}
