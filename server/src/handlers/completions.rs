//! `POST /v1/completions`: a raw prompt (text or token ids), `echo` and legacy logprobs.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use parking_lot::Mutex;
use serde_json::json;

use super::{
    check_ids, check_model, collect, generation, parse, piece_text, settings, sse_json,
    stream_response, Body, St, StreamItem,
};
use crate::api;
use crate::engine::{Finish, Logprob, TokenConstraint};
use crate::error::ApiError;
use crate::{unix_now, AppState};

pub(crate) async fn completions(State(st): St, body: Body) -> Response {
    match completions_inner(Arc::clone(&st), body).await {
        Ok(r) => r,
        Err(e) => {
            st.metrics.request("completions", false);
            e.into_response()
        }
    }
}

/// One position of legacy logprobs.
fn push_logprob(
    st: &AppState,
    out: &mut api::CompletionLogprobs,
    id: u32,
    lp: &Logprob,
    at: usize,
) {
    out.tokens.push(piece_text(st, id).0);
    out.token_logprobs.push(Some(lp.logprob));
    out.top_logprobs.push(Some(
        lp.top
            .iter()
            .map(|&(t, l)| (piece_text(st, t).0, json!(l)))
            .collect(),
    ));
    out.text_offset.push(at);
}

/// Logprobs of generated tokens whose text starts at `base` of the collected text and at
/// `offset` of the answer's.
fn completion_logprobs(
    st: &AppState,
    out: &mut api::CompletionLogprobs,
    tokens: &[(u32, Option<Logprob>, usize)],
    base: usize,
    offset: usize,
) {
    for (id, lp, at) in tokens {
        if let Some(lp) = lp {
            push_logprob(st, out, *id, lp, offset + at - base);
        }
    }
}

/// `echo` with `logprobs`: the prompt's own log-probabilities. The engine computes logits for
/// generated positions only, so the request starts from the prompt's first token and this
/// constraint forces the rest of the prompt token by token, reading each position's
/// distribution before masking it; then generation goes on unconstrained. End-of-generation
/// tokens inside the prompt must not stop it, so the engine does not stop on them and this
/// constraint ends the request at the first one generated after the prompt.
struct PromptForcing {
    forced: Vec<u32>,
    pos: usize,
    top: usize,
    eog: Vec<u32>,
    record: Arc<Mutex<Vec<Logprob>>>,
}

impl TokenConstraint for PromptForcing {
    fn mask(&mut self, logits: &mut [f32]) {
        let Some(&want) = self.forced.get(self.pos) else {
            return;
        };
        self.record.lock().push(logprob_at(logits, want, self.top));
        for (i, l) in logits.iter_mut().enumerate() {
            if i != want as usize {
                *l = f32::NEG_INFINITY;
            }
        }
    }

    fn accept(&mut self, token: u32) -> bool {
        if self.pos < self.forced.len() {
            self.pos += 1;
            return true;
        }
        !self.eog.contains(&token)
    }
}

/// Log-softmax of `logits` at `id` and the `n` most likely tokens (as the engine reports
/// generated tokens').
fn logprob_at(logits: &[f32], id: u32, n: usize) -> Logprob {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|l| l.is_finite())
        .map(|&l| f64::from(l - max).exp())
        .sum();
    let lse = f64::from(max) + sum.ln();
    let lp = |l: f32| (f64::from(l) - lse) as f32;
    let mut idx: Vec<u32> = (0..logits.len() as u32)
        .filter(|&i| !logits[i as usize].is_nan())
        .collect();
    let by_desc = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]);
    if n == 0 {
        idx.clear();
    } else if n < idx.len() {
        idx.select_nth_unstable_by(n - 1, by_desc);
        idx.truncate(n);
    }
    idx.sort_unstable_by(by_desc);
    Logprob {
        logprob: lp(logits
            .get(id as usize)
            .copied()
            .unwrap_or(f32::NEG_INFINITY)),
        top: idx
            .into_iter()
            .map(|i| (i, lp(logits[i as usize])))
            .collect(),
    }
}

