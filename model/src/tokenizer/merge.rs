//! The two merge loops: SentencePiece-style (best score first, over the vocabulary's pieces)
//! and BPE (lowest merge rank first), each over a doubly linked list of symbols as llama.cpp's
//! `llm_tokenizer_spm_session` / `llm_tokenizer_bpe_session` do, so ties break identically.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::{fast_map, FastMap};

/// A span of the text being tokenized (byte offsets), linked to its neighbours.
#[derive(Clone, Copy, Debug)]
struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    start: usize,
    len: usize,
}

/// Splits `text` into one symbol per UTF-8 character (lead byte decides the length, as llama.cpp).
fn symbols_of(text: &[u8]) -> Vec<Symbol> {
    let mut out = Vec::with_capacity(text.len());
    let mut off = 0;
    while off < text.len() {
        let len = utf8_len(text[off]).min(text.len() - off);
        let idx = out.len();
        out.push(Symbol {
            prev: idx.checked_sub(1),
            next: (off + len < text.len()).then_some(idx + 1),
            start: off,
            len,
        });
        off += len;
    }
    out
}

/// Length of a UTF-8 sequence from its lead byte (continuation bytes count as 1).
pub(crate) fn utf8_len(lead: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[usize::from(lead >> 4)]
}

struct SpmBigram {
    left: usize,
    right: usize,
    score: f32,
    // Pieces are vocabulary tokens, far shorter than 4 GiB.
    size: u32,
}

impl PartialEq for SpmBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for SpmBigram {
    // Max-heap: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// What the SPM loop needs from the vocabulary.
pub(crate) trait SpmVocab {
    /// Id and score of a piece, when it is in the vocabulary.
    fn piece(&self, text: &[u8]) -> Option<(u32, f32)>;
    /// Token for a raw byte (byte fallback), when the vocabulary has one.
    fn byte_token(&self, b: u8) -> Option<u32>;
}

/// Scores of pieces looked up so far (`None`: not in the vocabulary). Lookups in the full
/// vocabulary miss the CPU caches; text repeats its pieces, so this small table, shared by
/// all fragments of one text, answers most of them.
pub(crate) type PieceCache<'t> = FastMap<&'t [u8], Option<(u32, f32)>>;

/// Tokenizes already-escaped text with score-ordered merges, appending to `out`.
pub(crate) fn spm_tokenize<'t>(
    vocab: &impl SpmVocab,
    text: &'t [u8],
    out: &mut Vec<u32>,
    seen: &mut PieceCache<'t>,
) {
    let mut syms = symbols_of(text);
    if syms.is_empty() {
        return;
    }
    let mut heap = BinaryHeap::new();
    let mut rev_merge: FastMap<&[u8], (usize, usize)> = fast_map(0);
    #[allow(clippy::too_many_arguments)]
    fn try_add<'t>(
        vocab: &impl SpmVocab,
        text: &'t [u8],
        syms: &[Symbol],
        heap: &mut BinaryHeap<SpmBigram>,
        rev: &mut FastMap<&'t [u8], (usize, usize)>,
        seen: &mut PieceCache<'t>,
        left: Option<usize>,
        right: Option<usize>,
    ) {
        let (Some(l), Some(r)) = (left, right) else {
            return;
        };
        let piece = &text[syms[l].start..syms[l].start + syms[l].len + syms[r].len];
        let found = *seen.entry(piece).or_insert_with(|| vocab.piece(piece));
        if let Some((_, score)) = found {
            heap.push(SpmBigram {
                left: l,
                right: r,
                score,
                size: u32::try_from(piece.len()).unwrap_or(u32::MAX),
            });
            rev.insert(piece, (l, r));
        }
    }
    for i in 1..syms.len() {
        try_add(
            vocab,
            text,
            &syms,
            &mut heap,
            &mut rev_merge,
            seen,
            Some(i - 1),
            Some(i),
        );
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (syms[b.left], syms[b.right]);
        if l.len == 0 || r.len == 0 || l.len + r.len != b.size as usize {
            continue;
        }
        syms[b.left].len += r.len;
        syms[b.right].len = 0;
        syms[b.left].next = r.next;
        if let Some(n) = r.next {
            syms[n].prev = Some(b.left);
        }
        let prev = syms[b.left].prev;
        let next = syms[b.left].next;
        try_add(
            vocab,
            text,
            &syms,
            &mut heap,
            &mut rev_merge,
            seen,
            prev,
            Some(b.left),
        );
        try_add(
            vocab,
            text,
            &syms,
            &mut heap,
            &mut rev_merge,
            seen,
            Some(b.left),
            next,
        );
    }
    let mut i = Some(0);
    while let Some(idx) = i {
        let s = syms[idx];
        resegment(vocab, text, &syms, &rev_merge, seen, s.start, s.len, out);
        i = s.next;
    }
}

