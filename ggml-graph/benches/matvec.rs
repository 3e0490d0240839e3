//! Quantized mat-vec throughput (GB/s of weight bytes read) beside the machine's measured memory
//! read bandwidth, on 1 and 2 threads. Run: `cargo bench -p rocmforge-ggml-graph --bench matvec`.
//! Set `MATVEC_QUICK=1` for the 2048x2048 shape only, `MATVEC_SIMD=avx2|scalar` to cap the SIMD
//! level, `MATVEC_GEMMA=1` for Gemma 3 270M's shapes and types only (decode and 128-token prefill;
//! `MATVEC_THREADS=1,2` picks the thread counts, `MATVEC_SHAPE=640x262144` one shape; without
//! `MATVEC_GEMMA` that shape alone for every type),
//! `MATVEC_CPU=1` to time in process CPU seconds, `MATVEC_TYPES=q4_1,iq4_xs` for some of the
//! weight types only (default: every type with a SIMD kernel).

use std::time::{Duration, Instant};

use rayon::prelude::*;
use rocmforge_ggml_graph::quant::Simd;
use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, WeightBytes};

/// Deterministic filler bytes (fast; every bit pattern is a valid quantized block once the scale
/// fields are sane).
fn weights(ty: DType, k: usize, n: usize) -> Vec<u8> {
    let bytes = k / ty.block_size() * ty.type_size() * n;
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let mut v: Vec<u8> = (0..bytes)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect();
    let scale_offsets: &[usize] = match ty {
        DType::Q4_K | DType::Q5_K | DType::Q4_1 | DType::Q5_1 => &[0, 2],
        DType::Q6_K => &[208],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        _ => &[0],
    };
    for blk in v.chunks_exact_mut(ty.type_size()) {
        for &o in scale_offsets {
            blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.01).to_bits().to_le_bytes());
        }
    }
    v
}

/// Seconds per call of `f`: the best of several timed batches after a warm-up. With
/// `MATVEC_CPU=1`, process CPU seconds instead of wall seconds (steadier on a shared machine; 1%
/// resolution per batch, so batches run a second).
fn time(mut f: impl FnMut()) -> f64 {
    f();
    let cpu = std::env::var_os("MATVEC_CPU").is_some();
    let batch = Duration::from_millis(if cpu { 1000 } else { 200 });
    let mut best = f64::MAX;
    for _ in 0..if cpu { 3 } else { 5 } {
        let start = Instant::now();
        let c0 = cpu_seconds();
        let mut iters = 0;
        while start.elapsed() < batch {
            f();
            iters += 1;
        }
        let spent = match (cpu, c0, cpu_seconds()) {
            (true, Some(a), Some(b)) => b - a,
            _ => start.elapsed().as_secs_f64(),
        };
        best = best.min(spent / iters as f64);
    }
    best
}

/// User plus system CPU seconds of this process (Linux `/proc/self/stat`, 100 ticks a second).
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command name (which ends with ')'): state is field 3, utime 14, stime 15.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn bandwidth(threads: usize) -> f64 {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("pool");
    let buf: Vec<u64> = (0..(512usize << 20) / 8).map(|i| i as u64).collect();
    let t = time(|| {
        let s: u64 = pool.install(|| {
            buf.par_chunks(1 << 16)
                .map(|c| c.iter().fold(0u64, |a, &x| a.wrapping_add(x)))
                .sum()
        });
        std::hint::black_box(s);
    });
    (buf.len() * 8) as f64 / t / 1e9
}

/// Matrix-matrix (prefill) time for `m` activation columns: the multi-column kernels.
fn prefill(threads: usize, ty: DType, k: usize, n: usize, m: usize) {
    let mut g = Graph::new();
    let w = g.weight("w", ty, &[k, n]).expect("weight");
    let x = g.input("x", DType::F32, &[k, m]).expect("input");
    let y = g.mul_mat(w, x).expect("mul_mat");
    g.mark_output(y).expect("output");
    let mut ex = Executor::new(backend(threads));
    ex.bind_weight("w", ty, &[k, n], WeightBytes::from_vec(weights(ty, k, n)))
        .expect("bind");
    let xv: Vec<f32> = (0..k * m)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let xb: Vec<u8> = bytemuck::cast_slice(&xv).to_vec();
    let t = time(|| ex.run(&g, &[(x, &xb)]).expect("run"));
    println!(
        "threads={threads} {ty:>5} {k}x{n} x {m} columns: {:8.2} ms  {:6.1} GMAC/s",
        t * 1e3,
        (k * n * m) as f64 / t / 1e9
    );
}

