//! The one-shot all-reduce of small f32 messages between the GPUs of one process, over peer
//! memory (`all_reduce_peer_f32` in `kernels/hip/allreduce.hip`): one launch per rank on its own
//! stream, no library call, so a decode step's small all-reduces cost a peer round trip each
//! instead of a collective library's latency.
//!
//! Set-up gives every rank an exchange buffer and a sync area in its own memory and every rank
//! the addresses of all of them (the ranks share this process); the per-call epochs live in
//! the sync areas, so captured graphs replay correctly. Every rank sums the parts in rank order:
//! all ranks hold the same bytes afterwards.

use std::sync::Arc;
use std::time::Duration;

use gpu_mem::{DeviceBuffer, KernelArg, MappedHostBuffer, MemRange, Platform};
use kernels::{
    KernelId, PeerReduceParams, PEER_BLOCKS, PEER_MAX_RANKS, PEER_SYNC_WORDS, PEER_THREADS,
};

use super::ops::Args;
use super::{gpu_err, HipDevice};

use crate::error::Result;

/// The largest message (bytes) that goes over peer memory. One launch moves each rank's part
/// once and reads every part once per rank: past a few hundred KB the collective library's
/// ring (each byte crosses a link once per rank) wins; a decode step's all-reduces (a hidden
/// state per sequence: 16 KB per token of an 8B model) stay well below.
pub(crate) const PEER_MAX_BYTES: usize = 256 << 10;

/// How long a launch waits for the other ranks before it gives up and reports an error: longer
/// than any rank's own work between two all-reduces can take (a first run loads kernels and
/// libraries), short enough that a rank that died ends the step with an error.
pub(crate) const TIMEOUT: Duration = Duration::from_secs(30);

/// Whether a message of `bytes` bytes goes over peer memory.
pub(crate) fn takes(bytes: usize) -> bool {
    bytes > 0 && bytes <= PEER_MAX_BYTES && bytes & 3 == 0
}

/// One rank's memory that every rank reaches.
struct RankMem {
    /// Two phases of [`PEER_MAX_BYTES`].
    _exchange: DeviceBuffer<f32>,
    /// [`PEER_SYNC_WORDS`] words, zeroed before the first launch.
    _sync: DeviceBuffer<u32>,
}

/// One rank of a peer all-reduce (see the module documentation).
pub(crate) struct PeerReduce {
    /// Every rank's memory, kept while any rank may still write into it.
    _mem: Arc<Vec<RankMem>>,
    /// The word this rank's launches set on a timeout.
    error: MappedHostBuffer,
    timeout: Duration,
    params: PeerReduceParams,
}

impl std::fmt::Debug for PeerReduce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerReduce")
            .field("rank", &self.params.rank)
            .field("world", &self.params.world)
            .finish()
    }
}

