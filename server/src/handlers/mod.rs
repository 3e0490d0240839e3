//! The endpoints, one module per kind (chat, text completions, embeddings, the small ones),
//! and what they share: request parsing and validation, submitting a generation to the engine
//! and collecting or streaming (server-sent events) its answer.

mod chat;
mod completions;
mod embeddings;
mod misc;

pub(crate) use chat::chat;
pub(crate) use completions::completions;
pub(crate) use embeddings::embeddings;
pub(crate) use misc::{auth, detokenize, fallback, health, metrics, models, tokenize};

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};

use model::sampling::SamplerConfig;
use serde::de::DeserializeOwned;
use serde_json::json;
use tokio::sync::mpsc;
use tracing::Instrument;

use crate::api::{self, SamplingParams};
use crate::engine::{Backend, Finish, Generation, Logprob, Out, Submitted, TokenConstraint};
use crate::error::ApiError;
use crate::{Admission, AppState};

type St = State<Arc<AppState>>;
type Body = Result<Bytes, BytesRejection>;

/// Most stop strings one request may give.
const MAX_STOP: usize = 16;
/// Most alternatives per position (chat's `top_logprobs`).
const MAX_TOP_LOGPROBS: i64 = 20;

fn parse<T: DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let bytes = body.map_err(|r| {
        let mut e = ApiError::bad_request(r.body_text());
        e.status = r.status();
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            e.message = "the request body is larger than the server's limit".into();
        }
        e
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid: {e}")))
}

fn finish(st: &AppState, endpoint: &str, r: Result<Response, ApiError>) -> Response {
    st.metrics.request(endpoint, r.is_ok());
    r.unwrap_or_else(IntoResponse::into_response)
}

fn check_ids(ids: &[u32], n_vocab: usize, param: &str) -> Result<(), ApiError> {
    match ids.iter().find(|&&t| t as usize >= n_vocab) {
        Some(bad) => Err(ApiError::bad_param(
            param,
            format!("token id {bad} is outside the vocabulary of {n_vocab}"),
        )),
        None => Ok(()),
    }
}

fn check_model(st: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if !m.is_empty() && m != st.opts.model_id => {
            Err(ApiError::unknown_model(m, &st.opts.model_id))
        }
        _ => Ok(()),
    }
}

/// Sampling and limits common to both completion endpoints, checked.
#[derive(Debug)]
struct Settings {
    sampling: SamplerConfig,
    max_tokens: Option<usize>,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    ignore_eos: bool,
}

fn in_range(param: &str, v: Option<f32>, lo: f32, hi: f32) -> Result<Option<f32>, ApiError> {
    match v {
        Some(x) if !(x.is_finite() && (lo..=hi).contains(&x)) => Err(ApiError::bad_param(
            param,
            format!("`{param}` must be between {lo} and {hi}, got {x}"),
        )),
        v => Ok(v),
    }
}

fn settings(p: SamplingParams, n_ctx: usize) -> Result<Settings, ApiError> {
    let mut s = SamplerConfig::default();
    if let Some(t) = in_range("temperature", p.temperature, 0.0, 2.0)? {
        s.temperature = t;
    }
    if let Some(v) = in_range("top_p", p.top_p, 0.0, 1.0)? {
        s.top_p = v;
    }
    if let Some(v) = in_range("min_p", p.min_p, 0.0, 1.0)? {
        s.min_p = v;
    }
    if let Some(v) = in_range("presence_penalty", p.presence_penalty, -2.0, 2.0)? {
        s.presence_penalty = v;
    }
    if let Some(v) = in_range("frequency_penalty", p.frequency_penalty, -2.0, 2.0)? {
        s.frequency_penalty = v;
    }
    if let Some(v) = in_range("repeat_penalty", p.repeat_penalty, 0.0, 10.0)? {
        if v <= 0.0 {
            return Err(ApiError::bad_param(
                "repeat_penalty",
                "`repeat_penalty` must be positive",
            ));
        }
        s.repeat_penalty = v;
    }
    if let Some(k) = p.top_k {
        s.top_k = usize::try_from(k)
            .map_err(|_| ApiError::bad_param("top_k", "`top_k` must not be negative"))?;
    }
    if let Some(seed) = p.seed {
        // Any 64-bit integer is a seed; negative ones keep their bits.
        s.seed = seed as u64;
    }
    if let Some(n) = p.n {
        if n != 1 {
            return Err(ApiError::bad_param(
                "n",
                format!("only n = 1 is supported, got {n}"),
            ));
        }
    }
    let (param, max) = match (p.max_completion_tokens, p.max_tokens) {
        (Some(m), _) => ("max_completion_tokens", Some(m)),
        (None, m) => ("max_tokens", m),
    };
    let max_tokens = match max {
        None => None,
        Some(m) if m < 0 => {
            return Err(ApiError::bad_param(
                param,
                format!("`{param}` must not be negative, got {m}"),
            ))
        }
        Some(m) if m as u64 > n_ctx as u64 => {
            return Err(ApiError::bad_param(
                param,
                format!("`{param}` is {m}, more than the {n_ctx} tokens a request's context holds"),
            ))
        }
        Some(m) => Some(m as usize),
    };
    let stop = p.stop.map(api::StopSpec::into_vec).unwrap_or_default();
    if stop.len() > MAX_STOP {
        return Err(ApiError::bad_param(
            "stop",
            format!("at most {MAX_STOP} stop strings, got {}", stop.len()),
        ));
    }
    Ok(Settings {
        sampling: s,
        max_tokens,
        stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        stream: p.stream,
        include_usage: p.stream_options.is_some_and(|o| o.include_usage),
        ignore_eos: p.ignore_eos,
    })
}

