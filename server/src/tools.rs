//! Tool calling: the tool-call syntax a model was trained on (chosen from its chat template),
//! parsing a generated text into content and calls, holding back streamed text that may start a
//! call, the grammar that forces a call (`tool_choice` required or named), and the rewriting of
//! tool messages for templates that know no tools.
//!
//! The formats are those llama.cpp's server recognises: Hermes/Qwen (`<tool_call>{json}
//! </tool_call>`), Llama 3.x (a bare `{"name": .., "parameters": ..}` object, optionally after
//! `<|python_tag|>`), Mistral (`[TOOL_CALLS][{..}, ..]`), and a generic JSON answer
//! (`{"tool_call": {..}}`, `{"tool_calls": [..]}` or `{"response": ".."}`) for every other model,
//! whose prompt then describes the tools in a system message. Output that does not parse as calls
//! is plain content: a malformed call never fails a request.

use serde_json::{json, Map, Value};

/// The tool-call syntax of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": .., "arguments": {..}}</tool_call>`, one block per call (Hermes 2
    /// Pro, Qwen 2.5/3, and templates that copy them).
    Hermes,
    /// `{"name": .., "parameters": {..}}`, optionally after `<|python_tag|>` (Llama 3.1-3.3).
    Llama3,
    /// `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]` (Mistral Nemo, Small, Large).
    Mistral,
    /// A JSON answer the system prompt asks for: `{"tool_call": {"name": .., "arguments": ..}}`
    /// or `{"response": ".."}`.
    Generic,
}

/// Marker texts of the formats that have one.
const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL_MARKER: &str = "[TOOL_CALLS]";

impl ToolFormat {
    /// The format a chat template was written for (`None`: a built-in format without tools).
    pub fn detect(template: Option<&str>) -> Self {
        let Some(src) = template else {
            return ToolFormat::Generic;
        };
        if src.contains(HERMES_OPEN) {
            ToolFormat::Hermes
        } else if src.contains(MISTRAL_MARKER) {
            ToolFormat::Mistral
        } else if src.contains(PYTHON_TAG)
            || (src.contains("<|start_header_id|>") && src.contains("ipython"))
        {
            ToolFormat::Llama3
        } else {
            ToolFormat::Generic
        }
    }

    /// The text that opens a call in this format, if it has one.
    pub fn marker(self) -> Option<&'static str> {
        match self {
            ToolFormat::Hermes => Some(HERMES_OPEN),
            ToolFormat::Llama3 => Some(PYTHON_TAG),
            ToolFormat::Mistral => Some(MISTRAL_MARKER),
            ToolFormat::Generic => None,
        }
    }

    /// Whether a call may also start as bare JSON at the very beginning of the answer.
    fn bare_json_start(self) -> bool {
        !matches!(self, ToolFormat::Hermes)
    }
}

/// One tool the client offers, checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// The JSON schema of its arguments (an object schema).
    pub parameters: Value,
    /// The definition as the client sent it (`{"type": "function", "function": {..}}`), for
    /// the chat template.
    pub definition: Value,
}

impl Tool {
    /// Reads one entry of `tools`; the error says what is wrong with it.
    pub fn from_value(v: &Value) -> Result<Self, String> {
        if v["type"] != "function" {
            return Err("every tool must have `type: \"function\"`".into());
        }
        let f = &v["function"];
        let name = f["name"]
            .as_str()
            .ok_or("every tool needs `function.name` (a string)")?;
        if name.is_empty()
            || name.len() > 64
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
        {
            return Err(format!(
                "tool name `{name}` must be 1 to 64 characters of a-z, A-Z, 0-9, _, - and ."
            ));
        }
        let parameters = match &f["parameters"] {
            Value::Null => json!({"type": "object", "properties": {}}),
            p @ Value::Object(_) => p.clone(),
            _ => {
                return Err(format!(
                    "`parameters` of tool `{name}` must be a JSON schema object"
                ))
            }
        };
        Ok(Self {
            name: name.to_owned(),
            parameters,
            definition: v.clone(),
        })
    }
}

