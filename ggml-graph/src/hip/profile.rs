//! A per-node GPU time profiler for the HIP backend, switched on with `HipOptions::profile`.
//!
//! Each node's launches are bracketed by two timing events on the device's stream; completed
//! pairs are folded into totals keyed by op, operand types and shapes, so prefill and decode
//! nodes (different token counts) land in different rows. While profiling, graph capture is
//! off (events around every node need plain launches). The table is logged at `info` under the
//! target `rocmforge::profile` when the device closes (`ROCMFORGE_LOG=rocmforge::profile=info`).
//! With the option off none of this runs: one flag test per launch.

use std::collections::HashMap;

use gpu_mem::Event;

use crate::tensor::{Op, Tensor};

/// Event pairs waiting for their elapsed times, at most (then the oldest are folded in).
const PENDING_MAX: usize = 2048;

#[derive(Default, Clone, Copy)]
struct Total {
    count: u64,
    ms: f64,
}

/// Node times collected so far.
#[derive(Default)]
pub(crate) struct Profiler {
    pending: Vec<(String, Event, Event)>,
    totals: HashMap<String, Total>,
}

/// The row a node's time is added to: op, operand types and shapes (ggml order).
pub(crate) fn key(t: &Tensor, srcs: &[&Tensor]) -> String {
    let shape = |x: &Tensor| {
        let n = x.ne.iter().rposition(|&v| v != 1).map_or(1, |i| i + 1);
        let dims: Vec<String> = x.ne[..n].iter().map(usize::to_string).collect();
        format!("{}[{}]", x.dtype.name(), dims.join(","))
    };
    let ins: Vec<String> = match t.op {
        // A mul_mat's weight decides its kernel; the activation is the token count.
        Op::MulMat | Op::MulMatAdd | Op::MulMatGated(_) => srcs.iter().map(|s| shape(s)).collect(),
        _ => srcs.first().map(|s| shape(s)).into_iter().collect(),
    };
    format!("{:<14} {} -> {}", t.op.name(), ins.join(" "), shape(t))
}

impl Profiler {
    /// Adds a node's event pair (recorded around its launches).
    pub(crate) fn push(&mut self, key: String, start: Event, end: Event) -> gpu_mem::Result<()> {
        self.pending.push((key, start, end));
        if self.pending.len() >= PENDING_MAX {
            self.fold()?;
        }
        Ok(())
    }

    /// Waits for the pending pairs and adds their times to the totals.
    fn fold(&mut self) -> gpu_mem::Result<()> {
        if let Some((_, _, last)) = self.pending.last() {
            last.synchronize()?;
        }
        for (key, start, end) in self.pending.drain(..) {
            let ms = start.elapsed_ms(&end)?;
            let t = self.totals.entry(key).or_default();
            t.count += 1;
            t.ms += f64::from(ms);
        }
        Ok(())
    }

    /// Logs the table, longest total first.
    pub(crate) fn report(&mut self) {
        if let Err(e) = self.fold() {
            tracing::warn!(target: "rocmforge::profile", "profile: timing events failed: {e}");
            return;
        }
        let mut rows: Vec<(&String, &Total)> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1.ms.total_cmp(&a.1.ms));
        let all: f64 = rows.iter().map(|r| r.1.ms).sum();
        let launches: u64 = rows.iter().map(|r| r.1.count).sum();
        tracing::info!(
            target: "rocmforge::profile",
            "GPU node time: {all:.1} ms over {launches} nodes ({} kinds)",
            rows.len()
        );
        tracing::info!(
            target: "rocmforge::profile",
            "{:>10} {:>9} {:>6} {:>9}  node",
            "total ms",
            "mean us",
            "%",
            "count"
        );
        for (k, t) in rows.iter().take(60) {
            tracing::info!(
                target: "rocmforge::profile",
                "{:>10.2} {:>9.2} {:>6.2} {:>9}  {k}",
                t.ms,
                t.ms * 1e3 / t.count.max(1) as f64,
                100.0 * t.ms / all.max(1e-9),
                t.count
            );
        }
    }
}
