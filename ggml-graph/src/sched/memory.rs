//! Where a run's tensors live: arena offsets, copy slots and the host-mapped outputs that
//! kernels write in place, and the device buffers behind them.

use super::{launches, Prepared, Schedule, Scheduler};
use crate::backend::{Buffer, TensorMem};
use crate::error::{GraphError, Result};
use crate::graph::Graph;
use crate::plan::ALIGN;
use crate::tensor::{Leaf, Op, TensorId};

/// Largest output written to host-mapped memory: beyond it the bus's bandwidth, not the latency
/// of a copy after the kernel, is what the host waits for, and device memory is faster to write.
const MAPPED_OUTPUT_MAX: usize = 4 << 20;

/// Which outputs the kernels computing them write to host-mapped memory, and where: per storage
/// root an offset in its device's mapped buffer, and the bytes per device. An output qualifies
/// when its root is computed by a launch on a device `maps` allows, nothing else in the graph
/// reads or writes that root, and it is at most [`MAPPED_OUTPUT_MAX`] bytes. Such roots keep
/// their arena offset too (the fallback when a device has no mapped memory to give).
pub(super) fn mapped_outputs(
    graph: &Graph,
    sched: &Schedule,
    n_devices: usize,
    maps: impl Fn(usize) -> bool,
) -> (Vec<Option<usize>>, Vec<usize>) {
    let nodes = graph.tensors();
    let mut mapped = vec![None; nodes.len()];
    let mut size = vec![0usize; n_devices];
    if graph.outputs().is_empty() {
        return (mapped, size);
    }
    // Roots that another launched node reads or writes in place.
    let mut touched = vec![false; nodes.len()];
    for (j, t) in nodes.iter().enumerate() {
        if sched.device_of[j].is_none() || !launches(t) {
            continue;
        }
        for &s in &t.src {
            touched[graph.storage_root(s).0.index()] = true;
        }
        let r = graph.storage_root(TensorId::from_index(j)).0.index();
        if r != j {
            touched[r] = true;
        }
    }
    for &o in graph.outputs() {
        let r = graph.storage_root(o).0.index();
        let t = &nodes[r];
        let Some(d) = sched.device_of[r] else {
            continue;
        };
        if mapped[r].is_some()
            || touched[r]
            || !launches(t)
            || t.op.is_alias()
            || t.extent() > MAPPED_OUTPUT_MAX
            || !maps(d)
        {
            continue;
        }
        mapped[r] = Some(size[d]);
        size[d] += t.extent().div_ceil(ALIGN) * ALIGN;
    }
    (mapped, size)
}

/// Device `d`'s buffer of a per-device list (`what` names it in the error when there is none).
fn device_buf<'a>(
    bufs: &'a [Option<Box<dyn Buffer>>],
    d: usize,
    what: &'static str,
) -> Result<&'a dyn Buffer> {
    bufs.get(d)
        .and_then(|b| b.as_deref())
        .ok_or_else(|| GraphError::Unsupported {
            backend: "scheduler",
            op: what,
            detail: format!("device {d} has no {what}"),
        })
}

impl Scheduler {
    /// Gives each device the host-mapped output buffer `prep` needs; a device that has none
    /// (or fails to allocate one) keeps its outputs in the arena from then on.
    pub(super) fn ensure_mapped(&mut self, prep: &mut Prepared) -> Result<()> {
        for d in 0..self.devices.len() {
            let need = prep.mapped_size[d];
            if need == 0 || self.mapped[d].as_ref().is_some_and(|b| b.size() >= need) {
                continue;
            }
            // Captured launches write the old buffer: drop them, and let a replay finish.
            prep.captured = None;
            self.drop_captures();
            self.streams[d].synchronize()?;
            self.mapped[d] = None;
            match self.devices[d].buffer_type().alloc_mapped(need) {
                Ok(Some(b)) => self.mapped[d] = Some(b),
                got => {
                    if let Err(e) = got {
                        tracing::warn!("scheduler: no host-mapped outputs on device {d}: {e}");
                    }
                    self.map_outputs[d] = false;
                    // The kept preparations place outputs in the buffer that is gone.
                    self.prepared.clear();
                    for (m, home) in prep.mapped.iter_mut().zip(&prep.sched.device_of) {
                        if *home == Some(d) {
                            *m = None;
                        }
                    }
                    prep.mapped_size[d] = 0;
                }
            }
        }
        Ok(())
    }

    pub(super) fn mapped_buf(&self, d: usize) -> Result<&dyn Buffer> {
        device_buf(&self.mapped, d, "mapped output buffer")
    }

    pub(super) fn arena(&self, d: usize) -> Result<&dyn Buffer> {
        device_buf(&self.arenas, d, "arena")
    }

    /// The home buffer and offset of storage root `r`.
    pub(super) fn home_of(
        &self,
        graph: &Graph,
        prep: &Prepared,
        r: TensorId,
        home: usize,
    ) -> Result<(&dyn Buffer, usize)> {
        let t = &graph.tensors()[r.index()];
        match t.op {
            Op::Leaf(Leaf::Persistent) => {
                let p = self
                    .persistent
                    .get(&t.name)
                    .ok_or_else(|| GraphError::UnboundWeight(t.name.clone()))?;
                Ok((p.buf.as_ref(), 0))
            }
            Op::Leaf(Leaf::Weight) => {
                let b = self
                    .uploaded_buf(&t.name, home)
                    .ok_or_else(|| GraphError::UnboundWeight(t.name.clone()))?;
                Ok((b, 0))
            }
            _ => match prep.mapped[r.index()] {
                Some(off) => Ok((self.mapped_buf(home)?, off)),
                None => Ok((self.arena(home)?, prep.offsets[r.index()].unwrap_or(0))),
            },
        }
    }

    pub(super) fn mem<'a>(
        &'a self,
        graph: &'a Graph,
        prep: &Prepared,
        id: TensorId,
        d: usize,
    ) -> Result<TensorMem<'a>> {
        let sched = prep.sched.as_ref();
        let (r, off) = graph.storage_root(id);
        let tensor = &graph.tensors()[id.index()];
        let is_weight = graph.tensors()[r.index()].op == Op::Leaf(Leaf::Weight);
        let nd = self.devices.len();
        if let (false, Some(s)) = (is_weight, prep.slot[r.index() * nd + d]) {
            return Ok(TensorMem {
                tensor,
                buffer: self.arena(d)?,
                offset: s + off,
            });
        }
        let home = if is_weight {
            d
        } else {
            sched.device_of[r.index()].unwrap_or(0)
        };
        let (buffer, base) = self.home_of(graph, prep, r, home)?;
        Ok(TensorMem {
            tensor,
            buffer,
            offset: base + off,
        })
    }
}
