//! Chat prompt formatting: the model's own Jinja `tokenizer.chat_template` rendered with
//! minijinja, or a built-in turn format when the file has none.
//!
//! The Jinja environment mirrors what Hugging Face's `apply_chat_template` (and llama.cpp's
//! minja) offer templates: `messages`, `bos_token`, `eos_token`, `add_generation_prompt`,
//! `raise_exception`, `strftime_now`, `tojson`, Python string/list/dict methods, and blocks
//! trimmed like Hugging Face's (`trim_blocks`, `lstrip_blocks`).

use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::{context, Environment, Error as JinjaError, ErrorKind, Value};

use crate::error::ModelError;

/// One chat turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The turn's text.
    pub content: String,
}

impl ChatMessage {
    /// A message with the given role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Built-in turn formats for models whose file carries no template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuiltinFormat {
    /// Gemma: `<start_of_turn>user\n...<end_of_turn>\n`, assistant role named `model`, system
    /// text folded into the first user turn.
    Gemma,
    /// ChatML (`<|im_start|>role\n...<|im_end|>\n`), llama.cpp's fallback.
    ChatMl,
}

/// A chat prompt formatter.
#[derive(Clone, Debug)]
pub enum ChatTemplate {
    /// A Jinja template from the model file.
    Jinja {
        /// Template source.
        source: String,
        /// Text of the BOS token, exposed to the template as `bos_token`.
        bos_token: String,
        /// Text of the EOS token, exposed as `eos_token`.
        eos_token: String,
    },
    /// A built-in format.
    Builtin(BuiltinFormat),
}

impl ChatTemplate {
    /// The template for a model: its own Jinja template when present, otherwise a built-in format
    /// chosen by architecture (Gemma for `gemma*`, ChatML for everything else).
    pub fn for_model(
        template: Option<&str>,
        architecture: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Self {
        match template {
            Some(src) if !src.trim().is_empty() => ChatTemplate::Jinja {
                source: src.to_owned(),
                bos_token: bos_token.to_owned(),
                eos_token: eos_token.to_owned(),
            },
            _ if architecture.starts_with("gemma") => ChatTemplate::Builtin(BuiltinFormat::Gemma),
            _ => ChatTemplate::Builtin(BuiltinFormat::ChatMl),
        }
    }

    /// Renders a conversation; with `add_generation_prompt` the text ends where the assistant's
    /// reply starts.
    ///
    /// The result never starts with the BOS text when the tokenizer adds BOS itself: callers
    /// tokenize with BOS per the model's metadata; [`strip_leading_bos`] removes a duplicate.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        match self {
            ChatTemplate::Builtin(BuiltinFormat::Gemma) => {
                Ok(render_gemma(messages, add_generation_prompt))
            }
            ChatTemplate::Builtin(BuiltinFormat::ChatMl) => {
                Ok(render_chatml(messages, add_generation_prompt))
            }
            ChatTemplate::Jinja {
                source,
                bos_token,
                eos_token,
            } => render_jinja(
                source,
                Value::from(
                    messages
                        .iter()
                        .map(|m| context! { role => m.role.clone(), content => m.content.clone() })
                        .collect::<Vec<Value>>(),
                ),
                None,
                add_generation_prompt,
                bos_token,
                eos_token,
            ),
        }
    }

    /// Renders a conversation given in the OpenAI / Hugging Face JSON shape (objects with
    /// `role`, `content` and, for tool use, `tool_calls`, `tool_call_id`, `name`), with tool
    /// definitions exposed to the template as `tools` (none when `None`), as Hugging Face's
    /// `apply_chat_template(messages, tools=...)` does.
    ///
    /// Built-in formats know no tools: they render each message's role and text content only.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        match self {
            ChatTemplate::Builtin(_) => {
                let plain: Vec<ChatMessage> = messages
                    .iter()
                    .map(|m| {
                        ChatMessage::new(
                            m["role"].as_str().unwrap_or(""),
                            m["content"].as_str().unwrap_or(""),
                        )
                    })
                    .collect();
                self.render(&plain, add_generation_prompt)
            }
            ChatTemplate::Jinja {
                source,
                bos_token,
                eos_token,
            } => render_jinja(
                source,
                Value::from_serialize(messages),
                tools.map(Value::from_serialize),
                add_generation_prompt,
                bos_token,
                eos_token,
            ),
        }
    }

    /// The Jinja source of the model's template (`None` for a built-in format); servers read
    /// it to tell which tool-call syntax the model was trained on.
    pub fn source(&self) -> Option<&str> {
        match self {
            ChatTemplate::Jinja { source, .. } => Some(source),
            ChatTemplate::Builtin(_) => None,
        }
    }

    /// Strings that end an assistant turn in this format (besides the model's EOG tokens).
    pub fn stop_strings(&self) -> Vec<String> {
        match self {
            ChatTemplate::Builtin(BuiltinFormat::Gemma) => vec!["<end_of_turn>".into()],
            ChatTemplate::Builtin(BuiltinFormat::ChatMl) => vec!["<|im_end|>".into()],
            ChatTemplate::Jinja { .. } => Vec::new(),
        }
    }
}

