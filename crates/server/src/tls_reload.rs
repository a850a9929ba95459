//! Polling the listeners' certificate files and swapping in new TLS configs.

use std::sync::Arc;
use std::time::Duration;

use tether_observe::metrics::{CounterVec, Registry};
use tether_tls::{ReloadOutcome, Reloading};
use tokio_util::sync::CancellationToken;

/// Listener TLS configs rebuilt from their files when those change (certificate rotation).
/// When set, these replace the [`Config`](crate::Config)'s `agent_tls` and the frontend's
/// `tls` for new handshakes.
#[derive(Clone, Debug)]
pub struct TlsReload {
    /// How often the files are checked.
    pub interval: Duration,
    pub agent: Arc<Reloading<rustls::ServerConfig>>,
    /// The TCP frontend's; `None` for a Unix socket frontend.
    pub frontend: Option<Arc<Reloading<rustls::ServerConfig>>>,
}

/// `tether_server_tls_reloads_total{listener, outcome}`.
#[derive(Debug)]
pub(crate) struct ReloadMetrics {
    reloads: Arc<CounterVec>,
}

impl ReloadMetrics {
    pub(crate) fn register(registry: &Registry) -> Self {
        let reloads = registry.counter_vec(
            "tether_server_tls_reloads_total",
            "Certificate reloads by listener (agent, frontend) and outcome (reloaded, failed: the old config stays)",
            &["listener", "outcome"],
        );
        for listener in ["agent", "frontend"] {
            for outcome in ["reloaded", "failed"] {
                reloads.with(&[listener, outcome]);
            }
        }
        Self { reloads }
    }
}

/// Checks every `reload.interval` until `stop`.
pub(crate) async fn run(reload: TlsReload, metrics: ReloadMetrics, stop: CancellationToken) {
    let mut ticker = tokio::time::interval(reload.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        check("agent", &reload.agent, &metrics).await;
        if let Some(frontend) = &reload.frontend {
            check("frontend", frontend, &metrics).await;
        }
    }
}

async fn check(
    listener: &str,
    reloading: &Arc<Reloading<rustls::ServerConfig>>,
    metrics: &ReloadMetrics,
) {
    // Reading files and parsing PEM: blocking work, kept off the async workers.
    let job = reloading.clone();
    let Ok(outcome) = tokio::task::spawn_blocking(move || job.reload_if_changed()).await else {
        return;
    };
    match outcome {
        ReloadOutcome::Unchanged => {}
        ReloadOutcome::Reloaded => {
            metrics.reloads.with(&[listener, "reloaded"]).inc();
            tracing::info!(listener, files = %reloading.files().iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(","), "TLS certificates reloaded; new handshakes use them");
        }
        // A certificate outside its validity is no half-written file that the next write
        // fixes: it needs a new certificate, so it is an error.
        ReloadOutcome::Failed(e) if e.is_outside_validity() => {
            metrics.reloads.with(&[listener, "failed"]).inc();
            tracing::error!(listener, error = %e, "TLS certificate files hold a certificate outside its validity period; keeping the previous ones");
        }
        ReloadOutcome::Failed(e) => {
            metrics.reloads.with(&[listener, "failed"]).inc();
            tracing::warn!(listener, error = %e, "TLS certificate files changed but do not load; keeping the previous ones");
        }
    }
}
