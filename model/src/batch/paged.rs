//! What executes a step's batch: one forward pass over the tokens of every running sequence,
//! keys and values in a pool of fixed-size blocks (see [`super::kv`]), one block table per
//! sequence.

use std::sync::Arc;

use ggml_graph::CpuBackend;

use super::kv::{block_hash, BlockPool};
use super::{EngineOptions, StepPadding};
use crate::arch::{build_paged_forward, PagedBatch, PagedGraph, PagedKvSpec};
use crate::engine::{Engine, KvPool};
use crate::error::ModelError;
use crate::session::{DevicePlan, Model};

/// One sequence's share of a step.
#[derive(Debug)]
pub(super) struct Item<'a> {
    /// The sequence's slot.
    pub slot: usize,
    /// Tokens fed at positions `n_past..`.
    pub tokens: &'a [u32],
    /// Positions already cached.
    pub n_past: usize,
    /// Whether the last token's logits are wanted.
    pub logits: bool,
}

/// A pass's shape: tokens, sequences, outputs, hidden states or logits, rows copied.
type PassShape = (usize, usize, usize, bool, usize);

/// Pass shapes whose optimized graphs are kept: every decode bucket of up to 128 sequences
/// (13, see [`decode_bucket`]) and a few prompt-chunk shapes.
const GRAPH_CACHE: usize = 16;

/// The batch a decode step of `n` sequences is padded to (see [`StepPadding`]): the smallest
/// of 1, 2, 4, 6, 8, 12, 16, 24, 32, 48... (powers of two and, from 6 on, 1.5 times them) that
/// holds it, at most `max_seqs`; padding adds at most half the real rows.
fn decode_bucket(n: usize, max_seqs: usize) -> usize {
    let p = n.next_power_of_two();
    let b = if p >= 8 && p / 4 * 3 >= n {
        p / 4 * 3
    } else {
        p
    };
    b.min(max_seqs).max(n)
}

/// Blocks of the KV pool for these options at most: `kv_blocks`, else every sequence at its
/// full context (the GPU may take fewer, see [`KvPool`]).
pub(super) fn pool_blocks(o: &EngineOptions) -> usize {
    o.kv_blocks
        .unwrap_or_else(|| o.max_seqs * o.n_ctx_per_seq.div_ceil(o.block_size))
}

/// Memory the host can still give (Linux's `MemAvailable`); `None` where unknown.
fn host_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Refuses a pool whose host part (the KV rows of the layers on the CPU) exceeds `limit`.
fn check_host_kv(plan: &DevicePlan, limit: Option<u64>) -> Result<(), ModelError> {
    let s = plan.split;
    let host = plan.kv.bytes / s.n_layer.max(1) as u64 * (s.n_layer - s.gpu_layers()) as u64;
    match limit {
        Some(limit) if host > limit => Err(ModelError::KvPool {
            bytes: host,
            limit,
            positions: plan.kv.positions,
        }),
        _ => Ok(()),
    }
}

/// A running sequence's cache: its block table and what of its prompt is registered.
#[derive(Debug)]
struct SeqKv {
    table: Vec<u32>,
    prompt: Vec<u32>,
    /// Full prompt blocks registered in (or taken from) the prefix cache, and the last one's
    /// hash.
    n_hashed: usize,
    last_hash: u64,
    /// The prompt's last, partly filled block is registered too.
    tail_hashed: bool,
    /// A block taken from the prefix cache that the sequence will write into: its index in the
    /// table and the positions of the sequence it holds. Before the sequence writes past them,
    /// the block is copied to one of its own (copy-on-write).
    cow: Option<(usize, usize)>,
}

impl SeqKv {
    fn new(prompt: &[u32]) -> Self {
        Self {
            table: Vec::new(),
            prompt: prompt.to_vec(),
            n_hashed: 0,
            last_hash: 0,
            tail_hashed: false,
            cow: None,
        }
    }

