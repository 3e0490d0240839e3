//! The scheduler: placement by `supports_op`, copy insertion, weights uploaded once per device,
//! and results equal to the single-device executor when work is split over two devices.

mod common;

use std::sync::Arc;

use common::*;
use rocmforge_ggml_graph::backend::{CpuDevice, Device, DummyDevice, GroupNode, Stream, TensorMem};
use rocmforge_ggml_graph::{
    CpuBackend, DType, Graph, Op, Result, RopeMode, RopeParams, Scheduler, Tensor, TensorId,
    WeightBytes,
};

/// A CPU device that only accepts some ops: stands in for a GPU backend with partial coverage.
struct Partial {
    inner: CpuDevice,
    accept: fn(&Op) -> bool,
}

impl Device for Partial {
    fn name(&self) -> &str {
        "partial-cpu"
    }
    fn supports_op(&self, t: &Tensor, srcs: &[&Tensor]) -> bool {
        (self.accept)(&t.op) && self.inner.supports_op(t, srcs)
    }
    forward_device!(inner);
    fn launch(
        &self,
        s: &dyn Stream,
        t: &Tensor,
        dst: TensorMem<'_>,
        srcs: &[TensorMem<'_>],
    ) -> Result<()> {
        self.inner.launch(s, t, dst, srcs)
    }
}

fn cpu() -> CpuDevice {
    CpuDevice::new(Arc::new(CpuBackend::new(1).unwrap()))
}

/// A small decoder-like block: norm, matmul, rope-free attention-ish mix, KV write, argmax.
fn block(g: &mut Graph) -> (TensorId, TensorId, TensorId, TensorId) {
    let x = g.input("x", DType::F32, &[64, 3]).unwrap();
    let idx = g.input("idx", DType::I32, &[3]).unwrap();
    let w = g.weight("w", DType::Q8_0, &[64, 64]).unwrap();
    let nw = g.weight("nw", DType::F32, &[64]).unwrap();
    let h = g.rms_norm(x, 1e-6).unwrap();
    let h = g.mul(h, nw).unwrap();
    let y = g.mul_mat(w, h).unwrap();
    let y = g.gelu(y).unwrap();
    let cache = g.persistent("cache", DType::F16, &[64, 8]).unwrap();
    let c = g.set_rows(cache, y, idx).unwrap();
    let all = g.cont(c).unwrap();
    let z = g.add(y, x).unwrap();
    let am = g.argmax(z).unwrap();
    g.mark_output(z).unwrap();
    g.mark_output(all).unwrap();
    g.mark_output(am).unwrap();
    (x, idx, z, all)
}

#[test]
fn split_over_two_devices_matches_executor() {
    let mut rng = Rng::new(21);
    let mut g = Graph::new();
    let (x, idx, z, all) = block(&mut g);
    let wb = random_weights(&mut rng, DType::Q8_0, 64 * 64);
    let nwv = rng.vec(64);
    let xv = rng.vec(64 * 3);
    let ins = [(x, f32_bytes(&xv)), (idx, i32_bytes(&[1, 4, 7]))];
    let ex = run(
        &g,
        &[
            ("w", DType::Q8_0, &[64, 64], wb.clone()),
            ("nw", DType::F32, &[64], f32_bytes(&nwv)),
        ],
        &ins,
    );

    // The first device only does mul_mat and gelu; everything else falls back to the CPU.
    let partial: Arc<dyn Device> = Arc::new(Partial {
        inner: cpu(),
        accept: |op| matches!(op, Op::MulMat | Op::Unary(_)),
    });
    let mut s = Scheduler::new(vec![partial, Arc::new(cpu())]).unwrap();
    s.bind_weight("w", DType::Q8_0, &[64, 64], WeightBytes::from_vec(wb))
        .unwrap();
    s.bind_weight(
        "nw",
        DType::F32,
        &[64],
        WeightBytes::from_vec(f32_bytes(&nwv)),
    )
    .unwrap();
    let refs: Vec<(TensorId, &[u8])> = ins.iter().map(|(i, b)| (*i, b.as_slice())).collect();
    for _ in 0..2 {
        s.run(&g, &refs).unwrap();
        assert_eq!(s.output_f32(z).unwrap(), ex.output_f32(z).unwrap());
        assert_eq!(s.output_f32(all).unwrap(), ex.output_f32(all).unwrap());
        // The same values handed over in place.
        for o in [z, all] {
            let want = ex.output_f32(o).unwrap();
            assert_eq!(s.with_output_f32(o, <[f32]>::to_vec).unwrap(), want);
            assert_eq!(ex.with_output_f32(o, <[f32]>::to_vec).unwrap(), want);
        }
    }
    let sched = s.last_schedule().unwrap();
    let on = |name: &str| -> Vec<usize> {
        g.tensors()
            .iter()
            .enumerate()
            .filter(|(_, t)| t.op.name() == name)
            .filter_map(|(i, _)| sched.device_of[i])
            .collect()
    };
    assert_eq!(on("mul_mat"), vec![0]);
    assert_eq!(on("gelu"), vec![0]);
    assert_eq!(on("rms_norm"), vec![1]);
    assert_eq!(on("add"), vec![1]);
    // mul's result goes to device 0; gelu's result comes back to the CPU (for set_rows and add);
    // x is read on device 1 only.
    assert_eq!(sched.copies.len(), 2, "{:?}", sched.copies);
    assert_eq!(
        sched.splits.iter().map(|(d, _)| *d).collect::<Vec<_>>(),
        vec![1, 0, 1]
    );
    assert_eq!(s.copies_made(), 4, "two copies per run");
}

#[test]
fn dummy_device_records_launches_and_allocations() {
    let mut g = Graph::new();
    let (x, idx, _, _) = block(&mut g);
    let dummy = Arc::new(DummyDevice::new("dummy", |t| matches!(t.op, Op::MulMat)));
    let mut s = Scheduler::new(vec![dummy.clone() as Arc<dyn Device>, Arc::new(cpu())]).unwrap();
    let mut rng = Rng::new(22);
    s.bind_weight(
        "w",
        DType::Q8_0,
        &[64, 64],
        WeightBytes::from_vec(random_weights(&mut rng, DType::Q8_0, 64 * 64)),
    )
    .unwrap();
    s.bind_weight(
        "nw",
        DType::F32,
        &[64],
        WeightBytes::from_vec(f32_bytes(&rng.vec(64))),
    )
    .unwrap();
    let xb = f32_bytes(&rng.vec(192));
    let ib = i32_bytes(&[0, 1, 2]);
    s.run(&g, &[(x, &xb), (idx, &ib)]).unwrap();
    s.run(&g, &[(x, &xb), (idx, &ib)]).unwrap();
    let log = dummy.log();
    assert_eq!(log.launches, vec!["mul_mat", "mul_mat"]);
    // One arena and one weight upload (Q8_0 64x64 = 64 rows of 2 blocks of 34 bytes), kept across runs.
    assert_eq!(log.allocs.len(), 2, "{:?}", log.allocs);
    assert!(log.allocs.contains(&4352));
}

#[test]
fn unsupported_everywhere_is_an_error() {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[4]).unwrap();
    let y = g.silu(x).unwrap();
    g.mark_output(y).unwrap();
    let dummy: Arc<dyn Device> = Arc::new(DummyDevice::new("dummy", |_| false));
    let mut s = Scheduler::new(vec![dummy]).unwrap();
    let err = s.run(&g, &[(x, &f32_bytes(&[1.0; 4]))]).unwrap_err();
    assert!(err.to_string().contains("no device supports"), "{err}");
}

