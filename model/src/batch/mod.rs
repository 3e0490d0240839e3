//! The batching engine: many requests decoded together by one thread that owns the model's
//! executor, with per-request sampling, stop conditions, streaming events and cancellation.
//!
//! Design choices:
//! - [`BatchEngine`] is a cheap handle (an `Arc` inside) over a worker thread; requests and
//!   cancellations reach it over a channel, events leave through each request's sink, so HTTP
//!   handlers on other threads share one engine.
//! - Iteration-level scheduling: every step feeds each running sequence its next token (or the
//!   next chunk of its prompt, under a per-step token budget) and admits waiting requests as
//!   slots free up; a request that ends or is cancelled gives its memory back at once.
//! - Each request samples with its own [`Sampler`](crate::sampling::Sampler) in the same order as
//!   [`crate::generate::generate`] (prompt tokens accepted first, stop tokens not emitted, the
//!   stop string never shown), so a greedy request gives the tokens `generate` gives alone.

mod kv;
mod paged;
mod worker;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::error::ModelError;
use crate::sampling::SamplerConfig;
use crate::session::{DevicePlan, Model, SessionOptions};
use crate::tokenizer::Tokenizer;

/// Options of the engine (a struct, never the environment).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineOptions {
    /// Device, `-ngl`, GPU memory limit, threads, KV type and prompt batch of the executor;
    /// `session.n_ctx` is ignored (see `n_ctx_per_seq`).
    pub session: SessionOptions,
    /// Sequences decoded together (a server's `--parallel`).
    pub max_seqs: usize,
    /// Longest context one sequence may reach (prompt + output).
    pub n_ctx_per_seq: usize,
    /// KV positions per cache block.
    pub block_size: usize,
    /// Blocks in the KV pool. `None`: on the CPU enough for `max_seqs` full contexts; on the
    /// GPU what its budget leaves after the weights, workspace and activations of the split
    /// (at least one full context, at most `max_seqs` of them). The device plan says how many.
    pub kv_blocks: Option<usize>,
    /// Host bytes the KV rows of layers on the CPU may take; `None`: the memory the system
    /// reports available. A larger pool is refused at start.
    pub host_kv_limit: Option<u64>,
    /// Tokens fed per step at most (decode tokens plus prompt chunks).
    pub step_tokens: usize,
    /// Share the cache of equal prompt prefixes between requests.
    pub prefix_cache: bool,
    /// On the CPU, sum every sequence's mat-muls in the order they get when the sequence runs
    /// alone, so each request gives the bits of [`crate::generate::generate`] (the K-quant tile
    /// kernels' order depends on the column count, as llama.cpp's). False: one order for the
    /// whole step's product (faster for K-quant weights; outputs may differ in the last bits).
    pub exact: bool,
    /// How a preempted sequence's cache is kept: copied to host memory, or recomputed.
    pub swap: SwapOptions,
    /// Whether decode steps are padded to a few batch sizes (see [`StepPadding`]).
    pub step_padding: StepPadding,
}

/// Padding of decode steps (every sequence feeding one token) to 1, 2, 4, 6, 8, 12, 16, 24...
/// sequences (powers of two and 1.5 times them, up to `max_seqs`: at most half as many rows
/// again), the extra rows computing a dummy token whose cache row and logits nobody reads.
/// A batch whose size changes from step to step (requests arriving and ending) then runs a
/// few graphs over and over: each is built, optimized and planned once, and on a GPU its
/// launches are captured once and replayed, instead of paying all of that whenever the size
/// changes. The padded rows cost compute, nearly nothing on a GPU (a decode step reads every
/// weight once whatever its width) but their full share on the CPU. Results are the same either
/// way: every row is computed on its own (on the CPU the exact orders of
/// [`EngineOptions::exact`] still hold). When steps may be padded (`On`, or `Auto` on any
/// device choice but the CPU), the KV cache holds one block more than the pool (`kv_blocks`, or
/// what the budget leaves, counted with it) for the padded rows to write.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StepPadding {
    /// Padded when a GPU runs layers of the model; not on the CPU alone.
    #[default]
    Auto,
    /// Always padded.
    On,
    /// Never padded: each batch size has a graph of its own.
    Off,
}

