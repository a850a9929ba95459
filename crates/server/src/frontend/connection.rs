//! One accepted frontend connection, served in the server's mode: on the main frontend its
//! clients' tenant is resolved from what they prove, on a tenant's own frontend it is that
//! tenant, once the client proved it is one of the tenant's.

use std::sync::Arc;
use std::time::Duration;

use tether_grpc::server::Connection;
use tether_grpc::{H2Settings, PeerTransport};
use tokio_util::sync::CancellationToken;

use super::Mode;
use crate::dial::Hub;
use crate::handshake_failures::{HandshakeFailures, Listener};
use crate::limits::LimitMetrics;
use crate::net;
use crate::warn_limit::WarnLimit;

/// What every frontend listener's connections share.
#[derive(Debug)]
pub(crate) struct FrontendService {
    pub(crate) hub: Arc<Hub>,
    pub(crate) settings: H2Settings,
    pub(crate) shutdown: CancellationToken,
    pub(crate) mode: Mode,
    pub(crate) metrics: LimitMetrics,
    pub(crate) first_packet_timeout: Duration,
    /// Limits the warnings about clients refused on a tenant's own frontend.
    pub(crate) strangers: WarnLimit,
    /// Refused TLS handshakes on the TCP frontends.
    pub(crate) handshake_failures: HandshakeFailures,
}

impl FrontendService {
    /// Serves one connection; `tenant` names the listener's own tenant, if it has one.
    pub(crate) async fn serve(
        self: Arc<Self>,
        conn: net::Accepted,
        deadline: tokio::time::Instant,
        tenant: Option<Arc<str>>,
    ) -> std::io::Result<()> {
        let metrics = &self.metrics;
        // The TLS handshake's state (about 2 KiB) is boxed, and so is each mode's: a
        // connection's task then holds only what its own mode needs once set up.
        let (peer_label, tls) = (conn.peer_label(), conn.peer.transport == PeerTransport::Tls);
        let (io, peer) = match Box::pin(crate::serve::ready(conn, deadline, metrics)).await {
            Ok(ready) => (ready.io, ready.peer),
            Err(error) if tls => {
                let listener = Listener::Frontend {
                    tenant: tenant.as_ref().map(|t| t.to_string()),
                };
                self.handshake_failures
                    .record(&listener, &peer_label, &error);
                return Ok(());
            }
            Err(error) => return Err(error),
        };
        // Before any request is read: a client that is not the tenant's gets nothing.
        if let Some(tenant) = &tenant
            && let Err(why) = admit(&self.hub, tenant, &peer)
        {
            if let Some(suppressed) = self.strangers.allow() {
                tracing::warn!(
                    tenant = %tenant,
                    peer = %peer.addr.map_or_else(|| "unix".to_owned(), |a| a.to_string()),
                    reason = %why,
                    suppressed,
                    "refused a client on a tenant's own frontend"
                );
            }
            io.abort_on_close();
            return Ok(());
        }
        let unix = peer.transport == PeerTransport::Unix;
        let connection = Connection {
            peer: Arc::new(peer),
            setup_deadline: Some(deadline),
        };
        // Requests name the tenant, which each dial looks up again.
        let pinned = tenant;
        let served = match self.mode {
            Mode::Grpc => {
                let service = self.clone();
                let on_call = move |call| {
                    super::grpc::serve(
                        service.hub.clone(),
                        service.metrics.clone(),
                        service.first_packet_timeout,
                        pinned.clone(),
                        call,
                    )
                };
                // Go clients send the escaped socket path as :authority; see AuthorityRewrite.
                let io: Box<dyn net::Io> = if unix {
                    Box::new(tether_grpc::AuthorityRewrite::new(io))
                } else {
                    io
                };
                Box::pin(tether_grpc::server::serve_connection(
                    io,
                    &self.settings,
                    connection,
                    on_call,
                    self.shutdown.cancelled(),
                ))
                .await
            }
            Mode::HttpConnect => {
                Box::pin(super::http_connect::serve(
                    self.hub.clone(),
                    metrics.clone(),
                    io,
                    connection.peer,
                    pinned,
                ))
                .await;
                Ok(())
            }
        };
        crate::serve::count_connection_end(metrics, &served);
        served.map_err(|e| std::io::Error::other(e.to_string()))
    }
}

/// Whether `peer` may use tenant `name`'s own frontend, in the generation in force.
fn admit(hub: &Hub, name: &str, peer: &tether_grpc::PeerIdentity) -> Result<(), String> {
    let running = hub.running();
    let tenants = &running.tenants;
    match tenants.by_name(name) {
        Some(tenant) => tenants.admit_own_frontend(tenant, peer),
        None => Err(tenants.not_found(name)),
    }
}
