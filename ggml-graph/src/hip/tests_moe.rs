//! GPU-against-CPU checks of the mixture-of-experts nodes and gpt-oss's ops: `mul_mat_id` for
//! every weight type the mat-vecs read (and MXFP4, f16, f32) on both of its ways (one launch over
//! the pairs; grouped by expert with the tile kernels, mat-vecs or gemm per expert), the routing
//! (`argsort_top_k`, `expert_weights` with and without normalisation, both gatings' graphs, ties),
//! `swiglu_oai`, MXFP4 products, and attention with sinks (contiguous and paged caches). Every
//! computing node must run on the GPU.

use std::sync::Arc;

use super::{cache_bytes, f32_bytes, hip, nmse, paged_case, weight_bytes, HipDevice, Rng, Weight};
use crate::backend::{CpuDevice, Device};
use crate::cpu::CpuBackend;
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::sched::Scheduler;
use crate::tensor::{AttnParams, DType, Op, TensorId};

/// Runs `g` on a GPU-first and on a CPU-only scheduler; returns both runs' `outs` (GPU first)
/// after checking that every computing node of the GPU run was placed on the GPU.
fn run_both(
    h: &Arc<HipDevice>,
    g: &Graph,
    weights: &[Weight],
    inputs: &[(TensorId, Vec<u8>)],
    outs: &[TensorId],
) -> [Vec<Vec<f32>>; 2] {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let mut res = Vec::new();
    for devices in [vec![h.clone() as Arc<dyn Device>, cpu.clone()], vec![cpu]] {
        let gpu_run = devices.len() == 2;
        let mut s = Scheduler::new(devices).expect("scheduler");
        for (name, dt, shape, bytes) in weights {
            s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                .expect("bind");
        }
        let ins: Vec<(TensorId, &[u8])> = inputs.iter().map(|(i, b)| (*i, b.as_slice())).collect();
        s.run(g, &ins).expect("run");
        if gpu_run {
            let sc = s.last_schedule().expect("schedule");
            for (i, t) in g.tensors().iter().enumerate() {
                if matches!(t.op, Op::Leaf(_) | Op::View) {
                    continue;
                }
                assert_eq!(
                    sc.device_of[i],
                    Some(0),
                    "{} (`{}`) did not run on the GPU",
                    t.op.name(),
                    t.name
                );
            }
        }
        res.push(
            outs.iter()
                .map(|&o| s.output_f32(o).expect("output"))
                .collect::<Vec<_>>(),
        );
    }
    let cpu_out = res.pop().expect("cpu");
    [res.pop().expect("gpu"), cpu_out]
}

/// `n_tok` tokens' expert ids: `n_used` distinct experts of `n_mat` each, as I32 bytes.
fn expert_ids(n_mat: usize, n_used: usize, n_tok: usize, rng: &mut Rng) -> Vec<u8> {
    let mut ids = Vec::with_capacity(n_used * n_tok);
    for _ in 0..n_tok {
        let mut pool: Vec<i32> = (0..n_mat as i32).collect();
        for _ in 0..n_used {
            let j = ((rng.f32().abs() * pool.len() as f32) as usize).min(pool.len() - 1);
            ids.push(pool.swap_remove(j));
        }
    }
    bytemuck::cast_slice(&ids).to_vec()
}

/// Row lengths and counts of the per-pair expert tests: the K-quant types' plain and biased
/// products take the short-row kernels at 256, 512 and 768 values (a warp's lanes split across
/// rows; 768: a fine-grained mixture's down product) and the per-row kernels at 2048; every
/// other type and every gated product the per-row kernels; no row count a multiple of the rows
/// per block.
const ID_SHAPES: [(usize, usize); 4] = [(256, 50), (512, 70), (768, 45), (2048, 36)];

