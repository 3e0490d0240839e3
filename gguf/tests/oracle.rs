//! Oracle tests: our dequantizers, quantizers and writer against the official `gguf` Python
//! package, compared bit for bit.

mod common;

use std::fmt::Write as _;

use common::*;
use rocmforge_gguf::{GgmlType, GgufFile, GgufWriter, MetadataValue};

/// Values per type in the random-bytes test (a whole number of 256-value blocks).
const N_VALUES: usize = 256 * 64;

fn manifest_line(m: &mut String, ty: GgmlType, input: &std::path::Path, output: &std::path::Path) {
    let _ = writeln!(m, "{} {} {}", ty as u32, input.display(), output.display());
}

#[test]
fn dequantize_random_blocks_matches_gguf_py_for_every_type() {
    if !python_oracle_available() {
        return;
    }
    let dir = scratch("dequant-random");
    let mut rng = Rng(0x5EED_0001);
    let mut manifest = String::new();
    let mut inputs = Vec::new();
    for &ty in GgmlType::ALL {
        let n_blocks = N_VALUES / ty.block_size();
        let data = random_blocks(ty, n_blocks, &mut rng);
        let (i, o) = (
            dir.join(format!("{}.in", ty.name())),
            dir.join(format!("{}.out", ty.name())),
        );
        std::fs::write(&i, &data).expect("write input");
        manifest_line(&mut manifest, ty, &i, &o);
        inputs.push((ty, data, o));
    }
    std::fs::write(dir.join("manifest.txt"), manifest).expect("write manifest");
    let report = run_oracle(&["dequant", dir.to_str().expect("utf-8 path")]);
    println!("{report}");
    for (ty, data, o) in inputs {
        let mut ours = vec![0f32; N_VALUES];
        rocmforge_gguf::dequantize(ty, &data, &mut ours).expect("dequantize");
        // The row-level entry point must agree with the parallel one.
        let mut row = vec![0f32; N_VALUES];
        rocmforge_gguf::dequantize_row(ty, &data, &mut row).expect("dequantize_row");
        assert_bits_eq(&format!("{ty} (row vs parallel)"), &row, &ours);
        assert_bits_eq(&format!("{ty} random blocks"), &ours, &read_f32(&o));
    }
}

/// Realistic weights: normal values plus blocks that stress edge cases.
fn test_values(rng: &mut Rng, n: usize) -> Vec<f32> {
    let mut v: Vec<f32> = (0..n).map(|_| rng.normal() * 0.05).collect();
    v[..32].fill(0.0); // all-zero block
    v[32..64].fill(0.25); // constant block
    v[64..96].iter_mut().for_each(|x| *x *= 1e-6); // tiny values
    v[100] = 3.0; // an outlier
    v[200] = -7.5;
    for (k, x) in v[256..288].iter_mut().enumerate() {
        *x = (k as f32 - 16.0) / 16.0; // exact ties after scaling
    }
    v
}

#[test]
fn quantizers_match_gguf_py_bytes_and_dequantization() {
    if !python_oracle_available() {
        return;
    }
    let dir = scratch("quant");
    let mut rng = Rng(0x5EED_0002);
    let x = test_values(&mut rng, N_VALUES);
    write_f32(&dir.join("x.f32"), &x);
    // Types both gguf-py and we quantize: bytes must be equal.
    let shared = [
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::BF16,
    ];
    // Types only gguf-py quantizes: its bytes feed both dequantizers.
    let py_only = [GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::MXFP4];
    let mut manifest = String::new();
    for ty in shared.iter().chain(&py_only) {
        manifest_line(
            &mut manifest,
            *ty,
            &dir.join("x.f32"),
            &dir.join(format!("{}.q", ty.name())),
        );
    }
    std::fs::write(dir.join("manifest.txt"), &manifest).expect("write manifest");
    run_oracle(&["quant", dir.to_str().expect("utf-8 path")]);

    let ddir = dir.join("deq");
    std::fs::create_dir_all(&ddir).expect("mkdir");
    let mut dmanifest = String::new();
    for ty in shared.iter().chain(&py_only) {
        let theirs =
            std::fs::read(dir.join(format!("{}.q", ty.name()))).expect("read gguf-py bytes");
        if shared.contains(ty) {
            let ours = rocmforge_gguf::quantize(*ty, &x).expect("quantize");
            assert_eq!(ours.len(), theirs.len(), "{ty}: size");
            if let Some(i) = (0..ours.len()).find(|&i| ours[i] != theirs[i]) {
                panic!(
                    "{ty}: byte {i} (block {}) differs: ours {:02x}, gguf-py {:02x}",
                    i / ty.type_size(),
                    ours[i],
                    theirs[i]
                );
            }
        }
        manifest_line(
            &mut dmanifest,
            *ty,
            &dir.join(format!("{}.q", ty.name())),
            &ddir.join(format!("{}.out", ty.name())),
        );
    }
    std::fs::write(ddir.join("manifest.txt"), &dmanifest).expect("write manifest");
    run_oracle(&["dequant", ddir.to_str().expect("utf-8 path")]);
    for ty in shared.iter().chain(&py_only) {
        let q = std::fs::read(dir.join(format!("{}.q", ty.name()))).expect("read");
        let ours = rocmforge_gguf::dequantize_to_vec(*ty, &q).expect("dequantize");
        assert_bits_eq(
            &format!("{ty} of gguf-py's quantization"),
            &ours,
            &read_f32(&ddir.join(format!("{}.out", ty.name()))),
        );
    }
}

