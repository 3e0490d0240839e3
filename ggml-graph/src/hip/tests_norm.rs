//! GPU-against-CPU checks of the grouped norm launches: a post-norm with the residual add and
//! the next norm (`rms_norm_add_f32`), two independent norms (`rms_norm2_f32`), and the q and k
//! norms with their ropes and cache writes (`norm_rope_kv_*`); the q, k and v projections with
//! their ropes and cache writes (`matvec_q4_k_rope_kv`, `matvec_q4_k_q6_k_rope_kv`).

use std::sync::Arc;

use super::{f16_cache_writes, f32_bytes, hip, nmse, weight, weight_bytes, Rng, Weight};
use crate::backend::{CpuDevice, Device};
use crate::cpu::CpuBackend;
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::sched::Scheduler;
use crate::tensor::{DType, RopeMode, RopeParams, TensorId};

type Weights = Vec<Weight>;

/// Runs `g` (optimized) on a GPU-first and a CPU-only scheduler; returns the grouped launches the
/// GPU run made and both runs' `outs`.
fn run_both(
    g: &mut Graph,
    weights: &Weights,
    inputs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
) -> Option<(usize, Vec<Vec<Vec<f32>>>)> {
    let h = hip()?;
    crate::opt::optimize(g);
    let before = h.grouped_launches();
    let gpu = run_on(
        vec![h.clone() as Arc<dyn Device>, cpu()],
        g,
        weights,
        inputs,
        outs,
    );
    let grouped = h.grouped_launches() - before;
    Some((
        grouped,
        vec![gpu, run_on(vec![cpu()], g, weights, inputs, outs)],
    ))
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
            let wb = weight_bytes(DType::Q8_0, 48, k, &mut rng);
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

/// Per-head q and k norms, their ropes and the K and V cache writes of a step (Gemma 3's and
/// Qwen 3's attention input) as one grouped launch, against the CPU: the roped q and k and both
/// caches after the write, NeoX and normal modes, partial rotation, f16 and f32 caches, one and
/// several tokens (a prompt's 40) at positions past 0.
#[test]
fn grouped_norm_rope_kv_matches_cpu() {
    let mut rng = Rng(0x0bad_cafe_f00d_d00d);
    for (hd, nh, nkv, nt, mode, n_dims, cache) in [
        (
            256usize,
            4usize,
            1usize,
            1usize,
            RopeMode::Neox,
            256usize,
            DType::F16,
        ),
        (64, 4, 2, 3, RopeMode::Normal, 64, DType::F16),
        (128, 2, 2, 1, RopeMode::Neox, 64, DType::F32),
        // A prompt: the V rows' writes spread over many blocks.
        (128, 4, 2, 40, RopeMode::Neox, 128, DType::F16),
    ] {
        // Every cache row is written (slots 0..nt), so whole caches compare; positions start past 0.
        let n_ctx = nt;
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &[hd, nh, nt]).expect("q");
        let k = g.input("k", DType::F32, &[hd, nkv, nt]).expect("k");
        let v = g.input("v", DType::F32, &[hd * nkv, nt]).expect("v");
        let pos = g.input("pos", DType::I32, &[nt]).expect("pos");
        let slot = g.input("slot", DType::I32, &[nt]).expect("slot");
        let wq = g.weight("wq", DType::F32, &[hd]).expect("wq");
        let wk = g.weight("wk", DType::F32, &[hd]).expect("wk");
        let qn = g.rms_norm(q, 1e-6).expect("qn");
        let qn = g.mul(qn, wq).expect("qm");
        let kn = g.rms_norm(k, 1e-6).expect("kn");
        let kn = g.mul(kn, wk).expect("km");
        let rp = RopeParams::new(mode, n_dims, 10000.0, 1.0);
        let rq = g.rope(qn, pos, rp, None).expect("rope q");
        let rk = g.rope(kn, pos, rp, None).expect("rope k");
        let ck = g.persistent("ck", cache, &[hd * nkv, n_ctx]).expect("ck");
        let cv = g.persistent("cv", cache, &[hd * nkv, n_ctx]).expect("cv");
        let kr = g.reshape(rk, &[hd * nkv, nt]).expect("kr");
        let kc = g.set_rows(ck, kr, slot).expect("set k");
        let vc = g.set_rows(cv, v, slot).expect("set v");
        let outs = [rq, rk, kc, vc];
        for o in outs {
            g.mark_output(o).expect("out");
        }
        let w = |rng: &mut Rng| -> Vec<f32> { rng.vec(hd).iter().map(|x| 1.0 + 0.3 * x).collect() };
        let weights: Weights = vec![
            ("wq".into(), DType::F32, vec![hd], f32_bytes(&w(&mut rng))),
            ("wk".into(), DType::F32, vec![hd], f32_bytes(&w(&mut rng))),
        ];
        let positions: Vec<i32> = (0..nt as i32).map(|p| 3 + 2 * p).collect();
        let slots: Vec<i32> = (0..nt as i32).rev().collect();
        let inputs = [
            (q, f32_bytes(&rng.vec(hd * nh * nt))),
            (k, f32_bytes(&rng.vec(hd * nkv * nt))),
            (v, f32_bytes(&rng.vec(hd * nkv * nt))),
            (pos, bytemuck::cast_slice(&positions).to_vec()),
            (slot, bytemuck::cast_slice(&slots).to_vec()),
        ];
        let Some((grouped, res)) = run_both(&mut g, &weights, &inputs, &outs) else {
            return;
        };
        assert_eq!(grouped, 1, "hd={hd} nt={nt} {mode:?}");
        for (i, (gpu, cpu)) in res[0].iter().zip(&res[1]).enumerate() {
            let e = nmse(gpu, cpu);
            println!("norm+rope+kv hd={hd} nh={nh} nkv={nkv} nt={nt} {mode:?} n_dims={n_dims} {cache:?} #{i}: NMSE {e:.3e}");
            // The f16 caches round the same values on both sides; sincos differs in the last bits.
            assert!(e <= 1e-9, "hd={hd} nt={nt} {mode:?} #{i}: NMSE {e:.3e}");
        }
    }
}

