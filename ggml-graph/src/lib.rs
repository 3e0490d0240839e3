#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
//!
//! ## Design choices
//! - Tensors are metadata only ([`Tensor`]: type, `ne`/`nb` in ggml's convention, op, sources,
//!   view parent); ops are a Rust enum with typed parameters ([`Op`]).
//! - A [`Graph`] is built by calling op methods in execution order; each method checks shapes
//!   and returns a [`TensorId`]. Weights are leaves bound by name to external bytes (zero-copy,
//!   e.g. a mmap'd GGUF) and use GGUF dims directly: `mul_mat(W[K, N], X[K, M]) -> [N, M]`.
//! - Persistent leaves (the KV cache) are executor-owned buffers found by name that keep their
//!   contents across runs; `set_rows`/`cpy` write them and return an alias to read through.
//! - The [`plan`] module places intermediates in one arena by liveness and best fit (elementwise
//!   and row ops take over a dying first operand in place), so a model can rebuild its graph every
//!   step; the arena only grows.
//! - [`opt`] passes (CSE, view folding, fusion guarded by `can_fuse`, dead-node elimination)
//!   rewrite a graph keeping its `TensorId`s valid; call [`opt::optimize`] before running.
//! - Backends split into buffer type / buffer / stream / device ([`backend`]); the [`Scheduler`]
//!   places nodes on several devices by `supports_op` and inserts copies; a dummy device records
//!   allocations and launches for logic tests.
//! - The CPU backend quantizes activations to 8-bit blocks once per `mul_mat` and dots them with
//!   quantized weights in integers (llama.cpp's approach); up to four activation columns share
//!   each decoded weight block in prefill. SIMD (AVX2/FMA/F16C, AVX-512 VNNI) is chosen at run
//!   time ([`quant::detected`]); the scalar path is the tested reference.

#![allow(
    clippy::needless_range_loop,
    reason = "kernels index several arrays in lockstep; the indices mirror ggml's block layouts"
)]

pub mod backend;
pub mod cpu;
pub mod error;
pub mod exec;
pub mod graph;
#[cfg(feature = "hip")]
pub mod hip;
#[cfg(not(feature = "hip"))]
#[path = "hip_stub.rs"]
pub mod hip;
mod hip_options;
pub mod opt;
pub mod plan;
pub mod quant;
pub mod sched;
pub mod tensor;

pub use backend::{
    Buffer, BufferType, Captured, Collective, CpuDevice, Device, DummyDevice, GroupNode, Stream,
    TensorMem,
};
pub use cpu::CpuBackend;
pub use error::{GraphError, Result};
pub use exec::{Executor, WeightBytes};
pub use graph::Graph;
pub use hip_options::{
    AllReduceKind, CollectiveOptions, HipOptions, IdExchange, StackKernel, RUNTIME_GROWTH,
};
pub use plan::Plan;
pub use sched::{Schedule, Scheduler, SchedulerOptions};
pub use tensor::{
    Act, AttnParams, DType, DecodeLayerParams, Leaf, Op, RopeMode, RopeParams, Tensor, TensorId,
};
