//! GPU-against-CPU checks of the decode mat-vec launches: long rows with and without a bias row
//! (the K-split kernels where the backend takes them), the column mat-vecs of 2 to 4 vectors, and
//! the q, k and v projections grouped into one launch.

use std::sync::Arc;

use super::super::matmul::{cols_launches, takes_cols};
use super::{check, f32_bytes, gated_case, hip, mul_mat_add_case, nmse, weight, Case, Rng};
use crate::backend::{CpuDevice, Device};
use crate::cpu::CpuBackend;
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::sched::Scheduler;
use crate::tensor::{Act, DType};

/// Long rows (from `K_SPLIT_FROM`) against the CPU for every fast weight type, alone and with a
/// bias row: the K-split kernels where the backend takes them (Q8_0), one row per warp otherwise.
#[test]
fn k_split_mat_vec_matches_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x7777_1234_abcd_0001);
    let (k, n) = (9216usize, 100usize);
    for dt in [
        DType::Q4_K,
        DType::Q5_K,
        DType::Q6_K,
        DType::Q8_0,
        DType::Q4_0,
        DType::Q5_0,
        DType::Q3_K,
        DType::Q2_K,
        DType::Q4_1,
        DType::Q5_1,
    ] {
        for m in [1usize, 2] {
            for bias in [false, true] {
                let mut g = Graph::new();
                let w = g.weight("w", dt, &[k, n]).expect("w");
                let x = g.input("x", DType::F32, &[k, m]).expect("x");
                let mut inputs = vec![(x, f32_bytes(&rng.vec(k * m)))];
                let mut y = g.mul_mat(w, x).expect("mm");
                if bias {
                    let b = g.input("b", DType::F32, &[n]).expect("b");
                    inputs.push((b, f32_bytes(&rng.vec(n))));
                    y = g.add(y, b).expect("add");
                }
                g.mark_output(y).expect("out");
                crate::opt::fuse(&mut g);
                let c = Case {
                    g,
                    weights: vec![weight("w", dt, k, n, &mut rng)],
                    inputs,
                    out: y,
                };
                check(
                    &h,
                    &format!("k-split mul_mat {dt} m={m} bias={bias}"),
                    &c,
                    2e-3,
                );
            }
        }
    }
}

/// Products of 2 to 4 vectors with Q4_K and Q6_K weights take the column mat-vecs (each weight
/// block read once for all vectors: 2 or 4 per grid row, the last one partial), plain, with
/// a bias row and gated, and match the CPU: rows not a multiple of a block's, rows of an odd
/// number of blocks (Q4_K's two blocks per lane in flight) and Q6_K rows that are and are not
/// 16-byte aligned (k = 2048: 1680 bytes; 512 and 2304: 420 and 1890).
#[test]
fn column_mat_vecs_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0xc01c_0150_2468_ace0);
    let n = 100usize;
    for dt in [DType::Q4_K, DType::Q6_K] {
        for k in [512usize, 2048, 2304] {
            for m in [2usize, 3, 4] {
                assert!(
                    takes_cols(dt, m),
                    "{dt} m={m} does not take the column mat-vecs"
                );
                let mut g = Graph::new();
                let w = g.weight("w", dt, &[k, n]).expect("w");
                let x = g.input("x", DType::F32, &[k, m]).expect("x");
                let y = g.mul_mat(w, x).expect("mm");
                g.mark_output(y).expect("out");
                let c = Case {
                    g,
                    weights: vec![weight("w", dt, k, n, &mut rng)],
                    inputs: vec![(x, f32_bytes(&rng.vec(k * m)))],
                    out: y,
                };
                let before = cols_launches();
                check(&h, &format!("column mul_mat {dt} k={k} m={m}"), &c, 2e-3);
                assert!(
                    cols_launches() > before,
                    "{dt} k={k} m={m}: no column mat-vec"
                );

                let c = mul_mat_add_case(dt, k, n, m, &mut rng);
                let before = cols_launches();
                check(
                    &h,
                    &format!("column mul_mat_add {dt} k={k} m={m}"),
                    &c,
                    2e-3,
                );
                assert!(
                    cols_launches() > before,
                    "{dt} k={k} m={m}: no column mat-vec"
                );

                for act in [Act::Silu, Act::Gelu] {
                    let c = gated_case(act, dt, k, n, m, &mut rng);
                    let before = cols_launches();
                    check(
                        &h,
                        &format!("column mul_mat_gated {act:?} {dt} k={k} m={m}"),
                        &c,
                        4e-3,
                    );
                    assert!(
                        cols_launches() > before,
                        "{dt} k={k} m={m}: no column mat-vec"
                    );
                }
            }
        }
    }
}

