//! The scheduler's capture and replay of repeated keyed runs: when a device records, when the
//! recording is replayed instead of launching, and when it is dropped (key change, arena
//! growth, capture turned off, failed captures).

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use rocmforge_ggml_graph::backend::{CpuDevice, Device, Stream, TensorMem};
use rocmforge_ggml_graph::{
    Captured, CpuBackend, DType, Graph, GraphError, Result, Scheduler, Tensor, TensorId,
};

/// What the recording device saw.
#[derive(Default)]
struct Counts {
    launches: AtomicUsize,
    recorded: AtomicUsize,
    captures: AtomicUsize,
    replays: AtomicUsize,
    capturing: AtomicBool,
    /// Make `end_capture` fail.
    fail: AtomicBool,
}

/// A CPU device that "records" launches between `begin_capture` and `end_capture` (it still
/// runs them, so the capturing run's results are real) and counts replays.
struct Recorder {
    inner: CpuDevice,
    counts: Arc<Counts>,
}

struct Replay(Arc<Counts>);

impl Captured for Replay {
    fn replay(&self) -> Result<()> {
        self.0.replays.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Device for Recorder {
    fn name(&self) -> &str {
        "recorder"
    }
    forward_device!(inner);
    fn supports_op(&self, t: &Tensor, srcs: &[&Tensor]) -> bool {
        self.inner.supports_op(t, srcs)
    }
    fn launch(
        &self,
        s: &dyn Stream,
        t: &Tensor,
        dst: TensorMem<'_>,
        srcs: &[TensorMem<'_>],
    ) -> Result<()> {
        let c = &self.counts;
        if c.capturing.load(Ordering::Relaxed) {
            c.recorded.fetch_add(1, Ordering::Relaxed);
        } else {
            c.launches.fetch_add(1, Ordering::Relaxed);
        }
        self.inner.launch(s, t, dst, srcs)
    }
    fn begin_capture(&self) -> Result<bool> {
        assert!(!self.counts.capturing.swap(true, Ordering::Relaxed));
        Ok(true)
    }
    fn end_capture(&self) -> Result<Box<dyn Captured>> {
        let c = &self.counts;
        assert!(c.capturing.swap(false, Ordering::Relaxed));
        if c.fail.load(Ordering::Relaxed) {
            return Err(GraphError::Unsupported {
                backend: "recorder",
                op: "capture",
                detail: "told to fail".into(),
            });
        }
        c.captures.fetch_add(1, Ordering::Relaxed);
        Ok(Box::new(Replay(c.clone())))
    }
}

fn recorder() -> (Scheduler, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let dev = Recorder {
        inner: CpuDevice::new(Arc::new(CpuBackend::new(1).unwrap())),
        counts: counts.clone(),
    };
    let mut s = Scheduler::new(vec![Arc::new(dev)]).unwrap();
    s.set_graph_capture(true);
    (s, counts)
}

/// `gelu(x) + x` over `n` columns of 64 values: 2 launches.
fn graph(n: usize) -> (Graph, TensorId, TensorId) {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[64, n]).unwrap();
    let y = g.gelu(x).unwrap();
    let z = g.add(y, x).unwrap();
    g.mark_output(z).unwrap();
    (g, x, z)
}

fn snapshot(c: &Counts) -> [usize; 4] {
    [
        c.launches.load(Ordering::Relaxed),
        c.recorded.load(Ordering::Relaxed),
        c.captures.load(Ordering::Relaxed),
        c.replays.load(Ordering::Relaxed),
    ]
}

#[test]
fn keyed_runs_are_captured_on_the_second_run_and_replayed_after() {
    let (mut s, c) = recorder();
    let (g, x, z) = graph(1);
    let xv = Rng::new(3).vec(64);
    let ins = [(x, f32_bytes(&xv))];
    let ins: Vec<(TensorId, &[u8])> = ins.iter().map(|(i, b)| (*i, b.as_slice())).collect();
    s.run_keyed(Some(1), &g, &ins).unwrap();
    assert_eq!(snapshot(&c), [2, 0, 0, 0], "first run: plain launches");
    let plain = s.output_f32(z).unwrap();
    s.run_keyed(Some(1), &g, &ins).unwrap();
    assert_eq!(
        snapshot(&c),
        [2, 2, 1, 1],
        "second run: recorded, then replayed once"
    );
    assert!(s.has_captured_graph());
    assert_eq!(s.output_f32(z).unwrap(), plain);
    for _ in 0..3 {
        s.run_keyed(Some(1), &g, &ins).unwrap();
    }
    assert_eq!(snapshot(&c), [2, 2, 1, 4], "later runs: replays only");
    // Unkeyed runs never replay; a small one leaves the capture (and the arena) alone.
    s.run(&g, &ins).unwrap();
    assert_eq!(snapshot(&c), [4, 2, 1, 4]);
    s.run_keyed(Some(1), &g, &ins).unwrap();
    assert_eq!(snapshot(&c), [4, 2, 1, 5]);
    // Turning capture off drops the recording and launches again.
    s.set_graph_capture(false);
    assert!(!s.has_captured_graph());
    s.run_keyed(Some(1), &g, &ins).unwrap();
    assert_eq!(snapshot(&c), [6, 2, 1, 5]);
}

#[test]
fn key_change_and_arena_growth_drop_the_capture() {
    let (mut s, c) = recorder();
    let (g, x, _) = graph(1);
    let xb = f32_bytes(&Rng::new(4).vec(64));
    let ins = [(x, xb.as_slice())];
    for _ in 0..3 {
        s.run_keyed(Some(7), &g, &ins).unwrap();
    }
    assert_eq!(snapshot(&c), [2, 2, 1, 2]);
    // A larger unkeyed graph reallocates the arena the recording points into.
    let (big, bx, _) = graph(256);
    let bb = f32_bytes(&Rng::new(5).vec(64 * 256));
    s.run(&big, &[(bx, bb.as_slice())]).unwrap();
    assert!(
        !s.has_captured_graph(),
        "arena growth must drop the capture"
    );
    s.run_keyed(Some(7), &g, &ins).unwrap();
    assert_eq!(snapshot(&c), [4, 4, 2, 3], "re-recorded after arena growth");
    // A new key (another graph) is prepared afresh: plain first, recorded second.
    s.run_keyed(Some(8), &g, &ins).unwrap();
    s.run_keyed(Some(8), &g, &ins).unwrap();
    assert_eq!(snapshot(&c), [6, 6, 3, 4]);
}

#[test]
fn failed_captures_fall_back_to_launches() {
    let (mut s, c) = recorder();
    c.fail.store(true, Ordering::Relaxed);
    let (g, x, z) = graph(1);
    let xb = f32_bytes(&Rng::new(6).vec(64));
    let ins = [(x, xb.as_slice())];
    s.run_keyed(Some(1), &g, &ins).unwrap();
    let want = s.output_f32(z).unwrap();
    for _ in 0..5 {
        s.run_keyed(Some(1), &g, &ins).unwrap();
        assert_eq!(s.output_f32(z).unwrap(), want);
    }
    // Two failed attempts (each followed by plain launches), then plain launches only.
    assert_eq!(snapshot(&c), [12, 4, 0, 0]);
    assert!(!s.has_captured_graph());
}

#[test]
fn graphs_that_take_turns_keep_their_plans_and_captures() {
    let (mut s, c) = recorder();
    let (g1, x1, z1) = graph(1);
    let (g2, x2, z2) = graph(2);
    let b1 = f32_bytes(&Rng::new(7).vec(64));
    let b2 = f32_bytes(&Rng::new(8).vec(128));
    let (i1, i2) = ([(x1, b1.as_slice())], [(x2, b2.as_slice())]);
    s.run_keyed(Some(1), &g1, &i1).unwrap();
    let want1 = s.output_f32(z1).unwrap();
    s.run_keyed(Some(2), &g2, &i2).unwrap();
    let want2 = s.output_f32(z2).unwrap();
    s.run_keyed(Some(1), &g1, &i1).unwrap();
    s.run_keyed(Some(2), &g2, &i2).unwrap();
    assert_eq!(
        snapshot(&c),
        [4, 4, 2, 2],
        "each key recorded on its second run"
    );
    // (The recorder's replays compute nothing: outputs are checked after real launches.)
    for _ in 0..3 {
        s.run_keyed(Some(1), &g1, &i1).unwrap();
        s.run_keyed(Some(2), &g2, &i2).unwrap();
    }
    assert_eq!(
        snapshot(&c),
        [4, 4, 2, 8],
        "alternating keys replay their own recordings"
    );
    assert_eq!(s.replays(), 8);
    // Many other keys later, the first is prepared (and recorded) afresh.
    for k in 10..40 {
        s.run_keyed(Some(k), &g2, &i2).unwrap();
    }
    let before = snapshot(&c);
    s.run_keyed(Some(1), &g1, &i1).unwrap();
    assert_eq!(
        snapshot(&c)[0],
        before[0] + 2,
        "an evicted key launches again"
    );
    assert_eq!(s.output_f32(z1).unwrap(), want1);
    s.run_keyed(Some(2), &g2, &i2).unwrap();
    s.run_keyed(Some(2), &g2, &i2).unwrap();
    assert_eq!(s.output_f32(z2).unwrap(), want2);
}

/// One rank of a collective whose other ranks run elsewhere (its sum is its own part here):
/// counts what the scheduler tells it, and fails when told to.
struct OneRank {
    capturable: bool,
    calls: AtomicUsize,
    replayed: AtomicUsize,
    failed: AtomicBool,
}

impl rocmforge_ggml_graph::Collective for OneRank {
    fn name(&self) -> &str {
        "one rank"
    }
    fn spans(&self, devices: &[usize]) -> bool {
        devices == [0]
    }
    fn all_reduce(&self, _parts: &[(usize, TensorMem<'_>)]) -> Result<()> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn capturable(&self) -> bool {
        self.capturable
    }
    fn replayed(&self) -> Result<()> {
        self.replayed.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn status(&self) -> Result<()> {
        if self.failed.load(Ordering::Relaxed) {
            return Err(GraphError::Unsupported {
                backend: "one rank",
                op: "all_reduce",
                detail: "a peer failed".into(),
            });
        }
        Ok(())
    }
}

#[test]
fn a_rank_s_all_reduce_is_captured_where_its_collective_allows_it() {
    for capturable in [true, false] {
        let (mut s, c) = recorder();
        let coll = Arc::new(OneRank {
            capturable,
            calls: AtomicUsize::new(0),
            replayed: AtomicUsize::new(0),
            failed: AtomicBool::new(false),
        });
        s.set_collective(Some(coll.clone()));
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[64, 1]).unwrap();
        let y = g.gelu(x).unwrap();
        let sum = g.all_reduce(&[y]).unwrap();
        let z = g.add(sum, x).unwrap();
        g.mark_output(z).unwrap();
        let xb = f32_bytes(&Rng::new(9).vec(64));
        let ins = [(x, xb.as_slice())];
        let mut outs = Vec::new();
        for run in 0..4 {
            assert_eq!(
                s.would_replay(Some(3), &g),
                capturable && run >= 2,
                "run {run}"
            );
            s.run_keyed(Some(3), &g, &ins).unwrap();
            outs.push(s.output_f32(z).unwrap());
        }
        assert!(outs.iter().all(|o| *o == outs[0]));
        let calls = coll.calls.load(Ordering::Relaxed);
        let replayed = coll.replayed.load(Ordering::Relaxed);
        if capturable {
            assert!(s.has_captured_graph());
            // Plain, recorded (then replayed), replayed, replayed.
            assert_eq!((calls, replayed, snapshot(&c)[3]), (2, 3, 3));
        } else {
            assert!(!s.has_captured_graph(), "its other ranks run outside");
            assert_eq!((calls, replayed), (4, 0));
        }
        // A failed collective: the next run and the reads of its results are errors.
        coll.failed.store(true, Ordering::Relaxed);
        if capturable {
            assert!(
                s.run_keyed(Some(3), &g, &ins).is_err(),
                "a replay after a failure"
            );
        }
        assert!(s.output_f32(z).is_err(), "results read after a failure");
    }
}
