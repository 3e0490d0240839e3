//! The scheduler's placement rule: weights and persistent leaves placed by name (a layer split
//! like llama.cpp's `-ngl`) pull the nodes that read them onto their device, the nodes between
//! follow their operands, weights are uploaded up front per device, and results equal the
//! single-device executor.

mod common;

use std::sync::Arc;

use common::*;
use rocmforge_ggml_graph::backend::{CpuDevice, Device, DummyDevice};
use rocmforge_ggml_graph::sched::PlacementRule;
use rocmforge_ggml_graph::{CpuBackend, DType, Graph, Scheduler, TensorId, WeightBytes};

/// A CPU device under another name (each scheduler device needs its own buffers).
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

const D: usize = 64;

/// Two "layers" (matmul, gelu, KV write, residual add) and an output matmul.
fn model(g: &mut Graph) -> (TensorId, TensorId, TensorId) {
    let x = g.input("x", DType::F32, &[D, 2]).unwrap();
    let idx = g.input("idx", DType::I32, &[2]).unwrap();
    let mut h = x;
    for il in 0..2 {
        let w = g
            .weight(&format!("blk.{il}.w"), DType::Q8_0, &[D, D])
            .unwrap();
        let y = g.mul_mat(w, h).unwrap();
        let y = g.gelu(y).unwrap();
        let cache = g
            .persistent(&format!("cache.{il}"), DType::F32, &[D, 4])
            .unwrap();
        let c = g.set_rows(cache, y, idx).unwrap();
        let all = g.cont(c).unwrap();
        g.mark_output(all).unwrap();
        h = g.add(y, h).unwrap();
    }
    let out = g.weight("out.w", DType::Q8_0, &[D, D]).unwrap();
    let z = g.mul_mat(out, h).unwrap();
    g.mark_output(z).unwrap();
    (x, idx, z)
}

fn layer(name: &str) -> Option<usize> {
    let rest = name
        .strip_prefix("blk.")
        .or_else(|| name.strip_prefix("cache."))?;
    rest.split('.').next()?.parse().ok()
}

#[test]
fn layers_follow_the_placement_rule() {
    let mut rng = Rng::new(5);
    let mut g = Graph::new();
    let (x, idx, z) = model(&mut g);
    let weights: Vec<(String, Vec<u8>)> = ["blk.0.w", "blk.1.w", "out.w"]
        .iter()
        .map(|n| (n.to_string(), random_weights(&mut rng, DType::Q8_0, D * D)))
        .collect();
    let xb = f32_bytes(&rng.vec(D * 2));
    let ib = i32_bytes(&[0, 3]);
    let ins: [(TensorId, &[u8]); 2] = [(x, &xb), (idx, &ib)];

    let mut reference = Scheduler::new(vec![dev("one")]).unwrap();
    // Layer 1 and the output on "gpu" (device 0), layer 0 on "cpu" (device 1), as `-ngl 2` of
    // two layers plus the head.
    let rule: PlacementRule = Arc::new(|name: &str| match layer(name) {
        Some(0) => Some(1),
        Some(_) => Some(0),
        None if name.starts_with("out.") => Some(0),
        None => None,
    });
    let mut s = Scheduler::new(vec![dev("gpu"), dev("cpu")]).unwrap();
    for sch in [&mut reference, &mut s] {
        for (n, b) in &weights {
            sch.bind_weight(n, DType::Q8_0, &[D, D], WeightBytes::from_vec(b.clone()))
                .unwrap();
        }
    }
    s.set_placement(rule);
    let mut reports = Vec::new();
    s.upload_placed_weights(&mut |done, total| reports.push((done, total)))
        .unwrap();
    let wbytes = weights[0].1.len() as u64;
    assert_eq!(reports.last(), Some(&(3 * wbytes, 3 * wbytes)));
    let before = s.usage();
    assert_eq!(before[0].weights, 2 * wbytes, "blk.1.w and out.w");
    assert_eq!(before[1].weights, wbytes, "blk.0.w");

    for _ in 0..2 {
        reference.run(&g, &ins).unwrap();
        s.run(&g, &ins).unwrap();
        assert_eq!(s.output_f32(z).unwrap(), reference.output_f32(z).unwrap());
    }
    // No weight was uploaded lazily; each cache lives with its layer.
    let after = s.usage();
    assert_eq!(after[0].weights, before[0].weights);
    assert_eq!(after[1].weights, before[1].weights);
    assert_eq!(after[1].persistent, after[0].persistent);
    assert!(after[0].persistent > 0);

    let sched = s.last_schedule().unwrap();
    let on = |op: &str| -> Vec<usize> {
        g.tensors()
            .iter()
            .enumerate()
            .filter(|(_, t)| t.op.name() == op)
            .filter_map(|(i, _)| sched.device_of[i])
            .collect()
    };
    assert_eq!(on("mul_mat"), vec![1, 0, 0]);
    // gelu, set_rows and the residual add follow their layer's matmul.
    assert_eq!(on("gelu"), vec![1, 0]);
    assert_eq!(on("set_rows"), vec![1, 0]);
    assert_eq!(on("add"), vec![1, 0]);
}

