//! Log output, configured from klog's flags and `--log-format`.
//!
//! klog's verbosity is finer and chattier than tracing's levels, and upstream runs at
//! `-v=4` by default, so levels are mapped coarsely: up to 4 is INFO, 5-7 DEBUG, 8 and above
//! TRACE. The mapped level applies to tether's own events; libraries (h2 logs every frame at
//! DEBUG) stay at INFO until `-v=8`. `RUST_LOG`, when set, replaces that with a full tracing
//! filter.
//!
//! Text is klog's format ([`klog`]), which upstream writes and log pipelines parse.
//!
//! Destination, as klog: standard error by default; with `--logtostderr=false` and
//! `--log-file`, that file (appended to), plus standard error with `--alsologtostderr`.
//!
//! `--log-format=json` writes one object per line for log pipelines: `timestamp` (RFC 3339,
//! UTC), `level`, `target`, `message` and the event's own fields at the top level, `span` (the
//! innermost span: its `name` and fields) and `spans` (all of them, outermost first).

mod klog;

use std::ffi::OsString;
use std::fs::OpenOptions;
use std::io::IsTerminal as _;
use std::sync::Arc;

use anyhow::Context as _;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt as _};

use crate::cli::klog::{KlogArgs, LogFormat};

/// Installs the global subscriber. Commands without klog flags (`dial`, `quickstart`) log
/// warnings and errors to standard error as text.
pub(crate) fn init(klog: Option<&KlogArgs>) -> anyhow::Result<()> {
    let directives = klog.map_or_else(|| LevelFilter::WARN.to_string(), |k| directives(k.v));
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.is_empty() => EnvFilter::try_new(&env).context("RUST_LOG")?,
        _ => EnvFilter::try_new(&directives).context("the log filter")?,
    };
    let Some(klog) = klog else {
        let ansi = std::io::stderr().is_terminal();
        return install(tool_subscriber(filter, ansi));
    };
    let writer = if klog.logtostderr || klog.log_file.is_empty() {
        BoxMakeWriter::new(std::io::stderr)
    } else {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&klog.log_file)
            .with_context(|| format!("--log-file: opening {}", klog.log_file))?;
        let file = Arc::new(file);
        if klog.alsologtostderr {
            BoxMakeWriter::new(std::io::stderr.and(file))
        } else {
            BoxMakeWriter::new(file)
        }
    };
    install(subscriber(klog.log_format, filter, writer))
}

/// The first line of a server's or agent's log: what runs, and how it was asked to, as
/// upstream logs its flags at start. Tokens and keys are files, never flag values; the one
/// secret a flag can hold is a URL's user info (`--https-proxy=http://user:password@…`),
/// which is redacted.
pub(crate) fn log_start(argv: &[OsString]) {
    let flags = argv
        .iter()
        .skip(1)
        .map(|arg| redact_user_info(&arg.to_string_lossy()))
        .collect::<Vec<_>>()
        .join(" ");
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        commit = crate::build_info::COMMIT,
        invoked_as = %argv.first().map(|a| a.to_string_lossy()).unwrap_or_default(),
        flags,
        "tether starting"
    );
}

/// `arg` with the user info of a URL in it (`scheme://user:password@host`) replaced by
/// `REDACTED`, as the agent's own proxy lines show it.
fn redact_user_info(arg: &str) -> String {
    let Some(scheme_end) = arg.find("://").map(|i| i + 3) else {
        return arg.to_owned();
    };
    let authority_len = arg[scheme_end..]
        .find(['/', '?', '#'])
        .unwrap_or(arg.len() - scheme_end);
    let authority = &arg[scheme_end..scheme_end + authority_len];
    match authority.rfind('@') {
        Some(at) => format!("{}REDACTED{}", &arg[..scheme_end], &arg[scheme_end + at..]),
        None => arg.to_owned(),
    }
}