impl std::str::FromStr for StepPadding {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            _ => Err(ModelError::InvalidArgument(format!(
                "step padding `{s}`: expected auto, on or off"
            ))),
        }
    }
}

/// When the pool runs out of blocks, the newest sequence is preempted. Its cache is either
/// copied to host memory and copied back when it resumes (swap), or dropped and computed again
/// from its tokens (recompute); both give the same bits, so the output is the same either way.
///
/// The engine swaps when the sequence holds at least `min_positions` cached positions and the
/// swapped caches fit `host_bytes`; otherwise it recomputes. Why: recomputing costs a prefill
/// of the sequence's positions (compute that grows with its length, and attention that grows
/// with its square) but no memory; swapping costs two copies of its cache rows (one way over
/// the bus on a GPU, a memory copy on the CPU) whatever the model's size, and holds host
/// memory while the sequence waits. A short sequence recomputes in a fraction of one step,
/// riding along with the decode batch whose weights the step reads anyway; a long one would
/// take whole steps of prefill, while its copies take far less time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwapOptions {
    /// Host bytes all swapped-out caches may take together; 0: always recompute.
    pub host_bytes: u64,
    /// Sequences with fewer cached positions are recomputed.
    pub min_positions: usize,
}

impl Default for SwapOptions {
    fn default() -> Self {
        Self {
            host_bytes: 1 << 30,
            min_positions: 64,
        }
    }
}

impl Default for EngineOptions {
    fn default() -> Self {
        Self {
            session: SessionOptions::default(),
            max_seqs: 8,
            n_ctx_per_seq: 4096,
            block_size: 16,
            kv_blocks: None,
            host_kv_limit: None,
            step_tokens: 512,
            prefix_cache: true,
            exact: true,
            swap: SwapOptions::default(),
            step_padding: StepPadding::Auto,
        }
    }
}

/// Constrained decoding hook (a grammar or JSON schema engine).
pub trait TokenConstraint: Send {
    /// Called before sampling: forbids tokens by setting their logits to `-inf`.
    fn mask(&mut self, logits: &mut [f32]);
    /// Called with the sampled token; false when the constraint is complete (generation stops).
    fn accept(&mut self, token: u32) -> bool;
}

/// What a request asks for.
pub struct Request {
    /// Prompt token ids (BOS included when the model wants one).
    pub prompt: Vec<u32>,
    /// Sampling settings (seed inside).
    pub sampling: SamplerConfig,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Tokens that end generation and are not emitted (e.g. the model's end-of-generation ids).
    pub stop_tokens: Vec<u32>,
    /// Text that ends generation; it is never part of the emitted text.
    pub stop_strings: Vec<String>,
    /// `Some(n)`: each token's log-probability and the `n` most likely alternatives.
    pub logprobs: Option<usize>,
    /// Constrained decoding.
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request")
            .field("prompt_len", &self.prompt.len())
            .field("sampling", &self.sampling)
            .field("max_tokens", &self.max_tokens)
            .field("stop_tokens", &self.stop_tokens)
            .field("stop_strings", &self.stop_strings)
            .field("logprobs", &self.logprobs)
            .field("constraint", &self.constraint.is_some())
            .finish()
    }
}

impl Request {
    /// Greedy decoding of up to `max_tokens` tokens after `prompt`, no stop conditions.
    pub fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Self {
        Self {
            prompt,
            sampling: SamplerConfig::greedy(),
            max_tokens,
            stop_tokens: Vec::new(),
            stop_strings: Vec::new(),
            logprobs: None,
            constraint: None,
        }
    }
}

/// A token's log-probability (natural log of the softmax of the logits the sampler saw, after
/// the constraint's mask) and the most likely tokens at that step.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    /// The chosen token's log-probability.
    pub logprob: f32,
    /// The `n` most likely tokens and their log-probabilities, best first.
    pub top: Vec<(u32, f32)>,
}