/// `mul_mat_id` of a stack of 4 matrices, 2 experts per token, one activation vector per token
/// or one per slot, at each of [`ID_SHAPES`]: a decode token and small batches take the
/// per-pair launch; at the first shape 40 and 100 tokens also the grouped way (quantized
/// weights: sorted on the device, one tile launch; f16, f32 and MXFP4: sorted on the host, one
/// product per expert).
#[test]
fn mul_mat_id_matches_cpu_for_every_weight_type() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x6d6f_6531_2345_6789);
    let (n_mat, n_used) = (4usize, 2usize);
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::MXFP4,
        DType::F16,
        DType::F32,
    ];
    let cases = ID_SHAPES.iter().enumerate().flat_map(|(i, &(k, n))| {
        let toks: &[(usize, usize)] = if i == 0 {
            &[(1, 1), (1, 2), (3, 1), (5, 2), (40, 1), (100, 2)]
        } else {
            &[(1, 1), (1, 2), (3, 1), (5, 2)]
        };
        toks.iter().map(move |&(t, x)| (k, n, t, x))
    });
    let cases: Vec<_> = cases.collect();
    for dt in types {
        for &(k, n, n_tok, n_x) in &cases {
            let mut g = Graph::new();
            let w = g.weight("w", dt, &[k, n, n_mat]).expect("w");
            let x = g.input("x", DType::F32, &[k, n_x, n_tok]).expect("x");
            let ids = g.input("ids", DType::I32, &[n_used, n_tok]).expect("ids");
            let y = g.mul_mat_id(w, x, ids).expect("mul_mat_id");
            g.mark_output(y).expect("out");
            let weights = vec![(
                "w".to_string(),
                dt,
                vec![k, n, n_mat],
                weight_bytes(dt, n * n_mat, k, &mut rng),
            )];
            let inputs = vec![
                (x, f32_bytes(&rng.vec(k * n_x * n_tok))),
                (ids, expert_ids(n_mat, n_used, n_tok, &mut rng)),
            ];
            let [gpu, cpu] = run_both(&h, &g, &weights, &inputs, &[y]);
            let e = nmse(&gpu[0], &cpu[0]);
            let what = format!("mul_mat_id {dt} k={k} n={n} n_tok={n_tok} n_x={n_x}");
            println!("{what}: NMSE {e:.3e}");
            // Decode quantizes the activations to 8 bits on both sides (the GPU per 32 values
            // as Q8_1); the grouped way's larger groups multiply f16 operands.
            assert!(e <= 2e-3, "{what}: NMSE {e:.3e}");
        }
    }
}

/// The tile types: every weight type the expert-grouped tile kernels read.
const TILE_TYPES: [DType; 11] = [
    DType::Q4_0,
    DType::Q4_1,
    DType::Q5_0,
    DType::Q5_1,
    DType::Q8_0,
    DType::Q2_K,
    DType::Q3_K,
    DType::Q4_K,
    DType::Q5_K,
    DType::Q6_K,
    DType::MXFP4,
];

/// How a test spreads the pairs over the experts.
#[derive(Clone, Copy, Debug)]
enum Spread {
    /// Each token's slots pick distinct experts among the first `n_mat / 2 + 1`, the lower ones
    /// far more often (uneven counts; the upper half of the stack gets no pair).
    Skewed,
    /// Slot 0 of every token picks expert 1 (one expert with every token: several tiles of it),
    /// the other slots distinct others.
    OneTakesAll,
}

/// `n_tok` tokens' ids of `n_used` distinct experts of `n_mat` each, spread as `spread` says.
fn spread_ids(
    spread: Spread,
    n_mat: usize,
    n_used: usize,
    n_tok: usize,
    rng: &mut Rng,
) -> Vec<i32> {
    let mut ids = Vec::with_capacity(n_used * n_tok);
    for _ in 0..n_tok {
        let mut pool: Vec<i32> = match spread {
            Spread::Skewed => (0..=(n_mat / 2) as i32).collect(),
            Spread::OneTakesAll => (0..n_mat as i32).filter(|&e| e != 1).collect(),
        };
        for slot in 0..n_used {
            if slot == 0 && matches!(spread, Spread::OneTakesAll) {
                ids.push(1);
                continue;
            }
            let r = rng.f32().abs();
            let r = if matches!(spread, Spread::Skewed) {
                r * r
            } else {
                r
            };
            let j = ((r * pool.len() as f32) as usize).min(pool.len() - 1);
            ids.push(pool.remove(j));
        }
    }
    ids
}