#[test]
fn without_a_rule_the_first_supporting_device_wins() {
    let mut rng = Rng::new(6);
    let mut g = Graph::new();
    let (x, idx, _) = model(&mut g);
    let mut s = Scheduler::new(vec![dev("gpu"), dev("cpu")]).unwrap();
    for n in ["blk.0.w", "blk.1.w", "out.w"] {
        let b = random_weights(&mut rng, DType::Q8_0, D * D);
        s.bind_weight(n, DType::Q8_0, &[D, D], WeightBytes::from_vec(b))
            .unwrap();
    }
    // Nothing placed: nothing uploaded up front.
    s.upload_placed_weights(&mut |_, _| {}).unwrap();
    assert!(s.usage().iter().all(|u| u.weights == 0));
    let xb = f32_bytes(&rng.vec(D * 2));
    let ib = i32_bytes(&[1, 2]);
    s.run(&g, &[(x, &xb), (idx, &ib)]).unwrap();
    let sched = s.last_schedule().unwrap();
    assert!(sched.splits.iter().all(|(d, _)| *d == 0));
}

#[test]
fn keyed_runs_reuse_their_preparation_and_stay_exact() {
    let mut rng = Rng::new(7);
    let mut g = Graph::new();
    let (x, idx, z) = model(&mut g);
    let mut s = Scheduler::new(vec![dev("gpu"), dev("cpu")]).unwrap();
    let mut reference = Scheduler::new(vec![dev("one")]).unwrap();
    for n in ["blk.0.w", "blk.1.w", "out.w"] {
        let b = random_weights(&mut rng, DType::Q8_0, D * D);
        for sch in [&mut s, &mut reference] {
            sch.bind_weight(n, DType::Q8_0, &[D, D], WeightBytes::from_vec(b.clone()))
                .unwrap();
        }
    }
    s.set_placement(Arc::new(|name: &str| {
        layer(name).map(|l| if l == 0 { 1 } else { 0 })
    }));
    // Keyed, keyed again (reuse), unkeyed in between, keyed again: each equals a fresh run.
    for (step, key) in [Some(3), Some(3), None, Some(3), Some(4)]
        .into_iter()
        .enumerate()
    {
        let xb = f32_bytes(&rng.vec(D * 2));
        let ib = i32_bytes(&[(step % 4) as i32, ((step + 1) % 4) as i32]);
        let ins: [(TensorId, &[u8]); 2] = [(x, &xb), (idx, &ib)];
        s.run_keyed(key, &g, &ins).unwrap();
        reference.run(&g, &ins).unwrap();
        assert_eq!(
            s.output_f32(z).unwrap(),
            reference.output_f32(z).unwrap(),
            "step {step}"
        );
    }
    // A missing input is still an error on a reused preparation.
    let xb = f32_bytes(&rng.vec(D * 2));
    assert!(s.run_keyed(Some(4), &g, &[(x, &xb)]).is_err());
}

