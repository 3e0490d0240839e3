//! Every op on the CPU backend against a naive f64 reference, over several shapes including odd
//! sizes, with normalized-MSE bounds per op (ggml test-backend-ops style).

#![allow(
    clippy::needless_range_loop,
    reason = "references index several arrays in lockstep"
)]

mod common;

use common::*;
use rocmforge_ggml_graph::{Act, DType, Graph, RopeMode, RopeParams};

const EXACT: f64 = 1e-10;
const FLOAT: f64 = 1e-7;

fn idx4(ne: [usize; 4], i: [usize; 4]) -> usize {
    i[0] + ne[0] * (i[1] + ne[1] * (i[2] + ne[2] * i[3]))
}

fn each4(ne: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
    (0..ne[3]).flat_map(move |i3| {
        (0..ne[2]).flat_map(move |i2| {
            (0..ne[1]).flat_map(move |i1| (0..ne[0]).map(move |i0| [i0, i1, i2, i3]))
        })
    })
}

#[test]
fn binary_broadcast() {
    let mut rng = Rng::new(1);
    for (a_ne, b_ne) in [
        ([7, 3, 2, 1], [7, 1, 1, 1]),
        ([7, 3, 2, 1], [1, 3, 1, 1]),
        ([5, 4, 3, 2], [5, 4, 3, 2]),
        ([640, 3, 1, 1], [640, 1, 1, 1]),
    ] {
        for mul in [false, true] {
            let mut g = Graph::new();
            let a = g.input("a", DType::F32, &a_ne).unwrap();
            let b = g.input("b", DType::F32, &b_ne).unwrap();
            let y = if mul {
                g.mul(a, b).unwrap()
            } else {
                g.add(a, b).unwrap()
            };
            g.mark_output(y).unwrap();
            let (av, bv) = (
                rng.vec(a_ne.iter().product()),
                rng.vec(b_ne.iter().product()),
            );
            let ex = run(&g, &[], &[(a, f32_bytes(&av)), (b, f32_bytes(&bv))]);
            let want: Vec<f64> = each4(a_ne)
                .map(|i| {
                    let bi = [
                        i[0] % b_ne[0],
                        i[1] % b_ne[1],
                        i[2] % b_ne[2],
                        i[3] % b_ne[3],
                    ];
                    let (x, z) = (av[idx4(a_ne, i)] as f64, bv[idx4(b_ne, bi)] as f64);
                    if mul {
                        x * z
                    } else {
                        x + z
                    }
                })
                .collect();
            assert_close("binary", &ex.output_f32(y).unwrap(), &want, EXACT);
        }
    }
}

/// GELU (tanh form) as ggml's CPU backend evaluates it: input rounded to f16, result rounded to
/// f16, exact limits beyond +-10.
fn gelu64(x: f64) -> f64 {
    if x <= -10.0 {
        return 0.0;
    }
    if x >= 10.0 {
        return x;
    }
    let h = half::f16::from_f64(x).to_f64();
    let y =
        0.5 * h * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (h + 0.044715 * h * h * h)).tanh());
    half::f16::from_f64(y).to_f64()
}

