//! Hostile input: every truncation of small real files, a catalogue of corrupted headers with
//! the typed error each must produce, and random mutations that must never panic.

mod common;

use common::*;
use rocmforge_gguf::{GgmlType, GgufError, GgufFile, Metadata, MetadataValue, TensorToWrite};

/// A small file with every metadata kind and a few tensors, written by our writer.
fn small_file() -> Vec<u8> {
    let mut rng = Rng(7);
    let mut md = Metadata::new();
    md.set("general.architecture", "llama");
    md.set("llama.block_count", 2u32);
    md.set("f", 0.5f32);
    md.set("b", true);
    md.set("tokens", vec!["a".to_owned(), "bc".to_owned()]);
    md.set("scores", vec![0.25f32, -1.0]);
    md.set(
        "nested",
        MetadataValue::Array(rocmforge_gguf::ArrayValue::Array(vec![
            rocmforge_gguf::ArrayValue::U8(vec![1, 2]),
            rocmforge_gguf::ArrayValue::Bool(vec![true]),
        ])),
    );
    let a = rng.bytes(4 * 8);
    let b = random_blocks(GgmlType::Q8_0, 2, &mut rng);
    let c = random_blocks(GgmlType::Q4_K, 1, &mut rng);
    rocmforge_gguf::write_to_vec(
        &md,
        &[
            TensorToWrite {
                name: "a",
                dims: &[8],
                ty: GgmlType::F32,
                data: &a,
            },
            TensorToWrite {
                name: "b",
                dims: &[32, 2],
                ty: GgmlType::Q8_0,
                data: &b,
            },
            TensorToWrite {
                name: "c",
                dims: &[256],
                ty: GgmlType::Q4_K,
                data: &c,
            },
        ],
    )
    .expect("write")
}

/// End of the last tensor's bytes: every prefix at least this long is a valid file.
fn data_end(f: &GgufFile) -> usize {
    f.tensors()
        .iter()
        .map(|t| f.data_offset() + t.offset + t.size)
        .max()
        .unwrap_or(f.data_offset()) as usize
}

fn check_every_truncation(data: &[u8]) {
    let full = GgufFile::from_bytes(data.to_vec()).expect("full file parses");
    let end = data_end(&full);
    for len in 0..data.len() {
        match GgufFile::from_bytes(&data[..len]) {
            Ok(f) => {
                assert!(len >= end, "prefix of {len} bytes (< {end}) parsed");
                assert_eq!(f.tensors(), full.tensors());
            }
            Err(e) => {
                assert!(len < end, "prefix of {len} bytes (>= {end}) failed: {e}");
                assert!(
                    matches!(
                        e,
                        GgufError::Truncated { .. } | GgufError::TensorOutOfBounds { .. }
                    ),
                    "prefix {len}: unexpected error {e:?}"
                );
                // Every way of cutting a file short says so.
                assert!(e.to_string().contains("truncated"), "prefix {len}: {e}");
            }
        }
    }
}

#[test]
fn every_truncation_of_our_file_gives_a_typed_error() {
    check_every_truncation(&small_file());
}

#[test]
fn every_truncation_of_a_gguf_py_file_gives_a_typed_error() {
    if !python_oracle_available() {
        return;
    }
    let dir = scratch("trunc-py");
    let path = dir.join("py.gguf");
    let script = format!(
        "import numpy as np, gguf\n\
         w = gguf.GGUFWriter({:?}, 'llama')\n\
         w.add_block_count(2)\n\
         w.add_context_length(128)\n\
         w.add_token_list(['<s>', 'hello', 'world'])\n\
         w.add_token_scores([0.0, -1.5, -2.5])\n\
         w.add_string('general.name', 'tiny')\n\
         w.add_tensor('w', np.arange(64, dtype=np.float32).reshape(2, 32))\n\
         q = gguf.quants.quantize(np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32), gguf.GGMLQuantizationType.Q8_0)\n\
         w.add_tensor('q', q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)\n\
         w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()\n",
        path.to_str().expect("utf-8")
    );
    let out = std::process::Command::new("python3")
        .args(["-c", &script])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let data = std::fs::read(&path).expect("read");
    let f = GgufFile::from_bytes(data.clone()).expect("parse gguf-py file");
    assert_eq!(f.tensor("q").expect("q").dims, vec![32, 2]);
    assert_eq!(
        f.get_str_array("tokenizer.ggml.tokens")
            .expect("tokens")
            .len(),
        3
    );
    check_every_truncation(&data);
}

