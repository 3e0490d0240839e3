//! Two GPUs in one scheduler, as a layer split uses them: each "layer" of a small graph reads
//! weights placed on its own GPU, so the activations cross from the first GPU to the second by a
//! device-to-device copy every run, and the outputs must match the CPU's. Skipped below two GPUs
//! (`ROCMFORGE_REQUIRE_GPUS=2` makes that a failure).

use std::sync::Arc;

use super::{f32_bytes, hip, nmse, weight, Rng};
use crate::backend::{CpuDevice, Device};
use crate::cpu::CpuBackend;
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::hip::HipDevice;
use crate::sched::{PlacementRule, Scheduler};
use crate::tensor::DType;

#[test]
fn two_gpus_pass_activations_device_to_device() {
    let Some(h0) = hip() else {
        return;
    };
    if hip_ffi::testing::need_gpus(super::super::device_count(), 2).is_none() {
        return;
    }
    let h1 = Arc::new(HipDevice::new(1).expect("GPU 1"));
    let peer = h0.enable_peer_access(&h1).expect("peer access 0 -> 1");
    h1.enable_peer_access(&h0).expect("peer access 1 -> 0");
    println!("peer access between GPU 0 and 1: {peer}");
    let mut rng = Rng(0x2_6bu64 << 20 | 0x51);
    let k = 512usize;
    let mut g = Graph::new();
    let w0 = g.weight("blk.0.w", DType::Q8_0, &[k, k]).expect("w0");
    let w1 = g.weight("blk.1.w", DType::Q8_0, &[k, k]).expect("w1");
    let x = g.input("x", DType::F32, &[k, 1]).expect("x");
    let y0 = g.mul_mat(w0, x).expect("y0");
    let a = g.add(y0, x).expect("a");
    let y1 = g.mul_mat(w1, a).expect("y1");
    let out = g.add(y1, a).expect("out");
    g.mark_output(out).expect("mark");
    let weights = [
        weight("blk.0.w", DType::Q8_0, k, k, &mut rng),
        weight("blk.1.w", DType::Q8_0, k, k, &mut rng),
    ];
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let mut two = Scheduler::new(vec![
        h0.clone() as Arc<dyn Device>,
        h1.clone() as Arc<dyn Device>,
        cpu.clone(),
    ])
    .expect("two-GPU scheduler");
    let rule: PlacementRule = Arc::new(|name: &str| match name {
        "blk.0.w" => Some(0),
        "blk.1.w" => Some(1),
        _ => None,
    });
    two.set_placement(rule);
    let mut one = Scheduler::new(vec![cpu]).expect("CPU scheduler");
    for s in [&mut two, &mut one] {
        for (name, dt, shape, bytes) in &weights {
            s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                .expect("bind");
        }
    }
    two.upload_placed_weights(&mut |_, _| {}).expect("upload");
    for step in 0..3 {
        let xb = f32_bytes(&rng.vec(k));
        two.run(&g, &[(x, &xb)]).expect("two-GPU run");
        one.run(&g, &[(x, &xb)]).expect("CPU run");
        let got = two.output_f32(out).expect("two-GPU output");
        let want = one.output_f32(out).expect("CPU output");
        let e = nmse(&got, &want);
        println!("step {step}: NMSE {e:.3e}");
        assert!(e <= 2e-3, "step {step}: NMSE {e:.3e}");
    }
    let sched = two.last_schedule().expect("schedule");
    let on: Vec<usize> = g
        .tensors()
        .iter()
        .enumerate()
        .filter(|(_, t)| t.op.name() == "mul_mat")
        .filter_map(|(i, _)| sched.device_of[i])
        .collect();
    assert_eq!(on, vec![0, 1], "each layer on its GPU");
    assert!(two.copies_made() >= 3, "one crossing per run at least");
    let usage = two.usage();
    assert!(usage[0].weights > 0 && usage[1].weights > 0, "{usage:?}");
}

