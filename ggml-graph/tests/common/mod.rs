//! Shared helpers for the op tests: a seeded generator, random quantized blocks, f64 references
//! and the normalized mean squared error used as the pass criterion (as in ggml's
//! test-backend-ops).

#![allow(
    dead_code,
    unused_macros,
    unused_imports,
    reason = "each test binary uses a different subset of the helpers"
)]

use rocmforge_ggml_graph::{CpuBackend, DType, Executor, Graph, TensorId, WeightBytes};

/// xorshift64* generator: deterministic test data without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [-1, 1).
    pub fn uniform(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }
    pub fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// Offsets of the f16 scale fields inside one block of `ty`.
fn scale_fields(ty: DType) -> &'static [usize] {
    match ty {
        DType::Q4_0 | DType::Q5_0 | DType::Q8_0 | DType::IQ4_NL | DType::IQ4_XS => &[0],
        DType::Q4_1 | DType::Q5_1 | DType::Q4_K | DType::Q5_K => &[0, 2],
        DType::Q2_K => &[80, 82],
        DType::Q3_K => &[108],
        DType::Q6_K => &[208],
        _ => &[],
    }
}

/// Random bytes for `n` values of `ty` with sane scale fields (every bit pattern of the quants is
/// a valid block, so this covers the whole encoding).
pub fn random_weights(rng: &mut Rng, ty: DType, n: usize) -> Vec<u8> {
    match ty {
        DType::F32 => bytemuck::cast_slice(&rng.vec(n)).to_vec(),
        DType::F16 => rng
            .vec(n)
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        DType::BF16 => rng
            .vec(n)
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_bits().to_le_bytes())
            .collect(),
        _ => {
            let bs = ty.type_size();
            let mut b: Vec<u8> = (0..n / ty.block_size() * bs)
                .map(|_| rng.next_u64() as u8)
                .collect();
            for blk in b.chunks_exact_mut(bs) {
                for &o in scale_fields(ty) {
                    let v = 0.001 + 0.02 * (rng.uniform() + 1.0);
                    blk[o..o + 2].copy_from_slice(&half::f16::from_f32(v).to_bits().to_le_bytes());
                }
                if ty == DType::MXFP4 {
                    // An E8M0 exponent near 2^-7 (bias 127).
                    blk[0] = 116 + (rng.next_u64() % 8) as u8;
                }
            }
            b
        }
    }
}

/// Dequantized rows (f64, by the `gguf` crate) of a weight matrix with rows of `k` values.
pub fn dequant(ty: DType, bytes: &[u8], k: usize) -> Vec<f64> {
    let rb = k / ty.block_size() * ty.type_size();
    let mut out = Vec::new();
    let mut row = vec![0f32; k];
    for r in bytes.chunks_exact(rb) {
        gguf::dequantize_row(ty, r, &mut row).expect("gguf dequantizes every weight type");
        out.extend(row.iter().map(|&v| v as f64));
    }
    out
}

/// Normalized mean squared error of `got` against `want`.
pub fn nmse(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let (mut err, mut norm) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output {g}");
        err += (g as f64 - w).powi(2);
        norm += w * w;
    }
    if norm == 0.0 {
        err
    } else {
        err / norm
    }
}

pub fn assert_close(what: &str, got: &[f32], want: &[f64], bound: f64) {
    let e = nmse(got, want);
    assert!(e <= bound, "{what}: nmse {e:e} > {bound:e}");
}

pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    bytemuck::cast_slice(v).to_vec()
}

/// Runs `g` on a fresh single-thread executor with `weights` bound, returning the executor.
pub fn run(
    g: &Graph,
    weights: &[(&str, DType, &[usize], Vec<u8>)],
    inputs: &[(TensorId, Vec<u8>)],
) -> Executor {
    let mut ex = Executor::new(CpuBackend::new(2).expect("thread pool"));
    for (name, ty, shape, bytes) in weights {
        ex.bind_weight(name, *ty, shape, WeightBytes::from_vec(bytes.clone()))
            .expect("bind");
    }
    let ins: Vec<(TensorId, &[u8])> = inputs.iter().map(|(i, b)| (*i, b.as_slice())).collect();
    ex.run(g, &ins).expect("run");
    ex
}

/// Values rebuilt from ggml-graph's own block decoders (what the scalar dot products use).
pub fn decoded(ty: DType, bytes: &[u8], k: usize) -> Vec<f64> {
    let rb = k / ty.block_size() * ty.type_size();
    let mut out = Vec::new();
    let mut row = vec![0f32; k];
    for r in bytes.chunks_exact(rb) {
        assert!(rocmforge_ggml_graph::quant::blocks::reconstruct_row(
            ty, r, &mut row
        ));
        out.extend(row.iter().map(|&v| v as f64));
    }
    out
}

/// The `Device` methods a scheduler test double hands unchanged to the device in its field
/// `$inner`: `buffer_type` and `new_stream`, plus `supports_op` and `launch` with `all`;
/// `compute` forwards all but `buffer_type` (a double with memory of its own).
macro_rules! forward_device {
    ($inner:tt) => {
        fn buffer_type(&self) -> &dyn rocmforge_ggml_graph::backend::BufferType {
            self.$inner.buffer_type()
        }
        forward_device!($inner, stream);
    };
    ($inner:tt, stream) => {
        fn new_stream(
            &self,
        ) -> rocmforge_ggml_graph::Result<Box<dyn rocmforge_ggml_graph::backend::Stream>> {
            self.$inner.new_stream()
        }
    };
    ($inner:tt, all) => {
        fn buffer_type(&self) -> &dyn rocmforge_ggml_graph::backend::BufferType {
            self.$inner.buffer_type()
        }
        forward_device!($inner, compute);
    };
    ($inner:tt, compute) => {
        forward_device!($inner, stream);
        fn supports_op(
            &self,
            t: &rocmforge_ggml_graph::Tensor,
            srcs: &[&rocmforge_ggml_graph::Tensor],
        ) -> bool {
            self.$inner.supports_op(t, srcs)
        }
        fn launch(
            &self,
            s: &dyn rocmforge_ggml_graph::backend::Stream,
            t: &rocmforge_ggml_graph::Tensor,
            dst: rocmforge_ggml_graph::backend::TensorMem<'_>,
            srcs: &[rocmforge_ggml_graph::backend::TensorMem<'_>],
        ) -> rocmforge_ggml_graph::Result<()> {
            self.$inner.launch(s, t, dst, srcs)
        }
    };
}
pub(crate) use forward_device;