/// Removes one leading `bos` from `text` (templates that write `{{ bos_token }}` themselves
/// would otherwise give two BOS tokens once the tokenizer adds its own).
pub fn strip_leading_bos<'a>(text: &'a str, bos: &str) -> &'a str {
    if bos.is_empty() {
        return text;
    }
    text.strip_prefix(bos).unwrap_or(text)
}

fn render_gemma(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    let mut system = String::new();
    for m in messages {
        if m.role == "system" {
            system.push_str(&m.content);
            continue;
        }
        let role = if m.role == "assistant" {
            "model"
        } else {
            m.role.as_str()
        };
        out.push_str("<start_of_turn>");
        out.push_str(role);
        out.push('\n');
        if !system.is_empty() && role == "user" {
            out.push_str(&system);
            out.push_str("\n\n");
            system.clear();
        }
        out.push_str(m.content.trim());
        out.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        out.push_str("<start_of_turn>model\n");
    }
    out
}

fn render_chatml(messages: &[ChatMessage], add_generation_prompt: bool) -> String {
    let mut out = String::new();
    for m in messages {
        out.push_str("<|im_start|>");
        out.push_str(&m.role);
        out.push('\n');
        out.push_str(&m.content);
        out.push_str("<|im_end|>\n");
    }
    if add_generation_prompt {
        out.push_str("<|im_start|>assistant\n");
    }
    out
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(fmt)`: the current UTC date, supporting the directives chat templates use.
fn strftime_now(fmt: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format_date(secs, &fmt)
}

fn format_date(unix_secs: u64, fmt: &str) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    // Civil-from-days (Howard Hinnant's algorithm) for the proleptic Gregorian calendar.
    let days = (unix_secs / 86_400) as i64 + 719_468;
    let era = days.div_euclid(146_097);
    let doe = days.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('d') => out.push_str(&format!("{day:02}")),
            Some('m') => out.push_str(&format!("{month:02}")),
            Some('Y') => out.push_str(&year.to_string()),
            Some('y') => out.push_str(&format!("{:02}", year % 100)),
            Some('b') => out.push_str(&month_name[..3]),
            Some('B') => out.push_str(month_name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Instructions a chat template may execute per rendering (minijinja's fuel): real templates
/// need a few hundred per message, a template that loops without end is stopped here.
pub const TEMPLATE_FUEL: u64 = 5_000_000;
/// Largest rendered prompt, in bytes.
pub const MAX_TEMPLATE_OUTPUT: usize = 64 << 20;

/// A writer that refuses to grow past [`MAX_TEMPLATE_OUTPUT`].
struct Bounded(Vec<u8>);

impl std::io::Write for Bounded {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_TEMPLATE_OUTPUT {
            return Err(std::io::Error::other("output limit"));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn render_jinja(
    source: &str,
    messages: Value,
    tools: Option<Value>,
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String, ModelError> {
    let mut env = Environment::new();
    env.set_fuel(Some(TEMPLATE_FUEL));
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    let tmpl = env
        .template_from_str(source)
        .map_err(|e| ModelError::ChatTemplate(format!("{e:#}")))?;
    let mut out = Bounded(Vec::new());
    let rendered = tmpl.render_captured_to(
        context! {
            messages => messages,
            // Hugging Face passes `tools=None` when there are none; templates test `tools is
            // not none`, which an undefined value would pass.
            tools => tools.unwrap_or(Value::from(())),
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        },
        &mut out,
    );
    match rendered {
        Ok(_) => String::from_utf8(out.0)
            .map_err(|_| ModelError::ChatTemplate("rendered text is not UTF-8".into())),
        Err(e) if e.kind() == ErrorKind::OutOfFuel => Err(ModelError::ChatTemplate(format!(
            "the template ran more than {TEMPLATE_FUEL} instructions (an endless loop?)"
        ))),
        Err(e) if e.kind() == ErrorKind::WriteFailure => Err(ModelError::ChatTemplate(format!(
            "the rendered prompt exceeds {} MiB",
            MAX_TEMPLATE_OUTPUT >> 20
        ))),
        Err(e) => Err(ModelError::ChatTemplate(format!("{e:#}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn convo() -> Vec<ChatMessage> {
        vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
            ChatMessage::new("assistant", "Hello!"),
            ChatMessage::new("user", "Name a color."),
        ]
    }

    #[test]
    fn gemma_builtin_format() {
        let t = ChatTemplate::for_model(None, "gemma3", "<bos>", "<eos>");
        let s = t.render(&convo(), true).unwrap();
        assert_eq!(
            s,
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello!<end_of_turn>\n\
             <start_of_turn>user\nName a color.<end_of_turn>\n\
             <start_of_turn>model\n"
        );
    }

    #[test]
    fn chatml_fallback_for_other_archs() {
        let t = ChatTemplate::for_model(Some("  "), "llama", "<s>", "</s>");
        let s = t.render(&convo()[1..2], true).unwrap();
        assert_eq!(s, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    }

    /// The shape of Gemma 3's Hugging Face template (loops, namespaces, slicing, raise).
    const GEMMA_LIKE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}"#;

    #[test]
    fn jinja_matches_builtin_gemma() {
        let t = ChatTemplate::for_model(Some(GEMMA_LIKE), "gemma3", "<bos>", "<eos>");
        let s = t.render(&convo(), true).unwrap();
        let builtin = ChatTemplate::Builtin(BuiltinFormat::Gemma)
            .render(&convo(), true)
            .unwrap();
        assert_eq!(strip_leading_bos(&s, "<bos>"), builtin);
    }

    #[test]
    fn raise_exception_becomes_an_error() {
        let t = ChatTemplate::for_model(Some(GEMMA_LIKE), "gemma3", "<bos>", "<eos>");
        let bad = vec![ChatMessage::new("user", "a"), ChatMessage::new("user", "b")];
        let err = t.render(&bad, true).unwrap_err().to_string();
        assert!(err.contains("must alternate"), "{err}");
    }

    #[test]
    fn python_methods_and_tojson_work() {
        let src = "{% for m in messages %}{{ m.content.strip().upper() }}|{{ m.role | tojson }}{% endfor %}\
                   {% if messages[0].content.startswith(' x') %}!{% endif %}";
        let t = ChatTemplate::for_model(Some(src), "qwen2", "", "");
        let s = t
            .render(&[ChatMessage::new("user", " x y ")], false)
            .unwrap();
        assert_eq!(s, "X Y|\"user\"!");
    }

    #[test]
    fn syntax_error_is_reported() {
        let t = ChatTemplate::for_model(Some("{% for %}"), "llama", "", "");
        assert!(matches!(
            t.render(&convo(), true),
            Err(ModelError::ChatTemplate(_))
        ));
    }

    #[test]
    fn endless_templates_run_out_of_fuel() {
        let src =
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}";
        let t = ChatTemplate::for_model(Some(src), "llama", "", "");
        let err = t.render(&convo(), true).unwrap_err();
        assert!(matches!(err, ModelError::ChatTemplate(_)), "{err:?}");
        assert!(err.to_string().contains("instructions"), "{err}");
    }

    #[test]
    fn template_output_is_bounded() {
        // 1 KiB repeated 100 000 times: 100 MB of prompt from a few instructions per round.
        let src = "{% for i in range(100000) %}{{ messages[0].content }}{% endfor %}";
        let t = ChatTemplate::for_model(Some(src), "llama", "", "");
        let err = t
            .render(&[ChatMessage::new("user", "x".repeat(1024))], true)
            .unwrap_err();
        assert!(err.to_string().contains("exceeds 64 MiB"), "{err}");
    }

    #[test]
    fn json_messages_and_tools_reach_the_template() {
        let src = "{% if tools is not none %}{% for t in tools %}[{{ t.function.name }}]{% endfor %}{% endif %}\
                   {% for m in messages %}{{ m.role }}:{{ m.content }}\
                   {% for c in m.tool_calls or [] %}{{ c.function.name }}{{ c.function.arguments | tojson }}{% endfor %}\
                   {% if m.tool_call_id %}#{{ m.tool_call_id }}{% endif %};{% endfor %}";
        let t = ChatTemplate::for_model(Some(src), "qwen2", "", "");
        let msgs = [
            serde_json::json!({"role": "user", "content": "hi"}),
            serde_json::json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}]}),
            serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": "2"}),
        ];
        let tools = [serde_json::json!({"type": "function", "function": {"name": "f"}})];
        let s = t.render_json(&msgs, Some(&tools), false).unwrap();
        assert_eq!(s, "[f]user:hi;assistant:Nonef{\"x\":1};tool:2#c1;");
        let s = t.render_json(&msgs[..1], None, false).unwrap();
        assert_eq!(s, "user:hi;");
        assert_eq!(t.source(), Some(src));
    }

    #[test]
    fn date_formatting() {
        // 2024-07-26 is 19930 days after the epoch.
        assert_eq!(format_date(19_930 * 86_400, "%d %b %Y"), "26 Jul 2024");
        assert_eq!(format_date(0, "%Y-%m-%d %B %%"), "1970-01-01 January %");
    }
}