/// A CPU device that records the groups the scheduler offers it and launches none of them.
struct Grouping {
    inner: CpuDevice,
    offered: parking_lot::Mutex<Vec<Vec<&'static str>>>,
}

impl Device for Grouping {
    fn name(&self) -> &str {
        "grouping-cpu"
    }
    forward_device!(inner, all);
    fn launch_group(&self, _s: &dyn Stream, group: &[GroupNode<'_>]) -> Result<usize> {
        self.offered
            .lock()
            .push(group.iter().map(|g| g.tensor.op.name()).collect());
        Ok(0)
    }
}

/// The scheduler offers q/k/v mat-vecs on one input (with the ropes and cache writes of their
/// outputs after them), rope pairs of the same positions (with the K and V cache writes after
/// them) and set_rows pairs of the same indices as groups, never a node
/// that reads an earlier one of the run except in those chains; a device that takes none still
/// gets every node launched one by one, each later node of a refused run offered again.
#[test]
fn scheduler_offers_independent_runs_as_groups() {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[256, 1]).unwrap();
    let pos = g.input("pos", DType::I32, &[1]).unwrap();
    let w = |g: &mut Graph, name: &str, n: usize| g.weight(name, DType::Q8_0, &[256, n]).unwrap();
    let (wq, wk, wv, wa) = (
        w(&mut g, "wq", 128),
        w(&mut g, "wk", 64),
        w(&mut g, "wv", 64),
        w(&mut g, "wa", 256),
    );
    let q = g.mul_mat(wq, x).unwrap();
    let k = g.mul_mat(wk, x).unwrap();
    let v = g.mul_mat(wv, x).unwrap();
    let q3 = g.reshape(q, &[64, 2, 1]).unwrap();
    let k3 = g.reshape(k, &[64, 1, 1]).unwrap();
    let rp = RopeParams::new(RopeMode::Normal, 64, 10000.0, 1.0);
    let rq = g.rope(q3, pos, rp, None).unwrap();
    let rk = g.rope(k3, pos, rp, None).unwrap();
    let ck = g.persistent("ck", DType::F16, &[64, 4]).unwrap();
    let cv = g.persistent("cv", DType::F16, &[64, 4]).unwrap();
    let rk2 = g.reshape(rk, &[64, 1]).unwrap();
    g.set_rows(ck, rk2, pos).unwrap();
    g.set_rows(cv, v, pos).unwrap();
    // Chains: the second of each pair reads the first.
    let a = g.mul_mat(wa, x).unwrap();
    let b = g.mul_mat(a, x).unwrap();
    let r1 = g.rope(q3, pos, rp, None).unwrap();
    let r2 = g.rope(r1, pos, rp, None).unwrap();
    for o in [rq, b, r2] {
        g.mark_output(o).unwrap();
    }
    let dev = Arc::new(Grouping {
        inner: cpu(),
        offered: parking_lot::Mutex::new(Vec::new()),
    });
    let mut s = Scheduler::new(vec![dev.clone() as Arc<dyn Device>]).unwrap();
    let mut rng = Rng::new(7);
    for (name, n) in [("wq", 128), ("wk", 64), ("wv", 64), ("wa", 256)] {
        let bytes = random_weights(&mut rng, DType::Q8_0, 256 * n);
        s.bind_weight(name, DType::Q8_0, &[256, n], WeightBytes::from_vec(bytes))
            .unwrap();
    }
    let xs = f32_bytes(
        &(0..256)
            .map(|i| (i as f32 * 0.01).sin())
            .collect::<Vec<_>>(),
    );
    let ps = i32_bytes(&[2]);
    s.run(&g, &[(x, &xs), (pos, &ps)]).unwrap();
    assert_eq!(
        *dev.offered.lock(),
        vec![
            // The projections with the ropes and cache writes of their outputs.
            vec!["mul_mat", "mul_mat", "mul_mat", "rope", "rope", "set_rows", "set_rows"],
            // Refused: the first runs alone and the rest is offered again.
            vec!["mul_mat", "mul_mat"],
            // The key rope's cache write and the value's after the rope pair.
            vec!["rope", "rope", "set_rows", "set_rows"],
            vec!["set_rows", "set_rows"],
        ]
    );
    // Every node still ran one by one: the chained rope's second pass did rotate again.
    let once = s.output_f32(rq).unwrap();
    let twice = s.output_f32(r2).unwrap();
    assert_eq!(twice.len(), 128);
    assert!(twice.iter().all(|v| v.is_finite()));
    assert_ne!(once, twice);
}