/// A call parsed out of the model's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The id the model gave it (Mistral), else `None` (the server names it).
    pub id: Option<String>,
    /// The function's name.
    pub name: String,
    /// Its arguments as a JSON text.
    pub arguments: String,
}

/// A generated text split into what the user reads and the calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Text outside the calls (trimmed); empty when there is none.
    pub content: String,
    /// The calls, in order; empty when the text is a plain answer.
    pub calls: Vec<ToolCall>,
}

impl Parsed {
    fn plain(text: &str) -> Self {
        Self {
            content: text.to_owned(),
            calls: Vec::new(),
        }
    }
}

/// Splits a complete answer into content and calls; text that is not a well-formed call in the
/// model's format (nor in the generic JSON shape) stays content.
pub fn parse(format: ToolFormat, text: &str) -> Parsed {
    let specific = match format {
        ToolFormat::Hermes => parse_hermes(text),
        ToolFormat::Llama3 => parse_llama3(text),
        ToolFormat::Mistral => parse_mistral(text),
        ToolFormat::Generic => None,
    };
    specific
        .or_else(|| parse_generic(text))
        .unwrap_or_else(|| Parsed::plain(text))
}

/// Removes a Markdown code fence around `s`, as small models like to add.
fn unfence(s: &str) -> &str {
    let t = s.trim();
    match t.strip_prefix("```") {
        Some(rest) => {
            let rest = rest.strip_prefix("json").unwrap_or(rest);
            rest.strip_suffix("```").unwrap_or(rest).trim()
        }
        None => t,
    }
}

/// A call object: `name` and `arguments_key` (an object, or a string holding JSON).
fn call_from(v: &Value, arguments_keys: &[&str]) -> Option<ToolCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?;
    if name.is_empty() {
        return None;
    }
    let args = arguments_keys
        .iter()
        .find_map(|k| o.get(*k))
        .cloned()
        .unwrap_or_else(|| json!({}));
    let arguments = match args {
        Value::Object(_) => args.to_string(),
        Value::String(s) if serde_json::from_str::<Value>(&s).is_ok_and(|v| v.is_object()) => s,
        _ => return None,
    };
    let id = o
        .get("id")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_owned);
    Some(ToolCall {
        id,
        name: name.to_owned(),
        arguments,
    })
}

fn parse_hermes(text: &str) -> Option<Parsed> {
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(HERMES_OPEN) {
        content.push_str(&rest[..open]);
        let body = &rest[open + HERMES_OPEN.len()..];
        // A missing close tag is accepted at the very end (the stop token came first).
        let (inner, after) = match body.find(HERMES_CLOSE) {
            Some(close) => (&body[..close], &body[close + HERMES_CLOSE.len()..]),
            None => (body, ""),
        };
        let v: Value = serde_json::from_str(unfence(inner)).ok()?;
        calls.push(call_from(&v, &["arguments", "parameters"])?);
        rest = after;
    }
    if calls.is_empty() {
        return None;
    }
    content.push_str(rest);
    Some(Parsed {
        content: content.trim().to_owned(),
        calls,
    })
}

fn parse_llama3(text: &str) -> Option<Parsed> {
    let t = text.trim();
    let (content, body) = match t.find(PYTHON_TAG) {
        Some(i) => (t[..i].trim(), &t[i + PYTHON_TAG.len()..]),
        None => ("", t),
    };
    let body = unfence(body);
    // Several calls come as a JSON stream or separated by `;` (Llama 3.2's habit).
    let stream: Result<Vec<Value>, _> = serde_json::Deserializer::from_str(body)
        .into_iter::<Value>()
        .collect();
    let values = match stream {
        Ok(v) if !v.is_empty() => v,
        _ => body
            .split(';')
            .filter(|p| !p.trim().is_empty())
            .map(|p| serde_json::from_str::<Value>(p.trim()))
            .collect::<Result<Vec<_>, _>>()
            .ok()?,
    };
    let calls = values
        .iter()
        .map(|v| call_from(v, &["parameters", "arguments"]))
        .collect::<Option<Vec<_>>>()?;
    (!calls.is_empty()).then(|| Parsed {
        content: content.to_owned(),
        calls,
    })
}

