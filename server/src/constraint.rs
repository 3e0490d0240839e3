//! Structured output (`response_format` json_object / json_schema) by constrained decoding:
//! llguidance computes, before each sampling step, which tokens keep the text a valid prefix of
//! the grammar, from a token trie built once out of the GGUF vocabulary.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use model::batch::TokenConstraint;
use model::tokenizer::{attr, Tokenizer};
use serde_json::Value;

/// The model's vocabulary as llguidance sees it: every token's bytes (control tokens marked as
/// special so that grammars never produce them as text).
struct Vocab {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tokenizer
            .encode(&String::from_utf8_lossy(s), false, false)
    }
}

/// Compiles grammars for one model.
pub struct Grammars {
    factory: ParserFactory,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammars")
    }
}

impl Grammars {
    /// Builds the token trie from the tokenizer's vocabulary.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Result<Self, String> {
        let n = tokenizer.n_vocab();
        let words: Vec<Vec<u8>> = (0..n as u32)
            .map(|id| {
                if tokenizer.token_attr(id) & (attr::CONTROL | attr::UNUSED | attr::UNKNOWN) != 0 {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(tokenizer.token_text(id).unwrap_or("").as_bytes());
                    w
                } else {
                    tokenizer.token_to_piece(id)
                }
            })
            .collect();
        let eos = tokenizer.eos().or(tokenizer.eot()).unwrap_or(0);
        let info = TokRxInfo {
            vocab_size: n as u32,
            tok_eos: eos,
            tok_bos: tokenizer.bos(),
            tok_pad: tokenizer.pad(),
            tok_unk: tokenizer.unk(),
            tok_end_of_turn: tokenizer.eot(),
        };
        let env: TokEnv = Arc::new(Vocab {
            trie: TokTrie::from(&info, &words),
            tokenizer,
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.quiet();
        Ok(Self { factory })
    }

    /// A constraint for a JSON schema (`None`: any JSON object); an invalid schema is an error
    /// the client caused.
    pub fn json(&self, schema: Option<Value>) -> Result<GrammarConstraint, String> {
        let mut schema = schema.unwrap_or_else(|| serde_json::json!({"type": "object"}));
        // Fixed separators instead of free whitespace: small models otherwise spend their
        // budget on blanks between tokens. A schema's own `x-guidance` options win.
        if let Some(obj) = schema.as_object_mut() {
            obj.entry("x-guidance")
                .or_insert_with(|| serde_json::json!({"whitespace_flexible": false}));
        }
        self.compile(TopLevelGrammar::from_json_schema(schema))
    }

    /// A constraint for a llguidance Lark grammar (tool calls); an invalid grammar is an error.
    pub fn lark(&self, grammar: String) -> Result<GrammarConstraint, String> {
        self.compile(TopLevelGrammar::from_lark(grammar))
    }

    fn compile(&self, grammar: TopLevelGrammar) -> Result<GrammarConstraint, String> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        Ok(GrammarConstraint { m })
    }
}

/// One request's grammar state (a JSON schema or a Lark grammar).
pub struct GrammarConstraint {
    m: Matcher,
}

impl TokenConstraint for GrammarConstraint {
    fn mask(&mut self, logits: &mut [f32]) {
        match self.m.compute_mask() {
            Ok(allowed) => {
                for (i, l) in logits.iter_mut().enumerate() {
                    if i >= allowed.len() || !allowed.is_allowed(i as u32) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            Err(e) => tracing::warn!("grammar mask failed: {e}"),
        }
    }

    fn accept(&mut self, token: u32) -> bool {
        self.m.consume_token(token).is_ok() && !self.m.is_stopped()
    }
}
