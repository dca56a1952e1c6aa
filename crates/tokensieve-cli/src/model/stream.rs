//! Streaming token bytes as text: a token may end in the middle of a UTF-8 character (byte-level
//! BPE splits multi-byte characters), so the incomplete tail waits for the next token.

/// Turns a stream of byte chunks into text, holding back an incomplete trailing character.
#[derive(Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    /// Adds `bytes` and returns the text that is complete now. Bytes that can never start or
    /// continue a valid character come out as U+FFFD.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut consumed = 0;
        for chunk in self.pending.utf8_chunks() {
            out.push_str(chunk.valid());
            consumed += chunk.valid().len();
            let invalid = chunk.invalid();
            if invalid.is_empty() {
                continue;
            }
            let rest = self.pending.len() - consumed;
            // An invalid run at the very end may be a character still arriving.
            if invalid.len() == rest && could_continue(invalid) {
                break;
            }
            out.push(char::REPLACEMENT_CHARACTER);
            consumed += invalid.len();
        }
        self.pending.drain(..consumed);
        out
    }

    /// Ends the stream: whatever is still held back, lossily.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}

/// True when `tail` is the start of a valid multi-byte character (a lead byte and fewer
/// continuation bytes than it announces).
fn could_continue(tail: &[u8]) -> bool {
    let need = match tail[0] {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => return false,
    };
    tail.len() < need && tail[1..].iter().all(|b| b & 0xC0 == 0x80)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_character_split_across_tokens_waits_for_its_end() {
        let mut s = Utf8Stream::default();
        let euro = "€".as_bytes(); // E2 82 AC
        assert_eq!(s.push(b"a "), "a ");
        assert_eq!(s.push(&euro[..1]), "");
        assert_eq!(s.push(&euro[1..2]), "");
        assert_eq!(s.push(&[euro[2], b'!']), "€!");
        assert_eq!(s.finish(), "");
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut s = Utf8Stream::default();
        assert_eq!(s.push(&[b'x', 0xFF, b'y']), "x\u{FFFD}y");
        // A lead byte followed by a non-continuation byte is invalid at once.
        assert_eq!(s.push(&[0xE2, b'z']), "\u{FFFD}z");
        // An unfinished character at the end comes out lossily.
        assert_eq!(s.push(&[0xF0, 0x9F]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    #[test]
    fn emoji_byte_by_byte() {
        let mut s = Utf8Stream::default();
        let text = "🦙 llama";
        let out: String = text.as_bytes().iter().map(|b| s.push(&[*b])).collect();
        assert_eq!(out + &s.finish(), text);
    }
}