#[allow(clippy::too_many_arguments)]
fn resegment<'t>(
    vocab: &impl SpmVocab,
    text: &'t [u8],
    syms: &[Symbol],
    rev_merge: &FastMap<&[u8], (usize, usize)>,
    seen: &mut PieceCache<'t>,
    start: usize,
    len: usize,
    out: &mut Vec<u32>,
) {
    let piece = &text[start..start + len];
    if let Some((id, _)) = *seen.entry(piece).or_insert_with(|| vocab.piece(piece)) {
        out.push(id);
        return;
    }
    match rev_merge.get(piece) {
        None => out.extend(piece.iter().filter_map(|&b| vocab.byte_token(b))),
        Some(&(l, r)) => {
            // The recorded pair spans this piece; llama.cpp re-reads the symbols' current
            // lengths, which are those they had when the pair was formed.
            let (sl, sr) = (syms[l], syms[r]);
            resegment(vocab, text, syms, rev_merge, seen, sl.start, sl.len, out);
            resegment(vocab, text, syms, rev_merge, seen, sr.start, sr.len, out);
        }
    }
}

struct BpeBigram {
    left: usize,
    right: usize,
    rank: usize,
    text: Vec<u8>,
}

impl PartialEq for BpeBigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for BpeBigram {}
impl PartialOrd for BpeBigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for BpeBigram {
    // Max-heap: lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Merges one pre-tokenized word by merge rank; returns its final pieces as byte ranges.
pub(crate) fn bpe_word(
    word: &[u8],
    rank: impl Fn(&[u8], &[u8]) -> Option<usize>,
) -> Vec<(usize, usize)> {
    let mut syms = symbols_of(word);
    let mut heap = BinaryHeap::new();
    let add =
        |syms: &[Symbol], heap: &mut BinaryHeap<BpeBigram>, l: Option<usize>, r: Option<usize>| {
            let (Some(l), Some(r)) = (l, r) else { return };
            let a = &word[syms[l].start..syms[l].start + syms[l].len];
            let b = &word[syms[r].start..syms[r].start + syms[r].len];
            if let Some(rank) = rank(a, b) {
                let mut text = a.to_vec();
                text.extend_from_slice(b);
                heap.push(BpeBigram {
                    left: l,
                    right: r,
                    rank,
                    text,
                });
            }
        };
    for i in 1..syms.len() {
        add(&syms, &mut heap, Some(i - 1), Some(i));
    }
    while let Some(b) = heap.pop() {
        let (l, r) = (syms[b.left], syms[b.right]);
        if l.len == 0 || r.len == 0 {
            continue;
        }
        // Skip pairs whose symbols changed since they were queued.
        if l.start + l.len != r.start
            || l.len + r.len != b.text.len()
            || word[l.start..r.start + r.len] != b.text[..]
        {
            continue;
        }
        syms[b.left].len += r.len;
        syms[b.right].len = 0;
        syms[b.left].next = r.next;
        if let Some(n) = r.next {
            syms[n].prev = Some(b.left);
        }
        let prev = syms[b.left].prev;
        let next = syms[b.left].next;
        add(&syms, &mut heap, prev, Some(b.left));
        add(&syms, &mut heap, Some(b.left), next);
    }
    syms.iter()
        .filter(|s| s.len > 0)
        .map(|s| (s.start, s.start + s.len))
        .collect()
}