/// Prompts' expert products grouped on the device for every tile weight type: uneven experts,
/// experts with no pair, one expert with every token (several tiles of one expert), one
/// activation vector per token (gate/up) or per slot (down), rows not a multiple of the tile's,
/// two steps of 256 values and rows of 320 (gpt-oss's 2880 is no multiple of 256 either);
/// plain and gated (SiLU and GELU, one launch for the three
/// nodes). Each takes the one-launch tile path and gives the CPU's results.
#[test]
fn grouped_tile_products_match_cpu() {
    use crate::tensor::Act;
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x6772_6f75_7065_6401);
    // (k, n, n_mat, n_used, n_tok, n_x = 1 or n_used, spread)
    let cases = [
        (
            256usize,
            50usize,
            16usize,
            2usize,
            60usize,
            false,
            Spread::Skewed,
        ),
        (512, 100, 8, 2, 70, true, Spread::OneTakesAll),
        (256, 64, 32, 4, 200, false, Spread::Skewed),
        // Rows of 10 blocks of 32 (no whole step of 256; the 32-value types only).
        (320, 70, 8, 2, 50, false, Spread::OneTakesAll),
    ];
    for dt in TILE_TYPES {
        for (i, &(k, n, n_mat, n_used, n_tok, per_slot, spread)) in cases.iter().enumerate() {
            if k % dt.block_size() != 0 {
                continue;
            }
            let n_x = if per_slot { n_used } else { 1 };
            let ids_v = spread_ids(spread, n_mat, n_used, n_tok, &mut rng);
            let ids_b: Vec<u8> = bytemuck::cast_slice(&ids_v).to_vec();
            let xs = f32_bytes(&rng.vec(k * n_x * n_tok));
            let wa = weight_bytes(dt, n * n_mat, k, &mut rng);
            let wb = weight_bytes(dt, n * n_mat, k, &mut rng);
            // Plain.
            let mut g = Graph::new();
            let w = g.weight("w", dt, &[k, n, n_mat]).expect("w");
            let x = g.input("x", DType::F32, &[k, n_x, n_tok]).expect("x");
            let ids = g.input("ids", DType::I32, &[n_used, n_tok]).expect("ids");
            let y = g.mul_mat_id(w, x, ids).expect("mul_mat_id");
            g.mark_output(y).expect("out");
            let weights = vec![("w".to_string(), dt, vec![k, n, n_mat], wa.clone())];
            let inputs = vec![(x, xs.clone()), (ids, ids_b.clone())];
            let before = crate::hip::grouped_tile_launches();
            let [gpu, cpu] = run_both(&h, &g, &weights, &inputs, &[y]);
            let what = format!("grouped {dt} case {i} ({spread:?})");
            assert!(
                crate::hip::grouped_tile_launches() > before,
                "{what}: not on the grouped tiles"
            );
            let e = nmse(&gpu[0], &cpu[0]);
            println!("{what}: NMSE {e:.3e}");
            assert!(e <= 2e-3, "{what}: NMSE {e:.3e}");
            if per_slot {
                continue;
            }
            // Gated: up and gate of one activation vector per token.
            let act = if i % 2 == 0 { Act::Silu } else { Act::Gelu };
            let mut g = Graph::new();
            let wu = g.weight("up", dt, &[k, n, n_mat]).expect("up");
            let wg = g.weight("gate", dt, &[k, n, n_mat]).expect("gate");
            let x = g.input("x", DType::F32, &[k, 1, n_tok]).expect("x");
            let ids = g.input("ids", DType::I32, &[n_used, n_tok]).expect("ids");
            let up = g.mul_mat_id(wu, x, ids).expect("up product");
            let gate = g.mul_mat_id(wg, x, ids).expect("gate product");
            let y = g.gated(act, gate, up).expect("activation");
            g.mark_output(y).expect("out");
            let weights = vec![
                ("up".to_string(), dt, vec![k, n, n_mat], wa),
                ("gate".to_string(), dt, vec![k, n, n_mat], wb),
            ];
            let inputs = vec![(x, xs), (ids, ids_b)];
            let before = (crate::hip::grouped_tile_launches(), h.grouped_nodes());
            let [gpu, cpu] = run_both(&h, &g, &weights, &inputs, &[y]);
            assert!(
                crate::hip::grouped_tile_launches() > before.0 && h.grouped_nodes() - before.1 >= 3,
                "{what}: the gated nodes were not one grouped tile launch"
            );
            let e = nmse(&gpu[0], &cpu[0]);
            println!("{what} gated {act:?}: NMSE {e:.3e}");
            assert!(e <= 2e-3, "{what} gated {act:?}: NMSE {e:.3e}");
        }
    }
}

