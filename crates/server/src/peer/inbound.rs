//! Links from peer servers that offer their agents: the accepting side of server peering.
//! Each link's agents join this server's registries as remote routes, under the tenants
//! their server admitted them to; the dials this server sends them go over the link, and
//! end with an explicit error when the link does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};

use tether_conn::{Heard, LastPong, LogText};
use tether_grpc::Code;
use tether_proto::link::{self, Hello};
use tether_proto::metadata::{self, Metadata};
use tether_proto::{PeerAgents, pb};
use tether_tunnel::{DialError, Event, Hooks, Link, Role, SessionConfig, Transport, TransportEnd};
use tokio_util::sync::CancellationToken;

use super::{LinkSettings, PEER_ALPN};
use crate::backend::admission::{MAX_AGENT_ID_BYTES, MAX_IDENTIFIERS, MAX_IDENTIFIERS_BYTES};
use crate::backend::remote::{REMOTE_STREAM_BASE, RemoteAgent, ViaPeer};
use crate::backend::route::Route;
use crate::backend::service::CLOSE_TIMEOUT;
use crate::dial::Hub;
use crate::limits::{LimitMetrics, SlotAdmission};
use crate::metrics::DialFailure;
use crate::net;
use crate::request::Requests;
use crate::running::Running;
use tether_proto::labels::MAX_LABEL_VALUE;

/// What every inbound peer link shares.
#[derive(Debug)]
pub(crate) struct Inbound {
    pub(crate) hub: Arc<Hub>,
    /// `--peer-name`: the name every peer's certificate must carry.
    pub(crate) name: String,
    settings: LinkSettings,
    pub(crate) limit_metrics: LimitMetrics,
    /// `--max-agents`: the most agents one peer may announce here.
    max_agents: usize,
    /// Ends every link when the server stops.
    pub(crate) stop: CancellationToken,
    /// The peer servers linked now, by server ID.
    links: Mutex<std::collections::HashSet<String>>,
    /// Gives remote agents their stream IDs.
    next_id: Arc<AtomicU64>,
}

impl Inbound {
    pub(crate) fn new(
        hub: Arc<Hub>,
        name: String,
        settings: LinkSettings,
        limit_metrics: LimitMetrics,
        max_agents: usize,
        stop: CancellationToken,
    ) -> Self {
        Self {
            hub,
            name,
            settings,
            limit_metrics,
            max_agents,
            stop,
            links: Mutex::default(),
            next_id: Arc::new(AtomicU64::new(REMOTE_STREAM_BASE)),
        }
    }

    fn links(&self) -> MutexGuard<'_, std::collections::HashSet<String>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Serves one connection on the peer port: TLS and the peer's name by the setup
    /// deadline, its HELLO, then its link until it ends.
    pub(crate) async fn serve(
        self: Arc<Self>,
        conn: net::Accepted,
        deadline: tokio::time::Instant,
        _admission: SlotAdmission,
    ) -> std::io::Result<()> {
        let label = conn.peer_label();
        let net::Ready { io, peer, alpn } =
            crate::serve::ready(conn, deadline, &self.limit_metrics).await?;
        if alpn.as_deref() != Some(PEER_ALPN) {
            tracing::warn!(peer = %label, "closing a connection on the peer port that did not ask for ALPN tether-peer/1: only tether servers with --peer-port link here");
            return Ok(());
        }
        // As the connecting side verifies the accepting one: a DNS SAN (or, for an address,
        // an IP SAN), so one certificate serves both ends.
        let named = peer.certificate.as_ref().is_some_and(|names| {
            match self.name.parse::<std::net::IpAddr>() {
                Ok(ip) => names.has_ip(ip),
                Err(_) => names.dns.iter().any(|d| d.eq_ignore_ascii_case(&self.name)),
            }
        });
        if !named {
            tracing::warn!(peer = %label, principal = %peer.principal(), "closing a peer link whose certificate has no subjectAltName for --peer-name {}: check the peer's --peer-cert-file", self.name);
            return Ok(());
        }
        let liveness = Arc::new(LastPong::default());
        let io = Heard::new(io, liveness.clone());
        let (hello, pending) = tether_link::read_hello(io, deadline, liveness)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let peer_id = match hello.metadata.get(metadata::SERVER_ID) {
            Some(id) if !id.is_empty() && id.len() <= MAX_AGENT_ID_BYTES => id.to_owned(),
            _ => {
                pending
                    .refuse(
                        Code::INVALID_ARGUMENT,
                        "a peer link's HELLO names its server ID",
                    )
                    .await;
                return Ok(());
            }
        };
        if peer_id == self.hub.server_id {
            // This server's own address among its peers': nothing to link.
            pending
                .refuse(Code::FAILED_PRECONDITION, super::ITSELF)
                .await;
            return Ok(());
        }
        // One link per peer: a second one (the peer reached through two of this server's
        // addresses, or its retry before this end saw a half-open link end at its
        // keepalive timeout) is refused, and the link held stays.
        if !self.links().insert(peer_id.clone()) {
            pending
                .refuse(Code::FAILED_PRECONDITION, super::ALREADY_LINKED)
                .await;
            return Ok(());
        }
        let _linked = Linked(&self, peer_id.clone());
        self.clone()
            .serve_link(peer_id, label, hello, pending)
            .await
    }

