//! Quantized kernels on the GPU against the `gguf` crate's CPU dequantization: Q8_1 activation
//! quantization, mat-vec for every weight type, dequantize-to-f16 (+ gemmEx, the prefill path)
//! and get_rows.

mod common;

use common::{assert_nmse, gpu, Arg, Rng};
use gguf::GgmlType;
use gpu_mem::{Blas, GemmShape, Op};
use half::f16;
use rocmforge_kernels::{q8_1_vector_bytes, KernelId, WeightType, MATVEC_WARPS, QK8_1};

fn ggml(t: WeightType) -> GgmlType {
    GgmlType::ALL
        .iter()
        .copied()
        .find(|g| g.name() == t.ggml_name())
        .unwrap_or_else(|| panic!("no ggml type {}", t.ggml_name()))
}

/// Byte offsets of the f16 scale fields inside one block (random bytes there could be NaN).
fn f16_fields(t: WeightType) -> &'static [usize] {
    match t {
        WeightType::Q4_0 | WeightType::Q5_0 | WeightType::Q8_0 => &[0],
        WeightType::Q4_1 | WeightType::Q5_1 | WeightType::Q4_K | WeightType::Q5_K => &[0, 2],
        WeightType::Q2_K => &[80, 82],
        WeightType::Q3_K => &[108],
        WeightType::Q6_K => &[208],
    }
}

/// `rows` rows of `ncols` random values' worth of blocks, with sane random scales.
fn random_rows(t: WeightType, rows: usize, ncols: usize, rng: &mut Rng) -> Vec<u8> {
    let nblocks = rows * ncols / t.block_values();
    let mut b = rng.bytes(nblocks * t.block_bytes());
    for blk in b.chunks_mut(t.block_bytes()) {
        for &off in f16_fields(t) {
            let v = 0.002 + 0.01 * rng.f32().abs();
            blk[off..off + 2].copy_from_slice(&common::f16_bits(v).to_le_bytes());
        }
    }
    b
}

fn dequant(t: WeightType, bytes: &[u8]) -> Vec<f32> {
    gguf::dequantize_to_vec(ggml(t), bytes).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn quantize_q8_1_matches_the_cpu_rounding() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(1);
    // Two vectors of 640 values (a vector stride that needs the 16-byte round-up), read from
    // rows 704 floats apart.
    let (n, nvec, x_stride) = (640usize, 2usize, 704usize);
    let x = rng.vec(nvec * x_stride);
    let vb = q8_1_vector_bytes(n);
    assert_eq!(vb % 16, 0);
    let dx = g.upload(&x);
    let dy = g.alloc(nvec * vb);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::QuantizeQ8_1,
            [(n as u32).div_ceil(256), nvec as u32, 1],
            256,
            &[
                dx.arg(),
                dy.arg(),
                Arg::I32(n as i32),
                Arg::I64(x_stride as i64),
            ],
        )
    };
    let y: Vec<u8> = g.download(&dy, nvec * vb);
    let mut off_by_one = 0;
    for v in 0..nvec {
        let yv = &y[v * vb..(v + 1) * vb];
        let xv = &x[v * x_stride..v * x_stride + n];
        for (b, xs) in xv.chunks(QK8_1).enumerate() {
            let ds = &yv[n + 4 * b..n + 4 * b + 4];
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let gd = half::f16::from_le_bytes([ds[0], ds[1]]).to_f32();
            assert_eq!(
                gd,
                half::f16::from_f32(d).to_f32(),
                "vector {v} block {b} scale"
            );
            let mut sum = 0i32;
            for (l, &val) in xs.iter().enumerate() {
                let want = (val / d).round() as i32;
                let got = i32::from(yv[b * QK8_1 + l] as i8);
                assert!(
                    (got - want).abs() <= 1,
                    "vector {v} block {b} value {l}: {got} vs {want}"
                );
                off_by_one += usize::from(got != want);
                sum += got;
            }
            let gs = half::f16::from_le_bytes([ds[2], ds[3]]).to_f32();
            let ws = half::f16::from_f32(sum as f32 * d).to_f32();
            assert!(
                (gs - ws).abs() <= 1e-3 * ws.abs() + 1e-6,
                "vector {v} block {b} sum {gs} vs {ws}"
            );
        }
    }
    assert!(
        off_by_one < nvec * n / 100,
        "{off_by_one} values rounded differently"
    );
}

