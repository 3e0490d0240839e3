//! A small backtracking regular-expression matcher with the ECMAScript semantics of
//! `std::regex`, which llama.cpp uses for the pre-tokenizers it has no hand-written splitter
//! for: leftmost-first alternation, greedy quantifiers, lookahead, ASCII `\s`/`\d`/`\w`/`\b`.
//!
//! It matches over code units (`u32`): llama.cpp runs these patterns either on code points or
//! on its "collapsed" text where each non-ASCII code point stands as one byte naming its
//! Unicode category, and [`super::pretok`] builds both the same way.

/// A set of code units: sorted inclusive ranges, maybe negated.
#[derive(Clone, Debug, Default)]
struct Class {
    ranges: Vec<(u32, u32)>,
    negated: bool,
}

impl Class {
    fn contains(&self, c: u32) -> bool {
        self.ranges.iter().any(|&(a, b)| a <= c && c <= b) != self.negated
    }
}

#[derive(Clone, Copy, Debug)]
enum Inst {
    /// One code unit in the class.
    Class(usize),
    /// Try the first target, on failure the second.
    Split(usize, usize),
    Jmp(usize),
    /// Lookahead: the sub-program starts at the next instruction and ends with `LookEnd`;
    /// matching goes on at `next`.
    Look {
        negate: bool,
        next: usize,
    },
    LookEnd,
    Start,
    End,
    WordBoundary(bool),
    Match,
}

#[derive(Clone, Debug)]
enum Node {
    Class(usize),
    Start,
    End,
    WordBoundary(bool),
    Group(Vec<Vec<Node>>),
    Look(bool, Vec<Vec<Node>>),
    Repeat(Box<Node>, u32, Option<u32>, bool),
}

/// A compiled pattern.
#[derive(Clone, Debug)]
pub(crate) struct Regex {
    prog: Vec<Inst>,
    classes: Vec<Class>,
}

/// Why a pattern could not be compiled (the patterns are built in; this is a programming
/// error caught by the unit tests).
#[derive(Debug)]
pub(crate) struct PatternError(pub String);

struct Parser<'p> {
    p: &'p [char],
    i: usize,
    classes: Vec<Class>,
}

const SPACE: &[(u32, u32)] = &[(9, 13), (32, 32)];
const DIGIT: &[(u32, u32)] = &[(48, 57)];
const WORD: &[(u32, u32)] = &[(48, 57), (65, 90), (95, 95), (97, 122)];

fn complement(r: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut sorted = r.to_vec();
    sorted.sort_unstable();
    let mut out = Vec::new();
    let mut next = 0u32;
    for (a, b) in sorted {
        if a > next {
            out.push((next, a - 1));
        }
        next = next.max(b.saturating_add(1));
    }
    if next <= 0x10FFFF {
        out.push((next, u32::MAX));
    }
    out
}

