//! GPU throughput of the decode and prefill building blocks: quantized mat-vec (weight bytes
//! read per second, as a share of the device-to-device copy bandwidth measured in the same run)
//! and dequantize + gemmEx (TFLOP/s), at Llama-3-8B and Gemma-3-270M projection shapes. Timed
//! with stream events over many launches; the weights rotate over copies that together exceed
//! the L2 cache several times, so every launch reads its weights from device memory.
//! Without a GPU or built kernels it prints why and exits.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{gpu, Arg, DevBuf, Gpu, Rng};
use hip_ffi::{CaptureMode, DeviceAttribute, DevicePtr, GemmEx, GemmType, Op, PointerMode};
use kernels::{q8_1_vector_bytes, KernelId, Module, WeightType, MATVEC_WARPS};

const ITERS: u32 = 200;

fn time_ms(g: &Gpu, iters: u32, mut f: impl FnMut(u32)) -> f64 {
    let api = g.api;
    let (a, b) = (
        api.event_create(true).expect("event"),
        api.event_create(true).expect("event"),
    );
    f(0); // warm-up (module load, clocks)
          // SAFETY: both events and the stream are live for the whole measurement.
    unsafe {
        api.stream_synchronize(g.stream).expect("sync");
        api.event_record(a, g.stream).expect("record");
    }
    for i in 0..iters {
        f(i);
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

/// Per-launch time of `count` launches captured into one graph and replayed, which leaves out the
/// host's launch cost (what a captured decode step pays).
fn graph_ms(g: &Gpu, count: u32, mut launches: impl FnMut(u32)) -> f64 {
    let api = g.api;
    // SAFETY: the stream is live and idle (every earlier measurement synchronized it); nothing
    // else uses it while it captures.
    unsafe { api.stream_begin_capture(g.stream, CaptureMode::ThreadLocal) }.expect("capture");
    for i in 0..count {
        launches(i);
    }
    // SAFETY: capture was begun on this stream above.
    let graph = unsafe { api.stream_end_capture(g.stream) }.expect("end capture");
    // SAFETY: `graph` is the graph just captured.
    let exec = unsafe { api.graph_instantiate(graph) }.expect("instantiate");
    let ms = time_ms(g, 10, |_| {
        // SAFETY: the instantiated graph's buffers outlive the measurement.
        unsafe { api.graph_launch(exec, g.stream) }.expect("graph launch");
    });
    // SAFETY: the last replay finished (time_ms synchronizes on its end event).
    unsafe {
        api.graph_exec_destroy(exec).expect("exec destroy");
        api.graph_destroy(graph).expect("graph destroy");
    }
    ms / f64::from(count)
}

/// Device-to-device copy bandwidth (bytes read + bytes written per second) over 1 GiB.
fn copy_bandwidth(g: &Gpu) -> f64 {
    let bytes = 1usize << 30;
    let (src, dst) = (g.alloc(bytes), g.alloc(bytes));
    let ms = time_ms(g, 20, |_| {
        // SAFETY: both ranges are live allocations of `bytes` on this device.
        unsafe { g.api.memcpy_dtod_async(dst.ptr, src.ptr, bytes, g.stream) }.expect("copy");
    });
    2.0 * bytes as f64 / (ms * 1e-3)
}

struct Shape {
    what: &'static str,
    rows: usize,
    cols: usize,
}

const SHAPES: &[Shape] = &[
    Shape {
        what: "8B attn_q/o 4096x4096",
        rows: 4096,
        cols: 4096,
    },
    Shape {
        what: "8B attn_k/v 1024x4096",
        rows: 1024,
        cols: 4096,
    },
    Shape {
        what: "8B ffn_up 14336x4096",
        rows: 14336,
        cols: 4096,
    },
    Shape {
        what: "8B ffn_down 4096x14336",
        rows: 4096,
        cols: 14336,
    },
    Shape {
        what: "8B output 128256x4096",
        rows: 128256,
        cols: 4096,
    },
    Shape {
        what: "270M ffn_up 2048x640",
        rows: 2048,
        cols: 640,
    },
    Shape {
        what: "270M output 262144x640",
        rows: 262144,
        cols: 640,
    },
];

/// Weight copies so that the rotation covers at least 4 x the L2 cache.
fn copies(wbytes: usize, l2: usize) -> usize {
    (4 * l2).div_ceil(wbytes).clamp(1, 64)
}

#[allow(
    clippy::too_many_arguments,
    reason = "one launch's worth of parameters"
)]
fn matvec_args(
    w: u64,
    y: &DevBuf<'_>,
    out: &DevBuf<'_>,
    rows: usize,
    cols: usize,
    row_bytes: usize,
) -> [Arg; 7] {
    [
        Arg::Ptr(DevicePtr(w)),
        y.arg(),
        out.arg(),
        Arg::I32(cols as i32),
        Arg::I64(row_bytes as i64),
        Arg::I32(rows as i32),
        Arg::I32(rows as i32),
    ]
}