/// Alignment of the weight rows inside the buffer for `t`: 2 where ggml's block layout is only
/// 2-byte aligned anyway (the kernels' unaligned paths), else 4.
fn misalignment(t: WeightType) -> usize {
    match t {
        WeightType::Q4_1 | WeightType::Q5_1 | WeightType::Q2_K => 4,
        _ => 2,
    }
}

/// Mat-vec of `nrows` x `ncols` random weights of every type against the dequantized weights in
/// f64, for `ny` activation vectors; `misalign` puts the rows at an odd address, `max_grid` caps
/// the grid of the kernels that loop over rows.
fn check_matvec(
    g: &common::Gpu,
    rng: &mut Rng,
    (nrows, ncols, ny): (usize, usize, usize),
    misalign: bool,
    max_grid: u32,
) {
    let x = rng.vec(ny * ncols);
    let dx = g.upload(&x);
    let vb = q8_1_vector_bytes(ncols);
    let dy = g.alloc(ny * vb);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::QuantizeQ8_1,
            [(ncols as u32).div_ceil(256), ny as u32, 1],
            256,
            &[
                dx.arg(),
                dy.arg(),
                Arg::I32(ncols as i32),
                Arg::I64(ncols as i64),
            ],
        )
    };
    for &t in WeightType::ALL {
        if ncols % t.block_values() != 0 {
            continue;
        }
        let w = random_rows(t, nrows, ncols, rng);
        let wf = dequant(t, &w);
        let row_bytes = ncols / t.block_values() * t.block_bytes();
        let offset = if misalign { misalignment(t) } else { 0 };
        let mut padded = vec![0u8; offset];
        padded.extend_from_slice(&w);
        let dw = g.upload(&padded);
        let dout = g.alloc(ny * nrows * 4);
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                t.matvec(),
                [
                    (nrows.div_ceil(t.matvec_rows_per_block()) as u32).min(max_grid),
                    ny as u32,
                    1,
                ],
                MATVEC_WARPS * g.warp,
                &[
                    dw.arg_at(offset),
                    dy.arg(),
                    dout.arg(),
                    Arg::I32(ncols as i32),
                    Arg::I64(row_bytes as i64),
                    Arg::I32(nrows as i32),
                    Arg::I32(nrows as i32),
                ],
            )
        };
        let got: Vec<f32> = g.download(&dout, ny * nrows);
        let mut want = vec![0.0f32; ny * nrows];
        for c in 0..ny {
            for r in 0..nrows {
                let s: f64 = (0..ncols)
                    .map(|i| f64::from(wf[r * ncols + i]) * f64::from(x[c * ncols + i]))
                    .sum();
                want[c * nrows + r] = s as f32;
            }
        }
        // 8-bit activations cost ~1e-5 NMSE; a layout slip costs ~1.
        assert_nmse(
            &format!(
                "matvec {} {nrows}x{ncols} x{ny} offset {offset}",
                t.ggml_name()
            ),
            &got,
            &want,
            5e-4,
        );
    }
}

#[test]
fn matvec_every_weight_type_against_dequantized_reference() {
    let Some(g) = gpu() else { return };
    println!("device: {}", g.name);
    let mut rng = Rng::new(2);
    // Rows not a multiple of the rows per block; 1024 columns: whole warp steps for most types.
    check_matvec(&g, &mut rng, (37, 1024, 2), false, u32::MAX);
    // 11 super-blocks / 88 small blocks: a partial last step, and rows at odd addresses.
    check_matvec(&g, &mut rng, (19, 2816, 1), true, u32::MAX);
    // Fewer blocks than one warp step (640 values: Gemma 3's width).
    check_matvec(&g, &mut rng, (5, 640, 3), false, u32::MAX);
    check_matvec(&g, &mut rng, (9, 768, 1), true, u32::MAX);
    // Grids smaller than the row groups: the kernels loop over rows.
    check_matvec(&g, &mut rng, (133, 4096, 1), false, 2);
    check_matvec(&g, &mut rng, (61, 1536, 2), true, 1);
}

