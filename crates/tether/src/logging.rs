//! Log output, configured from klog's flags.
//!
//! klog's verbosity is finer and chattier than tracing's levels, and upstream runs at
//! `-v=4` by default, so levels are mapped coarsely: up to 4 is INFO, 5-7 DEBUG, 8 and above
//! TRACE. `RUST_LOG`, when set, replaces that with a full tracing filter.
//!
//! Destination, as klog: standard error by default; with `--logtostderr=false` and
//! `--log-file`, that file (appended to), plus standard error with `--alsologtostderr`.

use std::fs::OpenOptions;
use std::io::IsTerminal as _;
use std::sync::Arc;

use anyhow::Context as _;
use tracing::level_filters::LevelFilter;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::writer::{BoxMakeWriter, MakeWriterExt as _};

use crate::cli::klog::KlogArgs;

/// Installs the global subscriber. Commands without klog flags (`dial`, `quickstart`) log
/// warnings and errors to standard error.
pub(crate) fn init(klog: Option<&KlogArgs>) -> anyhow::Result<()> {
    let default = klog.map_or(LevelFilter::WARN, |k| level(k.v));
    let filter = EnvFilter::builder()
        .with_default_directive(default.into())
        .from_env()
        .context("RUST_LOG")?;
    let Some(klog) = klog else {
        return tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .try_init()
            .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"));
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
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .try_init()
        .map_err(|e| anyhow::anyhow!("installing the log subscriber: {e}"))
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
    use super::*;

    #[test]
    fn verbosity_levels() {
        assert_eq!(level(0), LevelFilter::INFO);
        assert_eq!(level(4), LevelFilter::INFO);
        assert_eq!(level(5), LevelFilter::DEBUG);
        assert_eq!(level(8), LevelFilter::TRACE);
    }
}
