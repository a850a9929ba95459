//! One accepted frontend connection, served in the server's mode: on the main frontend its
//! clients' tenant is resolved from what they prove, on a tenant's own frontend it is that
//! tenant.

use std::sync::Arc;
use std::time::Duration;

use tether_grpc::server::Connection;
use tether_grpc::{H2Settings, PeerTransport};
use tokio_util::sync::CancellationToken;

use super::Mode;
use crate::dial::Hub;
use crate::limits::LimitMetrics;
use crate::net;
use crate::tenant::Tenant;

/// What every frontend listener's connections share.
#[derive(Debug)]
pub(crate) struct FrontendService {
    pub(crate) hub: Arc<Hub>,
    pub(crate) settings: H2Settings,
    pub(crate) shutdown: CancellationToken,
    pub(crate) mode: Mode,
    pub(crate) metrics: LimitMetrics,
    pub(crate) first_packet_timeout: Duration,
}

impl FrontendService {
    /// Serves one connection; `tenant` is the listener's own tenant, if it has one.
    pub(crate) async fn serve(
        self: Arc<Self>,
        conn: net::Accepted,
        deadline: tokio::time::Instant,
        tenant: Option<Arc<Tenant>>,
    ) -> std::io::Result<()> {
        let metrics = &self.metrics;
        // The TLS handshake's state (about 2 KiB) is boxed, and so is each mode's: a
        // connection's task then holds only what its own mode needs once set up.
        let (io, peer) = Box::pin(crate::ready(conn, deadline, metrics)).await?;
        let unix = peer.transport == PeerTransport::Unix;
        let connection = Connection {
            peer: Arc::new(peer),
            setup_deadline: Some(deadline),
        };
        let served = match self.mode {
            Mode::Grpc => {
                let service = self.clone();
                let on_call = move |call| {
                    super::grpc::serve(
                        service.hub.clone(),
                        service.metrics.clone(),
                        service.first_packet_timeout,
                        tenant.clone(),
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
                    tenant,
                ))
                .await;
                Ok(())
            }
        };
        crate::count_connection_end(metrics, &served);
        served.map_err(|e| std::io::Error::other(e.to_string()))
    }
}