/// kube's client logs every failed request at ERROR (`failed with error client error
/// (Connect)`), with neither the API server's URL nor the OS error. tether's own warning for
/// the same failure says both, so below DEBUG (`-v` under 5) kube's line is left out.
const KUBE_REQUEST_FAILURES: &str = "kube_client::client::builder=off";

type Subscriber = Box<dyn tracing::Subscriber + Send + Sync>;

fn install(subscriber: Subscriber) -> anyhow::Result<()> {
    tracing::subscriber::set_global_default(subscriber)
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
}

/// The subscriber for `format`, writing to `writer`.
fn subscriber<W>(format: LogFormat, filter: EnvFilter, writer: W) -> Subscriber
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(
            builder
                .with_ansi(false)
                .event_format(klog::Klog)
                .fmt_fields(klog::Klog)
                .finish(),
        ),
        LogFormat::Json => Box::new(
            builder
                .json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(true)
                .finish(),
        ),
    }
}

/// The subscriber of the commands a person runs in a terminal (`dial`, `top`, …): tracing's
/// compact text on standard error, coloured on a terminal.
fn tool_subscriber(filter: EnvFilter, ansi: bool) -> Subscriber {
    Box::new(
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(ansi)
            .finish(),
    )
}

/// The filter for klog verbosity `v`: tether's own events at [`level`], libraries at INFO
/// at most until `-v=8`, where their frame-level detail is what was asked for, and kube's
/// request failures not below `-v=5` (see [`KUBE_REQUEST_FAILURES`]).
fn directives(v: u32) -> String {
    let own = level(v);
    let libraries = if v >= 8 {
        own
    } else {
        own.min(LevelFilter::INFO)
    };
    let mut directives = format!("{libraries},tether={own}");
    if own < LevelFilter::DEBUG {
        directives.push(',');
        directives.push_str(KUBE_REQUEST_FAILURES);
    }
    directives
}

