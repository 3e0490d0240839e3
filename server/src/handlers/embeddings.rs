//! `POST /v1/embeddings`: pooled, unit-length hidden states of texts or token lists.

use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use base64::Engine as _;
use serde_json::{json, Value};

use super::{check_ids, check_model, finish, parse, Body, St};
use crate::api;
use crate::error::ApiError;
use crate::AppState;

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
