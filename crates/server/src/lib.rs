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
//! - `net`: listeners; `serve` accepts on them, `shutdown` ends a run (grace, then stop);
//! - `endpoints`: the health and admin ports, and the TLS and routing files' watchers.
#![forbid(unsafe_code)]

mod audit;
mod backend;
mod bandwidth;
mod byte_rate;
mod control_plane;
mod destinations;
mod dial;
mod endpoints;
mod error;
pub mod frontend;
mod handshake_failures;
mod health;
mod identity;
mod introspect;
mod limits;
mod metrics;
mod net;
mod peer;
mod peer_links;
mod reload;
mod request;
pub mod routing;
mod running;
mod serve;
mod shutdown;
mod sniff;
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
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Duration;

pub use backend::binding::{IdentityBinding, NodeAddresses, NodeFuture, NodeLookupError};
pub use backend::selection::Strategy;
pub use backend::token::{
    AgentTokenAuth, AuthFuture, TokenAuthenticator, TokenIdentity, TokenRefusal,
};
pub use control_plane::{ControlPlaneEndpoints, check_host_port};
pub use frontend::Mode;
pub use limits::{DEFAULT_MAX_REVERSE_CONNECTIONS_PER_STREAM, Limits};
pub use peer::{PEER_ALPN, PeerConfig};
pub use routing::RoutingConfig;
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
use crate::limits::{Limit, LimitMetrics};
use crate::net::Listener;
use crate::serve::Gate;
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
    /// The watched routing file: when set, its generation in force replaces `routing` at
    /// bind, and each later generation is applied while the server runs (see `reload`).
    pub routing_reload: Option<Arc<tether_reload::Reloader<RoutingConfig>>>,
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
    /// `--audit-log-path`: JSON lines, two per connection (opened, ended) and one per refused
    /// or failed dial; `None` is off.
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
    /// `--peer-port`: server peering, off by default (no port opens without it).
    pub peering: Option<PeerConfig>,
}

/// The ALPN protocols the agent listener offers, in its order of preference: tether's
/// native link for tether agents that offer it, gRPC over HTTP/2 for every other agent, and
/// HTTP/1.1 for the native link in WebSocket messages (tether agents that ask for it, through
/// proxies that pass only HTTP/1.1).
pub const AGENT_ALPN: [&[u8]; 3] = [tether_proto::link::ALPN, b"h2", b"http/1.1"];

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

/// A server whose listeners are bound and whose shared state is built; [`run`](Self::run)
/// serves them.
#[derive(Debug)]
pub struct Server {
    config: Config,
    frontend: Listener,
    /// Tenants' own frontends, by tenant name.
    tenant_frontends: Vec<(String, Listener)>,
    agent: Listener,
    /// The peer port, with server peering.
    peer: Option<Listener>,
    health: TcpListener,
    admin: TcpListener,
    registry: Registry,
    /// Extra admin routes answered before the built-in ones (profiling).
    admin_routes: Option<tether_observe::http::DeferredHandler>,
    hub: Arc<Hub>,
    agent_service: Arc<AgentService>,
    limit_metrics: LimitMetrics,
    /// Ends every connection at once: after the grace period, or immediately without one.
    stop: CancellationToken,
    /// Spawned when the server runs; it outlives every connection (it is stopped last) so
    /// that the records of connections cut at shutdown are written too.
    audit_writer: Option<tether_observe::audit::AuditWriter>,
}

