//! Streaming detokenization: token pieces in, complete UTF-8 text out, with a character split
//! across tokens (byte fallback, byte-level BPE) held back until its last byte arrives.

/// Turns a stream of token pieces into text without ever emitting half a character.
#[derive(Clone, Debug, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
}

impl StreamDecoder {
    /// An empty decoder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a token's bytes; returns the text that is now complete (maybe empty). Bytes that
    /// can never become valid UTF-8 come out as U+FFFD.
    pub fn push(&mut self, piece: &[u8]) -> String {
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    // The prefix was just validated.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..valid]));
                    match e.error_len() {
                        None => {
                            self.pending.drain(..valid);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Flushes what is held back (an unfinished character becomes U+FFFD).
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }

    /// True when bytes are being held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_back_split_characters() {
        let mut d = StreamDecoder::new();
        let bytes = "a🦙b".as_bytes();
        assert_eq!(d.push(&bytes[..2]), "a");
        assert!(d.has_pending());
        assert_eq!(d.push(&bytes[2..4]), "");
        assert_eq!(d.push(&bytes[4..]), "🦙b");
        assert!(!d.has_pending());
    }

    #[test]
    fn invalid_bytes_become_replacement() {
        let mut d = StreamDecoder::new();
        assert_eq!(d.push(&[b'x', 0xFF, b'y']), "x\u{FFFD}y");
        assert_eq!(d.push(&[0xE4, 0xB8]), "");
        assert_eq!(d.finish(), "\u{FFFD}");
    }
}
