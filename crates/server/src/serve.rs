//! Serving a listener: the accept loop with its gate (connection caps and the setup
//! deadline), and the setup-deadline accounting every connection's serving shares.

use std::sync::Arc;
use std::time::Duration;

use tether_grpc::H2Settings;
use tether_grpc::server::Connection;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::call::AgentCall;
use crate::backend::native::{self, NativeSettings};
use crate::backend::service::AgentService;
use crate::handshake_failures::{self, HandshakeFailures};
use crate::limits::{ConnectionSlots, Limit, LimitMetrics, Limits, SlotAdmission};
use crate::net::{self, Listener};
use crate::warn_limit::WarnLimit;

/// Links the peer port takes at once, and from one address: far above what a fleet of
/// servers opens, far below what would let a stranger exhaust the server.
const MAX_PEER_LINKS: usize = 256;
const MAX_PEER_LINKS_PER_ADDRESS: usize = 8;

/// What a listener checks at accept: its connection slots and the setup deadline.
#[derive(Clone)]
pub(crate) struct Gate {
    slots: Arc<ConnectionSlots>,
    setup_timeout: Duration,
    metrics: LimitMetrics,
    /// The flags of the listener's caps, named when they refuse a connection.
    flags: CapFlags,
}

impl Gate {
    /// The agent listener's: `--max-agent-connections` and its per-address cap.
    pub(crate) fn agents(limits: &Limits, metrics: LimitMetrics) -> Self {
        Self {
            slots: ConnectionSlots::new(
                limits.max_agent_connections,
                limits.max_agent_connections_per_address,
            ),
            setup_timeout: limits.setup_timeout,
            metrics,
            flags: CapFlags::AGENT,
        }
    }

    /// The peer port's: a fleet has a few servers, each with two links to every other.
    pub(crate) fn peers(limits: &Limits, metrics: LimitMetrics) -> Self {
        Self {
            slots: ConnectionSlots::new(MAX_PEER_LINKS, MAX_PEER_LINKS_PER_ADDRESS),
            setup_timeout: limits.setup_timeout,
            metrics,
            flags: CapFlags::PEER,
        }
    }

    /// Every frontend listener's, the tenants' own included: they share the caps.
    pub(crate) fn frontends(limits: &Limits, metrics: LimitMetrics) -> Self {
        Self {
            slots: ConnectionSlots::new(
                limits.max_frontend_connections,
                limits.max_frontend_connections_per_address,
            ),
            setup_timeout: limits.setup_timeout,
            metrics,
            flags: CapFlags::FRONTEND,
        }
    }
}

/// The flags that set one listener's total and per-address connection caps.
#[derive(Clone, Copy, Debug)]
struct CapFlags {
    total: &'static str,
    per_address: &'static str,
    /// What the per-address cap counts.
    per_address_counts: &'static str,
}

impl CapFlags {
    const AGENT: Self = Self {
        total: "--max-agent-connections",
        per_address: "--max-agent-connections-per-address",
        per_address_counts: "connections from one address with no agent stream admitted yet; \
            admitted agents do not count, however many share the address",
    };
    const PEER: Self = Self {
        total: "the peer port's fixed cap (256 links)",
        per_address: "the peer port's fixed cap per address (8 links)",
        per_address_counts: "open links from one address",
    };
    const FRONTEND: Self = Self {
        total: "--max-frontend-connections",
        per_address: "--max-frontend-connections-per-address",
        per_address_counts: "open connections from one address",
    };

    /// The flag that sets `limit`, and what it counts.
    fn of(self, limit: Limit) -> String {
        match limit {
            Limit::AddressConnections => {
                format!("{} ({})", self.per_address, self.per_address_counts)
            }
            _ => format!("{} (open connections on this listener)", self.total),
        }
    }
}

/// Completes TLS by the setup deadline, counting a connection that missed it.
pub(crate) async fn ready(
    conn: net::Accepted,
    deadline: tokio::time::Instant,
    metrics: &LimitMetrics,
) -> std::io::Result<net::Ready> {
    let ready = conn.ready(deadline).await;
    if let Err(e) = &ready
        && e.kind() == std::io::ErrorKind::TimedOut
    {
        metrics.hit(Limit::SetupTimeout);
    }
    ready
}

/// Serves one agent connection: TLS by the setup deadline, then its agent streams, which
/// never end by themselves: `stop` cuts them (see [`accept_loop`]).
///
/// Not an `async fn`: the setup (TLS, the link's opening, admission's state) is boxed and
/// freed once done, and for the rest of its life the connection's task holds only what
/// serves it. An async fn would keep its arguments and the setup's locals beside that for
/// as long as the agent stays connected (1.7 KB per native link).
pub(crate) fn agent_connection(
    service: Arc<AgentService>,
    settings: H2Settings,
    metrics: LimitMetrics,
    handshake_failures: Arc<HandshakeFailures>,
    (conn, deadline, admission): (net::Accepted, tokio::time::Instant, SlotAdmission),
) -> impl Future<Output = std::io::Result<()>> + Send + 'static {
    let setup = Box::pin(open_agent_connection(
        service,
        settings,
        metrics,
        handshake_failures,
        (conn, deadline, admission),
    ));
    async move {
        // The setup's box is dropped as soon as it is done.
        let serving = { setup }.await?;
        match serving {
            Some(serving) => serving.await,
            None => Ok(()),
        }
    }
}

