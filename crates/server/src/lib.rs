//! The tether proxy server: frontends for clients, a listener for agents, and the routing
//! between them.
//!
//! Layout:
//! - [`frontend`]: gRPC `ProxyService` and HTTP CONNECT, over a Unix socket or mTLS TCP;
//! - `backend`: agent streams (`AgentService.Connect`), their connections, and agent
//!   selection by proxy strategy;
//! - `dial`: one dial from request to established tunnel, with a deadline;
//! - `destinations`: what each frontend client may ask for, checked before an agent is chosen;
//! - `health`: health, readiness and metrics endpoints;
//! - `net`: listeners.
#![forbid(unsafe_code)]

mod audit;
mod backend;
mod bandwidth;
mod byte_rate;
mod control_plane;
mod destinations;
mod dial;
mod error;
pub mod frontend;
mod handshake_failures;
mod health;
mod identity;
mod introspect;
mod limits;
mod metrics;
mod net;
mod request;
pub mod routing;
mod tenant;
mod tenant_config;
mod tenant_frontend;
mod tls_reload;
mod tls_source;
mod unix_socket;
mod warn_limit;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub use backend::binding::{IdentityBinding, NodeAddresses, NodeFuture, NodeLookupError};
pub use backend::selection::Strategy;
pub use backend::token::{
    AgentTokenAuth, AuthFuture, TokenAuthenticator, TokenIdentity, TokenRefusal,
};
pub use control_plane::{ControlPlaneEndpoints, check_host_port};
pub use frontend::Mode;
pub use limits::{DEFAULT_MAX_REVERSE_CONNECTIONS_PER_STREAM, Limits};
pub use routing::RoutingConfig;
use tether_grpc::server::Connection;
use tether_grpc::{H2Settings, Keepalive};
use tether_observe::metrics::Registry;
pub use tether_tunnel::FlowConfig;
pub use tls_reload::TlsReload;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::admission::Admission;
use crate::backend::binding::Binding;
use crate::backend::service::AgentService;
use crate::dial::Hub;
use crate::limits::{ConnectionSlots, Limit, LimitMetrics, SlotAdmission};
use crate::net::Listener;
use crate::tls_source::{TenantTls, TlsSource};

/// Where the frontend listens.
#[derive(Clone, Debug)]
pub enum FrontendListen {
    /// A Unix socket; no TLS. Access is gated by the socket's file mode.
    Unix {
        path: PathBuf,
        delete_existing: bool,
    },
    /// TCP with mutual TLS; the config must require client certificates.
    Tls {
        addr: SocketAddr,
        tls: Arc<rustls::ServerConfig>,
    },
}

/// A validated server configuration.
#[derive(Clone, Debug)]
pub struct Config {
    pub mode: Mode,
    pub frontend: FrontendListen,
    pub agent_addr: SocketAddr,
    pub agent_tls: Arc<rustls::ServerConfig>,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub server_id: String,
    pub server_count: u32,
    pub strategies: Vec<Strategy>,
    /// Topology, affinity and ejection for the strategies (`--routing-config`).
    pub routing: RoutingConfig,
    /// Deadline for an agent to answer a dial.
    pub dial_timeout: Duration,
    /// On shutdown, how long live connections may continue.
    pub graceful_shutdown_timeout: Duration,
    pub flow: FlowConfig,
    /// HTTP/2 PINGs to agents; a silent agent is dropped after `timeout`.
    pub agent_keepalive: Option<Keepalive>,
    pub frontend_keepalive: Option<Keepalive>,
    /// Deadlines and caps on connections, streams and agents.
    pub limits: Limits,
    /// `--agent-identity-binding`: which of an agent's claims (its `host`/`ipv4`/`ipv6`
    /// identifiers, and its ID) its certificate or token must prove.
    pub agent_identity_binding: IdentityBinding,
    /// Reload listener certificates and CAs from their files; `None` keeps the configs above.
    pub tls_reload: Option<TlsReload>,
    /// Authenticate agents by bearer token (upstream's ServiceAccount token authentication).
    pub agent_token_auth: Option<AgentTokenAuth>,
    /// `--audit-log-path`: one JSON line per connection and refused dial; `None` is off.
    pub audit_log: Option<tether_observe::audit::AuditTarget>,
    /// `--control-plane-endpoints`: agents' reverse dials may reach these, nothing else;
    /// `None` (the default) refuses every reverse dial, except for a tenant whose routing
    /// entry names its own `control_plane_endpoints`.
    pub control_plane: Option<ControlPlaneEndpoints>,
    /// `--resume-window`: how long an agent stream whose transport broke keeps its
    /// connections for the agent to resume it (tether agents only); zero turns it off.
    pub resume_window: Duration,
    /// `--dead-agent-timeout`: an agent stream with connections or dials in flight whose
    /// agent sends nothing (not a byte, PINGs answered included) for this long ends with
    /// them at once, resume window or not; `None` never. Needs `agent_keepalive`, whose
    /// PINGs go out every second while a stream is busy.
    pub dead_agent_timeout: Option<Duration>,
}

