//! Greedy tokens of prompts decoded alone (`generate`) and together (the batching engine),
//! shared by the tests that check that batching changes no sequence's tokens.

use std::time::Duration;

use rocmforge_model::batch::{BatchEngine, Event, FinishReason, Request};
use rocmforge_model::generate::{generate, GenerateOptions};
use rocmforge_model::sampling::{Sampler, SamplerConfig};
use rocmforge_model::session::{Session, SessionOptions};
use rocmforge_model::text::TextModel;

/// `n` greedy tokens after `prompt` from a session of its own (end-of-generation tokens do not
/// stop it, as the engine's greedy requests do not).
pub fn greedy_alone(tm: &TextModel, opts: &SessionOptions, prompt: &[u32], n: usize) -> Vec<u32> {
    let mut s = Session::new(tm.model(), opts).expect("session");
    let mut sampler = Sampler::new(SamplerConfig::greedy());
    let o = GenerateOptions {
        max_tokens: n,
        stop_strings: Vec::new(),
        ignore_eog: true,
    };
    generate(&mut s, tm, &mut sampler, prompt, &o, |_| {})
        .expect("generate")
        .tokens
}

/// Submits every prompt to `e` at once for `n` greedy tokens and returns each one's tokens;
/// panics, naming `what` and the request, on an error, on an end other than the length limit,
/// or when no event comes for 300 s.
pub fn greedy_together(
    e: &BatchEngine,
    prompts: &[Vec<u32>],
    n: usize,
    what: &str,
) -> Vec<Vec<u32>> {
    let rxs: Vec<_> = prompts
        .iter()
        .map(|p| {
            e.submit_channel(Request::greedy(p.clone(), n))
                .expect("submit")
                .1
        })
        .collect();
    rxs.iter()
        .enumerate()
        .map(|(i, rx)| {
            let mut toks = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_secs(300)).expect("event") {
                    Event::Token { id, .. } => toks.push(id),
                    Event::Done { reason, .. } => {
                        assert_eq!(reason, FinishReason::Length, "{what} request {i}");
                        break toks;
                    }
                    Event::Error(err) => panic!("{what} request {i}: {err}"),
                }
            }
        })
        .collect()
}