/// The tracing level for klog verbosity `v`.
fn level(v: u32) -> LevelFilter {
    match v {
        0..=4 => LevelFilter::INFO,
        5..=7 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    #[test]
    fn user_info_in_urls_is_redacted() {
        assert_eq!(
            redact_user_info("--https-proxy=http://alice:pw%2D1@127.0.0.1:3128"),
            "--https-proxy=http://REDACTED@127.0.0.1:3128"
        );
        assert_eq!(
            redact_user_info("https://u:p@proxy.example:3129/path@x"),
            "https://REDACTED@proxy.example:3129/path@x"
        );
        for plain in [
            "--https-proxy=http://127.0.0.1:3128",
            "--agent-id=a@b",
            "-v=4",
        ] {
            assert_eq!(redact_user_info(plain), plain);
        }
    }

    #[test]
    fn verbosity_levels() {
        assert_eq!(level(0), LevelFilter::INFO);
        assert_eq!(level(4), LevelFilter::INFO);
        assert_eq!(level(5), LevelFilter::DEBUG);
        assert_eq!(level(8), LevelFilter::TRACE);
    }

    /// Log lines written under `format` at INFO: one event in nested spans, one filtered out.
    fn lines(format: LogFormat) -> Vec<String> {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&out);
        let writer = move || Sink(Arc::clone(&sink));
        let filter = EnvFilter::new("info");
        tracing::subscriber::with_default(subscriber(format, filter, writer), || {
            let outer = tracing::info_span!("agent", agent.id = "a-1", stream = 7);
            let _outer = outer.enter();
            let inner = tracing::info_span!("dial", connect_id = 42);
            let _inner = inner.enter();
            tracing::warn!(error = "refused", "dial failed");
            tracing::debug!("filtered out");
        });
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn json_lines_parse_and_carry_span_fields() {
        let lines = lines(LogFormat::Json);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line: serde_json::Value = serde_json::from_str(&lines[0]).expect("one JSON object");
        assert_eq!(line["level"], "WARN");
        assert_eq!(line["message"], "dial failed");
        assert_eq!(line["error"], "refused");
        assert_eq!(line["target"], module_path!());
        let timestamp = line["timestamp"].as_str().expect("timestamp");
        assert!(
            timestamp.ends_with('Z') && timestamp.contains('T'),
            "{timestamp}"
        );
        assert_eq!(line["span"]["name"], "dial");
        assert_eq!(line["span"]["connect_id"], 42);
        let spans = line["spans"].as_array().expect("span list");
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0]["name"], "agent");
        assert_eq!(spans[0]["agent.id"], "a-1");
        assert_eq!(spans[0]["stream"], 7);
    }

    #[test]
    fn text_lines_are_klogs() {
        let lines = lines(LogFormat::Text);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        let (header, body) = line.split_once("] ").expect("klog's header ends with `] `");
        let mut header = header.split_whitespace();
        let date = header.next().unwrap();
        assert!(
            date.starts_with('W')
                && date.len() == 5
                && date[1..].bytes().all(|b| b.is_ascii_digit()),
            "{line}"
        );
        let time = header.next().unwrap();
        assert!(time.len() == 15 && time.as_bytes()[8] == b'.', "{line}");
        assert_eq!(header.next(), Some(std::process::id().to_string().as_str()));
        assert!(header.next().unwrap().starts_with("logging.rs:"), "{line}");
        assert_eq!(
            body,
            r#""dial failed" agent.id="a-1" stream=7 connect_id=42 error="refused""#
        );
    }

    #[test]
    fn fields_carry_plain_values_and_absent_ones_are_left_out() {
        let out = Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = Arc::clone(&out);
        let writer = move || Sink(Arc::clone(&sink));
        let health: Option<std::net::SocketAddr> = Some("127.0.0.1:8092".parse().unwrap());
        let admin: Option<std::net::SocketAddr> = None;
        let error = std::io::Error::other(Chained);
        tracing::subscriber::with_default(
            subscriber(LogFormat::Text, EnvFilter::new("info"), writer),
            || {
                tracing::info!(
                    health = health.map(tracing::field::display),
                    admin = admin.map(tracing::field::display),
                    error = &error as &(dyn std::error::Error + 'static),
                    "listening"
                );
            },
        );
        let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
        let body = text.trim_end().split_once("] ").unwrap().1;
        assert_eq!(
            body,
            r#""listening" health="127.0.0.1:8092" error="outer: inner""#
        );
    }

    /// An error whose text already carries its cause's, as some libraries' do.
    #[derive(Debug)]
    struct Chained;

    impl std::fmt::Display for Chained {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("outer: inner")
        }
    }

    impl std::error::Error for Chained {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&Inner)
        }
    }

    #[derive(Debug)]
    struct Inner;

    impl std::fmt::Display for Inner {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("inner")
        }
    }

    impl std::error::Error for Inner {}

    #[test]
    fn libraries_stay_at_info_until_v8() {
        let messages = |v| {
            let out = Arc::new(Mutex::new(Vec::<u8>::new()));
            let sink = Arc::clone(&out);
            let writer = move || Sink(Arc::clone(&sink));
            let filter = EnvFilter::new(directives(v));
            tracing::subscriber::with_default(subscriber(LogFormat::Text, filter, writer), || {
                tracing::info!(target: "h2::proto", "library info");
                tracing::debug!(target: "h2::codec::framed_write", "library debug");
                tracing::trace!(target: "h2::codec::framed_read", "library trace");
                tracing::info!(target: "tether_server::backend", "own info");
                tracing::debug!(target: "tether_server::backend", "own debug");
                tracing::trace!(target: "tether_agent::session", "own trace");
            });
            let text = String::from_utf8(out.lock().unwrap().clone()).unwrap();
            text.lines()
                .map(|line| {
                    line.split_once("] ")
                        .unwrap()
                        .1
                        .trim_matches('"')
                        .to_owned()
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(messages(4), ["library info", "own info"]);
        assert_eq!(messages(5), ["library info", "own info", "own debug"]);
        assert_eq!(messages(8).len(), 6);
    }

    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
}
