//! Token sampling: repetition penalties, top-k, top-p, min-p, temperature and seeded draws.
//!
//! The chain follows llama.cpp's default order (penalties, top-k, top-p, min-p, temperature,
//! draw) so that the same settings mean the same thing in both tools. A temperature of zero or
//! below is greedy decoding (penalties still apply). The generator is a seeded xoshiro256**, so a
//! given seed always gives the same text for the same model and prompt.

use std::collections::VecDeque;

/// Sampling settings; [`SamplerConfig::default`] matches llama.cpp's defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep the `top_k` most likely tokens; 0 disables the filter.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability mass reaches `top_p`; 1.0 disables it.
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the best token's; 0 disables it.
    pub min_p: f32,
    /// Multiplicative penalty for tokens seen in the last `repeat_last_n` tokens; 1.0 disables it.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at (0 disables all penalties).
    pub repeat_last_n: usize,
    /// Subtracted from a logit once per occurrence in the window.
    pub frequency_penalty: f32,
    /// Subtracted from a logit once if the token occurs in the window.
    pub presence_penalty: f32,
    /// Seed of the random generator.
    pub seed: u64,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0x5eed,
        }
    }
}

impl SamplerConfig {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    fn penalties_active(&self) -> bool {
        self.repeat_last_n > 0
            && (self.repeat_penalty != 1.0
                || self.frequency_penalty != 0.0
                || self.presence_penalty != 0.0)
    }
}

/// xoshiro256** seeded through splitmix64: small, fast and stable across platforms and versions.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// A generator whose whole output is determined by `seed`.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A uniform draw in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Entries per block of a row scan: a block whose largest entry cannot change the result is
/// passed over after one vectorized maximum.
const BLOCK: usize = 128;

/// A stateful sampler: the settings, the random generator and the recent-token window.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    recent: VecDeque<u32>,
    /// The distinct tokens of the penalty window, ascending, with their penalized logits in the
    /// row being sampled.
    penalized: Vec<(u32, f32)>,
    // Scratch reused by every call, so a warm sampler allocates nothing.
    window: Vec<u32>,
    candidates: Vec<(u32, f32)>,
    probs: Vec<f64>,
    maxima: Vec<f32>,
}

