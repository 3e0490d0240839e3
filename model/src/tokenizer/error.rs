//! The tokenizer's error type: each variant names the metadata key and what was expected.

/// Why a vocabulary could not be built from GGUF metadata.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// Reading a metadata key failed (absent where required, or of the wrong type).
    #[error(transparent)]
    Gguf(#[from] gguf::GgufError),
    /// `tokenizer.ggml.model` names a tokenizer we do not implement.
    #[error(
        "tokenizer.ggml.model `{0}` is not supported (supported: llama, gpt2, gemma4, bert, t5)"
    )]
    UnsupportedModel(String),
    /// An array is shorter than the token list.
    #[error(
        "metadata key `{key}` has {found} entries, expected at least {expected} (one per token)"
    )]
    ShortArray {
        /// The key.
        key: &'static str,
        /// Entries present.
        found: usize,
        /// Tokens in the vocabulary.
        expected: usize,
    },
    /// `tokenizer.ggml.precompiled_charsmap` is malformed.
    #[error("tokenizer.ggml.precompiled_charsmap: {0}")]
    BadCharsmap(String),
    /// The vocabulary is empty.
    #[error("tokenizer.ggml.tokens is empty")]
    Empty,
    /// A byte-level BPE vocabulary (`tokenizer.ggml.model` named) has no merge list.
    #[error(
        "tokenizer.ggml.merges is missing: a `{0}` (BPE) vocabulary needs its merge list; \
         re-convert the model with a current convert_hf_to_gguf.py"
    )]
    MissingMerges(String),
    /// A special token id is needed but not set or out of range.
    #[error("special token `{0}` is needed but not defined by the vocabulary")]
    MissingSpecial(&'static str),
}