/// Ids outside the stack (negative, or the stack's size) in a prompt grouped on the device:
/// their pairs' rows come out zero (as the per-pair kernels write them) and every other pair's
/// row is the CPU's (run with those ids replaced by valid ones; rows depend only on their own
/// pair).
#[test]
fn grouped_tile_products_zero_the_rows_of_ids_out_of_range() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x6f75_7472_616e_6765);
    let (k, n, n_mat, n_used, n_tok) = (256usize, 40usize, 8usize, 2usize, 40usize);
    let dt = DType::Q4_K;
    let mut bad = spread_ids(Spread::Skewed, n_mat, n_used, n_tok, &mut rng);
    let mut good = bad.clone();
    for (p, v) in [(3usize, -1i32), (10, n_mat as i32), (41, 1000)] {
        bad[p] = v;
        // Another expert than the token's other slot, so that the CPU's graph stays valid.
        good[p] = if bad[p ^ 1] == 0 { 1 } else { 0 };
    }
    let mut g = Graph::new();
    let w = g.weight("w", dt, &[k, n, n_mat]).expect("w");
    let x = g.input("x", DType::F32, &[k, 1, n_tok]).expect("x");
    let ids = g.input("ids", DType::I32, &[n_used, n_tok]).expect("ids");
    let y = g.mul_mat_id(w, x, ids).expect("mul_mat_id");
    g.mark_output(y).expect("out");
    let weights = vec![(
        "w".to_string(),
        dt,
        vec![k, n, n_mat],
        weight_bytes(dt, n * n_mat, k, &mut rng),
    )];
    let xs = f32_bytes(&rng.vec(k * n_tok));
    let with = |v: &[i32]| vec![(x, xs.clone()), (ids, bytemuck::cast_slice(v).to_vec())];
    let [_, cpu] = run_both(&h, &g, &weights, &with(&good), &[y]);
    // The GPU-first scheduler with the bad ids (the CPU would refuse them), after a run with the
    // good ones that leaves valid values in every row.
    let cpu_dev: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let mut s = Scheduler::new(vec![h.clone() as Arc<dyn Device>, cpu_dev]).expect("scheduler");
    for (name, dt, shape, bytes) in &weights {
        s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
            .expect("bind");
    }
    for v in [&good, &bad] {
        let ins = with(v);
        let ins: Vec<(TensorId, &[u8])> = ins.iter().map(|(i, b)| (*i, b.as_slice())).collect();
        s.run(&g, &ins).expect("run");
    }
    let gpu = s.output_f32(y).expect("output");
    for p in 0..n_used * n_tok {
        let (gr, cr) = (&gpu[p * n..(p + 1) * n], &cpu[0][p * n..(p + 1) * n]);
        if bad[p] != good[p] {
            assert!(
                gr.iter().all(|&v| v == 0.0),
                "pair {p} (id {}): not zeroed",
                bad[p]
            );
        } else {
            let e = nmse(gr, cr);
            assert!(e <= 2e-3, "pair {p}: NMSE {e:.3e}");
        }
    }
}

/// The routing of both gatings, as the model builds it: softmax, top k, the picked weights
/// (normalised or not); and top k of the raw logits, the picked logits, softmax over them
/// (gpt-oss), each as one grouped `moe_route_f32` launch. Logits rounded to halves make ties,
/// which both sides break by the lower index.
#[test]
fn routing_matches_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x726f_7574_6531_2345);
    for (n_exp, k, m, ties) in [
        (8usize, 2usize, 1usize, false),
        (32, 4, 7, false),
        (128, 8, 3, false),
        (128, 8, 5, true),
        (64, 1, 2, true),
        (40, 40, 2, false),
    ] {
        for norm in [false, true] {
            let mut g = Graph::new();
            let logits = g.input("logits", DType::F32, &[n_exp, m]).expect("logits");
            let probs = g.soft_max_ext(logits, None, 1.0).expect("softmax");
            let ids = g.arg_top_k(probs, k).expect("top k");
            let w = g.expert_weights(probs, ids, norm).expect("weights");
            let raw_ids = g.arg_top_k(logits, k).expect("top k of logits");
            let picked = g.expert_weights(logits, raw_ids, false).expect("picked");
            let w2 = g
                .soft_max_ext(picked, None, 1.0)
                .expect("softmax of picked");
            let outs = [ids, w, raw_ids, w2];
            for &o in &outs {
                g.mark_output(o).expect("out");
            }
            let mut v = rng.vec(n_exp * m);
            if ties {
                v.iter_mut().for_each(|x| *x = (*x * 4.0).round() / 2.0);
            }
            let before = h.grouped_nodes();
            let [gpu, cpu] = run_both(&h, &g, &[], &[(logits, f32_bytes(&v))], &outs);
            let what = format!("routing n_exp={n_exp} k={k} m={m} ties={ties} norm={norm}");
            // Both routings went as one `moe_route_f32` launch each (other tests running at
            // the same time only add to the count).
            assert!(
                h.grouped_nodes() - before >= 6,
                "{what}: the routing nodes were not launched as groups"
            );
            assert_eq!(gpu[0], cpu[0], "{what}: ids of the probabilities");
            assert_eq!(gpu[2], cpu[2], "{what}: ids of the logits");
            for i in [1, 3] {
                let e = nmse(&gpu[i], &cpu[i]);
                println!("{what} #{i}: NMSE {e:.3e}");
                assert!(e <= 1e-10, "{what} #{i}: NMSE {e:.3e}");
            }
        }
    }
}

