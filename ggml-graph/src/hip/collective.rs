//! The HIP backend's [`Collective`]: one NCCL/RCCL communicator with a rank on each GPU of a
//! scheduler, all driven by this process, its all-reduces queued on the GPUs' own streams.
//! Where every rank is in this process, small all-reduces take the one-shot peer all-reduce
//! instead ([`super::peer_reduce`], as [`AllReduceKind`] says).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use gpu_mem::{Communicator, NcclOptions, ReduceOp};
use hip_ffi::nccl::UNIQUE_ID_BYTES;

use crate::hip_options::{AllReduceKind, CollectiveOptions};

use super::peer_reduce::{self, PeerReduce};
use super::{addr, gpu_err, HipDevice};
use crate::backend::{Collective, TensorMem};
use crate::error::Result;

/// A communicator over several GPUs of one process (see [`Collective`]).
pub struct HipCollective {
    /// Per rank: the scheduler's index of its device, and the device.
    ranks: Vec<(usize, Arc<HipDevice>)>,
    comms: Vec<Communicator>,
    /// Per rank, its peer all-reduce (empty: every message goes through the library).
    peer: Vec<PeerReduce>,
    name: String,
    /// When the oldest collective not yet known finished was queued.
    in_flight: Mutex<Option<Instant>>,
    /// Why a watchdog aborted the communicator.
    aborted: Mutex<Option<String>>,
}

impl std::fmt::Debug for HipCollective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HipCollective")
            .field("name", &self.name)
            .field("ranks", &self.ranks.len())
            .finish()
    }
}

