//! Row-wise, element-wise and attention kernels on the GPU against f64 CPU references.

mod common;

use common::{assert_nmse, gpu, Arg, Rng};
use rocmforge_kernels::{act, binary, AttnParams, KernelId};

const NULL: Arg<'static> = Arg::Null;

#[test]
fn rms_norm_with_and_without_weight() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(10);
    let (rows, ncols, stride, eps) = (3usize, 640usize, 700usize, 1e-6f32);
    let x = rng.vec(rows * stride);
    let w = rng.vec(ncols);
    let (dx, dw, dy) = (g.upload(&x), g.upload(&w), g.alloc(rows * ncols * 4));
    for with_w in [true, false] {
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                KernelId::RmsNormF32,
                [rows as u32, 1, 1],
                256,
                &[
                    dx.arg(),
                    if with_w { dw.arg() } else { NULL },
                    dy.arg(),
                    Arg::I32(ncols as i32),
                    Arg::I64(stride as i64),
                    Arg::I64(ncols as i64),
                    Arg::F32(eps),
                ],
            )
        };
        let mut want = vec![0.0f32; rows * ncols];
        for r in 0..rows {
            let xr = &x[r * stride..r * stride + ncols];
            let ms = xr.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / ncols as f64;
            let s = 1.0 / (ms + f64::from(eps)).sqrt();
            for c in 0..ncols {
                let wv = if with_w { f64::from(w[c]) } else { 1.0 };
                want[r * ncols + c] = (f64::from(xr[c]) * s * wv) as f32;
            }
        }
        assert_nmse(
            "rms_norm",
            &g.download::<f32>(&dy, rows * ncols),
            &want,
            1e-12,
        );
    }
}

#[test]
fn rope_normal_and_neox_full_and_partial() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(11);
    let (n_tok, n_heads, hd) = (3usize, 4usize, 64usize);
    let rows = n_tok * n_heads;
    let x = rng.vec(rows * hd);
    let pos: Vec<i32> = vec![5, 17, 1000];
    let ff: Vec<f32> = (0..hd / 2).map(|i| 1.0 + i as f32 * 0.25).collect();
    let (dx, dpos, dff, dy) = (
        g.upload(&x),
        g.upload(&pos),
        g.upload(&ff),
        g.alloc(rows * hd * 4),
    );
    let base = 10000.0f32;
    for neox in [false, true] {
        for n_dims in [64usize, 32] {
            for with_ff in [false, true] {
                // SAFETY: the buffers were allocated above for the shapes and counts passed here.
                unsafe {
                    g.launch(
                        KernelId::RopeF32,
                        [((rows * hd / 2) as u32).div_ceil(128), 1, 1],
                        128,
                        &[
                            dx.arg(),
                            dy.arg(),
                            dpos.arg(),
                            Arg::I32(n_heads as i32),
                            Arg::I32(hd as i32),
                            Arg::I32(n_dims as i32),
                            Arg::I64(hd as i64),
                            Arg::I64(hd as i64),
                            Arg::F32(base),
                            Arg::F32(1.0),
                            if with_ff { dff.arg() } else { NULL },
                            Arg::I32(i32::from(neox)),
                            Arg::I32(rows as i32),
                            // No YaRN: ext_factor 0, magnitude 1, correction dims unused.
                            Arg::F32(0.0),
                            Arg::F32(1.0),
                            Arg::F32(0.0),
                            Arg::F32(0.0),
                        ],
                    )
                };
                let mut want = x.clone();
                for r in 0..rows {
                    let p = f64::from(pos[r / n_heads]);
                    for (i, &ffi) in ff.iter().enumerate().take(n_dims / 2) {
                        let mut th = p * f64::from(base).powf(-2.0 * i as f64 / n_dims as f64);
                        if with_ff {
                            th /= f64::from(ffi);
                        }
                        let (i0, i1) = if neox {
                            (i, i + n_dims / 2)
                        } else {
                            (2 * i, 2 * i + 1)
                        };
                        let (a, b) = (f64::from(x[r * hd + i0]), f64::from(x[r * hd + i1]));
                        want[r * hd + i0] = (a * th.cos() - b * th.sin()) as f32;
                        want[r * hd + i1] = (a * th.sin() + b * th.cos()) as f32;
                    }
                }
                assert_nmse(
                    &format!("rope neox={neox} n_dims={n_dims} ff={with_ff}"),
                    &g.download::<f32>(&dy, rows * hd),
                    &want,
                    1e-8,
                );
            }
        }
    }
}

