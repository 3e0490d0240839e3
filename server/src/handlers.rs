//! The endpoints: request validation, prompt building (chat template or raw prompt), running a
//! generation on the engine and writing whole or streamed (server-sent events) answers.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Request, State};
use axum::http::{header, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use model::chat::ChatMessage;
use model::sampling::SamplerConfig;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use crate::api::{self, Content, SamplingParams};
use crate::engine::{Backend, Finish, Generation, Logprob, Out, Submitted, TokenConstraint};
use crate::error::ApiError;
use crate::{unix_now, Admission, AppState};

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

/// Requires `Authorization: Bearer KEY` when the server has a key (`/health` stays open).
pub(crate) async fn auth(State(st): St, req: Request, next: Next) -> Response {
    let Some(key) = &st.opts.api_key else {
        return next.run(req).await;
    };
    if req.uri().path() == "/health" {
        return next.run(req).await;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match given {
        Some(g) if constant_time_eq(g.as_bytes(), key.as_bytes()) => next.run(req).await,
        _ => ApiError::unauthorized().into_response(),
    }
}

/// Equality whose time does not depend on where the inputs differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub(crate) async fn fallback(uri: Uri) -> ApiError {
    ApiError::no_route(uri.path())
}

pub(crate) async fn health(State(st): St) -> Response {
    match st.backend() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

pub(crate) async fn metrics(State(st): St) -> Response {
    let gauges = st.backend.get().map(|b| b.gauges());
    let in_flight = st.in_flight.load(std::sync::atomic::Ordering::Relaxed);
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.metrics.render(gauges, in_flight),
    )
        .into_response()
}

pub(crate) async fn models(State(st): St) -> Response {
    let r = st.backend().map(|b| {
        let cfg = b.text().model().config();
        Json(json!({
            "object": "list",
            "data": [{
                "id": st.opts.model_id,
                "object": "model",
                "created": st.created,
                "owned_by": "rocmforge",
                "meta": {
                    "architecture": cfg.arch.name(),
                    "n_ctx": b.n_ctx(),
                    "n_ctx_train": cfg.n_ctx_train,
                    "n_vocab": cfg.n_vocab,
                    "n_layer": cfg.n_layer,
                },
            }],
        }))
        .into_response()
    });
    finish(&st, "models", r)
}

fn finish(st: &AppState, endpoint: &str, r: Result<Response, ApiError>) -> Response {
    st.metrics.request(endpoint, r.is_ok());
    r.unwrap_or_else(IntoResponse::into_response)
}

pub(crate) async fn tokenize(State(st): St, body: Body) -> Response {
    let r = (|| {
        let req: api::TokenizeRequest = parse(body)?;
        let b = st.backend()?;
        let tok = b.text().tokenizer();
        let ids = tok.encode(&req.content, req.add_special, true);
        let tokens: Vec<Value> = if req.with_pieces {
            ids.iter()
                .map(|&id| {
                    let p = tok.token_to_piece(id);
                    match String::from_utf8(p) {
                        Ok(s) => json!({"id": id, "piece": s}),
                        Err(e) => json!({"id": id, "piece": e.into_bytes()}),
                    }
                })
                .collect()
        } else {
            ids.iter().map(|&id| json!(id)).collect()
        };
        Ok(Json(json!({ "tokens": tokens })).into_response())
    })();
    finish(&st, "tokenize", r)
}

pub(crate) async fn detokenize(State(st): St, body: Body) -> Response {
    let r = (|| {
        let req: api::DetokenizeRequest = parse(body)?;
        let b = st.backend()?;
        check_ids(&req.tokens, b.text().tokenizer().n_vocab(), "tokens")?;
        let bytes = b.text().tokenizer().detokenize(&req.tokens, false, false);
        let content = String::from_utf8_lossy(&bytes).into_owned();
        Ok(Json(json!({ "content": content })).into_response())
    })();
    finish(&st, "detokenize", r)
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

fn message_text(m: &api::Message) -> Result<String, ApiError> {
    match &m.content {
        None => Ok(String::new()),
        Some(Content::Text(t)) => Ok(t.clone()),
        Some(Content::Parts(parts)) => {
            let mut out = String::new();
            for p in parts {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => out.push_str(t),
                    (kind, _) => {
                        return Err(ApiError::bad_param(
                            "messages",
                            format!("content parts of type `{kind}` are not supported (only text)"),
                        ))
                    }
                }
            }
            Ok(out)
        }
    }
}

fn chat_messages(msgs: &[api::Message]) -> Result<Vec<ChatMessage>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    msgs.iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                other => {
                    return Err(ApiError::bad_param(
                        "messages",
                        format!("message role `{other}` is not supported (system, developer, user, assistant)"),
                    ))
                }
            };
            Ok(ChatMessage::new(role, message_text(m)?))
        })
        .collect()
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