impl Parser<'_> {
    fn err(&self, what: &str) -> PatternError {
        let s: String = self.p.iter().collect();
        PatternError(format!("{what} at {} in `{s}`", self.i))
    }

    fn peek(&self) -> Option<char> {
        self.p.get(self.i).copied()
    }

    fn class(&mut self, ranges: Vec<(u32, u32)>, negated: bool) -> usize {
        self.classes.push(Class { ranges, negated });
        self.classes.len() - 1
    }

    fn alt(&mut self) -> Result<Vec<Vec<Node>>, PatternError> {
        let mut alts = vec![self.seq()?];
        while self.peek() == Some('|') {
            self.i += 1;
            alts.push(self.seq()?);
        }
        Ok(alts)
    }

    fn seq(&mut self) -> Result<Vec<Node>, PatternError> {
        let mut seq = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' {
                break;
            }
            let atom = self.atom()?;
            let atom = self.quantifier(atom)?;
            seq.push(atom);
        }
        Ok(seq)
    }

    fn number(&mut self) -> Option<u32> {
        let start = self.i;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.i += 1;
        }
        let s: String = self.p[start..self.i].iter().collect();
        s.parse().ok()
    }

    fn quantifier(&mut self, atom: Node) -> Result<Node, PatternError> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => {
                let save = self.i;
                self.i += 1;
                let Some(min) = self.number() else {
                    self.i = save;
                    return Ok(atom);
                };
                let max = if self.peek() == Some(',') {
                    self.i += 1;
                    if self.peek() == Some('}') {
                        None
                    } else {
                        Some(self.number().ok_or_else(|| self.err("bad {n,m}"))?)
                    }
                } else {
                    Some(min)
                };
                if self.peek() != Some('}') {
                    return Err(self.err("unclosed {"));
                }
                (min, max)
            }
            _ => return Ok(atom),
        };
        self.i += 1;
        let greedy = if self.peek() == Some('?') {
            self.i += 1;
            false
        } else {
            true
        };
        Ok(Node::Repeat(Box::new(atom), min, max, greedy))
    }

    /// An escape's meaning as a set of code units.
    fn escape_set(&mut self) -> Result<Vec<(u32, u32)>, PatternError> {
        let c = self.peek().ok_or_else(|| self.err("trailing \\"))?;
        self.i += 1;
        let one = |v: u32| vec![(v, v)];
        Ok(match c {
            's' => SPACE.to_vec(),
            'S' => complement(SPACE),
            'd' => DIGIT.to_vec(),
            'D' => complement(DIGIT),
            'w' => WORD.to_vec(),
            'W' => complement(WORD),
            't' => one(9),
            'n' => one(10),
            'v' => one(11),
            'f' => one(12),
            'r' => one(13),
            '0' => one(0),
            'x' | 'u' => {
                let n = if c == 'x' { 2 } else { 4 };
                let hex: String = self
                    .p
                    .get(self.i..self.i + n)
                    .unwrap_or(&[])
                    .iter()
                    .collect();
                let v = u32::from_str_radix(&hex, 16).map_err(|_| self.err("bad hex escape"))?;
                self.i += n;
                one(v)
            }
            other => one(u32::from(other)),
        })
    }

    fn atom(&mut self) -> Result<Node, PatternError> {
        let c = self.peek().ok_or_else(|| self.err("unexpected end"))?;
        self.i += 1;
        Ok(match c {
            '(' => {
                let mut look = None;
                if self.peek() == Some('?') {
                    match self.p.get(self.i + 1) {
                        Some(':') => {}
                        Some('=') => look = Some(false),
                        Some('!') => look = Some(true),
                        _ => return Err(self.err("unsupported group")),
                    }
                    self.i += 2;
                }
                let inner = self.alt()?;
                if self.peek() != Some(')') {
                    return Err(self.err("unclosed ("));
                }
                self.i += 1;
                match look {
                    Some(neg) => Node::Look(neg, inner),
                    None => Node::Group(inner),
                }
            }
            '[' => self.bracket()?,
            '.' => {
                let ranges = vec![(10, 10), (13, 13), (0x2028, 0x2029)];
                Node::Class(self.class(ranges, true))
            }
            '^' => Node::Start,
            '$' => Node::End,
            '\\' => match self.peek() {
                Some('b') => {
                    self.i += 1;
                    Node::WordBoundary(true)
                }
                Some('B') => {
                    self.i += 1;
                    Node::WordBoundary(false)
                }
                _ => {
                    let set = self.escape_set()?;
                    Node::Class(self.class(set, false))
                }
            },
            lit => Node::Class(self.class(vec![(u32::from(lit), u32::from(lit))], false)),
        })
    }

    fn bracket(&mut self) -> Result<Node, PatternError> {
        let negated = self.peek() == Some('^');
        if negated {
            self.i += 1;
        }
        let mut ranges = Vec::new();
        let mut first = true;
        loop {
            let c = self.peek().ok_or_else(|| self.err("unclosed ["))?;
            if c == ']' && !first {
                self.i += 1;
                break;
            }
            first = false;
            self.i += 1;
            let lo = if c == '\\' {
                let set = self.escape_set()?;
                if set.len() != 1 || set[0].0 != set[0].1 {
                    ranges.extend(set);
                    continue;
                }
                set[0].0
            } else {
                u32::from(c)
            };
            // A range `lo-hi`, unless the `-` is last in the class.
            if self.peek() == Some('-') && self.p.get(self.i + 1).is_some_and(|&n| n != ']') {
                self.i += 1;
                let h = self.peek().ok_or_else(|| self.err("unclosed ["))?;
                self.i += 1;
                let hi = if h == '\\' {
                    let set = self.escape_set()?;
                    set.first()
                        .map(|r| r.0)
                        .ok_or_else(|| self.err("bad range"))?
                } else {
                    u32::from(h)
                };
                ranges.push((lo, hi));
            } else {
                ranges.push((lo, lo));
            }
        }
        Ok(Node::Class(self.class(ranges, negated)))
    }
}

