//! The server's side of the batching engine ([`model::batch`]): the one module that talks to it.
//! It starts the engine, turns a validated request into an engine request, and forwards the
//! engine's events to the async handlers over a tokio channel; dropping a [`Submitted`] cancels
//! its request.

use std::sync::{Arc, OnceLock};

use model::arch::{KvCacheSpec, KvType};
use model::batch::{self, BatchEngine, EngineOptions, FinishReason, Pooling};
use model::placement;
use model::sampling::SamplerConfig;
use model::session::Model;
use model::session::SessionOptions;
use model::text::TextModel;
use model::ModelError;
use tokio::sync::mpsc;

use crate::constraint::Grammars;
use crate::metrics::{DeviceMemory, EngineGauges};

pub use model::batch::TokenConstraint;

/// How the engine is set up.
#[derive(Debug, Clone)]
pub struct BackendOptions {
    /// Device, layers, memory limit, threads and KV type (`n_ctx` is ignored).
    pub session: SessionOptions,
    /// Sequences decoded together (`--parallel`).
    pub parallel: usize,
    /// Context of one request (prompt + answer).
    pub n_ctx_per_seq: usize,
}

/// A loaded model behind a running engine.
#[derive(Debug)]
pub struct Backend {
    engine: BatchEngine,
    text: TextModel,
    n_ctx: usize,
    /// How embeddings pool their tokens: the model's `{arch}.pooling_type`, else the mean.
    pooling: Pooling,
    /// Built on the first structured-output request (a trie over the whole vocabulary).
    grammars: OnceLock<Result<Grammars, String>>,
    /// Where the model's memory went, per device.
    memory: Vec<DeviceMemory>,
}

/// What one generation asks for, already validated by the handler.
pub struct Generation {
    /// Prompt token ids.
    pub prompt: Vec<u32>,
    /// Sampling settings.
    pub sampling: SamplerConfig,
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Stop at the model's end-of-generation tokens.
    pub stop_at_eog: bool,
    /// Text that ends generation (never shown).
    pub stop_strings: Vec<String>,
    /// `Some(n)`: log-probabilities with `n` alternatives.
    pub logprobs: Option<usize>,
    /// Constrained decoding (structured output).
    pub constraint: Option<Box<dyn TokenConstraint>>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the prompt itself: requests are logged without their text.
        f.debug_struct("Generation")
            .field("prompt_len", &self.prompt.len())
            .field("max_tokens", &self.max_tokens)
            .field("constraint", &self.constraint.is_some())
            .finish()
    }
}

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token or string.
    Stop,
    /// The token budget or the context ran out.
    Length,
    /// Cancelled.
    Cancelled,
}

impl Finish {
    /// OpenAI's `finish_reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            Finish::Stop => "stop",
            Finish::Length | Finish::Cancelled => "length",
        }
    }
}

/// A token's log-probability and the best alternatives (id, log-probability).
#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens, best first.
    pub top: Vec<(u32, f32)>,
}

/// One event of a generation.
#[derive(Debug)]
pub enum Out {
    /// A generated token and the text that became final with it (may be empty).
    Token {
        /// Its id.
        id: u32,
        /// New text.
        text: String,
        /// Log-probabilities, when asked for.
        logprob: Option<Logprob>,
    },
    /// The end: held-back text, why, and the token counts.
    Done {
        /// Text released at the end.
        text: String,
        /// Why it ended.
        finish: Finish,
        /// Prompt tokens.
        prompt_tokens: usize,
        /// Generated tokens.
        completion_tokens: usize,
    },
    /// The generation failed.
    Error(ModelError),
}

/// A running generation: its events, and cancellation when dropped.
#[derive(Debug)]
pub struct Submitted {
    /// The events, ending with `Done` or `Error`.
    pub events: mpsc::UnboundedReceiver<Out>,
    handle: batch::RequestHandle,
}

impl Drop for Submitted {
    fn drop(&mut self) {
        // Finished requests ignore this; unfinished ones free their KV blocks at once.
        self.handle.cancel();
    }
}

impl Backend {
    /// Starts the engine over a loaded model.
    pub fn start(text: TextModel, opts: &BackendOptions) -> Result<Self, ModelError> {
        let eopts = EngineOptions {
            session: opts.session.clone(),
            max_seqs: opts.parallel,
            n_ctx_per_seq: opts.n_ctx_per_seq,
            step_tokens: opts.session.n_batch.max(opts.parallel),
            ..EngineOptions::default()
        };
        let block_size = eopts.block_size;
        let kv_type = eopts.session.kv_type;
        let engine = BatchEngine::start(Arc::new(text.model().clone()), eopts)?;
        let memory = memory_plan(&engine, text.model(), block_size, kv_type);
        // GGUF's pooling types: 0 none, 1 mean, 2 cls (the first token), 3 last; a decoder's
        // file has none. "None" asks for per-token vectors, which the endpoint does not
        // return, so it pools like mean.
        let pooling = match Pooling::of_model(text.model())? {
            Some(Pooling::None) | None => Pooling::Mean,
            Some(p) => p,
        };
        Ok(Self {
            engine,
            text,
            n_ctx: opts.n_ctx_per_seq,
            pooling,
            grammars: OnceLock::new(),
            memory,
        })
    }