fn parse_mistral(text: &str) -> Option<Parsed> {
    let t = text.trim();
    // The marker is a control token that detokenizes to nothing; a leading array is the same.
    let (content, body) = match t.find(MISTRAL_MARKER) {
        Some(i) => (t[..i].trim(), &t[i + MISTRAL_MARKER.len()..]),
        None if t.starts_with('[') => ("", t),
        None => return None,
    };
    let v: Value = serde_json::from_str(unfence(body)).ok()?;
    let items = match v {
        Value::Array(a) => a,
        o @ Value::Object(_) => vec![o],
        _ => return None,
    };
    let calls = items
        .iter()
        .map(|c| call_from(c, &["arguments", "parameters"]))
        .collect::<Option<Vec<_>>>()?;
    (!calls.is_empty()).then(|| Parsed {
        content: content.to_owned(),
        calls,
    })
}

fn parse_generic(text: &str) -> Option<Parsed> {
    let v: Value = serde_json::from_str(unfence(text)).ok()?;
    let o = v.as_object()?;
    let args = ["arguments", "parameters"];
    if let Some(c) = o.get("tool_call") {
        return Some(Parsed {
            content: String::new(),
            calls: vec![call_from(c, &args)?],
        });
    }
    if let Some(Value::Array(cs)) = o.get("tool_calls") {
        let calls = cs
            .iter()
            .map(|c| call_from(c.get("function").unwrap_or(c), &args))
            .collect::<Option<Vec<_>>>()?;
        return (!calls.is_empty()).then_some(Parsed {
            content: String::new(),
            calls,
        });
    }
    if let Some(Value::String(r)) = o.get("response") {
        return Some(Parsed::plain(r));
    }
    call_from(&v, &args).map(|c| Parsed {
        content: String::new(),
        calls: vec![c],
    })
}

/// Where, in a partial answer, a call may have started: text before it can be streamed as
/// content, text from it on is held until the answer is complete. `None`: nothing to hold.
pub fn hold_from(format: ToolFormat, text: &str) -> Option<usize> {
    let lead = text.len() - text.trim_start().len();
    if format.bare_json_start() {
        match text[lead..].chars().next() {
            // Only blanks so far: the answer may still open with JSON.
            None => return Some(0),
            Some('{' | '[' | '`') => return Some(0),
            _ => {}
        }
    }
    let marker = format.marker()?;
    if let Some(i) = text.find(marker) {
        return Some(i);
    }
    // A marker cut at the end of the text so far.
    (1..marker.len())
        .rev()
        .filter(|&k| text.is_char_boundary(text.len().saturating_sub(k)))
        .find(|&k| k <= text.len() && text.ends_with(&marker[..k]))
        .map(|k| text.len() - k)
}

/// `tool_choice` as the server uses it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// Tools are not offered to the model.
    None,
    /// The model decides.
    Auto,
    /// The model must call one of the tools.
    Required,
    /// The model must call this function.
    Named(String),
}

impl Choice {
    /// Reads `tool_choice` (absent: auto when there are tools).
    pub fn from_value(v: Option<&Value>) -> Result<Self, String> {
        match v {
            None | Some(Value::Null) => Ok(Choice::Auto),
            Some(Value::String(s)) => match s.as_str() {
                "none" => Ok(Choice::None),
                "auto" => Ok(Choice::Auto),
                "required" => Ok(Choice::Required),
                other => Err(format!(
                    "`tool_choice` `{other}` is unknown (none, auto, required, or a function)"
                )),
            },
            Some(v) => match (v["type"].as_str(), v["function"]["name"].as_str()) {
                (Some("function"), Some(name)) => Ok(Choice::Named(name.to_owned())),
                _ => Err(
                    "`tool_choice` must be a string or {\"type\": \"function\", \"function\": {\"name\": ..}}"
                        .into(),
                ),
            },
        }
    }
}

/// How the grammar writes the opening marker: the control token by id (it has no text the
/// grammar could match), or its text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerToken {
    /// The marker is this control token.
    Special(u32),
    /// The marker is ordinary text.
    Text,
}