/// Why a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token, a stop string, or a completed constraint.
    Stop,
    /// `max_tokens` reached, or the sequence's context is full.
    Length,
    /// Cancelled by its handle, its receiver going away, or engine shutdown.
    Cancelled,
}

/// Token counts of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (emitted).
    pub completion_tokens: usize,
    /// Prompt tokens whose cache was reused rather than computed.
    pub cached_tokens: usize,
}

/// Everything the engine tells about one request, in order; `Done` or `Error` comes last.
#[derive(Debug)]
pub enum Event {
    /// A generated token.
    Token {
        /// Its id.
        id: u32,
        /// Text that became final with it (UTF-8-safe, never part of a stop string; may be "").
        text: String,
        /// When asked for.
        logprob: Option<TokenLogprob>,
    },
    /// The request finished.
    Done {
        /// Why.
        reason: FinishReason,
        /// Token counts.
        usage: Usage,
        /// Text held back until the end (an incomplete UTF-8 sequence or what looked like the
        /// start of a stop string); usually empty.
        text: String,
    },
    /// The request failed; the engine goes on with the others.
    Error(ModelError),
}

/// Counters of the engine, as of its last step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineStats {
    /// Sequences being decoded.
    pub running: usize,
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// KV blocks in use.
    pub kv_blocks_used: usize,
    /// KV blocks free.
    pub kv_blocks_free: usize,
    /// KV blocks in the pool.
    pub kv_blocks_total: usize,
    /// Prompt tokens computed so far.
    pub prompt_tokens: u64,
    /// Tokens generated so far.
    pub generated_tokens: u64,
    /// Sequences preempted so far.
    pub preemptions: u64,
    /// Of those, the ones whose cache was swapped to host memory (the others recompute it).
    pub swapped_out: u64,
    /// Host bytes the swapped-out caches hold now.
    pub swap_bytes: u64,
    /// Forward steps so far.
    pub steps: u64,
    /// Of those, the steps a GPU ran by replaying the captured launches of an earlier step of
    /// the same shape.
    pub replayed_steps: u64,
    /// Of those, the decode steps padded to a larger batch (see [`StepPadding`]).
    pub padded_steps: u64,
    /// Host time of those steps, microseconds in all: graphs built and optimized for new pass
    /// shapes.
    pub build_us: u64,
    /// Host time: inputs uploaded and the pass launched (or replayed).
    pub run_us: u64,
    /// Host time: waiting for the pass's logits.
    pub output_us: u64,
    /// Host time: sampling (from the logits where the executor holds them) and streaming the
    /// tokens.
    pub sample_us: u64,
}

/// How [`BatchEngine::embed`] pools the hidden states of a text's tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Pooling {
    /// The mean over all tokens.
    #[default]
    Mean,
    /// The last token's (what a causal model has read the whole text at).
    Last,
    /// The first token's (BERT's `[CLS]`).
    First,
    /// No pooling: every token's vector, each of unit length, one after the other.
    None,
}

impl Pooling {
    /// The pooling a GGUF file asks for in `{arch}.pooling_type` (llama.cpp's numbers: 0 none,
    /// 1 mean, 2 cls, 3 last; 4, rank, needs a classifier head, which is not planned).
    pub fn from_gguf(value: u32) -> Result<Self, ModelError> {
        match value {
            0 => Ok(Self::None),
            1 => Ok(Self::Mean),
            2 => Ok(Self::First),
            3 => Ok(Self::Last),
            v => Err(ModelError::InvalidArgument(format!(
                "pooling type {v} is not supported (0 none, 1 mean, 2 cls, 3 last)"
            ))),
        }
    }