impl Server {
    /// Binds every listener, so that errors surface before anything is served and callers
    /// that asked for port 0 can learn the ports.
    pub async fn bind(mut config: Config, registry: Registry) -> Result<Self, ServerError> {
        distinct_ports(&config)?;
        let generation = match &config.routing_reload {
            Some(reloader) => {
                let loaded = reloader.current();
                config.routing = (*loaded.config).clone();
                loaded.generation
            }
            None => 1,
        };
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
        let peer = match &config.peering {
            Some(peering) => Some(
                Listener::tls(
                    peering.listen,
                    TlsSource::new(peering.server_tls.clone(), None),
                )
                .await
                .map_err(listen_err(
                    "peer",
                    peering.listen.to_string(),
                    "--peer-bind-address, --peer-port",
                ))?,
            ),
            None => None,
        };
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
        let (audit, audit_writer) = match audit {
            Some((log, writer)) => (
                Some(Arc::new(audit::Audit::new(log, config.server_id.clone()))),
                Some(writer),
            ),
            None => (None, None),
        };
        let hub = Arc::new(build_hub(&config, &registry, audit, generation));
        hub.refresh_backend_gauges();
        let limit_metrics = LimitMetrics::register(&registry);
        let stop = CancellationToken::new();
        let agent_service = Arc::new(build_agent_service(
            &config,
            hub.clone(),
            limit_metrics.clone(),
            stop.clone(),
        ));
        Ok(Self {
            config,
            frontend,
            tenant_frontends,
            agent,
            peer,
            health,
            admin,
            registry,
            admin_routes: None,
            hub,
            agent_service,
            limit_metrics,
            stop,
            audit_writer,
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

    /// The peer port's address, with server peering.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer.as_ref().and_then(Listener::tcp_addr)
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
            peer,
            health,
            admin,
            registry,
            admin_routes,
            hub,
            agent_service,
            limit_metrics,
            stop,
            audit_writer,
        } = self;
        let audit_writer = audit_writer.map(tether_observe::audit::AuditWriter::spawn);
        let limits = &config.limits;
        let shutting_down = Arc::new(AtomicBool::new(false));
        let frontends = TaskTracker::new();
        let agents = TaskTracker::new();

        tracing::info!(
            frontend = %frontend.local_addr(),
            mode = %config.mode,
            agent = %agent.local_addr(),
            health = health.local_addr().ok().map(tracing::field::display),
            admin = admin.local_addr().ok().map(tracing::field::display),
            server.id = %config.server_id,
            "proxy server listening"
        );
        let (endpoints, updates) = endpoints::Endpoints {
            health,
            admin,
            admin_routes,
            registry: &registry,
            hub: &hub,
            limit_metrics: &limit_metrics,
            shutting_down: &shutting_down,
            membership: introspect::Membership {
                server_id: config.server_id.clone(),
                server_count: config.server_count,
                routing: config.routing_reload.clone(),
            },
            tokens: config
                .agent_token_auth
                .as_ref()
                .map(|auth| auth.authenticator.clone()),
            max_http_connections: limits.max_http_connections,
            tls_reload: config.tls_reload.clone(),
        }
        .spawn(&stop);

        let agent_settings = agent_settings(&config, &limit_metrics);
        let handshake_failures = Arc::new(handshake_failures::HandshakeFailures::agents(&registry));
        let agent_gate = Gate::agents(limits, limit_metrics.clone());
        let agent_loop = serve::accept_loop(
            &agent,
            &agents,
            &shutdown,
            &stop,
            &agent_gate,
            |conn, deadline, admission| {
                serve::agent_connection(
                    agent_service.clone(),
                    agent_settings.clone(),
                    limit_metrics.clone(),
                    handshake_failures.clone(),
                    (conn, deadline, admission),
                )
            },
        );
        let frontend_service =
            build_frontend_service(&config, &hub, &shutdown, &limit_metrics, &registry);
        let frontend_gate = Gate::frontends(limits, limit_metrics.clone());
        let frontend_loop = serve::accept_loop(
            &frontend,
            &frontends,
            &shutdown,
            &stop,
            &frontend_gate,
            |conn, deadline, _| frontend_service.clone().serve(conn, deadline, None),
        );
        // The routing file's owner: serves each tenant's own frontend (the same service,
        // with the tenant pinned) and applies each new generation of a watched file.
        let owner = reload::RoutingOwner::new(
            hub.clone(),
            config.graceful_shutdown_timeout,
            tenant_binder(&config),
            reload::Serving {
                service: frontend_service.clone(),
                connections: frontends.clone(),
                shutdown: shutdown.clone(),
                stop: stop.clone(),
                gate: frontend_gate.clone(),
            },
        );
        let owner = owner.run(tenant_frontends, &config.routing, updates);
        let peer_loop = async {
            let (Some(listener), Some(peering)) = (&peer, &config.peering) else {
                return;
            };
            let settings = peer::LinkSettings {
                flow: config.flow,
                keepalive: config.agent_keepalive,
                dial_timeout: config.dial_timeout,
            };
            peer::outbound::start(peering, settings, &hub, &agents, &stop);
            let inbound = Arc::new(peer::inbound::Inbound::new(
                hub.clone(),
                peering.name.clone(),
                settings,
                limit_metrics.clone(),
                limits.max_agents,
                stop.clone(),
            ));
            let gate = Gate::peers(limits, limit_metrics.clone());
            serve::accept_loop(
                listener,
                &agents,
                &shutdown,
                &stop,
                &gate,
                |conn, deadline, admission| inbound.clone().serve(conn, deadline, admission),
            )
            .await;
        };

        tokio::join!(agent_loop, frontend_loop, owner, peer_loop);

        shutdown::Draining {
            shutting_down,
            frontend,
            frontends,
            agents,
            streams: agent_service.streams.clone(),
            endpoints,
            stop,
            audit_writer,
        }
        .drain(config.graceful_shutdown_timeout)
        .await;
    }
}

/// The frontends' service: the main frontend's and every tenant's own share it.
fn build_frontend_service(
    config: &Config,
    hub: &Arc<Hub>,
    shutdown: &CancellationToken,
    limit_metrics: &LimitMetrics,
    registry: &Registry,
) -> Arc<frontend::connection::FrontendService> {
    let limits = &config.limits;
    Arc::new(frontend::connection::FrontendService {
        hub: hub.clone(),
        settings: H2Settings::frontend()
            .with_keepalive(config.frontend_keepalive)
            .with_idle_timeout(limits.idle_connection_timeout)
            .with_max_concurrent_streams(limits.max_streams_per_frontend_connection),
        shutdown: shutdown.clone(),
        mode: config.mode,
        metrics: limit_metrics.clone(),
        first_packet_timeout: limits.first_packet_timeout,
        strangers: warn_limit::WarnLimit::new(Duration::from_secs(1)),
        handshake_failures: handshake_failures::HandshakeFailures::frontends(registry),
    })
}

/// Binds a tenant's own frontend listeners with the server's settings, for the routing
/// file's owner (a reload that adds or changes one).
fn tenant_binder(config: &Config) -> reload::BindTenant {
    let config = Arc::new(config.clone());
    Box::new(move |tenant| {
        let config = config.clone();
        Box::pin(async move {
            bind_tenant_frontend(&config, &tenant)
                .await
                .map_err(|e| e.to_string())
        })
    })
}

/// The state every dial and agent stream shares: the routing file's `generation` (the tenant
/// table, destination policies, reverse-dial allowlists), metrics and the audit log.
fn build_hub(
    config: &Config,
    registry: &Registry,
    audit: Option<Arc<audit::Audit>>,
    generation: u64,
) -> Hub {
    let metrics = Arc::new(metrics::ServerMetrics::register(registry));
    let mut tenants = tenant::Tenants::new(
        &config.strategies,
        &config.routing.tenants,
        config.routing.bandwidth,
        config.routing.selection(),
        registry,
    );
    tenants.generation = generation;
    let running = running::Running {
        generation,
        tenants,
        destinations: destinations::DestinationPolicies::new(
            &config.routing.destinations,
            registry,
            metrics.clone(),
        ),
        control_plane: control_plane::ReversePolicy::new(
            config.control_plane.clone(),
            &config.routing.tenants,
            config.limits.max_reverse_connections_per_stream,
        ),
        ejection: config.routing.ejection,
        leaving: Vec::new(),
    };
    Hub::new(
        running,
        metrics,
        Arc::new(backend::selection_metrics::SelectionMetrics::register(
            registry,
        )),
        audit,
        config.server_id.clone(),
        Arc::new(peer_links::PeerLinks::register(registry)),
    )
}

/// What every agent stream shares: admission, identity binding, reverse-dial policy and
/// resumption; `stop` cuts the streams.
fn build_agent_service(
    config: &Config,
    hub: Arc<Hub>,
    limit_metrics: LimitMetrics,
    stop: CancellationToken,
) -> AgentService {
    let limits = &config.limits;
    AgentService {
        hub,
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
        limit_metrics,
        token_auth: config.agent_token_auth.clone(),
        resumable: (!config.resume_window.is_zero())
            .then(|| backend::resume::Resumable::new(config.resume_window)),
        streams: TaskTracker::new(),
        stop,
    }
}

/// The agent listener's HTTP/2 settings: keepalive, idle timeout and the shared budget of
/// large incomplete messages.
fn agent_settings(config: &Config, limit_metrics: &LimitMetrics) -> H2Settings {
    let partial_messages = {
        let metrics = limit_metrics.clone();
        tether_grpc::PartialMessageBudget::new(
            config.limits.agent_partial_message_bytes,
            move || metrics.hit(Limit::PartialMessages),
        )
    };
    H2Settings::agent_stream()
        .with_keepalive(config.agent_keepalive)
        .with_idle_timeout(config.limits.idle_connection_timeout)
        .with_partial_message_budget(Some(partial_messages))
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
    if let Some(peering) = &config.peering {
        listeners.push((peering.listen, "--peer-port"));
    }
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
        for listener in bind_tenant_frontend(config, tenant).await? {
            bound.push((tenant.name.clone(), listener));
        }
    }
    Ok(bound)
}

