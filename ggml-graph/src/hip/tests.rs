//! Op-by-op checks of the HIP device against the CPU backend, in the manner of ggml's
//! test-backend-ops: the same graph runs through a scheduler whose first device is the GPU and
//! through a CPU-only one, and the outputs must agree within an NMSE bound per op. Without a GPU
//! (or without built kernels) each test prints why it skipped; `ROCMFORGE_REQUIRE_GPU=1` makes
//! that a failure.

use std::sync::Arc;

use super::HipDevice;
use crate::backend::{CpuDevice, Device};
use crate::cpu::CpuBackend;
use crate::exec::WeightBytes;
use crate::graph::Graph;
use crate::sched::Scheduler;
use crate::tensor::{Act, DType, Op, RopeMode, RopeParams, TensorId};

/// The GPU, or `None` after printing why the test skips (see `hip_ffi::testing`).
fn hip() -> Option<Arc<HipDevice>> {
    hip_ffi::testing::or_skip(HipDevice::new(0)).map(Arc::new)
}

struct Rng(u64);
impl Rng {
    fn f32(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| (self.f32() * 127.0) as i8 as u8).collect()
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Random weights of `dt`: floats, or blocks with every f16 scale field set to a small finite value.
fn weight_bytes(dt: DType, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
    match dt {
        DType::F32 => return f32_bytes(&rng.vec(rows * cols)),
        DType::F16 => {
            return rng
                .vec(rows * cols)
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect()
        }
        _ => {}
    }
    let nb = rows * cols / dt.block_size();
    let mut b = rng.bytes(nb * dt.type_size());
    let fields: &[usize] = match dt {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        _ => &[],
    };
    for blk in b.chunks_mut(dt.type_size()) {
        for &off in fields {
            let v = half::f16::from_f32(0.002 + 0.01 * rng.f32().abs());
            blk[off..off + 2].copy_from_slice(&v.to_le_bytes());
        }
        if dt == DType::MXFP4 {
            // The E8M0 exponent: scales 2^-9 .. 2^-6 (halved values are stored doubled).
            blk[0] = 119 + (rng.f32().abs() * 3.99) as u8;
        }
    }
    b
}

/// A weight of `dt` with `cols` values per row and `rows` rows (ggml's `[cols, rows]`), random
/// as `weight_bytes` makes them, named `name`.
type Weight = (String, DType, Vec<usize>, Vec<u8>);

fn weight(name: &str, dt: DType, cols: usize, rows: usize, rng: &mut Rng) -> Weight {
    (
        name.into(),
        dt,
        vec![cols, rows],
        weight_bytes(dt, rows, cols, rng),
    )
}

/// A step's K and V writes into f16 caches `cache_k` and `cache_v` of `n_ctx` rows of `row` values:
/// keys and values (any shape of `row * nt` values, reshaped to rows) at the rows `idx` holds.
/// Returns the two `set_rows` nodes.
fn f16_cache_writes(
    g: &mut Graph,
    [k, v]: [TensorId; 2],
    idx: TensorId,
    row: usize,
    nt: usize,
    n_ctx: usize,
) -> (TensorId, TensorId) {
    let ck = g
        .persistent("cache_k", DType::F16, &[row, n_ctx])
        .expect("ck");
    let cv = g
        .persistent("cache_v", DType::F16, &[row, n_ctx])
        .expect("cv");
    let kr = g.reshape(k, &[row, nt]).expect("kr");
    let vr = g.reshape(v, &[row, nt]).expect("vr");
    let kc = g.set_rows(ck, kr, idx).expect("set k");
    let vc = g.set_rows(cv, vr, idx).expect("set v");
    (kc, vc)
}

struct Case {
    g: Graph,
    weights: Vec<Weight>,
    inputs: Vec<(TensorId, Vec<u8>)>,
    out: TensorId,
}

/// Runs the case on the GPU-first and the CPU-only scheduler; returns (gpu, cpu) outputs after
/// checking that the output node itself ran on the GPU.
fn run_both(hip: &Arc<HipDevice>, c: &Case) -> (Vec<f32>, Vec<f32>) {
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let mut outs = Vec::new();
    for devices in [
        vec![hip.clone() as Arc<dyn Device>, cpu.clone()],
        vec![cpu.clone()],
    ] {
        let mut s = Scheduler::new(devices).expect("scheduler");
        for (name, dt, shape, bytes) in &c.weights {
            s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                .expect("bind");
        }
        let inputs: Vec<(TensorId, &[u8])> =
            c.inputs.iter().map(|(id, b)| (*id, b.as_slice())).collect();
        s.run(&c.g, &inputs).expect("run");
        outs.push(s.output_f32(c.out).expect("output"));
        if outs.len() == 1 {
            let placed = s.last_schedule().and_then(|sc| sc.device_of[c.out.index()]);
            assert_eq!(
                placed,
                Some(0),
                "{} did not run on the GPU",
                c.g.tensors()[c.out.index()].op.name()
            );
        }
    }
    let cpu_out = outs.pop().expect("cpu output");
    let gpu_out = outs.pop().expect("gpu output");
    (gpu_out, cpu_out)
}

/// `w x + b` with `w` of `dt` (`[k, n]`) and `m` vectors, fused into one `MulMatAdd` node.
fn mul_mat_add_case(dt: DType, k: usize, n: usize, m: usize, rng: &mut Rng) -> Case {
    let mut g = Graph::new();
    let w = g.weight("w", dt, &[k, n]).expect("w");
    let b = g.input("b", DType::F32, &[n]).expect("b");
    let x = g.input("x", DType::F32, &[k, m]).expect("x");
    let mm = g.mul_mat(w, x).expect("mm");
    let y = g.add(mm, b).expect("add");
    g.mark_output(y).expect("out");
    assert_eq!(crate::opt::fuse(&mut g), 1);
    assert_eq!(g.tensors()[y.index()].op, Op::MulMatAdd);
    Case {
        g,
        weights: vec![weight("w", dt, k, n, rng)],
        inputs: vec![(b, f32_bytes(&rng.vec(n))), (x, f32_bytes(&rng.vec(k * m)))],
        out: y,
    }
}

/// `act(w_gate x) * (w_up x)` with both weights of `dt` (`[k, n]`) and `m` vectors, fused into
/// one `MulMatGated` node.
fn gated_case(act: Act, dt: DType, k: usize, n: usize, m: usize, rng: &mut Rng) -> Case {
    let mut g = Graph::new();
    let wg = g.weight("wg", dt, &[k, n]).expect("wg");
    let wu = g.weight("wu", dt, &[k, n]).expect("wu");
    let x = g.input("x", DType::F32, &[k, m]).expect("x");
    let gt = g.mul_mat(wg, x).expect("gate");
    let up = g.mul_mat(wu, x).expect("up");
    let y = g.gated(act, gt, up).expect("gated");
    g.mark_output(y).expect("out");
    assert_eq!(crate::opt::fuse(&mut g), 1);
    assert_eq!(g.tensors()[y.index()].op, Op::MulMatGated(act));
    Case {
        g,
        weights: vec![weight("wg", dt, k, n, rng), weight("wu", dt, k, n, rng)],
        inputs: vec![(x, f32_bytes(&rng.vec(k * m)))],
        out: y,
    }
}

fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut e, mut n) = (0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        if !g.is_finite() {
            return f64::INFINITY;
        }
        e += (f64::from(g) - f64::from(w)).powi(2);
        n += f64::from(w).powi(2);
    }
    e / n.max(1e-30)
}

