//! The end of a server's run: stop accepting, let live connections finish within the grace
//! period, then cut what remains, and write the last audit records.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::net::Listener;

/// How long cut connections get to drop their state before the server stops regardless.
const CUT_TIMEOUT: Duration = Duration::from_secs(5);

/// What still runs once the accept loops returned.
pub(crate) struct Draining {
    /// Read by the readiness endpoint: set, it reports the server is going away.
    pub(crate) shutting_down: Arc<AtomicBool>,
    /// The main frontend's listener, closed first (a Unix socket's file goes with it).
    pub(crate) frontend: Listener,
    /// Frontend connections, the tenants' own frontends' included.
    pub(crate) frontends: TaskTracker,
    /// Agent connections, and the agent streams on them.
    pub(crate) agents: TaskTracker,
    pub(crate) streams: TaskTracker,
    /// The health and admin endpoints and the certificate reloads.
    pub(crate) endpoints: TaskTracker,
    /// Ends every connection at once.
    pub(crate) stop: CancellationToken,
    pub(crate) audit_writer: Option<tether_observe::audit::AuditTask>,
}

impl Draining {
    /// Lets frontend connections finish for up to `grace`, then cuts every connection and
    /// stream, stops the endpoints, and flushes the audit log last.
    pub(crate) async fn drain(self, grace: Duration) {
        // Shutting down: no new connections are accepted from here on.
        self.shutting_down.store(true, Ordering::Release);
        drop(self.frontend);
        self.frontends.close();
        self.agents.close();
        self.streams.close();
        if !grace.is_zero() {
            tracing::info!(?grace, "draining live connections");
            let _ = tokio::time::timeout(grace, self.frontends.wait()).await;
        }
        self.stop.cancel();
        // Cut connections drop their HTTP/2 state at once, which ends every stream task.
        let _ = tokio::time::timeout(CUT_TIMEOUT, async {
            self.frontends.wait().await;
            self.agents.wait().await;
            self.streams.wait().await;
        })
        .await;
        self.endpoints.close();
        self.endpoints.wait().await;
        if let Some(writer) = self.audit_writer {
            writer.finish().await;
        }
        tracing::info!("proxy server stopped");
    }
}