/// The default `--resume-window` and `--dead-agent-timeout`: a killed agent's connections
/// (its stream breaks at once, then waits the window) and a lost node's (silence: the timeout
/// after its last byte, at most a second before the loss, proven by a read that found
/// nothing) both end within 5 s.
pub const DEFAULT_RESUME_WINDOW: Duration = Duration::from_secs(4);
/// See [`DEFAULT_RESUME_WINDOW`].
pub const DEFAULT_DEAD_AGENT_TIMEOUT: Duration = Duration::from_secs(4);

/// Start-up failures. The io errors are plain fields, not `source()`s, which `{:#}` would
/// print a second time after the message that already holds them.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listening on {what} {addr} ({flags}): {error}")]
    Listen {
        what: &'static str,
        addr: String,
        /// The flags that set the address.
        flags: &'static str,
        error: std::io::Error,
    },
    /// Two of the server's own listeners given one port: said before binding, rather than
    /// as the second one's "address already in use".
    #[error(
        "{second} and {first} are both {port} (on the same or overlapping bind addresses): \
         each listener needs a port of its own"
    )]
    SamePort {
        first: &'static str,
        second: &'static str,
        port: u16,
    },
    /// A tenant's own frontend that cannot be served as configured.
    #[error("--routing-config: {0}")]
    TenantFrontend(String),
    #[error("opening the audit log {path}: {error}")]
    AuditLog { path: String, error: std::io::Error },
}

/// A server whose listeners are bound; [`run`](Self::run) serves them.
#[derive(Debug)]
pub struct Server {
    config: Config,
    frontend: Listener,
    /// Tenants' own frontends, by tenant name.
    tenant_frontends: Vec<(String, Listener)>,
    agent: Listener,
    health: TcpListener,
    admin: TcpListener,
    registry: Registry,
    /// Extra admin routes answered before the built-in ones (profiling).
    admin_routes: Option<tether_observe::http::DeferredHandler>,
    audit: Option<(
        tether_observe::audit::AuditLog,
        tether_observe::audit::AuditWriter,
    )>,
}

impl Server {
    /// Binds every listener, so that errors surface before anything is served and callers
    /// that asked for port 0 can learn the ports.
    pub async fn bind(config: Config, registry: Registry) -> Result<Self, ServerError> {
        distinct_ports(&config)?;
        let listen_err = |what, addr: String, flags| {
            move |error| ServerError::Listen {
                what,
                addr,
                flags,
                error,
            }
        };
        let frontend = match &config.frontend {
            FrontendListen::Unix {
                path,
                delete_existing,
            } => Listener::unix(path, *delete_existing).map_err(listen_err(
                "frontend socket",
                path.display().to_string(),
                "--uds-name",
            ))?,
            FrontendListen::Tls { addr, tls } => {
                let reloading = config.tls_reload.as_ref().and_then(|r| r.frontend.clone());
                Listener::tls(*addr, TlsSource::new(tls.clone(), reloading))
                    .await
                    .map_err(listen_err(
                        "frontend",
                        addr.to_string(),
                        "--server-bind-address, --server-port",
                    ))?
            }
        };
        let tenant_frontends = bind_tenant_frontends(&config).await?;
        let agent_reloading = config.tls_reload.as_ref().map(|r| r.agent.clone());
        let agent_tls = TlsSource::new(config.agent_tls.clone(), agent_reloading);
        let agent = Listener::tls(config.agent_addr, agent_tls)
            .await
            .map_err(listen_err(
                "agent",
                config.agent_addr.to_string(),
                "--agent-bind-address, --agent-port",
            ))?;
        let health = TcpListener::bind(config.health_addr)
            .await
            .map_err(listen_err(
                "health",
                config.health_addr.to_string(),
                "--health-bind-address, --health-port",
            ))?;
        let admin = TcpListener::bind(config.admin_addr)
            .await
            .map_err(listen_err(
                "admin",
                config.admin_addr.to_string(),
                "--admin-bind-address, --admin-port",
            ))?;
        let audit = match &config.audit_log {
            None => None,
            Some(target) => Some(
                tether_observe::audit::AuditLog::open(target, &registry).map_err(|error| {
                    ServerError::AuditLog {
                        path: target.to_string(),
                        error,
                    }
                })?,
            ),
        };
        Ok(Self {
            config,
            frontend,
            tenant_frontends,
            agent,
            health,
            admin,
            registry,
            admin_routes: None,
            audit,
        })
    }

