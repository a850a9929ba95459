//! Log output, configured from klog's flags and `--log-format`.
//!
//! klog's verbosity is finer and chattier than tracing's levels, and upstream runs at
//! `-v=4` by default, so levels are mapped coarsely: up to 4 is INFO, 5-7 DEBUG, 8 and above
//! TRACE. `RUST_LOG`, when set, replaces that with a full tracing filter.
//!
//! Destination, as klog: standard error by default; with `--logtostderr=false` and
//! `--log-file`, that file (appended to), plus standard error with `--alsologtostderr`.
//!
//! `--log-format=json` writes one object per line for log pipelines: `timestamp` (RFC 3339,
//! UTC), `level`, `target`, `message` and the event's own fields at the top level, `span` (the
//! innermost span: its `name` and fields) and `spans` (all of them, outermost first).

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
    let default = klog.map_or(LevelFilter::WARN, |k| level(k.v));
    let mut filter = EnvFilter::builder()
        .with_default_directive(default.into())
        .from_env()
        .context("RUST_LOG")?;
    if default < LevelFilter::DEBUG && std::env::var_os("RUST_LOG").is_none() {
        filter = filter.add_directive(KUBE_REQUEST_FAILURES.parse()?);
    }
    let Some(klog) = klog else {
        let ansi = std::io::stderr().is_terminal();
        return install(subscriber(
            LogFormat::Text,
            filter,
            BoxMakeWriter::new(std::io::stderr),
            ansi,
        ));
    };
    let (writer, ansi) = if klog.logtostderr || klog.log_file.is_empty() {
        (
            BoxMakeWriter::new(std::io::stderr),
            std::io::stderr().is_terminal(),
        )
    } else {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&klog.log_file)
            .with_context(|| format!("--log-file: opening {}", klog.log_file))?;
        let file = Arc::new(file);
        if klog.alsologtostderr {
            (BoxMakeWriter::new(std::io::stderr.and(file)), false)
        } else {
            (BoxMakeWriter::new(file), false)
        }
    };
    install(subscriber(klog.log_format, filter, writer, ansi))
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

/// The subscriber for `format`, writing to `writer`. Colours only ever go to a terminal, and
/// never into JSON.
fn subscriber<W>(format: LogFormat, filter: EnvFilter, writer: W, ansi: bool) -> Subscriber
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(builder.with_ansi(ansi).finish()),
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
        tracing::subscriber::with_default(subscriber(format, filter, writer, false), || {
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
    fn text_lines_stay_readable() {
        let lines = lines(LogFormat::Text);
        assert_eq!(lines.len(), 1, "{lines:?}");
        let line = &lines[0];
        assert!(!line.starts_with('{'), "{line}");
        for part in [
            "WARN",
            "agent{agent.id=\"a-1\" stream=7}",
            "dial{connect_id=42}",
            "dial failed",
            "error=\"refused\"",
        ] {
            assert!(line.contains(part), "{part:?} missing in {line}");
        }
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
