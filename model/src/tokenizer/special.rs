//! Special-token partitioning: finds every control / user-defined token written in the text
//! with one Aho-Corasick pass and resolves them exactly as llama.cpp's sequential
//! `tokenizer_st_partition` does (longest token first, each token's leftmost non-overlapping
//! occurrences in what earlier tokens left as text, with optional whitespace stripping).
//!
//! llama.cpp scans the whole text once per special token, which is quadratic in practice
//! (Gemma has thousands of special tokens). The sequential rule is reproduced without the
//! rescans: an occurrence of a lower-priority token is taken iff none of its bytes was already
//! taken by a higher-priority token, by stripping, or by an earlier occurrence of itself.

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};

use super::{attr, Frag};

/// The automata over the special tokens, in llama.cpp's priority order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Specials {
    /// Every special token (control, user-defined, unknown).
    all: Option<(AhoCorasick, Vec<u32>)>,
    /// Only the tokens that count without `parse_special` (user-defined ones).
    user: Option<(AhoCorasick, Vec<u32>)>,
}

fn build(tokens: &[String], ids: Vec<u32>) -> Option<(AhoCorasick, Vec<u32>)> {
    if ids.is_empty() {
        return None;
    }
    let pats: Vec<&[u8]> = ids.iter().map(|&i| tokens[i as usize].as_bytes()).collect();
    // Overlapping search reports every occurrence of every token; the sequential rule is
    // applied afterwards. Building only fails past the automaton's size limits, in which case
    // the (slow, equivalent) per-token scan is used.
    AhoCorasickBuilder::new()
        .match_kind(MatchKind::Standard)
        .build(pats)
        .ok()
        .map(|ac| (ac, ids))
}

fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

impl Specials {
    /// Builds the automata for `order` (special ids, highest priority first).
    pub(crate) fn new(tokens: &[String], attrs: &[u32], order: &[u32]) -> Self {
        let user: Vec<u32> = order
            .iter()
            .copied()
            .filter(|&i| attrs[i as usize] & (attr::CONTROL | attr::UNKNOWN) == 0)
            .collect();
        Self {
            all: build(tokens, order.to_vec()),
            user: build(tokens, user),
        }
    }

    /// Splits `text` into raw text and special tokens. `None` when no automaton could be built
    /// for a non-empty token list (the caller then scans token by token).
    pub(crate) fn partition(
        &self,
        text: &str,
        attrs: &[u32],
        parse_special: bool,
    ) -> Option<Vec<Frag>> {
        let set = if parse_special { &self.all } else { &self.user };
        let Some((ac, ids)) = set else {
            return Some(if text.is_empty() {
                Vec::new()
            } else {
                vec![Frag::Text(0, text.len())]
            });
        };
        let bytes = text.as_bytes();
        let n = bytes.len();
        // (priority, start, end): sorted, this is the order the sequential scan meets them.
        let mut occ: Vec<(u32, usize, usize)> = ac
            .find_overlapping_iter(bytes)
            .map(|m| (m.pattern().as_u32(), m.start(), m.end()))
            .collect();
        if occ.is_empty() {
            return Some(if n == 0 {
                Vec::new()
            } else {
                vec![Frag::Text(0, n)]
            });
        }
        occ.sort_unstable();
        let mut taken = vec![false; n];
        let mut found: Vec<(usize, usize, u32)> = Vec::new();
        for (p, start, end) in occ {
            if taken[start..end].iter().any(|&t| t) {
                continue;
            }
            let id = ids[p as usize];
            let a = attrs[id as usize];
            taken[start..end].iter_mut().for_each(|t| *t = true);
            if a & attr::LSTRIP != 0 {
                let mut i = start;
                while i > 0 && !taken[i - 1] && is_c_space(bytes[i - 1]) {
                    i -= 1;
                    taken[i] = true;
                }
            }
            if a & attr::RSTRIP != 0 {
                let mut i = end;
                while i < n && !taken[i] && is_c_space(bytes[i]) {
                    taken[i] = true;
                    i += 1;
                }
            }
            found.push((start, end, id));
        }
        found.sort_unstable();
        let mut frags = Vec::with_capacity(2 * found.len() + 1);
        let push_text = |frags: &mut Vec<Frag>, from: usize, to: usize| {
            // Maximal untaken runs between `from` and `to` (stripped whitespace separates them).
            let mut i = from;
            while i < to {
                while i < to && taken[i] {
                    i += 1;
                }
                let s = i;
                while i < to && !taken[i] {
                    i += 1;
                }
                if i > s {
                    frags.push(Frag::Text(s, i));
                }
            }
        };
        let mut cursor = 0;
        for (start, end, id) in found {
            push_text(&mut frags, cursor, start);
            frags.push(Frag::Token(id));
            cursor = end;
        }
        push_text(&mut frags, cursor, n);
        Some(frags)
    }
}