    /// Serves `routes` on the admin port too, asked before the built-in paths (the binary's
    /// `--enable-profiling` adds its pprof paths this way).
    pub fn with_admin_routes(mut self, routes: tether_observe::http::DeferredHandler) -> Self {
        self.admin_routes = Some(routes);
        self
    }

    /// The frontend's address: a socket path or `host:port`.
    pub fn frontend_addr(&self) -> String {
        self.frontend.local_addr()
    }

    pub fn frontend_tcp_addr(&self) -> Option<SocketAddr> {
        self.frontend.tcp_addr()
    }

    /// Each tenant's own frontends: the tenant's name and a socket path or `host:port`.
    pub fn tenant_frontend_addrs(&self) -> Vec<(String, String)> {
        self.tenant_frontends
            .iter()
            .map(|(name, listener)| (name.clone(), listener.local_addr()))
            .collect()
    }

    pub fn agent_addr(&self) -> Option<SocketAddr> {
        self.agent.tcp_addr()
    }

    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health.local_addr().ok()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.local_addr().ok()
    }

    /// Serves until `shutdown` is cancelled, then stops accepting, lets live connections run
    /// for the graceful-shutdown period, and ends whatever remains.
    pub async fn run(self, shutdown: CancellationToken) {
        let Self {
            config,
            frontend,
            tenant_frontends,
            agent,
            health,
            admin,
            registry,
            admin_routes,
            audit,
        } = self;
        let metrics = Arc::new(metrics::ServerMetrics::register(&registry));
        let limit_metrics = LimitMetrics::register(&registry);
        let handshake_failures = Arc::new(handshake_failures::HandshakeFailures::agents(&registry));
        let limits = config.limits.clone();
        // The audit writer outlives every connection (it is stopped last) so that the
        // records of connections cut at shutdown are written too.
        let audit_writer = audit.map(|(log, writer)| {
            let audit = Arc::new(audit::Audit::new(log, config.server_id.clone()));
            (audit, writer.spawn())
        });
        let hub = Arc::new(Hub::new(
            tenant::Tenants::new(
                &config.strategies,
                &config.routing.tenants,
                config.routing.bandwidth,
                config.routing.selection(),
                &registry,
            ),
            destinations::DestinationPolicies::new(
                &config.routing.destinations,
                &registry,
                metrics.clone(),
            ),
            metrics,
            config.routing.ejection,
            Arc::new(backend::selection_metrics::SelectionMetrics::register(
                &registry,
            )),
            audit_writer.as_ref().map(|(audit, _)| audit.clone()),
            config.server_id.clone(),
        ));
        hub.refresh_backend_gauges();
        // Ends every connection at once: after the grace period, or immediately without one.
        let stop = CancellationToken::new();
        let agent_service = Arc::new(AgentService {
            hub: hub.clone(),
            server_id: config.server_id.clone(),
            server_count: config.server_count,
            flow: config.flow,
            dial_timeout: config.dial_timeout,
            next_stream_id: AtomicU64::new(1),
            dead_agent_timeout: config
                .dead_agent_timeout
                .filter(|_| config.agent_keepalive.is_some()),
            admission: Admission::new(limits.max_agents, limit_metrics.clone()),
            binding: Binding::new(
                config.agent_identity_binding,
                config
                    .agent_token_auth
                    .as_ref()
                    .and_then(|auth| auth.nodes.clone()),
                limit_metrics.clone(),
            ),
            limit_metrics: limit_metrics.clone(),
            token_auth: config.agent_token_auth.clone(),
            control_plane: control_plane::ReversePolicy::new(
                config.control_plane.clone(),
                &config.routing.tenants,
                limits.max_reverse_connections_per_stream,
            ),
            resumable: (!config.resume_window.is_zero())
                .then(|| backend::resume::Resumable::new(config.resume_window)),
            streams: TaskTracker::new(),
            stop: stop.clone(),
        });
        let shutting_down = Arc::new(AtomicBool::new(false));
        let frontends = TaskTracker::new();
        let agents = TaskTracker::new();
        let endpoints = TaskTracker::new();

        tracing::info!(
            frontend = %frontend.local_addr(),
            mode = %config.mode,
            agent = %agent.local_addr(),
            health = health.local_addr().ok().map(tracing::field::display),
            admin = admin.local_addr().ok().map(tracing::field::display),
            server.id = %config.server_id,
            "proxy server listening"
        );
        let health_handler = health::health_handler(
            hub.clone(),
            registry.clone(),
            shutting_down.clone(),
            config
                .agent_token_auth
                .as_ref()
                .map(|auth| auth.authenticator.clone()),
        );
        let http_limits = tether_observe::http::HttpLimits {
            max_connections: limits.max_http_connections,
            refused: Some(limit_metrics.counter(Limit::HttpConnections)),
            ..Default::default()
        };
        endpoints.spawn(tether_observe::http::serve(
            health,
            health_handler,
            http_limits.clone(),
            stop.clone().cancelled_owned(),
        ));
        endpoints.spawn(tether_observe::http::serve_with(
            admin,
            health::admin_handler(
                registry.clone(),
                hub.clone(),
                introspect::Membership {
                    server_id: config.server_id.clone(),
                    server_count: config.server_count,
                },
            ),
            admin_routes,
            http_limits,
            stop.clone().cancelled_owned(),
        ));

        if let Some(reload) = config.tls_reload.clone() {
            endpoints.spawn(tls_reload::run(
                reload,
                tls_reload::ReloadMetrics::register(&registry),
                stop.clone(),
            ));
        }

        let partial_messages = {
            let metrics = limit_metrics.clone();
            tether_grpc::PartialMessageBudget::new(limits.agent_partial_message_bytes, move || {
                metrics.hit(Limit::PartialMessages)
            })
        };
        let agent_settings = H2Settings::agent_stream()
            .with_keepalive(config.agent_keepalive)
            .with_idle_timeout(limits.idle_connection_timeout)
            .with_partial_message_budget(Some(partial_messages));
        let frontend_settings = H2Settings::frontend()
            .with_keepalive(config.frontend_keepalive)
            .with_idle_timeout(limits.idle_connection_timeout)
            .with_max_concurrent_streams(limits.max_streams_per_frontend_connection);
        let agent_gate = Gate {
            slots: ConnectionSlots::new(
                limits.max_agent_connections,
                limits.max_agent_connections_per_address,
            ),
            setup_timeout: limits.setup_timeout,
            metrics: limit_metrics.clone(),
            flags: CapFlags::AGENT,
        };
        let frontend_gate = Gate {
            slots: ConnectionSlots::new(
                limits.max_frontend_connections,
                limits.max_frontend_connections_per_address,
            ),
            setup_timeout: limits.setup_timeout,
            metrics: limit_metrics.clone(),
            flags: CapFlags::FRONTEND,
        };
        let agent_loop = accept_loop(
            &agent,
            &agents,
            &shutdown,
            &stop,
            &agent_gate,
            |conn, deadline, admission| {
                let service = agent_service.clone();
                let settings = agent_settings.clone();
                let metrics = limit_metrics.clone();
                let handshake_failures = handshake_failures.clone();
                async move {
                    let peer_label = conn.peer_label();
                    // Boxed: the TLS handshake's state is not held for the stream's life.
                    let (io, peer) = match Box::pin(ready(conn, deadline, &metrics)).await {
                        Ok(ready) => ready,
                        Err(e) => {
                            handshake_failures.record(
                                &handshake_failures::Listener::Agent,
                                &peer_label,
                                &e,
                            );
                            return Ok(());
                        }
                    };
                    let connection = Connection {
                        peer: Arc::new(peer),
                        setup_deadline: Some(deadline),
                    };
                    // Agent streams never end by themselves; `stop` cuts them (see accept_loop).
                    let served = tether_grpc::server::serve_connection(
                        io,
                        &settings,
                        connection,
                        move |call| service.clone().serve(call, admission.clone()),
                        std::future::pending(),
                    )
                    .await;
                    count_connection_end(&metrics, &served);
                    served.map_err(|e| std::io::Error::other(e.to_string()))
                }
            },
        );
        let frontend_service = Arc::new(frontend::connection::FrontendService {
            hub: hub.clone(),
            settings: frontend_settings,
            shutdown: shutdown.clone(),
            mode: config.mode,
            metrics: limit_metrics.clone(),
            first_packet_timeout: limits.first_packet_timeout,
            strangers: warn_limit::WarnLimit::new(Duration::from_secs(1)),
            handshake_failures: handshake_failures::HandshakeFailures::frontends(&registry),
        });
        let frontend_loop = accept_loop(
            &frontend,
            &frontends,
            &shutdown,
            &stop,
            &frontend_gate,
            |conn, deadline, _| frontend_service.clone().serve(conn, deadline, None),
        );
        // Each tenant's own frontend: the same service, with the tenant pinned.
        let mut tenant_loops = tokio::task::JoinSet::new();
        for (name, listener) in tenant_frontends {
            let tenant = hub.tenants.by_name(&name).cloned();
            assert!(
                tenant.is_some(),
                "tenant frontends are bound from the same table"
            );
            tracing::info!(tenant = %name, frontend = %listener.local_addr(), "tenant frontend listening");
            let service = frontend_service.clone();
            let (tasks, shutdown, stop, gate) = (
                frontends.clone(),
                shutdown.clone(),
                stop.clone(),
                frontend_gate.clone(),
            );
            tenant_loops.spawn(async move {
                accept_loop(
                    &listener,
                    &tasks,
                    &shutdown,
                    &stop,
                    &gate,
                    |conn, deadline, _| service.clone().serve(conn, deadline, tenant.clone()),
                )
                .await;
            });
        }
        let tenant_loops = async { while tenant_loops.join_next().await.is_some() {} };

        tokio::join!(agent_loop, frontend_loop, tenant_loops);

        // Shutting down: no new connections are accepted from here on.
        shutting_down.store(true, Ordering::Release);
        drop(frontend);
        frontends.close();
        agents.close();
        agent_service.streams.close();
        let grace = config.graceful_shutdown_timeout;
        if !grace.is_zero() {
            tracing::info!(?grace, "draining live connections");
            let _ = tokio::time::timeout(grace, frontends.wait()).await;
        }
        stop.cancel();
        // Cut connections drop their HTTP/2 state at once, which ends every stream task.
        let _ = tokio::time::timeout(Duration::from_secs(5), async {
            frontends.wait().await;
            agents.wait().await;
            agent_service.streams.wait().await;
        })
        .await;
        endpoints.close();
        endpoints.wait().await;
        if let Some((_, writer)) = audit_writer {
            writer.finish().await;
        }
        tracing::info!("proxy server stopped");
    }
}