/// Relative RMS error of a quantize/dequantize round trip.
fn rel_rmse(x: &[f32], y: &[f32]) -> f64 {
    let num: f64 = x.iter().zip(y).map(|(a, b)| f64::from(a - b).powi(2)).sum();
    let den: f64 = x.iter().map(|a| f64::from(*a).powi(2)).sum();
    (num / den).sqrt()
}

#[test]
fn k_quant_round_trips_stay_within_bounds_and_gguf_py_reads_them() {
    // Bounds for normal data, set ~30% above what ggml's reference quantizers reach.
    let bounds = [
        (GgmlType::Q2_K, 0.42),
        (GgmlType::Q3_K, 0.22),
        (GgmlType::Q4_K, 0.11),
        (GgmlType::Q5_K, 0.055),
        (GgmlType::Q6_K, 0.028),
        (GgmlType::Q8_K, 0.009),
        (GgmlType::Q4_0, 0.13),
        (GgmlType::Q4_1, 0.11),
        (GgmlType::Q5_0, 0.065),
        (GgmlType::Q5_1, 0.055),
        (GgmlType::Q8_0, 0.006),
    ];
    let mut rng = Rng(0x5EED_0003);
    let x: Vec<f32> = (0..N_VALUES).map(|_| rng.normal()).collect();
    let python = python_oracle_available();
    let dir = scratch("kquant");
    let mut manifest = String::new();
    let mut results = Vec::new();
    for (ty, bound) in bounds {
        let q = rocmforge_gguf::quantize(ty, &x).expect("quantize");
        let y = rocmforge_gguf::dequantize_to_vec(ty, &q).expect("dequantize");
        let e = rel_rmse(&x, &y);
        println!("{ty}: relative RMSE {e:.4} (bound {bound})");
        assert!(e < bound, "{ty}: relative RMSE {e} exceeds {bound}");
        let i = dir.join(format!("{}.q", ty.name()));
        std::fs::write(&i, &q).expect("write");
        manifest_line(
            &mut manifest,
            ty,
            &i,
            &dir.join(format!("{}.out", ty.name())),
        );
        results.push((ty, y));
    }
    // All-zero input must give zeros, not NaN.
    for (ty, _) in bounds {
        let z = rocmforge_gguf::dequantize_to_vec(
            ty,
            &rocmforge_gguf::quantize(ty, &[0f32; 512]).expect("quantize"),
        )
        .expect("dequantize");
        assert!(z.iter().all(|v| *v == 0.0), "{ty}: zeros do not round-trip");
    }
    if python {
        std::fs::write(dir.join("manifest.txt"), manifest).expect("write manifest");
        run_oracle(&["dequant", dir.to_str().expect("utf-8 path")]);
        for (ty, y) in results {
            assert_bits_eq(
                &format!("{ty}: gguf-py reading our quantization"),
                &y,
                &read_f32(&dir.join(format!("{}.out", ty.name()))),
            );
        }
    }
}

