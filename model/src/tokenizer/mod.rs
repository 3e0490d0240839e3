//! The tokenizer read from GGUF metadata: SentencePiece-style (`tokenizer.ggml.model = llama`)
//! and byte-level BPE (`gpt2`), giving the same token ids as llama.cpp.
//!
//! Design choices:
//! - Algorithms follow llama.cpp's `llama-vocab.cpp` step for step (score-ordered SPM merges
//!   with byte fallback, rank-ordered BPE merges, the hand-written pre-tokenizer splitters,
//!   special-token partitioning longest first), because "same ids as llama.cpp" includes its
//!   tie-breaks and quirks; tests compare against llama.cpp's own vocabulary test files.
//! - Every token's text piece is computed once at load (as llama.cpp's piece cache), so
//!   detokenization is a lookup.
//! - [`StreamDecoder`] holds back incomplete UTF-8 so streamed output never splits a character.

mod error;
mod load;
mod merge;
mod pretok;
mod regex;
mod special;
mod stream;
mod ugm;
mod unicode;
mod wpm;

use std::collections::{BTreeSet, HashMap};

pub use error::TokenizerError;
pub use load::VocabParts;
pub use pretok::PreTokenizer;
pub use stream::StreamDecoder;
pub(crate) use unicode::byte_to_char_table;

/// Hash maps keyed by token text: Fx hashing (the SipHash default dominated encoding time)
/// with a per-process random seed, so crafted text cannot aim at collisions.
pub(crate) type FastMap<K, V> = HashMap<K, V, rustc_hash::FxSeededState>;

/// An empty [`FastMap`] with room for `cap` entries.
pub(crate) fn fast_map<K, V>(cap: usize) -> FastMap<K, V> {
    use std::hash::{BuildHasher, Hasher};
    let seed = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    HashMap::with_capacity_and_hasher(cap, rustc_hash::FxSeededState::with_seed(seed as usize))
}

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub mod attr {
    /// No type information.
    pub const UNDEFINED: u32 = 0;
    /// The unknown token.
    pub const UNKNOWN: u32 = 1 << 0;
    /// Reserved, never produced.
    pub const UNUSED: u32 = 1 << 1;
    /// A normal text piece.
    pub const NORMAL: u32 = 1 << 2;
    /// A control token (BOS, EOS, turn markers).
    pub const CONTROL: u32 = 1 << 3;
    /// A user-defined token matched verbatim in text.
    pub const USER_DEFINED: u32 = 1 << 4;
    /// A byte-fallback token `<0xXX>`.
    pub const BYTE: u32 = 1 << 5;
    /// Strip whitespace left of the token when parsing specials.
    pub const LSTRIP: u32 = 1 << 7;
    /// Strip whitespace right of the token when parsing specials.
    pub const RSTRIP: u32 = 1 << 8;
}

/// Which algorithm the vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// SentencePiece-style: `▁` for spaces, score-ordered merges, byte fallback.
    Spm,
    /// Byte-level BPE with the given pre-tokenizer.
    Bpe(PreTokenizer),
    /// WordPiece (`bert`): greedy longest pieces of normalised words.
    Wpm,
    /// Unigram (`t5`): SentencePiece normalisation and the best-scoring segmentation.
    Ugm,
}

/// A vocabulary and its encoding rules.
#[derive(Clone, Debug)]
pub struct Tokenizer {
    kind: Kind,
    tokens: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<u32>,
    token_to_id: FastMap<String, u32>,
    ranks: FastMap<String, FastMap<String, usize>>,
    bos: Option<u32>,
    eos: Option<u32>,
    eot: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    eog: BTreeSet<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    ignore_merges: bool,
    escape_whitespaces: bool,
    sep: Option<u32>,
    add_sep: bool,
    lowercase: bool,
    strip_accents: bool,
    max_token_len: usize,
    ugm: Option<Box<ugm::Ugm>>,
    special_cache: Vec<u32>,
    specials: special::Specials,
    pieces: Vec<Vec<u8>>,
    byte_char: [char; 256],
    char_byte: HashMap<char, u8>,
}

