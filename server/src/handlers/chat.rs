//! `POST /v1/chat/completions`: messages through the chat template, structured output, tool
//! calls, whole or streamed answers.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use model::tokenizer::attr;
use serde_json::{json, Value};

use super::{
    check_model, collect, generation, parse, piece_text, response_constraint, settings, sse_json,
    stream_response, Body, St, StreamItem, MAX_TOP_LOGPROBS,
};
use crate::api::{self, Content};
use crate::engine::{Backend, Finish, Logprob, TokenConstraint};
use crate::error::ApiError;
use crate::tools::{self, Choice, MarkerToken, Tool, ToolFormat};
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

/// What a request's tools ask of the prompt, the grammar and the answer.
#[derive(Debug)]
struct ToolUse {
    format: ToolFormat,
    tools: Vec<Tool>,
    choice: Choice,
    parallel: bool,
}

impl ToolUse {
    /// The checked `tools` and `tool_choice`; `None` when no tools are offered to the model.
    fn from_request(req: &api::ChatRequest, format: ToolFormat) -> Result<Option<Self>, ApiError> {
        let bad = |m: String| ApiError::bad_param("tools", m);
        let tools = req
            .tools
            .iter()
            .flatten()
            .map(|t| Tool::from_value(t).map_err(bad))
            .collect::<Result<Vec<_>, _>>()?;
        let choice = Choice::from_value(req.tool_choice.as_ref())
            .map_err(|m| ApiError::bad_param("tool_choice", m))?;
        match &choice {
            Choice::None => return Ok(None),
            Choice::Auto if tools.is_empty() => return Ok(None),
            Choice::Required | Choice::Named(_) if tools.is_empty() => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    "`tool_choice` asks for a call but `tools` is empty",
                ))
            }
            Choice::Named(n) if !tools.iter().any(|t| &t.name == n) => {
                return Err(ApiError::bad_param(
                    "tool_choice",
                    format!("`tool_choice` names `{n}`, which is not among `tools`"),
                ))
            }
            _ => {}
        }
        if tools
            .iter()
            .enumerate()
            .any(|(i, t)| tools[..i].iter().any(|u| u.name == t.name))
        {
            return Err(bad("two tools have the same name".into()));
        }
        Ok(Some(Self {
            format,
            tools,
            choice,
            parallel: req.parallel_tool_calls == Some(true),
        }))
    }

    fn forced(&self) -> bool {
        matches!(self.choice, Choice::Required | Choice::Named(_))
    }

    /// The grammar that makes the answer a call of the allowed tools.
    fn constraint(&self, b: &Backend) -> Result<Option<Box<dyn TokenConstraint>>, ApiError> {
        if !self.forced() {
            return Ok(None);
        }
        let allowed: Vec<&Tool> = match &self.choice {
            Choice::Named(n) => self.tools.iter().filter(|t| &t.name == n).collect(),
            _ => self.tools.iter().collect(),
        };
        let tok = b.text().tokenizer();
        let marker = match self.format.marker().map(|m| tok.encode(m, false, true)) {
            Some(ids) if ids.len() == 1 && tok.token_attr(ids[0]) & attr::CONTROL != 0 => {
                MarkerToken::Special(ids[0])
            }
            _ => MarkerToken::Text,
        };
        let grammar = tools::call_grammar(self.format, &allowed, marker, self.parallel);
        let grammars = b.grammars().map_err(ApiError::internal)?;
        let c = grammars.lark(grammar).map_err(|e| {
            ApiError::bad_param(
                "tools",
                format!("a tool's parameter schema is not usable: {e}"),
            )
        })?;
        Ok(Some(Box::new(c)))
    }
}

/// A call argument text as templates want it: the parsed object (Hugging Face templates write
/// `arguments | tojson`), or the text when it is not JSON.
fn arguments_value(a: &Value) -> Value {
    match a {
        Value::String(s) => serde_json::from_str(s).unwrap_or_else(|_| a.clone()),
        other => other.clone(),
    }
}

