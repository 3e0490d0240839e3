//! BPE pre-tokenizers: split text into words the way llama.cpp's hand-written splitters do for
//! the GPT-2, llama3 and qwen2 regexes, and its `std::regex` passes for the default set.
//!
//! Every splitter works on code points and refines a list of chunk lengths (in code points), so
//! several passes can run one after the other as llama.cpp chains its regexes.

use super::unicode::{flags, Flags};

/// The pre-tokenizer variants we implement (`tokenizer.ggml.pre`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizer {
    /// No `tokenizer.ggml.pre` or `default`: punctuation runs, GPT-2 words, digit runs, 3-digit groups.
    Default,
    /// `gpt-2` and friends: the GPT-2 regex.
    Gpt2,
    /// `llama3`/`llama-bpe`...: the llama 3 regex (digits in groups of up to three).
    Llama3,
    /// `qwen2`...: the llama 3 regex with single digits.
    Qwen2,
}

impl PreTokenizer {
    /// The variant named by `tokenizer.ggml.pre`, or `None` when we do not implement it.
    pub fn from_name(name: Option<&str>) -> Option<Self> {
        Some(match name {
            None | Some("default") => Self::Default,
            Some(
                "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
                | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo"
                | "jina-v1-en" | "jina-v2-code" | "roberta-bpe",
            ) => Self::Gpt2,
            Some(
                "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
                | "midm-2.0" | "lfm2" | "jina-v5-nano" | "dbrx" | "smaug-bpe",
            ) => Self::Llama3,
            Some("qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "stablelm2") => Self::Qwen2,
            Some(_) => return None,
        })
    }

    /// Splits `text` into words.
    pub fn split(self, text: &str) -> Vec<String> {
        let cpts: Vec<char> = text.chars().collect();
        let whole = vec![cpts.len()];
        let lens = match self {
            Self::Gpt2 => split_gpt2(&cpts, &whole),
            Self::Llama3 => split_llama3(&cpts, &whole, 3),
            Self::Qwen2 => split_llama3(&cpts, &whole, 1),
            Self::Default => {
                let a = split_runs(&cpts, &whole, is_default_punct);
                let b = split_gpt2(&cpts, &a);
                let c = split_runs(&cpts, &b, is_number_collapsed);
                split_ascii_triples(&cpts, &c)
            }
        };
        let mut words = Vec::with_capacity(lens.len());
        let mut start = 0;
        for len in lens {
            words.push(cpts[start..start + len].iter().collect());
            start += len;
        }
        words
    }
}

/// One chunk of the text with out-of-range reads answered as "nothing here".
struct Chunk<'a> {
    cpts: &'a [char],
    ini: usize,
    end: usize,
}

impl Chunk<'_> {
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.cpts[pos])
    }
    fn flags(&self, pos: usize) -> Flags {
        self.cpt(pos).map(flags).unwrap_or_default()
    }
}

/// Collects word lengths, skipping empty ones.
struct Out {
    lens: Vec<usize>,
    prev_end: usize,
}

impl Out {
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.lens.push(len);
        }
        self.prev_end = end;
        len
    }
}

fn contraction_len(c: &Chunk<'_>, pos: usize, case_insensitive: bool) -> Option<usize> {
    if c.cpt(pos) != Some('\'') || pos + 1 >= c.end {
        return None;
    }
    let low = |p: usize| {
        c.cpt(p).map(|ch| {
            if case_insensitive {
                ch.to_ascii_lowercase()
            } else {
                ch
            }
        })
    };
    let n1 = low(pos + 1);
    if matches!(n1, Some('s' | 't' | 'm' | 'd')) {
        return Some(2);
    }
    if pos + 2 < c.end {
        let n2 = low(pos + 2);
        if matches!(
            (n1, n2),
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
        ) {
            return Some(3);
        }
    }
    None
}

fn not_word(f: Flags) -> bool {
    !(f.space || f.letter || f.number) && f.defined
}