#[test]
fn softmax_with_scale_and_broadcast_mask() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(12);
    let (rows, ncols, scale) = (4usize, 300usize, 0.7f32);
    let x: Vec<f32> = rng.vec(rows * ncols).iter().map(|v| v * 8.0).collect();
    let mut mask = vec![0.0f32; 2 * ncols];
    for (i, m) in mask.iter_mut().enumerate() {
        if i % 7 == 3 {
            *m = f32::NEG_INFINITY;
        } else if i % 5 == 1 {
            *m = -2.5;
        }
    }
    let (dx, dm, dy) = (g.upload(&x), g.upload(&mask), g.alloc(rows * ncols * 4));
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::SoftmaxF32,
            [rows as u32, 1, 1],
            128,
            &[
                dx.arg(),
                dm.arg(),
                dy.arg(),
                Arg::I32(ncols as i32),
                Arg::I64(ncols as i64),
                Arg::I64(ncols as i64),
                Arg::I64(ncols as i64),
                Arg::I32(2),
                Arg::F32(scale),
            ],
        )
    };
    let mut want = vec![0.0f32; rows * ncols];
    for r in 0..rows {
        let v: Vec<f64> = (0..ncols)
            .map(|c| {
                f64::from(x[r * ncols + c]) * f64::from(scale)
                    + f64::from(mask[(r % 2) * ncols + c])
            })
            .collect();
        let mx = v.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let s: f64 = v.iter().map(|a| (a - mx).exp()).sum();
        for c in 0..ncols {
            want[r * ncols + c] = ((v[c] - mx).exp() / s) as f32;
        }
    }
    assert_nmse(
        "softmax",
        &g.download::<f32>(&dy, rows * ncols),
        &want,
        1e-10,
    );
}

/// GELU the way ggml's CPU backend (its f16 lookup table) and our CPU op evaluate it: the input
/// rounded to f16, the tanh form in f32, the result rounded to f16; exact limits beyond +-10.
fn gelu_f16(x: f64) -> f64 {
    if x <= -10.0 {
        0.0
    } else if x >= 10.0 {
        x
    } else {
        let h = half::f16::from_f64(x).to_f32();
        let g = 0.5 * h * (1.0 + (0.797_884_6f32 * h * (1.0 + 0.044_715 * h * h)).tanh());
        f64::from(half::f16::from_f32(g).to_f32())
    }
}
/// Distance from `x` (an f16 value) to the next f16 of larger magnitude.
fn f16_ulp(x: f64) -> f64 {
    let h = half::f16::from_f64(x.abs());
    f64::from(half::f16::from_bits(h.to_bits() + 1).to_f32()) - f64::from(h.to_f32())
}
fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

#[test]
fn activations_plain_and_gated_on_a_fused_gate_up_tensor() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(13);
    let (rows, n) = (3usize, 100usize);
    // [rows, 2n]: gate in the first half of each row, up in the second.
    let gu: Vec<f32> = rng.vec(rows * 2 * n).iter().map(|v| v * 4.0).collect();
    let (dgu, dy) = (g.upload(&gu), g.alloc(rows * n * 4));
    let up = dgu.arg_at(n * 4);
    for (kind, f) in [(act::GELU, gelu_f16 as fn(f64) -> f64), (act::SILU, silu)] {
        for gated in [false, true] {
            // SAFETY: the buffers were allocated above for the shapes and counts passed here.
            unsafe {
                g.launch(
                    KernelId::ActF32,
                    [((rows * n) as u32).div_ceil(128), 1, 1],
                    128,
                    &[
                        dgu.arg(),
                        if gated { up } else { NULL },
                        dy.arg(),
                        Arg::I32(n as i32),
                        Arg::I32(rows as i32),
                        Arg::I64((2 * n) as i64),
                        Arg::I64((2 * n) as i64),
                        Arg::I64(n as i64),
                        Arg::I32(kind),
                    ],
                )
            };
            let want: Vec<f32> = (0..rows * n)
                .map(|i| {
                    let (r, c) = (i / n, i % n);
                    let a = f(f64::from(gu[r * 2 * n + c]));
                    (if gated {
                        a * f64::from(gu[r * 2 * n + n + c])
                    } else {
                        a
                    }) as f32
                })
                .collect();
            let got = g.download::<f32>(&dy, rows * n);
            let what = format!("act kind={kind} gated={gated}");
            if kind == act::GELU {
                // GPU and host tanhf differ by an ulp or two. Below x = -2, 1 + tanh(z) < 0.05
                // cancels most of those bits, and the f32 result may then round to the
                // neighbouring f16 value (a few dozen of these elements do); above, every
                // element must round to exactly the reference's f16 value.
                for (i, (&a, &b)) in got.iter().zip(&want).enumerate() {
                    if a == b {
                        continue;
                    }
                    let (r, c) = (i / n, i % n);
                    let x = f64::from(gu[r * 2 * n + c]);
                    let up = if gated {
                        f64::from(gu[r * 2 * n + n + c]).abs()
                    } else {
                        1.0
                    };
                    assert!(
                        x < -2.0,
                        "{what}: element {i} (x = {x}) got {a} want {b}: not the f16 value"
                    );
                    let step = f16_ulp(gelu_f16(x)) * up * (1.0 + 1e-6);
                    assert!(
                        (f64::from(a) - f64::from(b)).abs() <= step,
                        "{what}: element {i} (x = {x}) got {a} want {b}: more than one f16 step"
                    );
                }
            } else {
                assert_nmse(&what, &got, &want, 1e-10);
            }
        }
    }
}

