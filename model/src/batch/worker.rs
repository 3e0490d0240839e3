//! The engine's thread: admits requests, builds each step's batch, samples and streams tokens,
//! and ends requests on their stop conditions or cancellation.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rayon::prelude::*;

use super::paged::{Item, Runner, SwappedKv};
use super::{
    Command, EngineOptions, EngineStats, Event, FinishReason, Pooling, Request, Sink, TokenLogprob,
    Usage,
};
use crate::error::ModelError;
use crate::sampling::Sampler;
use crate::session::Model;
use crate::stream::TextStream;
use crate::tokenizer::Tokenizer;

/// Logits entries of a step (rows times vocabulary) from which its rows are sampled on the
/// thread pool: four rows of a 128k vocabulary, about 0.1 ms of sampling on one thread.
const PARALLEL_SAMPLING_ENTRIES: usize = 4 * 128 * 1024;

/// What `submit` checks before a request is queued.
#[derive(Clone, Debug)]
pub(super) struct Limits {
    n_vocab: usize,
    n_ctx: usize,
    /// Positions the whole KV pool holds.
    pool_positions: usize,
    step_tokens: usize,
    /// An embedding encoder's name: it has no output head to generate with.
    encoder: Option<&'static str>,
}

impl Limits {
    pub(super) fn new(model: &Model, opts: &EngineOptions) -> Result<Self, ModelError> {
        validate(model, opts)?;
        Ok(Self {
            n_vocab: model.config().n_vocab,
            n_ctx: opts.n_ctx_per_seq,
            pool_positions: super::paged::pool_blocks(opts) * opts.block_size,
            step_tokens: opts.step_tokens,
            encoder: Some(model.config().arch)
                .filter(|a| a.is_embedding())
                .map(|a| a.name()),
        })
    }

    /// The pool's size as the placement chose it.
    pub(super) fn set_pool_positions(&mut self, positions: usize) {
        self.pool_positions = positions;
    }

    pub(super) fn check_embed(&self, tokens: &[u32]) -> Result<(), ModelError> {
        if tokens.len() > self.step_tokens {
            return Err(ModelError::InvalidArgument(format!(
                "{} tokens to embed, at most step_tokens ({}) in one pass",
                tokens.len(),
                self.step_tokens
            )));
        }
        Ok(())
    }

    /// Refuses generation on an embedding encoder.
    pub(super) fn check_generates(&self) -> Result<(), ModelError> {
        match self.encoder {
            Some(arch) => Err(ModelError::InvalidArgument(format!(
                "`{arch}` is an embedding model: it makes embeddings, not text"
            ))),
            None => Ok(()),
        }
    }

    pub(super) fn check(&self, req: &Request) -> Result<(), ModelError> {
        if req.prompt.is_empty() {
            return Err(ModelError::InvalidArgument("the prompt is empty".into()));
        }
        if let Some(&bad) = req.prompt.iter().find(|&&t| t as usize >= self.n_vocab) {
            return Err(ModelError::BadToken {
                id: bad,
                n_vocab: self.n_vocab,
            });
        }
        if req.prompt.len() > self.n_ctx {
            return Err(ModelError::ContextFull {
                needed: req.prompt.len(),
                n_ctx: self.n_ctx,
            });
        }
        if req.prompt.len() > self.pool_positions {
            return Err(ModelError::InvalidArgument(format!(
                "a prompt of {} tokens can never fit the KV pool of {} positions",
                req.prompt.len(),
                self.pool_positions
            )));
        }
        Ok(())
    }
}

fn validate(model: &Model, o: &EngineOptions) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::InvalidArgument(m));
    if o.max_seqs == 0 {
        return bad("max_seqs must be at least 1".into());
    }
    if o.block_size == 0 {
        return bad("block_size must be at least 1".into());
    }
    if o.step_tokens < o.max_seqs {
        return bad(format!(
            "step_tokens ({}) must be at least max_seqs ({}): every running sequence decodes \
             one token per step",
            o.step_tokens, o.max_seqs
        ));
    }
    if o.n_ctx_per_seq == 0 || o.n_ctx_per_seq > model.config().n_ctx_train {
        return bad(format!(
            "n_ctx_per_seq {} must be in 1..={} (the model's trained context)",
            o.n_ctx_per_seq,
            model.config().n_ctx_train
        ));
    }
    if o.kv_blocks == Some(0) {
        return bad("kv_blocks must be at least 1".into());
    }
    Ok(())
}