/// A tensor split's sum: a partial product on each GPU, their `all_reduce` and a product of the
/// sum on each GPU, through NCCL/RCCL (no partial copied) and through peer copies, against the
/// CPU; and the all-reduce kernel path on one GPU (three local partials).
#[test]
fn two_gpus_all_reduce_partials_in_place() {
    let Some(h0) = hip() else {
        return;
    };
    let k = 512usize;
    let mut rng = Rng(0x5eed_0042);
    let build = |n_parts: usize| {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[k, 3]).expect("x");
        let parts: Vec<_> = (0..n_parts)
            .rev()
            .map(|p| {
                let w = g.weight(&format!("w{p}"), DType::Q8_0, &[k, k]).expect("w");
                g.mul_mat(w, x).expect("partial")
            })
            .collect();
        let s = g.all_reduce(&parts).expect("all_reduce");
        g.mark_output(s).expect("mark");
        let outs: Vec<_> = (0..n_parts)
            .map(|p| {
                let v = g.weight(&format!("v{p}"), DType::Q8_0, &[k, k]).expect("v");
                let y = g.mul_mat(v, s).expect("next");
                g.mark_output(y).expect("mark");
                y
            })
            .collect();
        (g, x, s, outs)
    };
    let weights: Vec<_> = (0..3)
        .flat_map(|p| [format!("w{p}"), format!("v{p}")])
        .map(|n| weight(&n, DType::Q8_0, k, k, &mut rng))
        .collect();
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let bind = |s: &mut Scheduler| {
        for (name, dt, shape, bytes) in &weights {
            s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                .expect("bind");
        }
    };
    let check = |what: &str, s: &Scheduler, one: &Scheduler, ids: &[crate::TensorId]| {
        for &id in ids {
            let got = s.output_f32(id).expect("output");
            let want = one.output_f32(id).expect("CPU output");
            let e = nmse(&got, &want);
            println!("{what}: node {}: NMSE {e:.3e}", id.index());
            assert!(e <= 2e-3, "{what}: NMSE {e:.3e}");
        }
    };
    // One GPU: the node sums three partials itself.
    let (g, x, s, outs) = build(3);
    let mut one = Scheduler::new(vec![cpu.clone()]).expect("CPU scheduler");
    bind(&mut one);
    let mut gpu = Scheduler::new(vec![h0.clone() as Arc<dyn Device>, cpu.clone()]).expect("GPU");
    bind(&mut gpu);
    let xb = f32_bytes(&rng.vec(k * 3));
    one.run(&g, &[(x, &xb)]).expect("CPU run");
    gpu.run(&g, &[(x, &xb)]).expect("GPU run");
    assert_eq!(
        gpu.last_schedule().expect("schedule").device_of[s.index()],
        Some(0)
    );
    let mut ids = vec![s];
    ids.extend(&outs);
    check("one GPU", &gpu, &one, &ids);

    if hip_ffi::testing::need_gpus(super::super::device_count(), 2).is_none() {
        return;
    }
    let h1 = Arc::new(HipDevice::new(1).expect("GPU 1"));
    h0.enable_peer_access(&h1).expect("peer access 0 -> 1");
    h1.enable_peer_access(&h0).expect("peer access 1 -> 0");
    let (g, x, s, outs) = build(2);
    let mut ids = vec![s];
    ids.extend(&outs);
    let rule: PlacementRule = Arc::new(|name: &str| name[1..].parse().ok());
    let coll = hip_ffi::testing::or_skip(crate::hip::HipCollective::new(
        &[(0, h0.clone()), (1, h1.clone())],
        &crate::CollectiveOptions::default(),
    ))
    .map(Arc::new);
    for by_nccl in [true, false] {
        let what = if by_nccl { "NCCL" } else { "peer copies" };
        let mut two = Scheduler::new(vec![
            h0.clone() as Arc<dyn Device>,
            h1.clone() as Arc<dyn Device>,
            cpu.clone(),
        ])
        .expect("two-GPU scheduler");
        bind(&mut two);
        two.set_placement(rule.clone());
        if by_nccl {
            let Some(c) = &coll else {
                continue;
            };
            println!(
                "collective: {}",
                crate::backend::Collective::name(c.as_ref())
            );
            two.set_collective(Some(c.clone()));
        }
        for step in 0..3 {
            let xb = f32_bytes(&rng.vec(k * 3));
            one.run(&g, &[(x, &xb)]).expect("CPU run");
            two.run(&g, &[(x, &xb)]).expect("two-GPU run");
            check(&format!("{what} step {step}"), &two, &one, &ids);
        }
        let sched = two.last_schedule().expect("schedule");
        assert_eq!(sched.collective[s.index()], by_nccl, "{what}");
        if let Some(c) = coll.as_ref().filter(|_| by_nccl) {
            c.check().expect("no asynchronous collective error");
        }
    }
}