fn silu64(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn unary_norms_and_gates() {
    let mut rng = Rng::new(2);
    for ne in [[1usize, 1, 1, 1], [33, 5, 1, 1], [640, 3, 2, 1]] {
        let n: usize = ne.iter().product();
        let xv: Vec<f32> = rng.vec(n).iter().map(|v| v * 3.0).collect();
        let uv = rng.vec(n);
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &ne).unwrap();
        let u = g.input("u", DType::F32, &ne).unwrap();
        let outs = [
            g.scale(x, 0.37).unwrap(),
            g.gelu(x).unwrap(),
            g.silu(x).unwrap(),
            g.rms_norm(x, 1e-6).unwrap(),
            g.norm(x, 1e-5).unwrap(),
            g.swiglu(x, u).unwrap(),
            g.geglu(x, u).unwrap(),
            g.gated(Act::Gelu, u, x).unwrap(),
        ];
        for &o in &outs {
            g.mark_output(o).unwrap();
        }
        let ex = run(&g, &[], &[(x, f32_bytes(&xv)), (u, f32_bytes(&uv))]);
        let x64: Vec<f64> = xv.iter().map(|&v| v as f64).collect();
        let u64v: Vec<f64> = uv.iter().map(|&v| v as f64).collect();
        let rows = |f: &dyn Fn(&[f64]) -> Vec<f64>| -> Vec<f64> {
            x64.chunks(ne[0]).flat_map(f).collect()
        };
        let rms = rows(&|r| {
            let s = (r.iter().map(|v| v * v).sum::<f64>() / r.len() as f64 + 1e-6).sqrt();
            r.iter().map(|v| v / s).collect()
        });
        let norm = rows(&|r| {
            let m = r.iter().sum::<f64>() / r.len() as f64;
            let var = r.iter().map(|v| (v - m).powi(2)).sum::<f64>() / r.len() as f64;
            r.iter().map(|v| (v - m) / (var + 1e-5).sqrt()).collect()
        });
        let wants: Vec<(&str, Vec<f64>, f64)> = vec![
            (
                "scale",
                x64.iter().map(|v| v * 0.37f32 as f64).collect(),
                EXACT,
            ),
            ("gelu", x64.iter().map(|&v| gelu64(v)).collect(), FLOAT),
            ("silu", x64.iter().map(|&v| silu64(v)).collect(), FLOAT),
            ("rms_norm", rms, FLOAT),
            ("norm", norm, FLOAT),
            (
                "swiglu",
                x64.iter()
                    .zip(&u64v)
                    .map(|(&a, &b)| silu64(a) * b)
                    .collect(),
                FLOAT,
            ),
            (
                "geglu",
                x64.iter()
                    .zip(&u64v)
                    .map(|(&a, &b)| gelu64(a) * b)
                    .collect(),
                FLOAT,
            ),
            (
                "geglu(u,x)",
                u64v.iter()
                    .zip(&x64)
                    .map(|(&a, &b)| gelu64(a) * b)
                    .collect(),
                FLOAT,
            ),
        ];
        for (o, (name, want, bound)) in outs.iter().zip(wants) {
            assert_close(name, &ex.output_f32(*o).unwrap(), &want, bound);
        }
    }
}

/// Rotary embedding in f64 with ggml's YaRN formulas (correction dims and ramp as
/// `ggml_rope_yarn_corr_dims` / `rope_yarn_ramp`, magnitude `attn_factor * (1 + 0.1 ln(1/s))`).
fn rope_ref(x: &[f32], ne: [usize; 4], pos: &[i32], p: RopeParams, ff: Option<&[f32]>) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    let half = p.n_dims / 2;
    let nd = p.n_dims as f64;
    let corr_dim = |beta: f64| {
        nd * (p.n_ctx_orig as f64 / (beta * 2.0 * std::f64::consts::PI)).ln()
            / (2.0 * (p.freq_base as f64).ln())
    };
    let lo = corr_dim(p.beta_fast as f64).floor().max(0.0);
    let hi = corr_dim(p.beta_slow as f64).ceil().min(nd - 1.0);
    let ext = p.ext_factor as f64;
    let fs = p.freq_scale as f64;
    let mut mscale = p.attn_factor as f64;
    if ext != 0.0 {
        mscale *= 1.0 + 0.1 * (1.0 / fs).ln();
    }
    for t in 0..ne[2] {
        for h in 0..ne[1] {
            let base = ne[0] * (h + ne[1] * t);
            for i in 0..half {
                let freq = (p.freq_base as f64).powf(-2.0 * i as f64 / nd);
                let mut extrap = pos[t] as f64 * freq;
                if let Some(f) = ff {
                    extrap /= f[i] as f64;
                }
                let interp = extrap * fs;
                let th = if ext != 0.0 {
                    let y = (i as f64 - lo) / (hi - lo).max(0.001);
                    let mix = (1.0 - y.clamp(0.0, 1.0)) * ext;
                    interp * (1.0 - mix) + extrap * mix
                } else {
                    interp
                };
                let (a, b) = match p.mode {
                    RopeMode::Normal => (2 * i, 2 * i + 1),
                    RopeMode::Neox => (i, i + half),
                };
                let (x0, x1) = (x[base + a] as f64, x[base + b] as f64);
                let (sn, cs) = (th.sin() * mscale, th.cos() * mscale);
                out[base + a] = x0 * cs - x1 * sn;
                out[base + b] = x0 * sn + x1 * cs;
            }
        }
    }
    out
}