/// One request in the engine.
struct Seq {
    id: u64,
    req: Request,
    sink: Sink,
    cancelled: Arc<AtomicBool>,
    sampler: Sampler,
    stream: TextStream,
    /// Prompt then generated tokens; `tokens[n_cached..]` are fed next.
    tokens: Vec<u32>,
    n_cached: usize,
    n_generated: usize,
    cached_prompt: usize,
    /// The runner's slot while running.
    slot: Option<usize>,
    /// The cache of the first `n_cached` tokens in host memory while preempted (swapped).
    swapped: Option<SwappedKv>,
}

impl Seq {
    fn send(&mut self, e: Event) {
        if !(self.sink)(e) {
            self.cancelled.store(true, Ordering::Release);
        }
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.req.prompt.len(),
            completion_tokens: self.n_generated,
            cached_tokens: self.cached_prompt,
        }
    }

    fn finish(&mut self, reason: FinishReason) {
        let text = match reason {
            FinishReason::Cancelled => String::new(),
            _ => self.stream.finish(),
        };
        let usage = self.usage();
        // The request is over either way; a gone receiver changes nothing.
        let _ = (self.sink)(Event::Done {
            reason,
            usage,
            text,
        });
    }
}

/// The worker: queued and running sequences over a runner.
pub(super) struct Worker {
    runner: Runner,
    opts: EngineOptions,
    tokenizer: Arc<Tokenizer>,
    stats: Arc<Mutex<EngineStats>>,
    counters: EngineStats,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
}

impl Worker {
    pub(super) fn new(
        model: Arc<Model>,
        opts: EngineOptions,
        tokenizer: Arc<Tokenizer>,
        stats: Arc<Mutex<EngineStats>>,
    ) -> Result<Self, ModelError> {
        let runner = Runner::new(model, &opts)?;
        let mut w = Self {
            runner,
            opts,
            tokenizer,
            stats,
            counters: EngineStats::default(),
            waiting: VecDeque::new(),
            running: Vec::new(),
        };
        w.publish();
        Ok(w)
    }

    /// Where the layers run.
    pub(super) fn plan(&self) -> &crate::session::DevicePlan {
        self.runner.plan()
    }