/// What an agent connection runs once set up, until it ends.
type Serving = std::pin::Pin<Box<dyn Future<Output = std::io::Result<()>> + Send>>;

/// An agent connection's setup: `None` when it ended there (a failed handshake is counted
/// and logged, not an error of the listener).
async fn open_agent_connection(
    service: Arc<AgentService>,
    settings: H2Settings,
    metrics: LimitMetrics,
    handshake_failures: Arc<HandshakeFailures>,
    (conn, deadline, admission): (net::Accepted, tokio::time::Instant, SlotAdmission),
) -> std::io::Result<Option<Serving>> {
    let peer_label = conn.peer_label();
    // Boxed: the TLS handshake's state is freed before the link's opening is read.
    let net::Ready { io, peer, alpn } = match Box::pin(ready(conn, deadline, &metrics)).await {
        Ok(ready) => ready,
        Err(e) => {
            handshake_failures.record(&handshake_failures::Listener::Agent, &peer_label, &e);
            return Ok(None);
        }
    };
    let (opening, io) = match alpn.as_deref() {
        Some(tether_proto::link::ALPN) => (Some(native::Opening::Hello), io),
        Some(b"http/1.1") => (Some(native::Opening::WebSocket), io),
        Some(_) => (None, io),
        // No ALPN: a proxy in front of WebSocket agents may not offer any.
        None => match crate::sniff::sniff(io, deadline).await {
            Ok((true, io)) => (Some(native::Opening::WebSocket), io),
            Ok((false, io)) => (None, io),
            Err(e) => {
                if e.kind() == std::io::ErrorKind::TimedOut {
                    metrics.hit(Limit::SetupTimeout);
                }
                return Err(e);
            }
        },
    };
    if let Some(opening) = opening {
        let native = NativeSettings {
            keepalive: settings.keepalive,
            budget: settings.partial_message_budget.clone(),
            opening,
        };
        return match native::open(service, io, peer, deadline, admission, native).await {
            Ok(link) => Ok(Some(Box::pin(link))),
            Err(e) => {
                if let tether_link::LinkError::HandshakeTimeout = &e {
                    metrics.hit(Limit::SetupTimeout);
                }
                Err(std::io::Error::other(e.to_string()))
            }
        };
    }
    let connection = Connection {
        peer: Arc::new(peer),
        setup_deadline: Some(deadline),
    };
    Ok(Some(Box::pin(async move {
        let served = tether_grpc::server::serve_connection(
            io,
            &settings,
            connection,
            move |call| {
                service
                    .clone()
                    .serve(AgentCall::grpc(call), admission.clone())
            },
            std::future::pending(),
        )
        .await;
        count_connection_end(&metrics, &served);
        served.map_err(|e| std::io::Error::other(e.to_string()))
    })))
}

/// Counts connections that ended because setup missed its deadline.
pub(crate) fn count_connection_end(
    metrics: &LimitMetrics,
    served: &Result<(), tether_grpc::GrpcError>,
) {
    if let Err(tether_grpc::GrpcError::HandshakeTimeout) = served {
        metrics.hit(Limit::SetupTimeout);
    }
}

/// Accepts until `shutdown`, running each connection as a tracked task that ends when it
/// finishes or when `stop` cuts it. A connection over a listener's caps is closed at once;
/// every other one gets a setup deadline counted from its accept.
pub(crate) async fn accept_loop<F, Fut>(
    listener: &Listener,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
    stop: &CancellationToken,
    gate: &Gate,
    mut serve: F,
) where
    F: FnMut(net::Accepted, tokio::time::Instant, SlotAdmission) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    let refusals = WarnLimit::new(Duration::from_secs(1));
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(conn) => {
                let peer = conn.peer_label();
                let slot = match gate.slots.take(conn.peer.addr.map(|a| a.ip())) {
                    Ok(slot) => slot,
                    Err(limit) => {
                        gate.metrics.hit(limit);
                        if let Some(suppressed) = refusals.allow() {
                            let flag = gate.flags.of(limit);
                            tracing::warn!(%peer, suppressed, "connection limit reached: closing the new connection before TLS; raise {flag}");
                        }
                        continue;
                    }
                };
                let deadline = tokio::time::Instant::now() + gate.setup_timeout;
                // Boxed: an async block that captures a future and awaits it keeps two
                // copies of it for the task's life (the capture and the awaited local), and
                // a connection's future is 3.6–4 KiB.
                let fut = Box::pin(serve(conn, deadline, slot.admission()));
                let stop = stop.clone();
                tasks.spawn(async move {
                    let _slot = slot;
                    tokio::select! {
                        result = fut => if let Err(e) = result {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        },
                        () = stop.cancelled() => {}
                    }
                });
            }
            Err(e) => {
                // Out of descriptors or similar: back off rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