#[test]
fn matvec_float_weights() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(3);
    let (nrows, ncols, stride) = (29usize, 300usize, 320usize);
    let w = rng.vec(nrows * stride);
    let x = rng.vec(ncols);
    let mut want = vec![0.0f32; nrows];
    for (r, o) in want.iter_mut().enumerate() {
        *o = (0..ncols)
            .map(|i| f64::from(w[r * stride + i]) * f64::from(x[i]))
            .sum::<f64>() as f32;
    }
    let dx = g.upload(&x);
    let dout = g.alloc(nrows * 4);
    let args = |dw| {
        [
            dw,
            dx.arg(),
            dout.arg(),
            Arg::I32(ncols as i32),
            Arg::I64(stride as i64),
            Arg::I32(nrows as i32),
        ]
    };
    let dw = g.upload(&w);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::MatvecF32,
            [nrows as u32, 1, 1],
            2 * g.warp,
            &args(dw.arg()),
        )
    };
    assert_nmse("matvec f32", &g.download::<f32>(&dout, nrows), &want, 1e-10);
    let wh: Vec<u16> = w.iter().map(|&v| common::f16_bits(v)).collect();
    let mut want_h = vec![0.0f32; nrows];
    for (r, o) in want_h.iter_mut().enumerate() {
        *o = (0..ncols)
            .map(|i| f64::from(half::f16::from_bits(wh[r * stride + i]).to_f32()) * f64::from(x[i]))
            .sum::<f64>() as f32;
    }
    let dwh = g.upload(&wh);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::MatvecF16,
            [nrows as u32, 1, 1],
            2 * g.warp,
            &args(dwh.arg()),
        )
    };
    assert_nmse(
        "matvec f16",
        &g.download::<f32>(&dout, nrows),
        &want_h,
        1e-10,
    );
}

#[test]
fn dequant_f16_and_get_rows_every_weight_type() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(4);
    let (nrows, ncols) = (5usize, 512usize);
    let ids: Vec<i32> = vec![3, 0, 4, 3, 1];
    let dids = g.upload(&ids);
    for &t in WeightType::ALL {
        let w = random_rows(t, nrows, ncols, &mut rng);
        let wf = dequant(t, &w);
        let row_bytes = ncols / t.block_values() * t.block_bytes();
        let dw = g.upload(&w);
        let subs = (ncols / 32) as u32;
        let dh = g.alloc(nrows * ncols * 2);
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                t.dequant_f16(),
                [subs.div_ceil(64), nrows as u32, 1],
                64,
                &[
                    dw.arg(),
                    dh.arg(),
                    Arg::I32(ncols as i32),
                    Arg::I64(row_bytes as i64),
                    Arg::I64(ncols as i64),
                ],
            )
        };
        let got: Vec<u16> = g.download(&dh, nrows * ncols);
        for (i, (&h, &want)) in got.iter().zip(&wf).enumerate() {
            let v = half::f16::from_bits(h).to_f32();
            assert!(
                (v - want).abs() <= 1e-3 * want.abs() + 1e-6,
                "dequant_f16 {} value {i}: {v} vs {want}",
                t.ggml_name()
            );
        }
        let dr = g.alloc(ids.len() * ncols * 4);
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                t.get_rows(),
                [subs.div_ceil(64), ids.len() as u32, 1],
                64,
                &[
                    dw.arg(),
                    dids.arg(),
                    dr.arg(),
                    Arg::I32(ncols as i32),
                    Arg::I64(row_bytes as i64),
                    Arg::I64(ncols as i64),
                ],
            )
        };
        let rows: Vec<f32> = g.download(&dr, ids.len() * ncols);
        for (k, &id) in ids.iter().enumerate() {
            for c in 0..ncols {
                let (v, want) = (rows[k * ncols + c], wf[id as usize * ncols + c]);
                assert!(
                    (v - want).abs() <= 1e-6 * want.abs() + 1e-7,
                    "get_rows {} row {id} col {c}: {v} vs {want}",
                    t.ggml_name()
                );
            }
        }
    }
}

