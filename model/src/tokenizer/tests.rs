//! Unit tests on hand-made vocabularies; the real ones are checked in `model/tests/tokenizer*.rs`.

use super::*;

fn spm() -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    for b in 0..=255u8 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
    }
    let words = [
        "▁", "h", "e", "l", "o", "▁h", "he", "ll", "llo", "▁hello", "hello", "<turn>",
    ];
    for w in words {
        tokens.push(w.into());
        types.push(if w == "<turn>" { 3 } else { 1 });
    }
    let n = tokens.len();
    let scores = (0..n)
        .map(|i| if i < 259 { 0.0 } else { i as f32 })
        .collect();
    Tokenizer::from_parts(VocabParts {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        ..VocabParts::default()
    })
    .expect("valid vocab")
}

#[test]
fn spm_merges_prefix_and_byte_fallback() {
    let t = spm();
    let id = |s: &str| t.token_id(s).expect("token");
    assert_eq!(t.encode("hello", true, false), vec![1, id("▁hello")]);
    // 'é' is not in the vocabulary: two byte tokens.
    assert_eq!(
        t.encode("hé", false, false),
        vec![id("▁h"), 3 + 0xC3, 3 + 0xA9]
    );
    assert_eq!(t.decode(&t.encode("hé hello", true, false)), "hé hello");
}

#[test]
fn a_repeated_token_text_maps_to_the_later_id_as_in_llama_cpp() {
    // Found by the tokenizer fuzz target: a normal token spelled like byte token <0x6C> takes
    // over that text, so byte fallback for `l` yields it and it decodes as its own text.
    let mut parts = VocabParts {
        model: "llama".into(),
        tokens: vec!["<unk>".into(), "<s>".into(), "</s>".into()],
        token_types: Some(vec![2, 3, 3]),
        ..VocabParts::default()
    };
    for b in 0..=255u8 {
        parts.tokens.push(format!("<0x{b:02X}>"));
        parts.token_types.as_mut().expect("types").push(6);
    }
    parts.tokens.push("<0x6C>".into());
    parts.token_types.as_mut().expect("types").push(1);
    let n = parts.tokens.len();
    parts.scores = Some(vec![0.0; n]);
    let t = Tokenizer::from_parts(parts).expect("a repeated text is not fatal");
    let later = (n - 1) as u32;
    assert_eq!(t.token_id("<0x6C>"), Some(later));
    // The space prefix `▁` comes first, as its three byte tokens.
    assert_eq!(
        t.encode("l", false, false),
        vec![3 + 0xE2, 3 + 0x96, 3 + 0x81, later]
    );
    assert_eq!(t.decode(&[3 + 0x6C]), "l");
}

#[test]
fn spm_special_tokens_only_when_parsed() {
    let t = spm();
    let turn = t.token_id("<turn>").expect("token");
    let parsed = t.encode("<turn>hello", false, true);
    assert_eq!(parsed[0], turn);
    // After a special token the space prefix applies again.
    assert_eq!(parsed[1], t.token_id("▁hello").expect("token"));
    assert!(!t.encode("<turn>hello", false, false).contains(&turn));
    assert!(t.is_eog(2));
    assert_eq!(t.token_to_piece(turn), b"<turn>");
    assert!(t.token_to_piece_ext(turn, 0, false).is_empty());
}

fn bpe() -> Tokenizer {
    let table = unicode::byte_to_char_table();
    let mut tokens: Vec<String> = table.iter().map(|c| c.to_string()).collect();
    for w in ["he", "ll", "hell", "hello", "Ġw", "Ġwo", "<|endoftext|>"] {
        tokens.push(w.into());
    }
    let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"];
    let n = tokens.len();
    let mut types = vec![1; n];
    types[n - 1] = 3;
    Tokenizer::from_parts(VocabParts {
        model: "gpt2".into(),
        pre: Some("gpt-2".into()),
        tokens,
        token_types: Some(types),
        merges: merges.iter().map(|s| (*s).to_owned()).collect(),
        special_ids: vec![("eos_token_id".into(), (n - 1) as u64)],
        ..VocabParts::default()
    })
    .expect("valid vocab")
}

