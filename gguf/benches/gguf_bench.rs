//! `cargo bench -p rocmforge-gguf`: opening the real model and listing its tensors, and single-core
//! dequantization throughput per type beside gguf-py (numpy) on the same data in the same run.
//!
//! The model path comes from `ROCMFORGE_TEST_MODEL` (default: the `fetch-model` cache path).
//! `GGUF_BENCH_FILTER=q4_k,q8_0` limits the dequantization table to some types.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rocmforge_gguf::{GgmlType, GgufFile};

/// Output values per type in the dequantization benchmark.
const N_VALUES: usize = 1 << 22;

fn best_of(n: usize, mut f: impl FnMut()) -> Duration {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

fn model_path() -> PathBuf {
    std::env::var_os("ROCMFORGE_TEST_MODEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/rocmforge/models/gemma-3-270m-q4_k_m.gguf")
        })
}

fn bench_open() {
    let path = model_path();
    if !path.exists() {
        println!(
            "open: skipped, {} not found (run `cargo xtask fetch-model`)",
            path.display()
        );
        return;
    }
    let mut listed = 0u64;
    let t = best_of(20, || {
        let f = GgufFile::open(&path).expect("open model");
        listed = f.tensors().iter().map(|t| t.size).sum::<u64>() + f.tensors().len() as u64;
    });
    let f = GgufFile::open(&path).expect("open model");
    println!(
        "open + list tensors: {:.2} ms (best of 20) for {} ({} MB, {} tensors, {} metadata keys; checksum {listed})",
        t.as_secs_f64() * 1e3,
        path.display(),
        f.file_size() / 1_000_000,
        f.tensors().len(),
        f.metadata().len()
    );
}

/// Random blocks whose f16 scale fields hold moderate finite values (shared with the tests'
/// generator in spirit; kept local so the bench has no test-only dependency).
fn blocks(ty: GgmlType, n_blocks: usize, seed: &mut u64) -> Vec<u8> {
    let mut next = || {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    };
    let ts = ty.type_size();
    let mut b: Vec<u8> = (0..n_blocks * ts).map(|_| next() as u8).collect();
    use GgmlType as T;
    let f16_fields: &[usize] = match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS => &[0],
        T::Q4_1 | T::Q5_1 | T::Q8_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ1_S => &[0],
        T::Q2_K => &[80, 82],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        T::TQ1_0 => &[52],
        T::TQ2_0 => &[64],
        T::F16 | T::BF16 => &[],
        _ => &[],
    };
    for blk in b.chunks_exact_mut(ts) {
        for &o in f16_fields {
            let v = half::f16::from_f32(0.01 + (next() % 1000) as f32 * 1e-4);
            blk[o..o + 2].copy_from_slice(&v.to_bits().to_le_bytes());
        }
        if ty == T::Q8_K {
            blk[0..4].copy_from_slice(&0.01f32.to_le_bytes());
        }
    }
    b
}

fn bench_dequant() {
    let filter: Option<Vec<String>> = std::env::var("GGUF_BENCH_FILTER")
        .ok()
        .map(|s| s.split(',').map(|x| x.trim().to_lowercase()).collect());
    let types: Vec<GgmlType> = GgmlType::ALL
        .iter()
        .copied()
        .filter(|t| {
            filter
                .as_ref()
                .is_none_or(|f| f.contains(&t.name().to_lowercase()))
        })
        .collect();
    let dir = std::env::temp_dir().join(format!("gguf-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let mut manifest = String::new();
    let mut ours = Vec::new();
    let mut seed = 0x1234_5678_9abc_def1u64;
    for &ty in &types {
        let src = blocks(ty, N_VALUES / ty.block_size(), &mut seed);
        let mut dst = vec![0f32; N_VALUES];
        let t = best_of(5, || {
            rocmforge_gguf::dequantize_row(ty, &src, &mut dst).expect("dequantize")
        });
        ours.push((ty, t));
        let input = dir.join(format!("{}.bin", ty.name()));
        std::fs::write(&input, &src).expect("write bench input");
        manifest.push_str(&format!("{} {} -\n", ty as u32, input.display()));
    }
    std::fs::write(dir.join("manifest.txt"), manifest).expect("write manifest");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle.py");
    // numpy on one core too, so the comparison is per core.
    let py = Command::new("python3")
        .arg(&script)
        .args(["bench", dir.to_str().expect("utf-8 path"), "3"])
        .env("OMP_NUM_THREADS", "1")
        .env("OPENBLAS_NUM_THREADS", "1")
        .output();
    let mut theirs = std::collections::HashMap::new();
    match py {
        Ok(o) if o.status.success() => {
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let mut it = line.split_whitespace();
                if let (Some(id), Some(s)) = (it.next(), it.next()) {
                    if let (Ok(id), Ok(s)) = (id.parse::<u32>(), s.parse::<f64>()) {
                        theirs.insert(id, s);
                    }
                }
            }
        }
        Ok(o) => println!(
            "gguf-py bench failed: {}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => println!("gguf-py bench not run: {e}"),
    }
    let _ = std::fs::remove_dir_all(&dir);
    let gb = (N_VALUES * 4) as f64 / 1e9;
    println!("\ndequantization, one core, {N_VALUES} values per type, GB/s of f32 output (best of 5 / 3):");
    println!(
        "{:<8} {:>10} {:>12} {:>8}",
        "type", "ours", "gguf-py", "ratio"
    );
    for (ty, t) in ours {
        let o = gb / t.as_secs_f64();
        match theirs.get(&(ty as u32)) {
            Some(&s) => println!(
                "{:<8} {:>10.2} {:>12.3} {:>7.1}x",
                ty.name(),
                o,
                gb / s,
                o / (gb / s)
            ),
            None => println!("{:<8} {:>10.2} {:>12} {:>8}", ty.name(), o, "-", "-"),
        }
    }
}

fn main() {
    // `cargo test --benches` passes `--bench`-less args; run only under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    bench_open();
    bench_dequant();
}