/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
fn split_gpt2(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut out = Out {
        lens: Vec::with_capacity(offsets.len()),
        prev_end: 0,
    };
    let mut start = 0;
    for &off in offsets {
        let c = Chunk {
            cpts,
            ini: start,
            end: start + off,
        };
        start += off;
        out.prev_end = c.ini;
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpt(pos);
            if let Some(n) = contraction_len(&c, pos, false) {
                pos += out.add(pos + n);
                continue;
            }
            let is_sp = cpt == Some(' ');
            let mut f2 = if is_sp {
                c.flags(pos + 1)
            } else {
                c.flags(pos)
            };
            if f2.letter {
                pos += usize::from(is_sp);
                while f2.letter {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                out.add(pos);
                continue;
            }
            if f2.number {
                pos += usize::from(is_sp);
                while f2.number {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                out.add(pos);
                continue;
            }
            if not_word(f2) {
                pos += usize::from(is_sp);
                while not_word(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                out.add(pos);
                continue;
            }
            let mut n_ws = 0;
            while c.flags(pos + n_ws).space {
                n_ws += 1;
            }
            if n_ws > 1 && c.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                out.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                out.add(pos);
                continue;
            }
            pos += 1;
            out.add(pos);
        }
    }
    out.lens
}

/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
fn split_llama3(cpts: &[char], offsets: &[usize], max_digits: usize) -> Vec<usize> {
    let mut out = Out {
        lens: Vec::with_capacity(offsets.len()),
        prev_end: 0,
    };
    let mut start = 0;
    for &off in offsets {
        let c = Chunk {
            cpts,
            ini: start,
            end: start + off,
        };
        start += off;
        out.prev_end = c.ini;
        let mut pos = c.ini;
        while pos < c.end {
            let cpt = c.cpt(pos);
            let f = c.flags(pos);
            if let Some(n) = contraction_len(&c, pos, true) {
                pos += out.add(pos + n);
                continue;
            }
            let is_crlf = |ch: Option<char>| matches!(ch, Some('\r' | '\n'));
            if !(is_crlf(cpt) || f.number) && (f.letter || c.flags(pos + 1).letter) {
                pos += 1;
                while c.flags(pos).letter {
                    pos += 1;
                }
                out.add(pos);
                continue;
            }
            if f.number {
                let mut ini = pos;
                while c.flags(pos).number {
                    pos += 1;
                    if pos - ini >= max_digits {
                        out.add(pos);
                        ini = pos;
                    }
                }
                out.add(pos);
                continue;
            }
            let is_sp = cpt == Some(' ');
            let mut f2 = if is_sp { c.flags(pos + 1) } else { f };
            if !(f2.space || f2.letter || f2.number) && f.defined {
                pos += usize::from(is_sp);
                while not_word(f2) {
                    pos += 1;
                    f2 = c.flags(pos);
                }
                while is_crlf(c.cpt(pos)) {
                    pos += 1;
                }
                out.add(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_crlf_end = 0;
            while c.flags(pos + n_ws).space {
                if is_crlf(c.cpt(pos + n_ws)) {
                    last_crlf_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_crlf_end > 0 {
                pos = last_crlf_end;
                out.add(pos);
                continue;
            }
            if n_ws > 1 && c.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                out.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                out.add(pos);
                continue;
            }
            pos += 1;
            out.add(pos);
        }
    }
    out.lens
}

/// `[\p{P}\$\+<=>\^~\|]`
fn is_default_punct(ch: char) -> bool {
    if ch.is_ascii() {
        return ch.is_ascii_punctuation() && ch != '`'
            || matches!(ch, '$' | '+' | '<' | '=' | '>' | '^' | '~' | '|');
    }
    let f = flags(ch);
    // llama.cpp collapses non-ASCII whitespace before matching, so it never counts as punctuation.
    !f.space && f.punct
}

/// `\p{N}` on llama.cpp's collapsed text.
fn is_number_collapsed(ch: char) -> bool {
    if ch.is_ascii() {
        return ch.is_ascii_digit();
    }
    let f = flags(ch);
    !f.space && f.number
}

/// `class+` as a `std::regex` split: each maximal run is a word, and so is each gap.
fn split_runs(cpts: &[char], offsets: &[usize], class: fn(char) -> bool) -> Vec<usize> {
    let mut lens = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &off in offsets {
        let chunk = &cpts[start..start + off];
        start += off;
        let mut i = 0;
        let mut gap_start = 0;
        while i < chunk.len() {
            if class(chunk[i]) {
                let run_start = i;
                while i < chunk.len() && class(chunk[i]) {
                    i += 1;
                }
                if run_start > gap_start {
                    lens.push(run_start - gap_start);
                }
                lens.push(i - run_start);
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if gap_start < chunk.len() {
            lens.push(chunk.len() - gap_start);
        }
    }
    lens
}

/// `[0-9][0-9][0-9]` as a `std::regex` split.
fn split_ascii_triples(cpts: &[char], offsets: &[usize]) -> Vec<usize> {
    let mut lens = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &off in offsets {
        let chunk = &cpts[start..start + off];
        start += off;
        let mut i = 0;
        let mut gap_start = 0;
        while i + 3 <= chunk.len() {
            if chunk[i..i + 3].iter().all(char::is_ascii_digit) {
                if i > gap_start {
                    lens.push(i - gap_start);
                }
                lens.push(3);
                i += 3;
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if gap_start < chunk.len() {
            lens.push(chunk.len() - gap_start);
        }
    }
    lens
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(p: PreTokenizer, s: &str) -> Vec<String> {
        p.split(s)
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            split(PreTokenizer::Gpt2, "Hello world's  end\n"),
            ["Hello", " world", "'s", " ", " end", "\n"]
        );
    }

    #[test]
    fn llama3_digits_and_newlines() {
        assert_eq!(
            split(PreTokenizer::Llama3, "x 12345\n\n  y"),
            ["x", " ", "123", "45", "\n\n", " ", " y"]
        );
        assert_eq!(split(PreTokenizer::Qwen2, "123"), ["1", "2", "3"]);
        assert_eq!(split(PreTokenizer::Llama3, "I'M ok"), ["I", "'M", " ok"]);
    }

    #[test]
    fn default_chain() {
        assert_eq!(
            split(PreTokenizer::Default, "a+b 1234!!"),
            ["a", "+", "b", " ", "123", "4", "!!"]
        );
    }
}
