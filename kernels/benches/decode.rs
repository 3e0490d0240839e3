//! GPU throughput of the decode and prefill building blocks: quantized mat-vec (weight bytes
//! read per second, as a share of the device-to-device copy bandwidth measured in the same run)
//! and dequantize + gemmEx (TFLOP/s), at Llama-3-8B and Gemma-3-270M projection shapes. Timed
//! with stream events over many launches; the weights rotate over copies that together exceed
//! the L2 cache several times, so every launch reads its weights from device memory.
//! Without a GPU or built kernels it prints why and exits. `DECODE_BATCHED=1` runs only the
//! batched products (mat-vec, the column mat-vecs of 2 to 4 vectors, integer tiles, dequantize +
//! gemmEx at 1 to 256 vectors). `DECODE_MOE=1` runs only a mixture of experts' decode kernels at
//! Qwen3-30B-A3B's shapes (8 of 128 experts; gpt-oss-20b's for MXFP4, 4 of 32): the expert
//! mat-vecs (per-row and short-row kernels), the routing and the activations' quantization.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{gpu, Arg, DevBuf, Gpu, Rng};
use gpu_mem::{Blas, DeviceAttribute, Event, GemmShape, MemRange, Op};
use half::f16;
use rocmforge_kernels::{
    q8_1_vector_bytes, KernelId, MmqPlan, WeightType, MATVEC_WARPS, MMQ_THREADS,
};

const ITERS: u32 = 200;

fn time_ms(g: &Gpu, iters: u32, mut f: impl FnMut(u32)) -> f64 {
    let (a, b) = (
        Event::new(&g.device, true).expect("event"),
        Event::new(&g.device, true).expect("event"),
    );
    f(0); // warm-up (module load, clocks)
    g.stream.synchronize().expect("sync");
    a.record(&g.stream).expect("record");
    for i in 0..iters {
        f(i);
    }
    b.record(&g.stream).expect("record");
    b.synchronize().expect("event sync");
    let ms = a.elapsed_ms(&b).expect("elapsed");
    f64::from(ms) / f64::from(iters)
}