fn check(hip: &Arc<HipDevice>, what: &str, c: &Case, bound: f64) {
    let (g, w) = run_both(hip, c);
    let e = nmse(&g, &w);
    println!("{what}: NMSE {e:.3e}");
    assert!(e <= bound, "{what}: NMSE {e:.3e} > {bound:.1e}");
}

#[test]
fn mul_mat_matches_cpu_for_every_weight_type_decode_and_prefill() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x1234_5678_9abc_def1);
    let (k, n) = (512usize, 72usize);
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
        DType::F16,
        DType::F32,
    ];
    for dt in types {
        for m in [1usize, 2, 3, 5, 8, 17] {
            let mut g = Graph::new();
            let w = g.weight("w", dt, &[k, n]).expect("w");
            let x = g.input("x", DType::F32, &[k, m]).expect("x");
            let y = g.mul_mat(w, x).expect("mul_mat");
            g.mark_output(y).expect("out");
            let wb = weight_bytes(dt, n, k, &mut rng);
            let c = Case {
                g,
                weights: vec![("w".into(), dt, vec![k, n], wb)],
                inputs: vec![(x, f32_bytes(&rng.vec(k * m)))],
                out: y,
            };
            // Both sides quantize activations to 8 bits for decode; prefill uses f16 operands.
            check(&h, &format!("mul_mat {dt} m={m}"), &c, 2e-3);
        }
    }
}