/// A tensor split run as ranks in one process: a scheduler per GPU (every visible one), each
/// with its rank of one communicator, each graph summing its one partial with the other ranks'.
/// Keyed runs from a thread per rank capture the graph, all-reduce included, on the second
/// run; later runs replay it from this one thread, rank after rank (nothing waits). Every
/// rank's outputs match the CPU's sum.
/// Both all-reduces run: the collective library's and the peer all-reduce (where it can be
/// made; this message of 1536 floats takes it), whose ranks end with identical bytes.
#[test]
fn ranks_capture_and_replay_their_all_reduces() {
    let Some(h0) = hip() else {
        return;
    };
    let n = super::super::device_count();
    if hip_ffi::testing::need_gpus(n, 2).is_none() {
        return;
    }
    let gpus: Vec<Arc<HipDevice>> = std::iter::once(h0)
        .chain((1..n).map(|i| Arc::new(HipDevice::new(i as i32).expect("GPU"))))
        .collect();
    for kind in [crate::AllReduceKind::Nccl, crate::AllReduceKind::Peer] {
        ranks_capture_and_replay(&gpus, kind);
    }
}

fn ranks_capture_and_replay(gpus: &[Arc<HipDevice>], kind: crate::AllReduceKind) {
    let n = gpus.len();
    let opts = crate::CollectiveOptions {
        all_reduce: kind,
        ..crate::CollectiveOptions::default()
    };
    let peer = kind == crate::AllReduceKind::Peer;
    if peer && gpus[0].gpu().info().platform == gpu_mem::Platform::Amd {
        println!("{kind:?}: skipped: no peer all-reduce on AMD yet");
        return;
    }
    let Some(colls) = hip_ffi::testing::or_skip(crate::hip::HipCollective::per_rank(gpus, &opts))
    else {
        return;
    };
    for c in &colls {
        let name = crate::backend::Collective::name(c);
        println!("{kind:?}: {name}");
        assert_eq!(name.starts_with("peer/"), peer, "{name}");
    }
    let colls: Vec<Arc<crate::hip::HipCollective>> = colls.into_iter().map(Arc::new).collect();
    let k = 512usize;
    let mut rng = Rng(0x7a_2024);
    let mut weights: Vec<_> = (0..n)
        .map(|r| weight(&format!("w{r}"), DType::Q8_0, k, k, &mut rng))
        .collect();
    weights.push(weight("v", DType::Q8_0, k, k, &mut rng));
    // Rank `r`'s graph, or (None) the whole sum on one device.
    let build = |rank: Option<usize>| {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[k, 3]).expect("x");
        let parts: Vec<_> = (0..n)
            .filter(|&p| rank.is_none_or(|r| r == p))
            .map(|p| {
                let w = g.weight(&format!("w{p}"), DType::Q8_0, &[k, k]).expect("w");
                g.mul_mat(w, x).expect("partial")
            })
            .collect();
        let s = g.all_reduce(&parts).expect("all_reduce");
        let v = g.weight("v", DType::Q8_0, &[k, k]).expect("v");
        let y = g.mul_mat(v, s).expect("y");
        g.mark_output(y).expect("mark");
        (g, x, y)
    };
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let bind = |s: &mut Scheduler| {
        for (name, dt, shape, bytes) in &weights {
            s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                .expect("bind");
        }
    };
    let mut one = Scheduler::new(vec![cpu.clone()]).expect("CPU scheduler");
    bind(&mut one);
    let whole = build(None);
    let graphs: Vec<_> = (0..n).map(|r| build(Some(r))).collect();
    let mut ranks: Vec<Scheduler> = gpus
        .iter()
        .zip(&colls)
        .map(|(h, c)| {
            let mut s = Scheduler::new(vec![h.clone() as Arc<dyn Device>]).expect("scheduler");
            bind(&mut s);
            s.set_collective(Some(c.clone() as Arc<dyn crate::backend::Collective>));
            s
        })
        .collect();
    for step in 0..4 {
        let xb = f32_bytes(&rng.vec(k * 3));
        one.run(&whole.0, &[(whole.1, &xb)]).expect("CPU run");
        let key = Some(7);
        let replay = ranks
            .iter()
            .zip(&graphs)
            .all(|(s, (g, _, _))| s.would_replay(key, g));
        assert_eq!(
            replay,
            step >= 2,
            "step {step}: replay from the third run on"
        );
        if replay {
            for (s, (g, x, _)) in ranks.iter_mut().zip(&graphs) {
                s.run_keyed(key, g, &[(*x, &xb)]).expect("replay");
            }
        } else {
            std::thread::scope(|sc| {
                let hs: Vec<_> = ranks
                    .iter_mut()
                    .zip(&graphs)
                    .map(|(s, (g, x, _))| {
                        let xb = &xb;
                        sc.spawn(move || s.run_keyed(key, g, &[(*x, xb)]))
                    })
                    .collect();
                for h in hs {
                    h.join().expect("rank thread").expect("rank run");
                }
            });
        }
        let want = one.output_f32(whole.2).expect("CPU output");
        let mut first: Option<Vec<f32>> = None;
        for (r, (s, (_, _, y))) in ranks.iter().zip(&graphs).enumerate() {
            let got = s.output_f32(*y).expect("rank output");
            let e = nmse(&got, &want);
            println!("{kind:?} step {step} rank {r}: NMSE {e:.3e}");
            assert!(e <= 2e-3, "{kind:?} step {step} rank {r}: NMSE {e:.3e}");
            // The same sum's bytes on every rank, through the same kernels on like GPUs.
            if peer {
                let f = first.get_or_insert_with(|| got.clone());
                assert!(
                    f.iter().zip(&got).all(|(a, b)| a.to_bits() == b.to_bits()),
                    "step {step} rank {r}: not rank 0's bytes"
                );
            }
        }
    }
    for (r, s) in ranks.iter().enumerate() {
        assert!(s.has_captured_graph(), "rank {r}: captured");
        assert_eq!(
            s.replays(),
            3,
            "rank {r}: the capture's run and two replays"
        );
    }
    for c in &colls {
        c.check().expect("no asynchronous collective error");
    }
}

