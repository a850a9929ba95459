//! The tether proxy agent.
//!
//! It keeps reverse tunnels (`AgentService.Connect` streams) to as many distinct proxy
//! servers as they announce, and on their request dials destinations in the cluster network
//! and relays bytes.
//!
//! Layout:
//! - `clientset`: connecting to servers until the server count is reached;
//! - `drain`: what a draining agent says it waits for, and stopping it once drained;
//! - `egress_proxy`: the TCP connection to a server, directly or through an HTTP(S) proxy;
//! - `server_count`: the count, announced by servers or counted from their Leases;
//! - `session`: one server stream and the connections multiplexed on it;
//! - `destination`: resolving, checking against the destination policy, and dialing;
//! - `control_plane`: the node-side listener whose connections go to the control plane
//!   through the tunnel (reverse dials, a tether extension);
//! - `health`: health, readiness and metrics endpoints;
//! - `metrics`: upstream's agent metrics.
#![forbid(unsafe_code)]

mod clientset;
mod config;
mod connect;
mod control_plane;
mod control_plane_config;
mod destination;
mod discovery;
mod drain;
pub mod egress_proxy;
mod health;
mod introspect;
mod metrics;
mod rendezvous;
mod server_count;
mod session;
mod tls_failure;
mod tls_reload;

use std::net::SocketAddr;
use std::sync::Arc;

pub use config::Config;
pub use control_plane_config::{ControlPlaneConfig, ControlPlaneProtocol, ListenAddr};
pub use destination::{DestinationConfig, PolicyFileError};
pub use discovery::Discovery;
pub use health::Readiness;
pub use server_count::{CountSource, LeaseCounting, ServerLeases};
use tether_observe::metrics::Registry;
pub use tether_proto::Labels;
pub use tether_tunnel::FlowConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Start-up failures. The io errors are plain fields, not `source()`s, which `{:#}` would
/// print a second time after the message that already holds them.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("listening on {what} {addr} ({flags}): {error}")]
    Listen {
        what: &'static str,
        addr: SocketAddr,
        /// The flags that set the address.
        flags: &'static str,
        error: std::io::Error,
    },
    /// Two of the agent's own listeners given one port: said before binding, rather than as
    /// the second one's "address already in use".
    #[error(
        "{second} and {first} are both {port} (on the same or overlapping bind addresses): \
         each listener needs a port of its own"
    )]
    SamePort {
        first: &'static str,
        second: &'static str,
        port: u16,
    },
    #[error("listening on --control-plane-listen={addr}: {error}")]
    ControlPlaneListen {
        addr: ListenAddr,
        error: std::io::Error,
    },
    #[error(transparent)]
    Policy(#[from] PolicyFileError),
    #[error("opening the audit log {path}: {error}")]
    AuditLog { path: String, error: std::io::Error },
}

/// An agent whose health and admin listeners are bound.
#[derive(Debug)]
pub struct Agent {
    config: Config,
    health: TcpListener,
    admin: TcpListener,
    control_plane: Option<control_plane::Listener>,
    registry: Registry,
    metrics: Arc<metrics::AgentMetrics>,
    destinations: Arc<destination::Destinations>,
    /// Extra admin routes answered before the built-in ones (profiling).
    admin_routes: Option<tether_observe::http::DeferredHandler>,
    readiness: Readiness,
    audit: Option<(
        tether_observe::audit::AuditLog,
        tether_observe::audit::AuditWriter,
    )>,
}

/// Refuses two of the agent's own TCP listeners on one port, naming both flags.
fn distinct_ports(config: &Config) -> Result<(), AgentError> {
    let mut listeners = vec![
        (config.health_addr, "--health-server-port"),
        (config.admin_addr, "--admin-server-port"),
    ];
    if let Some(ListenAddr::Tcp(addr)) = config.control_plane.as_ref().map(|c| &c.listen) {
        listeners.push((*addr, "--control-plane-listen"));
    }
    for (i, &(a, first)) in listeners.iter().enumerate() {
        for &(b, second) in &listeners[i + 1..] {
            if tether_observe::http::tcp_overlaps(a, b) {
                return Err(AgentError::SamePort {
                    first,
                    second,
                    port: a.port(),
                });
            }
        }
    }
    Ok(())
}