/// The weighted sum of the chosen experts' outputs, fused by the optimizer into one `moe_sum`
/// node (with and without the residual added), equals the CPU's unfused `mul` and `add` chain
/// bit for bit (decode, a few tokens, a prompt; 2 to 8 experts; gpt-oss's 2880-wide rows).
#[test]
fn moe_sum_matches_unfused_cpu_bit_exact() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x6d6f_6573_756d_0001);
    for (n, k, nt) in [
        (2048usize, 8usize, 1usize),
        (2880, 4, 3),
        (64, 2, 5),
        (512, 8, 70),
    ] {
        for residual in [false, true] {
            let what = format!("moe_sum n={n} k={k} nt={nt} residual={residual}");
            let mut g = Graph::new();
            let experts = g
                .input("experts", DType::F32, &[n, k, nt])
                .expect("experts");
            let weights = g.input("weights", DType::F32, &[k, nt]).expect("weights");
            let wr = g.reshape(weights, &[1, k, nt]).expect("reshape");
            let prod = g.mul(experts, wr).expect("mul");
            let mut out = g.view(prod, &[n, nt], &[n * k * 4], 0).expect("slot 0");
            for i in 1..k {
                let s = g
                    .view(prod, &[n, nt], &[n * k * 4], i * n * 4)
                    .expect("slot");
                out = g.add(out, s).expect("add");
            }
            // Values of mixed magnitudes: another order or a fused multiply-add would show.
            let mut mixed = |len: usize| {
                let v: Vec<f32> = rng.vec(len).iter().map(|v| v * 1e3 * v.abs()).collect();
                f32_bytes(&v)
            };
            let mut inputs = vec![(experts, mixed(n * k * nt)), (weights, mixed(k * nt))];
            if residual {
                let r = g.input("residual", DType::F32, &[n, nt]).expect("residual");
                out = g.add(out, r).expect("residual add");
                inputs.push((r, mixed(n * nt)));
            }
            g.mark_output(out).expect("out");
            let unfused = g.clone();
            assert_eq!(
                crate::opt::fuse(&mut g),
                1 + usize::from(residual),
                "{what}"
            );
            assert_eq!(g.tensors()[out.index()].op, Op::MoeSum, "{what}");
            // Without the replaced nodes, which no schedule places.
            let (fused, map) = crate::opt::eliminate_dead(&g);
            let remap = |id: TensorId| map[id.index()].expect("kept");
            let fused_inputs: Vec<(TensorId, Vec<u8>)> =
                inputs.iter().map(|(i, b)| (remap(*i), b.clone())).collect();
            let [gpu, _] = run_both(&h, &fused, &[], &fused_inputs, &[remap(out)]);
            let [_, cpu] = run_both(&h, &unfused, &[], &inputs, &[out]);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&gpu[0]),
                bits(&cpu[0]),
                "{what}: GPU differs from the unfused CPU graph"
            );
        }
    }
}

/// Float-weight mat-vecs as a router's (f32 `[2048, 128]`: wide blocks, four values per load),
/// rows whose length is no multiple of 4 (one value per load) and a long output (narrow
/// blocks), f32 and f16 weights, one and three vectors; and a prompt's router products on the
/// float tiles (f32, 40 and 512 vectors: split shares of the rows, edges of tiles and slabs).
#[test]
fn float_mat_vecs_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x726f_7574_6572_0001);
    for dt in [DType::F32, DType::F16] {
        for (k, n) in [(2048usize, 128usize), (130, 7), (2050, 1500)] {
            let prompts: &[usize] = if dt == DType::F32 && n <= 1024 {
                &[40, 512]
            } else {
                &[]
            };
            for &m in [1usize, 3].iter().chain(prompts) {
                let mut g = Graph::new();
                let w = g.weight("w", dt, &[k, n]).expect("w");
                let x = g.input("x", DType::F32, &[k, m]).expect("x");
                let y = g.mul_mat(w, x).expect("mul_mat");
                g.mark_output(y).expect("out");
                let weights = vec![(
                    "w".to_string(),
                    dt,
                    vec![k, n],
                    weight_bytes(dt, n, k, &mut rng),
                )];
                let inputs = [(x, f32_bytes(&rng.vec(k * m)))];
                let [gpu, cpu] = run_both(&h, &g, &weights, &inputs, &[y]);
                let e = nmse(&gpu[0], &cpu[0]);
                println!("mul_mat {dt} k={k} n={n} m={m}: NMSE {e:.3e}");
                // The CPU may round the activations to f16 for f16 weights.
                let bound = if dt == DType::F32 { 1e-10 } else { 1e-5 };
                assert!(e <= bound, "mul_mat {dt} k={k} n={n} m={m}: NMSE {e:.3e}");
            }
        }
    }
}

