//! Collective communication between devices: a [`Communicator`] is one rank of an NCCL/RCCL
//! communicator, bound to one device, whose collectives are queued on that device's streams.
//!
//! One process driving all its GPUs makes every rank at once with [`Communicator::init_all`] and
//! issues a collective for all ranks inside [`grouped`]; a process per GPU makes its rank with
//! [`Communicator::init_rank`] from a [`UniqueId`] that rank 0 made and handed over.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytemuck::Pod;
use hip_ffi::nccl::CommHandle;
use hip_ffi::{CollType, Nccl, NcclOptions, ReduceOp, UniqueId};

use crate::buffer::{DeviceView, DeviceViewMut};
use crate::device::Device;
use crate::error::{GpuError, Result};
use crate::stream::Stream;

/// Element types collectives carry.
pub trait CollElem: Pod {
    /// The library's type code.
    const TYPE: CollType;
}

impl CollElem for f32 {
    const TYPE: CollType = CollType::F32;
}
impl CollElem for half::f16 {
    const TYPE: CollType = CollType::F16;
}
impl CollElem for half::bf16 {
    const TYPE: CollType = CollType::BF16;
}
impl CollElem for i32 {
    const TYPE: CollType = CollType::I32;
}
impl CollElem for u8 {
    const TYPE: CollType = CollType::U8;
}

/// Loads the collective library of `device`'s platform.
pub fn load_library(device: &Device, opts: &NcclOptions) -> Result<Arc<Nccl>> {
    Ok(Arc::new(Nccl::load(device.info().platform, opts)?))
}

/// Runs `issue` between a group start and end, so that the collectives it queues for several
/// ranks from this one thread are issued together (required when one thread drives several
/// ranks: a lone collective would wait for the others forever).
pub fn grouped<R>(nccl: &Nccl, issue: impl FnOnce() -> Result<R>) -> Result<R> {
    nccl.group_start()?;
    let r = issue();
    let end = nccl.group_end();
    // The library may leave another device current after launching on each rank's.
    let rebind = hip_ffi::runtime().and_then(|api| api.rebind_current());
    let v = r?;
    end?;
    rebind?;
    Ok(v)
}

/// A view's device, address and bytes, as [`Communicator`]'s checks take them.
fn mem_of(
    device: &Device,
    ptr: hip_ffi::DevicePtr,
    len: usize,
    elem: usize,
) -> (&Device, u64, usize) {
    (device, ptr.0, len.saturating_mul(elem))
}

/// One rank of a communicator, on one device; destroyed on drop.
pub struct Communicator {
    nccl: Arc<Nccl>,
    comm: CommHandle,
    device: Device,
    rank: usize,
    ranks: usize,
    /// Set by [`Communicator::abort`] or [`Communicator::abort_shared`]: the handle is gone.
    aborted: AtomicBool,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("device", &self.device.ordinal())
            .field("rank", &self.rank)
            .field("ranks", &self.ranks)
            .finish()
    }
}

impl Communicator {
    /// One communicator over `devices` (rank `i` on `devices[i]`), all driven by this process.
    pub fn init_all(nccl: &Arc<Nccl>, devices: &[Device]) -> Result<Vec<Communicator>> {
        let ordinals: Vec<i32> = devices.iter().map(Device::ordinal).collect();
        let mut seen = ordinals.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != ordinals.len() || ordinals.is_empty() {
            return Err(GpuError::InvalidArgument(format!(
                "a communicator needs distinct devices, got {ordinals:?}"
            )));
        }
        let comms = nccl.comm_init_all(&ordinals);
        // The library sets each device current in turn while it builds the ranks.
        devices[0].api().rebind_current()?;
        let comms = comms?;
        Ok(comms
            .into_iter()
            .zip(devices)
            .enumerate()
            .map(|(rank, (comm, d))| Communicator {
                nccl: Arc::clone(nccl),
                comm,
                device: d.clone(),
                rank,
                ranks: ordinals.len(),
                aborted: AtomicBool::new(false),
            })
            .collect())
    }

