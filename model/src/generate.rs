//! The generation loop: prompt processing in batches, then one token per forward pass, sampled,
//! streamed as text, until a token budget, an end-of-generation token or a stop string.

use std::time::Instant;

use crate::arch::LogitsMode;
use crate::error::ModelError;
use crate::sampling::Sampler;
use crate::session::Session;
use crate::stream::TextStream;

/// Why generation ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The token budget was used up.
    Length,
    /// The model produced an end-of-generation token.
    EndOfGeneration,
    /// A stop string appeared in the text.
    StopString,
    /// The context is full.
    ContextFull,
}

/// Counts and timings of one generation.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Generated token ids (the EOG token, when one ended the run, is not included).
    pub tokens: Vec<u32>,
    /// Tokens of the prompt that were evaluated.
    pub prompt_tokens: usize,
    /// Seconds spent on the prompt.
    pub prompt_s: f64,
    /// Seconds spent generating (sampling and decode passes).
    pub gen_s: f64,
    /// Why it stopped.
    pub stop: StopReason,
}

/// What the loop needs from the vocabulary: text bytes of a token and which ids end a turn.
pub trait Vocab {
    /// Bytes a token contributes to the output text.
    fn piece(&self, id: u32) -> Vec<u8>;
    /// True for end-of-generation ids (EOS, end-of-turn...).
    fn is_eog(&self, id: u32) -> bool;
}

/// Generation limits.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to generate at most.
    pub max_tokens: usize,
    /// Text that ends generation (not printed).
    pub stop_strings: Vec<String>,
    /// Keep going past end-of-generation tokens (benchmarks).
    pub ignore_eog: bool,
}

/// Evaluates `prompt` after whatever the session already holds, then samples up to
/// `opts.max_tokens` tokens, calling `on_text` with each piece of text as soon as it is final.
pub fn generate(
    session: &mut Session,
    vocab: &dyn Vocab,
    sampler: &mut Sampler,
    prompt: &[u32],
    opts: &GenerateOptions,
    mut on_text: impl FnMut(&str),
) -> Result<Generation, ModelError> {
    let t0 = Instant::now();
    for &t in prompt {
        sampler.accept(t);
    }
    // Each step's logits are sampled where they landed (see `Session::eval_with`); nothing is
    // sampled when no token is asked for, so the sampler's state moves as it always did.
    let mut next = session.eval_with(prompt, LogitsMode::Last, |l| {
        (opts.max_tokens > 0).then(|| sampler.sample(l))
    })?;
    let prompt_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let mut stream = TextStream::new(opts.stop_strings.iter().cloned());
    let mut tokens = Vec::new();
    let mut stop = StopReason::Length;
    while let Some(tok) = next.filter(|_| tokens.len() < opts.max_tokens) {
        if !opts.ignore_eog && vocab.is_eog(tok) {
            stop = StopReason::EndOfGeneration;
            break;
        }
        sampler.accept(tok);
        tokens.push(tok);
        let text = stream.push(&vocab.piece(tok));
        if !text.is_empty() {
            on_text(&text);
        }
        if stream.stopped() {
            stop = StopReason::StopString;
            break;
        }
        if tokens.len() == opts.max_tokens {
            break;
        }
        if session.n_past() >= session.n_ctx() {
            stop = StopReason::ContextFull;
            break;
        }
        next = session.eval_with(&[tok], LogitsMode::Last, |l| Some(sampler.sample(l)))?;
    }
    let rest = stream.finish();
    if !rest.is_empty() {
        on_text(&rest);
    }
    Ok(Generation {
        tokens,
        prompt_tokens: prompt.len(),
        prompt_s,
        gen_s: t1.elapsed().as_secs_f64(),
        stop,
    })
}