/// Host devices read their placed weights where they are bound (a mapped model file in
/// practice): no second copy in host memory. Devices of other memory get their own copies.
#[test]
fn host_devices_bind_placed_weights_without_copying() {
    let mut rng = Rng::new(9);
    let mut g = Graph::new();
    let (x, idx, z) = model(&mut g);
    let owners: Vec<(String, Arc<Vec<u8>>)> = ["blk.0.w", "blk.1.w", "out.w"]
        .iter()
        .map(|n| {
            let b = random_weights(&mut rng, DType::Q8_0, D * D);
            (n.to_string(), Arc::new(b))
        })
        .collect();
    let bind = |s: &mut Scheduler| {
        for (n, o) in &owners {
            let owner: Arc<dyn AsRef<[u8]> + Send + Sync> = o.clone();
            let wb = WeightBytes::new(owner, 0..o.len()).unwrap();
            s.bind_weight(n, DType::Q8_0, &[D, D], wb).unwrap();
        }
    };
    let refs = |i: usize| Arc::strong_count(&owners[i].1);

    // Layer 0 on a host device (1), the rest on a device with its own memory (0).
    let other = DummyDevice::new("gpu", |_| true);
    let devices: Vec<Arc<dyn Device>> = vec![Arc::new(other), dev("cpu")];
    let mut s = Scheduler::new(devices).unwrap();
    bind(&mut s);
    let bound = (refs(0), refs(1));
    s.set_placement(Arc::new(|name: &str| match layer(name) {
        Some(0) => Some(1),
        _ => Some(0),
    }));
    s.upload_placed_weights(&mut |_, _| {}).unwrap();
    assert_eq!(
        refs(0),
        bound.0 + 1,
        "blk.0.w is read in place by the host device"
    );
    assert_eq!(refs(1), bound.1, "blk.1.w is copied to the other device");

    // And the host device computes from those bytes like the single-device executor.
    let mut reference = Scheduler::new(vec![dev("one")]).unwrap();
    bind(&mut reference);
    let mut host_only = Scheduler::new(vec![dev("cpu")]).unwrap();
    bind(&mut host_only);
    host_only.set_placement(Arc::new(|_: &str| Some(0)));
    host_only.upload_placed_weights(&mut |_, _| {}).unwrap();
    let xb = f32_bytes(&rng.vec(D * 2));
    let ib = i32_bytes(&[0, 3]);
    let ins: [(TensorId, &[u8]); 2] = [(x, &xb), (idx, &ib)];
    reference.run(&g, &ins).unwrap();
    host_only.run(&g, &ins).unwrap();
    assert_eq!(
        host_only.output_f32(z).unwrap(),
        reference.output_f32(z).unwrap()
    );
}

/// What a placement budgets for activations is what the scheduler allocates: on an attention
/// block's head (q and k products of one input, roped with one set of positions: two launch
/// groups, whose nodes may run together and so never work in place) the scheduler's arena is
/// [`planned_peak`], which the ungrouped plan undercounts.
#[test]
fn the_arena_is_the_planned_peak_with_launch_groups() {
    use rocmforge_ggml_graph::plan::plan;
    use rocmforge_ggml_graph::sched::planned_peak;
    use rocmforge_ggml_graph::tensor::{RopeMode, RopeParams};
    const T: usize = 8;
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[D, T]).unwrap();
    let pos = g.input("pos", DType::I32, &[T]).unwrap();
    let n = g.rms_norm(x, 1e-6).unwrap();
    let mut prods = Vec::new();
    for name in ["q", "k"] {
        let w = g
            .weight(&format!("blk.0.{name}"), DType::F32, &[D, D])
            .unwrap();
        let p = g.mul_mat(w, n).unwrap();
        prods.push(g.reshape(p, &[16, D / 16, T]).unwrap());
    }
    let rope = RopeParams::new(RopeMode::Neox, 16, 10000.0, 1.0);
    let roped: Vec<TensorId> = (prods.iter())
        .map(|&p| g.rope(p, pos, rope, None).unwrap())
        .collect();
    let y = g.add(roped[0], roped[1]).unwrap();
    g.mark_output(y).unwrap();
    assert!(
        planned_peak(&g) > plan(&g).peak,
        "the groups keep more alive"
    );

    let mut s = Scheduler::new(vec![dev("cpu")]).unwrap();
    let mut rng = 7u32;
    for name in ["q", "k"] {
        let vals: Vec<u8> = (0..D * D)
            .flat_map(|_| {
                rng = rng.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((rng >> 8) as f32 / (1u32 << 24) as f32 - 0.5).to_le_bytes()
            })
            .collect();
        s.bind_weight(
            &format!("blk.0.{name}"),
            DType::F32,
            &[D, D],
            WeightBytes::from_vec(vals),
        )
        .unwrap();
    }
    let input: Vec<u8> = (0..D * T)
        .flat_map(|i| (i as f32 * 0.01).to_le_bytes())
        .collect();
    let positions: Vec<u8> = (0..T as i32).flat_map(|p| p.to_le_bytes()).collect();
    s.run(&g, &[(x, &input), (pos, &positions)]).unwrap();
    assert_eq!(s.usage()[0].arena, planned_peak(&g) as u64);
}
