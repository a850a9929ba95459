//! Dialing through an agent: choosing one, waiting for its answer, bounding the wait.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tether_tunnel::{Abandoned, Tunnel};
use tokio::sync::watch;

use crate::audit::Audit;
use crate::backend::selection::Strategy;
use crate::backend::selection_metrics::SelectionMetrics;
use crate::backend::session::Watch;
use crate::byte_rate::ByteRate;
use crate::error::DialError;
use crate::identity::Proof;
use crate::metrics::{DialFailure, ServerMetrics};
use crate::request::RequestContext;
use crate::running::Running;
use crate::tenant::{Side, Tenant};

/// An established tunnel, with its tenant's bytes/s bucket (idle without a limit or share;
/// a reload may set one while the connection runs).
#[derive(Debug)]
pub(crate) struct Dialed {
    pub(crate) tunnel: Tunnel,
    pub(crate) byte_rate: Option<Arc<ByteRate>>,
}

/// State shared by every frontend and agent stream of one server.
#[derive(Debug)]
pub(crate) struct Hub {
    /// The routing file's generation in force: the tenant table (each tenant owns the
    /// registry of its agents), destination policies, reverse-dial allowlists and ejection.
    /// Replaced as a whole by a reload ([`crate::reload`]); read with [`Hub::running`].
    running: watch::Sender<Arc<Running>>,
    pub(crate) metrics: Arc<ServerMetrics>,
    selection_metrics: Arc<SelectionMetrics>,
    /// Set when the audit log is on.
    pub(crate) audit: Option<Arc<Audit>>,
    /// This server's `--server-id`, for the log lines of its frontend connections.
    pub(crate) server_id: String,
}

impl Hub {
    pub(crate) fn new(
        running: Running,
        metrics: Arc<ServerMetrics>,
        selection_metrics: Arc<SelectionMetrics>,
        audit: Option<Arc<Audit>>,
        server_id: String,
    ) -> Self {
        Self {
            running: watch::Sender::new(Arc::new(running)),
            metrics,
            selection_metrics,
            audit,
            server_id,
        }
    }

    /// The generation in force: a snapshot, good for one dial or one admission.
    pub(crate) fn running(&self) -> Arc<Running> {
        self.running.borrow().clone()
    }

    /// Puts `next` in force for every later dial and admission; the previous generation's
    /// readers finish with theirs.
    pub(crate) fn publish(&self, next: Arc<Running>) {
        self.running.send_replace(next);
    }

    /// Records a dial refused before any agent was asked; `tenant` once it was resolved.
    pub(crate) fn refused(&self, request: &RequestContext, tenant: Option<&Tenant>, reason: &str) {
        if let Some(audit) = &self.audit {
            audit.refused(request, tenant.map(|t| &*t.name), reason);
        }
    }

    fn selection_metrics(&self) -> &SelectionMetrics {
        &self.selection_metrics
    }

    /// What a new agent stream of `tenant` reports its health and load to.
    pub(crate) fn watch(&self, tenant: &Tenant) -> Watch {
        Watch {
            ejection: self.running().ejection,
            metrics: self.selection_metrics.clone(),
            tenant: tenant.load.clone(),
            audit: self
                .audit
                .as_ref()
                .map(|audit| Arc::new(audit.for_tenant(&tenant.name))),
        }
    }

    /// Readiness, as upstream, for any tenant.
    pub(crate) fn is_ready(&self) -> bool {
        self.running()
            .tenants
            .all()
            .any(|t| t.registry().is_ready())
    }

    /// Publishes registry-derived gauges after a change, summed over tenants.
    pub(crate) fn refresh_backend_gauges(&self) {
        let mut agents = 0;
        let mut tether_agents = 0;
        let mut keys: Vec<(Strategy, usize)> = Vec::new();
        let running = self.running();
        for tenant in running.tenants.all() {
            let registry = tenant.registry();
            agents += registry.agent_count();
            tether_agents += registry.tether_agent_count();
            for (n, (strategy, count)) in registry.key_counts().enumerate() {
                match keys.get_mut(n) {
                    Some(slot) => slot.1 += count,
                    None => keys.push((strategy, count)),
                }
            }
        }
        self.metrics.ready_backend_connections.set(agents as i64);
        self.metrics
            .set_connected_agents(tether_agents, agents - tether_agents);
        for (strategy, count) in keys {
            self.metrics.set_ready_backends(strategy.as_str(), count);
        }
    }