impl PeerReduce {
    /// One rank per GPU of `gpus` (rank `k` on `gpus[k]`): turns peer access on between every
    /// pair and gives each rank its exchange buffer and zeroed sync area; a launch waits up to
    /// `timeout` for the other ranks. Fails where a pair has no peer access, on AMD (the
    /// exchange needs fine-grained memory there, which is not allocated yet), or for more than
    /// [`PEER_MAX_RANKS`] GPUs.
    pub(crate) fn all(gpus: &[Arc<HipDevice>], timeout: Duration) -> Result<Vec<Self>> {
        let world = gpus.len();
        if !(2..=PEER_MAX_RANKS).contains(&world) {
            return Err(gpu_err(
                "peer all-reduce",
                format!("{world} GPUs (2 to {PEER_MAX_RANKS} take part)"),
            ));
        }
        for g in gpus {
            if g.gpu().info().platform == Platform::Amd {
                return Err(gpu_err(
                    "peer all-reduce",
                    "AMD GPUs: the exchange needs fine-grained (uncached) memory, not allocated \
                     yet",
                ));
            }
        }
        let devices: Vec<gpu_mem::Device> = gpus.iter().map(|g| g.gpu().clone()).collect();
        let without =
            gpu_mem::enable_all_peers(&devices).map_err(|e| gpu_err("peer all-reduce", e))?;
        if let Some((a, b)) = without.first() {
            return Err(gpu_err(
                "peer all-reduce",
                format!("GPU {a} cannot reach GPU {b}'s memory"),
            ));
        }
        let phase_floats = PEER_MAX_BYTES / 4;
        let mut mem = Vec::with_capacity(world);
        // Field by field: struct update syntax over this type crashes rustc 1.95 (broken MIR).
        let mut params: PeerReduceParams = bytemuck::Zeroable::zeroed();
        params.timeout_ns = i64::try_from(timeout.as_nanos()).unwrap_or(i64::MAX);
        params.world = world as i32;
        params.phase_floats = phase_floats as i32;
        for (k, g) in gpus.iter().enumerate() {
            let err = |e| gpu_err("peer all-reduce", e);
            let exchange = DeviceBuffer::<f32>::new(g.gpu(), 2 * phase_floats, "peer exchange")
                .map_err(err)?;
            let mut sync =
                DeviceBuffer::<u32>::new(g.gpu(), PEER_SYNC_WORDS, "peer sync").map_err(err)?;
            let stream = g.inner.sb.stream();
            stream.memset(&mut sync.view_mut(), 0).map_err(err)?;
            stream.synchronize().map_err(err)?;
            params.bufs[k] = exchange.ptr().0;
            params.sync[k] = sync.ptr().0;
            mem.push(RankMem {
                _exchange: exchange,
                _sync: sync,
            });
        }
        let mem = Arc::new(mem);
        gpus.iter()
            .enumerate()
            .map(|(k, g)| {
                let error =
                    MappedHostBuffer::new(g.gpu(), 4).map_err(|e| gpu_err("peer all-reduce", e))?;
                let mut params = params;
                params.rank = k as i32;
                params.error = error.range().addr();
                Ok(Self {
                    _mem: Arc::clone(&mem),
                    error,
                    timeout,
                    params,
                })
            })
            .collect()
    }

    /// Queues the all-reduce of `x` (this rank's part, summed in place) on `dev`'s stream;
    /// every rank must queue one of the same length, in the same order of calls.
    pub(crate) fn launch(&self, dev: &HipDevice, x: MemRange<'_>) -> Result<()> {
        if !takes(x.len()) {
            return Err(gpu_err(
                "peer all-reduce",
                format!(
                    "a message of {} bytes (whole floats, at most {PEER_MAX_BYTES})",
                    x.len()
                ),
            ));
        }
        let mut a = Args::new();
        a.push(x)
            .push((x.len() / 4) as i32)
            .push(KernelArg::Bytes(bytemuck::bytes_of(&self.params)));
        // SAFETY: the kernel reads and writes `x.len() / 4` floats of `x`; the table's buffers
        // (two phases of PEER_MAX_BYTES each, which the length is checked against) and sync
        // areas are alive while `self` is (`_mem`), and peer access between every pair was
        // turned on when they were made; the grid is the fixed PEER_BLOCKS every rank launches.
        unsafe {
            dev.launch_kernel(
                KernelId::AllReducePeerF32,
                [PEER_BLOCKS, 1, 1],
                PEER_THREADS,
                &a.0,
            )
        }
    }

    /// Why a launch of this rank failed (a wait for the other ranks that timed out), if one
    /// did; the word may lag a launch still running.
    pub(crate) fn failure(&self) -> Result<Option<String>> {
        let word = self
            .error
            .peek_u32(0)
            .map_err(|e| gpu_err("peer all-reduce", e))?;
        Ok((word != 0).then(|| {
            format!(
                "peer all-reduce rank {} of {}: the other ranks did not arrive within {:?} (a \
                 rank died or hangs)",
                self.params.rank, self.params.world, self.timeout
            )
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_takes_whole_float_messages_up_to_its_limit() {
        // A decode token's hidden state of an 8B model, and a batch of 16 of them.
        assert!(takes(4096 * 4));
        assert!(takes(16 * 4096 * 4));
        assert!(takes(PEER_MAX_BYTES));
        assert!(!takes(PEER_MAX_BYTES + 4));
        // A 512-token prompt's all-reduce goes to the collective library.
        assert!(!takes(512 * 4096 * 4));
        assert!(!takes(0));
        assert!(!takes(6));
    }
}