#[test]
fn get_rows_float_tables() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(5);
    let (nrows, ncols, stride) = (6usize, 100usize, 104usize);
    let t = rng.vec(nrows * stride);
    let th: Vec<u16> = t.iter().map(|&v| common::f16_bits(v)).collect();
    let ids: Vec<i32> = vec![5, 2, 2, 0];
    let dids = g.upload(&ids);
    let dout = g.alloc(ids.len() * ncols * 4);
    for (k, dt) in [
        (KernelId::GetRowsF32, g.upload(&t)),
        (KernelId::GetRowsF16, g.upload(&th)),
    ] {
        // SAFETY: the buffers were allocated above for the shapes and counts passed here.
        unsafe {
            g.launch(
                k,
                [1, ids.len() as u32, 1],
                128,
                &[
                    dt.arg(),
                    dids.arg(),
                    dout.arg(),
                    Arg::I32(ncols as i32),
                    Arg::I64(stride as i64),
                    Arg::I64(ncols as i64),
                ],
            )
        };
        let got: Vec<f32> = g.download(&dout, ids.len() * ncols);
        for (r, &id) in ids.iter().enumerate() {
            for c in 0..ncols {
                let src = t[id as usize * stride + c];
                let want = if k == KernelId::GetRowsF16 {
                    half::f16::from_f32(src).to_f32()
                } else {
                    src
                };
                assert_eq!(got[r * ncols + c], want, "{} row {r} col {c}", k.name());
            }
        }
    }
}

/// The prefill path: weights dequantized to f16 on the device, activations converted to f16,
/// one gemmEx with f32 output, against the CPU product of the same rounded operands.
#[test]
fn dequantized_weights_through_gemm_ex() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng::new(6);
    let (m, n, k) = (96usize, 7usize, 512usize);
    let t = WeightType::Q4_K;
    let w = random_rows(t, m, k, &mut rng);
    let wf = dequant(t, &w);
    let x = rng.vec(n * k);
    let dw = g.upload(&w);
    let dwh = g.alloc(m * k * 2);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            t.dequant_f16(),
            [(k as u32 / 32).div_ceil(64), m as u32, 1],
            64,
            &[
                dw.arg(),
                dwh.arg(),
                Arg::I32(k as i32),
                Arg::I64((k / 256 * 144) as i64),
                Arg::I64(k as i64),
            ],
        )
    };
    let dx = g.upload(&x);
    let dxh = g.alloc(n * k * 2);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::ConvertF32F16,
            [((n * k) as u32).div_ceil(256), 1, 1],
            256,
            &[dx.arg(), dxh.arg(), Arg::I64((n * k) as i64)],
        )
    };
    let dc = g.alloc(n * m * 4);
    let blas = Blas::new(&g.stream).expect("blas handle");
    // Row-major out[n][m] = X[n][k] . W[m][k]^T is column-major C(m x n) = W^T(k x m)^T X^T(k x n).
    let shape = GemmShape {
        trans_a: Op::T,
        trans_b: Op::N,
        m,
        n,
        k,
        lda: k,
        ldb: k,
        ldc: m,
    };
    blas.gemm_ex(
        &shape,
        1.0,
        &dwh.range().view::<f16>().expect("f16 weights"),
        &dxh.range().view::<f16>().expect("f16 activations"),
        0.0,
        &mut dc.range().view_mut::<f32>().expect("f32 result"),
    )
    .expect("gemm_ex");
    // Waits for the GEMM.
    let got: Vec<f32> = g.download(&dc, n * m);
    drop(blas);
    let r16 = |v: f32| f64::from(half::f16::from_f32(v).to_f32());
    let mut want = vec![0.0f32; n * m];
    for j in 0..n {
        for i in 0..m {
            want[j * m + i] = (0..k)
                .map(|l| r16(wf[i * k + l]) * r16(x[j * k + l]))
                .sum::<f64>() as f32;
        }
    }
    assert_nmse("dequant q4_K + gemm_ex", &got, &want, 1e-6);
}