#[test]
fn bpe_merges_by_rank() {
    let t = bpe();
    let id = |s: &str| t.token_id(s).expect("token");
    assert_eq!(
        t.encode("hello wo", false, false),
        vec![id("hello"), id("Ġwo")]
    );
    let ids = t.encode("hello wo é", false, false);
    assert_eq!(t.decode(&ids), "hello wo é");
    assert!(t.is_eog(id("<|endoftext|>")));
}

#[test]
fn clean_spaces_passes() {
    let mut v = b"a , b ' c 's d".to_vec();
    clean_up_spaces(&mut v);
    assert_eq!(v, b"a, b'c's d");
}

#[test]
fn t5_unigram_through_the_tokenizer() {
    let tokens: Vec<String> = [
        "<pad>", "</s>", "<unk>", "▁", "▁hello", "▁he", "llo", "▁world",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let scores = vec![0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -3.0, -2.5];
    let types = vec![3, 3, 2, 1, 1, 1, 1, 1];
    let t = Tokenizer::from_parts(VocabParts {
        model: "t5".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        ..VocabParts::default()
    })
    .expect("valid vocab");
    assert_eq!(t.kind(), Kind::Ugm);
    // No BOS, EOS appended, as llama.cpp's defaults for t5.
    assert_eq!(t.encode("hello world", true, false), vec![4, 7, 1]);
    assert_eq!(t.decode(&[4, 7, 1]), "hello world");
}

#[test]
fn unknown_pre_tokenizer_falls_back_to_default() {
    let mut parts = VocabParts {
        model: "gpt2".into(),
        pre: Some("no-such-pre".into()),
        tokens: unicode::byte_to_char_table()
            .iter()
            .map(|c| c.to_string())
            .collect(),
        ..VocabParts::default()
    };
    let t = Tokenizer::from_parts(parts.clone()).expect("unknown names are not an error");
    assert_eq!(t.kind(), Kind::Bpe(PreTokenizer::Default));
    parts.pre = Some("smollm".into());
    let t = Tokenizer::from_parts(parts).expect("smollm");
    assert_eq!(t.kind(), Kind::Bpe(PreTokenizer::Starcoder));
    assert_eq!(t.encode("ab 12", false, false).len(), 5);
}

fn frags_key(f: &[Frag]) -> Vec<(bool, usize, usize)> {
    f.iter()
        .map(|x| match *x {
            Frag::Text(s, e) => (true, s, e),
            Frag::Token(id) => (false, id as usize, 0),
        })
        .collect()
}

proptest::proptest! {
    /// The one-pass automaton partition equals llama.cpp's token-by-token scan, with
    /// overlapping specials of equal and different lengths and whitespace stripping.
    #[test]
    fn automaton_partition_equals_sequential_scan(text in "[ab<> \n]{0,40}", parse in proptest::bool::ANY) {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![2, 3, 3];
        for (w, ty) in [("a", 1), ("b", 1), ("<a>", 3), ("a>", 4), ("<ab", 4), ("b<", 3), ("ba", 4), ("ab", 3), (" <", 4), ("bb", 4)] {
            tokens.push(w.into());
            types.push(ty);
        }
        let mut t = Tokenizer::from_parts(VocabParts {
            model: "llama".into(),
            tokens,
            token_types: Some(types),
            ..VocabParts::default()
        })
        .expect("valid vocab");
        for (w, bits) in [("a>", attr::LSTRIP), ("b<", attr::RSTRIP), (" <", attr::LSTRIP | attr::RSTRIP)] {
            let id = t.token_id(w).expect("token");
            t.attrs[id as usize] |= bits;
        }
        t.specials = special::Specials::new(&t.tokens, &t.attrs, &t.special_cache);
        let fast = t.partition(&text, parse);
        let slow = t.partition_scan(&text, parse);
        proptest::prop_assert_eq!(frags_key(&fast), frags_key(&slow));
    }
}
