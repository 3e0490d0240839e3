//! Block layouts checked against an outside oracle: the official `gguf` Python package
//! dequantizes the same random blocks, and our decoding must agree to float rounding.

mod common;

use common::*;
use rocmforge_ggml_graph::DType;
use std::process::Command;

const TYPES: [DType; 10] = [
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
];

#[test]
fn dequantize_matches_gguf_python() {
    let have = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output();
    if !have.map(|o| o.status.success()).unwrap_or(false) {
        println!("skipped: python3 with the gguf package is not available");
        return;
    }
    let dir = std::env::temp_dir().join(format!("ggml-graph-oracle-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng::new(42);
    let n = 1024;
    for ty in TYPES {
        let bytes = random_weights(&mut rng, ty, n);
        let src = dir.join(format!("{}.bin", ty.name()));
        let dst = dir.join(format!("{}.f32", ty.name()));
        std::fs::write(&src, &bytes).unwrap();
        let script = format!(
            "import numpy as np, gguf\n\
             from gguf.quants import dequantize\n\
             b = np.fromfile('{}', dtype=np.uint8)\n\
             t = gguf.GGMLQuantizationType['{}']\n\
             dequantize(b, t).astype(np.float32).tofile('{}')\n",
            src.display(),
            ty.name().to_uppercase(),
            dst.display()
        );
        let out = Command::new("python3")
            .args(["-c", &script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "python failed for {ty}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let theirs: Vec<f32> = std::fs::read(&dst)
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let ours = decoded(ty, &bytes, n);
        // The gguf crate (production get_rows) and our decoders (the dot products) agree too.
        assert_eq!(ours, dequant(ty, &bytes, n), "{ty}: decoders vs gguf crate");
        assert_eq!(theirs.len(), ours.len(), "{ty}");
        for (i, (&a, &b)) in theirs.iter().zip(&ours).enumerate() {
            let tol = 1e-6 * (1.0 + b.abs());
            assert!(
                (a as f64 - b).abs() <= tol,
                "{ty} value {i}: gguf-py {a}, ours {b}"
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
