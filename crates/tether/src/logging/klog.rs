//! klog's text format, the one upstream's binaries write and log pipelines parse:
//!
//! ```text
//! I1203 07:47:44.724476    4242 listen.rs:88] "proxy server listening" agent="127.0.0.1:8091" mode="grpc"
//! ```
//!
//! The header is klog's: severity letter (`I`, `W`, `E`; tracing's DEBUG and TRACE are klog's
//! `-v` levels, so `I` too), month and day, time with microseconds (UTC), the process id in
//! seven columns, and the source file's name and line. Then, as klog's structured calls
//! (`InfoS`) write it, the quoted message and `key=value` pairs: the fields of the spans the
//! event happened in (outermost first, as a logger's `WithValues`), then the event's own.
//! Strings are quoted, numbers and booleans are not.

use std::error::Error;
use std::fmt::{self, Write as _};

use jiff::Timestamp;
use jiff::tz::TimeZone;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats events and span fields as klog does.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Klog;

impl<S, N> FormatEvent<S, N> for Klog
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        write_header(
            &mut writer,
            *meta.level(),
            Timestamp::now(),
            std::process::id(),
            meta.file(),
            meta.line(),
            meta.target(),
        )?;
        let mut fields = Fields::default();
        event.record(&mut fields);
        write_quoted(&mut writer, &fields.message)?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let extensions = span.extensions();
                if let Some(formatted) = extensions.get::<FormattedFields<N>>()
                    && !formatted.is_empty()
                {
                    write!(writer, " {formatted}")?;
                }
            }
        }
        writer.write_str(&fields.pairs)?;
        writeln!(writer)
    }
}

impl<'writer> FormatFields<'writer> for Klog {
    /// Span fields, kept formatted in the span until its events are written.
    fn format_fields<R: RecordFields>(
        &self,
        mut writer: Writer<'writer>,
        fields: R,
    ) -> fmt::Result {
        let mut visitor = Fields::default();
        fields.record(&mut visitor);
        writer.write_str(visitor.pairs.trim_start())
    }
}

/// klog's header up to and including `] `. Without a source file (events bridged from the
/// `log` crate), the target stands in for it.
fn write_header(
    writer: &mut impl fmt::Write,
    level: Level,
    now: Timestamp,
    pid: u32,
    file: Option<&str>,
    line: Option<u32>,
    target: &str,
) -> fmt::Result {
    let severity = match level {
        Level::ERROR => 'E',
        Level::WARN => 'W',
        _ => 'I',
    };
    let time = now.to_zoned(TimeZone::UTC).strftime("%m%d %H:%M:%S.%6f");
    let file = file.map_or(target, |path| path.rsplit('/').next().unwrap_or(path));
    write!(
        writer,
        "{severity}{time} {pid:>7} {file}:{}] ",
        line.unwrap_or(0)
    )
}

/// Writes `text` as a quoted string (Go's `%q` and Rust's `{:?}` agree on the common escapes).
fn write_quoted(writer: &mut impl fmt::Write, text: &str) -> fmt::Result {
    write!(writer, "{text:?}")
}

/// An event's message, and its other fields as ` key=value` pairs.
#[derive(Default)]
struct Fields {
    message: String,
    pairs: String,
}

impl Fields {
    fn quoted(&mut self, field: &Field, text: &str) {
        if field.name() == "message" {
            self.message.push_str(text);
        } else {
            let _ = write!(self.pairs, " {}={text:?}", field.name());
        }
    }

    fn bare(&mut self, field: &Field, value: impl fmt::Display) {
        let _ = write!(self.pairs, " {}={value}", field.name());
    }
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.quoted(field, value);
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.bare(field, value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.bare(field, value);
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.bare(field, value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.bare(field, value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.bare(field, value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.bare(field, value);
    }

    /// The error and its causes, joined by `: ` as `anyhow`'s `{:#}` does, each once: a cause
    /// whose text the message already carries is not repeated.
    fn record_error(&mut self, field: &Field, value: &(dyn Error + 'static)) {
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(cause) = source {
            let cause_text = cause.to_string();
            if !text.contains(&cause_text) {
                text.push_str(": ");
                text.push_str(&cause_text);
            }
            source = cause.source();
        }
        self.quoted(field, &text);
    }

    /// `%value` and `?value` fields: their text, quoted.
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.quoted(field, &format!("{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_is_klogs() {
        let now: Timestamp = "2026-12-03T07:47:44.724476912Z".parse().unwrap();
        let mut line = String::new();
        write_header(
            &mut line,
            Level::WARN,
            now,
            1,
            Some("crates/server/src/listen.rs"),
            Some(88),
            "tether_server::listen",
        )
        .unwrap();
        assert_eq!(line, "W1203 07:47:44.724476       1 listen.rs:88] ");

        let mut line = String::new();
        write_header(
            &mut line,
            Level::DEBUG,
            now,
            1234567,
            None,
            None,
            "h2::codec",
        )
        .unwrap();
        assert_eq!(line, "I1203 07:47:44.724476 1234567 h2::codec:0] ");
        for (level, letter) in [(Level::ERROR, 'E'), (Level::INFO, 'I'), (Level::TRACE, 'I')] {
            let mut line = String::new();
            write_header(&mut line, level, now, 1, None, None, "t").unwrap();
            assert!(line.starts_with(letter), "{level}: {line}");
        }
    }

    #[test]
    fn quoting_escapes_as_go_does() {
        let mut out = String::new();
        write_quoted(&mut out, "a \"b\"\n\\c").unwrap();
        assert_eq!(out, r#""a \"b\"\n\\c""#);
    }
}
