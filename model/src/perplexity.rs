//! Perplexity over a token sequence with llama.cpp's `llama-perplexity` method: the text is cut
//! into non-overlapping windows of `n_ctx` tokens, each evaluated from an empty context (its first
//! token replaced by BOS when the model adds one), and only the second half of each window is
//! scored, so every scored token sees at least `n_ctx / 2` tokens of context.

use crate::arch::LogitsMode;
use crate::error::ModelError;
use crate::session::Session;

/// Perplexity settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PplOptions {
    /// Window length.
    pub n_ctx: usize,
    /// Stop after this many windows.
    pub max_chunks: Option<usize>,
    /// Token that replaces each window's first token (BOS), if the model uses one.
    pub bos: Option<u32>,
}

/// The result.
#[derive(Clone, Debug, PartialEq)]
pub struct PplResult {
    /// exp(mean negative log-likelihood).
    pub ppl: f64,
    /// Mean negative log-likelihood (nats per token).
    pub nll: f64,
    /// Windows evaluated.
    pub chunks: usize,
    /// Tokens scored.
    pub scored: usize,
}

/// -log softmax(logits)[target], computed stably in f64.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let l = logits
        .get(target as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY) as f64;
    -(l - max - sum.ln())
}

/// Computes perplexity; `progress(chunk, n_chunks, running_ppl)` is called after each window.
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    opts: &PplOptions,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<PplResult, ModelError> {
    let n_ctx = opts.n_ctx;
    if n_ctx < 4 || n_ctx > session.n_ctx() {
        return Err(ModelError::InvalidArgument(format!(
            "perplexity window {n_ctx} must be in 4..={}",
            session.n_ctx()
        )));
    }
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(m) = opts.max_chunks {
        n_chunks = n_chunks.min(m);
    }
    if n_chunks == 0 {
        return Err(ModelError::InvalidArgument(format!(
            "the text has {} tokens, fewer than one window of {n_ctx}",
            tokens.len()
        )));
    }
    let n_vocab = session.model().config().n_vocab;
    let first = n_ctx / 2;
    let mut total = 0.0f64;
    let mut scored = 0usize;
    for c in 0..n_chunks {
        let mut window = tokens[c * n_ctx..(c + 1) * n_ctx].to_vec();
        if let Some(bos) = opts.bos {
            window[0] = bos;
        }
        session.reset();
        let logits = session.eval(&window, LogitsMode::All)?;
        for j in first..n_ctx - 1 {
            // Targets come from the original text, not the BOS-patched window.
            let target = tokens[c * n_ctx + j + 1];
            total += nll(&logits[j * n_vocab..(j + 1) * n_vocab], target);
            scored += 1;
        }
        progress(c, n_chunks, (total / scored as f64).exp());
    }
    let mean = total / scored as f64;
    Ok(PplResult {
        ppl: mean.exp(),
        nll: mean,
        chunks: n_chunks,
        scored,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nll_of_uniform_is_log_n() {
        let l = vec![0.5f32; 8];
        assert!((nll(&l, 3) - (8f64).ln()).abs() < 1e-12);
    }

    #[test]
    fn nll_is_shift_invariant() {
        let a = [1.0f32, 2.0, 3.0];
        let b = [101.0f32, 102.0, 103.0];
        assert!((nll(&a, 2) - nll(&b, 2)).abs() < 1e-9);
    }
}
