//! Token sampling: repetition penalties, top-k, top-p, min-p, temperature and seeded draws.
//!
//! The chain follows llama.cpp's default order (penalties, top-k, top-p, min-p, temperature,
//! draw) so that the same settings mean the same thing in both tools. A temperature of zero or
//! below is greedy decoding (penalties still apply). The generator is a seeded xoshiro256**, so a
//! given seed always gives the same text for the same model and prompt.

use std::collections::HashMap;
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

/// A stateful sampler: the settings, the random generator and the recent-token window.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
    recent: VecDeque<u32>,
    candidates: Vec<(u32, f32)>,
}

impl Sampler {
    /// A sampler with its generator seeded from `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = Rng::new(cfg.seed);
        Self {
            cfg,
            rng,
            recent: VecDeque::new(),
            candidates: Vec::new(),
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
    /// NaN logits are treated as impossible tokens. An empty row returns token 0.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        let penalties = self.penalty_map();
        let greedy = self.cfg.temperature <= 0.0;
        if greedy {
            return argmax_with(logits, |i, l| penalize(&self.cfg, &penalties, i, l));
        }
        let cands = &mut self.candidates;
        cands.clear();
        cands.extend(logits.iter().enumerate().filter_map(|(i, &l)| {
            let l = penalize(&self.cfg, &penalties, i as u32, l);
            (!l.is_nan() && l != f32::NEG_INFINITY).then_some((i as u32, l))
        }));
        if cands.is_empty() {
            return 0;
        }
        let by_logit_desc = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1);
        // top-k: partial selection keeps this cheap on 256k-entry vocabularies.
        if self.cfg.top_k > 0 && self.cfg.top_k < cands.len() {
            cands.select_nth_unstable_by(self.cfg.top_k - 1, by_logit_desc);
            cands.truncate(self.cfg.top_k);
        }
        cands.sort_unstable_by(by_logit_desc);
        // top-p on temperature-1 probabilities, as llama.cpp does.
        if self.cfg.top_p < 1.0 {
            let probs = softmax_sorted(cands, 1.0);
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
            // p_i / p_max = exp(l_i - l_max): compare in log space, no softmax needed.
            let max = cands[0].1;
            let floor = max + self.cfg.min_p.ln();
            let keep = cands.iter().take_while(|c| c.1 >= floor).count();
            cands.truncate(keep.max(1));
        }
        let probs = softmax_sorted(cands, self.cfg.temperature);
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

    fn penalty_map(&self) -> HashMap<u32, u32> {
        let mut counts = HashMap::new();
        if self.cfg.penalties_active() {
            for &t in &self.recent {
                *counts.entry(t).or_insert(0u32) += 1;
            }
        }
        counts
    }
}

fn penalize(cfg: &SamplerConfig, counts: &HashMap<u32, u32>, token: u32, logit: f32) -> f32 {
    let Some(&n) = counts.get(&token) else {
        return logit;
    };
    let mut l = if logit > 0.0 {
        logit / cfg.repeat_penalty
    } else {
        logit * cfg.repeat_penalty
    };
    l -= n as f32 * cfg.frequency_penalty + cfg.presence_penalty;
    l
}

fn argmax_with(logits: &[f32], f: impl Fn(u32, f32) -> f32) -> u32 {
    let mut best = 0u32;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &l) in logits.iter().enumerate() {
        let v = f(i as u32, l);
        if v > best_v {
            best_v = v;
            best = i as u32;
        }
    }
    best
}

/// Index of the largest value (first one on ties); NaNs never win.
pub fn argmax(logits: &[f32]) -> u32 {
    argmax_with(logits, |_, l| l)
}

/// Probabilities of candidates sorted by descending logit, at temperature `temp`.
fn softmax_sorted(cands: &[(u32, f32)], temp: f32) -> Vec<f64> {
    let max = f64::from(cands[0].1);
    let t = f64::from(temp);
    let mut probs: Vec<f64> = cands
        .iter()
        .map(|c| ((f64::from(c.1) - max) / t).exp())
        .collect();
    let sum: f64 = probs.iter().sum();
    for p in &mut probs {
        *p /= sum;
    }
    probs
}

#[cfg(test)]
mod tests {
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
