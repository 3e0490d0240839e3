//! `all_reduce` nodes in the scheduler: partial results on several devices summed by copies to
//! the node's device, or in place on every device by a [`Collective`] (then no partial is
//! copied and every device's partial holds the sum); both equal one device's sum.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use rocmforge_ggml_graph::backend::{Collective, CpuDevice, Device, TensorMem};
use rocmforge_ggml_graph::sched::PlacementRule;
use rocmforge_ggml_graph::{CpuBackend, DType, Graph, Op, Result, Scheduler, TensorId};

struct Named(&'static str, CpuDevice);

impl Device for Named {
    fn name(&self) -> &str {
        self.0
    }
    forward_device!(1, all);
}

fn dev(name: &'static str) -> Arc<dyn Device> {
    Arc::new(Named(
        name,
        CpuDevice::new(Arc::new(CpuBackend::new(1).unwrap())),
    ))
}

/// A collective over host buffers: sums the parts through the host, writes the sum into each
/// part, and records the devices of each call.
struct HostCollective {
    ranks: Vec<usize>,
    calls: Mutex<Vec<Vec<usize>>>,
}

impl Collective for HostCollective {
    fn name(&self) -> &str {
        "host"
    }
    fn spans(&self, devices: &[usize]) -> bool {
        devices == self.ranks.as_slice()
    }
    fn all_reduce(&self, parts: &[(usize, TensorMem<'_>)]) -> Result<()> {
        let n = parts[0].1.tensor.nelements();
        let mut sum = vec![0f32; n];
        for (_, m) in parts {
            let mut b = vec![0u8; n * 4];
            m.buffer.read(m.offset, &mut b)?;
            for (s, c) in sum.iter_mut().zip(b.chunks_exact(4)) {
                *s += f32::from_le_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
        let bytes = f32_bytes(&sum);
        for (_, m) in parts {
            m.buffer.write(m.offset, &bytes)?;
        }
        self.calls
            .lock()
            .unwrap()
            .push(parts.iter().map(|(d, _)| *d).collect());
        Ok(())
    }
}

const D: usize = 32;

fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (i, (a, b)) in got.iter().zip(want).enumerate() {
        assert!((a - b).abs() <= tol * b.abs().max(1.0), "[{i}]: {a} vs {b}");
    }
}

/// `n` partial products of `x` (weights `w{k}`, placed on device `k`), their all-reduce, and a
/// product of the sum on each device (`v{k}`): what a tensor split's next layer reads.
fn split_graph(g: &mut Graph, n: usize) -> (TensorId, Vec<TensorId>, TensorId, Vec<TensorId>) {
    let x = g.input("x", DType::F32, &[D, 3]).unwrap();
    let parts: Vec<TensorId> = (0..n)
        .rev()
        .map(|k| {
            let w = g.weight(&format!("w{k}"), DType::F32, &[D, D]).unwrap();
            g.mul_mat(w, x).unwrap()
        })
        .collect();
    let s = g.all_reduce(&parts).unwrap();
    g.mark_output(s).unwrap();
    let next: Vec<TensorId> = (0..n)
        .map(|k| {
            let v = g.weight(&format!("v{k}"), DType::F32, &[D, D]).unwrap();
            let y = g.mul_mat(v, s).unwrap();
            g.mark_output(y).unwrap();
            y
        })
        .collect();
    (x, parts, s, next)
}

fn weight_of(name: &str) -> Option<usize> {
    name[1..].parse().ok()
}

fn bind(s: &mut Scheduler, rng: &mut Rng, n: usize) {
    for k in 0..n {
        for p in ["w", "v"] {
            let w = f32_bytes(&rng.vec(D * D));
            s.bind_weight(
                &format!("{p}{k}"),
                DType::F32,
                &[D, D],
                rocmforge_ggml_graph::WeightBytes::from_vec(w),
            )
            .unwrap();
        }
    }
}

#[test]
fn all_reduce_by_copies_or_by_a_collective_equals_one_device() {
    for n in [2usize, 3] {
        let mut g = Graph::new();
        let (x, parts, s, next) = split_graph(&mut g, n);
        let copied = |sched: &rocmforge_ggml_graph::Schedule, id: TensorId| {
            sched.copies.iter().filter(|(r, _)| *r == id).count()
        };
        let mut rng = Rng::new(11);
        let xb = f32_bytes(&rng.vec(D * 3));
        let ins: [(TensorId, &[u8]); 1] = [(x, &xb)];

        let mut one = Scheduler::new(vec![dev("one")]).unwrap();
        bind(&mut one, &mut Rng::new(7), n);
        one.run(&g, &ins).unwrap();
        let want = one.output_f32(s).unwrap();
        let want_next: Vec<Vec<f32>> = next.iter().map(|&y| one.output_f32(y).unwrap()).collect();

        let rule: PlacementRule = Arc::new(weight_of);
        let names = ["a", "b", "c"];
        let devices = |n: usize| (0..n).map(|k| dev(names[k])).collect::<Vec<_>>();

        // By copies: every other device's partial travels to the node's device.
        let mut copies = Scheduler::new(devices(n)).unwrap();
        bind(&mut copies, &mut Rng::new(7), n);
        copies.set_placement(Arc::clone(&rule));
        copies.run(&g, &ins).unwrap();
        let sched = copies.last_schedule().unwrap().clone();
        let node = sched.device_of[s.index()].unwrap();
        assert_eq!(
            node, 0,
            "the sum follows its last operand (device 0's partial)"
        );
        assert!(!sched.collective[s.index()]);
        assert_eq!(
            parts.iter().map(|&p| copied(&sched, p)).sum::<usize>(),
            n - 1
        );
        close(&copies.output_f32(s).unwrap(), &want, 1e-5);

        // By the collective: no partial is copied.
        let coll = Arc::new(HostCollective {
            ranks: (0..n).collect(),
            calls: Mutex::new(Vec::new()),
        });
        let mut reduced = Scheduler::new(devices(n)).unwrap();
        bind(&mut reduced, &mut Rng::new(7), n);
        reduced.set_placement(rule);
        reduced.set_collective(Some(coll.clone()));
        reduced.run(&g, &ins).unwrap();
        let sched = reduced.last_schedule().unwrap().clone();
        assert!(sched.collective[s.index()]);
        assert_eq!(g.tensors()[s.index()].op, Op::AllReduce);
        // No partial travels; the sum goes to the devices whose next product reads it.
        assert_eq!(parts.iter().map(|&p| copied(&sched, p)).sum::<usize>(), 0);
        assert_eq!(copied(&sched, s), n - 1);
        assert_eq!(
            *coll.calls.lock().unwrap(),
            vec![(0..n).rev().collect::<Vec<_>>()]
        );
        close(&reduced.output_f32(s).unwrap(), &want, 1e-5);
        for (y, w) in next.iter().zip(&want_next) {
            close(&reduced.output_f32(*y).unwrap(), w, 1e-4);
        }

        // A collective over other devices than the partials' is not used.
        let partial = Arc::new(HostCollective {
            ranks: vec![0, 1, 2, 3],
            calls: Mutex::new(Vec::new()),
        });
        let mut other = Scheduler::new(devices(n)).unwrap();
        bind(&mut other, &mut Rng::new(7), n);
        other.set_placement(Arc::new(weight_of));
        other.set_collective(Some(partial.clone()));
        other.run(&g, &ins).unwrap();
        assert!(!other.last_schedule().unwrap().collective[s.index()]);
        assert!(partial.calls.lock().unwrap().is_empty());
        close(&other.output_f32(s).unwrap(), &want, 1e-5);
    }
}

#[test]
fn all_reduce_checks_its_operands() {
    let mut g = Graph::new();
    let a = g.input("a", DType::F32, &[4, 2]).unwrap();
    let b = g.input("b", DType::F32, &[4, 3]).unwrap();
    let h = g.input("h", DType::F16, &[4, 2]).unwrap();
    assert!(g.all_reduce(&[]).is_err());
    assert!(g.all_reduce(&[a, b]).is_err(), "shapes differ");
    assert!(g.all_reduce(&[a, h]).is_err(), "not f32");
    let t = g.transpose(a).unwrap();
    assert!(g.all_reduce(&[t]).is_err(), "not dense");
    let s = g.all_reduce(&[a, a, a]).unwrap();
    g.mark_output(s).unwrap();
    let mut sch = Scheduler::new(vec![dev("one")]).unwrap();
    let v: Vec<f32> = (0..8).map(|i| i as f32 - 3.0).collect();
    let vb = f32_bytes(&v);
    sch.run(&g, &[(a, &vb)]).unwrap();
    let want: Vec<f32> = v.iter().map(|x| 3.0 * x).collect();
    assert_eq!(sch.output_f32(s).unwrap(), want);
}

/// One operand with a collective spanning its device (one rank of a communicator whose other
/// ranks are other processes): the collective runs on it and the node reads the result.
#[test]
fn a_single_rank_all_reduce_goes_through_the_collective() {
    let mut g = Graph::new();
    let (x, _, s, _) = split_graph(&mut g, 1);
    let coll = Arc::new(HostCollective {
        ranks: vec![0],
        calls: Mutex::new(Vec::new()),
    });
    let mut sch = Scheduler::new(vec![dev("a")]).unwrap();
    bind(&mut sch, &mut Rng::new(7), 1);
    sch.set_collective(Some(coll.clone()));
    let xb = f32_bytes(&Rng::new(3).vec(D * 3));
    for _ in 0..2 {
        sch.run_keyed(Some(1), &g, &[(x, &xb)]).unwrap();
    }
    assert!(sch.last_schedule().unwrap().collective[s.index()]);
    assert_eq!(coll.calls.lock().unwrap().len(), 2);
    assert!(!sch.has_captured_graph());
    let mut plain = Scheduler::new(vec![dev("a")]).unwrap();
    bind(&mut plain, &mut Rng::new(7), 1);
    plain.run(&g, &[(x, &xb)]).unwrap();
    assert!(!plain.last_schedule().unwrap().collective[s.index()]);
    close(
        &sch.output_f32(s).unwrap(),
        &plain.output_f32(s).unwrap(),
        0.0,
    );
}
