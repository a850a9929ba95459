//! Peer-supplied text in log lines, cut to a bounded prefix.

use std::fmt;

/// At most this many bytes of a peer-supplied string reach a log line.
const MAX_LOGGED_BYTES: usize = 128;

/// Displays at most [`MAX_LOGGED_BYTES`] of a string (on a character boundary), then how
/// long the whole was: a peer that sends a megabyte-long agent ID must not write a megabyte
/// into every log line about it.
#[derive(Clone, Copy, Debug)]
pub struct LogText<'a>(pub &'a str);

impl fmt::Display for LogText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        if s.len() <= MAX_LOGGED_BYTES {
            return f.write_str(s);
        }
        let mut end = MAX_LOGGED_BYTES;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        write!(f, "{}…({} bytes)", &s[..end], s.len())
    }
}

#[cfg(test)]
mod tests {
    use super::LogText;

    #[test]
    fn long_text_is_cut_on_a_char_boundary() {
        assert_eq!(LogText("short").to_string(), "short");
        let long = "é".repeat(1000);
        let shown = LogText(&long).to_string();
        assert!(shown.len() < 200, "{shown}");
        assert!(shown.ends_with("…(2000 bytes)"), "{shown}");
    }
}