#[test]
fn binary_ops_broadcast_and_scale_and_convert() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(14);
    let (rows, ncols) = (4usize, 96usize);
    let a = rng.vec(rows * ncols);
    let b = rng.vec(2 * ncols);
    let (da, db, dy) = (g.upload(&a), g.upload(&b), g.alloc(rows * ncols * 4));
    for (op, b_rows, b_cols) in [
        (binary::ADD, 1usize, ncols),
        (binary::MUL, 2, ncols),
        (binary::ADD, 4, 1),
        (binary::MUL, 1, 1),
    ] {
        let b_stride = if b_cols == 1 { 1 } else { ncols };
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                KernelId::BinaryF32,
                [((rows * ncols) as u32).div_ceil(128), 1, 1],
                128,
                &[
                    da.arg(),
                    db.arg(),
                    dy.arg(),
                    Arg::I32(ncols as i32),
                    Arg::I32(rows as i32),
                    Arg::I64(ncols as i64),
                    Arg::I64(b_stride as i64),
                    Arg::I64(ncols as i64),
                    Arg::I32(b_rows as i32),
                    Arg::I32(b_cols as i32),
                    Arg::I32(op),
                ],
            )
        };
        let want: Vec<f32> = (0..rows * ncols)
            .map(|i| {
                let (r, c) = (i / ncols, i % ncols);
                let bv = b[(r % b_rows) * b_stride + c % b_cols];
                if op == binary::ADD {
                    a[i] + bv
                } else {
                    a[i] * bv
                }
            })
            .collect();
        assert_eq!(
            g.download::<f32>(&dy, rows * ncols),
            want,
            "binary op {op} b {b_rows}x{b_cols}"
        );
    }
    let n = rows * ncols;
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::ScaleF32,
            [(n as u32).div_ceil(128), 1, 1],
            128,
            &[
                da.arg(),
                dy.arg(),
                Arg::I64(n as i64),
                Arg::F32(25.3),
                Arg::F32(0.5),
            ],
        )
    };
    let want: Vec<f32> = a
        .iter()
        .map(|v| (f64::from(*v) * 25.3 + 0.5) as f32)
        .collect();
    assert_nmse("scale", &g.download::<f32>(&dy, n), &want, 1e-12);
    let dh = g.alloc(n * 2);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::ConvertF32F16,
            [(n as u32).div_ceil(128), 1, 1],
            128,
            &[da.arg(), dh.arg(), Arg::I64(n as i64)],
        )
    };
    let h: Vec<u16> = g.download(&dh, n);
    let want_h: Vec<u16> = a.iter().map(|&v| common::f16_bits(v)).collect();
    assert_eq!(h, want_h, "convert_f32_f16 rounds to nearest even");
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::ConvertF16F32,
            [(n as u32).div_ceil(128), 1, 1],
            128,
            &[dh.arg(), dy.arg(), Arg::I64(n as i64)],
        )
    };
    let back: Vec<f32> = want_h
        .iter()
        .map(|&b| half::f16::from_bits(b).to_f32())
        .collect();
    assert_eq!(g.download::<f32>(&dy, n), back);
}

