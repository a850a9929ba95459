//! The tether proxy server: frontends for clients, a listener for agents, and the routing
//! between them.
//!
//! Layout:
//! - [`frontend`]: gRPC `ProxyService` and HTTP CONNECT, over a Unix socket or mTLS TCP;
//! - `backend`: agent streams (`AgentService.Connect`), their connections, and agent
//!   selection by proxy strategy;
//! - `dial`: one dial from request to established tunnel, with a deadline;
//! - `health`: health, readiness and metrics endpoints;
//! - `net`: listeners.
#![forbid(unsafe_code)]

mod backend;
mod dial;
pub mod frontend;
mod health;
mod metrics;
mod net;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

pub use backend::registry::Strategy;
pub use frontend::Mode;
use tether_grpc::{H2Settings, Keepalive};
use tether_observe::metrics::Registry;
pub use tether_tunnel::FlowConfig;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::service::AgentService;
use crate::dial::Hub;
use crate::net::Listener;

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
    /// Deadline for an agent to answer a dial.
    pub dial_timeout: Duration,
    /// On shutdown, how long live connections may continue.
    pub graceful_shutdown_timeout: Duration,
    pub flow: FlowConfig,
    /// HTTP/2 PINGs to agents; a silent agent is dropped after `timeout`.
    pub agent_keepalive: Option<Keepalive>,
    pub frontend_keepalive: Option<Keepalive>,
}

/// Start-up failures.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("listening on {what} {addr}: {source}")]
    Listen {
        what: &'static str,
        addr: String,
        source: std::io::Error,
    },
}

/// A server whose listeners are bound; [`run`](Self::run) serves them.
#[derive(Debug)]
pub struct Server {
    config: Config,
    frontend: Listener,
    agent: Listener,
    health: TcpListener,
    admin: TcpListener,
    registry: Registry,
}

impl Server {
    /// Binds every listener, so that errors surface before anything is served and callers
    /// that asked for port 0 can learn the ports.
    pub async fn bind(config: Config, registry: Registry) -> Result<Self, ServerError> {
        let listen_err =
            |what, addr: String| move |source| ServerError::Listen { what, addr, source };
        let frontend = match &config.frontend {
            FrontendListen::Unix {
                path,
                delete_existing,
            } => Listener::unix(path, *delete_existing)
                .map_err(listen_err("frontend socket", path.display().to_string()))?,
            FrontendListen::Tls { addr, tls } => Listener::tls(*addr, tls.clone())
                .await
                .map_err(listen_err("frontend", addr.to_string()))?,
        };
        let agent = Listener::tls(config.agent_addr, config.agent_tls.clone())
            .await
            .map_err(listen_err("agent", config.agent_addr.to_string()))?;
        let health = TcpListener::bind(config.health_addr)
            .await
            .map_err(listen_err("health", config.health_addr.to_string()))?;
        let admin = TcpListener::bind(config.admin_addr)
            .await
            .map_err(listen_err("admin", config.admin_addr.to_string()))?;
        Ok(Self {
            config,
            frontend,
            agent,
            health,
            admin,
            registry,
        })
    }

    /// The frontend's address: a socket path or `host:port`.
    pub fn frontend_addr(&self) -> String {
        self.frontend.local_addr()
    }

    pub fn frontend_tcp_addr(&self) -> Option<SocketAddr> {
        self.frontend.tcp_addr()
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
            agent,
            health,
            admin,
            registry,
        } = self;
        let metrics = Arc::new(metrics::ServerMetrics::register(&registry));
        let hub = Arc::new(Hub::new(
            backend::registry::Registry::new(&config.strategies),
            metrics,
        ));
        hub.refresh_backend_gauges();
        let agent_service = Arc::new(AgentService {
            hub: hub.clone(),
            server_id: config.server_id.clone(),
            server_count: config.server_count,
            flow: config.flow,
            dial_timeout: config.dial_timeout,
            next_stream_id: AtomicU64::new(1),
        });
        let shutting_down = Arc::new(AtomicBool::new(false));
        // Ends every connection at once: after the grace period, or immediately without one.
        let stop = CancellationToken::new();
        let frontends = TaskTracker::new();
        let agents = TaskTracker::new();
        let endpoints = TaskTracker::new();