impl Agent {
    pub async fn bind(config: Config, registry: Registry) -> Result<Self, AgentError> {
        distinct_ports(&config)?;
        let bind = |what, addr, flags| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|error| AgentError::Listen {
                    what,
                    addr,
                    flags,
                    error,
                })
        };
        let health = bind(
            "health",
            config.health_addr,
            "--health-server-host, --health-server-port",
        )
        .await?;
        let admin = bind(
            "admin",
            config.admin_addr,
            "--admin-bind-address, --admin-server-port",
        )
        .await?;
        let control_plane =
            match &config.control_plane {
                Some(cp) => Some(control_plane::Listener::bind(&cp.listen).await.map_err(
                    |error| AgentError::ControlPlaneListen {
                        addr: cp.listen.clone(),
                        error,
                    },
                )?),
                None => None,
            };
        let metrics = Arc::new(metrics::AgentMetrics::register(&registry));
        let own_listeners = [&health, &admin]
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let destinations = Arc::new(destination::Destinations::new(
            config.destinations.clone(),
            own_listeners,
            &registry,
        )?);
        // SIGHUP asks for the policy file to be read at once, and is only logged without one.
        // Its default action ends the process: registering here replaces it from now on
        // (tokio never unregisters a handler), before the watcher listens in `run`.
        if let Err(e) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            tracing::warn!(error = %e, "cannot handle SIGHUP");
        }
        let audit = match &config.audit_log {
            None => None,
            Some(target) => Some(
                tether_observe::audit::AuditLog::open(target, &registry).map_err(|error| {
                    AgentError::AuditLog {
                        path: target.to_string(),
                        error,
                    }
                })?,
            ),
        };
        Ok(Self {
            config,
            health,
            admin,
            control_plane,
            registry,
            metrics,
            destinations,
            admin_routes: None,
            readiness: Readiness::default(),
            audit,
        })
    }

    /// Serves `routes` on the admin port too, asked before the built-in paths (the binary's
    /// `--enable-profiling` adds its pprof paths this way).
    pub fn with_admin_routes(mut self, routes: tether_observe::http::DeferredHandler) -> Self {
        self.admin_routes = Some(routes);
        self
    }

    /// When `/readyz` answers 200 (default: connected to at least one server, as upstream).
    pub fn with_readiness(mut self, readiness: Readiness) -> Self {
        self.readiness = readiness;
        self
    }

    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health.local_addr().ok()
    }

    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.local_addr().ok()
    }

    /// The control-plane listener's address (`IP:PORT` or `unix:PATH`), when configured.
    pub fn control_plane_addr(&self) -> Option<String> {
        self.control_plane.as_ref().map(|l| l.local_addr())
    }

    /// Runs until `stop`. `drain` (the first SIGTERM) tells every server this agent is going
    /// away and stops opening server connections; live connections keep working. With
    /// [`Config::drain_timeout`], a drained agent also stops by itself once they are gone.
    pub async fn run(self, drain: CancellationToken, stop: CancellationToken) {
        // Cancelled by the caller, or by this agent once drained.
        let stop = stop.child_token();
        let Self {
            config,
            health,
            admin,
            control_plane: control_plane_listener,
            registry,
            metrics,
            destinations,
            admin_routes,
            readiness,
            audit,
        } = self;
        // Stopped last, so the records of connections cut at shutdown are written too.
        let (audit_log, audit_writer) = match audit {
            Some((log, writer)) => (Some(log), Some(writer.spawn())),
            None => (None, None),
        };
        let (endpoint, settings) = config
            .control_plane
            .as_ref()
            .map(|cp| (cp.endpoint.clone(), (cp.max_connections, cp.protocol)))
            .unwrap_or_default();
        let drain_timeout = config.drain_timeout;
        let clientset = Arc::new(clientset::ClientSet::new(
            config,
            metrics.clone(),
            destinations.clone(),
            audit_log,
        ));
        let health_addr = health.local_addr().ok();
        tracing::info!(
            health = health.local_addr().ok().map(tracing::field::display),
            admin = admin.local_addr().ok().map(tracing::field::display),
            agent.id = %clientset.agent_id(),
            "proxy agent starting"
        );
        let endpoints = tokio_util::task::TaskTracker::new();
        let http_limits = tether_observe::http::HttpLimits {
            refused: Some(registry.counter(
                "tether_agent_http_connections_refused_total",
                "Connections to the health or admin port closed at accept because as many were open already",
            )),
            ..Default::default()
        };
        endpoints.spawn(tether_observe::http::serve(
            health,
            health::health_handler(clientset.clone(), registry.clone(), readiness),
            http_limits.clone(),
            stop.clone().cancelled_owned(),
        ));
        endpoints.spawn(tether_observe::http::serve_with(
            admin,
            health::admin_handler(health_addr, clientset.clone()),
            admin_routes,
            http_limits,
            stop.clone().cancelled_owned(),
        ));
        endpoints.spawn(destinations.watch(stop.clone()));
        if let Some(bound) = drain_timeout {
            let draining = clientset.clone();
            endpoints.spawn(drain::stop_when_drained(
                move || draining.is_draining().then(|| draining.open_connections()),
                drain.clone(),
                bound,
                stop.clone(),
            ));
        }
        if let Some(listener) = control_plane_listener {
            endpoints.spawn(control_plane::serve(
                listener,
                endpoint,
                settings,
                clientset.clone(),
                metrics,
                stop.clone(),
            ));
        }
        clientset.run(drain, stop.clone()).await;
        endpoints.close();
        endpoints.wait().await;
        if let Some(writer) = audit_writer {
            writer.finish().await;
        }
        tracing::info!("proxy agent stopped");
    }
}
