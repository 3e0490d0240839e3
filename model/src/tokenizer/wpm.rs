//! WordPiece (BERT-style, `tokenizer.ggml.model = bert`) as llama.cpp's `llm_tokenizer_wpm`
//! does it: normalise (optional accent stripping and lower-casing), split at whitespace and
//! around punctuation and CJK ideographs, then take the longest vocabulary piece at each
//! position of `▁word`; a word with any gap becomes the unknown token.

use unicode_normalization::UnicodeNormalization;

use super::unicode::flags;

/// CJK ideograph blocks that become words of their own (the ranges BERT's reference code
/// uses, including its 0x2B920 start of extension E).
fn is_chinese_char(c: u32) -> bool {
    matches!(c,
        0x4E00..=0x9FFF
        | 0x3400..=0x4DBF
        | 0x20000..=0x2A6DF
        | 0x2A700..=0x2B73F
        | 0x2B740..=0x2B81F
        | 0x2B920..=0x2CEAF
        | 0xF900..=0xFAFF
        | 0x2F800..=0x2FA1F)
}

/// Splits and normalises text into WordPiece words.
pub(crate) fn words(text: &str, lowercase: bool, strip_accents: bool) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in text.chars() {
        // llama.cpp maps each code point to the first code point of its canonical
        // decomposition (the base letter; the marks are dropped below).
        let c = if strip_accents {
            std::iter::once(c).nfd().next().unwrap_or(c)
        } else {
            c
        };
        let f = flags(c);
        let last = words.len() - 1;
        if f.space {
            if !words[last].is_empty() {
                words.push(String::new());
            }
            continue;
        }
        let u = u32::from(c);
        if u == 0 || u == 0xFFFD || f.control {
            continue;
        }
        if strip_accents && f.mark {
            continue;
        }
        let c = if lowercase {
            c.to_lowercase().next().unwrap_or(c)
        } else {
            c
        };
        if f.punct || (u < 0x7F && f.symbol) || is_chinese_char(u) {
            if !words[last].is_empty() {
                words.push(String::new());
            }
            let l = words.len() - 1;
            words[l].push(c);
            words.push(String::new());
        } else {
            words[last].push(c);
        }
    }
    if words.last().is_some_and(String::is_empty) {
        words.pop();
    }
    words
}

/// Greedy longest-match of `▁word` against the vocabulary, appending ids to `out`; the whole
/// word becomes `unk` when some position has no piece.
pub(crate) fn tokenize_word(
    word: &str,
    max_token_len: usize,
    lookup: impl Fn(&str) -> Option<u32>,
    unk: Option<u32>,
    out: &mut Vec<u32>,
) {
    if word.is_empty() {
        return;
    }
    let w = format!("\u{2581}{word}");
    let n = w.len();
    let before = out.len();
    let mut i = 0;
    while i < n {
        let longest = n.min(i + max_token_len + 1);
        let found = (i + 1..=longest)
            .rev()
            .find_map(|j| w.get(i..j).and_then(&lookup).map(|id| (j, id)));
        match found {
            Some((j, id)) => {
                out.push(id);
                i = j;
            }
            None => {
                out.truncate(before);
                break;
            }
        }
    }
    if out.len() == before {
        out.extend(unk);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_punctuation_and_strips_accents() {
        assert_eq!(
            words("Héllo, World!  x", true, true),
            ["hello", ",", "world", "!", "x"]
        );
        assert_eq!(words("中文", true, true), ["中", "文"]);
        assert_eq!(words("Héllo", false, false), ["Héllo"]);
    }

    #[test]
    fn longest_match_or_unknown() {
        let vocab = ["▁hel", "lo", "▁x"];
        let lookup = |s: &str| vocab.iter().position(|v| *v == s).map(|p| p as u32);
        let mut out = Vec::new();
        tokenize_word("hello", 8, lookup, Some(9), &mut out);
        assert_eq!(out, [0, 1]);
        tokenize_word("hellq", 8, lookup, Some(9), &mut out);
        assert_eq!(out, [0, 1, 9]);
    }
}
