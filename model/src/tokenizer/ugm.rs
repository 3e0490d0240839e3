//! Unigram (T5-style, `tokenizer.ggml.model = t5`) as llama.cpp's `llm_tokenizer_ugm`:
//! SentencePiece's precompiled normalisation map (a XOR-compressed double array over byte
//! prefixes with replacement strings), whitespace handling, then the Viterbi search for the
//! highest-scoring segmentation, unknown code points costing the lowest score minus 10.

use super::{attr, fast_map, FastMap, TokenizerError};

/// A byte trie mapping strings to token ids (later insertions of the same text win).
#[derive(Clone, Debug)]
struct Trie {
    values: Vec<Option<u32>>,
    edges: FastMap<(u32, u8), u32>,
}

impl Trie {
    fn new() -> Self {
        Self {
            values: vec![None],
            edges: fast_map(0),
        }
    }

    fn insert(&mut self, key: &[u8], value: u32) {
        let mut node = 0u32;
        for &b in key {
            node = match self.edges.get(&(node, b)) {
                Some(&n) => n,
                None => {
                    let n = self.values.len() as u32;
                    self.values.push(None);
                    self.edges.insert((node, b), n);
                    n
                }
            };
        }
        self.values[node as usize] = Some(value);
    }

    fn step(&self, node: u32, b: u8) -> Option<u32> {
        self.edges.get(&(node, b)).copied()
    }

    /// Length of the longest path of `key` through the trie, whether or not it ends on a
    /// stored string (llama.cpp's `get_longest_prefix`).
    fn longest_path(&self, key: &[u8]) -> usize {
        let mut node = 0;
        for (i, &b) in key.iter().enumerate() {
            match self.step(node, b) {
                Some(n) => node = n,
                None => return i,
            }
        }
        key.len()
    }
}

/// Options read from the vocabulary that shape normalisation.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UgmOptions {
    pub escape_whitespaces: bool,
    pub add_space_prefix: bool,
    pub remove_extra_whitespaces: bool,
}

/// The unigram model's tables.
#[derive(Clone, Debug)]
pub(crate) struct Ugm {
    matcher: Trie,
    user: Trie,
    xcda: Vec<u32>,
    replacements: Vec<u8>,
    unknown_score: f32,
    opts: UgmOptions,
}

/// Where a normalised prefix comes from.
enum Norm {
    Input(usize),
    Replacement(usize, usize),
}

impl Ugm {
    pub(crate) fn new(
        tokens: &[String],
        scores: &[f32],
        attrs: &[u32],
        charsmap: Option<&[u8]>,
        opts: UgmOptions,
    ) -> Result<Self, TokenizerError> {
        let (mut xcda, mut replacements) = (Vec::new(), Vec::new());
        if let Some(map) = charsmap.filter(|m| !m.is_empty()) {
            let bad = |what: &str| TokenizerError::BadCharsmap(what.to_owned());
            let head: [u8; 4] = map
                .get(..4)
                .and_then(|h| h.try_into().ok())
                .ok_or_else(|| bad("shorter than its 4-byte size header"))?;
            let blob = u32::from_le_bytes(head) as usize;
            if blob.checked_add(4).is_none_or(|end| end >= map.len()) {
                return Err(bad(&format!(
                    "double array of {blob} bytes does not fit in {} bytes",
                    map.len()
                )));
            }
            xcda = map[4..4 + blob]
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            replacements = map[4 + blob..].to_vec();
        }
        let (mut min, mut matcher, mut user) = (f32::MAX, Trie::new(), Trie::new());
        for (id, text) in tokens.iter().enumerate() {
            let a = attrs[id];
            if a & attr::NORMAL != 0 {
                min = min.min(scores[id]);
            }
            if a & (attr::NORMAL | attr::USER_DEFINED | attr::UNUSED) != 0 {
                matcher.insert(text.as_bytes(), id as u32);
            }
            if a & attr::USER_DEFINED != 0 {
                user.insert(text.as_bytes(), id as u32);
            }
        }
        Ok(Self {
            matcher,
            user,
            xcda,
            replacements,
            unknown_score: min - 10.0,
            opts,
        })
    }

    /// The double array's node, `None` past its end.
    fn node(&self, i: u32) -> Option<u32> {
        self.xcda.get(i as usize).copied()
    }

    fn base(p: u32) -> u32 {
        (p >> 10) << ((p & (1 << 9)) >> 6)
    }

    /// The longest charsmap rule matching at `input[at..]`: (consumed, replacement start).
    fn charsmap_prefix(&self, input: &[u8]) -> Option<(usize, usize)> {
        let mut idx = Self::base(self.node(0)?);
        let mut best = None;
        for (k, &c) in input.iter().enumerate() {
            if c == 0 {
                break;
            }
            idx ^= u32::from(c);
            let p = self.node(idx)?;
            if p & ((1 << 31) | 0xFF) != u32::from(c) {
                break;
            }
            let leaf = (p >> 8) & 1 == 1;
            idx ^= Self::base(p);
            if leaf {
                let value = self.node(idx)? & ((1 << 31) - 1);
                best = Some((k + 1, value as usize));
            }
        }
        best
    }