impl Sampler {
    /// A sampler with its generator seeded from `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = Rng::new(cfg.seed);
        Self {
            cfg,
            rng,
            recent: VecDeque::new(),
            penalized: Vec::new(),
            window: Vec::new(),
            candidates: Vec::new(),
            probs: Vec::new(),
            maxima: Vec::new(),
        }
    }

    /// The settings this sampler uses.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Records a token (prompt or generated) for the penalty window.
    pub fn accept(&mut self, token: u32) {
        if self.cfg.repeat_last_n == 0 {
            return;
        }
        if self.recent.len() == self.cfg.repeat_last_n {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Forgets the penalty window (a new conversation); the generator keeps its state.
    pub fn reset_history(&mut self) {
        self.recent.clear();
    }

    /// Picks the next token from one row of logits (one value per vocabulary entry).
    ///
    /// NaN logits are treated as impossible tokens. An empty row returns token 0. Candidates of
    /// equal logit rank by token id. One or two passes over the row, mostly a vectorized maximum
    /// per block, then work in proportion to `top_k` and the penalty window: only `top_k = 0`
    /// without min-p (or with top-p) sorts the whole vocabulary.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        self.penalize_window(logits);
        let Self {
            cfg,
            rng,
            penalized,
            candidates: cands,
            probs,
            maxima,
            ..
        } = self;
        if cfg.temperature <= 0.0 {
            return argmax_in(logits, penalized).0;
        }
        cands.clear();
        if cfg.top_k > 0 {
            let mut top = TopK::new(cfg.top_k, cands);
            top.scan(logits, penalized, maxima);
            top.finish();
        } else if cfg.top_p >= 1.0 && cfg.min_p > 0.0 {
            // min-p alone keeps what lies within ln(min_p) of the best: only that is sorted.
            let (best, max) = argmax_in(logits, penalized);
            if max == f32::NEG_INFINITY {
                return 0;
            }
            let floor = max + cfg.min_p.ln();
            scan(logits, penalized, None, &mut AtLeast { floor, out: cands });
            if cands.is_empty() {
                cands.push((best, max));
            }
            cands.sort_unstable_by(by_rank);
        } else {
            scan(
                logits,
                penalized,
                None,
                &mut AtLeast {
                    floor: f32::NEG_INFINITY,
                    out: cands,
                },
            );
            cands.retain(|c| c.1 != f32::NEG_INFINITY);
            cands.sort_unstable_by(by_rank);
        }
        if cands.is_empty() {
            return 0;
        }
        // top-p on temperature-1 probabilities, as llama.cpp does.
        if cfg.top_p < 1.0 {
            softmax_sorted(cands, 1.0, probs);
            let mut mass = 0.0f64;
            let mut keep = cands.len();
            for (i, p) in probs.iter().enumerate() {
                mass += *p;
                if mass >= f64::from(cfg.top_p) {
                    keep = i + 1;
                    break;
                }
            }
            cands.truncate(keep.max(1));
        }
        if cfg.min_p > 0.0 {
            // p_i / p_max = exp(l_i - l_max): compare in log space, no softmax needed.
            let max = cands[0].1;
            let floor = max + cfg.min_p.ln();
            let keep = cands.iter().take_while(|c| c.1 >= floor).count();
            cands.truncate(keep.max(1));
        }
        softmax_sorted(cands, cfg.temperature, probs);
        let r = rng.next_f64();
        let mut acc = 0.0f64;
        for (c, p) in cands.iter().zip(probs.iter()) {
            acc += p;
            if r < acc {
                return c.0;
            }
        }
        cands[cands.len() - 1].0
    }

    /// Fills `penalized` with the window's distinct tokens and their penalized logits in `row`.
    fn penalize_window(&mut self, row: &[f32]) {
        self.penalized.clear();
        if !self.cfg.penalties_active() {
            return;
        }
        self.window.clear();
        self.window.extend(&self.recent);
        self.window.sort_unstable();
        for run in self.window.chunk_by(|a, b| a == b) {
            if let Some(&l) = row.get(run[0] as usize) {
                let l = penalize(&self.cfg, run.len() as u32, l);
                self.penalized.push((run[0], l));
            }
        }
    }
}

/// The logit of a token seen `n` times in the penalty window.
fn penalize(cfg: &SamplerConfig, n: u32, logit: f32) -> f32 {
    let mut l = if logit > 0.0 {
        logit / cfg.repeat_penalty
    } else {
        logit * cfg.repeat_penalty
    };
    l -= n as f32 * cfg.frequency_penalty + cfg.presence_penalty;
    l
}

/// Candidate order: higher logit first (`total_cmp`), then lower token id.
fn by_rank(a: &(u32, f32), b: &(u32, f32)) -> std::cmp::Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// What a row scan feeds (see [`scan`]).
trait Visit {
    /// Blocks whose entries all lie below this are passed over.
    fn bar(&self) -> f32;
    /// Entry `id` of value `v`; called in ascending id order.
    fn visit(&mut self, id: u32, v: f32);
}

/// Feeds `v` the entries of `row`, with the values of `penalized` (ascending, distinct ids
/// inside the row) in place of the row's, block by block: every entry of a block that holds
/// a penalized token or whose largest value (`maxima[block]` where given) reaches `v.bar()`,
/// in id order.
fn scan(row: &[f32], penalized: &[(u32, f32)], maxima: Option<&[f32]>, v: &mut impl Visit) {
    let mut p = 0;
    for (b, block) in row.chunks(BLOCK).enumerate() {
        let start = b * BLOCK;
        if penalized
            .get(p)
            .is_some_and(|&(id, _)| (id as usize) < start + block.len())
        {
            for (i, &x) in (start..).zip(block) {
                let x = match penalized.get(p) {
                    Some(&(id, l)) if id as usize == i => {
                        p += 1;
                        l
                    }
                    _ => x,
                };
                v.visit(i as u32, x);
            }
        } else if maxima.map_or_else(|| block_max(block), |m| m[b]) >= v.bar() {
            for (i, &x) in (start..).zip(block) {
                v.visit(i as u32, x);
            }
        }
    }
}