fn chat_logprob(st: &AppState, id: u32, lp: &Logprob) -> api::ChatLogprob {
    let (token, bytes) = piece_text(st, id);
    api::ChatLogprob {
        token,
        logprob: lp.logprob,
        bytes,
        top_logprobs: lp
            .top
            .iter()
            .map(|&(t, l)| {
                let (token, bytes) = piece_text(st, t);
                api::TopLogprob {
                    token,
                    logprob: l,
                    bytes,
                }
            })
            .collect(),
    }
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
    tokio::spawn(async move {
        let _admission = admission;
        let mut sub = sub;
        let mut timing = Timing { start, last: None };
        if !send_all(&tx, make(StreamItem::Start)).await {
            st.metrics.cancelled();
            return;
        }
        loop {
            let ev = tokio::select! {
                ev = sub.events.recv() => ev,
                () = tx.closed() => {
                    st.metrics.cancelled();
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
                return;
            }
            if end {
                let _ = tx.send(SseEvent::default().data("[DONE]")).await;
                return;
            }
        }
    });
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

pub(crate) async fn chat(State(st): St, body: Body) -> Response {
    match chat_inner(Arc::clone(&st), body).await {
        Ok(r) => r,
        Err(e) => {
            st.metrics.request("chat", false);
            e.into_response()
        }
    }
}

async fn chat_inner(st: Arc<AppState>, body: Body) -> Result<Response, ApiError> {
    let start = Instant::now();
    let req: api::ChatRequest = parse(body)?;
    check_model(&st, req.model.as_deref())?;
    if req.tools.as_ref().is_some_and(|t| !t.is_empty()) {
        return Err(ApiError::bad_param(
            "tools",
            "tools are not supported by this server yet",
        ));
    }
    let top = match (req.logprobs, req.top_logprobs) {
        (_, Some(n)) if !(0..=MAX_TOP_LOGPROBS).contains(&n) => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                format!("`top_logprobs` must be between 0 and {MAX_TOP_LOGPROBS}"),
            ))
        }
        (false, Some(_)) => {
            return Err(ApiError::bad_param(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ))
        }
        (true, n) => Some(n.unwrap_or(0) as usize),
        (false, None) => None,
    };
    let b = st.backend()?;
    let s = settings(req.sampling.clone(), b.n_ctx())?;
    let messages = chat_messages(&req.messages)?;
    let template = b.text().chat_template();
    let rendered = template
        .render(&messages, true)
        .map_err(|e| ApiError::bad_param("messages", format!("the chat template failed: {e}")))?;
    let prompt = b.text().encode_chat(&rendered)?;
    let mut g = generation(prompt, &s, b.n_ctx(), top)?;
    g.stop_strings.extend(template.stop_strings());
    g.constraint = response_constraint(b, req.response_format.as_ref())?;
    let admission = st.admit()?;
    let n_prompt = g.prompt.len();
    let sub = b.submit(g)?;
    let id = format!("chatcmpl-{}", st.next_id());
    let created = unix_now();
    let model = st.opts.model_id.clone();
    tracing::info!(%id, prompt_tokens = n_prompt, stream = s.stream, "chat request");
    if s.stream {
        let include_usage = s.include_usage;
        let want_lp = top.is_some();
        let st2 = Arc::clone(&st);
        let chunk = move |choices: Vec<api::ChunkChoice>, usage: Option<api::Usage>| {
            sse_json(&api::ChatChunk {
                id: id.clone(),
                object: "chat.completion.chunk",
                created,
                model: model.clone(),
                choices,
                usage,
            })
        };
        let make = move |item: StreamItem<'_>| match item {
            StreamItem::Start => vec![chunk(
                vec![api::ChunkChoice {
                    index: 0,
                    delta: api::Delta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                    },
                    logprobs: None,
                    finish_reason: None,
                }],
                None,
            )],
            StreamItem::Token { id, text, logprob } => {
                let lp = match (want_lp, logprob) {
                    (true, Some(l)) => Some(api::ChatLogprobs {
                        content: vec![chat_logprob(&st2, id, l)],
                    }),
                    _ => None,
                };
                if text.is_empty() && lp.is_none() {
                    return Vec::new();
                }
                vec![chunk(
                    vec![api::ChunkChoice {
                        index: 0,
                        delta: api::Delta {
                            role: None,
                            content: Some(text.to_owned()),
                        },
                        logprobs: lp,
                        finish_reason: None,
                    }],
                    None,
                )]
            }
            StreamItem::Done {
                text,
                finish,
                usage,
            } => {
                let mut out = vec![chunk(
                    vec![api::ChunkChoice {
                        index: 0,
                        delta: api::Delta {
                            role: None,
                            content: (!text.is_empty()).then(|| text.to_owned()),
                        },
                        logprobs: None,
                        finish_reason: Some(finish.as_str()),
                    }],
                    None,
                )];
                if include_usage {
                    out.push(chunk(Vec::new(), Some(usage)));
                }
                out
            }
        };
        return Ok(stream_response(
            Arc::clone(&st),
            sub,
            admission,
            start,
            "chat",
            make,
        ));
    }
    let c = collect(&st, sub, start).await?;
    drop(admission);
    let logprobs = top.map(|_| api::ChatLogprobs {
        content: c
            .tokens
            .iter()
            .filter_map(|(id, lp, _)| lp.as_ref().map(|l| chat_logprob(&st, *id, l)))
            .collect(),
    });
    st.metrics.request("chat", true);
    Ok(Json(api::ChatResponse {
        id,
        object: "chat.completion",
        created,
        model,
        choices: vec![api::ChatChoice {
            index: 0,
            message: api::AssistantMessage {
                role: "assistant",
                content: c.text,
            },
            logprobs,
            finish_reason: c.finish.unwrap_or(Finish::Stop).as_str(),
        }],
        usage: api::Usage::new(c.prompt_tokens, c.completion_tokens),
    })
    .into_response())
}