impl Config {
    /// Checks `routing` against the server's own listeners as binding it would, without
    /// binding: a tenant's own frontend on the main frontend's socket, a TCP one with a Unix
    /// main frontend or on another listener's port, a `client_ca` that does not load. A
    /// reloaded routing file is refused on these, as at start-up.
    pub fn check_routing(&self, routing: &RoutingConfig) -> Result<(), String> {
        for tenant in &routing.tenants {
            tenant_frontend_plan(self, tenant).map_err(|e| match e {
                ServerError::TenantFrontend(why) => why,
                other => other.to_string(),
            })?;
        }
        Ok(())
    }
}

/// How one tenant's own frontend is bound: its Unix socket (and whether to replace a file
/// there) and its TCP address with its TLS; `Err` when it conflicts with the server's
/// listeners.
#[allow(clippy::type_complexity)]
fn tenant_frontend_plan(
    config: &Config,
    tenant: &tenant_config::TenantConfig,
) -> Result<(Option<(PathBuf, bool)>, Option<(SocketAddr, TlsSource)>), ServerError> {
    let Some(frontend) = &tenant.frontend else {
        return Ok((None, None));
    };
    let refuse =
        |what: String| ServerError::TenantFrontend(format!("tenant {:?}'s {what}", tenant.name));
    let unix = match &frontend.unix {
        None => None,
        Some(path) => {
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
            Some((path.clone(), delete_existing))
        }
    };
    let tcp = match frontend.tcp {
        None => None,
        Some(addr) => {
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
            Some((addr, tls))
        }
    };
    Ok((unix, tcp))
}

/// Binds one tenant's own frontend listeners, refusing one that would share an address with
/// the server's other listeners.
async fn bind_tenant_frontend(
    config: &Config,
    tenant: &tenant_config::TenantConfig,
) -> Result<Vec<Listener>, ServerError> {
    let (unix, tcp) = tenant_frontend_plan(config, tenant)?;
    let mut bound = Vec::new();
    if let Some((path, delete_existing)) = unix {
        bound.push(Listener::unix(&path, delete_existing).map_err(|error| {
            ServerError::Listen {
                what: "tenant frontend socket",
                addr: path.display().to_string(),
                flags: "--routing-config",
                error,
            }
        })?);
    }
    if let Some((addr, tls)) = tcp {
        bound.push(
            Listener::tls(addr, tls)
                .await
                .map_err(|error| ServerError::Listen {
                    what: "tenant frontend",
                    addr: addr.to_string(),
                    flags: "--routing-config",
                    error,
                })?,
        );
    }
    Ok(bound)
}