    fn normalize_prefix(&self, input: &[u8], at: usize) -> (Norm, usize) {
        let rest = &input[at..];
        let user = self.user.longest_path(rest);
        if user > 0 {
            return (Norm::Input(user), user);
        }
        if let Some((consumed, off)) = self.charsmap_prefix(rest) {
            // A replacement must be NUL-terminated inside the map; a broken one is ignored.
            if let Some(len) = self
                .replacements
                .get(off..)
                .and_then(|r| r.iter().position(|&b| b == 0))
            {
                return (Norm::Replacement(off, len), consumed);
            }
        }
        let n = super::merge::utf8_len(rest[0]).min(rest.len());
        (Norm::Input(n), n)
    }

    fn normalize(&self, text: &str) -> Vec<u8> {
        let input = text.as_bytes();
        let o = self.opts;
        let space: &[u8] = if o.escape_whitespaces {
            "\u{2581}".as_bytes()
        } else {
            b" "
        };
        // llama.cpp never sets `treat_whitespace_as_suffix`, so the space only ever comes first.
        let prepend = o.add_space_prefix;
        let merge = o.remove_extra_whitespaces;
        let mut out = Vec::with_capacity(input.len() * 3);
        let (mut prepended, mut in_word) = (false, false);
        let mut at = 0;
        while at < input.len() {
            let (norm, consumed) = self.normalize_prefix(input, at);
            let piece = match norm {
                Norm::Input(n) => &input[at..at + n],
                Norm::Replacement(off, len) => &self.replacements[off..off + len],
            };
            for &c in piece {
                if c != b' ' {
                    if !in_word {
                        in_word = true;
                        if (prepend && !prepended) || merge {
                            out.extend_from_slice(space);
                            prepended = true;
                        }
                    }
                    out.push(c);
                } else {
                    in_word = false;
                    if !merge {
                        out.extend_from_slice(space);
                    }
                }
            }
            at += consumed;
        }
        out
    }

    /// Appends the best segmentation of `text` to `out`.
    pub(crate) fn tokenize(
        &self,
        text: &str,
        scores: &[f32],
        attrs: &[u32],
        unk: Option<u32>,
        out: &mut Vec<u32>,
    ) {
        let norm = self.normalize(text);
        let n = norm.len();
        if n == 0 {
            return;
        }
        // (token, start of the token, best score of a segmentation ending here)
        let mut best: Vec<(Option<u32>, usize, f64)> = vec![(unk, 0, f64::MIN); n + 1];
        best[0] = (unk, 0, 0.0);
        let mut at = 0;
        while at < n {
            let cp_len = super::merge::utf8_len(norm[at]).min(n - at);
            let here = best[at].2;
            let mut single = false;
            let mut node = self.matcher.step(0, norm[at]);
            let mut end = at + 1;
            while let Some(nd) = node {
                if let Some(id) = self.matcher.values[nd as usize] {
                    if end - at == cp_len {
                        single = true;
                    }
                    let score = if attrs[id as usize] & attr::USER_DEFINED != 0 {
                        0.0
                    } else {
                        f64::from(scores[id as usize])
                    };
                    if here + score > best[end].2 {
                        best[end] = (Some(id), at, here + score);
                    }
                }
                if end >= n {
                    break;
                }
                node = self.matcher.step(nd, norm[end]);
                end += 1;
            }
            if !single {
                let e = at + cp_len;
                let score = here + f64::from(self.unknown_score);
                if score > best[e].2 {
                    best[e] = (unk, at, score);
                }
            }
            at += cp_len;
        }
        let first = out.len();
        let mut prev_unknown = false;
        let mut pos = n;
        loop {
            let (tok, start, _) = best[pos];
            let unknown = tok == unk;
            if !(prev_unknown && unknown) {
                out.extend(tok);
            }
            if start == 0 {
                break;
            }
            prev_unknown = unknown;
            pos = start;
        }
        out[first..].reverse();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> (Vec<String>, Vec<f32>, Vec<u32>, Ugm) {
        let tokens: Vec<String> = [
            "<pad>", "</s>", "<unk>", "▁", "▁hello", "▁he", "llo", "h", "e", "l", "o", "▁world",
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        let scores = vec![
            0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -3.0, -5.0, -5.0, -5.0, -5.0, -2.5,
        ];
        let mut attrs = vec![attr::NORMAL; tokens.len()];
        attrs[0] = attr::CONTROL;
        attrs[1] = attr::CONTROL;
        attrs[2] = attr::UNKNOWN;
        let opts = UgmOptions {
            escape_whitespaces: true,
            add_space_prefix: true,
            remove_extra_whitespaces: true,
        };
        let ugm = Ugm::new(&tokens, &scores, &attrs, None, opts).expect("model");
        (tokens, scores, attrs, ugm)
    }

    #[test]
    fn viterbi_prefers_the_best_total_score() {
        let (_, scores, attrs, ugm) = model();
        let mut out = Vec::new();
        ugm.tokenize("hello  world", &scores, &attrs, Some(2), &mut out);
        // ▁hello (-2) beats ▁he + llo (-6); extra spaces are merged.
        assert_eq!(out, [4, 11]);
        out.clear();
        // Unknown code points collapse into one unknown token.
        ugm.tokenize("hello ÿÿ", &scores, &attrs, Some(2), &mut out);
        assert_eq!(out, [4, 3, 2]);
    }

    #[test]
    fn short_charsmap_is_an_error() {
        let (tokens, scores, attrs, _) = model();
        let opts = UgmOptions {
            escape_whitespaces: true,
            add_space_prefix: true,
            remove_extra_whitespaces: false,
        };
        let e = Ugm::new(&tokens, &scores, &attrs, Some(&[9, 0, 0, 0, 1]), opts).unwrap_err();
        assert!(e.to_string().contains("does not fit"), "{e}");
    }
}
