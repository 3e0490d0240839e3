#![doc = include_str!("../README.md")]
#![warn(missing_docs)]
//!
//! ## Design choices
//! - One module per architecture under [`arch`]; each builds a `ggml-graph` graph from a typed
//!   [`config::ModelConfig`] and never touches tensor memory. The [`session::Session`] binds the
//!   mapped file's tensors to the executor once (zero-copy) and keeps the KV cache as persistent
//!   executor buffers, so a decode step only rebuilds a small graph.
//! - Prompts are processed in batches and only the positions that need logits reach the output
//!   projection (the last one, or all of them for perplexity).
//! - Sampling follows llama.cpp's chain and defaults, with a seeded generator of our own so the
//!   same seed always gives the same text.

pub mod arch;
pub mod batch;
pub mod chat;
#[cfg(feature = "cli")]
pub mod cli;
pub mod config;
pub mod dist;
mod engine;
pub mod error;
pub mod fit;
pub mod generate;
pub mod gpus;
pub mod perplexity;
pub mod placement;
mod ranks;
pub mod sampling;
pub mod session;
pub mod stream;
pub mod synth;
mod tensor_split;
pub mod text;
pub mod tokenizer;

pub use error::ModelError;
