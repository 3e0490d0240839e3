//! The HIP backend's [`Collective`]: one NCCL/RCCL communicator with a rank on each GPU of a
//! scheduler, all driven by this process, its all-reduces queued on the GPUs' own streams.

use std::sync::Arc;

use gpu_mem::{Communicator, NcclOptions, ReduceOp};

use crate::hip_options::CollectiveOptions;

use super::{addr, gpu_err, HipDevice};
use crate::backend::{Collective, TensorMem};
use crate::error::Result;

/// A communicator over several GPUs of one process (see [`Collective`]).
pub struct HipCollective {
    /// Per rank: the scheduler's index of its device, and the device.
    ranks: Vec<(usize, Arc<HipDevice>)>,
    comms: Vec<Communicator>,
    name: String,
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
        let opts = NcclOptions {
            library: opts.library.clone(),
            dirs: hip_ffi::InstallDirs {
                rocm: opts.rocm.clone(),
                cuda: opts.cuda.clone(),
            },
            skip_python: false,
        };
        let first = gpus
            .first()
            .ok_or_else(|| gpu_err("collective", "no GPUs"))?;
        if gpus.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(gpu_err("collective", "device indices must ascend"));
        }
        let nccl = gpu_mem::comm::load_library(first.1.gpu(), &opts)
            .map_err(|e| gpu_err("collective", e))?;
        let version = nccl
            .version_string()
            .map_err(|e| gpu_err("collective", e))?;
        let devices: Vec<gpu_mem::Device> = gpus.iter().map(|(_, h)| h.gpu().clone()).collect();
        let comms =
            Communicator::init_all(&nccl, &devices).map_err(|e| gpu_err("collective", e))?;
        let kind = match nccl.platform() {
            gpu_mem::Platform::Amd => "RCCL",
            _ => "NCCL",
        };
        Ok(Self {
            ranks: gpus.to_vec(),
            comms,
            name: format!("{kind} {version}"),
        })
    }

    /// Fails with the first asynchronous error of a rank (a peer gone, a network error).
    pub fn check(&self) -> Result<()> {
        for c in &self.comms {
            c.check().map_err(|e| gpu_err("collective", e))?;
        }
        Ok(())
    }
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
}