    /// Blocks the sequence still has to take to cover `n` positions (a block to copy into
    /// included).
    fn blocks_to_take(&self, n: usize, bs: usize) -> usize {
        let copy = self.cow.is_some_and(|(_, held)| n > held);
        (n.div_ceil(bs) + usize::from(copy)).saturating_sub(self.table.len())
    }
}

/// The executor, the pool and the sequences' block tables by slot.
pub(super) struct Runner {
    model: Arc<Model>,
    engine: Engine,
    plan: DevicePlan,
    spec: PagedKvSpec,
    pool: BlockPool,
    prefix_cache: bool,
    /// Sum each sequence's products as it runs alone (see [`EngineOptions::exact`]).
    exact: bool,
    /// Optimized graphs of recent pass shapes (decode steps repeat one shape).
    graphs: Vec<(PassShape, PagedGraph)>,
    /// The prompt batch of a session alone (`generate` evaluates prompts in chunks of it).
    n_batch: usize,
    seqs: Vec<Option<SeqKv>>,
    /// Block copies `(from, to, slot)` the next pass makes before it writes.
    copies: Vec<(u32, u32, usize)>,
    /// Host time of the passes so far (see [`StepTimes`]).
    times: StepTimes,
    /// Host bytes the swapped-out caches hold (see [`SwappedKv`]).
    swap_used: u64,
    /// With decode steps padded ([`StepPadding`]): the block past the pool (the last of
    /// `spec`'s) that the padded rows write their keys and values to (no sequence owns or reads
    /// it).
    pad_block: Option<u32>,
    /// Sequences per step at most.
    max_seqs: usize,
    /// Decode steps padded so far.
    padded_steps: u64,
}

/// A preempted sequence's cache in host memory, taken by [`Runner::swap_out`] and written back
/// into fresh blocks by [`Runner::swap_in`]. Every swapped cache ends in `swap_in` or
/// [`Runner::discard_swapped`], which keep the runner's count of swapped bytes.
#[derive(Debug)]
pub(super) struct SwappedKv {
    prompt: Vec<u32>,
    /// Positions held.
    n_pos: usize,
    /// Per KV buffer (in [`Engine::kv_buffers`] order): the rows of the sequence's blocks, in
    /// block-table order.
    rows: Vec<Vec<u8>>,
}

impl SwappedKv {
    fn bytes(&self) -> u64 {
        self.rows.iter().map(|r| r.len() as u64).sum()
    }
}

/// Runs of consecutive block ids in `blocks`: `(index of the run's first entry, first block,
/// length)`; a run's rows are contiguous in every KV buffer, so it moves in one copy.
fn block_runs(blocks: &[u32]) -> Vec<(usize, usize, usize)> {
    let mut runs: Vec<(usize, usize, usize)> = Vec::new();
    for (i, &b) in blocks.iter().enumerate() {
        match runs.last_mut() {
            Some((_, first, len)) if *first + *len == b as usize => *len += 1,
            _ => runs.push((i, b as usize, 1)),
        }
    }
    runs
}

/// Host time spent in the passes, in microseconds: building graphs for new shapes, uploading
/// inputs and launching, waiting for the outputs.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StepTimes {
    pub build_us: u64,
    pub run_us: u64,
    pub output_us: u64,
}

fn micros(t: std::time::Instant) -> u64 {
    t.elapsed().as_micros() as u64
}

/// Where position `p` of a prompt of `plen` tokens sits when a session alone evaluates the
/// prompt in chunks of `n_batch`: `(chunk length, index in the chunk)`; `(1, 0)` past the
/// prompt (generated tokens are evaluated one at a time).
fn chunk_place(p: usize, plen: usize, n_batch: usize) -> (usize, usize) {
    if p >= plen {
        return (1, 0);
    }
    let start = p / n_batch * n_batch;
    ((plen - start).min(n_batch), p - start)
}

