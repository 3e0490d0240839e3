//! GPU-against-CPU checks of the grouped norm launches: a post-norm with the residual add and
//! the next norm (`rms_norm_add_f32`), and two independent norms (`rms_norm2_f32`).

use std::sync::Arc;

use super::{f32_bytes, hip, nmse, quant_bytes, Rng};
use crate::backend::{CpuDevice, Device};
use crate::cpu::CpuBackend;
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::sched::Scheduler;
use crate::tensor::{DType, TensorId};

type Weights = Vec<(String, DType, Vec<usize>, Vec<u8>)>;

/// Runs `g` (optimized) on a GPU-first and a CPU-only scheduler; returns the grouped launches the
/// GPU run made and both runs' `outs`.
fn run_both(
    g: &mut Graph,
    weights: &Weights,
    inputs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
) -> Option<(usize, Vec<Vec<Vec<f32>>>)> {
    let h = hip()?;
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    crate::opt::optimize(g);
    let before = h.grouped_launches();
    let mut res = Vec::new();
    for devices in [vec![h.clone() as Arc<dyn Device>, cpu.clone()], vec![cpu]] {
        let mut s = Scheduler::new(devices).expect("scheduler");
        for (name, dt, shape, bytes) in weights {
            s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                .expect("bind");
        }
        let ins: Vec<(TensorId, &[u8])> = inputs.iter().map(|(i, b)| (*i, b.as_slice())).collect();
        s.run(g, &ins).expect("run");
        res.push(
            outs.iter()
                .map(|&o| s.output_f32(o).expect("output"))
                .collect(),
        );
    }
    Some((h.grouped_launches() - before, res))
}

/// A post-norm, the residual add after it and the next norm (`rms_norm(a) * w1 + x`, then
/// `rms_norm(sum) * w2` read by a Q8_0 mat-vec through the quantization the launch leaves) as one
/// grouped launch, against the CPU; the add's operands either way round, with and without the
/// next norm, decode and prompt row counts.
#[test]
fn grouped_norm_add_norm_matches_cpu() {
    let mut rng = Rng(0x0a0b_0c0d_1234_5678);
    for (k, m, next, swap) in [
        (640usize, 1usize, true, false),
        (640, 2, true, true),
        (1024, 1, false, false),
        (640, 12, true, false),
        (256, 3, false, true),
    ] {
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &[k, m]).expect("a");
        let x = g.input("x", DType::F32, &[k, m]).expect("x");
        let w1 = g.weight("w1", DType::F32, &[k]).expect("w1");
        let nr = g.rms_norm(a, 1e-6).expect("norm");
        let n = g.mul(nr, w1).expect("mul");
        let y = if swap { g.add(x, n) } else { g.add(n, x) }.expect("add");
        g.mark_output(y).expect("out");
        let mut outs = vec![y];
        let mut weights: Weights = vec![("w1".into(), DType::F32, vec![k], f32_bytes(&rng.vec(k)))];
        if next {
            let w2 = g.weight("w2", DType::F32, &[k]).expect("w2");
            let hn = g.rms_norm(y, 1e-5).expect("norm2");
            let hh = g.mul(hn, w2).expect("mul2");
            let wq = g.weight("wq", DType::Q8_0, &[k, 48]).expect("wq");
            let p = g.mul_mat(wq, hh).expect("mm");
            g.mark_output(hh).expect("out");
            g.mark_output(p).expect("out");
            outs.extend([hh, p]);
            weights.push(("w2".into(), DType::F32, vec![k], f32_bytes(&rng.vec(k))));
            let wb = quant_bytes(DType::Q8_0, 48, k, &mut rng);
            weights.push(("wq".into(), DType::Q8_0, vec![k, 48], wb));
        }
        let inputs = [
            (a, f32_bytes(&rng.vec(k * m))),
            (x, f32_bytes(&rng.vec(k * m))),
        ];
        let Some((grouped, res)) = run_both(&mut g, &weights, &inputs, &outs) else {
            return;
        };
        assert_eq!(grouped, 1, "k={k} m={m} next={next}");
        for (i, (gpu, cpu)) in res[0].iter().zip(&res[1]).enumerate() {
            let e = nmse(gpu, cpu);
            println!("norm+add(+norm) k={k} m={m} next={next} swap={swap} #{i}: NMSE {e:.3e}");
            let tol = if i == 2 { 2e-3 } else { 1e-9 };
            assert!(e <= tol, "k={k} m={m} next={next} #{i}: NMSE {e:.3e}");
        }
    }
}

/// Per-head q and k norms (rows of 256 values, 4 and 1 heads per token) as one grouped launch,
/// against the CPU, for one and several tokens.
#[test]
fn grouped_norm_pair_matches_cpu() {
    let mut rng = Rng(0x1111_2222_3333_4444);
    for m in [1usize, 3] {
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &[256, 4, m]).expect("q");
        let k = g.input("k", DType::F32, &[256, 1, m]).expect("k");
        let wq = g.weight("wq", DType::F32, &[256]).expect("wq");
        let wk = g.weight("wk", DType::F32, &[256]).expect("wk");
        let qn = g.rms_norm(q, 1e-6).expect("qn");
        let qn = g.mul(qn, wq).expect("qm");
        let kn = g.rms_norm(k, 1e-6).expect("kn");
        let kn = g.mul(kn, wk).expect("km");
        g.mark_output(qn).expect("out");
        g.mark_output(kn).expect("out");
        let weights: Weights = vec![
            ("wq".into(), DType::F32, vec![256], f32_bytes(&rng.vec(256))),
            ("wk".into(), DType::F32, vec![256], f32_bytes(&rng.vec(256))),
        ];
        let inputs = [
            (q, f32_bytes(&rng.vec(1024 * m))),
            (k, f32_bytes(&rng.vec(256 * m))),
        ];
        let Some((grouped, res)) = run_both(&mut g, &weights, &inputs, &[qn, kn]) else {
            return;
        };
        assert_eq!(grouped, 1, "m={m}");
        for (i, (gpu, cpu)) in res[0].iter().zip(&res[1]).enumerate() {
            let e = nmse(gpu, cpu);
            println!("q/k norm pair m={m} #{i}: NMSE {e:.3e}");
            assert!(e <= 1e-9, "m={m} #{i}: NMSE {e:.3e}");
        }
    }
}