impl HipCollective {
    /// Loads the platform's collective library and makes one rank per GPU of `gpus` (each
    /// `(index in the scheduler's devices, device)`, ascending indices, distinct GPUs).
    pub fn new(gpus: &[(usize, Arc<HipDevice>)], opts: &CollectiveOptions) -> Result<Self> {
        let first = gpus
            .first()
            .ok_or_else(|| gpu_err("collective", "no GPUs"))?;
        if gpus.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(gpu_err("collective", "device indices must ascend"));
        }
        let nccl = load(&first.1, opts)?;
        let devices: Vec<gpu_mem::Device> = gpus.iter().map(|(_, h)| h.gpu().clone()).collect();
        let comms =
            Communicator::init_all(&nccl, &devices).map_err(|e| gpu_err("collective", e))?;
        let hips: Vec<Arc<HipDevice>> = gpus.iter().map(|(_, h)| h.clone()).collect();
        let peer = peer_ranks(&hips, opts.all_reduce)?;
        let name = named(describe(&nccl)?, !peer.is_empty());
        Ok(Self {
            ranks: gpus.to_vec(),
            comms,
            peer,
            name,
            in_flight: Mutex::new(None),
            aborted: Mutex::new(None),
        })
    }

    /// One communicator over `gpus`, made in this process, as one collective per rank: rank
    /// `k` on `gpus[k]`, which is device 0 of the scheduler that rank `k` gets (each rank's
    /// scheduler and thread drive their own GPU, as processes of a `for_rank` split would).
    pub fn per_rank(gpus: &[Arc<HipDevice>], opts: &CollectiveOptions) -> Result<Vec<Self>> {
        let first = gpus
            .first()
            .ok_or_else(|| gpu_err("collective", "no GPUs"))?;
        let nccl = load(first, opts)?;
        let devices: Vec<gpu_mem::Device> = gpus.iter().map(|h| h.gpu().clone()).collect();
        let comms =
            Communicator::init_all(&nccl, &devices).map_err(|e| gpu_err("collective", e))?;
        let peer = peer_ranks(gpus, opts.all_reduce)?;
        let kind = named(describe(&nccl)?, !peer.is_empty());
        let world = gpus.len();
        let mut peer = peer.into_iter();
        Ok(comms
            .into_iter()
            .zip(gpus)
            .enumerate()
            .map(|(rank, (comm, gpu))| Self {
                ranks: vec![(0, gpu.clone())],
                comms: vec![comm],
                peer: peer.next().into_iter().collect(),
                name: format!("{kind} rank {rank} of {world}"),
                in_flight: Mutex::new(None),
                aborted: Mutex::new(None),
            })
            .collect())
    }

    /// Rank `rank` of `world` on `gpu` (`(index in the scheduler's devices, device)`), the other
    /// ranks in other processes: rank 0 makes the communicator's id and hands it to
    /// `exchange`, which returns it on every rank (the others pass an empty slice and get rank
    /// 0's bytes); blocks until every rank joined.
    pub fn for_rank(
        gpu: (usize, Arc<HipDevice>),
        rank: usize,
        world: usize,
        opts: &CollectiveOptions,
        exchange: &mut crate::hip_options::IdExchange<'_>,
    ) -> Result<Self> {
        let nccl = load(&gpu.1, opts)?;
        let mine = if rank == 0 {
            nccl.unique_id()
                .map_err(|e| gpu_err("collective", e))?
                .0
                .to_vec()
        } else {
            Vec::new()
        };
        let got = exchange(&mine).map_err(|e| gpu_err("collective", e))?;
        let id = hip_ffi::UniqueId(got.as_slice().try_into().map_err(|_| {
            gpu_err(
                "collective",
                format!(
                    "a unique id of {} bytes, {UNIQUE_ID_BYTES} expected",
                    got.len()
                ),
            )
        })?);
        let comm = Communicator::init_rank(&nccl, gpu.1.gpu(), &id, rank, world)
            .map_err(|e| gpu_err("collective", e))?;
        let name = format!("{} rank {rank} of {world}", describe(&nccl)?);
        Ok(Self {
            ranks: vec![gpu],
            comms: vec![comm],
            peer: Vec::new(),
            name,
            in_flight: Mutex::new(None),
            aborted: Mutex::new(None),
        })
    }

    /// Fails with the first asynchronous error of a rank (a peer gone, a network error), or
    /// why the communicator was aborted.
    pub fn check(&self) -> Result<()> {
        if let Some(why) = self.aborted.lock().as_ref() {
            return Err(gpu_err("collective", why.clone()));
        }
        for c in &self.comms {
            c.check().map_err(|e| gpu_err("collective", e))?;
        }
        for p in &self.peer {
            if let Some(why) = p.failure()? {
                return Err(gpu_err("collective", why));
            }
        }
        Ok(())
    }

    /// Aborts every rank (pending collectives end, later ones fail) for `why`, once.
    pub fn abort(&self, why: String) {
        let mut a = self.aborted.lock();
        if a.is_some() {
            return;
        }
        tracing::error!("{}: aborted: {why}", self.name);
        for c in &self.comms {
            if let Err(e) = c.abort_shared() {
                tracing::warn!("{}: abort: {e}", self.name);
            }
        }
        *a = Some(why);
    }

    /// Starts a thread that polls the ranks' asynchronous errors and aborts the communicator
    /// on one, or when a collective has been in flight for longer than `timeout` (a peer that
    /// died without the library noticing), so the thread waiting on the collective gets an
    /// error instead of hanging. The thread ends with the collective.
    pub fn watch(self: &Arc<Self>, timeout: Duration) {
        let weak: Weak<Self> = Arc::downgrade(self);
        let spawned = std::thread::Builder::new()
            .name("collective-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(100));
                let Some(c) = weak.upgrade() else {
                    return;
                };
                if c.aborted.lock().is_some() {
                    return;
                }
                let late = (*c.in_flight.lock()).filter(|t| t.elapsed() > timeout);
                if let Err(e) = c.check() {
                    c.abort(format!("{e}"));
                } else if let Some(t) = late {
                    c.abort(format!(
                        "a collective has not finished after {:.0?} (a rank died or hangs)",
                        t.elapsed()
                    ));
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("{}: no watchdog thread: {e}", self.name);
        }
    }
}

/// The peer all-reduce's ranks over `gpus` as `kind` asks: none for [`AllReduceKind::Nccl`] or
/// where it cannot work under [`AllReduceKind::Auto`] (logged), an error under
/// [`AllReduceKind::Peer`].
fn peer_ranks(gpus: &[Arc<HipDevice>], kind: AllReduceKind) -> Result<Vec<PeerReduce>> {
    match kind {
        AllReduceKind::Nccl => Ok(Vec::new()),
        AllReduceKind::Peer => PeerReduce::all(gpus, peer_reduce::TIMEOUT),
        AllReduceKind::Auto => Ok(PeerReduce::all(gpus, peer_reduce::TIMEOUT).unwrap_or_else(
            |e| {
                tracing::debug!(
                    "collective: no peer all-reduce ({e}); the library takes every size"
                );
                Vec::new()
            },
        )),
    }
}