/// The conversation as the template gets it. Templates that know no tool calls get the calls
/// written in the model's own syntax and tool results as user turns.
fn chat_messages(
    msgs: &[api::Message],
    template_src: Option<&str>,
    format: ToolFormat,
) -> Result<Vec<Value>, ApiError> {
    if msgs.is_empty() {
        return Err(ApiError::bad_param("messages", "`messages` is empty"));
    }
    let native = template_src.is_some_and(|s| s.contains("tool_calls"));
    msgs.iter()
        .map(|m| {
            let role = match m.role.as_str() {
                "system" | "developer" => "system",
                "user" => "user",
                "assistant" => "assistant",
                "tool" => "tool",
                other => {
                    return Err(ApiError::bad_param(
                        "messages",
                        format!("message role `{other}` is not supported (system, developer, user, assistant, tool)"),
                    ))
                }
            };
            let text = message_text(m)?;
            let calls: Vec<Value> = m
                .tool_calls
                .iter()
                .flatten()
                .map(|c| {
                    let f = &c["function"];
                    match f["name"].as_str() {
                        Some(name) => Ok(json!({
                            "id": c["id"],
                            "type": "function",
                            "function": {"name": name, "arguments": arguments_value(&f["arguments"])},
                        })),
                        None => Err(ApiError::bad_param(
                            "messages",
                            "a tool call in `messages` has no `function.name`",
                        )),
                    }
                })
                .collect::<Result<_, _>>()?;
            if native {
                let mut v = json!({"role": role, "content": text});
                if !calls.is_empty() {
                    v["tool_calls"] = Value::from(calls);
                    if m.content.is_none() {
                        v["content"] = Value::Null;
                    }
                }
                if let Some(id) = &m.tool_call_id {
                    v["tool_call_id"] = json!(id);
                }
                if let Some(n) = &m.name {
                    v["name"] = json!(n);
                }
                return Ok(v);
            }
            if role == "tool" {
                let response = json!({"tool_response": {
                    "tool_call_id": m.tool_call_id, "name": m.name, "content": text}});
                return Ok(json!({"role": "user", "content": response.to_string()}));
            }
            let mut content = text;
            for c in &calls {
                let f = &c["function"];
                if !content.is_empty() {
                    content.push('\n');
                }
                content.push_str(&tools::call_text(
                    format,
                    f["name"].as_str().unwrap_or(""),
                    &f["arguments"],
                ));
            }
            Ok(json!({"role": role, "content": content}))
        })
        .collect()
}

/// Offers the tools: as the template's `tools` when it uses them, else described in the system
/// message (the generic format).
fn offer_tools(
    messages: &mut Vec<Value>,
    template_src: Option<&str>,
    tu: &ToolUse,
) -> Option<Vec<Value>> {
    if template_src.is_some_and(|s| s.contains("tools")) {
        return Some(tu.tools.iter().map(|t| t.definition.clone()).collect());
    }
    let text = tools::generic_system_prompt(&tu.tools, &tu.choice);
    match messages.first_mut() {
        Some(m) if m["role"] == "system" => {
            let old = m["content"].as_str().unwrap_or("").to_owned();
            m["content"] = json!(format!("{old}\n\n{text}").trim_start().to_owned());
        }
        _ => messages.insert(0, json!({"role": "system", "content": text})),
    }
    None
}

/// The answer's calls with their ids.
fn tool_calls_out(st: &AppState, calls: Vec<tools::ToolCall>) -> Vec<api::ToolCallOut> {
    calls
        .into_iter()
        .map(|c| api::ToolCallOut {
            id: c.id.unwrap_or_else(|| format!("call_{}", st.next_id())),
            kind: "function",
            function: api::FunctionCall {
                name: c.name,
                arguments: c.arguments,
            },
        })
        .collect()
}

/// A streamed answer's tool-call state: content is sent until a call may start, the rest is
/// held and parsed at the end.
#[derive(Debug)]
struct ToolStream {
    format: ToolFormat,
    forced: bool,
    text: String,
    sent: usize,
}

