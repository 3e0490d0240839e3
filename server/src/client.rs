//! A small HTTP/1.1 client for OpenAI-style servers (ours or llama.cpp's): JSON requests and
//! server-sent-event streams, one connection per request. The load generator uses it.

use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1;
use hyper::{header, Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::error::ServerError;

/// A server's address and key.
#[derive(Debug, Clone)]
pub struct Client {
    host: String,
    port: u16,
    api_key: Option<String>,
    timeout: Duration,
}

/// A whole answer.
#[derive(Debug, Clone)]
pub struct Reply {
    /// The HTTP status.
    pub status: StatusCode,
    /// The `Retry-After` header, when present.
    pub retry_after: Option<String>,
    /// The `Content-Type` header, when present.
    pub content_type: Option<String>,
    /// The body.
    pub body: Bytes,
}

impl Reply {
    /// The body as JSON.
    pub fn json(&self) -> Result<Value, ServerError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            ServerError::Http(format!(
                "answer is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            ))
        })
    }
}

fn http_err(what: &str, e: impl std::fmt::Display) -> ServerError {
    ServerError::Http(format!("{what}: {e}"))
}

impl Client {
    /// A client for `http://HOST:PORT` (a trailing path is ignored; no TLS).
    pub fn new(url: &str, api_key: Option<String>) -> Result<Self, ServerError> {
        let rest = url.strip_prefix("http://").ok_or_else(|| {
            ServerError::InvalidArgument(format!("`{url}`: only http:// URLs are supported"))
        })?;
        let authority = rest.split('/').next().unwrap_or(rest);
        let (host, port) = match authority.rsplit_once(':') {
            Some((h, p)) => (
                h.to_owned(),
                p.parse::<u16>().map_err(|_| {
                    ServerError::InvalidArgument(format!("`{url}`: bad port `{p}`"))
                })?,
            ),
            None => (authority.to_owned(), 80),
        };
        if host.is_empty() {
            return Err(ServerError::InvalidArgument(format!("`{url}`: no host")));
        }
        Ok(Self {
            host,
            port,
            api_key,
            timeout: Duration::from_secs(600),
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<hyper::Response<hyper::body::Incoming>, ServerError> {
        let addr = format!("{}:{}", self.host, self.port);
        let tcp = tokio::net::TcpStream::connect(&addr)
            .await
            .map_err(|e| http_err(&format!("connecting to {addr}"), e))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| http_err("handshake", e))?;
        tokio::spawn(async move {
            // The connection ends with the request; its errors surface through the response.
            let _ = conn.await;
        });
        let mut req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, &addr);
        if let Some(k) = &self.api_key {
            req = req.header(header::AUTHORIZATION, format!("Bearer {k}"));
        }
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| http_err("building the request", e))?;
        tokio::time::timeout(self.timeout, sender.send_request(req))
            .await
            .map_err(|_| ServerError::Http(format!("{path}: no answer in {:?}", self.timeout)))?
            .map_err(|e| http_err(path, e))
    }

    /// Sends a request with raw body bytes and reads the whole answer.
    pub async fn raw(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Reply, ServerError> {
        let resp = self.send(method, path, body).await?;
        let header_str = |h: header::HeaderName| {
            resp.headers()
                .get(h)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let status = resp.status();
        let retry_after = header_str(header::RETRY_AFTER);
        let content_type = header_str(header::CONTENT_TYPE);
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| http_err(path, e))?
            .to_bytes();
        Ok(Reply {
            status,
            retry_after,
            content_type,
            body,
        })
    }

    /// `GET path`.
    pub async fn get(&self, path: &str) -> Result<Reply, ServerError> {
        self.raw(Method::GET, path, None).await
    }

    /// `POST path` with a JSON body.
    pub async fn post(&self, path: &str, body: &Value) -> Result<Reply, ServerError> {
        self.raw(Method::POST, path, Some(Bytes::from(body.to_string())))
            .await
    }

    /// `POST path` expecting server-sent events: `on_data` gets each event's data (`[DONE]`
    /// included) and returns false to hang up. A non-2xx answer is returned whole as `Err`.
    pub async fn stream(
        &self,
        path: &str,
        body: &Value,
        mut on_data: impl FnMut(&str) -> bool,
    ) -> Result<(), StreamError> {
        let resp = self
            .send(Method::POST, path, Some(Bytes::from(body.to_string())))
            .await?;
        let status = resp.status();
        let mut body = resp.into_body();
        if !status.is_success() {
            let bytes = body
                .collect()
                .await
                .map_err(|e| http_err(path, e))?
                .to_bytes();
            return Err(StreamError::Status {
                status,
                body: bytes,
            });
        }
        let mut buf: Vec<u8> = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| http_err(path, e))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            while let Some(end) = find_event_end(&buf) {
                let event: Vec<u8> = buf.drain(..end.0 + end.1).collect();
                let text = String::from_utf8_lossy(&event[..end.0]);
                for line in text.lines() {
                    let Some(data) = line.strip_prefix("data:") else {
                        continue;
                    };
                    if !on_data(data.strip_prefix(' ').unwrap_or(data)) {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }
}

/// Where the first event ends: (its length, the separator's length).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// Why a stream failed.
#[derive(Debug, thiserror::Error)]
pub enum StreamError {
    /// The exchange failed.
    #[error(transparent)]
    Client(#[from] ServerError),
    /// The server answered with an error status.
    #[error("HTTP {status}: {}", String::from_utf8_lossy(body))]
    Status {
        /// The status.
        status: StatusCode,
        /// The error body.
        body: Bytes,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let c = Client::new("http://127.0.0.1:8080/v1", None).expect("url");
        assert_eq!((c.host.as_str(), c.port), ("127.0.0.1", 8080));
        assert!(Client::new("https://x:1", None).is_err());
        assert!(Client::new("http://x:port", None).is_err());
    }

    #[test]
    fn event_boundaries() {
        assert_eq!(find_event_end(b"data: 1\n\ndata: 2"), Some((7, 2)));
        assert_eq!(find_event_end(b"data: 1\r\n\r\n"), Some((7, 4)));
        assert_eq!(find_event_end(b"data: 1\n"), None);
    }
}
