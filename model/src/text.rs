//! A model together with its tokenizer and chat template: what the CLI and the generation loop
//! need to go from text to text.

use std::path::Path;
use std::sync::Arc;

use crate::chat::{strip_leading_bos, ChatTemplate};
use crate::error::ModelError;
use crate::generate::Vocab;
use crate::session::{LoadOptions, Model};
use crate::tokenizer::Tokenizer;

/// A loaded model, its vocabulary and its chat format.
#[derive(Debug, Clone)]
pub struct TextModel {
    model: Model,
    tokenizer: Arc<Tokenizer>,
    template: ChatTemplate,
}

impl TextModel {
    /// Loads a GGUF model and builds its tokenizer; see [`Model::load`] for `progress`.
    pub fn load(
        path: impl AsRef<Path>,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        Self::load_with(path, &LoadOptions::default(), progress)
    }

    /// [`TextModel::load`] with options (see [`LoadOptions`]).
    pub fn load_with(
        path: impl AsRef<Path>,
        opts: &LoadOptions,
        progress: impl FnMut(u64, u64),
    ) -> Result<Self, ModelError> {
        let path = path.as_ref();
        Self::from_model(Model::load_with(path, opts, progress)?).map_err(|e| e.in_file(path))
    }

    /// Adds the tokenizer and chat template read from the model's own file.
    pub fn from_model(model: Model) -> Result<Self, ModelError> {
        let tokenizer = Tokenizer::from_gguf(model.file())?;
        let md = model.file().metadata();
        check_vocab(md, tokenizer.n_vocab(), model.config().n_vocab)?;
        let text_of = |id: Option<u32>| {
            id.and_then(|i| tokenizer.token_text(i))
                .unwrap_or("")
                .to_owned()
        };
        let template = ChatTemplate::for_model(
            md.get_str_opt("tokenizer.chat_template").ok().flatten(),
            model.config().arch.name(),
            &text_of(tokenizer.bos()),
            &text_of(tokenizer.eos()),
        );
        Ok(Self {
            model,
            tokenizer: Arc::new(tokenizer),
            template,
        })
    }

    /// The model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The chat format.
    pub fn chat_template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Token ids of `text`; with `add_special`, BOS/EOS as the model's metadata asks. Special
    /// token text in the input (`<start_of_turn>`...) is parsed as those tokens, as llama.cpp's
    /// tools do for prompts.
    pub fn encode(&self, text: &str, add_special: bool) -> Result<Vec<u32>, ModelError> {
        let ids = self.tokenizer.encode(text, add_special, true);
        if ids.is_empty() {
            return Err(ModelError::InvalidArgument(
                "the prompt tokenizes to nothing".into(),
            ));
        }
        Ok(ids)
    }

    /// Token ids of a rendered chat prompt: a BOS the template wrote itself is dropped, since
    /// the tokenizer adds its own.
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>, ModelError> {
        let bos_text = self
            .tokenizer
            .bos()
            .and_then(|b| self.tokenizer.token_text(b))
            .unwrap_or("");
        let text = if self.tokenizer.add_bos() {
            strip_leading_bos(rendered, bos_text)
        } else {
            rendered
        };
        self.encode(text, true)
    }

    /// The token that starts every perplexity window, when the model uses BOS.
    pub fn bos_for_chunks(&self) -> Option<u32> {
        if self.tokenizer.add_bos() {
            self.tokenizer.bos()
        } else {
            None
        }
    }

    /// Bytes of a token as shown to a user (control tokens print nothing).
    pub fn piece(&self, id: u32) -> Vec<u8> {
        self.tokenizer.token_to_piece_ext(id, 0, false)
    }
}

/// The vocabulary must cover the embedding table exactly (a token without text would print
/// nothing, a text without an embedding row could not be run), and every special token id the
/// metadata names must be inside it (llama.cpp falls back to a default id with a warning; a file
/// that names a token it does not have is refused here instead).
fn check_vocab(md: &gguf::Metadata, n_tokens: usize, n_rows: usize) -> Result<(), ModelError> {
    if n_tokens != n_rows {
        return Err(ModelError::BadTensor {
            name: "token_embd.weight".into(),
            reason: format!(
                "{n_rows} embedding rows but the vocabulary (`tokenizer.ggml.tokens`) has \
                 {n_tokens} entries; they must be equal"
            ),
        });
    }
    for (key, value) in md.iter() {
        if !(key.starts_with("tokenizer.ggml.") && key.ends_with("_token_id")) {
            continue;
        }
        match value.to_u64() {
            Some(id) if id < n_tokens as u64 => {}
            Some(id) => {
                return Err(ModelError::BadKey {
                    key: key.to_owned(),
                    reason: format!("token id {id} is outside the vocabulary of {n_tokens}"),
                })
            }
            None => {
                return Err(ModelError::BadKey {
                    key: key.to_owned(),
                    reason: format!("expected a token id, found {}", value.type_description()),
                })
            }
        }
    }
    Ok(())
}

impl Vocab for TextModel {
    fn piece(&self, id: u32) -> Vec<u8> {
        TextModel::piece(self, id)
    }

    fn is_eog(&self, id: u32) -> bool {
        self.tokenizer.is_eog(id)
    }
}
