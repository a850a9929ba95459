//! Dialing through an agent: choosing one, waiting for its answer, bounding the wait.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tether_observe::time::monotonic_now;

use std::collections::hash_map::Entry;
use tether_observe::metrics::Gauge;
use tether_proto::{DialId, Forward};

use tether_tunnel::{Abandoned, Link, PendingDial, Tunnel};
use tokio::sync::watch;

use crate::audit::Audit;
use crate::backend::health::Health;
use crate::backend::registry::Backend;
use crate::backend::remote::{RemoteAgent, RouteEntry};
use crate::backend::route::Route;
use crate::backend::selection::Strategy;
use crate::backend::selection_metrics::SelectionMetrics;
use crate::backend::session::{AgentSession, Watch};
use crate::byte_rate::ByteRate;
use crate::error::DialError;
use crate::identity::Proof;
use crate::metrics::{DialFailure, ServerMetrics};
use crate::peer_links::PeerLinks;
use crate::request::{Hop, RequestContext, Requests};
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
    /// Bumped when this server's own agents may have joined, left or changed: peer links
    /// announce the difference (server peering).
    pub(crate) agents_changed: Arc<watch::Sender<u64>>,
    /// The live peer links, for introspection and their gauges.
    pub(crate) peer_links: Arc<PeerLinks>,
}

/// Routes one dial may try when holders say they no longer hold the agent chosen.
const ROUTE_ATTEMPTS: usize = 3;
/// How long a dial waits for a refused route's bookkeeping before trying another.
const SETTLED_WAIT: Duration = Duration::from_millis(100);

impl Hub {
    pub(crate) fn new(
        running: Running,
        metrics: Arc<ServerMetrics>,
        selection_metrics: Arc<SelectionMetrics>,
        audit: Option<Arc<Audit>>,
        server_id: String,
        peer_links: Arc<PeerLinks>,
    ) -> Self {
        Self {
            running: watch::Sender::new(Arc::new(running)),
            metrics,
            selection_metrics,
            audit,
            server_id,
            agents_changed: Arc::new(watch::Sender::new(0)),
            peer_links,
        }
    }

