//! The routing file while the server runs: the one owner of the running configuration.
//!
//! ```text
//! routing file --(tether_reload::Reloader: read every 500 ms and on SIGHUP, compared by
//!    |            content, parsed and validated whole with the start-up checks)
//!    v
//! watch channel of Loaded<RoutingConfig> generations (a refused file never gets here)
//!    |
//!    v
//! RoutingOwner (this module, one task): builds the next Running from the previous one,
//!    |   keeping each tenant's TenantState (agents, registry, load, buckets) by name
//!    |-- Hub::publish: the new Arc<Running> is swapped in; every later dial and agent
//!    |   admission reads it (Hub::running), earlier ones finish with theirs
//!    |-- removed tenants: streams retired (no new dial at once, cut after the grace)
//!    |-- agent identities that moved to another tenant: the same
//!    `-- tenants' own frontends: removed or changed ones closed (a socket file unlinked),
//!        new ones bound and served
//! ```
//!
//! Nothing in a [`Running`] changes once published. What outlives a generation is state kept
//! by tenant name ([`TenantState`]) and set to the new generation's values there: a
//! registry's selection settings and a tenant's byte-rate bucket, which live connections
//! share, so a new `bytes_per_second` applies to them from their next chunk. Lowered
//! connection, pending-dial and dial-rate caps apply to new dials only; a destination policy
//! is checked at dial and never cuts a live connection (see the book's "Changing
//! configuration without a restart").

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use tether_reload::Loaded;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::backend::session::AgentSession;
use crate::dial::Hub;
use crate::frontend::connection::FrontendService;
use crate::net::Listener;
use crate::routing::RoutingConfig;
use crate::running::Running;
use crate::serve::Gate;
use crate::tenant::{Side, TenantState};
use crate::tenant_config::TenantConfig;
use crate::tenant_frontend::TenantFrontend;

/// Binds one tenant's own frontend listeners with the server's settings; `Err` says why.
pub(crate) type BindTenant = Box<
    dyn Fn(TenantConfig) -> Pin<Box<dyn Future<Output = Result<Vec<Listener>, String>> + Send>>
        + Send
        + Sync,
>;

/// The next generation of the running configuration, built from `previous` (whose tenants'
/// state it keeps by name) and the routing file's `generation`; also returns the tenants it
/// no longer has.
pub(crate) fn next_running(
    previous: &Running,
    routing: &RoutingConfig,
    generation: u64,
) -> (Running, Vec<Arc<TenantState>>) {
    let (tenants, removed) = previous.tenants.next(
        &routing.tenants,
        routing.bandwidth,
        routing.selection(),
        generation,
    );
    let leaving = previous
        .leaving
        .iter()
        .chain(&removed)
        .filter(|state| state.has_streams())
        .cloned()
        .collect();
    let running = Running {
        generation,
        tenants,
        destinations: previous.destinations.next(&routing.destinations),
        control_plane: previous.control_plane.next(&routing.tenants),
        ejection: routing.ejection,
        leaving,
    };
    (running, removed)
}

/// One tenant's own frontend, served.
struct Served {
    frontend: TenantFrontend,
    /// Ends the accept loops (the connections they accepted keep running).
    closing: CancellationToken,
    loops: Vec<JoinHandle<()>>,
}

/// What the accept loops of tenants' own frontends share with the main frontend's.
pub(crate) struct Serving {
    pub(crate) service: Arc<FrontendService>,
    pub(crate) connections: TaskTracker,
    pub(crate) shutdown: CancellationToken,
    pub(crate) stop: CancellationToken,
    pub(crate) gate: Gate,
}

/// The owner of the running configuration and of tenants' own frontends.
pub(crate) struct RoutingOwner {
    pub(crate) hub: Arc<Hub>,
    /// How long a retired agent stream keeps its connections (`--graceful-shutdown-timeout`).
    pub(crate) grace: Duration,
    pub(crate) bind: BindTenant,
    pub(crate) serving: Serving,
    served: HashMap<String, Served>,
}

impl RoutingOwner {
    pub(crate) fn new(hub: Arc<Hub>, grace: Duration, bind: BindTenant, serving: Serving) -> Self {
        Self {
            hub,
            grace,
            bind,
            serving,
            served: HashMap::new(),
        }
    }