/// True when position `p` is summed in the batched orders by every weight type and by the
/// attention: the same bits for any prompt that has this position in such a place, so its
/// cache can be shared (see [`ggml_graph::quant::batched_order`]).
fn stable(p: usize, plen: usize, n_batch: usize) -> bool {
    let (c, i) = chunk_place(p, plen, n_batch);
    c >= 8 && i < c - c % 4
}

impl Runner {
    pub(super) fn new(model: Arc<Model>, o: &EngineOptions) -> Result<Self, ModelError> {
        // Padded decode steps (see `StepPadding`; whether they are padded is known once the
        // placement says where the layers run) write their dummy rows to one block past the
        // pool, counted in the placement with the pool's.
        let pad_room = usize::from(match o.step_padding {
            StepPadding::Auto => o.session.device != crate::placement::DeviceChoice::Cpu,
            StepPadding::On => true,
            StepPadding::Off => false,
        });
        let mut spec = PagedKvSpec {
            dtype: o.session.kv_type,
            n_blocks: pool_blocks(o) + pad_room,
            block_size: o.block_size,
            max_blocks: o.n_ctx_per_seq.div_ceil(o.block_size),
        };
        // Unless the caller fixed it, the pool holds at least one sequence at full length.
        let pool = o.kv_blocks.is_none().then_some(KvPool {
            block_size: o.block_size,
            min_blocks: spec.max_blocks.min(pool_blocks(o)) + pad_room,
            max_blocks: spec.n_blocks,
        });
        // The largest pass: a full step budget from every slot, logits for each.
        let worst = PagedBatch {
            n_tok: o.step_tokens,
            n_seqs: o.max_seqs,
            n_out: o.max_seqs,
            hidden: false,
            // Every sequence copying a shared block.
            n_copy: o.max_seqs * o.block_size,
        };
        let g = build_paged_forward(model.config(), model.weights(), &spec, worst)?;
        let backend = CpuBackend::new(o.session.n_threads)?;
        let (mut engine, plan) = crate::engine::place(
            &model,
            &o.session,
            &spec.as_cache(),
            pool,
            g.graph,
            backend,
            &mut |_, _| {},
        )?;
        let model = engine.take_split_model().map_or(model, Arc::new);
        let mut plan = plan;
        plan.kv.block_size = Some(o.block_size);
        spec.n_blocks = plan.kv.positions / o.block_size;
        check_host_kv(&plan, o.host_kv_limit.or_else(host_available))?;
        let n_pool = spec.n_blocks.saturating_sub(pad_room);
        // The plan tells the sequences' share (what requests are checked against).
        plan.kv.positions = n_pool * o.block_size;
        let pad = match o.step_padding {
            StepPadding::Auto => engine.on_gpu(),
            StepPadding::On => true,
            StepPadding::Off => false,
        };
        let pad_block = (pad && n_pool < spec.n_blocks).then_some(n_pool as u32);
        tracing::info!("batching engine: {plan}");
        Ok(Self {
            model,
            engine,
            plan,
            spec,
            pool: BlockPool::new(n_pool),
            prefix_cache: o.prefix_cache,
            n_batch: o.session.n_batch.min(o.n_ctx_per_seq).max(1),
            exact: o.exact,
            graphs: Vec::new(),
            // One slot more than requests use: embeddings run in the last.
            seqs: (0..=o.max_seqs).map(|_| None).collect(),
            copies: Vec::new(),
            times: StepTimes::default(),
            swap_used: 0,
            pad_block,
            max_seqs: o.max_seqs,
            padded_steps: 0,
        })
    }

    /// Runs so far that replayed captured GPU launches, and decode steps padded.
    pub(super) fn reuse_counts(&self) -> (u64, u64) {
        (self.engine.replays(), self.padded_steps)
    }

    /// Where the layers run.
    pub(super) fn plan(&self) -> &DevicePlan {
        &self.plan
    }

    /// The GPU's device-to-device copy bandwidth; `None` on the CPU.
    pub(super) fn gpu_copy_bandwidth(&self) -> Option<Result<f64, ModelError>> {
        self.engine.gpu_copy_bandwidth()
    }