    /// The pooling of a loaded model: its `{arch}.pooling_type`, `None` when the file has none.
    pub fn of_model(m: &crate::session::Model) -> Result<Option<Self>, ModelError> {
        let v = m
            .file()
            .arch_u32_opt("pooling_type")
            .map_err(|e| ModelError::BadKey {
                key: format!("{}.pooling_type", m.config().arch.name()),
                reason: e.to_string(),
            })?;
        v.map(Self::from_gguf).transpose()
    }
}

impl std::str::FromStr for Pooling {
    type Err = ModelError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "mean" => Ok(Self::Mean),
            "cls" | "first" => Ok(Self::First),
            "last" => Ok(Self::Last),
            _ => Err(ModelError::InvalidArgument(format!(
                "pooling `{s}`: expected none, mean, cls or last"
            ))),
        }
    }
}

/// Where a request's events go; returning false (receiver gone) cancels the request.
pub type Sink = Box<dyn FnMut(Event) -> bool + Send>;

/// Messages to the worker thread.
enum Command {
    Submit {
        id: u64,
        req: Request,
        sink: Sink,
        cancelled: Arc<AtomicBool>,
    },
    Cancel,
    Embed {
        tokens: Vec<u32>,
        pooling: Pooling,
        reply: Sender<Result<Vec<f32>, ModelError>>,
    },
    Bandwidth {
        reply: Sender<Option<Result<f64, ModelError>>>,
    },
    Shutdown,
}

struct Inner {
    tx: Mutex<Sender<Command>>,
    thread: Mutex<Option<JoinHandle<()>>>,
    stats: Arc<Mutex<EngineStats>>,
    next_id: AtomicU64,
    tokenizer: Arc<Tokenizer>,
    limits: worker::Limits,
    plan: DevicePlan,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Inner {
    fn shutdown(&self) {
        if let Ok(tx) = self.tx.lock() {
            // The worker may already be gone; then there is nothing to stop.
            let _ = tx.send(Command::Shutdown);
        }
        let handle = self.thread.lock().ok().and_then(|mut h| h.take());
        if let Some(h) = handle {
            if h.join().is_err() {
                tracing::error!("the batching engine's thread panicked");
            }
        }
    }
}

/// The engine: a worker thread owning the model's executor. Cloning shares it.
#[derive(Clone)]
pub struct BatchEngine {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BatchEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchEngine")
            .field("stats", &self.stats())
            .finish()
    }
}

/// A submitted request: its id and a way to cancel it.
#[derive(Clone, Debug)]
pub struct RequestHandle {
    id: u64,
    cancelled: Arc<AtomicBool>,
    tx: Sender<Command>,
}

impl RequestHandle {
    /// The engine-wide id of the request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Cancels the request: it ends with [`FinishReason::Cancelled`] and its cache memory is
    /// freed before the next step.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        // A gone worker has nothing left to cancel.
        let _ = self.tx.send(Command::Cancel);
    }
}

