//! The server over real HTTP on the CPU: every endpoint, greedy answers equal to `generate`'s,
//! streaming, errors with their statuses, the API key, the bounded queue, concurrent streams,
//! cancellation freeing the KV cache, and arbitrary request bodies.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use hyper::{Method, StatusCode};
use rocmforge_server::client::{Client, StreamError};
use rocmforge_server::ServerOptions;
use serde_json::{json, Value};

use common::{chat_prompt, greedy_reference, start, synth_model, TestServer};

/// Sends a request (POST with a body, GET without), checks the answer's status and returns its
/// JSON.
async fn call<'a>(
    c: &Client,
    path: &str,
    body: impl Into<Option<&'a Value>>,
    status: StatusCode,
) -> Value {
    let body = body.into();
    let r = match body {
        Some(b) => c.post(path, b).await,
        None => c.get(path).await,
    }
    .expect("request");
    assert_eq!(r.status, status, "{path} {body:?}: {:?}", r.body);
    r.json().expect("JSON answer")
}

/// Streams a request and returns the concatenated text of its chunks (chat deltas or
/// completion texts), the finish reason and the number of `[DONE]` markers.
async fn stream_text(c: &Client, path: &str, body: Value) -> (String, Option<String>, usize) {
    let mut text = String::new();
    let mut finish = None;
    let mut done = 0;
    c.stream(path, &body, |data| {
        if data == "[DONE]" {
            done += 1;
            return true;
        }
        let v: Value = serde_json::from_str(data).expect("chunk is JSON");
        assert!(v.get("error").is_none(), "error chunk: {v}");
        if let Some(ch) = v["choices"].get(0) {
            let piece = ch["delta"]["content"]
                .as_str()
                .or_else(|| ch["text"].as_str())
                .unwrap_or("");
            text.push_str(piece);
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
        }
        true
    })
    .await
    .expect("stream");
    (text, finish, done)
}

fn chat_body(user: &str, max_tokens: usize, stream: bool) -> Value {
    json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": user}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

fn check_greedy_chat(ts: &TestServer, path: &Path, user: &str, n: usize) {
    let (prompt, stops) = chat_prompt(path, user);
    let want = greedy_reference(path, &prompt, n, &stops);
    let c = ts.client(None);
    let v = ts.rt.block_on(call(
        &c,
        "/v1/chat/completions",
        &chat_body(user, n, false),
        StatusCode::OK,
    ));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], want.as_str());
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    let completion = v["usage"]["completion_tokens"].as_u64().expect("usage");
    assert!(completion as usize <= n);
    assert_eq!(
        v["usage"]["total_tokens"].as_u64(),
        Some(prompt.len() as u64 + completion)
    );
    let (text, finish, done) = ts.rt.block_on(stream_text(
        &c,
        "/v1/chat/completions",
        chat_body(user, n, true),
    ));
    assert_eq!(text, want, "streamed text differs from the whole answer");
    assert_eq!(finish.as_deref(), v["choices"][0]["finish_reason"].as_str());
    assert_eq!(done, 1);
}

#[test]
fn greedy_chat_equals_generate_synthetic() {
    let path = synth_model();
    let ts = start(&path, 2, ServerOptions::default());
    check_greedy_chat(&ts, &path, "Hello there", 24);
    ts.wait_idle();
}

#[test]
fn greedy_chat_equals_generate_gemma() {
    let Some(path) = common::real_model() else {
        return;
    };
    let ts = start(&path, 2, ServerOptions::default());
    check_greedy_chat(&ts, &path, "What is the capital of France?", 16);
    ts.wait_idle();
}

