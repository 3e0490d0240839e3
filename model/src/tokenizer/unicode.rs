//! Code point classes the pre-tokenizers need (letter, number, whitespace, punctuation), and
//! GPT-2's byte <-> printable code point table.
//!
//! llama.cpp classifies code points by Unicode general category (its own generated table) and
//! by the `White_Space` property; we take the categories from `unicode-general-category` and the
//! 25 `White_Space` code points listed below, which is the whole property.

use unicode_general_category::{get_general_category, GeneralCategory as Gc};

/// What the splitters ask about one code point.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    /// Position is inside the text being split (false past either end).
    pub defined: bool,
    /// `\p{L}`
    pub letter: bool,
    /// `\p{N}`
    pub number: bool,
    /// `\p{P}`
    pub punct: bool,
    /// `\p{M}`
    pub mark: bool,
    /// `\p{S}`
    pub symbol: bool,
    /// `\p{C}` (control, format, surrogate, private use, unassigned)
    pub control: bool,
    /// `\s` in llama.cpp's sense (the `White_Space` property).
    pub space: bool,
}

const WHITE_SPACE: [u32; 25] = [
    0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
    0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
];

/// Classifies one code point.
pub(crate) fn flags(c: char) -> Flags {
    let cat = get_general_category(c);
    let letter = matches!(
        cat,
        Gc::UppercaseLetter
            | Gc::LowercaseLetter
            | Gc::TitlecaseLetter
            | Gc::ModifierLetter
            | Gc::OtherLetter
    );
    let number = matches!(cat, Gc::DecimalNumber | Gc::LetterNumber | Gc::OtherNumber);
    let punct = matches!(
        cat,
        Gc::ConnectorPunctuation
            | Gc::DashPunctuation
            | Gc::OpenPunctuation
            | Gc::ClosePunctuation
            | Gc::InitialPunctuation
            | Gc::FinalPunctuation
            | Gc::OtherPunctuation
    );
    let mark = matches!(
        cat,
        Gc::NonspacingMark | Gc::SpacingMark | Gc::EnclosingMark
    );
    let symbol = matches!(
        cat,
        Gc::MathSymbol | Gc::CurrencySymbol | Gc::ModifierSymbol | Gc::OtherSymbol
    );
    let control = matches!(
        cat,
        Gc::Control | Gc::Format | Gc::Surrogate | Gc::PrivateUse | Gc::Unassigned
    );
    Flags {
        defined: true,
        control,
        letter,
        number,
        punct,
        mark,
        symbol,
        space: WHITE_SPACE.contains(&u32::from(c)),
    }
}

/// GPT-2's table: byte -> the printable code point that stands for it in BPE vocabularies.
pub(crate) fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut assigned = [false; 256];
    let printable = (0x21u32..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF);
    for b in printable {
        // Every value in these ranges is a valid scalar below 0x100.
        if let Some(c) = char::from_u32(b) {
            table[b as usize] = c;
            assigned[b as usize] = true;
        }
    }
    let mut n = 0u32;
    for b in 0..256usize {
        if !assigned[b] {
            table[b] = char::from_u32(256 + n).unwrap_or('\u{FFFD}');
            n += 1;
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = byte_to_char_table();
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[0xAD], '\u{143}');
    }

    #[test]
    fn classes() {
        assert!(flags('é').letter);
        assert!(flags('中').letter);
        assert!(flags('٣').number);
        assert!(flags('\u{3000}').space);
        assert!(flags('!').punct);
        assert!(!flags('$').punct);
        assert!(!flags('🦙').letter && !flags('🦙').space && !flags('🦙').number);
    }
}