/// Per-launch time of `count` launches captured into one graph and replayed, which leaves out the
/// host's launch cost (what a captured decode step pays).
fn graph_ms(g: &Gpu, count: u32, mut launches: impl FnMut(u32)) -> f64 {
    // The stream is idle (every earlier measurement synchronized it); only checked launches are
    // queued while it captures, so the graph knows the memory it replays on.
    g.stream.begin_capture().expect("capture");
    for i in 0..count {
        launches(i);
    }
    let graph = g.stream.end_capture().expect("end capture");
    let exec = graph.instantiate().expect("instantiate");
    let ms = time_ms(g, 10, |_| exec.launch(&g.stream).expect("graph launch"));
    ms / f64::from(count)
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
fn matvec_args<'a>(
    w: MemRange<'a>,
    y: &'a DevBuf<'_>,
    out: &'a DevBuf<'_>,
    rows: usize,
    cols: usize,
    row_bytes: usize,
) -> [Arg<'a>; 7] {
    [
        Arg::Mem(w),
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
        .device
        .attribute(DeviceAttribute::MultiprocessorCount)
        .unwrap_or(0);
    let l2 = g
        .device
        .attribute(DeviceAttribute::L2CacheBytes)
        .unwrap_or(0) as usize;
    println!("device: {} ({sms} SMs, L2 {} MiB)", g.name, l2 >> 20);
    let bw = gpu_mem::bandwidth::copy_bandwidth(&g.device, 1 << 30, 20).expect("copy bandwidth");
    println!("device-to-device copy: {:.0} GB/s (read + write)", bw / 1e9);
    let mut rng = Rng::new(7);
    if std::env::var_os("DECODE_BATCHED").is_some() {
        batched(&g, &mut rng, l2, bw, sms as usize);
        return;
    }
    if std::env::var_os("DECODE_MOE").is_some() {
        moe(&g, &mut rng, l2, bw);
        return;
    }
    println!(
        "matvec: us per call (back-to-back launches; replayed graph), weight GB/s and % of copy \
         bandwidth from the graph time (weights rotate over >= 4x L2)"
    );
    // (type, variants: kernel and rows per block)
    let types: [(WeightType, &[(KernelId, usize)]); 10] = [
        // `_ks`: all warps of a block share its rows (K split), R rows per block.
        (WeightType::Q4_K, &[(KernelId::MatvecKsQ4_K, 1)]),
        (WeightType::Q6_K, &[(KernelId::MatvecKsQ6_K, 2)]),
        (WeightType::Q8_0, &[(KernelId::MatvecKsQ8_0, 2)]),
        (WeightType::Q5_0, &[]),
        (WeightType::Q4_0, &[]),
        (WeightType::Q5_K, &[]),
        (WeightType::Q3_K, &[]),
        (WeightType::Q2_K, &[]),
        (WeightType::Q4_1, &[]),
        (WeightType::Q5_1, &[]),
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
                // SAFETY: the buffers were allocated above for the shapes and counts passed here.
                unsafe {
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
                    )
                };
            };
            quantize(0);
            let run = |k: KernelId, rpb: usize| {
                let name = k.name();
                let blocks = rows.div_ceil(rpb) as u32;
                let launch = |i: u32| {
                    let wp = w.sub((i as usize % n) * wbytes, wbytes);
                    // SAFETY: the buffers were allocated above for the shapes and counts passed
                    // here.
                    unsafe {
                        g.launch(
                            k,
                            [blocks, 1, 1],
                            MATVEC_WARPS * g.warp,
                            &matvec_args(wp, &y, &out, rows, cols, row_bytes),
                        )
                    };
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
            let (ms, gbs) = run(k, t.matvec_rows_per_block());
            for &(variant, rpb) in variants {
                run(variant, rpb);
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
    let blas = Blas::new(&g.stream).expect("blas");
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
            let shape = GemmShape {
                trans_a: Op::T,
                trans_b: Op::N,
                m: n,
                n: m,
                k,
                lda: k,
                ldb: k,
                ldc: n,
            };
            let (a, b) = (
                wh.range().view::<f16>().expect("f16 weights"),
                xh.range().view::<f16>().expect("f16 activations"),
            );
            let mut cv = c.range().view_mut::<f32>().expect("f32 result");
            let dequant = |_: u32| {
                // SAFETY: the buffers were allocated above for the shapes and counts passed here.
                unsafe {
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
                    )
                };
            };
            let gemm = |_: u32| {
                blas.gemm_ex(&shape, 1.0, &a, &b, 0.0, &mut cv)
                    .expect("gemm_ex");
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
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
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
        )
    };
    println!("gated mat-vec, 8B ffn gate+up 2 x 14336x4096 q4_K:");
    {
        let (k, rpb) = (KernelId::MatvecGatedQ4_K, t.matvec_gated_rows_per_block());
        let name = k.name();
        let blocks = rows.div_ceil(rpb) as u32;
        let launch = |i: u32| {
            let wg = (i as usize % n) * 2 * wbytes;
            // SAFETY: the buffers were allocated above for the shapes and counts passed here.
            unsafe {
                g.launch(
                    k,
                    [blocks, 1, 1],
                    MATVEC_WARPS * g.warp,
                    &[
                        Arg::Mem(w.sub(wg, wbytes)),
                        Arg::Mem(w.sub(wg + wbytes, wbytes)),
                        y.arg(),
                        out.arg(),
                        Arg::I32(cols as i32),
                        Arg::I64(row_bytes as i64),
                        Arg::I32(rows as i32),
                        Arg::I32(rows as i32),
                        Arg::I32(rocmforge_kernels::act::SILU),
                    ],
                )
            };
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

/// Batched products at the 8B's projection shapes: the mat-vec (one grid row per vector), the
/// integer tile kernels (`mmq_*`, plus `mmq_combine` where the plan splits) and dequantization to
/// f16 + gemmEx (with the activations' f16 conversion), per column count; times from replayed
/// graphs, and each one's weight bytes per second as a share of the copy bandwidth `bw` (the
/// weights' bandwidth limit; weights rotate over >= 4x L2).
fn batched(g: &Gpu, rng: &mut Rng, l2: usize, bw: f64, sms: usize) {
    const COLS: &[usize] = &[1, 2, 4, 8, 16, 32, 64, 128, 256];
    let blas = Blas::new(&g.stream).expect("blas");
    println!(
        "batched products: us per call (graph replay) and % of copy bandwidth for the weight bytes \
         (matvec / mmq / dequant + gemmEx)"
    );
    for t in [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q8_0,
        WeightType::Q4_0,
    ] {
        for (what, rows, cols) in [
            ("4096x4096", 4096usize, 4096usize),
            ("14336x4096", 14336, 4096),
            ("4096x14336", 4096, 14336),
        ] {
            let row_bytes = cols / t.block_values() * t.block_bytes();
            let wbytes = rows * row_bytes;
            let n = copies(wbytes, l2);
            let w = g.upload(&rng.bytes(n * wbytes));
            let mmax = *COLS.last().unwrap_or(&1);
            let x = g.upload(&rng.vec(cols * mmax));
            let vb = q8_1_vector_bytes(cols);
            let y = g.alloc(vb * mmax);
            let out = g.alloc(rows * mmax * 4);
            let part = g.alloc(rows * mmax * 4 * rocmforge_kernels::MMQ_MAX_SPLITS);
            let wh = g.alloc(rows * cols * 2);
            let xh = g.alloc(cols * mmax * 2);
            // SAFETY: the buffers were allocated above for the shapes and counts passed here.
            unsafe {
                g.launch(
                    KernelId::QuantizeQ8_1,
                    [(cols as u32).div_ceil(256), mmax as u32, 1],
                    256,
                    &[
                        x.arg(),
                        y.arg(),
                        Arg::I32(cols as i32),
                        Arg::I64(cols as i64),
                    ],
                )
            };
            for &m in COLS {
                let wsub = |i: u32| w.sub((i as usize % n) * wbytes, wbytes);
                let matvec = |i: u32| {
                    // SAFETY: the buffers were allocated above for the shapes and counts passed
                    // here.
                    unsafe {
                        g.launch(
                            t.matvec(),
                            [rocmforge_kernels::matvec_grid(t, rows), m as u32, 1],
                            MATVEC_WARPS * g.warp,
                            &matvec_args(wsub(i), &y, &out, rows, cols, row_bytes),
                        )
                    };
                };
                let cols_kid = t.matvec_cols(m, false);
                let col_mv = |i: u32| {
                    let Some(kid) = cols_kid else { return };
                    let [a0, a1, a2, a3, a4, a5, a6] =
                        matvec_args(wsub(i), &y, &out, rows, cols, row_bytes);
                    // SAFETY: the buffers were allocated above for the shapes and counts passed
                    // here.
                    unsafe {
                        g.launch(
                            kid,
                            rocmforge_kernels::matvec_cols_grid(t, rows, m),
                            MATVEC_WARPS * g.warp,
                            &[a0, a1, a2, a3, a4, a5, a6, Arg::I32(m as i32)],
                        )
                    };
                };
                let plan = MmqPlan::new(rows, m, cols, 1, sms);
                let smem = plan.smem_bytes(&g.target);
                if smem > 0 {
                    g.allow_smem(t.mmq(plan.nt), smem);
                }
                let mmq = |i: u32| {
                    let p = plan.partial.then(|| part.range());
                    // SAFETY: the buffers were allocated above for the shapes and counts passed
                    // here (`part` holds MMQ_MAX_SPLITS results).
                    unsafe {
                        g.launch_smem(
                            t.mmq(plan.nt),
                            plan.grid,
                            MMQ_THREADS,
                            smem,
                            &[
                                Arg::Mem(wsub(i)),
                                Arg::Null,
                                Arg::Null,
                                y.arg(),
                                out.arg(),
                                p.map_or(Arg::Null, Arg::Mem),
                                Arg::I32(cols as i32),
                                Arg::I64(row_bytes as i64),
                                Arg::I32(rows as i32),
                                Arg::I32(rows as i32),
                                Arg::I32(m as i32),
                                Arg::I32(plan.splits as i32),
                            ],
                        );
                        if plan.partial {
                            g.launch(
                                KernelId::MmqCombine,
                                rocmforge_kernels::mmq_combine_grid(rows, m),
                                MMQ_THREADS,
                                &[
                                    part.arg(),
                                    Arg::Null,
                                    out.arg(),
                                    Arg::I32(rows as i32),
                                    Arg::I32(m as i32),
                                    Arg::I32(rows as i32),
                                    Arg::I32(plan.splits as i32),
                                    Arg::I32(0),
                                    Arg::I32(0),
                                ],
                            );
                        }
                    }
                };
                let shape = GemmShape {
                    trans_a: Op::T,
                    trans_b: Op::N,
                    m: rows,
                    n: m,
                    k: cols,
                    lda: cols,
                    ldb: cols,
                    ldc: rows,
                };
                let gemm = |i: u32| {
                    // SAFETY: the buffers were allocated above for the shapes and counts passed
                    // here.
                    unsafe {
                        g.launch(
                            KernelId::ConvertF32F16,
                            [((cols * m) as u32).div_ceil(256), 1, 1],
                            256,
                            &[x.arg(), xh.arg(), Arg::I64((cols * m) as i64)],
                        );
                        g.launch(
                            t.dequant_f16(),
                            [(cols as u32 / 32).div_ceil(64), rows as u32, 1],
                            64,
                            &[
                                Arg::Mem(wsub(i)),
                                wh.arg(),
                                Arg::I32(cols as i32),
                                Arg::I64(row_bytes as i64),
                                Arg::I64(cols as i64),
                            ],
                        )
                    };
                    let a = wh.range().view::<f16>().expect("f16 weights");
                    let b = xh
                        .sub(0, cols * m * 2)
                        .view::<f16>()
                        .expect("f16 activations");
                    let mut c = out
                        .sub(0, rows * m * 4)
                        .view_mut::<f32>()
                        .expect("f32 result");
                    blas.gemm_ex(&shape, 1.0, &a, &b, 0.0, &mut c)
                        .expect("gemm_ex");
                };
                let share = |ms: f64| 100.0 * wbytes as f64 / (ms * 1e-3) / bw;
                let mut line = format!("  {:5} {what:11} m={m:3}", t.ggml_name());
                for (name, ms) in [
                    ("matvec", (m <= 32).then(|| graph_ms(g, ITERS / 4, matvec))),
                    ("cols", cols_kid.map(|_| graph_ms(g, ITERS / 4, col_mv))),
                    ("mmq", (m >= 2).then(|| graph_ms(g, ITERS / 4, mmq))),
                    ("dq+gemm", (m >= 8).then(|| time_ms(g, 20, gemm))),
                ] {
                    if let Some(ms) = ms {
                        line += &format!("  {name} {:7.1} us {:5.1}%", ms * 1e3, share(ms));
                    }
                }
                if plan.splits > 1 {
                    line += &format!("  (mmq nt {} splits {})", plan.nt, plan.splits);
                }
                println!("{line}");
            }
        }
    }
}

/// An expert product's shape: `n_mat` matrices of `rows` rows of `cols` values, `n_used` chosen
/// per token.
struct MoeShape {
    what: &'static str,
    rows: usize,
    cols: usize,
    n_mat: usize,
    n_used: usize,
}

/// Which expert mat-vec a [`moe`] line times.
#[derive(Clone, Copy)]
enum MoeKind {
    /// `act(gate) * up`, one activation vector per token.
    Gated,
    /// The plain product, one activation vector per slot (a down product).
    Plain,
    /// The plain product plus the experts' bias rows.
    Bias,
}

/// `iters` tokens' ids, `n_used` distinct experts of `n_mat` each, as I32.
fn moe_ids(rng: &mut Rng, n_mat: usize, n_used: usize, iters: usize) -> Vec<i32> {
    let mut ids = Vec::with_capacity(iters * n_used);
    for _ in 0..iters {
        let mut pool: Vec<i32> = (0..n_mat as i32).collect();
        for _ in 0..n_used {
            let j = (rng.next_u64() % pool.len() as u64) as usize;
            ids.push(pool.swap_remove(j));
        }
    }
    ids
}

/// One token's expert mat-vecs with kernel `kid` (grid x `grid`; `f32_in`: it takes the f32
/// activations, as the short-row kernels do, rather than Q8_1): us per call from a replayed
/// graph, and the chosen experts' weight bytes per second as a share of the copy bandwidth `bw`.
/// Each launch picks its own experts, and the stacks rotate over copies that together exceed the
/// L2 cache 8 times, so the weights come from device memory.
#[allow(
    clippy::too_many_arguments,
    reason = "one launch's worth of parameters"
)]
fn moe_line(
    g: &Gpu,
    rng: &mut Rng,
    l2: usize,
    bw: f64,
    s: &MoeShape,
    row_bytes: usize,
    kind: MoeKind,
    kid: KernelId,
    grid: u32,
    f32_in: bool,
) {
    let mats = if matches!(kind, MoeKind::Gated) { 2 } else { 1 };
    let mat_bytes = s.rows * row_bytes;
    let stack = s.n_mat * mat_bytes;
    let n = (8 * l2).div_ceil(mats * stack).clamp(1, 16);
    let w = g.upload(&rng.bytes(n * mats * stack));
    let n_x = if matches!(kind, MoeKind::Gated) {
        1
    } else {
        s.n_used
    };
    let x = g.upload(&rng.vec(s.cols * n_x));
    let vb = q8_1_vector_bytes(s.cols);
    let y = g.alloc(vb * n_x);
    let bias = g.upload(&rng.vec(s.rows * s.n_mat));
    let out = g.alloc(s.n_used * s.rows * 4);
    let idv = moe_ids(rng, s.n_mat, s.n_used, ITERS as usize);
    let ids = g.upload(&idv);
    // SAFETY: the buffers were allocated above for the shapes and counts passed here.
    unsafe {
        g.launch(
            KernelId::QuantizeQ8_1,
            [(s.cols as u32).div_ceil(256), n_x as u32, 1],
            256,
            &[
                x.arg(),
                y.arg(),
                Arg::I32(s.cols as i32),
                Arg::I64(s.cols as i64),
            ],
        )
    };
    let launch = |i: u32| {
        let base = (i as usize % n) * mats * stack;
        let id = ids.sub((i as usize % ITERS as usize) * s.n_used * 4, s.n_used * 4);
        let tail = [
            Arg::Mem(id),
            if f32_in { x.arg() } else { y.arg() },
            out.arg(),
            Arg::I32(s.cols as i32),
            Arg::I64(row_bytes as i64),
            Arg::I64(mat_bytes as i64),
            Arg::I32(s.rows as i32),
            Arg::I32(s.n_used as i32),
            Arg::I32(n_x as i32),
            Arg::I32(s.n_mat as i32),
        ];
        let mut args = vec![Arg::Mem(w.sub(base, stack))];
        match kind {
            MoeKind::Gated => args.push(Arg::Mem(w.sub(base + stack, stack))),
            MoeKind::Bias => args.push(bias.arg()),
            MoeKind::Plain => {}
        }
        args.extend(tail);
        if matches!(kind, MoeKind::Gated) {
            args.push(Arg::I32(rocmforge_kernels::act::SILU));
        }
        // SAFETY: the buffers were allocated above for the shapes and counts passed here (the
        // ids are below n_mat).
        unsafe {
            g.launch(
                kid,
                [grid, s.n_used as u32, 1],
                MATVEC_WARPS * g.warp,
                &args,
            )
        };
    };
    let ms = graph_ms(g, ITERS, launch);
    let bytes = (mats * s.n_used * mat_bytes) as f64;
    let gbs = bytes / (ms * 1e-3);
    println!(
        "  {:26} {:28} {:7.1} us {:6.0} GB/s {:5.1}%  ({:.1} MB)",
        kid.name(),
        s.what,
        ms * 1e3,
        gbs / 1e9,
        100.0 * gbs / bw,
        bytes / 1e6
    );
}

/// A mixture of experts' decode kernels: the expert mat-vecs at Qwen3-30B-A3B's shapes (and
/// gpt-oss-20b's MXFP4 one), each type on its per-row kernel and, where its rows fit, on the
/// short-row one; the routing of one token over 128 experts; the activations' quantization.
fn moe(g: &Gpu, rng: &mut Rng, l2: usize, bw: f64) {
    use rocmforge_kernels::{
        matvec_gated_grid, matvec_grid, matvec_grid_mxfp4, matvec_id_short_fits,
        matvec_id_short_grid,
    };
    println!(
        "mixture-of-experts decode: us per call (graph replay), chosen experts' weight GB/s and % \
         of copy bandwidth"
    );
    let gate_up = MoeShape {
        what: "30B-A3B gate+up 2x768x2048",
        rows: 768,
        cols: 2048,
        n_mat: 128,
        n_used: 8,
    };
    let down = MoeShape {
        what: "30B-A3B down 2048x768",
        rows: 2048,
        cols: 768,
        n_mat: 128,
        n_used: 8,
    };
    for t in [
        WeightType::Q4_K,
        WeightType::Q6_K,
        WeightType::Q8_0,
        WeightType::Q5_K,
        WeightType::Q4_0,
        WeightType::Q3_K,
    ] {
        for (s, kind) in [(&gate_up, MoeKind::Gated), (&down, MoeKind::Plain)] {
            let row_bytes = s.cols / t.block_values() * t.block_bytes();
            let (long, long_grid) = match kind {
                MoeKind::Gated => (t.matvec_id_gated(), matvec_gated_grid(t, s.rows)),
                _ => (t.matvec_id(), matvec_grid(t, s.rows)),
            };
            moe_line(g, rng, l2, bw, s, row_bytes, kind, long, long_grid, false);
            let short = t.matvec_id_short().map(|[plain, _]| plain);
            if let Some(short) = short.filter(|_| !matches!(kind, MoeKind::Gated)) {
                if matvec_id_short_fits(s.cols, row_bytes) {
                    let grid = matvec_id_short_grid(s.rows);
                    moe_line(g, rng, l2, bw, s, row_bytes, kind, short, grid, true);
                }
            }
        }
    }
    // gpt-oss-20b: each expert product with its bias rows, rows of 2880 MXFP4 values.
    let oss = MoeShape {
        what: "oss-20b 2880x2880 (4 of 32)",
        rows: 2880,
        cols: 2880,
        n_mat: 32,
        n_used: 4,
    };
    let rb = oss.cols / 32 * 17;
    moe_line(
        g,
        rng,
        l2,
        bw,
        &oss,
        rb,
        MoeKind::Bias,
        KernelId::MatvecIdAddMxfp4,
        matvec_grid_mxfp4(oss.rows),
        false,
    );
    // The routing of one decode token: softmax over 128 router logits, top 8, their weights.
    let n_exp = 128usize;
    let k = 8usize;
    let logits = g.upload(&rng.vec(n_exp));
    let probs = g.alloc(n_exp * 4);
    let ids = g.alloc(k * 4);
    let wts = g.alloc(k * 4);
    let route = |_: u32| {
        // SAFETY: one row of `n_exp` logits, probabilities, `k` ids and weights, allocated above.
        unsafe {
            g.launch(
                KernelId::MoeRouteF32,
                [1, 1, 1],
                g.warp,
                &[
                    logits.arg(),
                    probs.arg(),
                    ids.arg(),
                    wts.arg(),
                    Arg::I32(n_exp as i32),
                    Arg::I32(k as i32),
                    Arg::I64(n_exp as i64),
                    Arg::F32(1.0),
                    Arg::I32(0),
                    Arg::I32(1),
                ],
            )
        };
    };
    println!(
        "  {:26} {:28} {:7.1} us",
        KernelId::MoeRouteF32.name(),
        "128 experts, top 8",
        graph_ms(g, ITERS, route) * 1e3
    );
    // The activations' quantization before the gate/up (one vector of 2048) and the down
    // product (8 of 768).
    for (cols, m) in [(2048usize, 1usize), (768, 8)] {
        let x = g.upload(&rng.vec(cols * m));
        let y = g.alloc(q8_1_vector_bytes(cols) * m);
        let quantize = |_: u32| {
            // SAFETY: `m` vectors of `cols` values and their Q8_1 blocks, allocated above.
            unsafe {
                g.launch(
                    KernelId::QuantizeQ8_1,
                    [(cols as u32).div_ceil(256), m as u32, 1],
                    256,
                    &[
                        x.arg(),
                        y.arg(),
                        Arg::I32(cols as i32),
                        Arg::I64(cols as i64),
                    ],
                )
            };
        };
        println!(
            "  {:26} {:28} {:7.1} us",
            KernelId::QuantizeQ8_1.name(),
            format!("{m} x {cols}"),
            graph_ms(g, ITERS, quantize) * 1e3
        );
    }
}