/// A prefill product whose weight has more rows than a launch grid's y dimension allows
/// (65535), as a vocabulary-sized output matrix with every position's logits does.
#[test]
fn mul_mat_prefill_with_more_rows_than_grid_y_matches_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x0bad_cafe_f00d_1234);
    let (k, n, m) = (64usize, 70_001usize, 12usize);
    let dt = DType::Q8_0;
    let mut g = Graph::new();
    let w = g.weight("w", dt, &[k, n]).expect("w");
    let x = g.input("x", DType::F32, &[k, m]).expect("x");
    let y = g.mul_mat(w, x).expect("mul_mat");
    g.mark_output(y).expect("out");
    let c = Case {
        g,
        weights: vec![weight("w", dt, k, n, &mut rng)],
        inputs: vec![(x, f32_bytes(&rng.vec(k * m)))],
        out: y,
    };
    check(&h, "mul_mat q8_0 70001 rows m=12", &c, 2e-3);
}

/// Two decode mat-vecs of one input (as q/k/v share theirs) reuse one activation quantization;
/// a new input written between runs, and a node rewriting the input's memory, must not see the
/// old quantized values.
#[test]
fn shared_mat_vec_input_is_quantized_once_and_refreshed() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x5eed_0fc0_ffee);
    let (k, n) = (1024usize, 40usize);
    let mut g = Graph::new();
    let w1 = g.weight("w1", DType::Q4_K, &[k, n]).expect("w1");
    let w2 = g.weight("w2", DType::Q6_K, &[k, n]).expect("w2");
    let x = g.input("x", DType::F32, &[k, 1]).expect("x");
    let y1 = g.mul_mat(w1, x).expect("y1");
    let y2 = g.mul_mat(w2, x).expect("y2");
    let y = g.add(y1, y2).expect("y");
    g.mark_output(y).expect("out");
    let weights = vec![
        weight("w1", DType::Q4_K, k, n, &mut rng),
        weight("w2", DType::Q6_K, k, n, &mut rng),
    ];
    let cpu: Arc<dyn Device> = Arc::new(CpuDevice::new(Arc::new(
        CpuBackend::new(2).expect("cpu backend"),
    )));
    let mut gpu_s = Scheduler::new(vec![h.clone() as Arc<dyn Device>, cpu.clone()]).expect("s");
    let mut cpu_s = Scheduler::new(vec![cpu]).expect("s");
    for s in [&mut gpu_s, &mut cpu_s] {
        for (name, dt, shape, bytes) in &weights {
            s.bind_weight(name, *dt, shape, WeightBytes::from_vec(bytes.clone()))
                .expect("bind");
        }
    }
    let mut last: Option<Vec<f32>> = None;
    for step in 0..3 {
        let xb = f32_bytes(&rng.vec(k));
        gpu_s.run(&g, &[(x, &xb)]).expect("gpu run");
        cpu_s.run(&g, &[(x, &xb)]).expect("cpu run");
        let got = gpu_s.output_f32(y).expect("gpu out");
        let want = cpu_s.output_f32(y).expect("cpu out");
        let e = nmse(&got, &want);
        println!("step {step}: NMSE {e:.3e}");
        assert!(e <= 2e-3, "step {step}: NMSE {e:.3e}");
        if let Some(prev) = &last {
            assert_ne!(
                prev, &got,
                "step {step}: output did not follow the new input"
            );
        }
        last = Some(got);
    }
}