#[test]
fn rope_modes_partial_scaled_and_yarn() {
    let mut rng = Rng::new(3);
    let yarn = |mode, n_dims, scale: f32| RopeParams {
        ext_factor: 1.0,
        attn_factor: 0.9,
        n_ctx_orig: 512,
        ..RopeParams::new(mode, n_dims, 10000.0, scale)
    };
    for (p, d, use_ff) in [
        (
            RopeParams::new(RopeMode::Normal, 64, 10000.0, 1.0),
            64,
            false,
        ),
        (
            RopeParams::new(RopeMode::Neox, 256, 10000.0, 1.0),
            256,
            false,
        ),
        (
            RopeParams::new(RopeMode::Neox, 32, 10000.0, 0.25),
            80,
            false,
        ),
        (
            RopeParams::new(RopeMode::Normal, 48, 10000.0, 1.0),
            48,
            true,
        ),
        (yarn(RopeMode::Normal, 64, 0.25), 64, false),
        (yarn(RopeMode::Neox, 32, 0.125), 48, true),
    ] {
        let n_dims = p.n_dims;
        let ne = [d, 3, 5, 1];
        let xv = rng.vec(d * 15);
        let pos = [0, 1, 7, 100, 4097];
        let ffv: Vec<f32> = (0..n_dims / 2).map(|i| 1.0 + i as f32 * 0.5).collect();
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &ne).unwrap();
        let ps = g.input("pos", DType::I32, &[5]).unwrap();
        let ff = g.input("ff", DType::F32, &[n_dims / 2]).unwrap();
        let y = g.rope(x, ps, p, use_ff.then_some(ff)).unwrap();
        g.mark_output(y).unwrap();
        let mut ins = vec![(x, f32_bytes(&xv)), (ps, i32_bytes(&pos))];
        if use_ff {
            ins.push((ff, f32_bytes(&ffv)));
        }
        let ex = run(&g, &[], &ins);
        let want = rope_ref(&xv, ne, &pos, p, use_ff.then_some(&ffv[..]));
        assert_close("rope", &ex.output_f32(y).unwrap(), &want, FLOAT);
        if p.ext_factor != 0.0 {
            // YaRN really changes the result: the plain scaled rope is far from it.
            let plain = RopeParams::new(p.mode, n_dims, 10000.0, p.freq_scale);
            let other = rope_ref(&xv, ne, &pos, plain, use_ff.then_some(&ffv[..]));
            assert!(common::nmse(&ex.output_f32(y).unwrap(), &other) > 1e-3);
        }
    }
}

#[test]
fn soft_max_with_mask_and_scale() {
    let mut rng = Rng::new(4);
    for ne in [[7usize, 3, 2, 1], [32, 4, 1, 1]] {
        let n: usize = ne.iter().product();
        let xv = rng.vec(n);
        let mut mv = rng.vec(ne[0] * ne[1]);
        mv[1] = f32::NEG_INFINITY;
        let mut g = Graph::new();
        let x = g.input("x", DType::F32, &ne).unwrap();
        let m = g.input("m", DType::F32, &[ne[0], ne[1]]).unwrap();
        let y = g.soft_max_ext(x, Some(m), 0.5).unwrap();
        let z = g.soft_max_ext(x, None, 1.0).unwrap();
        g.mark_output(y).unwrap();
        g.mark_output(z).unwrap();
        let ex = run(&g, &[], &[(x, f32_bytes(&xv)), (m, f32_bytes(&mv))]);
        let sm = |with_mask: bool| -> Vec<f64> {
            let mut out = Vec::new();
            for (r, row) in xv.chunks(ne[0]).enumerate() {
                let i1 = r % ne[1];
                let v: Vec<f64> = row
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        if with_mask {
                            x as f64 * 0.5 + mv[i1 * ne[0] + i] as f64
                        } else {
                            x as f64
                        }
                    })
                    .collect();
                let mx = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let s: f64 = v.iter().map(|a| (a - mx).exp()).sum();
                out.extend(v.iter().map(|a| (a - mx).exp() / s));
            }
            out
        };
        assert_close(
            "soft_max mask",
            &ex.output_f32(y).unwrap(),
            &sm(true),
            FLOAT,
        );
        assert_close("soft_max", &ex.output_f32(z).unwrap(), &sm(false), FLOAT);
    }
}