/// The q, k and v projections of a decode step (three `mul_mat`s of one input, rows not a
/// multiple of a block's) in one grouped launch, against the CPU for every type the grouped
/// kernels take; Q4_K q and k with a Q6_K v go together too, a run whose third weight has
/// another type groups the first two, and float weights stay ungrouped.
#[test]
fn grouped_qkv_mat_vecs_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x5151_2727_0a0a_3c3c);
    let k = 512usize;
    let rows = [100usize, 36, 20];
    // (types, grouped launches, grouped nodes)
    let cases: [([DType; 3], usize, usize); 13] = [
        ([DType::Q4_K; 3], 1, 3),
        ([DType::Q5_K; 3], 1, 3),
        ([DType::Q6_K; 3], 1, 3),
        ([DType::Q8_0; 3], 1, 3),
        ([DType::Q4_0; 3], 1, 3),
        ([DType::Q5_0; 3], 1, 3),
        ([DType::Q3_K; 3], 1, 3),
        ([DType::Q2_K; 3], 1, 3),
        ([DType::Q4_K, DType::Q4_K, DType::Q6_K], 1, 3),
        ([DType::Q8_0, DType::Q8_0, DType::Q6_K], 1, 2),
        ([DType::Q4_1; 3], 1, 3),
        ([DType::Q5_1; 3], 1, 3),
        ([DType::F16; 3], 0, 0),
    ];
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    for (types, groups, nodes) in cases {
        for m in [1usize, 2] {
            let mut g = Graph::new();
            let x = g.input("x", DType::F32, &[k, m]).expect("x");
            let mut weights = Vec::new();
            let mut ys = Vec::new();
            for (i, (&dt, &n)) in types.iter().zip(&rows).enumerate() {
                let name = format!("w{i}");
                let w = g.weight(&name, dt, &[k, n]).expect("w");
                let y = g.mul_mat(w, x).expect("mm");
                g.mark_output(y).expect("out");
                weights.push(weight(&name, dt, k, n, &mut rng));
                ys.push(y);
            }
            let xs = f32_bytes(&rng.vec(k * m));
            let (before, nodes_before) = (h.grouped_launches(), h.grouped_nodes());
            let mut outs = Vec::new();
            for devices in [
                vec![h.clone() as Arc<dyn Device>, cpu.clone()],
                vec![cpu.clone()],
            ] {
                let mut s = Scheduler::new(devices).expect("scheduler");
                for (name, dt, shape, bytes) in &weights {
                    s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                        .expect("bind");
                }
                s.run(&g, &[(x, xs.as_slice())]).expect("run");
                let o: Vec<Vec<f32>> = ys
                    .iter()
                    .map(|&y| s.output_f32(y).expect("output"))
                    .collect();
                outs.push(o);
            }
            assert_eq!(
                h.grouped_launches() - before,
                groups,
                "grouped launches for {types:?} m={m}"
            );
            assert_eq!(
                h.grouped_nodes() - nodes_before,
                nodes,
                "grouped nodes for {types:?} m={m}"
            );
            for (i, (gpu, cpu)) in outs[0].iter().zip(&outs[1]).enumerate() {
                let e = nmse(gpu, cpu);
                println!("grouped mul_mat {:?} #{i} m={m}: NMSE {e:.3e}", types[i]);
                assert!(e <= 2e-3, "grouped {:?} #{i} m={m}: NMSE {e:.3e}", types[i]);
            }
        }
    }
}

/// A tall Q6_K mat-vec of one vector (an output head's shape: 2048-value rows, more than
/// `HEAD_RING_MIN_ROWS` of them, a partial last round of groups over the grid) takes the ring
/// kernel `head_q6_k` where the device runs the decode stack, and matches the CPU.
#[test]
fn tall_q6_k_mat_vec_takes_the_ring_kernel_and_matches_cpu() {
    let Some(h) = hip() else { return };
    if !h.set_stack(true) {
        println!("skipped: this device does not run the decode stack's kernels");
        return;
    }
    let mut rng = Rng(0x4ead_0f0f_1234_5555);
    let (k, n) = (2048usize, kernels::HEAD_RING_MIN_ROWS + 7 * 32);
    let mut g = Graph::new();
    let w = g.weight("w", DType::Q6_K, &[k, n]).expect("w");
    let x = g.input("x", DType::F32, &[k, 1]).expect("x");
    let y = g.mul_mat(w, x).expect("mm");
    g.mark_output(y).expect("out");
    let c = Case {
        g,
        weights: vec![weight("w", DType::Q6_K, k, n, &mut rng)],
        inputs: vec![(x, f32_bytes(&rng.vec(k)))],
        out: y,
    };
    let before = crate::hip::head_launches();
    check(&h, "tall Q6_K mul_mat (head_q6_k)", &c, 2e-3);
    assert!(
        crate::hip::head_launches() > before,
        "the tall Q6_K mat-vec did not take head_q6_k"
    );
}