fn main() {
    let Some(g) = gpu() else { return };
    let g = g.no_sync();
    let sms = g
        .api
        .device_attribute(DeviceAttribute::MultiprocessorCount, 0)
        .unwrap_or(0);
    let l2 = g
        .api
        .device_attribute(DeviceAttribute::L2CacheBytes, 0)
        .unwrap_or(0) as usize;
    println!("device: {} ({sms} SMs, L2 {} MiB)", g.name, l2 >> 20);
    let bw = copy_bandwidth(&g);
    println!("device-to-device copy: {:.0} GB/s (read + write)", bw / 1e9);
    let mut rng = Rng::new(7);
    println!(
        "matvec: us per call (back-to-back launches; replayed graph), weight GB/s and % of copy \
         bandwidth from the graph time (weights rotate over >= 4x L2)"
    );
    // (type, variants: symbol suffix and rows per block)
    let types: [(WeightType, &[(&str, usize)]); 7] = [
        // `_ks`: all warps of a block share its rows (K split), R rows per block.
        (WeightType::Q4_K, &[("_ks", 1)]),
        (WeightType::Q6_K, &[("_ks", 2)]),
        (WeightType::Q8_0, &[("_ks", 2)]),
        (WeightType::Q5_0, &[]),
        (WeightType::Q4_0, &[]),
        (WeightType::Q5_K, &[]),
        (WeightType::Q3_K, &[]),
    ];
    let mut summary = Vec::new();
    for (t, variants) in types {
        for s in SHAPES {
            if s.cols % t.block_values() != 0 {
                continue;
            }
            let (rows, cols) = (s.rows, s.cols);
            let row_bytes = cols / t.block_values() * t.block_bytes();
            let wbytes = rows * row_bytes;
            let n = copies(wbytes, l2);
            let w = g.upload(&rng.bytes(n * wbytes));
            let x = g.upload(&rng.vec(cols));
            let y = g.alloc(q8_1_vector_bytes(cols));
            let out = g.alloc(rows * 4);
            let quantize = |_: u32| {
                g.launch(
                    KernelId::QuantizeQ8_1,
                    [(cols as u32).div_ceil(256), 1, 1],
                    256,
                    &[
                        x.arg(),
                        y.arg(),
                        Arg::I32(cols as i32),
                        Arg::I64(cols as i64),
                    ],
                );
            };
            quantize(0);
            let run = |name: &str, rpb: usize| {
                let blocks = rows.div_ceil(rpb) as u32;
                let launch = |i: u32| {
                    let wp = w.ptr.0 + ((i as usize % n) * wbytes) as u64;
                    g.launch_named(
                        Module::Matvec,
                        name,
                        [blocks, 1, 1],
                        MATVEC_WARPS * g.warp,
                        &matvec_args(wp, &y, &out, rows, cols, row_bytes),
                    );
                };
                let ms = time_ms(&g, ITERS, launch);
                let gms = graph_ms(&g, ITERS, launch);
                let gbs = wbytes as f64 / (gms * 1e-3);
                println!(
                    "  {name:16} {:28} stream {:7.1} us graph {:7.1} us {:6.0} GB/s {:5.1}%",
                    s.what,
                    ms * 1e3,
                    gms * 1e3,
                    gbs / 1e9,
                    100.0 * gbs / bw
                );
                (gms, gbs)
            };
            let k = t.matvec();
            let (ms, gbs) = run(k.name(), t.matvec_rows_per_block());
            for &(suffix, rpb) in variants {
                run(&format!("{}{suffix}", k.name()), rpb);
            }
            let qms = graph_ms(&g, ITERS, quantize);
            summary.push(format!(
                "{:5} {:28} {:7.1} us {:5.0} GB/s {:5.1}% (+ quantize {:.1} us; graph times)",
                t.ggml_name(),
                s.what,
                ms * 1e3,
                gbs / 1e9,
                100.0 * gbs / bw,
                qms * 1e3
            ));
        }
    }
    gated(&g, &mut rng, l2, bw);
    prefill(&g, &mut rng);
    println!("summary (copy bandwidth {:.0} GB/s):", bw / 1e9);
    for l in summary {
        println!("  {l}");
    }
}