impl BatchEngine {
    /// Starts the worker thread with the model's executor (weights bound or uploaded as
    /// [`crate::session::Session`] does) and returns once it is ready.
    pub fn start(model: Arc<Model>, opts: EngineOptions) -> Result<Self, ModelError> {
        let tokenizer = Arc::new(Tokenizer::from_gguf(model.file())?);
        let limits = worker::Limits::new(&model, &opts)?;
        let stats = Arc::new(Mutex::new(EngineStats::default()));
        let (tx, rx) = mpsc::channel();
        let (ready_tx, ready_rx) = mpsc::channel();
        let worker_stats = Arc::clone(&stats);
        let worker_tok = Arc::clone(&tokenizer);
        let thread = std::thread::Builder::new()
            .name("rocmforge-batch".into())
            .spawn(move || {
                let w = worker::Worker::new(model, opts, worker_tok, worker_stats);
                match w {
                    Ok(mut w) => {
                        if ready_tx.send(Ok(w.plan().clone())).is_ok() {
                            w.run(rx);
                        }
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            })
            .map_err(|e| ModelError::Device(format!("cannot start the engine thread: {e}")))?;
        let started = ready_rx.recv().unwrap_or_else(|_| {
            Err(ModelError::Device(
                "the engine thread ended while starting".into(),
            ))
        });
        let plan = match started {
            Ok(p) => p,
            Err(e) => {
                let _ = thread.join();
                return Err(e);
            }
        };
        let mut limits = limits;
        limits.set_pool_positions(plan.kv.positions);
        Ok(Self {
            inner: Arc::new(Inner {
                tx: Mutex::new(tx),
                thread: Mutex::new(Some(thread)),
                stats,
                next_id: AtomicU64::new(1),
                tokenizer,
                limits,
                plan,
            }),
        })
    }

    /// Queues a request; its events go to `sink`. Refused at once: an empty prompt, a prompt
    /// longer than `n_ctx_per_seq`, a token outside the vocabulary, a request that could never
    /// fit the KV pool, or a stopped engine.
    pub fn submit(&self, req: Request, sink: Sink) -> Result<RequestHandle, ModelError> {
        self.inner.limits.check_generates()?;
        self.inner.limits.check(&req)?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let cancelled = Arc::new(AtomicBool::new(false));
        let tx = self.inner.tx.lock().map_err(|_| stopped())?.clone();
        tx.send(Command::Submit {
            id,
            req,
            sink,
            cancelled: Arc::clone(&cancelled),
        })
        .map_err(|_| stopped())?;
        Ok(RequestHandle { id, cancelled, tx })
    }

    /// [`BatchEngine::submit`] with the events on a channel.
    pub fn submit_channel(
        &self,
        req: Request,
    ) -> Result<(RequestHandle, Receiver<Event>), ModelError> {
        let (tx, rx) = mpsc::channel();
        let h = self.submit(req, Box::new(move |e| tx.send(e).is_ok()))?;
        Ok((h, rx))
    }

    /// The embedding of `tokens`: the model's normalized last hidden states (the output
    /// head's input; an encoder's last hidden states) pooled over the tokens and scaled to unit
    /// length ([`Pooling::None`]: every token's, each scaled to unit length). Runs between two steps
    /// as a pass of its own (preempting the newest sequences when the pool has no room); at
    /// most `step_tokens` tokens.
    pub fn embed(&self, tokens: Vec<u32>, pooling: Pooling) -> Result<Vec<f32>, ModelError> {
        let probe = Request::greedy(tokens, 0);
        self.inner.limits.check(&probe)?;
        self.inner.limits.check_embed(&probe.prompt)?;
        let (reply, rx) = mpsc::channel();
        let tx = self.inner.tx.lock().map_err(|_| stopped())?.clone();
        tx.send(Command::Embed {
            tokens: probe.prompt,
            pooling,
            reply,
        })
        .map_err(|_| stopped())?;
        rx.recv().map_err(|_| stopped())?
    }

    /// The GPU's device-to-device copy bandwidth (bytes read + written per second), measured
    /// now between two steps; `None` when the engine runs on the CPU.
    pub fn gpu_copy_bandwidth(&self) -> Option<Result<f64, ModelError>> {
        let (reply, rx) = mpsc::channel();
        let sent = self
            .inner
            .tx
            .lock()
            .map_err(|_| stopped())
            .and_then(|tx| tx.send(Command::Bandwidth { reply }).map_err(|_| stopped()));
        if let Err(e) = sent {
            return Some(Err(e));
        }
        rx.recv().unwrap_or_else(|_| Some(Err(stopped())))
    }

    /// Counters as of the last step.
    pub fn stats(&self) -> EngineStats {
        self.inner.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Where the model's layers run.
    pub fn device_plan(&self) -> &DevicePlan {
        &self.inner.plan
    }

    /// The model's tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner.tokenizer
    }

    /// Ends every request (cancelled) and stops the worker thread; later submits are refused.
    pub fn shutdown(&self) {
        self.inner.shutdown();
    }
}

fn stopped() -> ModelError {
    ModelError::InvalidArgument("the batching engine has shut down".into())
}

#[cfg(test)]
mod tests;
