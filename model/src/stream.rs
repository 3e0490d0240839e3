//! Streaming text output: turns token byte pieces into valid UTF-8 as soon as possible and stops
//! at stop strings without ever printing any part of one.

/// Accumulates token bytes and releases text that is both complete UTF-8 and cannot be the start
/// of a stop string.
#[derive(Clone, Debug, Default)]
pub struct TextStream {
    stops: Vec<String>,
    pending_bytes: Vec<u8>,
    held: String,
    stopped: bool,
}

impl TextStream {
    /// A stream that ends at the first occurrence of any of `stops` (empty strings are ignored).
    pub fn new(stops: impl IntoIterator<Item = String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Self::default()
        }
    }

    /// True once a stop string was seen; later input is ignored.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds a token's bytes; returns the text that can be shown now.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        if self.stopped {
            return String::new();
        }
        self.pending_bytes.extend_from_slice(bytes);
        let valid = match std::str::from_utf8(&self.pending_bytes) {
            Ok(s) => s.len(),
            Err(e) if e.error_len().is_some() => {
                // Invalid bytes (not just a cut-off sequence): show them as U+FFFD now.
                let s = String::from_utf8_lossy(&self.pending_bytes).into_owned();
                self.pending_bytes.clear();
                self.held.push_str(&s);
                return self.release();
            }
            Err(e) => e.valid_up_to(),
        };
        let rest = self.pending_bytes.split_off(valid);
        let text = std::mem::replace(&mut self.pending_bytes, rest);
        self.held.push_str(&String::from_utf8_lossy(&text));
        self.release()
    }

    /// Everything still held back (end of generation): incomplete UTF-8 becomes U+FFFD.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let tail = String::from_utf8_lossy(&self.pending_bytes).into_owned();
        self.pending_bytes.clear();
        self.held.push_str(&tail);
        std::mem::take(&mut self.held)
    }

    fn release(&mut self) -> String {
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
        {
            self.stopped = true;
            let out = self.held[..at].to_owned();
            self.held.clear();
            return out;
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > keep && self.held.ends_with(&s[..i]) {
                    keep = i;
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_owned();
        self.held.drain(..cut);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn split_utf8_is_joined() {
        let mut s = TextStream::new([]);
        let bytes = "é".as_bytes();
        assert_eq!(s.push(&bytes[..1]), "");
        assert_eq!(s.push(&bytes[1..]), "é");
    }

    #[test]
    fn stop_string_across_tokens() {
        let mut s = TextStream::new(["<end>".to_owned()]);
        assert_eq!(s.push(b"Hello <e"), "Hello ");
        assert_eq!(s.push(b"n"), "");
        assert_eq!(s.push(b"d> more"), "");
        assert!(s.stopped());
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn false_alarm_is_released() {
        let mut s = TextStream::new(["<end>".to_owned()]);
        assert_eq!(s.push(b"a <e"), "a ");
        assert_eq!(s.push(b"x"), "<ex");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        let mut s = TextStream::new([]);
        assert_eq!(s.push(&[0xff, b'a']), "\u{fffd}a");
        assert_eq!(s.push(&[0xe2, 0x82]), "");
        assert_eq!(s.finish(), "\u{fffd}");
    }

    proptest! {
        #[test]
        fn output_is_text_up_to_first_stop(text in "[a-c<>]{0,40}", cuts in prop::collection::vec(0usize..40, 0..10)) {
            let stop = "<b>".to_owned();
            let mut s = TextStream::new([stop.clone()]);
            let bytes = text.as_bytes();
            let mut cuts: Vec<usize> = cuts.into_iter().filter(|&c| c <= bytes.len()).collect();
            cuts.push(0);
            cuts.push(bytes.len());
            cuts.sort_unstable();
            let mut out = String::new();
            for w in cuts.windows(2) {
                out.push_str(&s.push(&bytes[w[0]..w[1]]));
            }
            out.push_str(&s.finish());
            let expected = match text.find(&stop) { Some(i) => &text[..i], None => &text[..] };
            prop_assert_eq!(out, expected);
        }
    }
}
