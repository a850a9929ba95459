//! SIGTERM and SIGINT, as upstream's binaries handle them.
//!
//! The first signal starts a graceful stop: the server stops accepting and shuts down; the
//! agent drains (tells every server it is going away and opens no new server connections).
//! The second one ends it: the agent stops and exits 0; the server exits 1 at once.

use anyhow::Context as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// Cancelled by the first and the second signal respectively.
#[derive(Debug)]
pub(crate) struct Signals {
    pub(crate) first: CancellationToken,
    pub(crate) second: CancellationToken,
}

impl Signals {
    /// Installs the handlers, replacing the default action (terminate), and watches for
    /// signals until the second one. Must be called inside the runtime.
    pub(crate) fn install() -> anyhow::Result<Self> {
        let mut term = signal(SignalKind::terminate()).context("installing a SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("installing a SIGINT handler")?;
        let signals = Self {
            first: CancellationToken::new(),
            second: CancellationToken::new(),
        };
        let (first, second) = (signals.first.clone(), signals.second.clone());
        // Owned by the runtime: it ends after the second signal, or when the process does.
        tokio::spawn(async move {
            for (token, which) in [(first, "first"), (second, "second")] {
                let name = tokio::select! {
                    _ = term.recv() => "SIGTERM",
                    _ = int.recv() => "SIGINT",
                };
                tracing::info!(signal = name, "{which} signal received");
                token.cancel();
            }
        });
        Ok(signals)
    }
}