/// A llguidance Lark grammar whose every sentence is a call (or `parallel` several) of `tools`
/// in `format`, each call's arguments following its function's schema.
pub fn call_grammar(
    format: ToolFormat,
    tools: &[&Tool],
    marker: MarkerToken,
    parallel: bool,
) -> String {
    let args_key = match format {
        ToolFormat::Llama3 => "parameters",
        _ => "arguments",
    };
    let call_schemas: Vec<Value> = tools
        .iter()
        .map(|t| {
            let mut props = Map::new();
            props.insert("name".into(), json!({"const": t.name}));
            props.insert(args_key.into(), t.parameters.clone());
            json!({
                "type": "object",
                "properties": props,
                "required": ["name", args_key],
                "additionalProperties": false,
            })
        })
        .collect();
    let one = if call_schemas.len() == 1 {
        call_schemas[0].clone()
    } else {
        json!({"anyOf": call_schemas})
    };
    let fixed_ws = |mut schema: Value| {
        // Fixed separators: small models otherwise spend the budget on blanks.
        if let Some(o) = schema.as_object_mut() {
            o.insert("x-guidance".into(), json!({"whitespace_flexible": false}));
        }
        schema
    };
    let repeat = if parallel { "+" } else { "" };
    let lit = |s: &str| serde_json::to_string(s).unwrap_or_default();
    match format {
        ToolFormat::Hermes => format!(
            "start: call{repeat}\ncall: {} %json {} {}\n",
            lit("<tool_call>\n"),
            fixed_ws(one),
            lit("\n</tool_call>\n"),
        ),
        ToolFormat::Llama3 => format!("start: call{repeat}\ncall: %json {}\n", fixed_ws(one)),
        ToolFormat::Mistral => {
            let mut arr = json!({"type": "array", "items": one, "minItems": 1});
            if !parallel {
                arr["maxItems"] = json!(1);
            }
            let open = match marker {
                MarkerToken::Special(id) => format!("<[{id}]>"),
                MarkerToken::Text => lit(MISTRAL_MARKER),
            };
            format!("start: {open} %json {}\n", fixed_ws(arr))
        }
        ToolFormat::Generic => {
            let answer = if parallel {
                json!({
                    "type": "object",
                    "properties": {"tool_calls": {"type": "array", "items": one, "minItems": 1}},
                    "required": ["tool_calls"],
                    "additionalProperties": false,
                })
            } else {
                json!({
                    "type": "object",
                    "properties": {"tool_call": one},
                    "required": ["tool_call"],
                    "additionalProperties": false,
                })
            };
            format!("start: %json {}\n", fixed_ws(answer))
        }
    }
}

/// The system text that describes the tools to a model whose template does not (the generic
/// format).
pub fn generic_system_prompt(tools: &[Tool], choice: &Choice) -> String {
    let defs: Vec<&Value> = tools.iter().map(|t| &t.definition).collect();
    let must = match choice {
        Choice::Required | Choice::Named(_) => "You must call a tool.",
        _ => "Call a tool only when it helps; otherwise answer normally.",
    };
    format!(
        "You can call these tools:\n{}\n\nTo call a tool, answer with JSON only, in the form \
         {{\"tool_call\": {{\"name\": \"<tool name>\", \"arguments\": {{...}}}}}}. {must}",
        serde_json::to_string(&defs).unwrap_or_default()
    )
}

