//! Reading a run's outputs back: where each output lives and its values as f32, handed over in
//! place where the buffer can show them.

use super::{OutLoc, Scheduler};
use crate::backend::Buffer;
use crate::error::{GraphError, Result};
use crate::tensor::{Tensor, TensorId};

impl Scheduler {
    /// Where an output of the last run lives: its descriptor, buffer and byte offset.
    fn output_at(&self, id: TensorId) -> Result<(&Tensor, &dyn Buffer, usize)> {
        let (_, t, loc) = self
            .last
            .as_ref()
            .and_then(|l| l.outputs.iter().find(|(o, _, _)| *o == id))
            .ok_or_else(|| GraphError::NotOutput(format!("{id:?}")))?;
        let (buf, offset) = match loc {
            OutLoc::Arena { device, offset } => (self.arena(*device)?, *offset),
            OutLoc::Mapped { device, offset } => (self.mapped_buf(*device)?, *offset),
            OutLoc::Persistent { name, offset } => {
                let p = self
                    .persistent
                    .get(name)
                    .ok_or_else(|| GraphError::UnboundWeight(name.clone()))?;
                (p.buf.as_ref(), *offset)
            }
            OutLoc::Weight {
                name,
                device,
                offset,
            } => (
                self.uploaded_buf(name, *device)
                    .ok_or_else(|| GraphError::UnboundWeight(name.clone()))?,
                *offset,
            ),
        };
        Ok((t, buf, offset))
    }

    /// Hands `f` an output of the last run as f32 values in logical order: for a dense f32
    /// output on a GPU (a decode step's logits) the values where the device's read landed, in
    /// page-locked memory, with no copy on the host.
    pub fn with_output_f32<R>(&self, id: TensorId, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
        let (t, buf, offset) = self.output_at(id)?;
        let mut f = Some(f);
        let mut r = None;
        let mut err = None;
        buf.read_with(offset, t.extent(), &mut |bytes| {
            if let Some(f) = f.take() {
                match crate::cpu::with_f32(t, bytes, f) {
                    Ok(v) => r = Some(v),
                    Err(e) => err = Some(e),
                }
            }
        })?;
        if let Some(e) = err {
            return Err(e);
        }
        // The read waited for the run's work on that device, its collectives included (a
        // replayed capture's are known finished only here).
        if let Some(c) = &self.collective {
            c.settled();
            c.status()?;
        }
        r.ok_or_else(|| GraphError::NotOutput(t.name.clone()))
    }

    /// An output of the last run as f32 values in logical order.
    pub fn output_f32(&self, id: TensorId) -> Result<Vec<f32>> {
        self.with_output_f32(id, <[f32]>::to_vec)
    }
}
