//! The OpenAI wire format: request bodies as lenient serde structs (unknown fields are ignored,
//! as OpenAI-compatible servers do) and the response objects the endpoints write.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopSpec {
    /// A single stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl StopSpec {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopSpec::One(s) => vec![s],
            StopSpec::Many(v) => v,
        }
    }
}

/// A message's `content`: text, or a list of typed parts (only `text` parts are understood).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// `text` (images and audio are not supported).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default)]
    pub text: Option<String>,
}

/// One chat message of a request.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text (absent for assistant turns that only call tools).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's calls (`{"id", "type": "function", "function": {"name",
    /// "arguments"}}`).
    #[serde(default)]
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` turn: the call it answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
    /// A `tool` turn: the function's name (some templates show it).
    #[serde(default)]
    pub name: Option<String>,
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the `usage` counts.
    #[serde(default)]
    pub include_usage: bool,
}

/// `response_format`.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The schema of `json_schema`.
    pub json_schema: Option<JsonSchemaFormat>,
}

/// `response_format.json_schema`.
#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    /// The schema's name.
    pub name: Option<String>,
    /// The JSON schema the answer must follow.
    pub schema: Option<Value>,
}

/// Sampling and length settings shared by chat and text completions.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature (0: greedy); default: the server's (0.8, as llama.cpp).
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    pub top_p: Option<f32>,
    /// Keep the k most likely tokens (0: off).
    pub top_k: Option<i64>,
    /// Minimum probability relative to the best token.
    pub min_p: Option<f32>,
    /// Seed of the sampler (same seed, same text).
    pub seed: Option<i64>,
    /// Tokens to generate at most.
    pub max_tokens: Option<i64>,
    /// The newer name of `max_tokens` (chat).
    pub max_completion_tokens: Option<i64>,
    /// Stop strings (at most 4).
    pub stop: Option<StopSpec>,
    /// OpenAI's presence penalty (-2..2).
    pub presence_penalty: Option<f32>,
    /// OpenAI's frequency penalty (-2..2).
    pub frequency_penalty: Option<f32>,
    /// llama.cpp's multiplicative repetition penalty.
    pub repeat_penalty: Option<f32>,
    /// Number of choices; only 1 is served.
    pub n: Option<i64>,
    /// Keep going past end-of-generation tokens (llama.cpp's extension, used by benchmarks).
    #[serde(default)]
    pub ignore_eos: bool,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The model id (`GET /v1/models`).
    pub model: Option<String>,
    /// The conversation.
    pub messages: Vec<Message>,
    /// Sampling settings.
    #[serde(flatten)]
    pub sampling: SamplingParams,
    /// Return the chosen tokens' log-probabilities.
    #[serde(default)]
    pub logprobs: bool,
    /// Alternatives per position (0..=20), with `logprobs`.
    pub top_logprobs: Option<i64>,
    /// Structured output.
    pub response_format: Option<ResponseFormat>,
    /// Tool definitions (`{"type": "function", "function": {"name", "description",
    /// "parameters"}}`).
    pub tools: Option<Vec<Value>>,
    /// `none`, `auto` (default), `required`, or `{"type": "function", "function": {"name"}}`.
    pub tool_choice: Option<Value>,
    /// With `tool_choice` required or named: allow several calls (default: exactly one).
    pub parallel_tool_calls: Option<bool>,
}

/// A completion prompt: text, token ids, or a batch of one of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Several texts (completions serve only one).
    Texts(Vec<String>),
    /// Several token lists (completions serve only one).
    TokenLists(Vec<Vec<u32>>),
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The model id.
    pub model: Option<String>,
    /// The prompt.
    pub prompt: Prompt,
    /// Sampling settings.
    #[serde(flatten)]
    pub sampling: SamplingParams,
    /// Repeat the prompt before the completion.
    #[serde(default)]
    pub echo: bool,
    /// Alternatives per position (0..=5); the chosen token's log-probability is always given.
    pub logprobs: Option<i64>,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingRequest {
    /// The model id.
    pub model: Option<String>,
    /// What to embed: one or several texts or token lists.
    pub input: Prompt,
    /// `float` (default) or `base64` (little-endian f32 bytes).
    pub encoding_format: Option<String>,
    /// Must equal the model's width when given (no truncation).
    pub dimensions: Option<i64>,
}

/// `POST /tokenize` (llama.cpp's shape).
#[derive(Debug, Clone, Deserialize)]
pub struct TokenizeRequest {
    /// The text.
    pub content: String,
    /// Add BOS/EOS as the model asks.
    #[serde(default)]
    pub add_special: bool,
    /// Also return each token's text.
    #[serde(default)]
    pub with_pieces: bool,
}

/// `POST /detokenize`.
#[derive(Debug, Clone, Deserialize)]
pub struct DetokenizeRequest {
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// Token counts of a request.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Tokens of the prompt.
    pub prompt_tokens: usize,
    /// Tokens generated.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// Counts with the total filled in.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}

/// One alternative of a chat logprob entry.
#[derive(Debug, Clone, Serialize)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
}

/// A chat logprob entry: the chosen token and the alternatives.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprob {
    /// The chosen token's text.
    pub token: String,
    /// Its log-probability.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `choices[].logprobs` of a chat answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatLogprob>,
}