    /// Host time of the passes so far.
    pub(super) fn times(&self) -> StepTimes {
        self.times
    }

    /// Blocks in use and in the pool.
    pub(super) fn blocks(&self) -> (usize, usize) {
        (self.pool.used(), self.pool.total())
    }

    /// True when a sequence of `n` positions fits the pool at all.
    pub(super) fn fits(&self, n: usize) -> bool {
        self.blocks_for(n) <= self.pool.total()
    }

    /// Blocks a sequence of `n` positions covers.
    fn blocks_for(&self, n: usize) -> usize {
        n.div_ceil(self.spec.block_size)
    }

    /// A free slot for a sequence of `tokens` (its first `prompt_len` the prompt) and how many
    /// of them are cached already (shared prefix blocks); `None` when no slot is free or the
    /// pool has no room for the rest of its tokens now.
    pub(super) fn acquire(&mut self, tokens: &[u32], prompt_len: usize) -> Option<(usize, usize)> {
        let n_slots = self.seqs.len() - 1;
        let slot = self.seqs[..n_slots].iter().position(Option::is_none)?;
        let bs = self.spec.block_size;
        let mut kv = SeqKv::new(&tokens[..prompt_len]);
        if self.prefix_cache {
            // Whole prompt blocks, always leaving a token to compute (its logits are needed).
            let nb = self.n_batch;
            let shareable = (prompt_len - 1) / bs;
            for i in 0..shareable {
                if !(i * bs..(i + 1) * bs).all(|p| stable(p, prompt_len, nb)) {
                    break;
                }
                let h = block_hash(kv.last_hash, &kv.prompt[i * bs..(i + 1) * bs]);
                let Some(b) = self.pool.lookup(h) else {
                    break;
                };
                kv.table.push(b);
                kv.n_hashed += 1;
                kv.last_hash = h;
            }
            // The block of the prompt's last token, cached with the same prompt tokens (a
            // repeated prompt, or one ending where a cached one did): shared up to the last
            // token, which is computed again into a copy of the block.
            let i = shareable;
            if kv.n_hashed == i && (i * bs..prompt_len).all(|p| stable(p, prompt_len, nb)) {
                let h = block_hash(kv.last_hash, &kv.prompt[i * bs..prompt_len]);
                if let Some(b) = self.pool.lookup(h) {
                    kv.table.push(b);
                    kv.cow = Some((i, prompt_len - 1));
                }
            }
        }
        let cached = match kv.cow {
            Some((_, held)) => held,
            None => kv.table.len() * bs,
        };
        if kv.blocks_to_take(tokens.len(), bs) > self.pool.available() {
            for b in kv.table {
                self.pool.release(b);
            }
            return None;
        }
        self.seqs[slot] = Some(kv);
        Some((slot, cached))
    }

    /// Gives a slot back; its blocks return to the pool (shared ones when their last user is
    /// gone).
    pub(super) fn release(&mut self, slot: usize) {
        if let Some(kv) = self.seqs.get_mut(slot).and_then(Option::take) {
            for b in kv.table {
                self.pool.release(b);
            }
            // A copy into a block given back would write a block someone else may take.
            self.copies.retain(|&(_, _, s)| s != slot);
        }
    }

    /// Grows `slot`'s block table to cover `n` positions; false (nothing taken) when the pool
    /// cannot.
    pub(super) fn reserve(&mut self, slot: usize, n: usize) -> bool {
        let bs = self.spec.block_size;
        let need = self.blocks_for(n);
        let Some(kv) = self.seqs.get_mut(slot).and_then(Option::as_mut) else {
            return false;
        };
        if kv.blocks_to_take(n, bs) > self.pool.available() {
            return false;
        }
        if let Some((i, held)) = kv.cow {
            if n > held {
                // Copy-on-write: the next pass copies the shared block into one of the
                // sequence's own before it writes there.
                let Some(own) = self.pool.alloc() else {
                    return false;
                };
                let shared = std::mem::replace(&mut kv.table[i], own);
                self.copies.push((shared, own, slot));
                self.pool.release(shared);
                kv.cow = None;
            }
        }
        while kv.table.len() < need {
            match self.pool.alloc() {
                Some(b) => kv.table.push(b),
                None => return false,
            }
        }
        true
    }