fn unary_case(
    build: impl Fn(&mut Graph, TensorId) -> TensorId,
    shape: &[usize],
    rng: &mut Rng,
) -> Case {
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, shape).expect("x");
    let y = build(&mut g, x);
    g.mark_output(y).expect("out");
    let n: usize = shape.iter().product();
    Case {
        g,
        weights: vec![],
        inputs: vec![(
            x,
            f32_bytes(&rng.vec(n).iter().map(|v| v * 3.0).collect::<Vec<_>>()),
        )],
        out: y,
    }
}

#[test]
fn elementwise_and_row_ops_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0xfeed_beef_cafe_f00d);
    let shape = [640usize, 5, 2];
    check(
        &h,
        "rms_norm",
        &unary_case(|g, x| g.rms_norm(x, 1e-6).expect("op"), &shape, &mut rng),
        1e-10,
    );
    check(
        &h,
        "scale",
        &unary_case(|g, x| g.scale(x, 0.125).expect("op"), &shape, &mut rng),
        1e-12,
    );
    check(
        &h,
        "gelu",
        &unary_case(|g, x| g.gelu(x).expect("op"), &shape, &mut rng),
        1e-8,
    );
    check(
        &h,
        "silu",
        &unary_case(|g, x| g.silu(x).expect("op"), &shape, &mut rng),
        1e-8,
    );
    check(
        &h,
        "soft_max",
        &unary_case(
            |g, x| g.soft_max_ext(x, None, 0.3).expect("op"),
            &shape,
            &mut rng,
        ),
        1e-10,
    );
    // Binary ops: same shape, and a broadcast row (norm weight / bias).
    for bshape in [vec![640usize, 5, 2], vec![640usize]] {
        for mul in [false, true] {
            let mut g = Graph::new();
            let a = g.input("a", DType::F32, &shape).expect("a");
            let b = g.input("b", DType::F32, &bshape).expect("b");
            let y = if mul { g.mul(a, b) } else { g.add(a, b) }.expect("op");
            g.mark_output(y).expect("out");
            let nb: usize = bshape.iter().product();
            let c = Case {
                g,
                weights: vec![],
                inputs: vec![
                    (a, f32_bytes(&rng.vec(640 * 10))),
                    (b, f32_bytes(&rng.vec(nb))),
                ],
                out: y,
            };
            check(
                &h,
                &format!("{} b={bshape:?}", if mul { "mul" } else { "add" }),
                &c,
                1e-14,
            );
        }
    }
    for act in [Act::Gelu, Act::Silu] {
        let mut g = Graph::new();
        let a = g.input("a", DType::F32, &[256, 7]).expect("a");
        let b = g.input("b", DType::F32, &[256, 7]).expect("b");
        let y = g.gated(act, a, b).expect("gated");
        g.mark_output(y).expect("out");
        let c = Case {
            g,
            weights: vec![],
            inputs: vec![
                (a, f32_bytes(&rng.vec(256 * 7))),
                (b, f32_bytes(&rng.vec(256 * 7))),
            ],
            out: y,
        };
        check(&h, &format!("gated {act:?}"), &c, 1e-8);
    }
}

