//! What a running server serves beside its frontends and agent listener: the health and
//! admin HTTP ports, the TLS files' watcher and the routing file's watcher. Each is a task
//! that ends with `stop`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tether_observe::http::DeferredHandler;
use tether_observe::metrics::Registry;
use tether_reload::Loaded;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::token::TokenAuthenticator;
use crate::dial::Hub;
use crate::health;
use crate::introspect::Membership;
use crate::limits::{Limit, LimitMetrics};
use crate::routing::RoutingConfig;
use crate::tls_reload::{self, TlsReload};

/// The endpoints' listeners and what they report on.
pub(crate) struct Endpoints<'a> {
    pub(crate) health: TcpListener,
    pub(crate) admin: TcpListener,
    pub(crate) admin_routes: Option<DeferredHandler>,
    pub(crate) registry: &'a Registry,
    pub(crate) hub: &'a Arc<Hub>,
    pub(crate) limit_metrics: &'a LimitMetrics,
    /// Set when shutdown begins: readiness fails from then on.
    pub(crate) shutting_down: &'a Arc<AtomicBool>,
    /// Who this server is and its watched routing file, if any.
    pub(crate) membership: Membership,
    /// Agent token checks, whose reachability readiness reports.
    pub(crate) tokens: Option<Arc<dyn TokenAuthenticator>>,
    /// `--max-http-connections`, for each of the two ports.
    pub(crate) max_http_connections: usize,
    pub(crate) tls_reload: Option<TlsReload>,
}

/// Each new generation of the watched routing file; `None` without one.
pub(crate) type RoutingUpdates = Option<watch::Receiver<Arc<Loaded<RoutingConfig>>>>;

impl Endpoints<'_> {
    /// Spawns every endpoint's task on the returned tracker, each ending with `stop`.
    pub(crate) fn spawn(self, stop: &CancellationToken) -> (TaskTracker, RoutingUpdates) {
        let Self {
            health,
            admin,
            admin_routes,
            registry,
            hub,
            limit_metrics,
            shutting_down,
            membership,
            tokens,
            max_http_connections,
            tls_reload,
        } = self;
        let routing_reload = membership.routing.clone();
        let tasks = TaskTracker::new();
        let health_handler =
            health::health_handler(hub.clone(), registry.clone(), shutting_down.clone(), tokens);
        let http_limits = tether_observe::http::HttpLimits {
            max_connections: max_http_connections,
            refused: Some(limit_metrics.counter(Limit::HttpConnections)),
            ..Default::default()
        };
        tasks.spawn(tether_observe::http::serve(
            health,
            health_handler,
            http_limits.clone(),
            stop.clone().cancelled_owned(),
        ));
        tasks.spawn(tether_observe::http::serve_with(
            admin,
            health::admin_handler(registry.clone(), hub.clone(), membership),
            admin_routes,
            http_limits,
            stop.clone().cancelled_owned(),
        ));
        if let Some(reload) = tls_reload {
            tasks.spawn(tls_reload::run(
                reload,
                tls_reload::ReloadMetrics::register(registry),
                stop.clone(),
            ));
        }
        let updates = match &routing_reload {
            Some(reloader) => {
                tasks.spawn(
                    reloader
                        .clone()
                        .run(tether_reload::DEFAULT_INTERVAL, stop.clone()),
                );
                Some(reloader.subscribe())
            }
            None => {
                tasks.spawn(tether_reload::log_hangups(
                    "the server watches no configuration file (--routing-config is not set)",
                    stop.clone(),
                ));
                None
            }
        };
        (tasks, updates)
    }
}