    /// Host bytes a swapped cache of `n` positions takes.
    pub(super) fn swap_bytes_for(&self, n: usize) -> u64 {
        let rows = self.blocks_for(n) * self.spec.block_size;
        self.engine
            .kv_buffers()
            .iter()
            .map(|(_, row)| (row * rows) as u64)
            .sum()
    }

    /// Host bytes the swapped-out caches hold now.
    pub(super) fn swap_used(&self) -> u64 {
        self.swap_used
    }

    /// Copies the cache of `slot`'s first `n` positions to host memory and gives the slot
    /// back (also when a copy fails).
    pub(super) fn swap_out(&mut self, slot: usize, n: usize) -> Result<SwappedKv, ModelError> {
        let r = self.read_blocks(slot, n);
        self.release(slot);
        let swapped = r?;
        self.swap_used += swapped.bytes();
        Ok(swapped)
    }

    fn read_blocks(&self, slot: usize, n: usize) -> Result<SwappedKv, ModelError> {
        let kv = self
            .seqs
            .get(slot)
            .and_then(Option::as_ref)
            .ok_or_else(|| ModelError::InvalidArgument(format!("no sequence in slot {slot}")))?;
        let nb = self.blocks_for(n);
        if nb > kv.table.len() {
            return Err(ModelError::ContextFull {
                needed: n,
                n_ctx: kv.table.len() * self.spec.block_size,
            });
        }
        // A block whose copy-on-write has not run yet still holds nothing: its rows are in
        // the shared block the copy reads.
        let src: Vec<u32> = kv.table[..nb]
            .iter()
            .map(|&b| {
                self.copies
                    .iter()
                    .find(|&&(_, to, s)| s == slot && to == b)
                    .map_or(b, |&(from, _, _)| from)
            })
            .collect();
        let bs = self.spec.block_size;
        let runs = block_runs(&src);
        let mut rows = Vec::new();
        for (name, row) in self.engine.kv_buffers() {
            let block = row * bs;
            let mut data = vec![0u8; nb * block];
            for &(i, first, len) in &runs {
                self.engine.read_kv(
                    &name,
                    first * block,
                    &mut data[i * block..(i + len) * block],
                )?;
            }
            rows.push(data);
        }
        Ok(SwappedKv {
            prompt: kv.prompt.clone(),
            n_pos: n,
            rows,
        })
    }

    /// A free slot with `swapped` written back into blocks of its own, room left for
    /// `n_tokens` positions in all; `None` when no slot is free or the pool has no room now
    /// (the cache stays swapped). After `Some`, the cache is no longer needed: give it to
    /// [`Runner::discard_swapped`] (on an error the sequence recomputes).
    pub(super) fn swap_in(
        &mut self,
        swapped: &SwappedKv,
        n_tokens: usize,
    ) -> Option<Result<usize, ModelError>> {
        let n_slots = self.seqs.len() - 1;
        let slot = self.seqs[..n_slots].iter().position(Option::is_none)?;
        let nb = self.blocks_for(swapped.n_pos);
        if self.blocks_for(n_tokens.max(swapped.n_pos)) > self.pool.available() {
            return None;
        }
        let mut kv = SeqKv::new(&swapped.prompt);
        for _ in 0..nb {
            // Cannot fail: the room was checked.
            kv.table.extend(self.pool.alloc());
        }
        let table = kv.table.clone();
        self.seqs[slot] = Some(kv);
        let r = self.write_blocks(&table, swapped);
        if let Err(e) = r {
            self.release(slot);
            return Some(Err(e));
        }
        Some(Ok(slot))
    }

