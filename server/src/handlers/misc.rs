//! The small endpoints: authentication, health, metrics, models, tokenize and detokenize.

use axum::extract::{Request, State};
use axum::http::{header, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::{check_ids, finish, parse, Body, St};
use crate::api;
use crate::error::ApiError;

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
        st.metrics
            .render(gauges, st.backend.get().map(|b| b.memory()), in_flight),
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