/// The echoed prompt's logprobs: the first token's are null, the others' were recorded while
/// forcing.
fn prompt_logprobs(st: &AppState, ids: &[u32], record: &[Logprob]) -> api::CompletionLogprobs {
    let mut out = api::CompletionLogprobs::default();
    let mut at = 0;
    for (i, &id) in ids.iter().enumerate() {
        match i.checked_sub(1).and_then(|j| record.get(j)) {
            Some(lp) => push_logprob(st, &mut out, id, lp, at),
            None => {
                out.tokens.push(piece_text(st, id).0);
                out.token_logprobs.push(None);
                out.top_logprobs.push(None);
                out.text_offset.push(at);
            }
        }
        at += st.backend.get().map_or(0, |b| {
            b.text().tokenizer().token_to_piece_ext(id, 0, false).len()
        });
    }
    out
}

async fn completions_inner(st: Arc<AppState>, body: Body) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req: api::CompletionRequest = parse(body)?;
    check_model(&st, req.model.as_deref())?;
    let b = st.backend()?;
    let s = settings(req.sampling.clone(), b.n_ctx())?;
    let top = match req.logprobs {
        Some(n) if !(0..=5).contains(&n) => {
            return Err(ApiError::bad_param(
                "logprobs",
                "`logprobs` must be between 0 and 5",
            ))
        }
        n => n.map(|n| n as usize),
    };
    let tok = b.text().tokenizer();
    let (prompt, prompt_text) = match req.prompt {
        api::Prompt::Text(t) => (tok.encode(&t, true, true), t),
        api::Prompt::Tokens(ids) => {
            check_ids(&ids, tok.n_vocab(), "prompt")?;
            let text = String::from_utf8_lossy(&tok.detokenize(&ids, false, false)).into_owned();
            (ids, text)
        }
        api::Prompt::Texts(mut v) if v.len() == 1 => {
            let t = v.remove(0);
            (tok.encode(&t, true, true), t)
        }
        api::Prompt::TokenLists(mut v) if v.len() == 1 => {
            let ids = v.remove(0);
            check_ids(&ids, tok.n_vocab(), "prompt")?;
            let text = String::from_utf8_lossy(&tok.detokenize(&ids, false, false)).into_owned();
            (ids, text)
        }
        _ => {
            return Err(ApiError::bad_param(
                "prompt",
                "only one prompt per request is supported",
            ))
        }
    };
    let mut g = generation(prompt, &s, b.n_ctx(), top)?;
    let n_prompt = g.prompt.len();
    // Prompt tokens forced after the first one (echo with logprobs), and their record.
    let forcing = match (req.echo, top) {
        (true, Some(n)) => {
            if !s.stop.is_empty() {
                return Err(ApiError::bad_param(
                    "stop",
                    "`stop` cannot be combined with `echo` and `logprobs`",
                ));
            }
            let record = Arc::new(Mutex::new(Vec::new()));
            let all = g.prompt.clone();
            let forced = g.prompt.split_off(1);
            g.max_tokens += forced.len();
            g.constraint = Some(Box::new(PromptForcing {
                eog: if g.stop_at_eog {
                    tok.eog_ids()
                } else {
                    Vec::new()
                },
                forced: forced.clone(),
                pos: 0,
                top: n,
                record: Arc::clone(&record),
            }));
            let f = Forced {
                eog: if g.stop_at_eog {
                    tok.eog_ids()
                } else {
                    Vec::new()
                },
                k: forced.len(),
                ids: all,
                record,
            };
            g.stop_at_eog = false;
            Some(f)
        }
        _ => None,
    };
    let admission = st.admit()?;
    let sub = b.submit(g)?;
    let id = format!("cmpl-{}", st.next_id());
    let created = unix_now();
    let model = st.opts.model_id.clone();
    tracing::info!(%id, prompt_tokens = n_prompt, stream = s.stream, "completion request");
    if st.opts.log_prompts {
        tracing::info!(%id, prompt = %prompt_text, "completion prompt");
    }
    let echo = req.echo.then_some(prompt_text);
    if s.stream {
        let include_usage = s.include_usage;
        let st2 = Arc::clone(&st);
        let mut offset = echo.as_ref().map_or(0, String::len);
        let chunk = move |text: String,
                          logprobs: Option<api::CompletionLogprobs>,
                          finish: Option<&'static str>,
                          usage: Option<api::Usage>| {
            sse_json(&api::CompletionResponse {
                id: id.clone(),
                object: "text_completion",
                created,
                model: model.clone(),
                choices: vec![api::CompletionChoice {
                    index: 0,
                    text,
                    logprobs,
                    finish_reason: finish,
                }],
                usage,
            })
        };
        let mut seen = 0;
        let mut dropped = 0;
        let make = move |item: StreamItem<'_>| match item {
            StreamItem::Start => match (&echo, &forcing) {
                // The echo waits for the prompt's logprobs.
                (Some(_), Some(f)) if f.k > 0 => Vec::new(),
                (Some(t), Some(f)) => vec![chunk(
                    t.clone(),
                    Some(prompt_logprobs(&st2, &f.ids, &[])),
                    None,
                    None,
                )],
                (Some(t), None) => vec![chunk(t.clone(), None, None, None)],
                (None, _) => Vec::new(),
            },
            StreamItem::Token { id, text, logprob } => {
                if let Some(f) = &forcing {
                    if seen < f.k {
                        seen += 1;
                        if seen < f.k {
                            return Vec::new();
                        }
                        let lp = prompt_logprobs(&st2, &f.ids, &f.record.lock());
                        return vec![chunk(
                            echo.clone().unwrap_or_default(),
                            Some(lp),
                            None,
                            None,
                        )];
                    }
                    if f.eog.contains(&id) {
                        dropped += 1;
                        return Vec::new();
                    }
                }
                let lp = match (top, logprob) {
                    (Some(_), Some(l)) => {
                        let mut out = api::CompletionLogprobs::default();
                        push_logprob(&st2, &mut out, id, l, offset);
                        Some(out)
                    }
                    _ => None,
                };
                offset += text.len();
                if text.is_empty() && lp.is_none() {
                    return Vec::new();
                }
                vec![chunk(text.to_owned(), lp, None, None)]
            }
            StreamItem::Done {
                text,
                finish,
                usage,
            } => {
                let usage = match &forcing {
                    Some(f) => api::Usage::new(
                        f.ids.len(),
                        usage.completion_tokens.saturating_sub(f.k + dropped),
                    ),
                    None => usage,
                };
                vec![chunk(
                    text.to_owned(),
                    None,
                    Some(finish.as_str()),
                    include_usage.then_some(usage),
                )]
            }
        };
        return Ok(stream_response(
            Arc::clone(&st),
            sub,
            admission,
            start,
            "completions",
            make,
        ));
    }
    let mut c = collect(&st, sub, start).await?;
    drop(admission);
    let offset = echo.as_ref().map_or(0, String::len);
    let (k, usage) = match &forcing {
        Some(f) => {
            // The end-of-generation token that ended the request is not part of the answer.
            let mut dropped = 0;
            if c.tokens.len() > f.k && c.tokens.last().is_some_and(|t| f.eog.contains(&t.0)) {
                if let Some((_, _, at)) = c.tokens.pop() {
                    c.text.truncate(at);
                }
                dropped = 1;
            }
            (
                f.k,
                api::Usage::new(
                    f.ids.len(),
                    c.completion_tokens.saturating_sub(f.k + dropped),
                ),
            )
        }
        None => (0, api::Usage::new(c.prompt_tokens, c.completion_tokens)),
    };
    let k = k.min(c.tokens.len());
    let base = c.tokens.get(k).map_or(c.text.len(), |t| t.2);
    let logprobs = top.map(|_| {
        let mut out = match &forcing {
            Some(f) => prompt_logprobs(&st, &f.ids, &f.record.lock()),
            None => api::CompletionLogprobs::default(),
        };
        completion_logprobs(&st, &mut out, &c.tokens[k..], base, offset);
        out
    });
    let generated = &c.text[base..];
    let text = match echo {
        Some(mut p) => {
            p.push_str(generated);
            p
        }
        None => generated.to_owned(),
    };
    st.metrics.request("completions", true);
    Ok(Json(api::CompletionResponse {
        id,
        object: "text_completion",
        created,
        model,
        choices: vec![api::CompletionChoice {
            index: 0,
            text,
            logprobs,
            finish_reason: Some(c.finish.unwrap_or(Finish::Stop).as_str()),
        }],
        usage: Some(usage),
    })
    .into_response())
}

/// An echo-with-logprobs request's forced prompt.
#[derive(Debug)]
struct Forced {
    /// Prompt tokens forced (all but the first).
    k: usize,
    /// The whole prompt.
    ids: Vec<u32>,
    /// End-of-generation tokens that end the answer (none with `ignore_eos`).
    eog: Vec<u32>,
    /// Their log-probabilities, filled while forcing.
    record: Arc<Mutex<Vec<Logprob>>>,
}