#[test]
fn kv_write_places_rows_by_head_and_position() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(15);
    let (n_tok, n_kv, hd, max_pos, pos0) = (3usize, 2usize, 64usize, 16usize, 5usize);
    let src = rng.vec(n_tok * n_kv * hd);
    let ds = g.upload(&src);
    let dc16 = g.alloc(n_kv * max_pos * hd * 2);
    let dc32 = g.alloc(n_kv * max_pos * hd * 4);
    for (k, dc) in [(KernelId::KvWriteF16, &dc16), (KernelId::KvWriteF32, &dc32)] {
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                k,
                [((n_tok * n_kv * hd) as u32).div_ceil(128), 1, 1],
                128,
                &[
                    ds.arg(),
                    dc.arg(),
                    Arg::I32(n_tok as i32),
                    Arg::I32(n_kv as i32),
                    Arg::I32(hd as i32),
                    Arg::I64(hd as i64),
                    Arg::I32(pos0 as i32),
                    Arg::I64(hd as i64),
                    Arg::I64((max_pos * hd) as i64),
                ],
            )
        };
    }
    let c16: Vec<u16> = g.download(&dc16, n_kv * max_pos * hd);
    let c32: Vec<u32> = g.download(&dc32, n_kv * max_pos * hd);
    for h in 0..n_kv {
        for p in 0..max_pos {
            for d in 0..hd {
                let i = (h * max_pos + p) * hd + d;
                if (pos0..pos0 + n_tok).contains(&p) {
                    let v = src[((p - pos0) * n_kv + h) * hd + d];
                    assert_eq!(
                        c16[i],
                        common::f16_bits(v),
                        "f16 cache head {h} pos {p} dim {d}"
                    );
                    assert_eq!(c32[i], v.to_bits(), "f32 cache head {h} pos {p} dim {d}");
                } else {
                    assert_eq!(
                        (c16[i], c32[i]),
                        (0xFFFF, 0xFFFF_FFFF),
                        "untouched head {h} pos {p}"
                    );
                }
            }
        }
    }
}

#[test]
fn argmax_takes_the_first_of_equal_maxima_and_skips_nan() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(16);
    let ncols = 262_144usize;
    let mut x = rng.vec(2 * ncols);
    x[1000] = 7.5;
    x[200_000] = 7.5;
    x[ncols + 5] = f32::NAN;
    x[ncols + 77_777] = 3.0;
    let (dx, dout) = (g.upload(&x), g.alloc(8));
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::ArgmaxF32,
            [2, 1, 1],
            256,
            &[
                dx.arg(),
                dout.arg(),
                Arg::I32(ncols as i32),
                Arg::I64(ncols as i64),
            ],
        )
    };
    assert_eq!(g.download::<i32>(&dout, 2), vec![1000, 77_777]);
}

/// One attention case: caches laid out [kv_head][pos][dim].
struct AttnCase {
    n_tokens: usize,
    n_heads: usize,
    n_kv_heads: usize,
    hd: usize,
    n_kv: usize,
    pos0: usize,
    window: usize,
    split_len: usize,
    f16_cache: bool,
}