#[test]
fn writer_output_is_read_identically_by_gguf_py() {
    if !python_oracle_available() {
        return;
    }
    let dir = scratch("writer");
    let path = dir.join("w.gguf");
    let mut rng = Rng(0x5EED_0004);
    let mut w = GgufWriter::create(&path).expect("create");
    w.set("general.architecture", "llama").expect("set");
    w.set("general.alignment", 64u32).expect("set");
    w.set("t.u8", 200u8).expect("set");
    w.set("t.i8", -5i8).expect("set");
    w.set("t.u16", 60000u16).expect("set");
    w.set("t.i16", -30000i16).expect("set");
    w.set("t.u32", 4_000_000_000u32).expect("set");
    w.set("t.i32", -2_000_000_000i32).expect("set");
    w.set("t.f32", 0.1f32).expect("set");
    w.set("t.bool", true).expect("set");
    w.set("t.str", "héllo, wörld ✓").expect("set");
    w.set("t.u64", u64::MAX - 1).expect("set");
    w.set("t.i64", i64::MIN + 1).expect("set");
    w.set("t.f64", -1.0e300f64).expect("set");
    w.set(
        "t.arr_str",
        vec!["a".to_owned(), String::new(), "ü".to_owned()],
    )
    .expect("set");
    w.set("t.arr_f32", vec![1.5f32, -0.0, f32::MAX])
        .expect("set");
    w.set("t.arr_i32", (0..1000).collect::<Vec<i32>>())
        .expect("set");
    w.set("t.arr_bool", vec![true, false, true]).expect("set");
    w.set("t.arr_empty", Vec::<u64>::new()).expect("set");
    w.set(
        "t.nested",
        MetadataValue::Array(rocmforge_gguf::ArrayValue::Array(vec![
            rocmforge_gguf::ArrayValue::I16(vec![1, -2, 3]),
            rocmforge_gguf::ArrayValue::I16(vec![]),
            rocmforge_gguf::ArrayValue::I16(vec![7]),
        ])),
    )
    .expect("set");
    let tensors: Vec<(String, Vec<u64>, GgmlType, Vec<u8>)> = [
        (GgmlType::F32, vec![7u64]),
        (GgmlType::F16, vec![33, 3]),
        (GgmlType::Q8_0, vec![64, 5]),
        (GgmlType::Q4_K, vec![512, 2]),
        (GgmlType::Q6_K, vec![256, 3, 2]),
        (GgmlType::IQ2_XS, vec![256]),
        (GgmlType::MXFP4, vec![32, 2, 2, 2]),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (ty, dims))| {
        let n: u64 = dims.iter().product();
        let data = if ty == GgmlType::F32 || ty == GgmlType::F16 {
            let v: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
            rocmforge_gguf::quantize(ty, &v).expect("encode")
        } else {
            random_blocks(ty, (n as usize) / ty.block_size(), &mut rng)
        };
        (format!("tensor.{i}.{}", ty.name()), dims, ty, data)
    })
    .collect();
    for (name, dims, ty, _) in &tensors {
        w.add_tensor_info(name, dims, *ty).expect("add tensor");
    }
    w.write_header().expect("header");
    for (name, _, _, data) in &tensors {
        w.write_tensor_data(name, data).expect("data");
    }
    w.finish().expect("finish");

    let file = GgufFile::open(&path).expect("our reader");
    for (name, dims, ty, data) in &tensors {
        let t = file.tensor(name).expect("tensor present");
        assert_eq!((&t.dims, t.ggml_type), (dims, *ty));
        assert_eq!(file.tensor_data(t), &data[..]);
        assert_eq!(t.offset % 64, 0);
    }
    let py = dir.join("py.txt");
    run_oracle(&[
        "dump",
        path.to_str().expect("utf-8"),
        py.to_str().expect("utf-8"),
    ]);
    let theirs = std::fs::read_to_string(&py).expect("read dump");
    assert_listing_eq(&rocmforge_gguf::dump::canonical_listing(&file), &theirs);

    let names: Vec<&str> = tensors.iter().map(|t| t.0.as_str()).collect();
    let mut args = vec![
        "tensors",
        path.to_str().expect("utf-8"),
        dir.to_str().expect("utf-8"),
    ];
    args.extend(&names);
    run_oracle(&args);
    for name in names {
        let ours = file.tensor_f32(name).expect("dequantize");
        assert_bits_eq(name, &ours, &read_f32(&dir.join(format!("{name}.f32"))));
    }
}

pub fn assert_listing_eq(ours: &str, theirs: &str) {
    let (a, b): (Vec<&str>, Vec<&str>) = (ours.lines().collect(), theirs.lines().collect());
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!(
            x == y,
            "listing line {i} differs:\n ours:    {}\n gguf-py: {}",
            &x[..x.len().min(300)],
            &y[..y.len().min(300)]
        );
    }
    assert_eq!(a.len(), b.len(), "listing lengths differ");
}

#[test]
fn type_table_matches_gguf_py_quant_sizes() {
    if !python_oracle_available() {
        return;
    }
    let out = std::process::Command::new("python3")
        .args([
            "-c",
            "import gguf\nfor t, (b, s) in gguf.GGML_QUANT_SIZES.items(): print(int(t), t.name, b, s)",
        ])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let mut seen = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        let (id, name, bs, ts): (u32, &str, usize, usize) = (
            f[0].parse().expect("id"),
            f[1],
            f[2].parse().expect("block"),
            f[3].parse().expect("size"),
        );
        match GgmlType::from_id(id) {
            // gguf-py still lists Q8_1 with the old two-f32 header (40 bytes); ggml-common.h
            // defines it with two f16 (36 bytes, `sizeof(block_q8_1) == 2*sizeof(ggml_half) +
            // QK8_1`), which is what ggml computes with. Q8_1 never appears in model files.
            Some(GgmlType::Q8_1) => {
                assert_eq!(
                    (bs, ts),
                    (32, 40),
                    "gguf-py's Q8_1 entry changed: revisit this exception"
                );
                assert_eq!(GgmlType::Q8_1.type_size(), 36);
                seen += 1;
            }
            Some(t) => {
                assert_eq!(
                    (t.block_size(), t.type_size()),
                    (bs, ts),
                    "{name} (id {id})"
                );
                assert_eq!(t.name().to_uppercase(), name.to_uppercase(), "id {id}");
                seen += 1;
            }
            None => panic!("gguf-py type {name} (id {id}) is not in our table"),
        }
    }
    // Q2_0 (ggml.h id 42) is newer than gguf-py 0.19's table; a later gguf-py that lists it
    // is checked above like every other type.
    let newer = usize::from(!text.lines().any(|l| l.starts_with("42 ")));
    assert_eq!(
        seen + newer,
        GgmlType::ALL.len(),
        "every type of ours is in gguf-py's table"
    );
}