struct Compiler {
    prog: Vec<Inst>,
}

impl Compiler {
    fn alt(&mut self, alts: &[Vec<Node>]) {
        // Split(a, next-split) chains; each branch jumps to the end.
        let mut jumps = Vec::new();
        for (k, seq) in alts.iter().enumerate() {
            if k + 1 < alts.len() {
                let split = self.prog.len();
                self.prog.push(Inst::Split(split + 1, 0));
                self.seq(seq);
                jumps.push(self.prog.len());
                self.prog.push(Inst::Jmp(0));
                let next = self.prog.len();
                self.prog[split] = Inst::Split(split + 1, next);
            } else {
                self.seq(seq);
            }
        }
        let end = self.prog.len();
        for j in jumps {
            self.prog[j] = Inst::Jmp(end);
        }
    }

    fn seq(&mut self, seq: &[Node]) {
        for n in seq {
            self.node(n);
        }
    }

    fn node(&mut self, n: &Node) {
        match n {
            Node::Class(c) => self.prog.push(Inst::Class(*c)),
            Node::Start => self.prog.push(Inst::Start),
            Node::End => self.prog.push(Inst::End),
            Node::WordBoundary(b) => self.prog.push(Inst::WordBoundary(*b)),
            Node::Group(alts) => self.alt(alts),
            Node::Look(negate, alts) => {
                let at = self.prog.len();
                self.prog.push(Inst::Look {
                    negate: *negate,
                    next: 0,
                });
                self.alt(alts);
                self.prog.push(Inst::LookEnd);
                let next = self.prog.len();
                self.prog[at] = Inst::Look {
                    negate: *negate,
                    next,
                };
            }
            Node::Repeat(atom, min, max, greedy) => {
                for _ in 0..*min {
                    self.node(atom);
                }
                let split = |a: usize, b: usize| {
                    if *greedy {
                        Inst::Split(a, b)
                    } else {
                        Inst::Split(b, a)
                    }
                };
                match max {
                    None => {
                        let top = self.prog.len();
                        self.prog.push(Inst::Jmp(0));
                        self.node(atom);
                        self.prog.push(Inst::Jmp(top));
                        let end = self.prog.len();
                        self.prog[top] = split(top + 1, end);
                    }
                    Some(max) => {
                        let mut holes = Vec::new();
                        for _ in *min..*max {
                            holes.push(self.prog.len());
                            self.prog.push(Inst::Jmp(0));
                            self.node(atom);
                        }
                        let end = self.prog.len();
                        for h in holes {
                            self.prog[h] = split(h + 1, end);
                        }
                    }
                }
            }
        }
    }
}

fn is_word(c: u32) -> bool {
    WORD.iter().any(|&(a, b)| a <= c && c <= b)
}

