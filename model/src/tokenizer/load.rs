//! Building a [`Tokenizer`] from GGUF metadata with llama.cpp's defaults and fix-ups (special
//! ids per tokenizer model, end-of-generation detection by token text, attribute overrides).

use std::collections::BTreeSet;

use gguf::{Metadata, MetadataValue};

use super::pretok::PreFlags;
use super::{attr, Kind, PreTokenizer, Tokenizer, TokenizerError};

/// Raw vocabulary fields as GGUF stores them; [`Tokenizer::from_parts`] applies the rules.
#[derive(Clone, Debug, Default)]
pub struct VocabParts {
    /// `tokenizer.ggml.model`
    pub model: String,
    /// `tokenizer.ggml.pre`
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type`
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`
    pub merges: Vec<String>,
    /// `(key suffix after "tokenizer.ggml.", id)` for every special id key present.
    pub special_ids: Vec<(String, u64)>,
    /// `tokenizer.ggml.add_bos_token`
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`
    pub add_space_prefix: Option<bool>,
    /// `general.name`
    pub name: Option<String>,
    /// `tokenizer.ggml.add_sep_token`
    pub add_sep: Option<bool>,
    /// `tokenizer.ggml.normalizer.lowercase` (WordPiece)
    pub lowercase: Option<bool>,
    /// `tokenizer.ggml.normalizer.strip_accents` (WordPiece)
    pub strip_accents: Option<bool>,
    /// `tokenizer.ggml.precompiled_charsmap` (Unigram)
    pub precompiled_charsmap: Option<Vec<u8>>,
    /// `tokenizer.ggml.remove_extra_whitespaces` (Unigram)
    pub remove_extra_whitespaces: Option<bool>,
}

const SPECIAL_KEYS: &[&str] = &[
    "bos_token_id",
    "eos_token_id",
    "eot_token_id",
    "eom_token_id",
    "unknown_token_id",
    "padding_token_id",
    "seperator_token_id",
    "mask_token_id",
    "fim_pad_token_id",
    "fim_rep_token_id",
    "fim_sep_token_id",
];

impl VocabParts {
    /// Reads the fields from a GGUF file's metadata.
    pub fn from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let tokens = md.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let scores = match md.get("tokenizer.ggml.scores") {
            None => None,
            Some(MetadataValue::Array(gguf::ArrayValue::I32(v))) => {
                Some(v.iter().map(|&x| x as f32).collect())
            }
            Some(_) => Some(md.get_f32_array("tokenizer.ggml.scores")?.to_vec()),
        };
        let token_types = md
            .get_i32_array_opt("tokenizer.ggml.token_type")?
            .map(<[i32]>::to_vec);
        let model = md.get_str("tokenizer.ggml.model")?;
        let pre = md.get_str_opt("tokenizer.ggml.pre")?;
        let merges = match md.get_str_array_opt("tokenizer.ggml.merges")? {
            Some(m) => m.to_vec(),
            // As llama.cpp: a BPE vocabulary without merges would tokenize everything into
            // single bytes, so it is refused (Kimi-K2's pre-tokenizer does without them).
            None if matches!(model, "gpt2" | "gemma4") && pre != Some("kimi-k2") => {
                return Err(TokenizerError::MissingMerges(model.to_owned()))
            }
            None => Vec::new(),
        };
        let mut special_ids = Vec::new();
        for k in SPECIAL_KEYS {
            let key = format!("tokenizer.ggml.{k}");
            if let Some(v) = md.get(&key) {
                let id = v.to_u64().ok_or_else(|| gguf::GgufError::WrongType {
                    key: key.clone(),
                    expected: "uint32",
                    found: v.type_description(),
                })?;
                special_ids.push(((*k).to_owned(), id));
            }
        }
        Ok(Self {
            model: model.to_owned(),
            pre: pre.map(str::to_owned),
            tokens,
            scores,
            token_types,
            merges,
            special_ids,
            add_bos: md.get_bool_opt("tokenizer.ggml.add_bos_token")?,
            add_eos: md.get_bool_opt("tokenizer.ggml.add_eos_token")?,
            add_space_prefix: md.get_bool_opt("tokenizer.ggml.add_space_prefix")?,
            name: md.get_str_opt("general.name")?.map(str::to_owned),
            add_sep: md.get_bool_opt("tokenizer.ggml.add_sep_token")?,
            lowercase: md.get_bool_opt("tokenizer.ggml.normalizer.lowercase")?,
            strip_accents: md.get_bool_opt("tokenizer.ggml.normalizer.strip_accents")?,
            precompiled_charsmap: match md.get("tokenizer.ggml.precompiled_charsmap") {
                None => None,
                Some(MetadataValue::Array(gguf::ArrayValue::U8(v))) => Some(v.clone()),
                Some(MetadataValue::Array(gguf::ArrayValue::I8(v))) => {
                    Some(v.iter().map(|&b| b as u8).collect())
                }
                Some(other) => {
                    return Err(gguf::GgufError::WrongType {
                        key: "tokenizer.ggml.precompiled_charsmap".to_owned(),
                        expected: "uint8 or int8 array",
                        found: other.type_description(),
                    }
                    .into())
                }
            },
            remove_extra_whitespaces: md.get_bool_opt("tokenizer.ggml.remove_extra_whitespaces")?,
        })
    }
}

/// End-of-generation token texts llama.cpp recognises.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts that make a token the end-of-turn token when the metadata names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

fn attr_of_type(t: i32) -> u32 {
    match t {
        1 => attr::NORMAL,
        2 => attr::UNKNOWN,
        3 => attr::CONTROL,
        4 => attr::USER_DEFINED,
        5 => attr::UNUSED,
        6 => attr::BYTE,
        _ => attr::UNDEFINED,
    }
}

impl Tokenizer {
    /// Builds the tokenizer from raw vocabulary fields.
    pub fn from_parts(p: VocabParts) -> Result<Self, TokenizerError> {
        let n = p.tokens.len();
        if n == 0 {
            return Err(TokenizerError::Empty);
        }
        let mut no_bos = false;
        let mut escape_whitespaces = false;
        let (kind, mut add_bos, mut add_space_prefix, clean_spaces, ignore_merges) =
            match p.model.as_str() {
                "llama" => (Kind::Spm, true, true, false, false),
                "bert" => (Kind::Wpm, true, false, true, false),
                "t5" => (Kind::Ugm, false, true, false, false),
                "gpt2" | "gemma4" => {
                    let name = if p.model == "gemma4" {
                        Some("gemma4")
                    } else {
                        p.pre.as_deref()
                    };
                    let (pre, flags) = match PreTokenizer::lookup(name) {
                        Some(found) => found,
                        None => {
                            // llama.cpp refuses unknown names; the default splitter still gives
                            // usable (if not identical) tokens, so warn and go on.
                            tracing::warn!(
                                "tokenizer.ggml.pre `{}` is not known; using the default \
                                 pre-tokenizer (tokens may differ from the model's training)",
                                name.unwrap_or_default()
                            );
                            (PreTokenizer::Default, PreFlags::default())
                        }
                    };
                    if name.is_none() {
                        tracing::warn!(
                            "tokenizer.ggml.pre is missing; using the default pre-tokenizer \
                             (generation quality may be degraded)"
                        );
                    }
                    no_bos = flags.no_bos;
                    escape_whitespaces = flags.escape_whitespaces;
                    (
                        Kind::Bpe(pre),
                        flags.add_bos,
                        false,
                        !flags.no_clean_spaces,
                        flags.ignore_merges,
                    )
                }
                other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
            };
        if let Some(v) = p.add_space_prefix {
            add_space_prefix = v;
        }
        let mut add_eos = kind == Kind::Ugm;

        if let Some(s) = &p.scores {
            if s.len() < n {
                return Err(TokenizerError::ShortArray {
                    key: "tokenizer.ggml.scores",
                    found: s.len(),
                    expected: n,
                });
            }
        }
        if let Some(t) = &p.token_types {
            if t.len() < n {
                return Err(TokenizerError::ShortArray {
                    key: "tokenizer.ggml.token_type",
                    found: t.len(),
                    expected: n,
                });
            }
        }

        let mut tokens = p.tokens;
        let mut token_to_id = super::fast_map(n);
        // (earlier id, later id, count) of texts that appear more than once
        let mut duplicates: Option<(usize, usize, usize)> = None;
        let mut attrs = vec![attr::NORMAL; n];
        for (i, text) in tokens.iter_mut().enumerate() {
            if text.is_empty() {
                *text = format!("[EMPTY_{i}]");
            }
            // Later duplicates win, as in llama.cpp's map.
            if let Some(earlier) = token_to_id.insert(text.clone(), i as u32) {
                duplicates.get_or_insert((earlier as usize, i, 0)).2 += 1;
            }
            if let Some(t) = &p.token_types {
                attrs[i] = attr_of_type(t[i]);
            }
        }
        if let Some((earlier, later, count)) = duplicates {
            // A text's earlier ids can still be decoded but are never produced (a byte token
            // shadowed this way is not used by byte fallback): the file is odd, not unusable.
            tracing::warn!(
                "tokenizer.ggml.tokens: {count} texts appear more than once (the first: ids \
                 {earlier} and {later}, {:?}); text maps to the later id, as in llama.cpp",
                tokens[later].chars().take(40).collect::<String>()
            );
        }
        let scores = p.scores.unwrap_or_else(|| vec![0.0; n]);

        let mut ranks: super::FastMap<String, super::FastMap<String, usize>> = super::fast_map(0);
        if matches!(kind, Kind::Bpe(_)) {
            // (index of the first, count)
            let mut malformed: Option<(usize, usize)> = None;
            for (i, m) in p.merges.iter().enumerate() {
                // Split at the first space after the first byte (a merge may start with one).
                let split = m.as_bytes().iter().skip(1).position(|&b| b == b' ');
                let Some(at) = split else {
                    // llama.cpp keeps such an entry as a pair of empty strings, which never
                    // matches: the same as skipping it, with the later ranks unchanged.
                    malformed.get_or_insert((i, 0)).1 += 1;
                    continue;
                };
                let (a, b) = (&m[..at + 1], &m[at + 2..]);
                ranks
                    .entry(a.to_owned())
                    .or_insert_with(|| super::fast_map(0))
                    .entry(b.to_owned())
                    .or_insert(i);
            }
            if let Some((first, count)) = malformed {
                tracing::warn!(
                    "tokenizer.ggml.merges: {count} of {} entries are not two tokens separated \
                     by a space (the first at index {first}: {:?}); they are ignored, as \
                     llama.cpp ignores them",
                    p.merges.len(),
                    p.merges[first].chars().take(40).collect::<String>()
                );
            }
        }

        let in_range = |id: Option<u64>| id.filter(|&v| (v as usize) < n).map(|v| v as u32);
        let (mut bos, mut eos, mut unk) = match kind {
            Kind::Spm => (in_range(Some(1)), in_range(Some(2)), in_range(Some(0))),
            Kind::Bpe(_) if p.model == "gemma4" => (None, None, None),
            Kind::Bpe(_) => (in_range(Some(11)), in_range(Some(11)), None),
            Kind::Wpm => (in_range(Some(101)), None, in_range(Some(100))),
            Kind::Ugm => (None, in_range(Some(1)), in_range(Some(2))),
        };
        let mut sep = match kind {
            Kind::Wpm => in_range(Some(102)),
            _ => None,
        };
        if no_bos {
            bos = None;
        }
        let (mut eot, mut eom, mut pad, mut fim) = (None, None, None, Vec::new());
        for (k, id) in &p.special_ids {
            let Some(id) = in_range(Some(*id)) else {
                continue;
            };
            match k.as_str() {
                "bos_token_id" => bos = Some(id),
                "eos_token_id" => eos = Some(id),
                "eot_token_id" => eot = Some(id),
                "eom_token_id" => eom = Some(id),
                "unknown_token_id" => unk = Some(id),
                "padding_token_id" => pad = Some(id),
                "seperator_token_id" => sep = Some(id),
                "mask_token_id" => {}
                _ => fim.push(id),
            }
        }
        if let Some(v) = p.add_bos {
            add_bos = v;
        }
        if let Some(v) = p.add_eos {
            add_eos = v;
        }

        // End-of-turn and end-of-message by text, when the metadata does not name them.
        let mut by_id: Vec<(u32, &str)> =
            token_to_id.iter().map(|(t, &i)| (i, t.as_str())).collect();
        by_id.sort_unstable();
        for &(id, text) in &by_id {
            if eot.is_none() && EOT_TEXTS.contains(&text) {
                eot = Some(id);
                attrs[id as usize] |= attr::CONTROL;
            }
            if eom.is_none() && text == "<|eom_id|>" {
                eom = Some(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        for &(id, text) in &by_id {
            let a = &mut attrs[id as usize];
            if *a & attr::CONTROL != 0 && text.contains("unused") {
                *a |= attr::UNUSED;
            }
        }
        let mut eog: BTreeSet<u32> = fim.into_iter().collect();
        for &(id, text) in &by_id {
            if EOG_TEXTS.contains(&text) {
                eog.insert(id);
                attrs[id as usize] |= attr::CONTROL;
            }
        }
        eog.extend(eos);
        eog.extend(eot);
        eog.extend(eom);
        let has =
            |eog: &BTreeSet<u32>, t: &str| eog.iter().find(|&&i| tokens[i as usize] == t).copied();
        let harmony = has(&eog, "<|return|>").is_some() && has(&eog, "<|call|>").is_some()
            || has(&eog, "<|calls|>").is_some() && has(&eog, "<|flush|>").is_some();
        if let (true, Some(end)) = (harmony, has(&eog, "<|end|>")) {
            eog.remove(&end);
            attrs[end as usize] = attr::USER_DEFINED;
        }
        let normal_s =
            has(&eog, "<|tool_response>").is_some() || has(&eog, "<|plamo:eos|>").is_some();
        if let (true, Some(s)) = (normal_s, has(&eog, "</s>")) {
            eog.remove(&s);
            attrs[s as usize] = attr::NORMAL;
        }

        let mut special_cache: Vec<u32> = (0..n as u32)
            .filter(|&i| {
                attrs[i as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        special_cache.sort_by(|&a, &b| tokens[b as usize].len().cmp(&tokens[a as usize].len()));

        let byte_char = super::unicode::byte_to_char_table();
        let char_byte = byte_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();

        let max_token_len = tokens.iter().map(String::len).max().unwrap_or(0);
        let mut tok = Tokenizer {
            kind,
            tokens,
            scores,
            attrs,
            token_to_id,
            ranks,
            bos,
            eos,
            eot,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            ignore_merges,
            escape_whitespaces,
            sep,
            add_sep: p.add_sep.unwrap_or(kind == Kind::Wpm),
            lowercase: p.lowercase.unwrap_or(true),
            strip_accents: p.strip_accents.or(p.lowercase).unwrap_or(true),
            max_token_len,
            ugm: None,
            special_cache,
            specials: super::special::Specials::default(),
            pieces: Vec::new(),
            byte_char,
            char_byte,
        };
        tok.pieces = (0..n as u32).map(|i| tok.make_piece(i, true)).collect();

        // Per-model attribute fix-ups applied after the caches, as llama.cpp does.
        let name = p.name.unwrap_or_default().to_lowercase();
        if name.contains("phi-3") || name.contains("phi3") {
            for &id in &tok.special_cache {
                tok.attrs[id as usize] |= attr::RSTRIP;
            }
            for (t, on) in [
                ("</s>", true),
                ("<unk>", false),
                ("<s>", false),
                ("<|endoftext|>", false),
            ] {
                if let Some(&id) = tok.token_to_id.get(t) {
                    let a = &mut tok.attrs[id as usize];
                    *a = if on {
                        *a | attr::RSTRIP
                    } else {
                        *a & !attr::RSTRIP
                    };
                }
            }
        }
        tok.specials = super::special::Specials::new(&tok.tokens, &tok.attrs, &tok.special_cache);
        if kind == Kind::Ugm {
            let opts = super::ugm::UgmOptions {
                escape_whitespaces: true,
                add_space_prefix: tok.add_space_prefix,
                remove_extra_whitespaces: p.remove_extra_whitespaces.unwrap_or(false),
            };
            tok.ugm = Some(Box::new(super::ugm::Ugm::new(
                &tok.tokens,
                &tok.scores,
                &tok.attrs,
                p.precompiled_charsmap.as_deref(),
                opts,
            )?));
        }
        Ok(tok)
    }
}