    /// Answers a peer's HELLO and runs its link until it ends.
    async fn serve_link<IO>(
        self: Arc<Self>,
        peer_id: String,
        label: String,
        hello: Hello,
        pending: tether_link::PendingLink<IO>,
    ) -> std::io::Result<()>
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let flow = self
            .settings
            .flow
            .negotiate(hello.metadata.get(metadata::TETHER_FLOW));
        let mut answer = Metadata::default();
        answer.push(metadata::SERVER_ID, self.hub.server_id.clone());
        answer.push(metadata::TETHER_VERSION, tether_observe::VERSION);
        if flow.is_credit() {
            let (key, value) = self.settings.flow.announce();
            answer.push(key, value);
        }
        let answer = Hello {
            version: hello.version.min(link::VERSION),
            capabilities: Vec::new(),
            metadata: answer,
        };
        let opened = pending
            .accept(&answer, None)
            .await
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let state = Arc::new(PeerState {
            hub: self.hub.clone(),
            peer_id: peer_id.as_str().into(),
            via: OnceLock::new(),
            remotes: Mutex::default(),
            next_stream_id: self.next_id.clone(),
            max_agents: self.max_agents,
            capped: std::sync::atomic::AtomicBool::new(false),
            listed: OnceLock::new(),
        });
        let session = Link::new(
            SessionConfig {
                role: Role::Server,
                flow,
                dial_timeout: self.settings.dial_timeout,
                close_timeout: CLOSE_TIMEOUT,
                limits: super::link_limits(),
                resumable: false,
                peering: true,
            },
            PeerHooks(state.clone()),
        );
        let via = Arc::new(ViaPeer::new(
            state.peer_id.clone(),
            session.clone(),
            Arc::new(Requests::default()),
        ));
        let _ = state.via.set(Arc::downgrade(&via));
        let listed = self.hub.peer_links.add(
            crate::peer_links::Direction::In,
            &peer_id,
            label.clone(),
            session.clone(),
            Some(via.clone()),
        );
        let _ = state.listed.set(listed.agents.clone());
        tracing::info!(peer.server = %LogText(&peer_id), peer = %label, "peer server linked: its agents can be dialed through it");
        let ended = async {
            self.stop.cancelled().await;
            TransportEnd::Final("server stopping".into())
        };
        let transport = Transport::native(opened.reader, opened.writer);
        let run = async {
            match self.settings.keepalive {
                Some(keepalive) => {
                    let (end, ()) = tokio::join!(
                        session.run_transport(transport, ended),
                        opened.handle.keep_alive(keepalive)
                    );
                    end
                }
                None => session.run_transport(transport, ended).await,
            }
        };
        let end = tokio::select! {
            end = run => end,
            () = state.follow_reloads() => TransportEnd::Final("server stopping".into()),
        };
        let reason = format!("the link to peer server {peer_id} ended: {}", end.reason());
        state.forget_all();
        drop(listed);
        session.close(&reason);
        via.routes().clear();
        tracing::info!(peer.server = %LogText(&peer_id), reason = %LogText(&reason), "peer server unlinked");
        Ok(())
    }
}

/// A peer's place in the links held, given back however the link's serving ends (an error,
/// a panic, the server stopping): a place left behind would refuse the peer for good.
struct Linked<'a>(&'a Inbound, String);