/// Every visible GPU (2 or more) as a rank of the peer all-reduce.
fn peer_ranks(
    timeout: std::time::Duration,
) -> Option<(
    Vec<Arc<HipDevice>>,
    Vec<super::super::peer_reduce::PeerReduce>,
)> {
    let h0 = hip()?;
    let n = super::super::device_count();
    hip_ffi::testing::need_gpus(n, 2)?;
    let gpus: Vec<Arc<HipDevice>> = std::iter::once(h0)
        .chain((1..n).map(|i| Arc::new(HipDevice::new(i as i32).expect("GPU"))))
        .collect();
    if gpus[0].gpu().info().platform == gpu_mem::Platform::Amd {
        println!("skipped: no peer all-reduce on AMD yet");
        return None;
    }
    let peers =
        super::super::peer_reduce::PeerReduce::all(&gpus, timeout).expect("peer all-reduce");
    Some((gpus, peers))
}

/// The peer all-reduce over every visible GPU: back-to-back calls of several lengths (a decode
/// token's 4096 floats, its largest message, lengths that end in a partial float4, and one from
/// a buffer not 16-byte aligned), queued on every rank with no wait between them, leave every
/// rank with exactly the rank-order sum of the parts.
#[test]
fn peer_all_reduce_sums_the_parts_in_rank_order() {
    let Some((gpus, peers)) = peer_ranks(std::time::Duration::from_secs(30)) else {
        return;
    };
    let mut rng = Rng(0x9e37_79b9);
    let calls = [
        (4096usize, 0usize),
        (1001, 0),
        (super::super::peer_reduce::PEER_MAX_BYTES / 4, 0),
        (3, 0),
        (4096, 1),
        (4096, 0),
        (24, 0),
    ];
    // Per call, per rank: the part and its device buffer (`off` floats of padding first).
    let mut parts: Vec<Vec<(Vec<f32>, gpu_mem::DeviceBuffer<f32>)>> = Vec::new();
    for &(len, off) in &calls {
        let mut mine = Vec::new();
        for g in &gpus {
            let v = rng.vec(len);
            let mut b = gpu_mem::DeviceBuffer::<f32>::new(g.gpu(), off + len, "part").expect("buf");
            let stream = g.inner.sb.stream();
            let mut dst = b.slice_mut(off..off + len).expect("slice");
            stream.write(&v, &mut dst).expect("write");
            mine.push((v, b));
        }
        parts.push(mine);
    }
    for (c, &(len, off)) in calls.iter().enumerate() {
        for ((g, p), (_, b)) in gpus.iter().zip(&peers).zip(&parts[c]) {
            let x = gpu_mem::MemRange::of_buffer(b)
                .sub(off * 4, len * 4)
                .expect("range");
            p.launch(g, x).expect("launch");
        }
    }
    for (c, &(len, off)) in calls.iter().enumerate() {
        let mut want = parts[c][0].0.clone();
        for (v, _) in &parts[c][1..] {
            for (w, x) in want.iter_mut().zip(v) {
                *w += *x;
            }
        }
        for (r, (g, (_, b))) in gpus.iter().zip(&parts[c]).enumerate() {
            let mut got = vec![0f32; len];
            let stream = g.inner.sb.stream();
            stream
                .read(&b.slice(off..off + len).expect("slice"), &mut got)
                .expect("read");
            let same = got
                .iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(
                same,
                "call {c} ({len} floats) rank {r}: not the rank-order sum"
            );
        }
    }
    for p in &peers {
        assert_eq!(p.failure().expect("error word"), None);
    }
}

/// A rank whose peers never launch gives up after its timeout and reports it; nothing hangs.
#[test]
fn peer_all_reduce_reports_peers_that_never_arrive() {
    let Some((gpus, peers)) = peer_ranks(std::time::Duration::from_millis(200)) else {
        return;
    };
    let mut b = gpu_mem::DeviceBuffer::<f32>::new(gpus[0].gpu(), 4096, "part").expect("buf");
    let stream = gpus[0].inner.sb.stream();
    stream
        .write(&[1f32; 4096], &mut b.view_mut())
        .expect("write");
    peers[0]
        .launch(&gpus[0], gpu_mem::MemRange::of_buffer(&b))
        .expect("launch");
    stream.synchronize().expect("the launch ends");
    let why = peers[0].failure().expect("error word");
    println!("{why:?}");
    assert!(why.is_some_and(|w| w.contains("did not arrive")));
    assert_eq!(peers[1].failure().expect("error word"), None);
}
