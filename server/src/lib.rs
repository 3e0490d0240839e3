#![doc = include_str!("../README.md")]
#![warn(missing_docs)]

pub mod api;
pub mod bench;
#[cfg(feature = "cli")]
pub mod cli;
pub mod client;
pub mod constraint;
pub mod engine;
pub mod error;
mod handlers;
pub mod metrics;
pub mod tools;

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use tower_http::trace::{DefaultMakeSpan, DefaultOnFailure, DefaultOnResponse, TraceLayer};
use tracing::Level;

pub use engine::{Backend, BackendOptions};
pub use error::{ApiError, ServerError};

/// Settings of the HTTP side.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The model id clients name (`GET /v1/models`).
    pub model_id: String,
    /// Requests must carry `Authorization: Bearer KEY` (except `/health`).
    pub api_key: Option<String>,
    /// Generations admitted beyond the engine's slots before 503 (the queue's bound).
    pub max_queue: usize,
    /// Sequences the engine decodes together.
    pub parallel: usize,
    /// Largest request body in bytes.
    pub body_limit: usize,
    /// Log each request's prompt text (at info); off by default, prompts are private.
    pub log_prompts: bool,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            model_id: "model".into(),
            api_key: None,
            max_queue: 64,
            parallel: 4,
            body_limit: 4 << 20,
            log_prompts: false,
        }
    }
}

/// Shared state of the handlers.
#[derive(Debug)]
struct AppState {
    opts: ServerOptions,
    backend: OnceLock<Backend>,
    load_error: OnceLock<String>,
    metrics: metrics::Metrics,
    in_flight: AtomicUsize,
    next_id: AtomicU64,
    created: u64,
}

/// The server: state shared by its routes; the model is attached when loaded.
#[derive(Debug, Clone)]
pub struct Server {
    state: Arc<AppState>,
}

/// A generation admitted past the queue bound; dropping it gives the place back.
#[derive(Debug)]
struct Admission {
    state: Arc<AppState>,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl AppState {
    fn backend(&self) -> Result<&Backend, ApiError> {
        match self.backend.get() {
            Some(b) => Ok(b),
            None => match self.load_error.get() {
                Some(e) => Err(ApiError::internal(format!("the model failed to load: {e}"))),
                None => Err(ApiError::loading()),
            },
        }
    }

    /// A place among the running and queued generations, or 503.
    fn admit(self: &Arc<Self>) -> Result<Admission, ApiError> {
        let cap = self.opts.parallel + self.opts.max_queue;
        let prev = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let admission = Admission {
            state: Arc::clone(self),
        };
        if prev >= cap {
            drop(admission);
            self.metrics.rejected_busy();
            return Err(ApiError::overloaded(1));
        }
        Ok(admission)
    }

    fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

impl Server {
    /// A server without a model yet (`/health` says loading).
    pub fn new(opts: ServerOptions) -> Self {
        Self {
            state: Arc::new(AppState {
                opts,
                backend: OnceLock::new(),
                load_error: OnceLock::new(),
                metrics: metrics::Metrics::default(),
                in_flight: AtomicUsize::new(0),
                next_id: AtomicU64::new(1),
                created: unix_now(),
            }),
        }
    }

    /// Attaches the loaded model; requests are served from now on.
    pub fn set_ready(&self, backend: Backend) {
        if let Err(b) = self.state.backend.set(backend) {
            // A second model for the same server is a caller bug; keep the first.
            b.shutdown();
        }
    }

    /// Records that loading failed; `/health` and every model endpoint report it.
    pub fn set_failed(&self, error: String) {
        let _ = self.state.load_error.set(error);
    }

    /// The engine, once loaded.
    pub fn backend(&self) -> Option<&Backend> {
        self.state.backend.get()
    }

    /// The routes, with authentication, the body limit and request tracing.
    pub fn router(&self) -> Router {
        let st = Arc::clone(&self.state);
        Router::new()
            .route("/v1/chat/completions", post(handlers::chat))
            .route("/v1/completions", post(handlers::completions))
            .route("/v1/embeddings", post(handlers::embeddings))
            .route("/v1/models", get(handlers::models))
            .route("/tokenize", post(handlers::tokenize))
            .route("/detokenize", post(handlers::detokenize))
            .route("/metrics", get(handlers::metrics))
            .route("/health", get(handlers::health))
            .fallback(handlers::fallback)
            .layer(axum::middleware::from_fn_with_state(
                Arc::clone(&st),
                handlers::auth,
            ))
            .layer(DefaultBodyLimit::max(st.opts.body_limit))
            .layer(
                // Method, path, status and latency at info (`ROCMFORGE_LOG=info`); bodies, and
                // so prompts, are never logged. 4xx/5xx answers are the clients' business.
                TraceLayer::new_for_http()
                    .make_span_with(DefaultMakeSpan::new().level(Level::INFO))
                    .on_response(DefaultOnResponse::new().level(Level::INFO))
                    .on_failure(DefaultOnFailure::new().level(Level::DEBUG)),
            )
            .with_state(st)
    }

    /// Serves on `listener` until `shutdown` completes.
    pub async fn serve(
        &self,
        listener: tokio::net::TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), ServerError> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|source| ServerError::Io {
                what: "serving HTTP".into(),
                source,
            })
    }
}