/// The collective's name: the library's, after `peer/` where small messages take the peer
/// all-reduce (up to [`peer_reduce::PEER_MAX_BYTES`]).
fn named(library: String, peer: bool) -> String {
    if peer {
        format!("peer/{library}")
    } else {
        library
    }
}

/// The collective library of `gpu`'s platform, found as `opts` says.
fn load(gpu: &HipDevice, opts: &CollectiveOptions) -> Result<Arc<hip_ffi::Nccl>> {
    let opts = NcclOptions {
        library: opts.library.clone(),
        dirs: hip_ffi::InstallDirs {
            rocm: opts.rocm.clone(),
            cuda: opts.cuda.clone(),
        },
        skip_python: false,
    };
    gpu_mem::comm::load_library(gpu.gpu(), &opts).map_err(|e| gpu_err("collective", e))
}

/// `NCCL 2.28.9` or `RCCL ...`.
fn describe(nccl: &hip_ffi::Nccl) -> Result<String> {
    let version = nccl
        .version_string()
        .map_err(|e| gpu_err("collective", e))?;
    let kind = match nccl.platform() {
        gpu_mem::Platform::Amd => "RCCL",
        _ => "NCCL",
    };
    Ok(format!("{kind} {version}"))
}

impl Collective for HipCollective {
    fn name(&self) -> &str {
        &self.name
    }

    fn spans(&self, devices: &[usize]) -> bool {
        devices.len() == self.ranks.len()
            && devices.iter().zip(&self.ranks).all(|(&d, (r, _))| d == *r)
    }

    fn all_reduce(&self, parts: &[(usize, TensorMem<'_>)]) -> Result<()> {
        let mut order: Vec<usize> = parts.iter().map(|(d, _)| *d).collect();
        order.sort_unstable();
        if !self.spans(&order) {
            return Err(gpu_err(
                "all_reduce",
                format!("parts on devices {order:?} do not match the communicator's ranks"),
            ));
        }
        let mut views = Vec::with_capacity(parts.len());
        for (d, m) in parts {
            let rank = self
                .ranks
                .iter()
                .position(|(r, _)| r == d)
                .ok_or_else(|| gpu_err("all_reduce", format!("device {d} has no rank")))?;
            let range = addr(m)?;
            // The library rewrites the bytes: activations quantized from them are stale.
            let dev = &self.ranks[rank].1;
            dev.inner.q8.lock().written(range.addr(), range.len());
            let view = range
                .view_mut::<f32>()
                .map_err(|e| gpu_err("all_reduce", e))?;
            views.push((rank, view));
        }
        if let Some((_, v)) = views.first() {
            if views.iter().any(|(_, w)| w.len() != v.len()) {
                return Err(gpu_err("all_reduce", "parts of different lengths"));
            }
        }
        if let Some(why) = self.aborted.lock().as_ref() {
            return Err(gpu_err(
                "all_reduce",
                format!("{}: aborted: {why}", self.name),
            ));
        }
        self.in_flight.lock().get_or_insert_with(Instant::now);
        let bytes = views.first().map_or(0, |(_, v)| v.byte_len() as usize);
        if !self.peer.is_empty() && peer_reduce::takes(bytes) {
            for (rank, view) in &views {
                let dev = &self.ranks[*rank].1;
                self.peer[*rank].launch(dev, gpu_mem::MemRange::of_view_mut(view))?;
            }
            return Ok(());
        }
        let nccl = self.comms[0].library();
        gpu_mem::grouped(nccl, || {
            for (rank, view) in &mut views {
                let stream = self.ranks[*rank].1.inner.sb.stream();
                self.comms[*rank].all_reduce_in_place(view, ReduceOp::Sum, stream)?;
            }
            Ok(())
        })
        .map_err(|e| gpu_err("all_reduce", e))
    }

    fn settled(&self) {
        *self.in_flight.lock() = None;
    }

    fn capturable(&self) -> bool {
        // One rank here: its all-reduce is one call on one stream. Several ranks driven from
        // one thread need a group over several devices' streams, which no one capture records.
        self.comms.len() == 1
    }

    fn replayed(&self) -> Result<()> {
        self.in_flight.lock().get_or_insert_with(Instant::now);
        Ok(())
    }

    fn status(&self) -> Result<()> {
        self.check()
    }
}