/// The q, k and v projections of a decode step (Q4_K, v also in Q6_K as Q4_K_M keeps it), the
/// normal-mode ropes of q and k and the K and V writes into f16 caches as one grouped mat-vec
/// launch, against the CPU: the plain projections, the roped q and k and both caches after the
/// write; GQA, partial rotation, rope frequency factors, YaRN, one and several tokens at
/// positions past 0 written to slots in another order.
#[test]
fn grouped_projections_rope_kv_match_cpu() {
    let mut rng = Rng(0x5eed_0f0f_7a7a_1234);
    // (model width, head dim, heads, kv heads, tokens, v type, rotated dims, freq factors, yarn)
    for (dm, hd, nh, nkv, nt, vt, n_dims, ff, yarn) in [
        (
            256usize,
            64usize,
            4usize,
            2usize,
            1usize,
            DType::Q4_K,
            64usize,
            false,
            false,
        ),
        (512, 128, 4, 1, 1, DType::Q6_K, 128, true, false),
        (256, 64, 4, 4, 3, DType::Q6_K, 32, false, true),
        (256, 32, 8, 2, 2, DType::Q4_K, 32, true, true),
    ] {
        let n_ctx = nt + 2;
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[dm, nt]).expect("x");
        let pos = g.input("pos", DType::I32, &[nt]).expect("pos");
        let slot = g.input("slot", DType::I32, &[nt]).expect("slot");
        let mm = |g: &mut Graph, name: &str, dt: DType, rows: usize| {
            let w = g.weight(name, dt, &[dm, rows]).expect("weight");
            g.mul_mat(w, x).expect("mul_mat")
        };
        let q = mm(&mut g, "wq", DType::Q4_K, hd * nh);
        let k = mm(&mut g, "wk", DType::Q4_K, hd * nkv);
        let v = mm(&mut g, "wv", vt, hd * nkv);
        let q3 = g.reshape(q, &[hd, nh, nt]).expect("q3");
        let k3 = g.reshape(k, &[hd, nkv, nt]).expect("k3");
        let mut rp = RopeParams::new(RopeMode::Normal, n_dims, 500000.0, 0.5);
        if yarn {
            rp.ext_factor = 1.0;
            rp.attn_factor = 1.0;
            rp.n_ctx_orig = 64;
        }
        let factors = ff.then(|| {
            g.weight("rope_freqs", DType::F32, &[n_dims / 2])
                .expect("ff")
        });
        let rq = g.rope(q3, pos, rp, factors).expect("rope q");
        let rk = g.rope(k3, pos, rp, factors).expect("rope k");
        let (kc, vc) = f16_cache_writes(&mut g, [rk, v], slot, hd * nkv, nt, n_ctx);
        let outs = [q, k, v, rq, rk, kc, vc];
        for o in outs {
            g.mark_output(o).expect("out");
        }
        let mut weights: Weights = vec![
            weight("wq", DType::Q4_K, dm, hd * nh, &mut rng),
            weight("wk", DType::Q4_K, dm, hd * nkv, &mut rng),
            weight("wv", vt, dm, hd * nkv, &mut rng),
        ];
        if ff {
            let f: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + 0.5 * i as f32).collect();
            weights.push((
                "rope_freqs".into(),
                DType::F32,
                vec![n_dims / 2],
                f32_bytes(&f),
            ));
        }
        let positions: Vec<i32> = (0..nt as i32).map(|p| 40 + 7 * p).collect();
        let slots: Vec<i32> = (0..nt as i32).map(|p| (nt as i32 + 1) - p).collect();
        let inputs = [
            (x, f32_bytes(&rng.vec(dm * nt))),
            (pos, bytemuck::cast_slice(&positions).to_vec()),
            (slot, bytemuck::cast_slice(&slots).to_vec()),
        ];
        let Some(h) = hip() else { return };
        crate::opt::optimize(&mut g);
        // The fused launch, then the projections and the rope launch apart, then the CPU.
        let mut res = Vec::new();
        let mut grouped = Vec::new();
        for fused in [true, false] {
            assert_eq!(
                h.set_qkv_rope(fused),
                fused,
                "the device was opened with `HipOptions::qkv_rope` off"
            );
            let before = h.grouped_launches();
            res.push(run_on(
                vec![h.clone() as Arc<dyn Device>, cpu()],
                &g,
                &weights,
                &inputs,
                &outs,
            ));
            grouped.push(h.grouped_launches() - before);
        }
        h.set_qkv_rope(true);
        res.push(run_on(vec![cpu()], &g, &weights, &inputs, &outs));
        // One launch for all seven nodes, or the projections' and the ropes' apart.
        assert_eq!(
            grouped,
            [1, 2],
            "hd={hd} nt={nt} v {vt:?}: grouped launches"
        );
        for (i, ((fused, apart), cpu)) in res[0].iter().zip(&res[1]).zip(&res[2]).enumerate() {
            let (e_apart, e_cpu) = (nmse(fused, apart), nmse(fused, cpu));
            println!("qkv+rope+kv dm={dm} hd={hd} nh={nh} nkv={nkv} nt={nt} v {vt:?} n_dims={n_dims} ff={ff} yarn={yarn} #{i}: NMSE {e_apart:.3e} against the rope launch, {e_cpu:.3e} against the CPU");
            // The same mat-vec values rotated by the same angle function; the CPU quantizes the
            // activations differently (as for any mat-vec). Cache rows outside the written slots
            // are zero everywhere.
            assert!(
                e_apart <= 1e-12,
                "hd={hd} nt={nt} v {vt:?} #{i}: NMSE {e_apart:.3e} against the rope launch"
            );
            assert!(
                e_cpu <= 2e-3,
                "hd={hd} nt={nt} v {vt:?} #{i}: NMSE {e_cpu:.3e} against the CPU"
            );
        }
    }
}

fn cpu() -> Arc<dyn Device> {
    Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )))
}

/// `outs` of `g` run on a scheduler over `devices`.
fn run_on(
    devices: Vec<Arc<dyn Device>>,
    g: &Graph,
    weights: &Weights,
    inputs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
) -> Vec<Vec<f32>> {
    let mut s = Scheduler::new(devices).expect("scheduler");
    for (name, dt, shape, bytes) in weights {
        s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
            .expect("bind");
    }
    let ins: Vec<(TensorId, &[u8])> = inputs.iter().map(|(i, b)| (*i, b.as_slice())).collect();
    s.run(g, &ins).expect("run");
    outs.iter()
        .map(|&o| s.output_f32(o).expect("output"))
        .collect()
}