/// gpt-oss's clamped SwiGLU on values well past the clamp, decode and prompt rows.
#[test]
fn swiglu_oai_matches_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x0a1_5719_7000_0007);
    for (n, m) in [(64usize, 1usize), (2880, 3), (100, 17)] {
        let mut g = Graph::new();
        let gate = g.input("gate", DType::F32, &[n, m]).expect("gate");
        let up = g.input("up", DType::F32, &[n, m]).expect("up");
        let y = g.swiglu_oai(gate, up, 1.702, 7.0).expect("swiglu_oai");
        g.mark_output(y).expect("out");
        let wide = |v: Vec<f32>| f32_bytes(&v.iter().map(|x| x * 12.0).collect::<Vec<_>>());
        let inputs = [(gate, wide(rng.vec(n * m))), (up, wide(rng.vec(n * m)))];
        let [gpu, cpu] = run_both(&h, &g, &[], &inputs, &[y]);
        let e = nmse(&gpu[0], &cpu[0]);
        println!("swiglu_oai n={n} m={m}: NMSE {e:.3e}");
        assert!(e <= 1e-10, "swiglu_oai n={n} m={m}: NMSE {e:.3e}");
    }
}

/// MXFP4 weights in the dense products (decode mat-vec; dequantization and gemm for a prompt)
/// and in `get_rows`.
#[test]
fn mxfp4_mul_mat_and_get_rows_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x3f4f_5f6f_7f8f_9faf);
    let (k, n) = (2880usize, 72usize);
    for m in [1usize, 3, 40] {
        let mut g = Graph::new();
        let w = g.weight("w", DType::MXFP4, &[k, n]).expect("w");
        let x = g.input("x", DType::F32, &[k, m]).expect("x");
        let y = g.mul_mat(w, x).expect("mul_mat");
        let ids = g.input("ids", DType::I32, &[m]).expect("ids");
        let rows = g.get_rows(w, ids).expect("get_rows");
        g.mark_output(y).expect("out");
        g.mark_output(rows).expect("out");
        let weights = vec![(
            "w".to_string(),
            DType::MXFP4,
            vec![k, n],
            weight_bytes(DType::MXFP4, n, k, &mut rng),
        )];
        let picks: Vec<i32> = (0..m).map(|i| ((i * 37) % n) as i32).collect();
        let inputs = vec![
            (x, f32_bytes(&rng.vec(k * m))),
            (ids, bytemuck::cast_slice(&picks).to_vec()),
        ];
        let [gpu, cpu] = run_both(&h, &g, &weights, &inputs, &[y, rows]);
        let e = nmse(&gpu[0], &cpu[0]);
        println!("mul_mat mxfp4 m={m}: NMSE {e:.3e}");
        assert!(e <= 2e-3, "mul_mat mxfp4 m={m}: NMSE {e:.3e}");
        assert_eq!(gpu[1], cpu[1], "get_rows mxfp4 m={m}");
    }
}

