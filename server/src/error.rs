//! The crate's errors: [`ServerError`] for starting and running the server, [`ApiError`] for one
//! request, answered as an OpenAI-style error object with the matching HTTP status.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use model::ModelError;

/// Everything that can stop the server or the load generator.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServerError {
    /// Loading or starting the model failed.
    #[error(transparent)]
    Model(#[from] ModelError),
    /// Binding, accepting or talking to a socket failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done (`binding 127.0.0.1:8080`...).
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An HTTP exchange failed (load generator and client).
    #[error("http: {0}")]
    Http(String),
    /// A setting is out of range.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

/// One failed request: HTTP status and OpenAI's `{"error": {message, type, param, code}}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong, for people.
    pub message: String,
    /// OpenAI's error type (`invalid_request_error`...).
    pub kind: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`...).
    pub code: Option<&'static str>,
    /// Seconds to wait before retrying (503 answers).
    pub retry_after: Option<u32>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400: the request is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            message.into(),
        )
    }

    /// 400 naming the field at fault.
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        let mut e = Self::bad_request(message);
        e.param = Some(param.to_owned());
        e
    }

    /// 404 for a model this server does not serve.
    pub fn unknown_model(name: &str, served: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("the model `{name}` does not exist; this server serves `{served}`"),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 404 for an unknown path.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no endpoint `{path}`"),
        )
    }

    /// 401 without the right bearer key.
    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or wrong API key (send `Authorization: Bearer KEY`)",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 503 with Retry-After: every slot and queue place is taken.
    pub fn overloaded(retry_after: u32) -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "the server is at capacity (all slots and queue places taken); retry later",
        );
        e.code = Some("server_overloaded");
        e.retry_after = Some(retry_after);
        e
    }

    /// 503 while the model loads.
    pub fn loading() -> Self {
        let mut e = Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "loading model",
        );
        e.retry_after = Some(1);
        e
    }

    /// 500: the server failed (never the request's fault).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            message.into(),
        )
    }

    /// A prompt (plus answer) that cannot fit a sequence's context.
    pub fn context_length(needed: usize, n_ctx: usize) -> Self {
        let mut e = Self::bad_request(format!(
            "this model's context holds {n_ctx} tokens per request; the request needs {needed}"
        ));
        e.code = Some("context_length_exceeded");
        e
    }

    /// The error object as JSON.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl From<ModelError> for ApiError {
    /// Errors of the engine about one request: the request's fault where the engine refused
    /// its input, the server's otherwise.
    fn from(e: ModelError) -> Self {
        match e {
            ModelError::ContextFull { needed, n_ctx } => ApiError::context_length(needed, n_ctx),
            ModelError::InvalidArgument(m) => ApiError::bad_request(m),
            e @ ModelError::BadToken { .. } => ApiError::bad_param("prompt", e.to_string()),
            e => ApiError::internal(e.to_string()),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        r
    }
}