    /// Serves commands until shutdown (or until every handle is gone).
    pub(super) fn run(&mut self, rx: Receiver<Command>) {
        loop {
            // Block only when there is nothing to do.
            let idle = self.running.is_empty() && self.waiting.is_empty();
            let first = if idle {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => break,
                }
            } else {
                match rx.recv_timeout(Duration::ZERO) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            };
            let mut shutdown = false;
            for c in first
                .into_iter()
                .chain(std::iter::from_fn(|| rx.try_recv().ok()))
            {
                match c {
                    Command::Submit {
                        id,
                        req,
                        sink,
                        cancelled,
                    } => self.enqueue(id, req, sink, cancelled),
                    Command::Cancel => {}
                    Command::Embed {
                        tokens,
                        pooling,
                        reply,
                    } => {
                        let r = self.embed(&tokens, pooling);
                        // A caller that stopped waiting needs no answer.
                        let _ = reply.send(r);
                    }
                    Command::Bandwidth { reply } => {
                        let _ = reply.send(self.runner.gpu_copy_bandwidth());
                    }
                    Command::Shutdown => shutdown = true,
                }
            }
            if shutdown {
                break;
            }
            self.reap_cancelled();
            self.admit();
            self.step();
            self.publish();
        }
        for mut s in self.running.drain(..).chain(self.waiting.drain(..)) {
            if let Some(slot) = s.slot.take() {
                self.runner.release(slot);
            }
            if let Some(kv) = s.swapped.take() {
                self.runner.discard_swapped(kv);
            }
            s.finish(FinishReason::Cancelled);
        }
        self.counters.running = 0;
        self.counters.waiting = 0;
        self.publish();
    }

    fn enqueue(&mut self, id: u64, req: Request, sink: Sink, cancelled: Arc<AtomicBool>) {
        let mut sampler = Sampler::new(req.sampling.clone());
        for &t in &req.prompt {
            sampler.accept(t);
        }
        let stream = TextStream::new(req.stop_strings.iter().cloned());
        let tokens = req.prompt.clone();
        self.waiting.push_back(Seq {
            id,
            req,
            sink,
            cancelled,
            sampler,
            stream,
            tokens,
            n_cached: 0,
            n_generated: 0,
            cached_prompt: 0,
            slot: None,
            swapped: None,
        });
    }

    /// Ends cancelled requests and frees their memory now.
    fn reap_cancelled(&mut self) {
        let cancelled = |s: &Seq| s.cancelled.load(Ordering::Acquire);
        let mut i = 0;
        while i < self.running.len() {
            if cancelled(&self.running[i]) {
                let s = self.running.remove(i);
                self.end(s, FinishReason::Cancelled);
            } else {
                i += 1;
            }
        }
        let (gone, keep): (Vec<Seq>, Vec<Seq>) = self.waiting.drain(..).partition(cancelled);
        self.waiting = keep.into();
        for s in gone {
            self.end(s, FinishReason::Cancelled);
        }
    }

    fn end(&mut self, mut s: Seq, reason: FinishReason) {
        if let Some(slot) = s.slot.take() {
            self.runner.release(slot);
        }
        if let Some(kv) = s.swapped.take() {
            self.runner.discard_swapped(kv);
        }
        tracing::debug!(id = s.id, ?reason, "request done");
        s.finish(reason);
    }

    /// Moves waiting requests into free slots, oldest first.
    fn admit(&mut self) {
        while self.running.len() < self.opts.max_seqs {
            let Some(mut s) = self.waiting.pop_front() else {
                break;
            };
            if !self.runner.fits(s.tokens.len()) {
                // Only a preempted sequence can have grown past the pool.
                self.end(s, FinishReason::Length);
                continue;
            }
            if let Some(kv) = s.swapped.take() {
                match self.runner.swap_in(&kv, s.tokens.len()) {
                    None => {
                        s.swapped = Some(kv);
                        self.waiting.push_front(s);
                        break;
                    }
                    Some(r) => {
                        self.runner.discard_swapped(kv);
                        match r {
                            Ok(slot) => {
                                tracing::debug!(id = s.id, "swapped in");
                                s.slot = Some(slot);
                                self.running.push(s);
                                continue;
                            }
                            // The cache is lost; the sequence computes it again.
                            Err(e) => {
                                tracing::warn!(id = s.id, "swap-in failed, recomputing: {e}");
                                s.n_cached = 0;
                            }
                        }
                    }
                }
            }
            match self.runner.acquire(&s.tokens, s.req.prompt.len()) {
                Some((slot, cached)) => {
                    s.slot = Some(slot);
                    s.n_cached = cached;
                    if s.n_generated == 0 {
                        s.cached_prompt = cached;
                    }
                    self.running.push(s);
                }
                None => {
                    self.waiting.push_front(s);
                    break;
                }
            }
        }
    }

    /// Runs one embedding pass, preempting the newest sequences while the pool lacks room.
    fn embed(&mut self, tokens: &[u32], pooling: Pooling) -> Result<Vec<f32>, ModelError> {
        let states = loop {
            if let Some(r) = self.runner.hidden_states(tokens) {
                break r?;
            }
            if self.running.is_empty() {
                return Err(ModelError::InvalidArgument(format!(
                    "{} tokens to embed do not fit the KV pool",
                    tokens.len()
                )));
            }
            self.preempt_newest();
        };
        let n = tokens.len();
        let d = states.len() / n.max(1);
        let rows: Vec<&[f32]> = states.chunks_exact(d).collect();
        let unit = |v: &mut [f32]| {
            let norm = v.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
            if norm > 0.0 {
                v.iter_mut().for_each(|x| *x = (*x as f64 / norm) as f32);
            }
        };
        let mut v: Vec<f32> = match pooling {
            Pooling::Mean => {
                let mut acc = vec![0f64; d];
                for r in &rows {
                    for (a, &x) in acc.iter_mut().zip(*r) {
                        *a += x as f64;
                    }
                }
                acc.iter().map(|a| (a / n as f64) as f32).collect()
            }
            Pooling::Last => rows[n - 1].to_vec(),
            Pooling::First => rows[0].to_vec(),
            Pooling::None => {
                let mut all = states;
                all.chunks_exact_mut(d).for_each(unit);
                return Ok(all);
            }
        };
        unit(&mut v);
        Ok(v)
    }

    /// Takes the cache of the newest running sequence to make room for older ones: swapped to
    /// host memory or dropped to be recomputed once readmitted (see [`super::SwapOptions`]),
    /// either way with the same result.
    fn preempt_newest(&mut self) {
        let Some(mut s) = self.running.pop() else {
            return;
        };
        if let Some(slot) = s.slot.take() {
            let swap = &self.opts.swap;
            let n = s.n_cached;
            let room = swap.host_bytes.saturating_sub(self.runner.swap_used());
            if n > 0 && n >= swap.min_positions && self.runner.swap_bytes_for(n) <= room {
                match self.runner.swap_out(slot, n) {
                    Ok(kv) => {
                        s.swapped = Some(kv);
                        self.counters.swapped_out += 1;
                    }
                    Err(e) => {
                        tracing::warn!(id = s.id, "swap-out failed, recomputing: {e}");
                        s.n_cached = 0;
                    }
                }
            } else {
                self.runner.release(slot);
                s.n_cached = 0;
            }
        }
        tracing::debug!(id = s.id, swapped = s.swapped.is_some(), "preempted");
        self.counters.preemptions += 1;
        self.waiting.push_front(s);
    }

    /// One forward pass over every running sequence, then sampling.
    fn step(&mut self) {
        if self.running.is_empty() {
            return;
        }
        // Decode tokens first (one per sequence), then prompt chunks, oldest first, under the
        // step budget; blocks for them are reserved oldest first, the newest sequences
        // preempted when the pool runs out.
        let take = loop {
            let mut budget = self.opts.step_tokens;
            let mut take = vec![0usize; self.running.len()];
            for (i, s) in self.running.iter().enumerate() {
                if s.tokens.len() - s.n_cached == 1 {
                    take[i] = 1;
                    budget -= 1;
                }
            }
            for (i, s) in self.running.iter().enumerate() {
                let left = s.tokens.len() - s.n_cached;
                if left > 1 && budget > 0 {
                    take[i] = left.min(budget);
                    budget -= take[i];
                }
            }
            let short = self.running.iter().zip(&take).position(|(s, &n)| {
                !self
                    .runner
                    .reserve(s.slot.unwrap_or(usize::MAX), s.n_cached + n)
            });
            match short {
                None => break take,
                // Alone and still short: the sequence has outgrown the whole pool.
                Some(0) if self.running.len() == 1 => {
                    let s = self.running.remove(0);
                    self.end(s, FinishReason::Length);
                }
                Some(_) => self.preempt_newest(),
            }
            if self.running.is_empty() {
                return;
            }
        };
        // The tokens fed are copied out (a few per sequence), so the samplers can hold the
        // sequences while they read the pass's logits in place.
        let mut fed: Vec<u32> = Vec::new();
        let mut spans = Vec::with_capacity(self.running.len());
        for (s, &n) in self.running.iter().zip(&take) {
            if n > 0 {
                let logits = s.n_cached + n == s.tokens.len();
                let slot = s.slot.unwrap_or(usize::MAX);
                spans.push((slot, fed.len(), n, s.n_cached, logits));
                fed.extend_from_slice(&s.tokens[s.n_cached..s.n_cached + n]);
            }
        }
        let items: Vec<Item<'_>> = spans
            .iter()
            .map(|&(slot, at, n, n_past, logits)| Item {
                slot,
                tokens: &fed[at..at + n],
                n_past,
                logits,
            })
            .collect();
        let n_vocab = self.runner.n_vocab().max(1);
        let (tokenizer, n_ctx) = (&self.tokenizer, self.opts.n_ctx_per_seq);
        let (running, counters) = (&mut self.running, &mut self.counters);
        let result = self.runner.forward(&items, |rows| {
            let t_sample = std::time::Instant::now();
            let mut rows = rows.chunks_exact(n_vocab);
            let mut jobs = Vec::new();
            for (i, s) in running.iter_mut().enumerate() {
                let n = take[i];
                if n == 0 {
                    continue;
                }
                if s.n_generated == 0 && s.n_cached < s.req.prompt.len() {
                    counters.prompt_tokens += n.min(s.req.prompt.len() - s.n_cached) as u64;
                }
                let wants = s.n_cached + n == s.tokens.len();
                s.n_cached += n;
                if wants {
                    if let Some(l) = rows.next() {
                        jobs.push((i, s, l));
                    }
                }
            }
            // Each sequence samples with its own sampler and streams to its own sink, so the
            // sequences of a large step sample in parallel; a small one stays on this thread,
            // which is no pool worker: handing rows to the pool and waiting costs more than a
            // few rows of sampling (one pass over each, see `Sampler::sample`).
            let one = |(i, s, l): (usize, &mut Seq, &[f32])| {
                let before = s.n_generated;
                let reason = sample_one(s, tokenizer, l, n_ctx);
                (i, s.n_generated - before, reason)
            };
            let sampled: Vec<(usize, usize, Option<FinishReason>)> =
                if jobs.len() * n_vocab >= PARALLEL_SAMPLING_ENTRIES {
                    jobs.into_par_iter().map(one).collect()
                } else {
                    jobs.into_iter().map(one).collect()
                };
            (sampled, t_sample)
        });
        drop(items);
        self.counters.steps += 1;
        let (sampled, t_sample) = match result {
            Ok(r) => r,
            Err(e) => {
                // A failed pass fails the requests in it; the engine goes on.
                let msg = e.to_string();
                tracing::error!("forward pass failed: {msg}");
                let mut failed = Vec::new();
                for (s, &n) in std::mem::take(&mut self.running).into_iter().zip(&take) {
                    if n > 0 {
                        failed.push(s);
                    } else {
                        self.running.push(s);
                    }
                }
                let mut first = Some(e);
                for mut s in failed {
                    if let Some(slot) = s.slot.take() {
                        self.runner.release(slot);
                    }
                    let err = first
                        .take()
                        .unwrap_or_else(|| ModelError::Device(msg.clone()));
                    let _ = (s.sink)(Event::Error(err));
                }
                return;
            }
        };
        let mut done = Vec::new();
        for (i, generated, reason) in sampled {
            self.counters.generated_tokens += generated as u64;
            if let Some(reason) = reason {
                done.push((i, reason));
            }
        }
        for &(i, reason) in done.iter().rev() {
            let s = self.running.remove(i);
            self.end(s, reason);
        }
        self.counters.sample_us += t_sample.elapsed().as_micros() as u64;
    }

    fn publish(&mut self) {
        let c = &mut self.counters;
        c.running = self.running.len();
        c.waiting = self.waiting.len();
        let (used, total) = self.runner.blocks();
        c.kv_blocks_used = used;
        c.kv_blocks_total = total;
        c.kv_blocks_free = total - used;
        c.swap_bytes = self.runner.swap_used();
        let t = self.runner.times();
        (c.build_us, c.run_us, c.output_us) = (t.build_us, t.run_us, t.output_us);
        (c.replayed_steps, c.padded_steps) = self.runner.reuse_counts();
        if let Ok(mut s) = self.stats.lock() {
            *s = *c;
        }
    }
}