#[test]
fn rope_get_rows_and_argmax_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x0bad_c0de_1357_9bdf);
    for (mode, n_dims) in [
        (RopeMode::Normal, 64usize),
        (RopeMode::Neox, 64),
        (RopeMode::Neox, 32),
    ] {
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[64, 4, 3]).expect("x");
        let pos = g.input("pos", DType::I32, &[3]).expect("pos");
        let p = RopeParams::new(mode, n_dims, 10000.0, 1.0);
        let y = g.rope(x, pos, p, None).expect("rope");
        g.mark_output(y).expect("out");
        let c = Case {
            g,
            weights: vec![],
            inputs: vec![
                (x, f32_bytes(&rng.vec(64 * 12))),
                (pos, bytemuck::cast_slice(&[0i32, 7, 300]).to_vec()),
            ],
            out: y,
        };
        check(&h, &format!("rope {mode:?} n_dims={n_dims}"), &c, 1e-9);
    }
    for dt in [DType::Q8_0, DType::Q4_K, DType::Q6_K, DType::F32] {
        let (cols, rows) = (512usize, 9usize);
        let mut g = Graph::new();
        let t = g.weight("emb", dt, &[cols, rows]).expect("emb");
        let ids = g.input("ids", DType::I32, &[4]).expect("ids");
        let y = g.get_rows(t, ids).expect("get_rows");
        g.mark_output(y).expect("out");
        let tb = if dt == DType::F32 {
            f32_bytes(&rng.vec(cols * rows))
        } else {
            weight_bytes(dt, rows, cols, &mut rng)
        };
        let c = Case {
            g,
            weights: vec![("emb".into(), dt, vec![cols, rows], tb)],
            inputs: vec![(ids, bytemuck::cast_slice(&[8i32, 0, 3, 8]).to_vec())],
            out: y,
        };
        check(&h, &format!("get_rows {dt}"), &c, 1e-12);
    }
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[5000, 3]).expect("x");
    let y = g.argmax(x).expect("argmax");
    g.mark_output(y).expect("out");
    let c = Case {
        g,
        weights: vec![],
        inputs: vec![(x, f32_bytes(&rng.vec(15000)))],
        out: y,
    };
    let (gpu, cpu) = run_both(&h, &c);
    assert_eq!(gpu, cpu, "argmax");
}

/// The optimizer's fused nodes (`rms_norm * w`, `mul_mat + bias`, gated FFN products) on the GPU
/// against the CPU's fused ops: decode (one or two columns, the gated mat-vec kernels; f16
/// weights have none and take two products and the activation) and prefill (GEMMs).
#[test]
fn fused_nodes_match_cpu() {
    let Some(h) = hip() else { return };
    let mut rng = Rng(0x0f05_ed00_1234_5678);
    let (k, n) = (512usize, 136usize);
    for m in [1usize, 2, 4, 5, 8, 20] {
        // rms_norm * weight
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &[k, m]).expect("x");
        let w = g.input("w", DType::F32, &[k]).expect("w");
        let nx = g.rms_norm(x, 1e-5).expect("norm");
        let y = g.mul(nx, w).expect("mul");
        g.mark_output(y).expect("out");
        assert_eq!(crate::opt::fuse(&mut g), 1);
        assert!(matches!(g.tensors()[y.index()].op, Op::RmsNormMul { .. }));
        let c = Case {
            g,
            weights: vec![],
            inputs: vec![(x, f32_bytes(&rng.vec(k * m))), (w, f32_bytes(&rng.vec(k)))],
            out: y,
        };
        check(&h, &format!("rms_norm_mul m={m}"), &c, 1e-10);

        // rms_norm * weight feeding a mat-vec (decode: the norm writes the quantized rows the
        // product reads), rows of one block (`rms_norm_q8_f32`) and of six (`_split_f32`).
        for kk in [512usize, 6144] {
            let dt = DType::Q8_0;
            let mut g = Graph::new();
            let x = g.input("x", DType::F32, &[kk, m]).expect("x");
            let nw = g.input("w", DType::F32, &[kk]).expect("w");
            let wm = g.weight("wm", dt, &[kk, n]).expect("wm");
            let nx = g.rms_norm(x, 1e-5).expect("norm");
            let xn = g.mul(nx, nw).expect("mul");
            let y = g.mul_mat(wm, xn).expect("mm");
            g.mark_output(y).expect("out");
            assert_eq!(crate::opt::fuse(&mut g), 1);
            let c = Case {
                g,
                weights: vec![weight("wm", dt, kk, n, &mut rng)],
                inputs: vec![
                    (x, f32_bytes(&rng.vec(kk * m))),
                    (nw, f32_bytes(&rng.vec(kk))),
                ],
                out: y,
            };
            check(
                &h,
                &format!("rms_norm_mul -> mul_mat k={kk} m={m}"),
                &c,
                2e-3,
            );
        }

        // mul_mat + bias
        let dt = DType::Q8_0;
        let c = mul_mat_add_case(dt, k, n, m, &mut rng);
        check(&h, &format!("mul_mat_add {dt} m={m}"), &c, 2e-3);

        // act(w_gate x) * (w_up x)
        for dt in [
            DType::Q4_K,
            DType::Q6_K,
            DType::Q5_K,
            DType::Q8_0,
            DType::Q4_0,
            DType::Q5_0,
            DType::Q3_K,
            DType::Q2_K,
            DType::Q4_1,
            DType::Q5_1,
            DType::F16,
        ] {
            for act in [Act::Silu, Act::Gelu] {
                let c = gated_case(act, dt, k, n, m, &mut rng);
                check(&h, &format!("mul_mat_gated {act:?} {dt} m={m}"), &c, 4e-3);
            }
        }

        // The gated product feeding the down projection (decode: its output quantized once more
        // for the mat-vec after it).
        let nf = 256usize;
        for (dt, down) in [
            (DType::Q4_K, DType::Q6_K),
            (DType::Q4_K, DType::Q4_K),
            (DType::Q8_0, DType::Q8_0),
            (DType::Q4_0, DType::Q4_K),
        ] {
            let mut g = Graph::new();
            let wg = g.weight("wg", dt, &[k, nf]).expect("wg");
            let wu = g.weight("wu", dt, &[k, nf]).expect("wu");
            let wd = g.weight("wd", down, &[nf, k]).expect("wd");
            let x = g.input("x", DType::F32, &[k, m]).expect("x");
            let gt = g.mul_mat(wg, x).expect("gate");
            let up = g.mul_mat(wu, x).expect("up");
            let hid = g.gated(Act::Silu, gt, up).expect("gated");
            let y = g.mul_mat(wd, hid).expect("down");
            g.mark_output(y).expect("out");
            let fused = crate::opt::fuse(&mut g);
            assert!(fused >= 1, "gated -> down: {fused} fusions");
            let c = Case {
                g,
                weights: vec![
                    weight("wg", dt, k, nf, &mut rng),
                    weight("wu", dt, k, nf, &mut rng),
                    weight("wd", down, nf, k, &mut rng),
                ],
                inputs: vec![(x, f32_bytes(&rng.vec(k * m)))],
                out: y,
            };
            check(&h, &format!("gated {dt} -> mul_mat {down} m={m}"), &c, 4e-3);
        }
    }
}