/// A piece of the input: raw text (byte range) or an already-recognised special token.
#[derive(Clone, Copy, Debug)]
enum Frag {
    Text(usize, usize),
    Token(u32),
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl Tokenizer {
    /// Reads the vocabulary from a GGUF file's `tokenizer.ggml.*` keys.
    pub fn from_gguf(file: &gguf::GgufFile) -> Result<Self, TokenizerError> {
        Self::from_metadata(file.metadata())
    }

    /// Reads the vocabulary from GGUF metadata.
    pub fn from_metadata(md: &gguf::Metadata) -> Result<Self, TokenizerError> {
        Self::from_parts(VocabParts::from_metadata(md)?)
    }

    /// Number of tokens.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// The algorithm in use.
    pub fn kind(&self) -> Kind {
        self.kind
    }

    /// Beginning-of-sequence id.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// End-of-sequence id.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// End-of-turn id.
    pub fn eot(&self) -> Option<u32> {
        self.eot
    }

    /// Unknown-token id.
    pub fn unk(&self) -> Option<u32> {
        self.unk
    }

    /// Padding id.
    pub fn pad(&self) -> Option<u32> {
        self.pad
    }

    /// Whether `encode(.., add_special = true, ..)` prepends BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether `encode(.., add_special = true, ..)` appends EOS.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }

    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> Vec<u32> {
        self.eog.iter().copied().collect()
    }

    /// True when generation should stop at `id`.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// The token's text as stored in the vocabulary.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The token's attribute bits ([`attr`]).
    pub fn token_attr(&self, id: u32) -> u32 {
        self.attrs
            .get(id as usize)
            .copied()
            .unwrap_or(attr::UNDEFINED)
    }

    /// The id of an exact token text.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text).copied()
    }