impl Regex {
    /// Compiles an ECMAScript-style pattern (no `\p{..}`: callers rewrite those first).
    pub(crate) fn new(pattern: &str) -> Result<Self, PatternError> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut p = Parser {
            p: &chars,
            i: 0,
            classes: Vec::new(),
        };
        let alts = p.alt()?;
        if p.i != chars.len() {
            return Err(p.err("unbalanced )"));
        }
        let mut c = Compiler { prog: Vec::new() };
        c.alt(&alts);
        c.prog.push(Inst::Match);
        Ok(Self {
            prog: c.prog,
            classes: p.classes,
        })
    }

    /// Runs the program from `pc` at `pos` within `text[lo..hi]`; returns the end of the first
    /// match in priority order. `not_null` rejects an empty match at `pos`.
    #[allow(clippy::too_many_arguments)]
    fn run(
        &self,
        stack: &mut Vec<(usize, usize)>,
        text: &[u32],
        lo: usize,
        hi: usize,
        pc: usize,
        pos: usize,
        not_null: bool,
    ) -> Option<usize> {
        let start = pos;
        let base = stack.len();
        stack.push((pc, pos));
        while stack.len() > base {
            let Some((mut pc, mut pos)) = stack.pop() else {
                break;
            };
            loop {
                match self.prog[pc] {
                    Inst::Class(c) => {
                        if pos < hi && self.classes[c].contains(text[pos]) {
                            pc += 1;
                            pos += 1;
                        } else {
                            break;
                        }
                    }
                    Inst::Split(a, b) => {
                        stack.push((b, pos));
                        pc = a;
                    }
                    Inst::Jmp(t) => pc = t,
                    Inst::Look { negate, next } => {
                        let found = self.run(stack, text, lo, hi, pc + 1, pos, false).is_some();
                        if found == negate {
                            break;
                        }
                        pc = next;
                    }
                    Inst::LookEnd => {
                        stack.truncate(base);
                        return Some(pos);
                    }
                    Inst::Start => {
                        if pos != lo {
                            break;
                        }
                        pc += 1;
                    }
                    Inst::End => {
                        if pos != hi {
                            break;
                        }
                        pc += 1;
                    }
                    Inst::WordBoundary(want) => {
                        let before = pos > lo && is_word(text[pos - 1]);
                        let after = pos < hi && is_word(text[pos]);
                        if (before != after) != want {
                            break;
                        }
                        pc += 1;
                    }
                    Inst::Match => {
                        if not_null && pos == start {
                            break;
                        }
                        stack.truncate(base);
                        return Some(pos);
                    }
                }
            }
        }
        None
    }

    /// Splits `text[lo..hi]` as llama.cpp's `unicode_regex_split_stl` does: each match and
    /// each gap between matches becomes a piece (empty matches give empty pieces); lengths
    /// are appended to `out`.
    pub(crate) fn split(&self, text: &[u32], lo: usize, hi: usize, out: &mut Vec<usize>) {
        let mut prev_end = lo;
        let mut from = lo;
        let mut after_empty = false;
        let mut stack = Vec::new();
        while from <= hi {
            let mut found = None;
            if after_empty {
                // std::regex_iterator: after an empty match, a non-empty match anchored here,
                // else search on from the next position.
                if let Some(e) = self.run(&mut stack, text, lo, hi, 0, from, true) {
                    found = Some((from, e));
                } else {
                    from += 1;
                    if from > hi {
                        break;
                    }
                }
            }
            if found.is_none() {
                found = (from..=hi).find_map(|s| {
                    self.run(&mut stack, text, lo, hi, 0, s, false)
                        .map(|e| (s, e))
                });
            }
            let Some((s, e)) = found else { break };
            if s > prev_end {
                out.push(s - prev_end);
            }
            out.push(e - s);
            prev_end = e;
            after_empty = e == s;
            from = e;
        }
        if prev_end < hi {
            out.push(hi - prev_end);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(pat: &str, text: &str) -> Vec<String> {
        let re = Regex::new(pat).expect("pattern");
        let t: Vec<u32> = text.chars().map(u32::from).collect();
        let mut lens = Vec::new();
        re.split(&t, 0, t.len(), &mut lens);
        let mut out = Vec::new();
        let mut p = 0;
        for l in lens {
            out.push(text.chars().skip(p).take(l).collect());
            p += l;
        }
        out
    }

    #[test]
    fn alternation_lookahead_and_gaps() {
        assert_eq!(split(r"\s+(?!\S)|\s+", "a   b"), ["a", "  ", " ", "b"]);
        assert_eq!(split(r"[0-9][0-9][0-9]", "x12345"), ["x", "123", "45"]);
        assert_eq!(split(r"\s+$", "a  "), ["a", "  "]);
        assert_eq!(
            split(r"(IMGIMG)((A|B){1,4})Z", "IMGIMGABZq"),
            ["IMGIMGABZ", "q"]
        );
        assert_eq!(split(r"[^(\s|.,!?)]+", "hi, you"), ["hi", ", ", "you"]);
    }

    #[test]
    fn empty_matches_give_empty_pieces() {
        assert_eq!(
            split(r"(?=(\d{3})+(?!\d))", "1234567"),
            ["1", "", "234", "", "567"]
        );
    }
}