/// Builds header bytes by hand.
#[derive(Default)]
struct Raw(Vec<u8>);

impl Raw {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        let mut r = Raw(b"GGUF".to_vec());
        r.u32(version).u64(n_tensors).u64(n_kv);
        r
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        self.u64(s.len() as u64);
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn kv_u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.str(k).u32(4).u32(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
        self.str(name).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad_to(&mut self, align: usize, extra: usize) -> Vec<u8> {
        while self.0.len() % align != 0 {
            self.0.push(0);
        }
        let mut v = self.0.clone();
        v.resize(v.len() + extra, 0);
        v
    }
    /// Parses the bytes plus 64 bytes of slack, so counts are not refused merely for the file
    /// being short.
    fn parse(&self) -> Result<GgufFile, GgufError> {
        let mut v = self.0.clone();
        v.resize(v.len() + 64, 0);
        GgufFile::from_bytes(v)
    }
}

#[test]
fn corrupted_headers_give_the_right_typed_errors() {
    let err = |r: Result<GgufFile, GgufError>| r.expect_err("must fail");
    assert!(matches!(
        err(GgufFile::from_bytes(b"GGUX\x03\0\0\0".to_vec())),
        GgufError::BadMagic { .. }
    ));
    assert!(matches!(
        err(GgufFile::from_bytes(Vec::new())),
        GgufError::Truncated { offset: 0, .. }
    ));
    assert!(matches!(
        err(Raw::header(1, 0, 0).parse()),
        GgufError::UnsupportedVersion { version: 1 }
    ));
    assert!(matches!(
        err(Raw::header(4, 0, 0).parse()),
        GgufError::UnsupportedVersion { version: 4 }
    ));
    assert!(matches!(
        err(Raw::header(3u32.swap_bytes(), 0, 0).parse()),
        GgufError::BigEndian { version: 3 }
    ));
    // Counts the rest of the file cannot hold: the message says the file is truncated.
    let e = err(Raw::header(3, u64::MAX, 0).parse());
    assert!(matches!(e, GgufError::Truncated { offset: 8, .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
    assert!(matches!(
        err(Raw::header(3, 0, 1 << 40).parse()),
        GgufError::Truncated { offset: 16, .. }
    ));
    // A huge string length is refused before any allocation.
    let mut r = Raw::header(3, 0, 1);
    r.u64(u64::MAX);
    assert!(matches!(
        err(r.parse()),
        GgufError::TooLarge { offset: 24, .. }
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(13).u32(0);
    assert!(matches!(
        err(r.parse()),
        GgufError::UnknownValueType {
            type_id: 13,
            offset: 33
        }
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(7).bytes(&[2]);
    assert!(matches!(
        err(r.parse()),
        GgufError::InvalidBool { value: 2, .. }
    ));
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(8).u64(2).bytes(&[0xff, 0xfe]);
    assert!(matches!(err(r.parse()), GgufError::InvalidUtf8 { .. }));
    // Array of a billion u64 in a tiny file.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9).u32(10).u64(1 << 30);
    assert!(matches!(
        err(r.parse()),
        GgufError::TooLarge {
            what: "array length",
            ..
        }
    ));
    // Nesting deeper than the cap.
    let mut r = Raw::header(3, 0, 1);
    r.str("k").u32(9);
    for _ in 0..20 {
        r.u32(9).u64(1);
    }
    r.u32(4).u64(0);
    assert!(matches!(err(r.parse()), GgufError::NestingTooDeep { .. }));
    let mut r = Raw::header(3, 0, 2);
    r.kv_u32("k", 1).kv_u32("k", 2);
    assert!(matches!(err(r.parse()), GgufError::DuplicateKey { ref key, .. } if key == "k"));
    for bad in [0u32, 3, 48] {
        let mut r = Raw::header(3, 0, 1);
        r.kv_u32("general.alignment", bad);
        assert!(
            matches!(err(r.parse()), GgufError::BadAlignment { .. }),
            "alignment {bad}"
        );
    }
    let mut r = Raw::header(3, 0, 1);
    r.str("general.alignment").u32(10).u64(32);
    assert!(
        matches!(err(r.parse()), GgufError::BadAlignment { .. }),
        "u64 alignment"
    );

    let with_tensor = |name: &str, dims: &[u64], ty: u32, offset: u64, data: usize| {
        let mut r = Raw::header(3, 1, 0);
        r.tensor(name, dims, ty, offset);
        GgufFile::from_bytes(r.pad_to(32, data))
    };
    assert!(with_tensor("t", &[32], 0, 0, 128).is_ok());
    assert!(matches!(
        err(with_tensor("t", &[32], 4, 0, 128)),
        GgufError::UnknownTensorType { type_id: 4, .. }
    ));
    assert!(matches!(
        err(with_tensor("t", &[1, 1, 1, 1, 1], 0, 0, 128)),
        GgufError::TooLarge {
            what: "tensor n_dims",
            ..
        }
    ));
    assert!(
        matches!(
            err(with_tensor("t", &[33], 8, 0, 128)),
            GgufError::BadShape { .. }
        ),
        "partial Q8_0 block"
    );
    assert!(
        matches!(
            err(with_tensor("t", &[1 << 40, 1 << 40], 0, 0, 128)),
            GgufError::BadShape { .. }
        ),
        "overflow"
    );
    assert!(
        matches!(
            err(with_tensor("t", &[32], 0, 0, 100)),
            GgufError::TensorOutOfBounds { .. }
        ),
        "past the end"
    );
    assert!(
        matches!(
            err(with_tensor("t", &[8], 0, 4, 128)),
            GgufError::TensorOutOfBounds { .. }
        ),
        "misaligned"
    );
    assert!(
        matches!(
            err(with_tensor("t", &[8], 0, u64::MAX - 8, 128)),
            GgufError::TensorOutOfBounds { .. }
        ),
        "offset overflow"
    );
    let mut r = Raw::header(3, 2, 0);
    r.tensor("t", &[8], 0, 0).tensor("t", &[8], 0, 32);
    assert!(matches!(
        err(GgufFile::from_bytes(r.pad_to(32, 64))),
        GgufError::DuplicateTensor { .. }
    ));

    // Errors carry the offset in their message.
    let e = err(with_tensor("t", &[32], 4, 0, 128)).to_string();
    assert!(e.contains("offset 45") && e.contains("`t`"), "{e}");
}

#[test]
fn typed_getters_report_key_expected_and_found() {
    let f = GgufFile::from_bytes(small_file()).expect("parse");
    let e = f.get_f32("llama.block_count").expect_err("u32 is not f32");
    assert!(
        matches!(&e, GgufError::WrongType { key, expected: "float32", found } if key == "llama.block_count" && found == "uint32"),
        "{e:?}"
    );
    assert!(matches!(
        f.get_u32("missing"),
        Err(GgufError::MissingKey { .. })
    ));
    assert_eq!(f.get_u32_opt("missing").expect("absent"), None);
    assert!(
        f.get_str_opt("llama.block_count").is_err(),
        "present with another type is an error"
    );
    assert_eq!(f.arch_u32("block_count").expect("arch helper"), 2);
    assert_eq!(f.get_u64("llama.block_count").expect("widening"), 2);
    let e = f
        .get_i32_array("scores")
        .expect_err("f32 array is not i32 array")
        .to_string();
    assert!(
        e.contains("array[float32]") && e.contains("array[int32]"),
        "{e}"
    );
    assert_eq!(f.get_f32_array("scores").expect("f32 array"), &[0.25, -1.0]);
}

#[test]
fn random_mutations_never_panic() {
    let base = small_file();
    let header_len = GgufFile::from_bytes(base.clone())
        .expect("parse")
        .data_offset() as usize;
    let mut rng = Rng(99);
    let mut errors = 0;
    for _ in 0..20_000 {
        let mut d = base.clone();
        for _ in 0..1 + rng.below(4) {
            let i = rng.below(header_len as u64) as usize;
            d[i] = match rng.below(3) {
                0 => rng.next_u64() as u8,
                1 => d[i] ^ (1 << rng.below(8)),
                _ => 0xff,
            };
        }
        if rng.below(4) == 0 {
            d.truncate(rng.below(d.len() as u64) as usize);
        }
        if let Ok(f) = GgufFile::from_bytes(d) {
            // Whatever parses must be safe to use.
            for t in f.tensors() {
                let n = t.n_elements() as usize;
                if n < 1 << 20 {
                    let mut out = vec![0f32; n];
                    rocmforge_gguf::dequantize(t.ggml_type, f.tensor_data(t), &mut out)
                        .expect("validated tensor dequantizes");
                }
            }
        } else {
            errors += 1;
        }
    }
    assert!(
        errors > 1000,
        "mutations should mostly be rejected ({errors})"
    );
}

#[test]
fn open_reports_io_errors_and_empty_files() {
    let dir = scratch("open");
    let missing = dir.join("missing.gguf");
    match GgufFile::open(&missing) {
        Err(GgufError::Io { path, .. }) => assert_eq!(path, missing),
        other => panic!("expected an I/O error, got {other:?}"),
    }
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert!(
        GgufFile::open(&empty).is_err(),
        "an empty file is not a GGUF"
    );
    let good = dir.join("good.gguf");
    std::fs::write(&good, small_file()).expect("write");
    let f = GgufFile::open(&good).expect("open");
    assert_eq!(f.path(), Some(good.as_path()));
    assert_eq!(f.tensors().len(), 3);
}

#[test]
fn directories_and_fifos_are_refused_without_blocking() {
    let dir = scratch("not-a-file");
    type Open = fn(&std::path::Path) -> rocmforge_gguf::Result<GgufFile>;
    let opens: [Open; 2] = [|p| GgufFile::open(p), |p| GgufFile::read(p)];
    for open in opens {
        let e = open(dir.as_path()).expect_err("a directory");
        assert!(matches!(e, GgufError::Io { .. }), "{e:?}");
        assert!(e.to_string().contains("is a directory"), "{e}");
    }
    // Opening a FIFO for reading would wait for a writer forever.
    let fifo = dir.join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .is_ok_and(|s| s.success());
    if !made {
        eprintln!("skipped the FIFO case: mkfifo is not available");
        return;
    }
    for open in opens {
        let e = open(fifo.as_path()).expect_err("a FIFO");
        assert!(e.to_string().contains("not a regular file"), "{e}");
    }
}

#[test]
fn read_copies_the_file_and_survives_its_truncation() {
    let dir = scratch("read");
    let path = dir.join("m.gguf");
    let bytes = small_file();
    std::fs::write(&path, &bytes).expect("write");
    let f = GgufFile::read(&path).expect("read");
    std::fs::write(&path, b"").expect("truncate");
    assert_eq!(f.path(), Some(path.as_path()));
    assert_eq!(f.as_bytes(), bytes.as_slice());
    let t = f.tensor("b").expect("tensor");
    // Tensor data keeps the file's alignment (the read buffer is 64-byte aligned).
    assert_eq!(f.tensor_data(t).as_ptr() as usize % 32, 0);
    assert_eq!(f.tensor_f32("a").expect("dequantize").len(), 8);
}

#[test]
fn info_escapes_control_characters_from_the_file() {
    let mut md = Metadata::new();
    md.set("general.architecture", "llama");
    md.set("evil\u{1b}]0;title\u{7}key", "value \u{1b}[31mred\r");
    let data = [0u8; 4];
    let bytes = rocmforge_gguf::write_to_vec(
        &md,
        &[TensorToWrite {
            name: "t\u{1b}[2J",
            dims: &[1],
            ty: GgmlType::F32,
            data: &data,
        }],
    )
    .expect("write");
    let f = GgufFile::from_bytes(bytes).expect("parse");
    let mut out = Vec::new();
    rocmforge_gguf::dump::write_info(&f, &mut out).expect("info");
    let text = String::from_utf8(out).expect("utf-8");
    assert!(!text.contains('\u{1b}') && !text.contains('\r') && !text.contains('\u{7}'));
    assert!(text.contains("evil\\u{1b}]0;title\\u{7}key"), "{text}");
    assert!(text.contains("t\\u{1b}[2J"), "{text}");
}
