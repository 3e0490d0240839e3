//! `POST /v1/chat/completions`: messages through the chat template, structured output, tool
//! calls, whole or streamed answers.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use model::chat::ChatMessage;

use super::{
    check_model, collect, generation, parse, piece_text, response_constraint, settings, sse_json,
    stream_response, Body, St, StreamItem, MAX_TOP_LOGPROBS,
};
use crate::api::{self, Content};
use crate::engine::{Finish, Logprob};
use crate::error::ApiError;
use crate::{unix_now, AppState};

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