fn simd_cap() -> Simd {
    match std::env::var("MATVEC_SIMD").as_deref() {
        Ok("scalar") => Simd::Scalar,
        Ok("avx2") => Simd::Avx2,
        _ => Simd::Avx512,
    }
}

fn backend(threads: usize) -> CpuBackend {
    CpuBackend::new(threads)
        .expect("backend")
        .with_simd(simd_cap())
}

/// Gemma 3 270M Q4_K_M's matrices: `(type, k, n)`.
const GEMMA: [(DType, usize, usize); 6] = [
    (DType::Q5_0, 640, 2048),
    (DType::Q5_0, 640, 1024),
    (DType::Q8_0, 640, 256),
    (DType::Q4_K, 1024, 640),
    (DType::Q6_K, 2048, 640),
    (DType::Q8_0, 640, 262144),
];

fn gemma() {
    let threads: Vec<usize> = std::env::var("MATVEC_THREADS")
        .ok()
        .map(|v| v.split(',').filter_map(|t| t.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 2]);
    for threads in threads {
        let bw = bandwidth(threads);
        println!("threads={threads} memory read bandwidth: {bw:.1} GB/s");
        let only = std::env::var("MATVEC_SHAPE").ok();
        let pick = |k: usize, n: usize| only.as_ref().is_none_or(|s| *s == format!("{k}x{n}"));
        for (ty, k, n) in GEMMA {
            if pick(k, n) {
                matvec(threads, ty, k, n, bw);
            }
        }
        for (ty, k, n) in &GEMMA[..5] {
            if pick(*k, *n) {
                prefill(threads, *ty, *k, *n, 128);
            }
        }
    }
}

/// One-column product time and weight bytes per second.
fn matvec(threads: usize, ty: DType, k: usize, n: usize, bw: f64) {
    let wb = weights(ty, k, n);
    let bytes = wb.len();
    let mut g = Graph::new();
    let w = g.weight("w", ty, &[k, n]).expect("weight");
    let x = g.input("x", DType::F32, &[k, 1]).expect("input");
    let y = g.mul_mat(w, x).expect("mul_mat");
    g.mark_output(y).expect("output");
    let mut ex = Executor::new(backend(threads));
    ex.bind_weight("w", ty, &[k, n], WeightBytes::from_vec(wb))
        .expect("bind");
    let xv: Vec<f32> = (0..k)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let xb: Vec<u8> = bytemuck::cast_slice(&xv).to_vec();
    let t = time(|| ex.run(&g, &[(x, &xb)]).expect("run"));
    let gbs = bytes as f64 / t / 1e9;
    println!(
        "threads={threads} {ty:>5} {k}x{n}: {:8.1} us  {gbs:6.1} GB/s  ({:.0}% of memory bandwidth)",
        t * 1e6,
        100.0 * gbs / bw
    );
}

fn main() {
    if std::env::var_os("MATVEC_GEMMA").is_some() {
        gemma();
        return;
    }
    let quick = std::env::var_os("MATVEC_QUICK").is_some();
    // `MATVEC_SHAPE=KxN`: that shape only (one larger than the caches times memory streaming).
    let one: Option<(usize, usize)> = std::env::var("MATVEC_SHAPE").ok().and_then(|s| {
        let (k, n) = s.split_once('x')?;
        Some((k.trim().parse().ok()?, n.trim().parse().ok()?))
    });
    let shapes: &[(usize, usize)] = match &one {
        Some(shape) => std::slice::from_ref(shape),
        None if quick => &[(2048, 2048)],
        None => &[(2048, 2048), (4096, 14336)],
    };
    let only = std::env::var("MATVEC_TYPES").ok();
    let types: Vec<DType> = [
        DType::Q4_K,
        DType::Q6_K,
        DType::Q8_0,
        DType::Q5_0,
        DType::Q2_K,
        DType::Q3_K,
        DType::Q5_K,
        DType::Q4_0,
        DType::Q4_1,
        DType::Q5_1,
        DType::IQ4_NL,
        DType::IQ4_XS,
        DType::MXFP4,
    ]
    .into_iter()
    .filter(|ty| {
        only.as_ref().is_none_or(|list| {
            list.split(',')
                .any(|name| name.trim().eq_ignore_ascii_case(&ty.to_string()))
        })
    })
    .collect();
    println!("simd: {:?}", backend(1).simd());
    for threads in [1, 2] {
        let bw = bandwidth(threads);
        println!("threads={threads} memory read bandwidth: {bw:.1} GB/s");
        for &(k, n) in shapes {
            for &ty in &types {
                matvec(threads, ty, k, n, bw);
            }
        }
        for &ty in &types {
            prefill(threads, ty, 2048, 2048, 128);
        }
    }
}