/// Refuses two of the server's own TCP listeners on one port (the check tenant frontends
/// get below), naming both flags.
fn distinct_ports(config: &Config) -> Result<(), ServerError> {
    let mut listeners = Vec::with_capacity(4);
    if let FrontendListen::Tls { addr, .. } = &config.frontend {
        listeners.push((*addr, "--server-port"));
    }
    listeners.extend([
        (config.agent_addr, "--agent-port"),
        (config.health_addr, "--health-port"),
        (config.admin_addr, "--admin-port"),
    ]);
    for (i, &(a, first)) in listeners.iter().enumerate() {
        for &(b, second) in &listeners[i + 1..] {
            if tether_observe::http::tcp_overlaps(a, b) {
                return Err(ServerError::SamePort {
                    first,
                    second,
                    port: a.port(),
                });
            }
        }
    }
    Ok(())
}

/// Binds every tenant's own frontend, refusing one that would share an address with the
/// server's other listeners.
async fn bind_tenant_frontends(config: &Config) -> Result<Vec<(String, Listener)>, ServerError> {
    let mut bound = Vec::new();
    for tenant in &config.routing.tenants {
        let Some(frontend) = &tenant.frontend else {
            continue;
        };
        let refuse = |what: String| {
            ServerError::TenantFrontend(format!("tenant {:?}'s {what}", tenant.name))
        };
        if let Some(path) = &frontend.unix {
            let delete_existing = match &config.frontend {
                FrontendListen::Unix { path: main, .. }
                    if tenant_frontend::unix_overlaps(path, main) =>
                {
                    return Err(refuse(format!(
                        "frontend.unix {} is the main frontend's socket (--uds-name)",
                        path.display()
                    )));
                }
                FrontendListen::Unix {
                    delete_existing, ..
                } => *delete_existing,
                FrontendListen::Tls { .. } => false,
            };
            let listener =
                Listener::unix(path, delete_existing).map_err(|error| ServerError::Listen {
                    what: "tenant frontend socket",
                    addr: path.display().to_string(),
                    flags: "--routing-config",
                    error,
                })?;
            bound.push((tenant.name.clone(), listener));
        }
        if let Some(addr) = frontend.tcp {
            let FrontendListen::Tls { addr: main, tls } = &config.frontend else {
                return Err(refuse(format!(
                    "frontend.tcp {addr} needs the mTLS frontend's certificates, and the main \
                     frontend is a Unix socket (--uds-name)"
                )));
            };
            for (other, flag) in [
                (*main, "--server-port"),
                (config.agent_addr, "--agent-port"),
                (config.health_addr, "--health-port"),
                (config.admin_addr, "--admin-port"),
            ] {
                if tether_observe::http::tcp_overlaps(addr, other) {
                    return Err(refuse(format!(
                        "frontend.tcp {addr} overlaps {other} ({flag})"
                    )));
                }
            }
            let reloading = config.tls_reload.as_ref().and_then(|r| r.frontend.clone());
            let main_tls = TlsSource::new(tls.clone(), reloading);
            let tls = match &frontend.client_ca {
                None => main_tls,
                Some(ca) => TlsSource::TenantCa(Arc::new(
                    TenantTls::new(main_tls, ca)
                        .map_err(|e| refuse(format!("frontend.client_ca: {e}")))?,
                )),
            };
            let listener = Listener::tls(addr, tls)
                .await
                .map_err(|error| ServerError::Listen {
                    what: "tenant frontend",
                    addr: addr.to_string(),
                    flags: "--routing-config",
                    error,
                })?;
            bound.push((tenant.name.clone(), listener));
        }
    }
    Ok(bound)
}