    fn write_blocks(&self, table: &[u32], swapped: &SwappedKv) -> Result<(), ModelError> {
        let bufs = self.engine.kv_buffers();
        if table.len() != self.blocks_for(swapped.n_pos) || bufs.len() != swapped.rows.len() {
            return Err(ModelError::Device(format!(
                "a swapped cache of {} buffers and {} positions does not fit {} buffers and {} \
                 blocks",
                swapped.rows.len(),
                swapped.n_pos,
                bufs.len(),
                table.len()
            )));
        }
        let bs = self.spec.block_size;
        let runs = block_runs(table);
        for ((name, row), data) in bufs.iter().zip(&swapped.rows) {
            let block = row * bs;
            for &(i, first, len) in &runs {
                self.engine
                    .write_kv(name, first * block, &data[i * block..(i + len) * block])?;
            }
        }
        Ok(())
    }

    /// Forgets a swapped cache (resumed, or its request ended while swapped out).
    pub(super) fn discard_swapped(&mut self, swapped: SwappedKv) {
        self.swap_used = self.swap_used.saturating_sub(swapped.bytes());
    }

    /// Runs every item in one forward pass and hands `f` the last-token logits of the items
    /// that ask for them (`[n_vocab]` rows, flat, in item order) where the executor holds them:
    /// a large batch's logits are tens of megabytes, read once by the samplers rather than
    /// copied first. Every item's slot must have blocks for its tokens ([`Runner::reserve`]).
    pub(super) fn forward<R>(
        &mut self,
        items: &[Item<'_>],
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, ModelError> {
        self.pass(items, false, f)
    }

    /// Entries of a logits row.
    pub(super) fn n_vocab(&self) -> usize {
        self.model.config().n_vocab
    }

    /// The normalized last hidden state of every token of `tokens` (a sequence of its own,
    /// `[n_embd]` per token, in order), run in the slot kept for it; its blocks are freed after.
    /// `None` when the pool has no room for it now.
    pub(super) fn hidden_states(&mut self, tokens: &[u32]) -> Option<Result<Vec<f32>, ModelError>> {
        let slot = self.seqs.len() - 1;
        if self.seqs[slot].is_some() || self.blocks_for(tokens.len()) > self.pool.available() {
            return None;
        }
        self.seqs[slot] = Some(SeqKv::new(tokens));
        let r = if self.reserve(slot, tokens.len()) {
            let item = Item {
                slot,
                tokens,
                n_past: 0,
                logits: true,
            };
            self.pass(std::slice::from_ref(&item), true, <[f32]>::to_vec)
        } else {
            Err(ModelError::InvalidArgument(
                "no KV room for the embedding".into(),
            ))
        };
        self.release(slot);
        Some(r)
    }

    /// [`Runner::forward`]; with `hidden`, every token's normalized hidden state (all items'
    /// rows, flat) instead of logits.
    fn pass<R>(
        &mut self,
        items: &[Item<'_>],
        hidden: bool,
        f: impl FnOnce(&[f32]) -> R,
    ) -> Result<R, ModelError> {
        let bs = self.spec.block_size;
        let mb = self.spec.max_blocks;
        let n_tok: usize = items.iter().map(|it| it.tokens.len()).sum();
        let n_out = items.iter().filter(|it| it.logits).count();
        let mut ids = Vec::with_capacity(n_tok);
        let mut pos = Vec::with_capacity(n_tok);
        let mut slots = Vec::with_capacity(n_tok);
        let mut seq = Vec::with_capacity(2 * n_tok);
        let mut tables = vec![0i32; mb * items.len()];
        let mut out_rows = Vec::with_capacity(n_out);
        let mut layout = Vec::with_capacity(n_tok);
        for (col, it) in items.iter().enumerate() {
            let kv = self
                .seqs
                .get(it.slot)
                .and_then(Option::as_ref)
                .ok_or_else(|| {
                    ModelError::InvalidArgument(format!("no sequence in slot {}", it.slot))
                })?;
            let end = it.n_past + it.tokens.len();
            if kv.table.len() * bs < end || kv.table.len() > mb {
                return Err(ModelError::ContextFull {
                    needed: end,
                    n_ctx: kv.table.len() * bs,
                });
            }
            for (i, &b) in kv.table.iter().enumerate() {
                tables[col * mb + i] = b as i32;
            }
            let plen = kv.prompt.len();
            for (i, &t) in it.tokens.iter().enumerate() {
                let p = it.n_past + i;
                ids.push(t as i32);
                pos.push(p as i32);
                slots.push((kv.table[p / bs] as usize * bs + p % bs) as i32);
                // Each token is summed as in the pass that evaluates it when its sequence runs
                // alone: its prompt chunk, or a one-token decode step (also when recomputed).
                let (c, ci) = chunk_place(p, plen, self.n_batch);
                layout.push((c as u32, ci as u32));
                seq.push(col as i32);
                seq.push((c == 1) as i32);
            }
            if hidden {
                out_rows.extend((ids.len() - it.tokens.len()..ids.len()).map(|r| r as i32));
            } else if it.logits {
                out_rows.push((ids.len() - 1) as i32);
            }
        }
        let copies = std::mem::take(&mut self.copies);
        // A decode step (one token and its logits from every item, nothing copied) is padded
        // to its bucket: dummy tokens at position 0 of columns whose tables hold only the
        // padding block, which they write and read alone.
        let n_real_out = out_rows.len();
        let mut n_tok = n_tok;
        let mut n_cols = items.len();
        if let Some(pb) = self.pad_block {
            let decode = !hidden
                && copies.is_empty()
                && items.iter().all(|it| it.tokens.len() == 1 && it.logits);
            let bucket = decode_bucket(items.len(), self.max_seqs);
            if decode && bucket > items.len() {
                for col in items.len()..bucket {
                    ids.push(0);
                    pos.push(0);
                    slots.push((pb as usize * bs) as i32);
                    layout.push((1, 0));
                    seq.push(col as i32);
                    seq.push(1);
                    out_rows.push(col as i32);
                }
                tables.resize(mb * bucket, pb as i32);
                n_tok = bucket;
                n_cols = bucket;
                self.padded_steps += 1;
            }
        }
        let n_out = out_rows.len().max(1);
        if out_rows.is_empty() {
            // The graph always ends in logits; one row is computed and dropped.
            out_rows.push((n_tok - 1) as i32);
        }
        let (mut copy_src, mut copy_dst) = (Vec::new(), Vec::new());
        for &(from, to, _) in &copies {
            for r in 0..bs {
                copy_src.push((from as usize * bs + r) as i32);
                copy_dst.push((to as usize * bs + r) as i32);
            }
        }
        let batch = PagedBatch {
            n_tok,
            n_seqs: n_cols,
            n_out,
            hidden,
            n_copy: copy_src.len(),
        };
        let key = (batch.n_tok, batch.n_seqs, batch.n_out, hidden, batch.n_copy);
        let t_build = std::time::Instant::now();
        let gi = match self.graphs.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let mut g = build_paged_forward(
                    self.model.config(),
                    self.model.weights(),
                    &self.spec,
                    batch,
                )?;
                self.engine.optimize(&mut g.graph);
                if self.graphs.len() == GRAPH_CACHE {
                    self.graphs.remove(0);
                }
                self.graphs.push((key, g));
                self.graphs.len() - 1
            }
        };
        self.times.build_us += micros(t_build);
        let t_run = std::time::Instant::now();
        let g = &self.graphs[gi].1;
        let cfg = self.model.config();
        let bytes = |v: &[i32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
        let (ids_b, pos_b, slots_b, seq_b, tables_b, rows_b) = (
            bytes(&ids),
            bytes(&pos),
            bytes(&slots),
            bytes(&seq),
            bytes(&tables),
            bytes(&out_rows),
        );
        self.engine.set_column_layout(self.exact.then_some(layout));
        // Equal shapes are equal graphs: the GPU scheduler reuses the schedule and plan.
        let run_key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::hash::DefaultHasher::new();
            ("paged", key).hash(&mut h);
            h.finish()
        };
        let (src_b, dst_b) = (bytes(&copy_src), bytes(&copy_dst));
        let mut inputs: Vec<(ggml_graph::TensorId, &[u8])> = vec![
            (g.tokens, &ids_b),
            (g.pos, &pos_b),
            (g.slots, &slots_b),
            (g.seq, &seq_b),
            (g.tables, &tables_b),
            (g.out_rows, &rows_b),
        ];
        if let Some((src, dst)) = g.copy {
            inputs.push((src, &src_b));
            inputs.push((dst, &dst_b));
        }
        let spec = self.spec;
        // A tensor split's other ranks build the same pass from their models.
        let rank_graph =
            |m: &Model| Ok(build_paged_forward(m.config(), m.weights(), &spec, batch)?.graph);
        self.engine
            .run(Some(run_key), &g.graph, &inputs, &rank_graph)?;
        self.times.run_us += micros(t_run);
        let t_out = std::time::Instant::now();
        // The padded rows' logits stay unread.
        let n_vals = if hidden {
            usize::MAX
        } else {
            n_real_out * cfg.n_vocab
        };
        let times = &mut self.times;
        let r = self.engine.with_output_f32(g.logits, |l| {
            times.output_us += micros(t_out);
            f(&l[..n_vals.min(l.len())])
        })?;
        // An embedding's blocks are freed right after; they join no prefix cache.
        if !hidden {
            for it in items {
                self.register_prompt_blocks(it.slot, it.n_past + it.tokens.len());
            }
        }
        Ok(r)
    }

    /// Registers the slot's full prompt blocks computed so far in the prefix cache.
    fn register_prompt_blocks(&mut self, slot: usize, n_cached: usize) {
        if !self.prefix_cache {
            return;
        }
        let bs = self.spec.block_size;
        let Some(kv) = self.seqs.get_mut(slot).and_then(Option::as_mut) else {
            return;
        };
        let plen = kv.prompt.len();
        let full = n_cached.min(plen) / bs;
        while kv.n_hashed < full {
            let i = kv.n_hashed;
            if !(i * bs..(i + 1) * bs).all(|p| stable(p, plen, self.n_batch)) {
                return;
            }
            let h = block_hash(kv.last_hash, &kv.prompt[i * bs..(i + 1) * bs]);
            self.pool.register(kv.table[i], h);
            kv.last_hash = h;
            kv.n_hashed += 1;
        }
        // The partly filled last prompt block, once the whole prompt is computed: a later
        // request with this prompt shares it (copy-on-write, see `acquire`).
        let i = plen / bs;
        if n_cached >= plen
            && plen % bs != 0
            && !kv.tail_hashed
            && kv.n_hashed == i
            && kv.cow.is_none()
            && (i * bs..plen).all(|p| stable(p, plen, self.n_batch))
        {
            let h = block_hash(kv.last_hash, &kv.prompt[i * bs..plen]);
            self.pool.register(kv.table[i], h);
            kv.tail_hashed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::decode_bucket;

    #[test]
    fn decode_buckets_are_powers_of_two_and_one_and_a_half_times_them() {
        let got: Vec<usize> = (1..=20).map(|n| decode_bucket(n, 128)).collect();
        let want = [
            1, 2, 4, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16, 16, 16, 16, 24, 24, 24, 24,
        ];
        assert_eq!(got, want);
        // 13 shapes serve 128 sequences; none pads by more than half the real rows.
        let mut all: Vec<usize> = (1..=128).map(|n| decode_bucket(n, 128)).collect();
        all.dedup();
        assert_eq!(all, [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]);
        assert!((1..=128).all(|n| decode_bucket(n, 128) * 2 <= n * 3));
        // The cap: never above max_seqs, never below the batch.
        assert_eq!(decode_bucket(5, 5), 5);
        assert_eq!(decode_bucket(33, 40), 40);
    }
}
