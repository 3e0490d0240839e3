//! GPU-against-CPU checks of the batched quantized products on integer tiles (`mmq.hip`): every
//! weight type the mat-vecs take, 2 to 256 activation vectors (the tile kernels from
//! `MMQ_MIN_COLS` to the device's most, `mmq_max_cols`: 32 with dp4a products, 128 on tensor
//! cores, Q6_K 64; in full and partial tiles; the mat-vecs and gemmEx around them; Q4_K and Q6_K take the
//! column mat-vecs up to 4), row counts that are not a multiple of a tile's, rows of whole 256-value steps
//! (an even and an odd number) and (32-value types) of an odd number of blocks, steps split over
//! several blocks, a bias row and the gated product.

use super::super::matmul::{mmq_takes_weight, takes_cols};
use super::{check, f32_bytes, gated_case, hip, mul_mat_add_case, weight, Case, Rng};
use crate::graph::Graph;
use crate::tensor::{Act, DType};

const TYPES: [DType; 10] = [
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

/// Row lengths to check for `dt`: 2048 (eight 256-value steps, split over several blocks for
/// few tiles) and, for 32-value blocks, 45 blocks (a partial last step), for 256-value blocks
/// 9 (split into shares of unequal length, some empty; Q3_K and Q6_K rows then start at 2-byte offsets
/// from 16-byte boundaries, which the staging ring's copies must cover).
fn row_lengths(dt: DType) -> &'static [usize] {
    if dt.block_size() == 32 {
        &[2048, 32 * 45]
    } else {
        &[2048, 256 * 9]
    }
}

/// `mul_mat` of 2 to 256 vectors against the CPU for every type; where `mmq_takes_weight` says so it
/// takes the tile kernels.
#[test]
fn mmq_mul_mat_matches_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x3a3a_0101_5c5c_7e7e);
    let n = 100usize;
    for dt in TYPES {
        for &k in row_lengths(dt) {
            for m in [2usize, 7, 8, 9, 16, 31, 32, 33, 64, 100, 128, 256] {
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
                let before = crate::hip::mmq_launches();
                check(&h, &format!("mmq mul_mat {dt} k={k} m={m}"), &c, 2e-3);
                // (Other tests may launch tile kernels meanwhile: only a launch is conclusive.)
                if mmq_takes_weight(&h, dt, m) && !takes_cols(dt, m) {
                    assert!(
                        crate::hip::mmq_launches() > before,
                        "{dt} k={k} m={m}: no tile kernel launched"
                    );
                }
            }
        }
    }
}

/// The fused bias (`mul_mat + b`) and gated (`act(w_gate x) * (w_up x)`) products on the tile
/// kernels against the CPU for every type: one block per tile (short rows) and split steps,
/// partial and full tiles of 16, 32, 64 and 128 vectors where the device takes that many.
#[test]
fn mmq_bias_and_gated_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x7e57_b1a5_0bad_9a7e);
    let n = 136usize;
    for dt in TYPES {
        for k in [512usize, 2048] {
            for m in [8usize, 20, 32, 64, 100, 128, 256] {
                if !mmq_takes_weight(&h, dt, m) || takes_cols(dt, m) {
                    continue;
                }
                let c = mul_mat_add_case(dt, k, n, m, &mut rng);
                let before = crate::hip::mmq_launches();
                check(&h, &format!("mmq mul_mat_add {dt} k={k} m={m}"), &c, 2e-3);
                assert!(
                    crate::hip::mmq_launches() > before,
                    "{dt} m={m}: no tile kernel"
                );

                for act in [Act::Silu, Act::Gelu] {
                    let c = gated_case(act, dt, k, n, m, &mut rng);
                    let before = crate::hip::mmq_launches();
                    check(
                        &h,
                        &format!("mmq mul_mat_gated {act:?} {dt} k={k} m={m}"),
                        &c,
                        4e-3,
                    );
                    assert!(
                        crate::hip::mmq_launches() > before,
                        "{dt} m={m}: no tile kernel"
                    );
                }
            }
        }
    }
}
