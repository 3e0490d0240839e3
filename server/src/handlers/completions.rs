//! `POST /v1/completions`: a raw prompt (text or token ids), `echo` and legacy logprobs.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use super::{
    check_ids, check_model, collect, generation, parse, piece_text, settings, sse_json,
    stream_response, Body, Collected, St, StreamItem,
};
use crate::api;
use crate::engine::Finish;
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