/// What a listener checks at accept: its connection slots and the setup deadline.
#[derive(Clone)]
struct Gate {
    slots: Arc<ConnectionSlots>,
    setup_timeout: Duration,
    metrics: LimitMetrics,
    /// The flags of the listener's caps, named when they refuse a connection.
    flags: CapFlags,
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
async fn ready(
    conn: net::Accepted,
    deadline: tokio::time::Instant,
    metrics: &LimitMetrics,
) -> std::io::Result<(Box<dyn net::Io>, tether_grpc::PeerIdentity)> {
    let ready = conn.ready(deadline).await;
    if let Err(e) = &ready
        && e.kind() == std::io::ErrorKind::TimedOut
    {
        metrics.hit(Limit::SetupTimeout);
    }
    ready
}

/// Counts connections that ended because setup missed its deadline.
fn count_connection_end(metrics: &LimitMetrics, served: &Result<(), tether_grpc::GrpcError>) {
    if let Err(tether_grpc::GrpcError::HandshakeTimeout) = served {
        metrics.hit(Limit::SetupTimeout);
    }
}

/// Accepts until `shutdown`, running each connection as a tracked task that ends when it
/// finishes or when `stop` cuts it. A connection over a listener's caps is closed at once;
/// every other one gets a setup deadline counted from its accept.
async fn accept_loop<F, Fut>(
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
    let refusals = warn_limit::WarnLimit::new(Duration::from_secs(1));
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