    /// Text to ids. `add_special` adds BOS/EOS as the metadata asks; `parse_special` lets
    /// control tokens written in the text (e.g. `<start_of_turn>`) become their ids.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::new();
        match self.kind {
            Kind::Spm => {
                // All fragments escaped first, so one piece cache serves the whole text.
                let mut escaped = Vec::new();
                let mut prev_special = true;
                for f in &frags {
                    match *f {
                        Frag::Text(s, e) => {
                            let mut t = String::with_capacity(e - s + 1);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..e]);
                            escaped.push(t.replace(' ', "\u{2581}"));
                            prev_special = false;
                        }
                        Frag::Token(_) => prev_special = true,
                    }
                }
                let mut seen = fast_map(0);
                let mut texts = escaped.iter();
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                for f in frags {
                    match f {
                        Frag::Text(..) => {
                            if let Some(t) = texts.next() {
                                merge::spm_tokenize(self, t.as_bytes(), &mut out, &mut seen);
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.eos);
                }
            }
            Kind::Wpm => {
                // llama.cpp adds the BOS ([CLS]) and SEP ids whenever specials are asked for.
                if add_special {
                    out.extend(self.bos);
                }
                for f in frags {
                    match f {
                        Frag::Text(s, e) => {
                            let lookup = |p: &str| self.token_to_id.get(p).copied();
                            for w in wpm::words(&text[s..e], self.lowercase, self.strip_accents) {
                                wpm::tokenize_word(
                                    &w,
                                    self.max_token_len,
                                    lookup,
                                    self.unk,
                                    &mut out,
                                );
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_sep {
                    out.extend(self.sep);
                }
            }
            Kind::Ugm => {
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                for f in frags {
                    match f {
                        Frag::Text(s, e) => {
                            if let Some(u) = &self.ugm {
                                u.tokenize(
                                    &text[s..e],
                                    &self.scores,
                                    &self.attrs,
                                    self.unk,
                                    &mut out,
                                );
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.eos);
                }
            }
            Kind::Bpe(pre) => {
                if add_special && self.add_bos {
                    out.extend(self.bos);
                }
                for f in frags {
                    match f {
                        Frag::Text(s, e) => self.bpe_tokenize(pre, &text[s..e], &mut out),
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.eos);
                }
            }
        }
        out
    }

    /// Splits text around special tokens, longest token first (llama.cpp's
    /// `tokenizer_st_partition`). Control and unknown tokens count only with `parse_special`;
    /// user-defined tokens always do.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        self.specials
            .partition(text, &self.attrs, parse_special)
            .unwrap_or_else(|| self.partition_scan(text, parse_special))
    }

    /// The same partition as llama.cpp computes it, one scan of the text per special token;
    /// used when the automaton could not be built.
    fn partition_scan(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let bytes = text.as_bytes();
        let mut frags = if text.is_empty() {
            Vec::new()
        } else {
            vec![Frag::Text(0, text.len())]
        };
        for &id in &self.special_cache {
            let a = self.attrs[id as usize];
            if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let pat = self.tokens[id as usize].as_bytes();
            if !frags.iter().any(|f| matches!(f, Frag::Text(..))) {
                break;
            }
            let mut next = Vec::with_capacity(frags.len());
            for f in frags {
                let Frag::Text(mut s, e) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(m) = find(&bytes[s..e], pat).map(|p| p + s) {
                    let mut left_end = m;
                    if a & attr::LSTRIP != 0 {
                        while left_end > s && is_c_space(bytes[left_end - 1]) {
                            left_end -= 1;
                        }
                    }
                    if left_end > s {
                        next.push(Frag::Text(s, left_end));
                    }
                    next.push(Frag::Token(id));
                    s = m + pat.len();
                    if a & attr::RSTRIP != 0 {
                        while s < e && is_c_space(bytes[s]) {
                            s += 1;
                        }
                    }
                }
                if s < e {
                    next.push(Frag::Text(s, e));
                }
            }
            frags = next;
        }
        frags
    }

    fn bpe_tokenize(&self, pre: PreTokenizer, text: &str, out: &mut Vec<u32>) {
        let escaped;
        let text = if self.escape_whitespaces {
            escaped = text.replace(' ', "\u{2581}");
            escaped.as_str()
        } else {
            text
        };
        let byte_encode = pre.byte_encode();
        for word in pre.split(text) {
            let encoded: String = if byte_encode {
                word.bytes().map(|b| self.byte_char[b as usize]).collect()
            } else {
                word
            };
            let whole_newlines = pre == PreTokenizer::Gemma4 && encoded.bytes().all(|b| b == b'\n');
            if self.ignore_merges || whole_newlines {
                if let Some(&id) = self.token_to_id.get(&encoded) {
                    out.push(id);
                    continue;
                }
            }
            let rank = |a: &[u8], b: &[u8]| {
                let a = std::str::from_utf8(a).ok()?;
                let b = std::str::from_utf8(b).ok()?;
                self.ranks.get(a)?.get(b).copied()
            };
            let eb = encoded.as_bytes();
            for (s, e) in merge::bpe_word(eb, rank) {
                let piece = &encoded[s..e];
                match self.token_to_id.get(piece) {
                    Some(&id) => out.push(id),
                    None if byte_encode => {
                        // llama.cpp looks each byte of the piece up as a one-byte string; only
                        // ASCII bytes can match, the rest are dropped.
                        for &b in piece.as_bytes() {
                            if b.is_ascii() {
                                let one = [b];
                                if let Some(&id) = std::str::from_utf8(&one)
                                    .ok()
                                    .and_then(|s| self.token_to_id.get(s))
                                {
                                    out.push(id);
                                }
                            }
                        }
                    }
                    None => {
                        for &b in piece.as_bytes() {
                            if let Some(&id) = self.token_to_id.get(&format!("<0x{b:02X}>")) {
                                out.push(id);
                            }
                        }
                    }
                }
            }
        }
    }

    /// The bytes a token stands for, special tokens included as text (the piece cache).
    pub fn token_to_piece(&self, id: u32) -> Vec<u8> {
        self.pieces.get(id as usize).cloned().unwrap_or_default()
    }

    /// llama.cpp's `llama_token_to_piece`: `special = false` renders control/unknown tokens as
    /// nothing; up to `lstrip` leading spaces are removed.
    pub fn token_to_piece_ext(&self, id: u32, lstrip: usize, special: bool) -> Vec<u8> {
        let a = self.token_attr(id);
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Vec::new();
        }
        let p = self
            .pieces
            .get(id as usize)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let n = p.iter().take(lstrip).take_while(|&&b| b == b' ').count();
        p[n..].to_vec()
    }

    fn make_piece(&self, id: u32, special: bool) -> Vec<u8> {
        let a = self.token_attr(id);
        if !special && a & (attr::UNKNOWN | attr::CONTROL) != 0 {
            return Vec::new();
        }
        let text = &self.tokens[id as usize];
        if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
            return text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            return match self.kind {
                Kind::Spm | Kind::Wpm | Kind::Ugm => text.replace('\u{2581}', " ").into_bytes(),
                Kind::Bpe(_) => self.decode_bpe_text(text),
            };
        }
        if a & attr::BYTE != 0 {
            return byte_of_token(text).map(|b| vec![b]).unwrap_or_default();
        }
        Vec::new()
    }

    /// Maps GPT-2's printable code points back to bytes (`llama_decode_text`).
    fn decode_bpe_text(&self, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len());
        for c in text.chars() {
            match self.char_byte.get(&c) {
                Some(&b) => out.push(b),
                None => {
                    let mut buf = [0u8; 4];
                    out.extend_from_slice(b"[UNK_BYTE_0x");
                    for b in c.encode_utf8(&mut buf).bytes() {
                        out.extend_from_slice(format!("{b:02x}").as_bytes());
                    }
                    out.extend_from_slice(text.as_bytes());
                    out.push(b']');
                }
            }
        }
        out
    }

    /// llama.cpp's `llama_detokenize`: the pieces joined, with the SPM leading space removed,
    /// optional removal of BOS/EOS and llama.cpp's space clean-up for BPE vocabularies.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && self.bos.is_some() && ids.first().copied() == self.bos
        {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && self.add_eos && self.eos.is_some() && ids.last().copied() == self.eos {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            text.extend(self.token_to_piece_ext(id, usize::from(remove_space), unparse_special));
            remove_space = false;
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// Ids to text for people: special tokens hidden, a leading BOS skipped so the space prefix
    /// that encoding added is removed again (`decode(&encode(s, true, false)) == s` for text
    /// the vocabulary covers), otherwise llama.cpp's `llama_detokenize`; invalid UTF-8 replaced.
    pub fn decode(&self, ids: &[u32]) -> String {
        let ids = match (ids.first(), self.bos) {
            (Some(&first), Some(bos)) if first == bos => &ids[1..],
            _ => ids,
        };
        String::from_utf8_lossy(&self.detokenize(ids, false, false)).into_owned()
    }
}

impl merge::SpmVocab for Tokenizer {
    fn piece(&self, text: &[u8]) -> Option<(u32, f32)> {
        let s = std::str::from_utf8(text).ok()?;
        let &id = self.token_to_id.get(s)?;
        Some((id, self.scores[id as usize]))
    }

    fn byte_token(&self, b: u8) -> Option<u32> {
        let hex = format!("<0x{b:02X}>");
        if let Some(&id) = self.token_to_id.get(&hex) {
            return Some(id);
        }
        std::str::from_utf8(&[b])
            .ok()
            .and_then(|s| self.token_to_id.get(s).copied())
    }
}

fn byte_of_token(text: &str) -> Option<u8> {
    let hex = text.get(3..5)?;
    u8::from_str_radix(hex, 16).ok()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.is_empty() || needle.len() > hay.len() {
        return None;
    }
    hay.windows(needle.len()).position(|w| w == needle)
}

/// llama.cpp's three clean-up passes: no space before `?!.,`, none around a lone `'`, and
/// none before `'s`, `'m`, `'re`, `'ve`. Written in place like the original, whose reads see
/// its own earlier writes.
fn clean_up_spaces(t: &mut Vec<u8>) {
    let n1 = t.len();
    let mut total = usize::from(n1 > 0);
    for i in 1..n1 {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    let n2 = total;
    total = usize::from(n2 > 0);
    let mut i = 1;
    while i < n2 {
        let x = t[i];
        if x == b'\'' && i + 1 < n2 && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    let n3 = total;
    total = usize::from(n3 > 0);
    for i in 1..n3 {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < n3 {
            let x1 = t[i + 1];
            let drop = match x1 {
                b's' | b'm' => true,
                b't' | b'd' => false,
                _ if i + 2 < n3 => matches!((x1, t[i + 2]), (b'r', b'e') | (b'v', b'e')),
                _ => false,
            };
            if drop {
                total -= 1;
            }
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
}

#[cfg(test)]
mod tests;