fn attention_case(g: &common::Gpu, c: &AttnCase, seed: u64) {
    let mut rng = Rng::new(seed);
    let max_pos = c.n_kv + 3;
    let q = rng.vec(c.n_tokens * c.n_heads * c.hd);
    let mut k = rng.vec(c.n_kv_heads * max_pos * c.hd);
    let mut v = rng.vec(c.n_kv_heads * max_pos * c.hd);
    if c.f16_cache {
        for x in k.iter_mut().chain(v.iter_mut()) {
            *x = half::f16::from_f32(*x).to_f32();
        }
    }
    let scale = 1.0 / (c.hd as f32).sqrt();
    let gqa = c.n_heads / c.n_kv_heads;
    // With an f16 cache the queries and the normalized probabilities are rounded to f16 before
    // their products, as llama.cpp's KQ and KQV matrix products (and our CPU op) round them.
    let round = |x: f64| -> f64 {
        if c.f16_cache {
            f64::from(half::f16::from_f64(x).to_f32())
        } else {
            x
        }
    };
    let mut want = vec![0.0f32; c.n_tokens * c.n_heads * c.hd];
    for t in 0..c.n_tokens {
        let qpos = c.pos0 + t;
        let hi = qpos.min(c.n_kv - 1);
        let lo = if c.window > 0 {
            (qpos + 1).saturating_sub(c.window)
        } else {
            0
        };
        for h in 0..c.n_heads {
            let kvh = h / gqa;
            let qr = &q[(t * c.n_heads + h) * c.hd..][..c.hd];
            let s: Vec<f64> = (lo..=hi)
                .map(|p| {
                    let kr = &k[(kvh * max_pos + p) * c.hd..][..c.hd];
                    qr.iter()
                        .zip(kr)
                        .map(|(a, b)| round(f64::from(*a)) * f64::from(*b))
                        .sum::<f64>()
                        * f64::from(scale)
                })
                .collect();
            let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = s.iter().map(|x| (x - mx).exp()).sum();
            for d in 0..c.hd {
                let o: f64 = (lo..=hi)
                    .zip(&s)
                    .map(|(p, sv)| {
                        round((sv - mx).exp() / z) * f64::from(v[(kvh * max_pos + p) * c.hd + d])
                    })
                    .sum();
                want[(t * c.n_heads + h) * c.hd + d] = o as f32;
            }
        }
    }
    let (dk, dv) = if c.f16_cache {
        let kh: Vec<u16> = k.iter().map(|&x| common::f16_bits(x)).collect();
        let vh: Vec<u16> = v.iter().map(|&x| common::f16_bits(x)).collect();
        (g.upload(&kh), g.upload(&vh))
    } else {
        (g.upload(&k), g.upload(&v))
    };
    let dq = g.upload(&q);
    let pos: Vec<i32> = (0..c.n_tokens).map(|t| (c.pos0 + t) as i32).collect();
    let dpos = g.upload(&pos);
    let dout = g.alloc(want.len() * 4);
    let splits = c.n_kv.div_ceil(c.split_len);
    let dpart = g.alloc(splits * c.n_tokens * c.n_heads * (c.hd + 2) * 4);
    let p = AttnParams {
        n_tokens: c.n_tokens as i32,
        n_heads: c.n_heads as i32,
        n_kv_heads: c.n_kv_heads as i32,
        head_dim: c.hd as i32,
        n_kv: c.n_kv as i32,
        causal: 1,
        window: c.window as i32,
        split_len: c.split_len as i32,
        q_tok_stride: (c.n_heads * c.hd) as i64,
        q_head_stride: c.hd as i64,
        k_pos_stride: c.hd as i64,
        k_head_stride: (max_pos * c.hd) as i64,
        v_pos_stride: c.hd as i64,
        v_head_stride: (max_pos * c.hd) as i64,
        o_tok_stride: (c.n_heads * c.hd) as i64,
        o_head_stride: c.hd as i64,
        scale,
        phase: 0,
    };
    let nw = 4u32;
    let rows = (c.n_tokens * gqa) as u32;
    let kid = if c.f16_cache {
        KernelId::AttnF16
    } else {
        KernelId::AttnF32
    };
    let phases: &[i32] = if splits > 1 { &[1, 2] } else { &[0] };
    for &phase in phases {
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                kid,
                [rows.div_ceil(nw), c.n_kv_heads as u32, splits as u32],
                nw * g.warp,
                &[
                    dq.arg(),
                    dk.arg(),
                    dv.arg(),
                    dpos.arg(),
                    dout.arg(),
                    dpart.arg(),
                    NULL,
                    Arg::Bytes(bytemuck::bytes_of(&AttnParams { phase, ..p })),
                ],
            )
        };
    }
    if splits > 1 {
        let n_rows = c.n_tokens * c.n_heads;
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                KernelId::AttnCombineF32,
                [n_rows as u32, 1, 1],
                128,
                &[
                    dpart.arg(),
                    dout.arg(),
                    Arg::I32(splits as i32),
                    Arg::I32(c.n_heads as i32),
                    Arg::I32(n_rows as i32),
                    Arg::I32(c.hd as i32),
                    Arg::I64((c.n_heads * c.hd) as i64),
                    Arg::I64(c.hd as i64),
                ],
            )
        };
    }
    let what = format!(
        "attention tokens={} heads={}/{} hd={} n_kv={} pos0={} window={} splits={splits} f16={}",
        c.n_tokens, c.n_heads, c.n_kv_heads, c.hd, c.n_kv, c.pos0, c.window, c.f16_cache
    );
    assert_nmse(&what, &g.download::<f32>(&dout, want.len()), &want, 1e-9);
}