    /// Serves the tenants' frontends bound at start-up, then applies each generation that
    /// `updates` brings (none without a watched file) until shutdown; returns once every
    /// tenant frontend's accept loop ended.
    pub(crate) async fn run(
        mut self,
        initial: Vec<(String, Listener)>,
        routing: &RoutingConfig,
        mut updates: Option<watch::Receiver<Arc<Loaded<RoutingConfig>>>>,
    ) {
        let mut by_tenant: HashMap<String, Vec<Listener>> = HashMap::new();
        for (name, listener) in initial {
            by_tenant.entry(name).or_default().push(listener);
        }
        for tenant in &routing.tenants {
            if let (Some(frontend), Some(listeners)) =
                (&tenant.frontend, by_tenant.remove(&tenant.name))
            {
                self.serve(&tenant.name, frontend.clone(), listeners);
            }
        }
        let shutdown = self.serving.shutdown.clone();
        loop {
            let next = async {
                match updates.as_mut() {
                    Some(updates) => match updates.changed().await {
                        Ok(()) => Some(updates.borrow_and_update().clone()),
                        Err(_) => None,
                    },
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => break,
                next = next => match next {
                    Some(loaded) => self.apply(&loaded).await,
                    // The reloader is gone (it stops with the server): nothing more comes.
                    None => updates = None,
                },
            }
        }
        for (_, served) in self.served.drain() {
            for handle in served.loops {
                let _ = handle.await;
            }
        }
    }

    /// Puts `loaded` in force, then ends what it took away and serves what it added.
    pub(crate) async fn apply(&mut self, loaded: &Loaded<RoutingConfig>) {
        let previous = self.hub.running();
        let generation = loaded.generation;
        if generation <= previous.generation {
            return;
        }
        let routing = &*loaded.config;
        let (next, removed) = next_running(&previous, routing, generation);
        let next = Arc::new(next);
        // From here every new dial and agent admission reads generation `generation`.
        self.hub.publish(next.clone());
        for state in &removed {
            let why = crate::tenant::removed(&state.name, generation);
            let streams = state.remove(&why);
            tracing::warn!(
                tenant = %state.name,
                generation,
                agent_streams = streams.len(),
                grace = ?self.grace,
                "{why}: its agents take no new dial, and their streams and connections end after \
                 the grace period (--graceful-shutdown-timeout)"
            );
            for session in streams {
                self.retire(state, &session, why.clone(), generation);
            }
        }
        self.retire_moved(&next);
        if !previous.destinations.same_as(&routing.destinations) {
            tracing::info!(
                generation,
                "destination policies changed: each new dial is checked against them; live \
                 connections are kept"
            );
        }
        self.frontends(routing, generation).await;
        self.hub.refresh_backend_gauges();
        tracing::info!(
            generation,
            sha256 = %loaded.sha256,
            tenants = routing.tenants.len(),
            "routing file generation {generation} in force"
        );
    }

    /// Retires every stream whose agent identity the new generation gives to another tenant,
    /// or to none.
    fn retire_moved(&self, running: &Running) {
        let tenants = &running.tenants;
        for tenant in tenants.all() {
            for session in tenant.streams_now() {
                if session.retiring().is_some() {
                    continue;
                }
                let proof = session.proof.proof();
                let why = match tenants.owner_of(Side::Agent, proof) {
                    Ok(owner) if owner.name == tenant.name => continue,
                    Ok(owner) => {
                        crate::tenant::moved(proof, &tenant.name, &owner.name, running.generation)
                    }
                    Err(why) => format!(
                        "{why} in the routing file (generation {})",
                        running.generation
                    ),
                };
                self.retire(tenant.state(), &session, why, running.generation);
            }
        }
    }

    /// Takes `session` out of its tenant's registry at once (no new dial reaches it) and
    /// has its owner end it, with its connections, after the grace period.
    fn retire(
        &self,
        tenant: &TenantState,
        session: &Arc<AgentSession>,
        why: String,
        generation: u64,
    ) {
        let deadline = tokio::time::Instant::now() + self.grace;
        if !session.retire(why.clone(), deadline, generation) {
            return;
        }
        tenant
            .registry()
            .remove(&session.agent_id, session.stream_id);
        tracing::warn!(
            agent.id = %session.agent_id,
            stream = session.stream_id,
            tenant = %tenant.name,
            generation,
            grace = ?self.grace,
            reason = %why,
            "agent stream retired by a reload: no new dial; it and its connections are cut after the grace period"
        );
    }

    /// Closes the tenants' own frontends that `routing` removed or changed (a Unix socket's
    /// file goes with its listener), then binds and serves the ones it added. A listener that
    /// cannot be bound is logged; the next generation that still declares it tries again.
    async fn frontends(&mut self, routing: &RoutingConfig, generation: u64) {
        let wanted: HashMap<&str, &TenantConfig> = routing
            .tenants
            .iter()
            .filter(|t| t.frontend.is_some())
            .map(|t| (t.name.as_str(), t))
            .collect();
        let stale: Vec<String> = self
            .served
            .iter()
            .filter(|(name, served)| {
                wanted.get(name.as_str()).and_then(|t| t.frontend.as_ref())
                    != Some(&served.frontend)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in stale {
            let Some(served) = self.served.remove(&name) else {
                continue;
            };
            served.closing.cancel();
            for handle in served.loops {
                let _ = handle.await;
            }
            tracing::info!(tenant = %name, generation, "tenant frontend closed by a reload");
        }
        for (name, tenant) in wanted {
            if self.served.contains_key(name) {
                continue;
            }
            let Some(frontend) = tenant.frontend.clone() else {
                continue;
            };
            match (self.bind)(tenant.clone()).await {
                Ok(listeners) => self.serve(name, frontend, listeners),
                Err(error) => tracing::error!(
                    tenant = %name,
                    generation,
                    %error,
                    "cannot serve the tenant's own frontend; the tenant's other settings apply, and the next changed routing file that still declares it tries again"
                ),
            }
        }
    }

    /// Serves `listeners` as tenant `name`'s own frontend.
    fn serve(&mut self, name: &str, frontend: TenantFrontend, listeners: Vec<Listener>) {
        let closing = self.serving.shutdown.child_token();
        let tenant: Arc<str> = name.into();
        let loops = listeners
            .into_iter()
            .map(|listener| {
                tracing::info!(tenant = %name, frontend = %listener.local_addr(), "tenant frontend listening");
                let service = self.serving.service.clone();
                let (tasks, closing, stop, gate, tenant) = (
                    self.serving.connections.clone(),
                    closing.clone(),
                    self.serving.stop.clone(),
                    self.serving.gate.clone(),
                    tenant.clone(),
                );
                tokio::spawn(async move {
                    crate::serve::accept_loop(
                        &listener,
                        &tasks,
                        &closing,
                        &stop,
                        &gate,
                        |conn, deadline, _| {
                            service.clone().serve(conn, deadline, Some(tenant.clone()))
                        },
                    )
                    .await;
                    // Dropping the listener closes it; a Unix socket's file goes with it.
                    drop(listener);
                })
            })
            .collect();
        self.served.insert(
            name.to_owned(),
            Served {
                frontend,
                closing,
                loops,
            },
        );
    }
}