impl Drop for Linked<'_> {
    fn drop(&mut self) {
        self.0.links().remove(&self.1);
    }
}

/// One inbound link's agents and what its hooks need.
#[derive(Debug)]
struct PeerState {
    hub: Arc<Hub>,
    peer_id: Arc<str>,
    /// The link as dials see it; weak, since the link holds these hooks.
    via: OnceLock<Weak<ViaPeer>>,
    /// The agents the peer announced, by agent ID, and where each is placed.
    remotes: Mutex<HashMap<String, Remote>>,
    next_stream_id: Arc<AtomicU64>,
    /// `--max-agents`: the most agents one link may announce.
    max_agents: usize,
    /// Whether the cap was already logged on this link.
    capped: std::sync::atomic::AtomicBool,
    /// The link's agent count in the server's list of peer links.
    listed: OnceLock<Arc<std::sync::atomic::AtomicUsize>>,
}

/// An agent a peer announced, and where it is placed on this server now.
#[derive(Debug)]
struct Remote {
    announced: pb::PeerAgent,
    /// In its tenant's registry; `None` while this server's routing file lacks the tenant
    /// (it is placed once a generation has it).
    placed: Option<Arc<RemoteAgent>>,
}

impl PeerState {
    fn remotes(&self) -> MutexGuard<'_, HashMap<String, Remote>> {
        self.remotes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in what the peer announced: new or changed agents join their tenant's registry
    /// (an agent whose keys changed joins again, behind its own earlier stream), agents it
    /// no longer holds leave.
    fn apply(&self, update: PeerAgents) {
        let Some(via) = self.via.get().and_then(Weak::upgrade) else {
            return;
        };
        // Locked before the generation is read, as `follow_reloads` does: one of the two
        // places each agent in the generation in force.
        let mut remotes = self.remotes();
        let running = self.hub.running();
        for announced in update.up {
            if let Err(why) = check(&announced) {
                tracing::warn!(peer.server = %LogText(&self.peer_id), agent.id = %LogText(&announced.agent_id), "ignoring an agent the peer announced: {why}");
                continue;
            }
            if remotes.len() >= self.max_agents && !remotes.contains_key(&announced.agent_id) {
                if !self.capped.swap(true, Ordering::Relaxed) {
                    tracing::warn!(peer.server = %LogText(&self.peer_id), max_agents = self.max_agents, "the peer announces more agents than --max-agents: the rest are not dialed from here");
                }
                continue;
            }
            if let Some(known) = remotes.get_mut(&announced.agent_id)
                && let Some(placed) = &known.placed
                && *placed.tenant == *announced.tenant
                && placed.same_keys(&announced)
            {
                placed.announced_again(announced.draining);
                known.announced = announced;
                continue;
            }
            if let Some(old) = remotes.remove(&announced.agent_id).and_then(|r| r.placed) {
                forget(&running, &old);
            }
            let placed = self.place(&running, &announced, &via);
            remotes.insert(announced.agent_id.clone(), Remote { announced, placed });
        }
        for agent_id in update.down {
            if let Some(old) = remotes.remove(&agent_id).and_then(|r| r.placed) {
                forget(&running, &old);
            }
        }
        self.count(remotes.len());
    }

    /// Puts `announced` in its tenant's registry, if this generation has the tenant.
    fn place(
        &self,
        running: &Running,
        announced: &pb::PeerAgent,
        via: &Arc<ViaPeer>,
    ) -> Option<Arc<RemoteAgent>> {
        let Some(tenant) = running.tenants.named(&announced.tenant) else {
            tracing::warn!(peer.server = %LogText(&self.peer_id), agent.id = %LogText(&announced.agent_id), tenant = %LogText(&announced.tenant), "the peer holds an agent of a tenant this server's routing file does not have: it is dialed from here once a reload adds the tenant");
            return None;
        };
        let remote = Arc::new(RemoteAgent::new(
            announced,
            self.next_stream_id.fetch_add(1, Ordering::Relaxed),
            tenant.name.clone(),
            tenant.load.clone(),
            via.clone(),
            self.hub
                .audit
                .as_ref()
                .map(|a| Arc::new(a.for_tenant(&tenant.name))),
        ));
        tenant
            .registry()
            .add(Route::Remote(remote.clone()), &remote.identifiers);
        Some(remote)
    }