    /// Rank `rank` of `ranks` of the communicator of `id`, on `device`; blocks until every rank
    /// joined (one thread or process per rank).
    pub fn init_rank(
        nccl: &Arc<Nccl>,
        device: &Device,
        id: &UniqueId,
        rank: usize,
        ranks: usize,
    ) -> Result<Communicator> {
        if rank >= ranks {
            return Err(GpuError::InvalidArgument(format!(
                "rank {rank} of a communicator of {ranks}"
            )));
        }
        device.bind()?;
        // SAFETY: the device this rank drives was just made current.
        let comm = unsafe { nccl.comm_init_rank(ranks, id, rank) };
        device.api().rebind_current()?;
        let comm = comm?;
        Ok(Communicator {
            nccl: Arc::clone(nccl),
            comm,
            device: device.clone(),
            rank,
            ranks,
            aborted: AtomicBool::new(false),
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the communicator.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// The device of this rank.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The library.
    pub fn library(&self) -> &Arc<Nccl> {
        &self.nccl
    }

    /// Checks `stream` and the buffers (`(device, address, bytes)`) against this rank's device
    /// and makes it current. A capture under way records the buffers: the library's own memory
    /// lives as long as the communicator, which a captured graph must not outlive.
    fn on_my_device(&self, stream: &Stream, views: &[(&Device, u64, usize)]) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Err(GpuError::InvalidArgument(format!(
                "rank {} of {}: the communicator was aborted",
                self.rank, self.ranks
            )));
        }
        self.device
            .expect_same(stream.device(), "collective stream")?;
        for (d, _, _) in views {
            self.device.expect_same(d, "collective buffer")?;
        }
        stream.note_use(views.iter().map(|&(_, a, n)| (a, n as u64)));
        self.device.bind()?;
        // A collective issued outside a group may run on a device the library switched to.
        Ok(self.device.api().rebind_current()?)
    }

    /// Queues an in-place all-reduce of `buf` on `stream` (every rank queues one of the same
    /// length; one thread driving several ranks wraps them in [`grouped`]).
    pub fn all_reduce_in_place<T: CollElem>(
        &self,
        buf: &mut DeviceViewMut<'_, T>,
        op: ReduceOp,
        stream: &Stream,
    ) -> Result<()> {
        self.on_my_device(
            stream,
            &[mem_of(buf.device, buf.ptr, buf.len, size_of::<T>())],
        )?;
        // SAFETY: `buf` is a checked view of this rank's device, borrowed exclusively for the
        // call; the stream is this device's.
        Ok(unsafe {
            self.nccl.all_reduce(
                buf.ptr,
                buf.ptr,
                buf.len,
                T::TYPE,
                op,
                self.comm,
                stream.handle(),
            )
        }?)
    }

    /// Queues an all-gather: `recv` (`ranks * send.len()` elements) receives every rank's
    /// `send` in rank order.
    pub fn all_gather<T: CollElem>(
        &self,
        send: &DeviceView<'_, T>,
        recv: &mut DeviceViewMut<'_, T>,
        stream: &Stream,
    ) -> Result<()> {
        self.on_my_device(
            stream,
            &[
                mem_of(send.device, send.ptr, send.len, size_of::<T>()),
                mem_of(recv.device, recv.ptr, recv.len, size_of::<T>()),
            ],
        )?;
        let want = send.len.checked_mul(self.ranks).ok_or_else(|| {
            GpuError::InvalidArgument(format!("{} x {} elements overflow", send.len, self.ranks))
        })?;
        if recv.len != want {
            return Err(GpuError::LengthMismatch {
                src: want,
                dst: recv.len,
            });
        }
        // SAFETY: checked views of this device with the sizes the call needs; `send` is borrowed
        // shared and `recv` exclusively, so they do not overlap.
        Ok(unsafe {
            self.nccl.all_gather(
                send.ptr,
                recv.ptr,
                send.len,
                T::TYPE,
                self.comm,
                stream.handle(),
            )
        }?)
    }

    /// Queues a send of `buf` to rank `peer`, which queues the matching [`Communicator::recv`].
    pub fn send<T: CollElem>(
        &self,
        buf: &DeviceView<'_, T>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_peer(peer)?;
        self.on_my_device(
            stream,
            &[mem_of(buf.device, buf.ptr, buf.len, size_of::<T>())],
        )?;
        // SAFETY: a checked view of this device; the stream is this device's.
        Ok(unsafe {
            self.nccl
                .send(buf.ptr, buf.len, T::TYPE, peer, self.comm, stream.handle())
        }?)
    }

    /// Queues a receive into `buf` from rank `peer`.
    pub fn recv<T: CollElem>(
        &self,
        buf: &mut DeviceViewMut<'_, T>,
        peer: usize,
        stream: &Stream,
    ) -> Result<()> {
        self.check_peer(peer)?;
        self.on_my_device(
            stream,
            &[mem_of(buf.device, buf.ptr, buf.len, size_of::<T>())],
        )?;
        // SAFETY: a checked view of this device, borrowed exclusively; the stream is this
        // device's.
        Ok(unsafe {
            self.nccl
                .recv(buf.ptr, buf.len, T::TYPE, peer, self.comm, stream.handle())
        }?)
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer >= self.ranks || peer == self.rank {
            return Err(GpuError::InvalidArgument(format!(
                "peer rank {peer} from rank {} of {}",
                self.rank, self.ranks
            )));
        }
        Ok(())
    }

    /// `Err` when the communicator has failed asynchronously (a peer died, a network error).
    pub fn check(&self) -> Result<()> {
        if self.aborted.load(Ordering::Acquire) {
            return Ok(());
        }
        // SAFETY: the handle is live while `self` is (and not aborted).
        Ok(unsafe { self.nccl.comm_async_error(self.comm) }?)
    }

    /// Tears the communicator down at once, cancelling pending collectives (after a peer
    /// failed: a plain destroy could wait for it forever).
    pub fn abort(self) -> Result<()> {
        self.abort_shared()
    }

    /// [`Communicator::abort`] from another thread than the one waiting on the collectives (a
    /// watchdog): later calls fail; only the first call aborts.
    pub fn abort_shared(&self) -> Result<()> {
        if self.aborted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        self.device.bind()?;
        // SAFETY: the handle is live and aborted once (the flag); Drop skips aborted handles.
        Ok(unsafe { self.nccl.comm_abort(self.comm) }?)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if *self.aborted.get_mut() {
            return;
        }
        let r = self
            .device
            .bind()
            .map_err(|e| e.to_string())
            .and_then(|()| {
                // SAFETY: the handle is live and dropped with `self`.
                unsafe { self.nccl.comm_destroy(self.comm) }.map_err(|e| e.to_string())
            });
        if let Err(e) = r {
            self.device.record_error("ncclCommDestroy", e);
        }
    }
}
