//! A model together with its tokenizer and chat template: what the CLI and the generation loop
//! need to go from text to text.

use std::path::Path;
use std::sync::Arc;

use crate::chat::{strip_leading_bos, ChatTemplate};
use crate::error::ModelError;
use crate::generate::Vocab;
use crate::session::Model;
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
        let path = path.as_ref();
        Self::from_model(Model::load(path, progress)?).map_err(|e| e.in_file(path))
    }

    /// Adds the tokenizer and chat template read from the model's own file.
    pub fn from_model(model: Model) -> Result<Self, ModelError> {
        let tokenizer = Tokenizer::from_gguf(model.file())?;
        let md = model.file().metadata();
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

impl Vocab for TextModel {
    fn piece(&self, id: u32) -> Vec<u8> {
        TextModel::piece(self, id)
    }

    fn is_eog(&self, id: u32) -> bool {
        self.tokenizer.is_eog(id)
    }
}