    fn count(&self, agents: usize) {
        if let Some(listed) = self.listed.get() {
            listed.store(agents, Ordering::Relaxed);
        }
        self.hub.peer_links.refresh_remote_agents();
    }

    /// Places the link's agents in every later generation: in a tenant it added, and again
    /// (with a new load record) in a tenant it removed and added back, whose registry starts
    /// empty. Returns only when the server no longer publishes generations (it stops).
    async fn follow_reloads(&self) {
        let mut generations = self.hub.generations();
        while generations.changed().await.is_ok() {
            let Some(via) = self.via.get().and_then(Weak::upgrade) else {
                return;
            };
            let mut remotes = self.remotes();
            let running = generations.borrow_and_update().clone();
            for remote in remotes.values_mut() {
                let tenant = running.tenants.named(&remote.announced.tenant);
                match (&remote.placed, tenant) {
                    (Some(placed), Some(tenant)) if placed.health.charges(&tenant.load) => {
                        let mut registry = tenant.registry();
                        if !registry.has_stream(&placed.agent_id, placed.stream_id) {
                            registry.add(Route::Remote(placed.clone()), &placed.identifiers);
                        }
                    }
                    (None, None) => {}
                    (placed, _) => {
                        if let Some(old) = placed {
                            forget(&running, old);
                        }
                        remote.placed = self.place(&running, &remote.announced, &via);
                    }
                }
            }
        }
    }

    /// Takes every agent of the link out of selection: the link ended.
    fn forget_all(&self) {
        let running = self.hub.running();
        for (_, remote) in self.remotes().drain() {
            if let Some(placed) = remote.placed {
                forget(&running, &placed);
            }
        }
        self.count(0);
    }
}

/// Takes `remote` out of its tenant's registry, wherever the tenant is now: in force, or
/// leaving after a reload removed it.
fn forget(running: &Running, remote: &RemoteAgent) {
    let registries = running
        .tenants
        .all()
        .map(|tenant| tenant.state())
        .chain(&running.leaving)
        .filter(|state| *state.name == *remote.tenant);
    for state in registries {
        state.registry().remove(&remote.agent_id, remote.stream_id);
    }
}

/// What a peer may announce: the bounds an agent's own stream is held to.
fn check(agent: &pb::PeerAgent) -> Result<(), String> {
    if agent.agent_id.is_empty() || agent.agent_id.len() > MAX_AGENT_ID_BYTES {
        return Err(format!(
            "an agent ID of {} bytes (1 to {MAX_AGENT_ID_BYTES})",
            agent.agent_id.len()
        ));
    }
    let identifiers = [&agent.hosts, &agent.ipv4, &agent.ipv6, &agent.cidrs];
    let count: usize = identifiers.iter().map(|values| values.len()).sum();
    let bytes: usize = identifiers
        .iter()
        .flat_map(|v| v.iter())
        .map(String::len)
        .sum();
    if count > MAX_IDENTIFIERS || bytes > MAX_IDENTIFIERS_BYTES {
        return Err(format!(
            "{count} identifiers of {bytes} bytes (at most {MAX_IDENTIFIERS} of {MAX_IDENTIFIERS_BYTES})"
        ));
    }
    for (what, value, max) in [
        ("tenant", &agent.tenant, crate::routing::MAX_NAME_BYTES),
        ("zone", &agent.zone, MAX_LABEL_VALUE),
        ("region", &agent.region, MAX_LABEL_VALUE),
        ("version", &agent.version, metadata::MAX_VERSION_BYTES),
    ] {
        if value.len() > max {
            return Err(format!("a {what} of {} bytes (at most {max})", value.len()));
        }
    }
    Ok(())
}

/// The hooks of an inbound peer link: announcements, and the outcomes of the dials this
/// server sent through it, charged to the agent each went to.
#[derive(Debug)]
struct PeerHooks(Arc<PeerState>);