/// The largest value of `x`, NaNs ignored (`-inf` when there is none).
fn block_max(x: &[f32]) -> f32 {
    const LANES: usize = 16;
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut lanes = x.chunks_exact(LANES);
    for c in &mut lanes {
        for (a, &v) in acc.iter_mut().zip(c) {
            // A compare-select, not `f32::max`: one vector instruction, and NaN never wins.
            *a = if v > *a { v } else { *a };
        }
    }
    let mut m = f32::NEG_INFINITY;
    for &v in acc.iter().chain(lanes.remainder()) {
        if v > m {
            m = v;
        }
    }
    m
}

/// The first largest entry: its id and value (`(0, -inf)` where none beats `-inf`).
struct Argmax {
    best: u32,
    value: f32,
}

impl Visit for Argmax {
    fn bar(&self) -> f32 {
        self.value
    }

    fn visit(&mut self, id: u32, v: f32) {
        if v > self.value {
            self.value = v;
            self.best = id;
        }
    }
}

fn argmax_in(row: &[f32], penalized: &[(u32, f32)]) -> (u32, f32) {
    let mut a = Argmax {
        best: 0,
        value: f32::NEG_INFINITY,
    };
    scan(row, penalized, None, &mut a);
    (a.best, a.value)
}

/// The entries of value `floor` or more (NaN never is).
struct AtLeast<'a> {
    floor: f32,
    out: &'a mut Vec<(u32, f32)>,
}

impl Visit for AtLeast<'_> {
    fn bar(&self) -> f32 {
        self.floor
    }

    fn visit(&mut self, id: u32, v: f32) {
        if v >= self.floor {
            self.out.push((id, v));
        }
    }
}

/// The `k` best candidates ([`by_rank`]; NaN and `-inf` are none), streamed: the buffer holds
/// up to about `2k` and is cut back to the best `k` when full, whose last sets the bar an
/// entry must beat.
struct TopK<'a> {
    k: usize,
    /// `-inf` entries are candidates too (for log-probabilities rather than draws).
    with_neg_inf: bool,
    /// Length at which the buffer is cut back to `k`.
    cap: usize,
    /// The `k`-th best so far once the buffer was cut (`cut`); later ids lose ties with it.
    floor: f32,
    cut: bool,
    /// No entry below this is among the best `k` (see [`TopK::scan`]).
    least: f32,
    out: &'a mut Vec<(u32, f32)>,
}

impl<'a> TopK<'a> {
    fn new(k: usize, out: &'a mut Vec<(u32, f32)>) -> Self {
        Self {
            k,
            with_neg_inf: false,
            cut: false,
            cap: k.saturating_add(k.max(256)),
            floor: f32::NEG_INFINITY,
            least: f32::NEG_INFINITY,
            out,
        }
    }

    /// Feeds `row` (with `penalized` in place) in two passes: the blocks' maxima first, whose
    /// `k`-th largest bounds the `k`-th best entry from below (that many entries reach it), so
    /// that the second pass visits only the blocks that reach the bound; `maxima` is scratch.
    fn scan(&mut self, row: &[f32], penalized: &[(u32, f32)], maxima: &mut Vec<f32>) {
        let n_blocks = row.len().div_ceil(BLOCK);
        maxima.clear();
        maxima.extend(row.chunks(BLOCK).map(block_max));
        if n_blocks >= self.k {
            // A block with a penalized token vouches for nothing: its raw maximum may be gone.
            maxima.extend_from_within(..);
            for &(id, _) in penalized {
                maxima[n_blocks + id as usize / BLOCK] = f32::NEG_INFINITY;
            }
            let sel = &mut maxima[n_blocks..];
            let desc = |a: &f32, b: &f32| b.total_cmp(a);
            self.least = *sel.select_nth_unstable_by(self.k - 1, desc).1;
        }
        scan(row, penalized, Some(&maxima[..n_blocks]), self);
    }