impl ToolStream {
    /// Adds new text; returns what can be sent as content now.
    fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        let hold = if self.forced {
            Some(0)
        } else {
            tools::hold_from(self.format, &self.text)
        };
        let upto = hold.unwrap_or(self.text.len()).max(self.sent);
        let out = self.text[self.sent..upto].to_owned();
        self.sent = upto;
        out
    }

    /// At the end: the held text, parsed.
    fn finish(&mut self, last: &str) -> tools::Parsed {
        self.text.push_str(last);
        let held = &self.text[self.sent..];
        let p = tools::parse(self.format, held);
        if p.calls.is_empty() {
            // Not a call after all: the held text is content, as it was written.
            return tools::Parsed {
                content: held.to_owned(),
                calls: Vec::new(),
            };
        }
        p
    }
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
    let template = b.text().chat_template();
    let src = template.source();
    let format = ToolFormat::detect(src);
    let tool_use = ToolUse::from_request(&req, format)?;
    let mut messages = chat_messages(&req.messages, src, format)?;
    let offered = tool_use
        .as_ref()
        .and_then(|tu| offer_tools(&mut messages, src, tu));
    let rendered = template
        .render_json(&messages, offered.as_deref(), true)
        .map_err(|e| ApiError::bad_param("messages", format!("the chat template failed: {e}")))?;
    let prompt = b.text().encode_chat(&rendered)?;
    let mut g = generation(prompt, &s, b.n_ctx(), top)?;
    g.stop_strings.extend(template.stop_strings());
    g.constraint = match &tool_use {
        Some(tu) if tu.forced() => {
            if req
                .response_format
                .as_ref()
                .is_some_and(|f| f.kind != "text")
            {
                return Err(ApiError::bad_param(
                    "response_format",
                    "`response_format` cannot be combined with a required tool call",
                ));
            }
            tu.constraint(b)?
        }
        _ => response_constraint(b, req.response_format.as_ref())?,
    };
    let admission = st.admit()?;
    let n_prompt = g.prompt.len();
    let sub = b.submit(g)?;
    let id = format!("chatcmpl-{}", st.next_id());
    let created = unix_now();
    let model = st.opts.model_id.clone();
    tracing::info!(%id, prompt_tokens = n_prompt, stream = s.stream, tools = tool_use.as_ref().map_or(0, |t| t.tools.len()), "chat request");
    if st.opts.log_prompts {
        tracing::info!(%id, prompt = %rendered, "chat prompt");
    }
    if s.stream {
        let include_usage = s.include_usage;
        let want_lp = top.is_some();
        let st2 = Arc::clone(&st);
        let mut tool_stream = tool_use.as_ref().map(|tu| ToolStream {
            format: tu.format,
            forced: tu.forced(),
            text: String::new(),
            sent: 0,
        });
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
        let delta =
            |content: Option<String>, calls: Option<Vec<api::ToolCallDelta>>| api::ChunkChoice {
                index: 0,
                delta: api::Delta {
                    role: None,
                    content,
                    tool_calls: calls,
                },
                logprobs: None,
                finish_reason: None,
            };
        let make = move |item: StreamItem<'_>| match item {
            StreamItem::Start => vec![chunk(
                vec![api::ChunkChoice {
                    delta: api::Delta {
                        role: Some("assistant"),
                        content: Some(String::new()),
                        tool_calls: None,
                    },
                    ..delta(None, None)
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
                let text = match &mut tool_stream {
                    Some(ts) => ts.push(text),
                    None => text.to_owned(),
                };
                if text.is_empty() && lp.is_none() {
                    return Vec::new();
                }
                vec![chunk(
                    vec![api::ChunkChoice {
                        logprobs: lp,
                        ..delta(Some(text), None)
                    }],
                    None,
                )]
            }
            StreamItem::Done {
                text,
                finish,
                usage,
            } => {
                let mut out = Vec::new();
                let mut finish_reason = finish.as_str();
                let last = match &mut tool_stream {
                    Some(ts) => {
                        let p = ts.finish(text);
                        if !p.calls.is_empty() {
                            finish_reason = "tool_calls";
                            if !p.content.is_empty() {
                                out.push(chunk(vec![delta(Some(p.content), None)], None));
                            }
                            for (i, c) in tool_calls_out(&st2, p.calls).into_iter().enumerate() {
                                // As OpenAI streams them: id and name first, then the arguments.
                                let head = api::ToolCallDelta {
                                    index: i,
                                    id: Some(c.id),
                                    kind: Some("function"),
                                    function: api::FunctionDelta {
                                        name: Some(c.function.name),
                                        arguments: String::new(),
                                    },
                                };
                                let args = api::ToolCallDelta {
                                    index: i,
                                    id: None,
                                    kind: None,
                                    function: api::FunctionDelta {
                                        name: None,
                                        arguments: c.function.arguments,
                                    },
                                };
                                out.push(chunk(vec![delta(None, Some(vec![head]))], None));
                                out.push(chunk(vec![delta(None, Some(vec![args]))], None));
                            }
                            String::new()
                        } else {
                            p.content
                        }
                    }
                    None => text.to_owned(),
                };
                out.push(chunk(
                    vec![api::ChunkChoice {
                        finish_reason: Some(finish_reason),
                        ..delta((!last.is_empty()).then_some(last), None)
                    }],
                    None,
                ));
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
    let mut finish_reason = c.finish.unwrap_or(Finish::Stop).as_str();
    let (content, tool_calls) = match &tool_use {
        Some(tu) => {
            let p = tools::parse(tu.format, &c.text);
            if p.calls.is_empty() {
                (Some(c.text), None)
            } else {
                finish_reason = "tool_calls";
                (
                    (!p.content.is_empty()).then_some(p.content),
                    Some(tool_calls_out(&st, p.calls)),
                )
            }
        }
        None => (Some(c.text), None),
    };
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
                content,
                tool_calls,
            },
            logprobs,
            finish_reason,
        }],
        usage: api::Usage::new(c.prompt_tokens, c.completion_tokens),
    })
    .into_response())
}
