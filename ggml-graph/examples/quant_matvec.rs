//! Runs one weight of a GGUF file through the CPU backend's quantized `mul_mat` and compares the
//! result with the product of its dequantized f32 values: how far the integer dot products (8-bit
//! activation blocks, llama.cpp's scheme) move a real tensor's output, and how long it takes.
//!
//! `cargo run -p rocmforge-ggml-graph --release --example quant_matvec -- [MODEL.gguf [TENSOR]]`
//!
//! Without a tensor name it takes the first two-dimensional quantized weight; without a file, a
//! random 2048 x 2048 Q4_K matrix.

use std::time::Instant;

use gguf::{dequantize_to_vec, quantize, GgmlType, GgufFile};
use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, WeightBytes};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (name, ty, k, n, bytes) = match args.next() {
        Some(path) => {
            let file = GgufFile::open(&path)?;
            let info = match args.next() {
                Some(t) => file.require_tensor(&t)?,
                None => file
                    .tensors()
                    .iter()
                    .find(|t| t.dims.len() == 2 && t.ggml_type.block_size() > 1)
                    .ok_or("no two-dimensional quantized tensor in the file")?,
            };
            if info.dims.len() != 2 {
                return Err(format!("{} has dims {:?}, not a matrix", info.name, info.dims).into());
            }
            let (k, n) = (info.dims[0] as usize, info.dims[1] as usize);
            let bytes = file.tensor_data(info).to_vec();
            (info.name.clone(), info.ggml_type, k, n, bytes)
        }
        None => {
            let (k, n) = (2048usize, 2048usize);
            let mut state = 0x2545_f491_4f6c_dd1du64;
            let values: Vec<f32> = (0..k * n)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .collect();
            let bytes = quantize(GgmlType::Q4_K, &values)?;
            ("random".to_owned(), GgmlType::Q4_K, k, n, bytes)
        }
    };

    let mut g = Graph::new();
    let x = g.input("x", DType::F32, &[k, 1])?;
    let w = g.weight("w", ty, &[k, n])?;
    let y = g.mul_mat(w, x)?;
    g.mark_output(y)?;
    let threads = std::thread::available_parallelism().map_or(1, |p| p.get());
    let mut exec = Executor::new(CpuBackend::new(threads)?);
    let reference = dequantize_to_vec(ty, &bytes)?;
    exec.bind_weight("w", ty, &[k, n], WeightBytes::from_vec(bytes))?;

    let xv: Vec<f32> = (0..k)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    let xb: Vec<u8> = xv.iter().flat_map(|v| v.to_le_bytes()).collect();
    exec.run(&g, &[(x, &xb)])?;
    let runs = 20;
    let t0 = Instant::now();
    for _ in 0..runs {
        exec.run(&g, &[(x, &xb)])?;
    }
    let per_run = t0.elapsed().as_secs_f64() / runs as f64;
    let got = exec.output_f32(y)?;

    // The f32 product, in f64.
    let want: Vec<f64> = reference
        .chunks_exact(k)
        .map(|row| {
            row.iter()
                .zip(&xv)
                .map(|(a, b)| f64::from(*a) * f64::from(*b))
                .sum()
        })
        .collect();
    let err: f64 = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (f64::from(*g) - w).powi(2))
        .sum();
    let norm: f64 = want.iter().map(|w| w * w).sum();
    println!(
        "{name} ({ty:?}, {k} x {n}): NMSE {:.3e} against the dequantized f32 product, \
         {:.1} us per mat-vec on {threads} threads ({:.1} GB/s of weights)",
        err / norm.max(1e-30),
        per_run * 1e6,
        (n * k / ty.block_size() * ty.type_size()) as f64 / per_run / 1e9
    );
    Ok(())
}