        tracing::info!(
            frontend = %frontend.local_addr(),
            mode = ?config.mode,
            agent = %agent.local_addr(),
            health = ?health.local_addr().ok(),
            admin = ?admin.local_addr().ok(),
            server.id = %config.server_id,
            "proxy server listening"
        );
        let health_handler =
            health::health_handler(hub.clone(), registry.clone(), shutting_down.clone());
        endpoints.spawn(tether_observe::http::serve(
            health,
            health_handler,
            stop.clone().cancelled_owned(),
        ));
        endpoints.spawn(tether_observe::http::serve(
            admin,
            health::admin_handler(registry.clone()),
            stop.clone().cancelled_owned(),
        ));

        let agent_settings = H2Settings::agent_stream().with_keepalive(config.agent_keepalive);
        let frontend_settings = H2Settings::frontend().with_keepalive(config.frontend_keepalive);
        let agent_loop = accept_loop(&agent, &agents, &shutdown, &stop, |conn| {
            let service = agent_service.clone();
            let settings = agent_settings.clone();
            async move {
                let io = conn.ready().await?;
                // Agent streams never end by themselves; `stop` cuts them (see accept_loop).
                tether_grpc::server::serve_connection(
                    io,
                    &settings,
                    move |call| service.clone().serve(call),
                    std::future::pending(),
                )
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
            }
        });
        let frontend_loop = accept_loop(&frontend, &frontends, &shutdown, &stop, |conn| {
            let hub = hub.clone();
            let settings = frontend_settings.clone();
            let shutdown = shutdown.clone();
            let mode = config.mode;
            async move {
                let unix = matches!(conn, net::Accepted::Unix(_));
                let io = conn.ready().await?;
                let grpc_hub = hub.clone();
                let on_call = move |call| frontend::grpc::serve(grpc_hub.clone(), call);
                let served = match mode {
                    // Go clients send the escaped socket path as :authority; see AuthorityRewrite.
                    Mode::Grpc if unix => {
                        let io = tether_grpc::AuthorityRewrite::new(io);
                        tether_grpc::server::serve_connection(
                            io,
                            &settings,
                            on_call,
                            shutdown.cancelled(),
                        )
                        .await
                    }
                    Mode::Grpc => {
                        tether_grpc::server::serve_connection(
                            io,
                            &settings,
                            on_call,
                            shutdown.cancelled(),
                        )
                        .await
                    }
                    Mode::HttpConnect => {
                        frontend::http_connect::serve(hub, io).await;
                        Ok(())
                    }
                };
                served.map_err(|e| std::io::Error::other(e.to_string()))
            }
        });

        tokio::join!(agent_loop, frontend_loop);

        // Shutting down: no new connections are accepted from here on.
        shutting_down.store(true, Ordering::Release);
        drop(frontend);
        frontends.close();
        agents.close();
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
        })
        .await;
        endpoints.close();
        endpoints.wait().await;
        tracing::info!("proxy server stopped");
    }
}

/// Accepts until `shutdown`, running each connection as a tracked task that ends when it
/// finishes or when `stop` cuts it.
async fn accept_loop<F, Fut>(
    listener: &Listener,
    tasks: &TaskTracker,
    shutdown: &CancellationToken,
    stop: &CancellationToken,
    mut serve: F,
) where
    F: FnMut(net::Accepted) -> Fut,
    Fut: std::future::Future<Output = std::io::Result<()>> + Send + 'static,
{
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(conn) => {
                let peer = conn.peer();
                let fut = serve(conn);
                let stop = stop.clone();
                tasks.spawn(async move {
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
