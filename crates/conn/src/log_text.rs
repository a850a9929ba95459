//! Peer-supplied text in log lines: escaped, and cut to a bounded prefix.

use std::fmt;

/// At most this many bytes of a peer-supplied string, as escaped, reach a log line.
const MAX_LOGGED_BYTES: usize = 128;

/// Displays a peer's string for a log line: control characters (newline, carriage return,
/// escape, the rest of C0 and C1), line and paragraph separators, bidirectional overrides
/// and the backslash are escaped, so the text cannot start a forged log line, move the
/// terminal's cursor or pass for an escape; then at most [`MAX_LOGGED_BYTES`] of it, and how
/// long the whole was: a peer that sends a megabyte-long agent ID must not write a megabyte
/// into every log line about it.
#[derive(Clone, Copy, Debug)]
pub struct LogText<'a>(pub &'a str);

impl fmt::Display for LogText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.0;
        let mut written = 0;
        for c in s.chars() {
            let mut escaped = Escaped::default();
            write_escaped(&mut escaped, c)?;
            if written + escaped.len > MAX_LOGGED_BYTES {
                return write!(f, "…({} bytes)", s.len());
            }
            f.write_str(escaped.as_str())?;
            written += escaped.len;
        }
        Ok(())
    }
}

/// One character as it appears in the log: itself, or its escape.
fn write_escaped(out: &mut impl fmt::Write, c: char) -> fmt::Result {
    match c {
        '\n' => out.write_str("\\n"),
        '\r' => out.write_str("\\r"),
        '\t' => out.write_str("\\t"),
        '\\' => out.write_str("\\\\"),
        c if needs_escape(c) => write!(out, "\\u{{{:x}}}", c as u32),
        c => out.write_char(c),
    }
}

/// Characters that could end, forge or disguise a log line.
fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A stack buffer for one escaped character (at most `\u{10ffff}`, 10 bytes).
#[derive(Default)]
struct Escaped {
    buf: [u8; 12],
    len: usize,
}

impl Escaped {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.buf[..self.len]).unwrap_or_default()
    }
}

impl fmt::Write for Escaped {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let end = self.len + s.len();
        let slot = self.buf.get_mut(self.len..end).ok_or(fmt::Error)?;
        slot.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
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
        assert!(shown.starts_with("éé"), "{shown}");
        assert!(shown.ends_with("…(2000 bytes)"), "{shown}");
    }

    #[test]
    fn a_forged_log_line_stays_on_one_line() {
        let forged = "boom\n2026-12-03T09:09:09.000000Z  WARN tether: FORGED LINE\r\x1b[2K";
        let shown = LogText(forged).to_string();
        assert_eq!(
            shown,
            "boom\\n2026-12-03T09:09:09.000000Z  WARN tether: FORGED LINE\\r\\u{1b}[2K"
        );
        assert!(!shown.chars().any(char::is_control), "{shown}");
    }

    #[test]
    fn every_control_separator_and_override_is_escaped() {
        for c in (0..0x20u32)
            .chain(0x7f..0xa0)
            .chain([0x2028, 0x2029, 0x202e, 0x2066])
            .filter_map(char::from_u32)
        {
            let text = format!("a{c}b");
            let shown = LogText(&text).to_string();
            assert!(!shown.contains(c), "{:#x}: {shown:?}", c as u32);
            assert!(
                shown.starts_with("a\\") && shown.ends_with('b'),
                "{shown:?}"
            );
        }
        // A literal backslash cannot pass for an escape.
        assert_eq!(LogText("a\\nb").to_string(), "a\\\\nb");
        // Printable text, quotes included, is shown as sent.
        assert_eq!(
            LogText("naïve \"quoted\" 'x'").to_string(),
            "naïve \"quoted\" 'x'"
        );
    }

    #[test]
    fn the_bound_counts_escaped_bytes() {
        let text = "\x1b".repeat(1000);
        let shown = LogText(&text).to_string();
        assert!(
            shown.len() <= 128 + "…(1000 bytes)".len(),
            "{}",
            shown.len()
        );
        assert!(shown.ends_with("…(1000 bytes)"), "{shown}");
    }
}