#[test]
fn endpoints() {
    let path = synth_model();
    let ts = start(&path, 2, ServerOptions::default());
    let c = ts.client(None);
    ts.rt.block_on(async {
        let h = call(&c, "/health", None, StatusCode::OK).await;
        assert_eq!(h["status"], "ok");

        let m = call(&c, "/v1/models", None, StatusCode::OK).await;
        assert_eq!(m["object"], "list");
        assert_eq!(m["data"][0]["id"], "test-model");

        let t = call(
            &c,
            "/tokenize",
            &json!({"content": "hello world", "add_special": false}),
            StatusCode::OK,
        )
        .await;
        let ids: Vec<u32> = t["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        assert!(!ids.is_empty());
        let d = call(&c, "/detokenize", &json!({"tokens": ids}), StatusCode::OK).await;
        assert_eq!(d["content"], "hello world");

        // Text and token-id prompts give the same greedy completion; echo repeats the prompt.
        let body = |prompt: Value, echo: bool| {
            json!({"model": "test-model", "prompt": prompt, "max_tokens": 8,
                   "temperature": 0, "echo": echo, "logprobs": 2})
        };
        let a = call(
            &c,
            "/v1/completions",
            &body(json!("hello world"), false),
            StatusCode::OK,
        )
        .await;
        assert_eq!(a["object"], "text_completion");
        let text = a["choices"][0]["text"].as_str().expect("text").to_owned();
        let lp = &a["choices"][0]["logprobs"];
        let n = a["usage"]["completion_tokens"].as_u64().expect("usage") as usize;
        assert_eq!(lp["token_logprobs"].as_array().expect("lps").len(), n);
        for (l, top) in lp["token_logprobs"]
            .as_array()
            .expect("lps")
            .iter()
            .zip(lp["top_logprobs"].as_array().expect("top"))
        {
            let l = l.as_f64().expect("logprob");
            assert!(l <= 0.0);
            let best = top
                .as_object()
                .expect("map")
                .values()
                .map(|v| v.as_f64().expect("lp"))
                .fold(f64::NEG_INFINITY, f64::max);
            // Greedy: no alternative is more likely than the chosen token (alternatives whose
            // text is the same, such as lone UTF-8 bytes, share one key of the map).
            assert!(best <= l + 1e-5, "{best} vs {l}");
        }
        let mut with_bos = vec![];
        let tk = call(
            &c,
            "/tokenize",
            &json!({"content": "hello world", "add_special": true}),
            StatusCode::OK,
        )
        .await;
        for x in tk["tokens"].as_array().expect("tokens") {
            with_bos.push(x.as_u64().expect("id"));
        }
        let b = call(
            &c,
            "/v1/completions",
            &body(json!(with_bos), true),
            StatusCode::OK,
        )
        .await;
        let echoed = b["choices"][0]["text"].as_str().expect("text");
        assert!(echoed.ends_with(&text), "{echoed:?} vs {text:?}");
        assert!(echoed.contains("hello world"), "{echoed:?}");

        let (streamed, finish, _) = stream_text(
            &c,
            "/v1/completions",
            json!({"prompt": "hello world", "max_tokens": 8, "temperature": 0, "stream": true}),
        )
        .await;
        assert_eq!(streamed, text);
        assert!(finish.is_some());

        // Chat logprobs and the usage chunk.
        let v = call(
            &c,
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                        "temperature": 0, "logprobs": true, "top_logprobs": 3}),
            StatusCode::OK,
        )
        .await;
        let content = v["choices"][0]["logprobs"]["content"]
            .as_array()
            .expect("lp");
        assert_eq!(
            content.len() as u64,
            v["usage"]["completion_tokens"].as_u64().expect("usage")
        );
        for e in content {
            assert_eq!(e["top_logprobs"].as_array().expect("top").len(), 3);
        }
        let mut usage_chunks = 0;
        c.stream(
            "/v1/chat/completions",
            &json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                    "stream": true, "stream_options": {"include_usage": true}}),
            |d| {
                if d != "[DONE]" {
                    let v: Value = serde_json::from_str(d).expect("json");
                    if v.get("usage").is_some_and(|u| !u.is_null()) {
                        assert_eq!(v["choices"].as_array().map(Vec::len), Some(0));
                        usage_chunks += 1;
                    }
                }
                true
            },
        )
        .await
        .expect("stream");
        assert_eq!(usage_chunks, 1);

        let metrics = c.get("/metrics").await.expect("metrics");
        let text = String::from_utf8_lossy(&metrics.body).into_owned();
        for name in [
            "rocmforge_requests_total{endpoint=\"chat\",status=\"ok\"} 2",
            "rocmforge_generation_tokens_total",
            "rocmforge_time_to_first_token_seconds_count",
            "rocmforge_inter_token_latency_seconds_bucket",
            "rocmforge_queue_length 0",
            "rocmforge_kv_blocks_free",
            "rocmforge_resident_bytes",
        ] {
            assert!(text.contains(name), "{name} missing from\n{text}");
        }
        // The CPU holds every weight and the whole KV pool of a CPU-only model.
        let gauge = |name: &str| -> u64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
                .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
        };
        let file = gguf::GgufFile::open(&path).expect("open");
        let weights: u64 = file.tensors().iter().map(|t| t.size).sum();
        assert_eq!(
            gauge("rocmforge_memory_used_bytes{device=\"cpu\",use=\"weights\"}"),
            weights
        );
        assert!(gauge("rocmforge_memory_used_bytes{device=\"cpu\",use=\"kv\"}") > 0);
    });
    ts.wait_idle();
}

/// Posts raw bytes and checks the answer is an OpenAI error object with `status`.
async fn expect_error(c: &Client, path: &str, body: &[u8], status: StatusCode) -> Value {
    let r = c
        .raw(Method::POST, path, Some(Bytes::copy_from_slice(body)))
        .await
        .expect("request");
    let v = r.json().expect("error body is JSON");
    assert_eq!(
        r.status,
        status,
        "{path} {}: {v}",
        String::from_utf8_lossy(body)
    );
    assert!(v["error"]["message"].is_string(), "{v}");
    assert!(v["error"]["type"].is_string(), "{v}");
    v
}

