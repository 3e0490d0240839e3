//! GPU throughput of the decode and prefill building blocks: quantized mat-vec (weight bytes
//! read per second, against the device's bandwidth) and dequantize + gemmEx (TFLOP/s), at
//! Llama-3-8B and Gemma-3-270M projection shapes. Timed with stream events over many launches.
//! Without a GPU or built kernels it prints why and exits.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{gpu, Arg, Gpu, Rng};
use hip_ffi::{GemmEx, GemmType, Op, PointerMode};
use kernels::{KernelId, WeightType, Q8_1_BYTES, QK8_1};

const ITERS: u32 = 200;

fn time_ms(g: &Gpu, iters: u32, mut f: impl FnMut()) -> f64 {
    let api = g.api;
    let (a, b) = (
        api.event_create(true).expect("event"),
        api.event_create(true).expect("event"),
    );
    f(); // warm-up (module load, clocks)
         // SAFETY: both events and the stream are live for the whole measurement.
    unsafe {
        api.stream_synchronize(g.stream).expect("sync");
        api.event_record(a, g.stream).expect("record");
    }
    for _ in 0..iters {
        f();
    }
    // SAFETY: as above; the events are destroyed once, after their last use.
    unsafe {
        api.event_record(b, g.stream).expect("record");
        api.event_synchronize(b).expect("event sync");
        let ms = api.event_elapsed_ms(a, b).expect("elapsed");
        api.event_destroy(a).expect("destroy");
        api.event_destroy(b).expect("destroy");
        f64::from(ms) / f64::from(iters)
    }
}

fn main() {
    let Some(g) = gpu() else { return };
    let g = g.no_sync();
    println!("device: {}", g.name);
    let mut rng = Rng::new(7);
    // (what, rows, cols)
    let shapes = [
        ("8B attn_q/o 4096x4096", 4096usize, 4096usize),
        ("8B ffn_up 14336x4096", 14336, 4096),
        ("8B ffn_down 4096x14336", 4096, 14336),
        ("270M ffn_up 2048x640", 2048, 640),
        ("270M output 262144x640", 262144, 640),
    ];
    println!("matvec (quantize x to Q8_1 + dot): us per call, weight GB/s");
    for t in [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q8_0,
        WeightType::Q4_0,
        WeightType::Q5_0,
    ] {
        for (what, rows, cols) in shapes {
            if cols % t.block_values() != 0 {
                continue;
            }
            let wbytes = rows * cols / t.block_values() * t.block_bytes();
            let w = g.upload(&rng.bytes(wbytes));
            let x = g.upload(&rng.vec(cols));
            let y = g.alloc(cols / QK8_1 * Q8_1_BYTES);
            let out = g.alloc(rows * 4);
            let row_bytes = (wbytes / rows) as i64;
            let ms = time_ms(&g, ITERS, || {
                g.launch(
                    KernelId::QuantizeQ8_1,
                    [(cols as u32).div_ceil(256), 1, 1],
                    256,
                    &[x.arg(), y.arg(), Arg::I32(cols as i32)],
                );
                g.launch(
                    t.matvec(),
                    [(rows as u32).div_ceil(4), 1, 1],
                    4 * g.warp,
                    &[
                        w.arg(),
                        y.arg(),
                        out.arg(),
                        Arg::I32(cols as i32),
                        Arg::I64(row_bytes),
                        Arg::I32(rows as i32),
                        Arg::I32(rows as i32),
                    ],
                );
            });
            println!(
                "  {:5} {what:28} {:8.1} us {:7.0} GB/s",
                t.ggml_name(),
                ms * 1e3,
                wbytes as f64 / (ms * 1e-3) / 1e9
            );
        }
    }
    println!("prefill (dequant to f16 + gemmEx, 512 tokens): ms per call, TFLOP/s");
    let handle = g.api.blas_create().expect("blas");
    // SAFETY: the handle and stream are live.
    unsafe {
        g.api
            .blas_set_stream(handle, g.stream)
            .expect("blas stream");
        g.api
            .blas_set_pointer_mode(handle, PointerMode::Host)
            .expect("pointer mode");
    }
    for (what, n, k) in [
        ("8B 4096x4096", 4096usize, 4096usize),
        ("8B 14336x4096", 14336, 4096),
    ] {
        let m = 512usize;
        let t = WeightType::Q4_K;
        let wbytes = n * k / 256 * 144;
        let w = g.upload(&rng.bytes(wbytes));
        let wh = g.alloc(n * k * 2);
        let xh = g.upload(&vec![0u16; m * k]);
        let c = g.alloc(n * m * 4);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let args = GemmEx {
            trans_a: Op::T,
            trans_b: Op::N,
            m: n as i32,
            n: m as i32,
            k: k as i32,
            alpha: &alpha,
            a: wh.ptr,
            a_type: GemmType::F16,
            lda: k as i32,
            b: xh.ptr,
            b_type: GemmType::F16,
            ldb: k as i32,
            beta: &beta,
            c: c.ptr,
            c_type: GemmType::F32,
            ldc: n as i32,
        };
        let ms = time_ms(&g, 50, || {
            g.launch(
                t.dequant_f16(),
                [(k as u32 / 32).div_ceil(64), n as u32, 1],
                64,
                &[
                    w.arg(),
                    wh.arg(),
                    Arg::I32(k as i32),
                    Arg::I64((k / 256 * 144) as i64),
                    Arg::I64(k as i64),
                ],
            );
            // SAFETY: operands sized for the shapes above; alpha/beta live across the call.
            unsafe { g.api.gemm_ex(handle, &args) }.expect("gemm_ex");
        });
        println!(
            "  q4_K {what:28} {:8.3} ms {:7.1} TFLOP/s",
            ms,
            2.0 * (m * n * k) as f64 / (ms * 1e-3) / 1e12
        );
    }
    // SAFETY: the stream is synchronized by the last measurement; the handle is not used again.
    unsafe { g.api.blas_destroy(handle) }.expect("blas destroy");
}