fn prefill(g: &Gpu, rng: &mut Rng) {
    println!("prefill (dequant to f16 + gemmEx f32 accumulation, 512 tokens): ms, TFLOP/s");
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
        ("8B 1024x4096", 1024, 4096),
        ("8B 14336x4096", 14336, 4096),
        ("8B 4096x14336", 4096, 14336),
    ] {
        let m = 512usize;
        for t in [WeightType::Q4_K, WeightType::Q6_K] {
            let row_bytes = k / 256 * t.block_bytes();
            let w = g.upload(&rng.bytes(n * row_bytes));
            let wh = g.alloc(n * k * 2);
            let xs: Vec<u16> = (0..m * k).map(|_| common::f16_bits(rng.f32())).collect();
            let xh = g.upload(&xs);
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
            let dequant = |_: u32| {
                g.launch(
                    t.dequant_f16(),
                    [(k as u32 / 32).div_ceil(64), n as u32, 1],
                    64,
                    &[
                        w.arg(),
                        wh.arg(),
                        Arg::I32(k as i32),
                        Arg::I64(row_bytes as i64),
                        Arg::I64(k as i64),
                    ],
                );
            };
            let gemm = |_: u32| {
                // SAFETY: operands sized for the shapes above; alpha/beta live across the call.
                unsafe { g.api.gemm_ex(handle, &args) }.expect("gemm_ex");
            };
            let dq = time_ms(g, 20, dequant);
            let gm = time_ms(g, 20, gemm);
            let flops = 2.0 * (m * n * k) as f64;
            println!(
                "  {:5} {what:16} dequant {:7.3} ms ({:5.0} GB/s f16 out) gemm {:7.3} ms ({:6.1} TFLOP/s) both {:6.1} TFLOP/s",
                t.ggml_name(),
                dq,
                (n * k * 2) as f64 / (dq * 1e-3) / 1e9,
                gm,
                flops / (gm * 1e-3) / 1e12,
                flops / ((dq + gm) * 1e-3) / 1e12
            );
        }
    }
    // SAFETY: the stream is synchronized by the last measurement; the handle is not used again.
    unsafe { g.api.blas_destroy(handle) }.expect("blas destroy");
}

/// The gated FFN mat-vec (`act(w_gate y) * (w_up y)`, one launch over both matrices) at the 8B
/// gate/up shape, Q4_K (symbol, rows per block; room for tuning candidates).
fn gated(g: &Gpu, rng: &mut Rng, l2: usize, bw: f64) {
    let t = WeightType::Q4_K;
    let (rows, cols) = (14336usize, 4096usize);
    let row_bytes = cols / t.block_values() * t.block_bytes();
    let wbytes = rows * row_bytes;
    let n = copies(2 * wbytes, l2);
    let w = g.upload(&rng.bytes(2 * n * wbytes));
    let x = g.upload(&rng.vec(cols));
    let y = g.alloc(q8_1_vector_bytes(cols));
    let out = g.alloc(rows * 4);
    g.launch(
        KernelId::QuantizeQ8_1,
        [(cols as u32).div_ceil(256), 1, 1],
        256,
        &[
            x.arg(),
            y.arg(),
            Arg::I32(cols as i32),
            Arg::I64(cols as i64),
        ],
    );
    println!("gated mat-vec, 8B ffn gate+up 2 x 14336x4096 q4_K:");
    {
        let (name, rpb) = ("matvec_q4_k_gated", t.matvec_gated_rows_per_block());
        let blocks = rows.div_ceil(rpb) as u32;
        let launch = |i: u32| {
            let wg = w.ptr.0 + ((i as usize % n) * 2 * wbytes) as u64;
            g.launch_named(
                Module::Matvec,
                name,
                [blocks, 1, 1],
                MATVEC_WARPS * g.warp,
                &[
                    Arg::Ptr(DevicePtr(wg)),
                    Arg::Ptr(DevicePtr(wg + wbytes as u64)),
                    y.arg(),
                    out.arg(),
                    Arg::I32(cols as i32),
                    Arg::I64(row_bytes as i64),
                    Arg::I32(rows as i32),
                    Arg::I32(rows as i32),
                    Arg::I32(kernels::act::SILU),
                ],
            );
        };
        let gms = graph_ms(g, ITERS, launch);
        let gbs = (2 * wbytes) as f64 / (gms * 1e-3);
        println!(
            "  {name:22} graph {:7.1} us {:6.0} GB/s {:5.1}%",
            gms * 1e3,
            gbs / 1e9,
            100.0 * gbs / bw
        );
    }
}