    /// The grammar compiler over this model's vocabulary.
    pub fn grammars(&self) -> Result<&Grammars, String> {
        self.grammars
            .get_or_init(|| Grammars::new(Arc::new(self.text.tokenizer().clone())))
            .as_ref()
            .map_err(Clone::clone)
    }

    /// The model, tokenizer and chat template.
    pub fn text(&self) -> &TextModel {
        &self.text
    }

    /// Context of one request.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Queues a generation; refused at once when the engine cannot take its prompt.
    pub fn submit(&self, g: Generation) -> Result<Submitted, ModelError> {
        let stop_tokens = if g.stop_at_eog {
            self.text.tokenizer().eog_ids()
        } else {
            Vec::new()
        };
        let req = batch::Request {
            prompt: g.prompt,
            sampling: g.sampling,
            max_tokens: g.max_tokens,
            stop_tokens,
            stop_strings: g.stop_strings,
            logprobs: g.logprobs,
            constraint: g.constraint,
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = Box::new(move |e: batch::Event| tx.send(convert(e)).is_ok());
        let handle = self.engine.submit(req, sink)?;
        Ok(Submitted { events: rx, handle })
    }

    /// The unit-length embedding of `tokens`, pooled as the model asks. Blocks until the
    /// engine ran it (call it off the async runtime).
    pub fn embed(&self, tokens: Vec<u32>) -> Result<Vec<f32>, ModelError> {
        self.engine.embed(tokens, self.pooling)
    }

    /// Where the model's layers run and the KV pool the placement sized.
    pub fn device_plan(&self) -> &model::session::DevicePlan {
        self.engine.device_plan()
    }

    /// The engine's queue and KV-pool counters.
    pub fn gauges(&self) -> EngineGauges {
        let s = self.engine.stats();
        EngineGauges {
            running: s.running,
            waiting: s.waiting,
            kv_blocks_used: s.kv_blocks_used,
            kv_blocks_free: s.kv_blocks_free,
        }
    }

    /// The memory the model takes on each device.
    pub fn memory(&self) -> &[DeviceMemory] {
        &self.memory
    }

    /// Stops the engine (requests still running end cancelled).
    pub fn shutdown(&self) {
        self.engine.shutdown();
    }
}

/// The memory of the engine's plan: the GPU's from its estimate and budget, the CPU's from
/// the weights and KV layers the split leaves there.
fn memory_plan(
    engine: &BatchEngine,
    model: &Model,
    block_size: usize,
    kv_type: KvType,
) -> Vec<DeviceMemory> {
    let plan = engine.device_plan();
    let split = &plan.split;
    let cfg = model.config();
    let cpu_weights: u64 = model
        .file()
        .tensors()
        .iter()
        .filter(|t| split.device_of(&t.name) != Some(placement::GPU))
        .map(|t| t.size)
        .sum();
    let positions = engine.stats().kv_blocks_total * block_size;
    let kv_all = KvCacheSpec {
        dtype: kv_type,
        n_ctx: positions,
    }
    .bytes(cfg) as u64;
    let per_layer = kv_all.checked_div(cfg.n_layer as u64).unwrap_or(0);
    let cpu_layers = (split.n_layer - split.gpu_layers()) as u64;
    let mut out = vec![DeviceMemory {
        device: "cpu".into(),
        weights: cpu_weights,
        kv: per_layer * cpu_layers,
        activations: 0,
        limit: None,
    }];
    if plan.uses_gpu() {
        out.push(DeviceMemory {
            device: plan.device.clone(),
            weights: plan.estimate.weights,
            kv: plan.estimate.kv,
            activations: plan.estimate.activations,
            limit: plan.available,
        });
    }
    out
}

fn convert(e: batch::Event) -> Out {
    match e {
        batch::Event::Token { id, text, logprob } => Out::Token {
            id,
            text,
            logprob: logprob.map(|l| Logprob {
                logprob: l.logprob,
                top: l.top,
            }),
        },
        batch::Event::Done {
            reason,
            usage,
            text,
        } => Out::Done {
            text,
            finish: match reason {
                FinishReason::Stop => Finish::Stop,
                FinishReason::Length => Finish::Length,
                FinishReason::Cancelled => Finish::Cancelled,
            },
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        },
        batch::Event::Error(e) => Out::Error(e),
    }
}