/// The generation for a prompt: the token budget fitted to the context.
fn generation(
    prompt: Vec<u32>,
    s: &Settings,
    n_ctx: usize,
    logprobs: Option<usize>,
) -> Result<Generation, ApiError> {
    if prompt.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    let room = n_ctx.saturating_sub(prompt.len());
    if room == 0 {
        return Err(ApiError::context_length(prompt.len() + 1, n_ctx));
    }
    Ok(Generation {
        max_tokens: s.max_tokens.unwrap_or(room).min(room),
        prompt,
        sampling: s.sampling.clone(),
        stop_at_eog: !s.ignore_eos,
        stop_strings: s.stop.clone(),
        logprobs,
        constraint: None,
    })
}

/// The grammar of `response_format` (`None` for plain text).
fn response_constraint(
    b: &Backend,
    f: Option<&api::ResponseFormat>,
) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
    let schema = match f.map(|f| (f.kind.as_str(), f)) {
        None | Some(("text", _)) => return Ok(None),
        Some(("json_object", _)) => None,
        Some(("json_schema", f)) => match f.json_schema.as_ref().and_then(|j| j.schema.clone()) {
            Some(s) => Some(s),
            None => {
                return Err(ApiError::bad_param(
                    "response_format",
                    "`response_format.json_schema.schema` is missing",
                ))
            }
        },
        Some((other, _)) => {
            return Err(ApiError::bad_param(
                "response_format",
                format!(
                    "`response_format` type `{other}` is unknown (text, json_object, json_schema)"
                ),
            ))
        }
    };
    let grammars = b.grammars().map_err(ApiError::internal)?;
    let c = grammars
        .json(schema)
        .map_err(|e| ApiError::bad_param("response_format", format!("invalid JSON schema: {e}")))?;
    Ok(Some(Box::new(c)))
}

/// Per-request timing into the latency histograms.
#[derive(Debug)]
struct Timing {
    start: Instant,
    last: Option<Instant>,
}

impl Timing {
    fn token(&mut self, st: &AppState) {
        let now = Instant::now();
        match self.last {
            None => st.metrics.ttft.observe(now - self.start),
            Some(l) => st.metrics.itl.observe(now - l),
        }
        self.last = Some(now);
    }
}

/// Log-probabilities of one token as the two wire formats need them.
fn piece_text(st: &AppState, id: u32) -> (String, Vec<u8>) {
    let bytes = st
        .backend
        .get()
        .map(|b| b.text().tokenizer().token_to_piece(id))
        .unwrap_or_default();
    (String::from_utf8_lossy(&bytes).into_owned(), bytes)
}

/// A finished generation.
#[derive(Debug, Default)]
struct Collected {
    text: String,
    tokens: Vec<(u32, Option<Logprob>, usize)>,
    finish: Option<Finish>,
    prompt_tokens: usize,
    completion_tokens: usize,
}

