//! Shared helpers for the integration tests: a deterministic RNG, scratch directories and the
//! Python oracle (`tests/oracle.py`, which runs the official `gguf` package).

#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::path::{Path, PathBuf};
use std::process::Command;

use rocmforge_gguf::GgmlType;

/// SplitMix64: small, deterministic, good enough for test data.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f32 {
        let u1 = self.unit().max(1e-7);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f32::consts::TAU * u2).cos()
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }

    /// A finite, moderate f16 scale of random sign.
    pub fn sane_f16(&mut self) -> [u8; 2] {
        let mag = (0.5 + self.unit()) * 2f32.powi(self.below(11) as i32 - 8);
        let v = if self.below(2) == 0 { mag } else { -mag };
        half::f16::from_f32(v).to_bits().to_le_bytes()
    }
}

/// A fresh scratch directory under cargo's per-target temp dir.
pub fn scratch(name: &str) -> PathBuf {
    let dir =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("gguf-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

pub fn oracle_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle.py")
}

/// True when python3 with `gguf` and `numpy` is importable. Without it a test prints why it
/// skipped; under CI (env `CI` set) a missing oracle is a failure, never a silent pass.
pub fn python_oracle_available() -> bool {
    let ok = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI requires python3 with the gguf and numpy packages (pip install gguf numpy)"
        );
        println!("skipped: python3 with gguf+numpy not available");
    }
    ok
}

/// Runs `python3 tests/oracle.py ARGS...` and returns its stdout; panics with its stderr.
pub fn run_oracle(args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(oracle_script())
        .args(args)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "oracle.py {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    let b = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

pub fn write_f32(path: &Path, v: &[f32]) {
    let b: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    std::fs::write(path, b).expect("write f32 file");
}

/// Asserts two f32 slices are identical bit for bit, naming the first difference.
pub fn assert_bits_eq(what: &str, ours: &[f32], theirs: &[f32]) {
    assert_eq!(ours.len(), theirs.len(), "{what}: length differs");
    if let Some(i) = (0..ours.len()).find(|&i| ours[i].to_bits() != theirs[i].to_bits()) {
        panic!(
            "{what}: value {i} differs: ours {} ({:08x}), gguf-py {} ({:08x})",
            ours[i],
            ours[i].to_bits(),
            theirs[i],
            theirs[i].to_bits()
        );
    }
}

/// Random block bytes for `ty` whose scale fields are finite, moderate values (random bytes
/// everywhere else), so both dequantizers see valid, varied input.
pub fn random_blocks(ty: GgmlType, n_blocks: usize, rng: &mut Rng) -> Vec<u8> {
    let ts = ty.type_size();
    let mut b = rng.bytes(n_blocks * ts);
    use GgmlType as T;
    let f16_fields: &[usize] = match ty {
        T::Q4_0 | T::Q5_0 | T::Q8_0 | T::IQ4_NL | T::IQ4_XS | T::Q1_0 | T::Q2_0 => &[0],
        T::Q4_1 | T::Q5_1 | T::Q8_1 | T::Q4_K | T::Q5_K => &[0, 2],
        T::IQ2_XXS | T::IQ2_XS | T::IQ2_S | T::IQ3_XXS | T::IQ3_S | T::IQ1_S => &[0],
        T::Q2_K => &[80, 82],
        T::Q3_K => &[108],
        T::Q6_K => &[208],
        T::TQ1_0 => &[52],
        T::TQ2_0 => &[64],
        _ => &[],
    };
    for blk in b.chunks_exact_mut(ts) {
        for &o in f16_fields {
            blk[o..o + 2].copy_from_slice(&rng.sane_f16());
        }
        match ty {
            T::Q8_K => {
                let d = (rng.unit() + 0.1) * 0.01;
                blk[0..4].copy_from_slice(&d.to_le_bytes());
            }
            T::IQ1_M => {
                // The f16 scale lives in the top nibble of each of the four u16 scale words.
                let d = u16::from_le_bytes(rng.sane_f16());
                for k in 0..4 {
                    let o = 48 + 2 * k;
                    let w = u16::from_le_bytes([blk[o], blk[o + 1]]) & 0x0FFF;
                    let w = w | (((d >> (4 * k)) & 0xF) << 12);
                    blk[o..o + 2].copy_from_slice(&w.to_le_bytes());
                }
            }
            _ => {}
        }
    }
    b
}