#[test]
fn errors_have_statuses_and_error_objects() {
    let path = synth_model();
    let ts = start(
        &path,
        1,
        ServerOptions {
            body_limit: 64 << 10,
            ..ServerOptions::default()
        },
    );
    let c = ts.client(None);
    let chat = "/v1/chat/completions";
    let bad = StatusCode::BAD_REQUEST;
    ts.rt.block_on(async {
        expect_error(&c, chat, b"{not json", bad).await;
        expect_error(&c, chat, b"\xff\xfe", bad).await;
        expect_error(&c, chat, br#"{"messages": "hi"}"#, bad).await;
        expect_error(&c, chat, br#"{"messages": []}"#, bad).await;
        let msgs = r#""messages": [{"role": "user", "content": "hi"}]"#;
        for (extra, param) in [
            (r#""max_tokens": -1"#, "max_tokens"),
            (r#""max_tokens": 100000000"#, "max_tokens"),
            (r#""temperature": "hot""#, ""),
            (r#""temperature": 9"#, "temperature"),
            (r#""top_p": 1.5"#, "top_p"),
            (r#""n": 2"#, "n"),
            (r#""top_logprobs": 3"#, "top_logprobs"),
            (
                r#""response_format": {"type": "json_schema"}"#,
                "response_format",
            ),
        ] {
            let body = format!("{{{msgs}, {extra}}}");
            let v = expect_error(&c, chat, body.as_bytes(), bad).await;
            if !param.is_empty() {
                assert_eq!(v["error"]["param"], param, "{body}: {v}");
            }
        }
        let v = expect_error(
            &c,
            chat,
            format!(r#"{{"model": "gpt-9", {msgs}}}"#).as_bytes(),
            StatusCode::NOT_FOUND,
        )
        .await;
        assert_eq!(v["error"]["code"], "model_not_found");
        let long = "word ".repeat(400);
        let v = expect_error(
            &c,
            chat,
            json!({"messages": [{"role": "user", "content": long}]})
                .to_string()
                .as_bytes(),
            bad,
        )
        .await;
        assert_eq!(v["error"]["code"], "context_length_exceeded");
        expect_error(
            &c,
            "/v1/completions",
            br#"{"prompt": [1, 2, 4000000000]}"#,
            bad,
        )
        .await;
        expect_error(&c, "/v1/completions", br#"{"prompt": ["a", "b"]}"#, bad).await;
        expect_error(&c, "/detokenize", br#"{"tokens": [99999999]}"#, bad).await;
        let huge = vec![b' '; 100 << 10];
        expect_error(&c, chat, &huge, StatusCode::PAYLOAD_TOO_LARGE).await;
        let v = call(&c, "/v1/nothing", None, StatusCode::NOT_FOUND).await;
        assert!(v["error"]["message"].is_string());
        // The server still answers after all that.
        call(&c, chat, &chat_body("hi", 2, false), StatusCode::OK).await;
    });
    ts.wait_idle();
}

#[test]
fn json_schema_output_parses_and_validates() {
    let path = synth_model();
    let ts = start(&path, 2, ServerOptions::default());
    let c = ts.client(None);
    let schema = json!({
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "ok": {"type": "boolean"}
        },
        "required": ["color", "ok"],
        "additionalProperties": false
    });
    let mut validated = 0;
    for (format, seed) in [
        (
            json!({"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}),
            1,
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "c", "schema": schema}}),
            2,
        ),
        (json!({"type": "json_object"}), 3),
    ] {
        let body = json!({
            "messages": [{"role": "user", "content": "Pick a color."}],
            "max_tokens": 60, "seed": seed, "temperature": 1.0,
            "response_format": format,
        });
        let v = ts
            .rt
            .block_on(call(&c, "/v1/chat/completions", &body, StatusCode::OK));
        let text = v["choices"][0]["message"]["content"]
            .as_str()
            .expect("text");
        let out: Value = match serde_json::from_str(text) {
            Ok(o) => o,
            // A random model may use up the budget inside an open string; what it wrote must
            // still be a prefix of valid JSON, and the answer says it was cut off.
            Err(e) if e.is_eof() => {
                assert_eq!(v["choices"][0]["finish_reason"], "length", "{text}");
                continue;
            }
            // JSON puts no bound on numbers (`1E0767`); serde_json's f64 does.
            Err(e) if e.to_string().starts_with("number out of range") => continue,
            Err(e) => panic!("not JSON ({e}): {text:?}"),
        };
        assert!(out.is_object(), "{text}");
        if format["type"] == "json_schema" {
            let color = out["color"].as_str().expect("color");
            assert!(["red", "green", "blue"].contains(&color), "{text}");
            assert!(out["ok"].is_boolean(), "{text}");
            assert_eq!(out.as_object().map(|o| o.len()), Some(2), "{text}");
            validated += 1;
        }
    }
    // The schema leaves little to choose, so its answers finish well within the budget.
    assert_eq!(validated, 2);
    ts.wait_idle();
}

#[test]
fn api_key_is_required() {
    let path = synth_model();
    let ts = start(
        &path,
        1,
        ServerOptions {
            api_key: Some("sekrit".into()),
            ..ServerOptions::default()
        },
    );
    ts.rt.block_on(async {
        let none = ts.client(None);
        let wrong = ts.client(Some("guess"));
        let right = ts.client(Some("sekrit"));
        let chat = "/v1/chat/completions";
        call(&none, "/health", None, StatusCode::OK).await;
        for c in [&none, &wrong] {
            let v = call(c, "/v1/models", None, StatusCode::UNAUTHORIZED).await;
            assert_eq!(v["error"]["code"], "invalid_api_key");
            let body = chat_body("hi", 2, false);
            call(c, chat, &body, StatusCode::UNAUTHORIZED).await;
        }
        call(&right, chat, &chat_body("hi", 2, false), StatusCode::OK).await;
    });
}

#[test]
fn full_queue_answers_503_with_retry_after() {
    let path = synth_model();
    let ts = start(
        &path,
        1,
        ServerOptions {
            max_queue: 0,
            ..ServerOptions::default()
        },
    );
    let c = ts.client(None);
    ts.rt.block_on(async {
        // One long stream holds the only place; it hangs up once the other request was refused.
        let (first_token_tx, first_token_rx) = tokio::sync::oneshot::channel::<()>();
        let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refused2 = Arc::clone(&refused);
        let c2 = c.clone();
        let long = tokio::spawn(async move {
            let mut tx = Some(first_token_tx);
            let body = json!({"prompt": "a b c", "max_tokens": 80, "ignore_eos": true,
                              "stream": true});
            c2.stream("/v1/completions", &body, |_| {
                if let Some(t) = tx.take() {
                    let _ = t.send(());
                }
                !refused2.load(Ordering::Relaxed)
            })
            .await
        });
        first_token_rx.await.expect("first token");
        let r = c
            .post("/v1/chat/completions", &chat_body("hi", 2, false))
            .await
            .expect("request");
        assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.retry_after.as_deref(), Some("1"));
        assert_eq!(
            r.json().expect("json")["error"]["code"],
            "server_overloaded"
        );
        refused.store(true, Ordering::Relaxed);
        long.await.expect("task").expect("stream");
    });
    ts.wait_idle();
}

#[test]
fn concurrent_streams_match_alone_and_cancel_frees_kv() {
    let path = synth_model();
    let ts = start(&path, 8, ServerOptions::default());
    let c = ts.client(None);
    let prompts: Vec<String> = (0..32).map(|i| format!("story {i}: once")).collect();
    let body = |p: &str| {
        json!({"prompt": p, "max_tokens": 12, "temperature": 0, "ignore_eos": true,
               "stream": true})
    };
    ts.rt.block_on(async {
        let mut alone = Vec::new();
        for p in &prompts {
            alone.push(stream_text(&c, "/v1/completions", body(p)).await.0);
        }
        let tasks: Vec<_> = prompts
            .iter()
            .map(|p| {
                let c = c.clone();
                let b = body(p);
                tokio::spawn(async move { stream_text(&c, "/v1/completions", b).await.0 })
            })
            .collect();
        for (t, want) in tasks.into_iter().zip(&alone) {
            assert_eq!(&t.await.expect("task"), want);
        }

        // Half of the clients hang up after their first chunk.
        let hung_up = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = prompts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let c = c.clone();
                let hung_up = Arc::clone(&hung_up);
                let b = json!({"prompt": p, "max_tokens": 60, "ignore_eos": true,
                               "stream": true});
                tokio::spawn(async move {
                    let mut chunks = 0;
                    let r = c
                        .stream("/v1/completions", &b, |_| {
                            chunks += 1;
                            if i % 2 == 0 && chunks == 2 {
                                hung_up.fetch_add(1, Ordering::Relaxed);
                                return false;
                            }
                            true
                        })
                        .await;
                    match r {
                        Ok(()) => {}
                        Err(StreamError::Client(e)) => panic!("stream {i}: {e}"),
                        Err(e) => panic!("stream {i}: {e}"),
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
        assert_eq!(hung_up.load(Ordering::Relaxed), prompts.len() / 2);
    });
    let g = ts.wait_idle();
    assert!(g.kv_blocks_free > 0);
    let metrics = ts.rt.block_on(c.get("/metrics")).expect("metrics").body;
    let text = String::from_utf8_lossy(&metrics);
    assert!(text.contains("rocmforge_requests_in_flight 0"), "{text}");
}

mod bodies {
    use super::*;
    use proptest::prelude::*;

    fn scalar() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            (-3i64..200).prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (-5.0f64..5.0).prop_map(Value::from),
            "[a-z <>|]{0,12}".prop_map(Value::from),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        scalar().prop_recursive(3, 16, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
                prop::collection::btree_map("[a-z_]{1,8}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    /// Mostly plausible bodies: known fields with values of any type.
    fn body() -> impl Strategy<Value = Value> {
        let field = prop_oneof![
            Just("model"),
            Just("messages"),
            Just("prompt"),
            Just("max_tokens"),
            Just("temperature"),
            Just("top_p"),
            Just("top_k"),
            Just("stop"),
            Just("logprobs"),
            Just("top_logprobs"),
            Just("echo"),
            Just("n"),
            Just("seed"),
            Just("content"),
            Just("tokens"),
        ];
        let msg = ("[a-z]{0,10}", value())
            .prop_map(|(role, content)| json!({"role": role, "content": content}));
        (
            prop::collection::vec((field, value()), 0..6),
            prop::option::of(prop::collection::vec(msg, 0..3)),
            prop::option::of(0u32..6),
        )
            .prop_map(|(fields, msgs, max)| {
                let mut m = serde_json::Map::new();
                for (k, v) in fields {
                    m.insert(k.to_owned(), v);
                }
                if let Some(msgs) = msgs {
                    m.insert("messages".into(), Value::from(msgs));
                }
                // Keep generations short so the test stays fast.
                if let Some(n) = max {
                    m.insert("max_tokens".into(), Value::from(n));
                } else if m
                    .get("max_tokens")
                    .and_then(Value::as_i64)
                    .is_none_or(|n| n > 5)
                {
                    m.insert("max_tokens".into(), Value::from(3));
                }
                Value::Object(m)
            })
    }

    #[test]
    fn arbitrary_bodies_get_well_formed_answers() {
        let path = synth_model();
        let ts = start(&path, 2, ServerOptions::default());
        let c = ts.client(None);
        let endpoints = [
            "/v1/chat/completions",
            "/v1/completions",
            "/tokenize",
            "/detokenize",
        ];
        let cfg = ProptestConfig {
            cases: 48,
            failure_persistence: None,
            ..ProptestConfig::default()
        };
        proptest!(cfg, |(b in body(), e in 0usize..4, stream in any::<bool>())| {
            let mut b = b;
            if stream {
                b["stream"] = Value::Bool(true);
            }
            let r = ts.rt.block_on(c.post(endpoints[e], &b)).expect("answer");
            prop_assert!(
                r.status.is_success() || r.status.is_client_error(),
                "{} {b}: {} {:?}", endpoints[e], r.status, r.body
            );
            let is_sse = r.content_type.as_deref().is_some_and(|t| t.starts_with("text/event-stream"));
            if is_sse {
                let text = String::from_utf8_lossy(&r.body).into_owned();
                prop_assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
                for ev in text.split("\n\n").filter(|s| !s.trim().is_empty()) {
                    let data = ev.trim_start_matches("data: ");
                    if data != "[DONE]" {
                        let v: Value = serde_json::from_str(data).expect("chunk JSON");
                        prop_assert!(v.get("error").is_none(), "{v}");
                    }
                }
            } else {
                let v = r.json().expect("JSON answer");
                if !r.status.is_success() {
                    prop_assert!(v["error"]["message"].is_string(), "{v}");
                }
            }
        });
        ts.wait_idle();
    }
}

fn embeddings_of(v: &Value) -> Vec<Vec<f32>> {
    v["data"]
        .as_array()
        .expect("data")
        .iter()
        .enumerate()
        .map(|(i, d)| {
            assert_eq!(d["object"], "embedding");
            assert_eq!(d["index"], i);
            d["embedding"]
                .as_array()
                .expect("float embedding")
                .iter()
                .map(|x| x.as_f64().expect("number") as f32)
                .collect()
        })
        .collect()
}

#[test]
fn embeddings_are_unit_vectors_of_the_model_width() {
    let path = synth_model();
    let width = model::session::Model::load(&path, |_, _| {})
        .expect("load")
        .config()
        .n_embd;
    let ts = start(&path, 2, ServerOptions::default());
    let c = ts.client(None);
    let url = "/v1/embeddings";
    let bad = StatusCode::BAD_REQUEST;
    ts.rt.block_on(async {
        let post = |body: Value| {
            let c = &c;
            async move { call(c, url, &body, StatusCode::OK).await }
        };
        let one = post(json!({"model": "test-model", "input": "hello world"})).await;
        assert_eq!(one["object"], "list");
        assert_eq!(one["model"], "test-model");
        let n = one["usage"]["prompt_tokens"].as_u64().expect("usage");
        assert!(n > 0);
        assert_eq!(one["usage"]["total_tokens"], n);
        let e = embeddings_of(&one);
        assert_eq!(e.len(), 1);
        let batch = post(json!({"input": ["hello world", "another text here"]})).await;
        let b = embeddings_of(&batch);
        assert_eq!(b.len(), 2);
        for v in e.iter().chain(&b) {
            assert_eq!(v.len(), width);
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-4, "norm {norm}");
        }
        // The same text gives the same vector, alone or in a batch; another text does not.
        assert_eq!(b[0], e[0]);
        assert_ne!(b[1], e[0]);

        let b64 = post(json!({"input": "hello world", "encoding_format": "base64"})).await;
        let text = b64["data"][0]["embedding"].as_str().expect("base64 string");
        let bytes = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, text)
            .expect("valid base64");
        let floats: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert_eq!(floats, e[0]);

        let t = call(
            &c,
            "/tokenize",
            &json!({"content": "hello world", "add_special": true}),
            StatusCode::OK,
        )
        .await;
        let ids: Vec<u64> = t["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect();
        let by_ids = post(json!({"input": ids, "dimensions": width})).await;
        assert_eq!(embeddings_of(&by_ids), e);
        let lists = post(json!({"input": [ids, ids]})).await;
        assert_eq!(embeddings_of(&lists), vec![e[0].clone(), e[0].clone()]);

        for body in [
            json!({"input": ""}),
            json!({"input": []}),
            json!({"input": [[]]}),
            json!({"input": [1, 2, 99999999]}),
            json!({"input": "hi", "encoding_format": "hex"}),
            json!({"input": "hi", "dimensions": width + 1}),
            json!({"input": "word ".repeat(400)}),
        ] {
            expect_error(&c, url, body.to_string().as_bytes(), bad).await;
        }
        let v = expect_error(
            &c,
            url,
            br#"{"model": "gpt-9", "input": "hi"}"#,
            StatusCode::NOT_FOUND,
        )
        .await;
        assert_eq!(v["error"]["code"], "model_not_found");
    });
    ts.wait_idle();
}

fn with_pooling_type(path: &Path, pooling: u32) -> std::path::PathBuf {
    common::with_metadata(
        path,
        &format!("pool{pooling}"),
        "llama.pooling_type",
        pooling,
    )
}

async fn embed_ids(c: &Client, ids: &[u32]) -> Vec<f32> {
    let body = json!({ "input": ids });
    embeddings_of(&call(c, "/v1/embeddings", &body, StatusCode::OK).await).remove(0)
}

#[test]
fn embeddings_pool_as_the_model_file_says() {
    let path = synth_model();
    let ids = [5u32, 9, 13, 2];
    let mean = start(&path, 1, ServerOptions::default());
    let (mean_all, mean_first) = mean.rt.block_on(async {
        let c = mean.client(None);
        (embed_ids(&c, &ids).await, embed_ids(&c, &ids[..1]).await)
    });
    mean.wait_idle();
    // A causal model's first token sees only itself: its state is the one-token text's.
    let cls = start(&with_pooling_type(&path, 2), 1, ServerOptions::default());
    let first = cls
        .rt
        .block_on(async { embed_ids(&cls.client(None), &ids).await });
    cls.wait_idle();
    assert_eq!(first.len(), mean_first.len());
    for (a, b) in first.iter().zip(&mean_first) {
        assert!((a - b).abs() < 1e-4, "cls {a} vs the first token's {b}");
    }
    assert_ne!(first, mean_all);
    let last = start(&with_pooling_type(&path, 3), 1, ServerOptions::default());
    let v = last
        .rt
        .block_on(async { embed_ids(&last.client(None), &ids).await });
    last.wait_idle();
    assert_ne!(v, mean_all);
    assert_ne!(v, first);
}

/// A Hermes-style template (Qwen's markers) short enough for the synthetic model's
/// byte-level vocabulary: the tool names, then the turns with their calls and results.
const TOOL_TEMPLATE: &str =
    "{% if tools %}T:{% for t in tools %}{{ t.function.name }},{% endfor %}\n{% endif %}\
{% for m in messages %}{{ m.role }}:{{ m.content if m.content is string else '' }}\
{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}\
{% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %}\n{% endfor %}\
{% if add_generation_prompt %}A:{% endif %}";

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"],
            "additionalProperties": false,
        },
    }})
}

/// The call's arguments follow the tool's schema.
fn check_weather_arguments(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(call["id"].as_str().is_some_and(|s| !s.is_empty()), "{call}");
    assert_eq!(call["function"]["name"], "get_weather", "{call}");
    let text = call["function"]["arguments"]
        .as_str()
        .expect("arguments text");
    let args: Value = serde_json::from_str(text).expect("arguments are JSON");
    assert!(
        ["Paris", "Oslo"].contains(&args["city"].as_str().expect("city")),
        "{args}"
    );
    assert!(args["celsius"].is_boolean(), "{args}");
    assert_eq!(args.as_object().map(|o| o.len()), Some(2), "{args}");
}

#[test]
fn tools_reach_the_template_and_forced_calls_follow_the_schema() {
    let path = common::with_metadata(
        &synth_model(),
        "tools",
        "tokenizer.chat_template",
        TOOL_TEMPLATE,
    );
    let ts = start(&path, 2, ServerOptions::default());
    let c = ts.client(None);
    let url = "/v1/chat/completions";
    let tm = model::text::TextModel::load(&path, |_, _| {}).expect("load");
    let prompt_len = |msgs: &[Value], tools: Option<&[Value]>| {
        let text = tm
            .chat_template()
            .render_json(msgs, tools, true)
            .expect("render");
        tm.encode_chat(&text).expect("encode").len()
    };
    let user = json!({"role": "user", "content": "Weather?"});
    let tools = [weather_tool()];
    ts.rt.block_on(async {
        // The template gets the tools, and the conversation's calls and results.
        let history = vec![
            user.clone(),
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_9",
                   "type": "function", "function": {"name": "get_weather",
                   "arguments": "{\"city\":\"Oslo\",\"celsius\":true}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_9", "content": "-3"}),
        ];
        let mut hist_for_template = history.clone();
        hist_for_template[1]["tool_calls"][0]["function"]["arguments"] =
            json!({"city": "Oslo", "celsius": true});
        for (msgs, want) in [
            (
                vec![user.clone()],
                prompt_len(std::slice::from_ref(&user), Some(&tools)),
            ),
            (history, prompt_len(&hist_for_template, Some(&tools))),
        ] {
            let v = call(
                &c,
                url,
                &json!({"messages": msgs, "tools": tools, "max_tokens": 1}),
                StatusCode::OK,
            )
            .await;
            assert_eq!(v["usage"]["prompt_tokens"], want, "{v}");
        }
        // `tool_choice: none` offers no tools.
        let v = call(
            &c,
            url,
            &json!({"messages": [user], "tools": tools, "tool_choice": "none", "max_tokens": 1}),
            StatusCode::OK,
        )
        .await;
        assert_eq!(
            v["usage"]["prompt_tokens"],
            prompt_len(std::slice::from_ref(&user), None)
        );

        // A named call, sampled: the grammar makes every answer a valid call.
        for seed in [1, 2, 3] {
            let v = call(
                &c,
                url,
                &json!({"messages": [user], "tools": tools, "seed": seed, "temperature": 1.0,
                        "max_tokens": 110,
                        "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}),
                StatusCode::OK,
            )
            .await;
            let choice = &v["choices"][0];
            assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
            assert!(choice["message"]["content"].is_null(), "{v}");
            let calls = choice["message"]["tool_calls"].as_array().expect("calls");
            assert_eq!(calls.len(), 1, "{v}");
            check_weather_arguments(&calls[0]);
        }

        // Streamed, greedy: the deltas add up to the whole answer's call.
        let body = json!({"messages": [user], "tools": tools, "temperature": 0,
                          "max_tokens": 110, "tool_choice": "required"});
        let whole = call(&c, url, &body, StatusCode::OK).await;
        let want = &whole["choices"][0]["message"]["tool_calls"][0];
        check_weather_arguments(want);
        let mut body = body;
        body["stream"] = json!(true);
        let (mut id, mut name, mut args, mut finish) = (None, String::new(), String::new(), None);
        c.stream(url, &body, |d| {
            if d == "[DONE]" {
                return true;
            }
            let v: Value = serde_json::from_str(d).expect("chunk JSON");
            let ch = &v["choices"][0];
            assert!(
                ch["delta"]["content"].as_str().unwrap_or("").is_empty(),
                "{v}"
            );
            for tc in ch["delta"]["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(tc["index"], 0);
                if let Some(i) = tc["id"].as_str() {
                    id = Some(i.to_owned());
                    assert_eq!(tc["type"], "function");
                }
                name.push_str(tc["function"]["name"].as_str().unwrap_or(""));
                args.push_str(tc["function"]["arguments"].as_str().unwrap_or(""));
            }
            if let Some(f) = ch["finish_reason"].as_str() {
                finish = Some(f.to_owned());
            }
            true
        })
        .await
        .expect("stream");
        assert!(id.is_some());
        assert_eq!(name, "get_weather");
        assert_eq!(args, want["function"]["arguments"].as_str().expect("args"));
        assert_eq!(finish.as_deref(), Some("tool_calls"));

        // Bad tool requests are 400s naming the parameter.
        for (body, param) in [
            (
                json!({"messages": [user], "tools": [{"type": "function"}]}),
                "tools",
            ),
            (
                json!({"messages": [user], "tools": tools, "tool_choice": "always"}),
                "tool_choice",
            ),
            (
                json!({"messages": [user], "tool_choice": "required"}),
                "tool_choice",
            ),
            (
                json!({"messages": [user], "tools": tools,
                       "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
                "tool_choice",
            ),
            (
                json!({"messages": [user], "tools": [weather_tool(), weather_tool()]}),
                "tools",
            ),
        ] {
            let v = call(&c, url, &body, StatusCode::BAD_REQUEST).await;
            assert_eq!(v["error"]["param"], param, "{body}: {v}");
        }
    });
    ts.wait_idle();
}

#[test]
fn tool_call_grammars_compile_for_every_format() {
    use rocmforge_server::tools::{call_grammar, MarkerToken, Tool, ToolFormat};
    let tm = model::text::TextModel::load(synth_model(), |_, _| {}).expect("load");
    let g =
        rocmforge_server::constraint::Grammars::new(std::sync::Arc::new(tm.tokenizer().clone()))
            .expect("grammars");
    let weather = Tool::from_value(&weather_tool()).expect("tool");
    let other =
        Tool::from_value(&json!({"type": "function", "function": {"name": "now"}})).expect("tool");
    let eos = tm.tokenizer().eos().expect("eos");
    for f in [
        ToolFormat::Hermes,
        ToolFormat::Llama3,
        ToolFormat::Mistral,
        ToolFormat::Generic,
    ] {
        for (marker, parallel) in [
            (MarkerToken::Text, false),
            (MarkerToken::Special(eos), true),
        ] {
            let grammar = call_grammar(f, &[&weather, &other], marker, parallel);
            if let Err(e) = g.lark(grammar.clone()) {
                panic!("{f:?}: {e}\n{grammar}");
            }
        }
    }
}

/// The same alternatives up to the noise between a prefill and one-token decode steps (the
/// quantized kernels round activations per batch shape): the best log-probability agrees, and
/// so does every token both maps name (near-ties may swap which tokens make the list).
fn close_maps(a: &Value, b: &Value) -> bool {
    let (a, b) = (a.as_object().expect("map"), b.as_object().expect("map"));
    let close =
        |x: &Value, y: &Value| (x.as_f64().expect("lp") - y.as_f64().expect("lp")).abs() < 1e-2;
    let best = |m: &serde_json::Map<String, Value>| {
        m.values()
            .map(|v| v.as_f64().expect("lp"))
            .fold(f64::NEG_INFINITY, f64::max)
    };
    (best(a) - best(b)).abs() < 1e-2 && a.iter().all(|(k, v)| b.get(k).is_none_or(|w| close(v, w)))
}

#[test]
fn echo_with_logprobs_scores_the_prompt() {
    let path = synth_model();
    let ts = start(&path, 2, ServerOptions::default());
    let c = ts.client(None);
    let url = "/v1/completions";
    ts.rt.block_on(async {
        let ids: Vec<u64> = call(
            &c,
            "/tokenize",
            &json!({"content": "hello world", "add_special": true}),
            StatusCode::OK,
        )
        .await["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .map(|x| x.as_u64().expect("id"))
            .collect();
        let n = ids.len();
        let body = |echo: bool, stream: bool| {
            json!({"prompt": ids, "max_tokens": 6, "temperature": 0, "logprobs": 2,
                   "echo": echo, "stream": stream})
        };
        let plain = call(&c, url, &body(false, false), StatusCode::OK).await;
        let echoed = call(&c, url, &body(true, false), StatusCode::OK).await;
        let (p, e) = (&plain["choices"][0], &echoed["choices"][0]);
        let prompt_text = "hello world";
        assert_eq!(
            e["text"].as_str().expect("text"),
            format!("{prompt_text}{}", p["text"].as_str().expect("text"))
        );
        assert_eq!(echoed["usage"], plain["usage"]);
        let (pl, el) = (&p["logprobs"], &e["logprobs"]);
        let gen = pl["tokens"].as_array().expect("tokens").len();
        assert_eq!(el["tokens"].as_array().expect("tokens").len(), n + gen);
        assert!(el["token_logprobs"][0].is_null() && el["top_logprobs"][0].is_null());
        for i in 1..n {
            let lp = el["token_logprobs"][i].as_f64().expect("prompt logprob");
            assert!(lp <= 0.0 && lp.is_finite(), "{lp}");
        }
        // The generated part is what the plain request gave, offsets shifted by the echo.
        for j in 0..gen {
            assert_eq!(el["tokens"][n + j], pl["tokens"][j]);
            let (a, b) = (
                el["token_logprobs"][n + j].as_f64().expect("lp"),
                pl["token_logprobs"][j].as_f64().expect("lp"),
            );
            assert!((a - b).abs() < 1e-2, "{a} vs {b}");
            assert!(
                close_maps(&el["top_logprobs"][n + j], &pl["top_logprobs"][j]),
                "{} vs {}",
                el["top_logprobs"][n + j],
                pl["top_logprobs"][j]
            );
            assert_eq!(
                el["text_offset"][n + j].as_u64().expect("offset"),
                pl["text_offset"][j].as_u64().expect("offset") + prompt_text.len() as u64
            );
        }
        // A prompt position's distribution is the one the model has after the tokens before it.
        for i in 1..n {
            let next = call(
                &c,
                url,
                &json!({"prompt": &ids[..i], "max_tokens": 1, "temperature": 0, "logprobs": 2}),
                StatusCode::OK,
            )
            .await;
            let want = &next["choices"][0]["logprobs"]["top_logprobs"][0];
            assert!(close_maps(&el["top_logprobs"][i], want), "position {i}");
        }
        // Streamed: the same text, the echo's chunk carrying the prompt's logprobs.
        let mut text = String::new();
        let mut tokens = 0;
        c.stream(url, &body(true, true), |d| {
            if d != "[DONE]" {
                let v: Value = serde_json::from_str(d).expect("chunk");
                text.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
                tokens += v["choices"][0]["logprobs"]["tokens"]
                    .as_array()
                    .map_or(0, Vec::len);
            }
            true
        })
        .await
        .expect("stream");
        assert_eq!(text, e["text"].as_str().expect("text"));
        assert_eq!(tokens, n + gen);
        let v = call(
            &c,
            url,
            &json!({"prompt": "hi", "echo": true, "logprobs": 1, "stop": ["x"]}),
            StatusCode::BAD_REQUEST,
        )
        .await;
        assert_eq!(v["error"]["param"], "stop");
    });
    ts.wait_idle();
}