    /// Leaves the best `k` in `out`, sorted by [`by_rank`].
    fn finish(self) {
        self.out.sort_unstable_by(by_rank);
        self.out.truncate(self.k);
    }
}

impl Visit for TopK<'_> {
    fn bar(&self) -> f32 {
        self.floor.max(self.least)
    }

    fn visit(&mut self, id: u32, v: f32) {
        let candidate = v > f32::NEG_INFINITY || (self.with_neg_inf && v == f32::NEG_INFINITY);
        if candidate && v >= self.least && (!self.cut || v.total_cmp(&self.floor).is_gt()) {
            self.out.push((id, v));
            if self.out.len() >= self.cap {
                self.out.select_nth_unstable_by(self.k - 1, by_rank);
                self.out.truncate(self.k);
                self.floor = self.out[self.k - 1].1;
                self.cut = true;
            }
        }
    }
}

/// The `n` largest non-NaN entries of `logits` (`-inf` included), largest first, ties by token
/// id, into `out`: two passes over the row (see [`TopK::scan`]), no copy of it.
pub(crate) fn top_n(logits: &[f32], n: usize, out: &mut Vec<(u32, f32)>) {
    out.clear();
    if n == 0 {
        return;
    }
    let mut top = TopK::new(n, out);
    top.with_neg_inf = true;
    top.scan(logits, &[], &mut Vec::new());
    top.finish();
}

/// Index of the largest value (first one on ties); NaNs never win.
pub fn argmax(logits: &[f32]) -> u32 {
    argmax_in(logits, &[]).0
}

/// Probabilities of candidates sorted by descending logit, at temperature `temp`, into `probs`.
fn softmax_sorted(cands: &[(u32, f32)], temp: f32, probs: &mut Vec<f64>) {
    let max = f64::from(cands[0].1);
    let t = f64::from(temp);
    probs.clear();
    probs.extend(cands.iter().map(|c| ((f64::from(c.1) - max) / t).exp()));
    let sum: f64 = probs.iter().sum();
    for p in probs.iter_mut() {
        *p /= sum;
    }
}

#[cfg(test)]
mod tests {
    use super::Rng;
    use super::*;
    use proptest::prelude::*;

    fn draw(cfg: SamplerConfig, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(cfg);
        (0..n).map(|_| s.sample(logits)).collect()
    }

    #[test]
    fn greedy_picks_argmax() {
        let logits = [0.1, 3.0, -1.0, 2.9];
        assert_eq!(draw(SamplerConfig::greedy(), &logits, 3), vec![1, 1, 1]);
    }

    #[test]
    fn nan_never_wins() {
        let logits = [f32::NAN, 1.0, f32::NAN];
        assert_eq!(argmax(&logits), 1);
        let cfg = SamplerConfig {
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            temperature: 1.0,
            ..SamplerConfig::default()
        };
        assert!(draw(cfg, &logits, 20).iter().all(|&t| t == 1));
    }

    #[test]
    fn same_seed_same_tokens_other_seed_differs() {
        let logits: Vec<f32> = (0..100).map(|i| (i % 7) as f32 * 0.3).collect();
        let cfg = SamplerConfig {
            temperature: 1.5,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..SamplerConfig::default()
        };
        let a = draw(cfg.clone(), &logits, 50);
        assert_eq!(a, draw(cfg.clone(), &logits, 50));
        let b = draw(SamplerConfig { seed: 43, ..cfg }, &logits, 50);
        assert_ne!(a, b);
    }

    #[test]
    fn repeat_penalty_changes_greedy_choice() {
        let logits = [2.0, 1.9, 0.0];
        let cfg = SamplerConfig {
            repeat_penalty: 1.5,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg);
        assert_eq!(s.sample(&logits), 0);
        s.accept(0);
        // 2.0 / 1.5 = 1.33 < 1.9
        assert_eq!(s.sample(&logits), 1);
    }

    #[test]
    fn presence_and_frequency_penalties_subtract() {
        let cfg = SamplerConfig {
            frequency_penalty: 0.5,
            presence_penalty: 0.25,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg);
        s.accept(0);
        s.accept(0);
        // token 0: 2.0 - 2*0.5 - 0.25 = 0.75 < 1.0
        assert_eq!(s.sample(&[2.0, 1.0]), 1);
    }