/// A buffer beyond the device's budget fails as out of memory, with gpu-mem's error as its
/// source (`error::tests` checks the other kinds on the host).
#[test]
fn allocation_beyond_the_budget_is_out_of_memory() {
    let Some(h) = hip() else { return };
    let bytes = usize::try_from(h.gpu().budget().limit().saturating_mul(2)).unwrap_or(usize::MAX);
    let e = match h.buffer_type().alloc(bytes) {
        Ok(_) => panic!("{bytes} bytes fit a budget of half that"),
        Err(e) => e,
    };
    assert!(e.is_out_of_memory(), "{e}");
    let source = std::error::Error::source(&e).expect("gpu-mem's error");
    let gpu = source.downcast_ref::<gpu_mem::GpuError>();
    assert!(
        matches!(gpu, Some(gpu_mem::GpuError::BudgetExceeded { .. })),
        "{source}"
    );
}

#[path = "tests_matvec.rs"]
mod matvec;

#[path = "tests_norm.rs"]
mod norm;

#[path = "tests_io.rs"]
mod io;

#[path = "tests_multi.rs"]
mod multi;

#[path = "tests_attn.rs"]
mod attn;
use attn::{cache_bytes, paged_case};

#[test]
fn byte_counts_past_any_device_are_refused_before_asking_it() {
    assert_eq!(super::bytes_of("partials", &[3, 5, 4]).ok(), Some(60));
    for factors in [
        &[1usize << 40, 1 << 30, 4][..],
        &[usize::MAX, 2],
        &[isize::MAX as usize],
    ] {
        let e = super::bytes_of("attention partials", factors).expect_err("too large");
        assert!(e.is_out_of_memory(), "{e}");
        assert!(e.to_string().contains("attention partials"), "{e}");
    }
}

#[path = "tests_mmq.rs"]
mod mmq;

#[path = "tests_moe.rs"]
mod moe;