    /// Dials `address` through an agent. Returns when the agent answered, the dial deadline
    /// (the agent stream's table holds it) passed, or `frontend_gone` resolved; in the last
    /// case the agent is told to stop dialing, or to close what it already opened. The chosen
    /// agent is recorded in the caller's connection span ([`crate::frontend::log_span`]).
    pub(crate) async fn dial(
        &self,
        request: &RequestContext,
        frontend_gone: impl Future<Output = ()>,
    ) -> Result<Dialed, DialError> {
        let refuse = |tenant: Option<&Tenant>, error: DialError| {
            self.refused(request, tenant, &error.to_string());
            error
        };
        // One generation for the whole decision.
        let running = self.running();
        let tenants = &running.tenants;
        let tenant = match &request.tenant {
            // Pinned by a tenant's own frontend: the client must still be the tenant's.
            Some(name) => {
                let tenant = tenants
                    .by_name(name)
                    .ok_or_else(|| refuse(None, DialError::NoTenant(tenants.not_found(name))))?;
                tenants
                    .admit_own_frontend(tenant, &request.peer)
                    .map_err(|why| refuse(Some(tenant), DialError::NoTenant(why)))?;
                tenant
            }
            None => tenants
                .resolve(Side::Client, Proof::peer(&request.peer))
                .map_err(|why| refuse(None, DialError::NoTenant(why)))?,
        };
        // Before the tenant's limits: a refused request costs the tenant nothing.
        running
            .destinations
            .check(request)
            .map_err(|why| refuse(Some(tenant), DialError::Policy(why)))?;
        let now = Instant::now();
        tenant
            .reserve_dial(now)
            .map_err(|(_, text)| refuse(Some(tenant), DialError::TenantLimit(text)))?;
        // From here the tenant's pending reservation is released with the agent's pending
        // count (`Health::dial_finished`), or right below when no agent is found.
        let selected = tenant.registry().select(request, now);
        let Some(selected) = selected else {
            tenant.load.release_pending();
            self.metrics.dial_failure(DialFailure::NoAgent);
            return Err(refuse(Some(tenant), DialError::NoAgent));
        };
        self.selection_metrics()
            .selected(selected.strategy, selected.candidates);
        let session = selected.backend;
        let random = request.dial_id;
        crate::frontend::log_span::record_agent(&session.agent_id);
        tracing::debug!(
            agent.id = %session.agent_id,
            dial.id = %random,
            address = %request.address,
            strategy = selected.strategy.as_str(),
            tenant = %tenant.name,
            frontend = request.frontend.as_str(),
            peer = %request.peer.principal(),
            "dialing"
        );
        // Counted (and its client recorded) before DIAL_REQ leaves: the answer's hook may
        // run before this returns.
        self.metrics.pending_dials.inc();
        session.pending_gauge.inc();
        session.health.dial_started();
        // Its audit records carry the generation that admitted it.
        let recorded = session.requests.insert(request, running.generation);
        let mut pending =
            match session
                .link
                .dial(random, request.protocol.clone(), request.address.clone())
            {
                Ok(pending) => pending,
                Err(e) => {
                    if recorded {
                        session.requests.remove(random);
                    }
                    self.metrics.pending_dials.dec();
                    session.pending_gauge.dec();
                    session.health.dial_finished();
                    if let tether_tunnel::DialError::StreamLost(_) = e {
                        self.metrics.dial_failure(DialFailure::SendRsp);
                    }
                    let error = DialError::from(e);
                    if let Some(audit) = &session.audit {
                        audit.failed(request, &session.agent_id, None, &error);
                    }
                    return Err(error);
                }
            };
        tokio::select! {
            answer = pending.answer() => answer.map_err(DialError::from).map(|tunnel| Dialed {
                tunnel,
                byte_rate: Some(tenant.byte_rate.clone()),
            }),
            () = frontend_gone => {
                match pending.abandon() {
                    Abandoned::Pending => {
                        session.requests.remove(random);
                        self.metrics.pending_dials.dec();
                        session.pending_gauge.dec();
                        session.health.dial_finished();
                        self.metrics.dial_failure(DialFailure::FrontendClose);
                        if let Some(audit) = &session.audit {
                            audit.failed(request, &session.agent_id, None, &DialError::FrontendGone);
                        }
                    }
                    Abandoned::Answered => self.metrics.dial_failure(DialFailure::FrontendClose),
                    Abandoned::Nothing => {}
                }
                Err(DialError::FrontendGone)
            }
        }
    }
}
