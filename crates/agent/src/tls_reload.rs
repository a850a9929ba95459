//! The agent's client certificate and CA, re-read when their files change.
//!
//! An agent holds its server connections for days; a rotated certificate matters when it
//! next connects. So the files are checked right before each new connection rather than
//! polled: a rotation is picked up by the next handshake, and a broken file keeps the
//! previous config (logged) instead of making the agent unable to connect at all.

use std::sync::Arc;

use tether_tls::{ReloadOutcome, Reloading};

/// The newest config, after checking the files.
pub(crate) async fn refreshed(
    reloading: &Arc<Reloading<rustls::ClientConfig>>,
) -> Arc<rustls::ClientConfig> {
    let job = reloading.clone();
    match tokio::task::spawn_blocking(move || job.reload_if_changed()).await {
        Ok(ReloadOutcome::Reloaded) => tracing::info!(
            files = %reloading.files().iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(","),
            "TLS client certificate or CA changed; new connections use them"
        ),
        Ok(ReloadOutcome::Failed(e)) if e.is_outside_validity() => tracing::error!(
            error = %e,
            "TLS client certificate files hold a certificate outside its validity period; keeping the previous ones"
        ),
        Ok(ReloadOutcome::Failed(e)) => tracing::warn!(
            error = %e,
            "TLS client certificate files changed but do not load; keeping the previous ones"
        ),
        Ok(ReloadOutcome::Unchanged) | Err(_) => {}
    }
    reloading.current()
}
