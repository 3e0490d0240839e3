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

/// -log softmax(logits)\[target\], computed stably in f64.
pub fn nll(logits: &[f32], target: u32) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
    let l = logits
        .get(target as usize)
        .copied()
        .unwrap_or(f32::NEG_INFINITY) as f64;
    -(l - max - sum.ln())
}

/// Smallest window: the scored second half must hold at least one prediction.
pub const MIN_WINDOW: usize = 4;

/// Computes perplexity; `progress(chunk, n_chunks, running_ppl)` is called after each window.
///
/// Memory stays bounded by one batch's logits (the session's batch size, at most one window)
/// whatever the text length: each window runs in batches whose logits are scored where the
/// executor left them, never copied or kept.
pub fn perplexity(
    session: &mut Session,
    tokens: &[u32],
    opts: &PplOptions,
    mut progress: impl FnMut(usize, usize, f64),
) -> Result<PplResult, ModelError> {
    let n_ctx = opts.n_ctx;
    if n_ctx < MIN_WINDOW {
        return Err(ModelError::InvalidArgument(format!(
            "a perplexity window needs at least {MIN_WINDOW} tokens (half of it is context, half \
             is scored), got {n_ctx}: pass a larger -c"
        )));
    }
    if n_ctx > session.n_ctx() {
        return Err(ModelError::InvalidArgument(format!(
            "the perplexity window of {n_ctx} tokens exceeds the session's context of {}",
            session.n_ctx()
        )));
    }
    if opts.max_chunks == Some(0) {
        return Err(ModelError::InvalidArgument(
            "--chunks 0 evaluates nothing: give at least 1, or leave it out for the whole text"
                .into(),
        ));
    }
    let mut n_chunks = tokens.len() / n_ctx;
    if let Some(m) = opts.max_chunks {
        n_chunks = n_chunks.min(m);
    }
    if n_chunks == 0 {
        return Err(ModelError::InvalidArgument(format!(
            "the text has {} tokens, fewer than one window of {n_ctx}: use a longer text or a \
             smaller -c",
            tokens.len()
        )));
    }
    let n_vocab = session.model().config().n_vocab;
    let first = n_ctx / 2;
    let mut total = 0.0f64;
    let mut scored = 0usize;
    let mut window = Vec::with_capacity(n_ctx);
    for c in 0..n_chunks {
        let text = &tokens[c * n_ctx..(c + 1) * n_ctx];
        window.clear();
        window.extend_from_slice(text);
        if let Some(bos) = opts.bos {
            window[0] = bos;
        }
        session.reset();
        // One forward pass per batch of the window: only a batch's logits exist at a time, and
        // batches before the scored half ask for none but their last.
        let mut start = 0;
        for part in window.chunks(session.n_batch()) {
            let end = start + part.len();
            if end <= first {
                session.eval_with(part, LogitsMode::Last, |_| ())?;
            } else {
                let (sum, n) = session.eval_with(part, LogitsMode::All, |logits| {
                    let mut sum = 0.0f64;
                    let mut n = 0usize;
                    for j in start.max(first)..end.min(n_ctx - 1) {
                        // Targets come from the original text, not the BOS-patched window.
                        let row = (j - start) * n_vocab;
                        let row = logits.get(row..row + n_vocab).unwrap_or(&[]);
                        sum += nll(row, text[j + 1]);
                        n += 1;
                    }
                    (sum, n)
                })?;
                total += sum;
                scored += n;
            }
            start = end;
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