/// A mixture of experts' up and gate products and their gated activation (SiLU and GELU), as
/// the model plans build them, for every weight type the mat-vecs read, give the CPU's
/// activation as one group: for a decode token and small batches (the per-pair way, at each of
/// [`ID_SHAPES`]) one gated expert mat-vec launch; for 40 and 400 tokens, grouped by expert, one gated product per
/// expert (a gated mat-vec for a few rows, gate and up on integer tiles, or for 100 rows per
/// expert both products and the activation).
#[test]
fn expert_gate_up_activation_matches_cpu() {
    use crate::tensor::Act;
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x6761_7465_7570_0001);
    let (n_mat, n_used) = (8usize, 2usize);
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
    ];
    // The grouped way at the first shape; the per-pair one at every shape.
    let mut cases = vec![
        (256usize, 50usize, 40usize, Act::Silu),
        (256, 50, 400, Act::Gelu),
    ];
    for &(k, n) in &ID_SHAPES {
        cases.push((k, n, 1, Act::Silu));
        cases.push((k, n, 3, Act::Gelu));
    }
    for dt in types {
        for &(k, n, n_tok, act) in &cases {
            let mut g = Graph::new();
            let wu = g.weight("up", dt, &[k, n, n_mat]).expect("up");
            let wg = g.weight("gate", dt, &[k, n, n_mat]).expect("gate");
            let x = g.input("x", DType::F32, &[k, 1, n_tok]).expect("x");
            let ids = g.input("ids", DType::I32, &[n_used, n_tok]).expect("ids");
            let up = g.mul_mat_id(wu, x, ids).expect("up product");
            let gate = g.mul_mat_id(wg, x, ids).expect("gate product");
            let y = g.gated(act, gate, up).expect("activation");
            g.mark_output(y).expect("out");
            let weights = vec![
                (
                    "up".to_string(),
                    dt,
                    vec![k, n, n_mat],
                    weight_bytes(dt, n * n_mat, k, &mut rng),
                ),
                (
                    "gate".to_string(),
                    dt,
                    vec![k, n, n_mat],
                    weight_bytes(dt, n * n_mat, k, &mut rng),
                ),
            ];
            let inputs = vec![
                (x, f32_bytes(&rng.vec(k * n_tok))),
                (ids, expert_ids(n_mat, n_used, n_tok, &mut rng)),
            ];
            let before = (h.grouped_launches(), h.grouped_nodes());
            let [gpu, cpu] = run_both(&h, &g, &weights, &inputs, &[y]);
            let grouped = (
                h.grouped_launches() - before.0,
                h.grouped_nodes() - before.1,
            );
            let e = nmse(&gpu[0], &cpu[0]);
            let what = format!("expert gate/up {dt} k={k} n={n} tokens={n_tok} {act:?}");
            println!("{what}: NMSE {e:.3e}, grouped launches {grouped:?}");
            assert!(e <= 2e-3, "{what}: NMSE {e:.3e}");
            assert_eq!(grouped, (1, 3), "{what}: not one gated expert group");
        }
    }
}

/// An expert product with its experts' bias rows added (gpt-oss's `add_id`, as the model plans
/// build it: `get_rows` of the bias stack by the flattened ids, then `add`), for every weight
/// type the mat-vecs read and MXFP4: a decode token and small batches (at each of
/// [`ID_SHAPES`]) take one biased expert mat-vec launch for the three nodes, 40 tokens (grouped by expert) run node by node; all give
/// the CPU's sums.
#[test]
fn expert_product_with_bias_matches_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x6269_6173_6964_0001);
    let (n_mat, n_used) = (8usize, 2usize);
    let types = [
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_0,
        DType::Q5_1,
        DType::Q8_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::MXFP4,
    ];
    // The grouped way at the first shape; the per-pair one at every shape.
    let mut cases = vec![(256usize, 50usize, 40usize)];
    for &(k, n) in &ID_SHAPES {
        cases.push((k, n, 1));
        cases.push((k, n, 3));
    }
    for dt in types {
        for &(k, n, n_tok) in &cases {
            let mut g = Graph::new();
            let w = g.weight("w", dt, &[k, n, n_mat]).expect("w");
            let b = g.weight("b", DType::F32, &[n, n_mat]).expect("b");
            let x = g.input("x", DType::F32, &[k, 1, n_tok]).expect("x");
            let ids = g.input("ids", DType::I32, &[n_used, n_tok]).expect("ids");
            let y = g.mul_mat_id(w, x, ids).expect("product");
            let flat = g.reshape(ids, &[n_used * n_tok]).expect("flat ids");
            let rows = g.get_rows(b, flat).expect("bias rows");
            let rows = g.reshape(rows, &[n, n_used, n_tok]).expect("rows");
            let out = g.add(y, rows).expect("sum");
            g.mark_output(out).expect("out");
            let bias: Vec<f32> = rng.vec(n * n_mat);
            let weights = vec![
                (
                    "w".to_string(),
                    dt,
                    vec![k, n, n_mat],
                    weight_bytes(dt, n * n_mat, k, &mut rng),
                ),
                (
                    "b".to_string(),
                    DType::F32,
                    vec![n, n_mat],
                    f32_bytes(&bias),
                ),
            ];
            let inputs = vec![
                (x, f32_bytes(&rng.vec(k * n_tok))),
                (ids, expert_ids(n_mat, n_used, n_tok, &mut rng)),
            ];
            let before = (h.grouped_launches(), h.grouped_nodes());
            let [gpu, cpu] = run_both(&h, &g, &weights, &inputs, &[out]);
            let grouped = (
                h.grouped_launches() - before.0,
                h.grouped_nodes() - before.1,
            );
            let e = nmse(&gpu[0], &cpu[0]);
            let what = format!("expert product with bias {dt} k={k} n={n} tokens={n_tok}");
            println!("{what}: NMSE {e:.3e}, grouped launches {grouped:?}");
            assert!(e <= 2e-3, "{what}: NMSE {e:.3e}");
            let want = if n_tok <= 3 { (1, 3) } else { (0, 0) };
            assert_eq!(grouped, want, "{what}: biased expert launches");
        }
    }
}