impl Hooks for PeerHooks {
    fn on_event(&self, link: &Arc<Link>, event: Event) {
        let state = &self.0;
        let Some(via) = state.via.get().and_then(Weak::upgrade) else {
            return;
        };
        let m = &state.hub.metrics;
        match event {
            Event::PeerAgents(update) => state.apply(*update),
            Event::DialRequested { random, .. } => {
                // A reverse dial: peers never send one; dropping the dial refuses it.
                drop(link.incoming_dial(random));
            }
            Event::DialSettled {
                random,
                latency,
                result,
            } => {
                m.pending_dials.dec();
                // (the agent, whether its connection is open and counts in its load)
                let entry = {
                    let mut routes = via.routes();
                    match (&result, routes.get(&random).map(|e| e.ended)) {
                        (_, None) => None,
                        // Its end came first: nothing to count open.
                        (_, Some(true)) | (Err(_), _) => {
                            routes.remove(&random).map(|entry| (entry.agent, false))
                        }
                        (Ok(_), Some(false)) => routes.get_mut(&random).map(|entry| {
                            entry.opened = true;
                            (entry.agent.clone(), true)
                        }),
                    }
                };
                let Some((remote, open)) = entry else {
                    return;
                };
                remote.health.dial_finished();
                // The holder's own refusals (its tenant limits, policy, a route it no longer
                // has) say nothing of the agent's health.
                let refused = matches!(&result, Err(DialError::Endpoint(text)) if text.starts_with(super::REFUSED_BY_HOLDER));
                if !refused {
                    crate::backend::session::judge(
                        &remote.health,
                        &state.hub.running().ejection,
                        state.hub.selection_metrics(),
                        &remote.agent_id,
                        result.as_ref().err(),
                    );
                }
                match &result {
                    Ok(id) => {
                        if open {
                            remote.health.connection_opened();
                        }
                        if let Some(audit) = &remote.audit {
                            via.requests.answered(random, latency, |followed| {
                                audit.opened(followed, &remote.agent_id, *id);
                            });
                        }
                    }
                    Err(error) => {
                        let followed = via.requests.remove(random);
                        let error = crate::error::DialError::from(error.clone());
                        if let (Some(audit), Some(followed)) = (&remote.audit, followed) {
                            audit.failed(&followed.request, &remote.agent_id, latency, &error);
                        }
                    }
                }
                m.dial_settled(latency, &result);
            }
            Event::Opened(_) => m.connection_opened(),
            Event::Ended(ended) => {
                m.connection_ended(&ended);
                let agent = {
                    let mut routes = via.routes();
                    match routes.get_mut(&ended.dial_id) {
                        Some(entry) if entry.opened => {
                            entry.agent.health.connection_ended();
                            routes.remove(&ended.dial_id).map(|entry| entry.agent)
                        }
                        // Before its answer was handled: the answer settles it.
                        Some(entry) => {
                            entry.ended = true;
                            Some(entry.agent.clone())
                        }
                        None => None,
                    }
                };
                let followed = via.requests.remove(ended.dial_id);
                if let Some(agent) = agent {
                    if let (Some(audit), Some(followed)) = (&agent.audit, followed) {
                        if !followed.opened {
                            audit.opened(&followed, &agent.agent_id, ended.id);
                        }
                        audit.connection(&followed, &agent.agent_id, &ended, None);
                    }
                    tether_tunnel::log_ended(&ended, &agent.agent_id, &state.hub.server_id);
                }
            }
            Event::StrayDialResponse { random } => {
                tracing::debug!(peer.server = %LogText(&state.peer_id), dial.id = %random, "answer to a forwarded dial nobody waits for");
                m.dial_failure(DialFailure::UnrecognizedResponse);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_announces_within_an_agent_stream_s_bounds() {
        let agent = |f: fn(&mut pb::PeerAgent)| {
            let mut a = pb::PeerAgent {
                agent_id: "node-1".into(),
                tenant: "blue".into(),
                ..Default::default()
            };
            f(&mut a);
            a
        };
        assert!(check(&agent(|_| {})).is_ok());
        for (bad, want) in [
            (agent(|a| a.agent_id.clear()), "agent ID"),
            (agent(|a| a.agent_id = "n".repeat(254)), "agent ID"),
            (agent(|a| a.hosts = vec!["h".into(); 65]), "identifiers"),
            (agent(|a| a.ipv4 = vec!["1".repeat(4097)]), "identifiers"),
            (agent(|a| a.tenant = "t".repeat(64)), "tenant"),
            (agent(|a| a.zone = "z".repeat(64)), "zone"),
            (agent(|a| a.version = "v".repeat(65)), "version"),
        ] {
            let error = check(&bad).unwrap_err();
            assert!(error.contains(want), "{error}");
        }
    }
}