    /// Tells the peer links that this server's own agents may have changed.
    pub(crate) fn note_agents_changed(&self) {
        self.agents_changed.send_modify(|n| *n = n.wrapping_add(1));
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

    /// Wakes on every generation put in force.
    pub(crate) fn generations(&self) -> watch::Receiver<Arc<Running>> {
        self.running.subscribe()
    }

    /// Records a dial refused before any agent was asked; `tenant` once it was resolved.
    pub(crate) fn refused(&self, request: &RequestContext, tenant: Option<&Tenant>, reason: &str) {
        if let Some(audit) = &self.audit {
            audit.refused(request, tenant.map(|t| &*t.name), reason);
        }
    }

    pub(crate) fn selection_metrics(&self) -> &SelectionMetrics {
        &self.selection_metrics
    }

    /// What a new agent stream of `tenant` reports its health and load to.
    pub(crate) fn watch(&self, tenant: &Tenant) -> Watch {
        Watch {
            ejection: self.running().ejection,
            metrics: self.selection_metrics.clone(),
            tenant: tenant.load.clone(),
            agents_changed: self.agents_changed.clone(),
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

    /// Publishes registry-derived gauges after a change of this server's own agent streams,
    /// summed over tenants, and tells the peer links.
    pub(crate) fn refresh_backend_gauges(&self) {
        self.note_agents_changed();
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
    /// An agent a peer server holds is dialed through that server (server peering).
    pub(crate) async fn dial(
        &self,
        request: &RequestContext,
        frontend_gone: impl Future<Output = ()>,
    ) -> Result<Dialed, DialError> {
        // One generation for the whole decision.
        let running = self.running();
        let tenant = self.admit(&running, request)?;
        let mut frontend_gone = std::pin::pin!(frontend_gone);
        let mut attempt = 1;
        loop {
            let (result, remote) = self
                .dial_once(request, tenant, &running, frontend_gone.as_mut())
                .await;
            // The holder no longer has the agent (its announcement that the agent left is
            // on its way): the route is passed over and the dial tries another.
            let Some(remote) = remote.filter(|_| {
                attempt < ROUTE_ATTEMPTS
                    && result.as_ref().is_err_and(crate::peer::holder_lacks_agent)
            }) else {
                return result;
            };
            remote.withdraw(monotonic_now());
            if !remote.via.settled(request.dial_id, SETTLED_WAIT).await {
                return result;
            }
            tracing::debug!(agent.id = %remote.agent_id, via = %remote.via.server_id, dial.id = %request.dial_id, "the agent's server no longer holds it; dialing another route");
            tenant.load.reserve_again();
            attempt += 1;
        }
    }

    /// One route for `request`: selects a stream and dials through it. Returns the outcome,
    /// and the remote agent when the route went through a peer.
    async fn dial_once(
        &self,
        request: &RequestContext,
        tenant: &Tenant,
        running: &Running,
        frontend_gone: impl Future<Output = ()>,
    ) -> (Result<Dialed, DialError>, Option<Arc<RemoteAgent>>) {
        let selected = tenant.registry().select(request, monotonic_now());
        let Some(selected) = selected else {
            tenant.load.release_pending();
            self.metrics.dial_failure(DialFailure::NoAgent);
            return (
                Err(self.refuse(request, Some(tenant), DialError::NoAgent)),
                None,
            );
        };
        self.selection_metrics()
            .selected(selected.strategy, selected.candidates);
        tracing::debug!(
            agent.id = %selected.backend.agent_id(),
            dial.id = %request.dial_id,
            address = %request.address,
            strategy = selected.strategy.as_str(),
            tenant = %tenant.name,
            frontend = request.frontend.as_str(),
            peer = %request.peer.principal(),
            via = selected.backend.local().is_none().then_some("peer"),
            "dialing"
        );
        let target = match &selected.backend {
            Route::Local(session) => Target::local(session),
            Route::Remote(remote) => Target::remote(remote, request, tenant, &self.server_id),
        };
        let request = match &selected.backend {
            Route::Local(_) => request.clone(),
            Route::Remote(remote) => RequestContext {
                hop: Some(Hop::Via(remote.via.server_id.clone())),
                ..request.clone()
            },
        };
        let result = self
            .dial_on(target, &request, tenant, running, frontend_gone)
            .await;
        (result, selected.backend.remote().cloned())
    }

    /// Dials through `agent_id`, one of this server's own agents, for a client of the peer
    /// server that forwarded `request`. The tenant, destination policy and limits are
    /// checked here again, as for a client of this server.
    pub(crate) async fn dial_forwarded(
        &self,
        request: &RequestContext,
        agent_id: &str,
        frontend_gone: impl Future<Output = ()>,
    ) -> Result<Dialed, DialError> {
        let running = self.running();
        let tenant = self.admit(&running, request)?;
        let session = tenant
            .registry()
            .first_local(agent_id)
            .and_then(Route::local)
            .cloned();
        let Some(session) = session else {
            tenant.load.release_pending();
            self.metrics.dial_failure(DialFailure::NoAgent);
            return Err(self.refuse(request, Some(tenant), DialError::NoAgent));
        };
        self.dial_on(
            Target::local(&session),
            request,
            tenant,
            &running,
            frontend_gone,
        )
        .await
    }

    fn refuse(
        &self,
        request: &RequestContext,
        tenant: Option<&Tenant>,
        error: DialError,
    ) -> DialError {
        self.refused(request, tenant, &error.to_string());
        error
    }

    /// The request's tenant, once its destination policy allowed it and its limits had room
    /// for one more pending dial (released with the dial, or by the caller if no agent is
    /// found).
    fn admit<'r>(
        &self,
        running: &'r Running,
        request: &RequestContext,
    ) -> Result<&'r Arc<Tenant>, DialError> {
        let tenants = &running.tenants;
        let tenant = match &request.tenant {
            // Pinned by a tenant's own frontend: the client must still be the tenant's.
            Some(name) => {
                let tenant = tenants.by_name(name).ok_or_else(|| {
                    self.refuse(request, None, DialError::NoTenant(tenants.not_found(name)))
                })?;
                tenants
                    .admit_own_frontend(tenant, &request.peer)
                    .map_err(|why| self.refuse(request, Some(tenant), DialError::NoTenant(why)))?;
                tenant
            }
            None => tenants
                .resolve(Side::Client, Proof::peer(&request.peer))
                .map_err(|why| self.refuse(request, None, DialError::NoTenant(why)))?,
        };
        // Before the tenant's limits: a refused request costs the tenant nothing.
        running
            .destinations
            .check(request)
            .map_err(|why| self.refuse(request, Some(tenant), DialError::Policy(why)))?;
        tenant
            .reserve_dial(tokio::time::Instant::now())
            .map_err(|(_, text)| {
                self.refuse(request, Some(tenant), DialError::TenantLimit(text))
            })?;
        Ok(tenant)
    }

    /// Sends the dial to `target` and waits for its answer, keeping the agent's load, the
    /// pending gauges and the audit records as it goes.
    async fn dial_on(
        &self,
        target: Target<'_>,
        request: &RequestContext,
        tenant: &Tenant,
        running: &Running,
        frontend_gone: impl Future<Output = ()>,
    ) -> Result<Dialed, DialError> {
        let random = request.dial_id;
        crate::frontend::log_span::record_agent(target.agent_id);
        // Counted (and its client recorded) before DIAL_REQ leaves: the answer's hook may
        // run before this returns.
        self.metrics.pending_dials.inc();
        target.started();
        // Its audit records carry the generation that admitted it.
        let recorded = target.requests.insert(request, running.generation);
        let mut pending = match target.send(request) {
            Ok(pending) => pending,
            Err(e) => {
                if recorded {
                    target.requests.remove(random);
                }
                self.metrics.pending_dials.dec();
                target.unstarted();
                if let tether_tunnel::DialError::StreamLost(_) = e {
                    self.metrics.dial_failure(DialFailure::SendRsp);
                }
                let error = DialError::from(e);
                if let Some(audit) = target.audit {
                    audit.failed(request, target.agent_id, None, &error);
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
                        target.requests.remove(random);
                        self.metrics.pending_dials.dec();
                        target.finished(random);
                        self.metrics.dial_failure(DialFailure::FrontendClose);
                        if let Some(audit) = target.audit {
                            audit.failed(request, target.agent_id, None, &DialError::FrontendGone);
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

/// Where a chosen dial goes, and what it keeps count and record with on the way: an agent
/// stream of this server, or the peer link to the server that holds the agent.
struct Target<'a> {
    agent_id: &'a str,
    link: &'a Arc<Link>,
    health: &'a Health,
    requests: &'a Requests,
    /// This server's own agents have a pending-dials series each.
    pending_gauge: Option<&'a Gauge>,
    audit: Option<&'a Audit>,
    /// Through a peer: what PEER_DIAL_REQ carries, and the agent, which the link's hooks
    /// find by dial ID.
    forward: Option<(Forward, &'a Arc<RemoteAgent>)>,
}

impl<'a> Target<'a> {
    fn local(session: &'a Arc<AgentSession>) -> Self {
        Self {
            agent_id: &session.agent_id,
            link: &session.link,
            health: &session.health,
            requests: &session.requests,
            pending_gauge: Some(&session.pending_gauge),
            audit: session.audit.as_deref(),
            forward: None,
        }
    }

    fn remote(
        remote: &'a Arc<RemoteAgent>,
        request: &RequestContext,
        tenant: &Tenant,
        server_id: &str,
    ) -> Self {
        let forward = Forward {
            agent_id: remote.agent_id.clone(),
            origin: crate::peer::origin::of(request, &tenant.name, server_id),
        };
        Self {
            agent_id: &remote.agent_id,
            link: &remote.via.link,
            health: &remote.health,
            requests: &remote.via.requests,
            pending_gauge: None,
            audit: remote.audit.as_deref(),
            forward: Some((forward, remote)),
        }
    }

    fn started(&self) {
        if let Some(gauge) = self.pending_gauge {
            gauge.inc();
        }
        self.health.dial_started();
    }

    /// Sends the dial request; through a peer, under a route entry of its own (a dial ID
    /// already in flight on the link is refused, its entry left to its own dial).
    fn send(&self, request: &RequestContext) -> Result<PendingDial, tether_tunnel::DialError> {
        let (protocol, address) = (request.protocol.clone(), request.address.clone());
        let random = request.dial_id;
        let Some((forward, remote)) = &self.forward else {
            return self.link.dial(random, protocol, address);
        };
        match remote.via.routes().entry(random) {
            Entry::Occupied(_) => return Err(tether_tunnel::DialError::Duplicate(random)),
            Entry::Vacant(slot) => {
                slot.insert(RouteEntry::new((*remote).clone()));
            }
        }
        let sent = self
            .link
            .dial_forwarded(random, protocol, address, forward.clone());
        if sent.is_err() {
            remote.via.routes().remove(&random);
        }
        sent
    }

    /// The dial was never sent: undoes [`started`](Self::started).
    fn unstarted(&self) {
        if let Some(gauge) = self.pending_gauge {
            gauge.dec();
        }
        self.health.dial_finished();
    }

    /// The dial ended before any answer could settle it.
    fn finished(&self, random: DialId) {
        self.unstarted();
        if let Some((_, remote)) = &self.forward {
            remote.via.routes().remove(&random);
        }
    }
}