pub(crate) async fn completions(State(st): St, body: Body) -> Response {
    match completions_inner(Arc::clone(&st), body).await {
        Ok(r) => r,
        Err(e) => {
            st.metrics.request("completions", false);
            e.into_response()
        }
    }
}

pub(crate) async fn embeddings(State(st): St, body: Body) -> Response {
    let r = embeddings_inner(Arc::clone(&st), body).await;
    finish(&st, "embeddings", r)
}

async fn embeddings_inner(st: Arc<AppState>, body: Body) -> Result<Response, ApiError> {
    let req: api::EmbeddingRequest = parse(body)?;
    check_model(&st, req.model.as_deref())?;
    let b = st.backend()?;
    let base64 = match req.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_param(
                "encoding_format",
                format!("`encoding_format` `{other}` is unknown (float, base64)"),
            ))
        }
    };
    let width = b.text().model().config().n_embd;
    if let Some(d) = req.dimensions {
        if d != width as i64 {
            return Err(ApiError::bad_param(
                "dimensions",
                format!("this model's embeddings have {width} dimensions, not {d}"),
            ));
        }
    }
    let tok = b.text().tokenizer();
    let encode = |t: &str| {
        // An empty text would embed only the special tokens added around it.
        if t.is_empty() {
            Vec::new()
        } else {
            tok.encode(t, true, true)
        }
    };
    let inputs: Vec<Vec<u32>> = match req.input {
        api::Prompt::Text(t) => vec![encode(&t)],
        api::Prompt::Texts(v) => v.iter().map(|t| encode(t)).collect(),
        api::Prompt::Tokens(ids) => vec![ids],
        api::Prompt::TokenLists(v) => v,
    };
    if inputs.is_empty() {
        return Err(ApiError::bad_param("input", "`input` is empty"));
    }
    for ids in &inputs {
        if ids.is_empty() {
            return Err(ApiError::bad_param("input", "an input is empty"));
        }
        if ids.len() > b.n_ctx() {
            return Err(ApiError::context_length(ids.len(), b.n_ctx()));
        }
        check_ids(ids, tok.n_vocab(), "input")?;
    }
    let n_tokens: usize = inputs.iter().map(Vec::len).sum();
    let admission = st.admit()?;
    let worker = Arc::clone(&st);
    // The engine's embed call waits for its pass between two decode steps.
    let vectors = tokio::task::spawn_blocking(move || {
        let _admission = admission;
        let b = worker.backend()?;
        inputs
            .into_iter()
            .map(|ids| b.embed(ids).map_err(ApiError::from))
            .collect::<Result<Vec<_>, ApiError>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("the embedding task failed: {e}")))??;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if base64 {
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                json!(base64::engine::general_purpose::STANDARD.encode(bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(Json(json!({
        "object": "list",
        "data": data,
        "model": st.opts.model_id,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }))
    .into_response())
}

fn completion_logprobs(st: &AppState, c: &Collected, offset: usize) -> api::CompletionLogprobs {
    let mut out = api::CompletionLogprobs::default();
    for (id, lp, at) in &c.tokens {
        let Some(lp) = lp else { continue };
        out.tokens.push(piece_text(st, *id).0);
        out.token_logprobs.push(lp.logprob);
        out.top_logprobs.push(
            lp.top
                .iter()
                .map(|&(t, l)| (piece_text(st, t).0, json!(l)))
                .collect(),
        );
        out.text_offset.push(offset + at);
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
    let g = generation(prompt, &s, b.n_ctx(), top)?;
    let admission = st.admit()?;
    let n_prompt = g.prompt.len();
    let sub = b.submit(g)?;
    let id = format!("cmpl-{}", st.next_id());
    let created = unix_now();
    let model = st.opts.model_id.clone();
    tracing::info!(%id, prompt_tokens = n_prompt, stream = s.stream, "completion request");
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
        let make = move |item: StreamItem<'_>| match item {
            StreamItem::Start => match &echo {
                Some(t) => vec![chunk(t.clone(), None, None, None)],
                None => Vec::new(),
            },
            StreamItem::Token { id, text, logprob } => {
                let lp = match (top, logprob) {
                    (Some(_), Some(l)) => Some(api::CompletionLogprobs {
                        tokens: vec![piece_text(&st2, id).0],
                        token_logprobs: vec![l.logprob],
                        top_logprobs: vec![l
                            .top
                            .iter()
                            .map(|&(t, v)| (piece_text(&st2, t).0, json!(v)))
                            .collect()],
                        text_offset: vec![offset],
                    }),
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
            } => vec![chunk(
                text.to_owned(),
                None,
                Some(finish.as_str()),
                include_usage.then_some(usage),
            )],
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
    let c = collect(&st, sub, start).await?;
    drop(admission);
    let offset = echo.as_ref().map_or(0, String::len);
    let logprobs = top.map(|_| completion_logprobs(&st, &c, offset));
    let text = match echo {
        Some(mut p) => {
            p.push_str(&c.text);
            p
        }
        None => c.text.clone(),
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
        usage: Some(api::Usage::new(c.prompt_tokens, c.completion_tokens)),
    })
    .into_response())
}