/// Attention with sinks (one logit per query head in each row's softmax) over f16, f32 and Q8_0
/// caches: decode through the one-launch kernel (within its register pass and beyond it, with
/// gpt-oss's shape and window) and split over several blocks past its length, prompt chunks
/// through the GEMM path (gpt-oss's shape and window, two token chunks) and the flash kernels;
/// and paged attention with sinks, prompt chunks and decode tokens mixed.
#[test]
fn attention_with_sinks_matches_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x5121_6b5a_7700_1234);
    // (head dim, heads, kv heads, query tokens, kv length, window, kv type)
    let cases = [
        (64usize, 8usize, 2usize, 1usize, 40usize, None, DType::F16),
        (64, 8, 2, 1, 700, None, DType::F16),
        (64, 64, 8, 1, 300, Some(128usize), DType::F16),
        (64, 64, 8, 1, 3000, None, DType::F16),
        (64, 8, 2, 1, 5000, None, DType::F16),
        (64, 64, 8, 20, 60, Some(16), DType::F16),
        (64, 64, 8, 600, 600, Some(128), DType::F16),
        (64, 64, 8, 1, 300, Some(128), DType::F32),
        (128, 8, 2, 5, 70, None, DType::F32),
        (64, 8, 2, 1, 900, None, DType::Q8_0),
        (64, 16, 4, 24, 100, Some(32), DType::Q8_0),
    ];
    for (hd, nh, nkv, nt, nk, window, kt) in cases {
        let mut g = Graph::new();
        let q = g.input("q", DType::F32, &[hd, nh, nt]).expect("q");
        let k = g.input("k", kt, &[hd, nkv, nk]).expect("k");
        let v = g.input("v", kt, &[hd, nkv, nk]).expect("v");
        let pos = g.input("pos", DType::I32, &[nt]).expect("pos");
        let sinks = g.input("sinks", DType::F32, &[nh]).expect("sinks");
        let p = AttnParams {
            scale: 1.0 / (hd as f32).sqrt(),
            causal: true,
            window,
            softcap: None,
            sinks: false,
        };
        let y = g.attention(q, k, v, pos, None, p).expect("attention");
        let y = g.add_attention_sinks(y, sinks).expect("sinks");
        g.mark_output(y).expect("out");
        let kv = |rng: &mut Rng| -> Vec<u8> {
            let vals: Vec<f32> = rng.vec(hd * nkv * nk).iter().map(|x| 3.0 * x).collect();
            cache_bytes(kt, &vals)
        };
        let positions: Vec<i32> = (0..nt).map(|t| (nk - nt + t) as i32).collect();
        // Sinks from far below to well above the scores, so that some rows give them most of
        // the probability.
        let sink_vals: Vec<f32> = rng.vec(nh).iter().map(|x| 6.0 * x).collect();
        let inputs = vec![
            (q, f32_bytes(&rng.vec(hd * nh * nt))),
            (k, kv(&mut rng)),
            (v, kv(&mut rng)),
            (pos, bytemuck::cast_slice(&positions).to_vec()),
            (sinks, f32_bytes(&sink_vals)),
        ];
        let [gpu, cpu] = run_both(&h, &g, &[], &inputs, &[y]);
        let e = nmse(&gpu[0], &cpu[0]);
        let what = format!(
            "attention with sinks hd={hd} heads={nh}/{nkv} tokens={nt} kv={nk} window={window:?} \
             {kt}"
        );
        println!("{what}: NMSE {e:.3e}");
        assert!(e <= 1e-8, "{what}: NMSE {e:.3e}");
    }
    let mixed: &[(usize, usize)] = &[(300, 40), (21, 1), (201, 1)];
    let decode: &[(usize, usize)] = &[(1, 1), (17, 1), (160, 1), (999, 1)];
    for (shape, window, kt, seqs) in [
        ((64, 64, 8), Some(128), DType::F16, mixed),
        ((64, 64, 8), None, DType::F16, decode),
        ((64, 8, 2), None, DType::F32, mixed),
        ((64, 16, 4), Some(100), DType::Q8_0, decode),
    ] {
        // The bounds of `paged_attention_matches_cpu`.
        let bound = if kt == DType::F16 { 1e-6 } else { 1e-8 };
        paged_case(&h, &mut rng, shape, window, kt, 16, seqs, bound, true);
    }
}