    #[test]
    fn penalty_window_forgets_old_tokens() {
        let cfg = SamplerConfig {
            repeat_penalty: 10.0,
            repeat_last_n: 2,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg);
        s.accept(0);
        s.accept(5);
        s.accept(6);
        assert_eq!(s.sample(&[2.0, 1.0]), 0);
    }

    #[test]
    fn min_p_cuts_unlikely_tokens() {
        // p(1)/p(0) = e^-5 < 0.1, so only token 0 survives.
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.1,
            ..SamplerConfig::default()
        };
        assert!(draw(cfg, &[5.0, 0.0, -1.0], 200).iter().all(|&t| t == 0));
    }

    #[test]
    fn high_temperature_reaches_several_tokens() {
        let cfg = SamplerConfig {
            temperature: 5.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        };
        let toks = draw(cfg, &[1.0, 0.9, 0.8, 0.7], 400);
        for t in 0..4 {
            assert!(toks.contains(&t), "token {t} never drawn");
        }
    }

    #[test]
    fn draws_follow_probabilities() {
        // Two tokens with p = 0.75 / 0.25.
        let l1 = (3.0f32).ln();
        let cfg = SamplerConfig {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 7,
            ..SamplerConfig::default()
        };
        let toks = draw(cfg, &[l1, 0.0], 20_000);
        let frac = toks.iter().filter(|&&t| t == 0).count() as f64 / toks.len() as f64;
        assert!((frac - 0.75).abs() < 0.02, "fraction {frac}");
    }

    /// The sampler as first written: every entry penalized through a map, the whole
    /// vocabulary copied, then selected and sorted. The streaming sampler must pick the same
    /// tokens wherever no two candidates tie.
    struct Reference {
        cfg: SamplerConfig,
        rng: Rng,
        recent: VecDeque<u32>,
    }

    impl Reference {
        fn new(cfg: SamplerConfig) -> Self {
            let rng = Rng::new(cfg.seed);
            Self {
                cfg,
                rng,
                recent: VecDeque::new(),
            }
        }

        fn accept(&mut self, token: u32) {
            if self.cfg.repeat_last_n == 0 {
                return;
            }
            if self.recent.len() == self.cfg.repeat_last_n {
                self.recent.pop_front();
            }
            self.recent.push_back(token);
        }

        fn sample(&mut self, logits: &[f32]) -> u32 {
            let mut counts = std::collections::HashMap::new();
            if self.cfg.penalties_active() {
                for &t in &self.recent {
                    *counts.entry(t).or_insert(0u32) += 1;
                }
            }
            let pen = |i: u32, l: f32| counts.get(&i).map_or(l, |&n| penalize(&self.cfg, n, l));
            if self.cfg.temperature <= 0.0 {
                let mut best = 0u32;
                let mut best_v = f32::NEG_INFINITY;
                for (i, &l) in logits.iter().enumerate() {
                    let v = pen(i as u32, l);
                    if v > best_v {
                        best_v = v;
                        best = i as u32;
                    }
                }
                return best;
            }
            let mut cands: Vec<(u32, f32)> = logits
                .iter()
                .enumerate()
                .filter_map(|(i, &l)| {
                    let l = pen(i as u32, l);
                    (!l.is_nan() && l != f32::NEG_INFINITY).then_some((i as u32, l))
                })
                .collect();
            if cands.is_empty() {
                return 0;
            }
            let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
            if self.cfg.top_k > 0 && self.cfg.top_k < cands.len() {
                cands.select_nth_unstable_by(self.cfg.top_k - 1, by_logit_desc);
                cands.truncate(self.cfg.top_k);
            }
            cands.sort_unstable_by(by_logit_desc);
            let mut probs = Vec::new();
            if self.cfg.top_p < 1.0 {
                softmax_sorted(&cands, 1.0, &mut probs);
                let mut mass = 0.0f64;
                let mut keep = cands.len();
                for (i, p) in probs.iter().enumerate() {
                    mass += *p;
                    if mass >= f64::from(self.cfg.top_p) {
                        keep = i + 1;
                        break;
                    }
                }
                cands.truncate(keep.max(1));
            }
            if self.cfg.min_p > 0.0 {
                let floor = cands[0].1 + self.cfg.min_p.ln();
                let keep = cands.iter().take_while(|c| c.1 >= floor).count();
                cands.truncate(keep.max(1));
            }
            softmax_sorted(&cands, self.cfg.temperature, &mut probs);
            let r = self.rng.next_f64();
            let mut acc = 0.0f64;
            for (c, p) in cands.iter().zip(&probs) {
                acc += p;
                if r < acc {
                    return c.0;
                }
            }
            cands[cands.len() - 1].0
        }
    }

    /// Rows of distinct random logits of several lengths (one block, several, a ragged end),
    /// some with NaN and `-inf` entries, whole NaN or `-inf` blocks, one `+inf`, or no
    /// candidate at all.
    fn test_rows() -> Vec<Vec<f32>> {
        let mut rng = Rng::new(99);
        let mut rand_row = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| (rng.next_f64() * 40.0 - 20.0) as f32)
                .collect()
        };
        let mut rows = vec![
            Vec::new(),
            rand_row(1),
            rand_row(3),
            rand_row(130),
            rand_row(1000),
            rand_row(5003),
        ];
        let mut holes = rand_row(3000);
        for i in (0..3000).step_by(7) {
            holes[i] = if i % 2 == 0 {
                f32::NAN
            } else {
                f32::NEG_INFINITY
            };
        }
        holes[256..384].fill(f32::NAN);
        holes[384..512].fill(f32::NEG_INFINITY);
        rows.push(holes);
        let mut inf = rand_row(700);
        inf[650] = f32::INFINITY;
        rows.push(inf);
        rows.push(vec![f32::NAN, f32::NEG_INFINITY, f32::NAN]);
        // Rising logits: every block beats the one before.
        rows.push((0..900).map(|i| i as f32 * 0.01 - 3.0).collect());
        rows
    }

    #[test]
    fn same_tokens_as_the_reference_sampler_for_every_setting() {
        let rows = test_rows();
        let mut n = 0;
        for temperature in [0.0, 0.3, 0.8, 1.5] {
            for top_k in [0, 1, 5, 40, 5000] {
                for top_p in [1.0, 0.9, 0.5] {
                    for min_p in [0.0, 0.05, 0.3, 2.0] {
                        for (repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty) in [
                            (64, 1.0, 0.0, 0.0),
                            (64, 1.3, 0.0, 0.0),
                            (8, 1.0, 0.4, 0.7),
                            (64, 1.1, 0.2, 0.1),
                            (0, 1.5, 0.5, 0.5),
                        ] {
                            n += 1;
                            let cfg = SamplerConfig {
                                temperature,
                                top_k,
                                top_p,
                                min_p,
                                repeat_penalty,
                                repeat_last_n,
                                frequency_penalty,
                                presence_penalty,
                                seed: n,
                            };
                            let mut new = Sampler::new(cfg.clone());
                            let mut old = Reference::new(cfg.clone());
                            // A history with repeats, tokens past some rows' ends included.
                            for i in 0..80u32 {
                                let t = (i * 37 + n as u32) % 1200;
                                new.accept(t);
                                old.accept(t);
                            }
                            for _ in 0..2 {
                                for (r, row) in rows.iter().enumerate() {
                                    let (a, b) = (new.sample(row), old.sample(row));
                                    assert_eq!(a, b, "row {r}, {cfg:?}");
                                    new.accept(a);
                                    old.accept(b);
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn top_n_is_the_head_of_a_full_sort() {
        for row in test_rows() {
            let mut all: Vec<(u32, f32)> = (0..row.len() as u32)
                .zip(row.iter().copied())
                .filter(|(_, l)| !l.is_nan())
                .collect();
            all.sort_by(by_rank);
            for n in [0, 1, 3, 40, 300, 10_000] {
                let mut got = vec![(7, 7.0)];
                top_n(&row, n, &mut got);
                assert_eq!(got, all[..n.min(all.len())], "n {n}, {} entries", row.len());
            }
        }
    }

    #[test]
    fn ties_rank_by_token_id() {
        let logits = [1.0, 2.0, 2.0, 2.0, 0.5];
        let cfg = SamplerConfig {
            temperature: 5.0,
            top_k: 2,
            top_p: 1.0,
            min_p: 0.0,
            ..SamplerConfig::default()
        };
        let toks = draw(cfg.clone(), &logits, 200);
        assert!(toks.iter().all(|&t| t == 1 || t == 2), "{toks:?}");
        assert!(toks.contains(&1) && toks.contains(&2));
        // Ties over many blocks: the first of them is the greedy pick.
        let mut row = vec![0.0f32; 1000];
        row[300..].fill(1.0);
        assert_eq!(argmax(&row), 300);
        let k3 = SamplerConfig { top_k: 3, ..cfg };
        let toks = draw(k3, &row, 300);
        assert!(toks.iter().all(|t| (300..303).contains(t)), "{toks:?}");
    }

    #[test]
    fn penalized_token_outside_its_block_maximum_still_wins() {
        // Token 5's raw logit is the lowest in its block, but a negative presence penalty
        // lifts it above every other entry of the row.
        let mut row: Vec<f32> = (0..600).map(|i| (i % 50) as f32 * 0.1).collect();
        row[5] = -1.0;
        let cfg = SamplerConfig {
            presence_penalty: -100.0,
            ..SamplerConfig::greedy()
        };
        let mut s = Sampler::new(cfg.clone());
        s.accept(5);
        assert_eq!(s.sample(&row), 5);
        // And the best of top-k, whose block bound leaves the penalized block out. Token 55
        // holds its block's raw maximum; a positive penalty must not let that bound stand.
        for (presence_penalty, want) in [(-100.0, 5), (100.0, 99)] {
            let mut row = row.clone();
            row[55] = 50.0;
            row[99] = 20.0;
            let mut s = Sampler::new(SamplerConfig {
                temperature: 1.0,
                top_k: 1,
                presence_penalty,
                ..cfg.clone()
            });
            s.accept(if presence_penalty < 0.0 { 5 } else { 55 });
            assert_eq!(s.sample(&row), want, "presence penalty {presence_penalty}");
        }
    }

    proptest! {
        #[test]
        fn sampled_token_is_inside_every_filter(
            logits in prop::collection::vec(-20.0f32..20.0, 1..300),
            top_k in 0usize..50,
            top_p in 0.05f32..1.0,
            min_p in 0.0f32..0.5,
            temp in 0.05f32..3.0,
            seed in any::<u64>(),
        ) {
            let cfg = SamplerConfig { temperature: temp, top_k, top_p, min_p, seed, ..SamplerConfig::default() };
            let mut s = Sampler::new(cfg);
            let tok = s.sample(&logits) as usize;
            prop_assert!(tok < logits.len());
            let l = logits[tok];
            // top-k: fewer than k tokens are strictly better.
            if top_k > 0 {
                prop_assert!(logits.iter().filter(|&&x| x > l).count() < top_k);
            }
            // min-p: relative probability at temperature 1 is at least min_p.
            let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            prop_assert!(((l - max) as f64).exp() >= f64::from(min_p) * 0.999);
            // top-p: the mass of strictly better tokens is below p.
            let z: f64 = logits.iter().map(|&x| f64::from(x - max).exp()).sum();
            let better: f64 = logits.iter().filter(|&&x| x > l).map(|&x| f64::from(x - max).exp() / z).sum();
            prop_assert!(better < f64::from(top_p) + 1e-6);
        }

        #[test]
        fn top_k_one_is_greedy(logits in prop::collection::vec(-10.0f32..10.0, 1..200), seed in any::<u64>()) {
            let cfg = SamplerConfig { temperature: 1.0, top_k: 1, seed, ..SamplerConfig::default() };
            let tok = Sampler::new(cfg).sample(&logits) as usize;
            let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            prop_assert_eq!(logits[tok], max);
        }
    }
}
