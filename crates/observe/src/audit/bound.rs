//! Bounds on what a peer can make one audit record hold.
//!
//! Requested addresses, error texts and identities come from peers: a refused dial once wrote
//! its whole 4 MiB address into the log. Each text field is cut to [`MAX_FIELD_BYTES`] of its
//! JSON encoding, so escaping (a control character takes six bytes) cannot grow it past the
//! bound, and the cut is marked in the text and in the record's `truncated` list. With every
//! field bounded, a record stays under [`MAX_RECORD_BYTES`], as kube-apiserver caps an event
//! with `--audit-log-truncate-max-event-size`.

use std::fmt::Write as _;

/// Longest text field, in bytes of its JSON encoding (without the quotes).
pub const MAX_FIELD_BYTES: usize = 4096;

/// Longest record, in bytes of its JSON line; a longer one is dropped and counted. Every
/// field at [`MAX_FIELD_BYTES`] stays well below it.
pub const MAX_RECORD_BYTES: usize = 64 * 1024;

/// Room kept for the marker that ends a cut field: `…(N bytes)`.
const MARKER_ROOM: usize = 32;

/// Cuts `text` so that its JSON encoding takes at most `max` bytes, on a character boundary,
/// and appends `…(N bytes)` with the original length. Says whether it cut.
pub(crate) fn bound_text(text: &mut String, max: usize) -> bool {
    if json_len(text) <= max {
        return false;
    }
    let budget = max.saturating_sub(MARKER_ROOM);
    let mut used = 0;
    let mut end = 0;
    for (at, c) in text.char_indices() {
        let len = json_char_len(c);
        if used + len > budget {
            break;
        }
        used += len;
        end = at + c.len_utf8();
    }
    let original = text.len();
    text.truncate(end);
    let _ = write!(text, "…({original} bytes)");
    true
}

/// Bytes `text` takes inside a JSON string, as serde_json escapes it.
fn json_len(text: &str) -> usize {
    text.chars().map(json_char_len).sum()
}

fn json_char_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(text: &str) -> usize {
        serde_json::to_string(text).unwrap().len() - 2
    }

    #[test]
    fn short_text_is_kept_whole() {
        let mut text = "127.0.0.1:10250".to_owned();
        assert!(!bound_text(&mut text, 64));
        assert_eq!(text, "127.0.0.1:10250");
    }

    #[test]
    fn long_text_is_cut_and_marked_with_its_length() {
        let mut text = "a".repeat(1 << 20);
        assert!(bound_text(&mut text, MAX_FIELD_BYTES));
        assert!(text.ends_with("…(1048576 bytes)"), "{}", &text[4000..]);
        assert!(encoded(&text) <= MAX_FIELD_BYTES);
        assert!(
            text.len() > MAX_FIELD_BYTES - MARKER_ROOM - 8,
            "{}",
            text.len()
        );
    }

    #[test]
    fn escaping_counts_against_the_bound() {
        // NUL takes six bytes in JSON: a field of 4096 of them would encode to 24 KiB.
        let mut text = "\0".repeat(MAX_FIELD_BYTES);
        assert!(bound_text(&mut text, MAX_FIELD_BYTES));
        assert!(encoded(&text) <= MAX_FIELD_BYTES, "{}", encoded(&text));
        for mut text in ["\"".repeat(5000), "\n".repeat(5000), "é".repeat(5000)] {
            bound_text(&mut text, MAX_FIELD_BYTES);
            assert!(encoded(&text) <= MAX_FIELD_BYTES, "{}", encoded(&text));
        }
    }

    #[test]
    fn the_cut_falls_on_a_character_boundary() {
        let mut text = "€".repeat(100);
        assert!(bound_text(&mut text, 64));
        assert!(text.starts_with("€"));
        assert!(text.ends_with("…(300 bytes)"), "{text}");
    }
}