async fn collect(st: &AppState, mut sub: Submitted, start: Instant) -> Result<Collected, ApiError> {
    let mut c = Collected::default();
    let mut timing = Timing { start, last: None };
    while let Some(ev) = sub.events.recv().await {
        match ev {
            Out::Token { id, text, logprob } => {
                timing.token(st);
                c.tokens.push((id, logprob, c.text.len()));
                c.text.push_str(&text);
            }
            Out::Done {
                text,
                finish,
                prompt_tokens,
                completion_tokens,
            } => {
                c.text.push_str(&text);
                c.finish = Some(finish);
                c.prompt_tokens = prompt_tokens;
                c.completion_tokens = completion_tokens;
                tracing::info!(
                    prompt_tokens,
                    completion_tokens,
                    finish = finish.as_str(),
                    ms = start.elapsed().as_millis() as u64,
                    "generation finished"
                );
                st.metrics.tokens(prompt_tokens, completion_tokens);
                return Ok(c);
            }
            Out::Error(e) => return Err(e.into()),
        }
    }
    Err(ApiError::internal(
        "the engine stopped before the request finished",
    ))
}

fn sse_json(v: &impl serde::Serialize) -> SseEvent {
    SseEvent::default().data(serde_json::to_string(v).unwrap_or_else(|e| {
        json!({"error": {"message": e.to_string(), "type": "server_error"}}).to_string()
    }))
}

/// Runs a streamed generation on its own task: events become SSE events; when the client goes
/// away (the response body is dropped), the task ends and the request is cancelled.
fn stream_response<F>(
    st: Arc<AppState>,
    sub: Submitted,
    admission: Admission,
    start: Instant,
    endpoint: &'static str,
    mut make: F,
) -> Response
where
    F: FnMut(StreamItem<'_>) -> Vec<SseEvent> + Send + 'static,
{
    let (tx, rx) = mpsc::channel::<SseEvent>(64);
    // The stream outlives the handler: keep its request's span for the logs.
    let span = tracing::Span::current();
    let task = async move {
        let _admission = admission;
        let mut sub = sub;
        let mut timing = Timing { start, last: None };
        if !send_all(&tx, make(StreamItem::Start)).await {
            st.metrics.cancelled();
            tracing::info!("the client went away: generation cancelled");
            return;
        }
        loop {
            let ev = tokio::select! {
                ev = sub.events.recv() => ev,
                () = tx.closed() => {
                    st.metrics.cancelled();
                    tracing::info!("the client went away: generation cancelled");
                    return;
                }
            };
            let (events, end) = match ev {
                Some(Out::Token { id, text, logprob }) => {
                    timing.token(&st);
                    (
                        make(StreamItem::Token {
                            id,
                            text: &text,
                            logprob: logprob.as_ref(),
                        }),
                        false,
                    )
                }
                Some(Out::Done {
                    text,
                    finish,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    st.metrics.tokens(prompt_tokens, completion_tokens);
                    st.metrics.request(endpoint, true);
                    tracing::info!(
                        prompt_tokens,
                        completion_tokens,
                        finish = finish.as_str(),
                        ms = start.elapsed().as_millis() as u64,
                        "generation finished"
                    );
                    (
                        make(StreamItem::Done {
                            text: &text,
                            finish,
                            usage: api::Usage::new(prompt_tokens, completion_tokens),
                        }),
                        true,
                    )
                }
                Some(Out::Error(e)) => {
                    st.metrics.request(endpoint, false);
                    (vec![sse_json(&ApiError::from(e).body())], true)
                }
                None => {
                    st.metrics.request(endpoint, false);
                    let e = ApiError::internal("the engine stopped before the request finished");
                    (vec![sse_json(&e.body())], true)
                }
            };
            if !send_all(&tx, events).await {
                st.metrics.cancelled();
                tracing::info!("the client went away: generation cancelled");
                return;
            }
            if end {
                let _ = tx.send(SseEvent::default().data("[DONE]")).await;
                return;
            }
        }
    };
    tokio::spawn(task.instrument(span));
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|e| (Ok::<_, Infallible>(e), rx))
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// Sends events in order; false once the client is gone.
async fn send_all(tx: &mpsc::Sender<SseEvent>, events: Vec<SseEvent>) -> bool {
    for e in events {
        if tx.send(e).await.is_err() {
            return false;
        }
    }
    true
}

/// What a streamed answer's writer is asked to turn into events.
enum StreamItem<'a> {
    Start,
    Token {
        id: u32,
        text: &'a str,
        logprob: Option<&'a Logprob>,
    },
    Done {
        text: &'a str,
        finish: Finish,
        usage: api::Usage,
    },
}