/// The text a call has in `format`, for templates that cannot render `tool_calls` themselves.
pub fn call_text(format: ToolFormat, name: &str, arguments: &Value) -> String {
    match format {
        ToolFormat::Hermes => format!(
            "{HERMES_OPEN}\n{}\n{HERMES_CLOSE}",
            json!({"name": name, "arguments": arguments})
        ),
        ToolFormat::Llama3 => json!({"name": name, "parameters": arguments}).to_string(),
        ToolFormat::Mistral => format!(
            "{MISTRAL_MARKER}{}",
            json!([{"name": name, "arguments": arguments}])
        ),
        ToolFormat::Generic => {
            json!({"tool_call": {"name": name, "arguments": arguments}}).to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            id: None,
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn formats_are_detected_from_the_template() {
        assert_eq!(ToolFormat::detect(None), ToolFormat::Generic);
        assert_eq!(
            ToolFormat::detect(Some("{{ '<tool_call>\\n' }}{{ tool | tojson }}")),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::detect(Some(
                "{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"
            )),
            ToolFormat::Mistral
        );
        assert_eq!(
            ToolFormat::detect(Some(
                "<|start_header_id|>ipython<|end_header_id|>{{ '<|python_tag|>' }}"
            )),
            ToolFormat::Llama3
        );
        assert_eq!(
            ToolFormat::detect(Some("<start_of_turn>user")),
            ToolFormat::Generic
        );
    }

    #[test]
    fn hermes_calls_and_content() {
        let t = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
        let p = parse(ToolFormat::Hermes, t);
        assert_eq!(p.content, "Let me look.");
        assert_eq!(
            p.calls,
            vec![
                call("get_weather", r#"{"city":"Paris"}"#),
                call("now", "{}")
            ]
        );
        // No close tag: the stop token ended the answer.
        let p = parse(
            ToolFormat::Hermes,
            "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}",
        );
        assert_eq!(p.calls, vec![call("f", r#"{"a": 1}"#)]);
    }

    #[test]
    fn llama3_calls() {
        let p = parse(
            ToolFormat::Llama3,
            r#"{"name": "get_weather", "parameters": {"city": "Oslo"}}"#,
        );
        assert_eq!(p.calls, vec![call("get_weather", r#"{"city":"Oslo"}"#)]);
        assert_eq!(p.content, "");
        let p = parse(
            ToolFormat::Llama3,
            r#"<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"x": 2}}"#,
        );
        assert_eq!(p.calls, vec![call("a", "{}"), call("b", r#"{"x":2}"#)]);
    }

    #[test]
    fn mistral_calls_with_and_without_the_marker() {
        let p = parse(
            ToolFormat::Mistral,
            r#"[TOOL_CALLS][{"name": "f", "arguments": {"q": "x"}, "id": "abcDEF123"}]"#,
        );
        assert_eq!(
            p.calls,
            vec![ToolCall {
                id: Some("abcDEF123".into()),
                ..call("f", r#"{"q":"x"}"#)
            }]
        );
        // The marker token detokenizes to nothing.
        let p = parse(
            ToolFormat::Mistral,
            r#" [{"name": "f", "arguments": {}}, {"name": "g", "arguments": {}}]"#,
        );
        assert_eq!(p.calls.len(), 2);
    }

    #[test]
    fn generic_json_answers() {
        let p = parse(
            ToolFormat::Generic,
            "```json\n{\"tool_call\": {\"name\": \"f\", \"arguments\": {\"n\": 3}}}\n```",
        );
        assert_eq!(p.calls, vec![call("f", r#"{"n":3}"#)]);
        let p = parse(
            ToolFormat::Generic,
            r#"{"tool_calls": [{"name": "f", "arguments": {}}, {"function": {"name": "g", "arguments": "{}"}}]}"#,
        );
        assert_eq!(p.calls, vec![call("f", "{}"), call("g", "{}")]);
        let p = parse(ToolFormat::Generic, r#"{"response": "Hello!"}"#);
        assert_eq!(p, Parsed::plain("Hello!"));
        // The generic shape is the fallback of every format.
        let p = parse(
            ToolFormat::Hermes,
            r#"{"name": "f", "arguments": {"k": true}}"#,
        );
        assert_eq!(p.calls, vec![call("f", r#"{"k":true}"#)]);
    }

    #[test]
    fn malformed_output_is_plain_content() {
        for (f, t) in [
            (ToolFormat::Hermes, "<tool_call>{\"name\": \"f\", \"argu"),
            (ToolFormat::Hermes, "<tool_call>[1, 2]</tool_call>"),
            (
                ToolFormat::Hermes,
                "<tool_call>{\"arguments\": {}}</tool_call>",
            ),
            (
                ToolFormat::Hermes,
                "<tool_call>{\"name\": \"f\", \"arguments\": 5}</tool_call>",
            ),
            (ToolFormat::Llama3, "{\"name\": \"f\", \"parameters\": {"),
            (ToolFormat::Llama3, "{\"x\": 1}"),
            (ToolFormat::Mistral, "[TOOL_CALLS][{\"name\": 7}]"),
            (ToolFormat::Mistral, "[1, 2, 3]"),
            (ToolFormat::Generic, "{\"tool_call\": \"f\"}"),
            (ToolFormat::Generic, "{\"tool_calls\": []}"),
            (ToolFormat::Generic, "Just text. <tool_call>"),
            (ToolFormat::Generic, ""),
            (ToolFormat::Llama3, "```"),
            (ToolFormat::Hermes, "<tool_call>\u{1F600}</tool_call>\u{0}"),
        ] {
            let p = parse(f, t);
            assert!(p.calls.is_empty(), "{f:?} {t:?}: {p:?}");
            assert_eq!(p.content, t, "{f:?}");
        }
    }

    #[test]
    fn parsing_never_panics_on_any_prefix() {
        let t = "Sure. <tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"é☃\"}}\n</tool_call> [TOOL_CALLS]<|python_tag|>";
        for f in [
            ToolFormat::Hermes,
            ToolFormat::Llama3,
            ToolFormat::Mistral,
            ToolFormat::Generic,
        ] {
            for (i, _) in t.char_indices() {
                let _ = parse(f, &t[..i]);
                if let Some(h) = hold_from(f, &t[..i]) {
                    assert!(t[..i].is_char_boundary(h));
                }
            }
        }
    }

    #[test]
    fn streamed_text_is_held_only_where_a_call_may_start() {
        let h = ToolFormat::Hermes;
        assert_eq!(hold_from(h, "Hello"), None);
        assert_eq!(hold_from(h, "Hello <tool"), Some(6));
        assert_eq!(hold_from(h, "Hello <tool_call>{"), Some(6));
        assert_eq!(hold_from(h, "a < b"), None);
        let g = ToolFormat::Generic;
        assert_eq!(hold_from(g, "  "), Some(0));
        assert_eq!(hold_from(g, " {\"tool"), Some(0));
        assert_eq!(hold_from(g, "Hi {"), None);
        assert_eq!(hold_from(ToolFormat::Mistral, "x [TOOL_"), Some(2));
        assert_eq!(hold_from(ToolFormat::Llama3, "[1]"), Some(0));
    }

    #[test]
    fn tool_choice_values() {
        assert_eq!(Choice::from_value(None), Ok(Choice::Auto));
        assert_eq!(Choice::from_value(Some(&json!("none"))), Ok(Choice::None));
        assert_eq!(
            Choice::from_value(Some(&json!("required"))),
            Ok(Choice::Required)
        );
        assert_eq!(
            Choice::from_value(Some(
                &json!({"type": "function", "function": {"name": "f"}})
            )),
            Ok(Choice::Named("f".into()))
        );
        assert!(Choice::from_value(Some(&json!("always"))).is_err());
        assert!(Choice::from_value(Some(&json!(3))).is_err());
    }

    #[test]
    fn tool_definitions_are_checked() {
        let ok = Tool::from_value(&json!({"type": "function", "function": {"name": "get_x"}}))
            .expect("valid");
        assert_eq!(ok.parameters["type"], "object");
        for bad in [
            json!({"type": "retrieval"}),
            json!({"type": "function", "function": {}}),
            json!({"type": "function", "function": {"name": "a b"}}),
            json!({"type": "function", "function": {"name": "f", "parameters": 3}}),
        ] {
            assert!(Tool::from_value(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn call_texts_parse_back() {
        let args = json!({"city": "Rome"});
        for f in [
            ToolFormat::Hermes,
            ToolFormat::Llama3,
            ToolFormat::Mistral,
            ToolFormat::Generic,
        ] {
            let p = parse(f, &call_text(f, "w", &args));
            assert_eq!(p.calls, vec![call("w", r#"{"city":"Rome"}"#)], "{f:?}");
        }
    }
}