/// Samples the next token of `s` from its last logits and emits it; `Some` when the request
/// ends. Follows [`crate::generate::generate`] step by step.
fn sample_one(s: &mut Seq, tok: &Tokenizer, logits: &[f32], n_ctx: usize) -> Option<FinishReason> {
    if s.n_generated >= s.req.max_tokens {
        return Some(FinishReason::Length);
    }
    // Only a constraint needs a copy of the row to mask.
    let masked;
    let logits = match s.req.constraint.as_mut() {
        Some(c) => {
            let mut l = logits.to_vec();
            c.mask(&mut l);
            masked = l;
            &masked[..]
        }
        None => logits,
    };
    let id = s.sampler.sample(logits);
    if s.req.stop_tokens.contains(&id) {
        return Some(FinishReason::Stop);
    }
    let logprob = s.req.logprobs.map(|n| logprob_of(logits, id, n));
    s.sampler.accept(id);
    s.tokens.push(id);
    s.n_generated += 1;
    let text = s.stream.push(&tok.token_to_piece_ext(id, 0, false));
    let complete = s.req.constraint.as_mut().is_some_and(|c| !c.accept(id));
    s.send(Event::Token { id, text, logprob });
    if s.stream.stopped() || complete {
        return Some(FinishReason::Stop);
    }
    if s.n_generated == s.req.max_tokens || s.tokens.len() >= n_ctx {
        return Some(FinishReason::Length);
    }
    None
}

/// Log-softmax of `logits` at `id` and the `n` best entries.
fn logprob_of(logits: &[f32], id: u32, n: usize) -> TokenLogprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| ((l - max) as f64).exp())
        .sum();
    let lse = max as f64 + sum.ln();
    let lp = |l: f32| (l as f64 - lse) as f32;
    // The best `n` in one pass over the row (no index vector of the whole vocabulary).
    let mut top = Vec::new();
    crate::sampling::top_n(logits, n, &mut top);
    for t in &mut top {
        t.1 = lp(t.1);
    }
    TokenLogprob {
        logprob: lp(logits
            .get(id as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY)),
        top,
    }
}