/// A function call of an answer.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON text.
    pub arguments: String,
}

/// One tool call of an answer.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallOut {
    /// `call_N` (or the id the model wrote).
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The call.
    pub function: FunctionCall,
}

/// The assistant's message of a chat answer.
#[derive(Debug, Clone, Serialize)]
pub struct AssistantMessage {
    /// Always `assistant`.
    pub role: &'static str,
    /// The text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// The calls, when the model made any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// `function` of a streamed tool-call delta.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionDelta {
    /// The name, in a call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments' JSON text.
    pub arguments: String,
}

/// One streamed tool-call delta.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCallDelta {
    /// Which call of the answer (0, 1, ..).
    pub index: usize,
    /// The id, in a call's first delta.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in a call's first delta.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The call's part.
    pub function: FunctionDelta,
}

/// One choice of a chat answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChoice {
    /// Always 0 (n = 1).
    pub index: usize,
    /// The answer.
    pub message: AssistantMessage,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop`, `length` or `tool_calls`.
    pub finish_reason: &'static str,
}

/// A whole chat answer.
#[derive(Debug, Clone, Serialize)]
pub struct ChatResponse {
    /// `chatcmpl-N`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// The answer.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// `choices[].delta` of a chat chunk.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Delta {
    /// `assistant` in the first chunk.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// The new text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Tool-call pieces.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a chat chunk.
#[derive(Debug, Clone, Serialize)]
pub struct ChunkChoice {
    /// Always 0.
    pub index: usize,
    /// The new text.
    pub delta: Delta,
    /// Log-probabilities of the chunk's tokens.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the last chunk.
    pub finish_reason: Option<&'static str>,
}

/// A `chat.completion.chunk` event.
#[derive(Debug, Clone, Serialize)]
pub struct ChatChunk {
    /// Same id in every chunk of an answer.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// Empty in the usage chunk.
    pub choices: Vec<ChunkChoice>,
    /// Only in the usage chunk (`stream_options.include_usage`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}

/// `choices[].logprobs` of a text completion (the legacy format).
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompletionLogprobs {
    /// Token texts.
    pub tokens: Vec<String>,
    /// Their log-probabilities (null for the prompt's first token, which nothing predicts).
    pub token_logprobs: Vec<Option<f32>>,
    /// Alternatives per position, token text -> log-probability (null where the logprob is).
    pub top_logprobs: Vec<Option<serde_json::Map<String, Value>>>,
    /// Character offset of each token in the choice's text.
    pub text_offset: Vec<usize>,
}

/// One choice of a text completion.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionChoice {
    /// Always 0.
    pub index: usize,
    /// The text (the prompt first with `echo`).
    pub text: String,
    /// Log-probabilities, when asked for.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length` (null in intermediate stream chunks).
    pub finish_reason: Option<&'static str>,
}

/// A text completion, whole or one streamed chunk.
#[derive(Debug, Clone, Serialize)]
pub struct CompletionResponse {
    /// `cmpl-N`.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The model id.
    pub model: String,
    /// The choice.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (whole answers and the last stream chunk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
}