#[test]
fn views_cont_concat_argmax() {
    let mut rng = Rng::new(5);
    let ne = [5usize, 4, 3, 1];
    let xv = rng.vec(60);
    let yv = rng.vec(60);
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &ne).unwrap();
    let y = g.input("y", DType::F32, &ne).unwrap();
    let xt = g.transpose(x).unwrap();
    let xtc = g.cont(xt).unwrap();
    let xp = g.permute(x, [2, 0, 1, 3]).unwrap(); // src dim0 -> dim2, dim1 -> dim0, dim2 -> dim1
    let xpc = g.cont(xp).unwrap();
    let r = g.reshape(x, &[20, 3]).unwrap();
    let v = g.view(x, &[3, 2], &[5 * 4], 4 * 5 + 4).unwrap(); // 3 values of rows 1 and 2 (byte strides)
    let vc = g.cont(v).unwrap();
    let c0 = g.concat(x, y, 0).unwrap();
    let c1 = g.concat(x, y, 1).unwrap();
    let c2 = g.concat(x, y, 2).unwrap();
    let am = g.argmax(r).unwrap();
    for o in [xtc, xpc, vc, c0, c1, c2, am] {
        g.mark_output(o).unwrap();
    }
    let ex = run(&g, &[], &[(x, f32_bytes(&xv)), (y, f32_bytes(&yv))]);
    let at = |i0: usize, i1: usize, i2: usize| xv[idx4(ne, [i0, i1, i2, 0])] as f64;
    let want_t: Vec<f64> = each4([4, 5, 3, 1]).map(|i| at(i[1], i[0], i[2])).collect();
    assert_close("transpose", &ex.output_f32(xtc).unwrap(), &want_t, EXACT);
    let want_p: Vec<f64> = each4([4, 3, 5, 1]).map(|i| at(i[2], i[0], i[1])).collect();
    assert_close("permute", &ex.output_f32(xpc).unwrap(), &want_p, EXACT);
    // View: offset 24 bytes = element 6 = (1, 1); row stride 20 bytes = one dim-1 step.
    let want_v: Vec<f64> = each4([3, 2, 1, 1])
        .map(|i| xv[6 + i[0] + 5 * i[1]] as f64)
        .collect();
    assert_close("view", &ex.output_f32(vc).unwrap(), &want_v, EXACT);
    let cat = |dim: usize| -> Vec<f64> {
        let mut one = ne;
        one[dim] *= 2;
        each4(one)
            .map(|mut i| {
                if i[dim] < ne[dim] {
                    xv[idx4(ne, i)] as f64
                } else {
                    i[dim] -= ne[dim];
                    yv[idx4(ne, i)] as f64
                }
            })
            .collect()
    };
    assert_close("concat0", &ex.output_f32(c0).unwrap(), &cat(0), EXACT);
    assert_close("concat1", &ex.output_f32(c1).unwrap(), &cat(1), EXACT);
    assert_close("concat2", &ex.output_f32(c2).unwrap(), &cat(2), EXACT);
    let want_am: Vec<i32> = xv
        .chunks(20)
        .map(|r| {
            r.iter()
                .enumerate()
                .fold(0, |b, (i, &v)| if v > r[b] { i } else { b }) as i32
        })
        .collect();
    assert_eq!(ex.output_i32(am).unwrap(), want_am);
}

#[test]
fn get_rows_float_and_quantized() {
    let mut rng = Rng::new(6);
    for ty in [
        DType::F32,
        DType::F16,
        DType::BF16,
        DType::Q8_0,
        DType::Q4_K,
        DType::Q6_K,
        DType::Q5_0,
    ] {
        let (k, rows) = (256, 9);
        let table = random_weights(&mut rng, ty, k * rows);
        let ids = [3i32, 0, 8, 3];
        let mut g = Graph::new();
        let t = g.weight("t", ty, &[k, rows]).unwrap();
        let i = g.input("ids", DType::I32, &[4]).unwrap();
        let y = g.get_rows(t, i).unwrap();
        g.mark_output(y).unwrap();
        let ex = run(
            &g,
            &[("t", ty, &[k, rows], table.clone())],
            &[(i, i32_bytes(&ids))],
        );
        let deq = dequant(ty, &table, k);
        let want: Vec<f64> = ids
            .iter()
            .flat_map(|&r| deq[r as usize * k..(r as usize + 1) * k].to_vec())
            .collect();
        assert_close(
            &format!("get_rows {ty}"),
            &ex.output_f32(y).unwrap(),
            &want,
            EXACT,
        );
    }
}

#[test]
fn softcap_bounds_and_matches_tanh() {
    let mut rng = Rng::new(9);
    let xv: Vec<f32> = rng.vec(300).iter().map(|v| v * 40.0).collect();
    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[100, 3]).unwrap();
    let y = g.softcap(x, 30.0).unwrap();
    g.mark_output(y).unwrap();
    assert!(g.softcap(x, 0.0).is_err());
    let ex = run(&g, &[], &[(x, f32_bytes(&xv))]);
    let got = ex.output_f32(y).unwrap();
    let want: Vec<f64> = xv
        .iter()
        .map(|&v| 30.0 * (v as f64 / 30.0).tanh())
        .collect();
    assert_close("softcap", &got, &want, FLOAT);
    assert!(got.iter().all(|v| v.abs() <= 30.0));
}