#[test]
fn attention_prefill_causal_and_sliding_window() {
    let Some(g) = gpu() else { return };
    let base = AttnCase {
        n_tokens: 9,
        n_heads: 8,
        n_kv_heads: 2,
        hd: 128,
        n_kv: 13,
        pos0: 4,
        window: 0,
        split_len: 1 << 20,
        f16_cache: true,
    };
    attention_case(&g, &base, 20);
    attention_case(
        &g,
        &AttnCase {
            window: 5,
            f16_cache: false,
            ..base
        },
        21,
    );
    // Gemma 3 270M shape: 4 query heads per KV head, head dim 256, 40 prompt tokens.
    attention_case(
        &g,
        &AttnCase {
            n_tokens: 40,
            n_heads: 4,
            n_kv_heads: 1,
            hd: 256,
            n_kv: 40,
            pos0: 0,
            window: 16,
            split_len: 1 << 20,
            f16_cache: true,
        },
        22,
    );
    // Head dim that is not a multiple of the warp size.
    attention_case(
        &g,
        &AttnCase {
            n_tokens: 5,
            n_heads: 6,
            n_kv_heads: 3,
            hd: 80,
            n_kv: 11,
            pos0: 6,
            window: 0,
            split_len: 1 << 20,
            f16_cache: false,
        },
        23,
    );
}

#[test]
fn attention_decode_split_k() {
    let Some(g) = gpu() else { return };
    let dec = AttnCase {
        n_tokens: 1,
        n_heads: 4,
        n_kv_heads: 1,
        hd: 256,
        n_kv: 700,
        pos0: 699,
        window: 0,
        split_len: 128,
        f16_cache: true,
    };
    attention_case(&g, &dec, 30);
    attention_case(&g, &AttnCase { window: 512, ..dec }, 31);
    // Window shorter than a split: the first splits see no key at all.
    attention_case(&g, &AttnCase { window: 100, ..dec }, 32);
    attention_case(
        &g,
        &AttnCase {
            n_heads: 32,
            n_kv_heads: 8,
            hd: 128,
            n_kv: 333,
            pos0: 332,
            split_len: 64,
            f16_cache: false,
            ..dec
        },
        33,
    );
}

#[test]
fn set_rows_writes_indexed_rows_and_leaves_the_rest() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(40);
    let (ncols, n, slots) = (96usize, 3usize, 10usize);
    let src = rng.vec(n * ncols);
    let idx: Vec<i32> = vec![7, 2, 9];
    let (ds, di) = (g.upload(&src), g.upload(&idx));
    let d16 = g.alloc(slots * ncols * 2);
    let d32 = g.alloc(slots * ncols * 4);
    for (k, d) in [(KernelId::SetRowsF16, &d16), (KernelId::SetRowsF32, &d32)] {
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                k,
                [((n * ncols) as u32).div_ceil(128), 1, 1],
                128,
                &[
                    ds.arg(),
                    di.arg(),
                    d.arg(),
                    Arg::I32(ncols as i32),
                    Arg::I32(n as i32),
                    Arg::I64(ncols as i64),
                    Arg::I64(ncols as i64),
                ],
            )
        };
    }
    let c16: Vec<u16> = g.download(&d16, slots * ncols);
    let c32: Vec<u32> = g.download(&d32, slots * ncols);
    for s in 0..slots {
        let from = idx.iter().position(|&i| i as usize == s);
        for c in 0..ncols {
            match from {
                Some(r) => {
                    let v = src[r * ncols + c];
                    assert_eq!(
                        c16[s * ncols + c],
                        common::f16_bits(v),
                        "f16 slot {s} col {c}"
                    );
                    assert_eq!(c32[s * ncols + c], v.to_bits(), "f32 slot {s} col {c}");
                }
                None => assert_eq!(
                    (c16[s * ncols + c], c32[s * ncols + c]),
                    (0xFFFF, 0xFFFF_FFFF),
                    "slot {s}"
                ),
            }
        }
    }
}
