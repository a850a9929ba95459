//! Links from peer servers that offer their agents: the accepting side of server peering.
//! Each link's agents join this server's registries as remote routes, under the tenants
//! their server admitted them to; the dials this server sends them go over the link, and
//! end with an explicit error when the link does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tether_conn::{Heard, Keepalive, LastPong, LogText};
use tether_grpc::Code;
use tether_proto::link::{self, Hello};
use tether_proto::metadata::{self, Metadata};
use tether_proto::{PeerAgents, pb};
use tether_tunnel::{
    Event, FlowConfig, Hooks, Limits, Link, Role, SessionConfig, Transport, TransportEnd,
};
use tokio_util::sync::CancellationToken;

use super::PEER_ALPN;
use crate::backend::admission::{MAX_AGENT_ID_BYTES, MAX_IDENTIFIERS};
use crate::backend::remote::{REMOTE_STREAM_BASE, RemoteAgent, ViaPeer};
use crate::backend::route::Route;
use crate::backend::service::CLOSE_TIMEOUT;
use crate::dial::Hub;
use crate::limits::{LimitMetrics, SlotAdmission};
use crate::metrics::DialFailure;
use crate::net;
use crate::request::Requests;

/// What every inbound peer link shares.
#[derive(Debug)]
pub(crate) struct Inbound {
    pub(crate) hub: Arc<Hub>,
    /// `--peer-name`: the name every peer's certificate must carry.
    pub(crate) name: String,
    pub(crate) flow: FlowConfig,
    pub(crate) keepalive: Option<Keepalive>,
    /// `--backend-dial-timeout`: how long a forwarded dial waits for the peer's answer.
    pub(crate) dial_timeout: Duration,
    pub(crate) limit_metrics: LimitMetrics,
    /// Ends every link when the server stops.
    pub(crate) stop: CancellationToken,
    /// The link each peer server holds now, by server ID (with a number of its own): a
    /// newer one replaces it.
    links: Mutex<HashMap<String, (u64, CancellationToken)>>,
    /// Numbers links, and gives remote agents their stream IDs.
    next_id: Arc<AtomicU64>,
}

impl Inbound {
    pub(crate) fn new(
        hub: Arc<Hub>,
        name: String,
        flow: FlowConfig,
        keepalive: Option<Keepalive>,
        dial_timeout: Duration,
        limit_metrics: LimitMetrics,
        stop: CancellationToken,
    ) -> Self {
        Self {
            hub,
            name,
            flow,
            keepalive,
            dial_timeout,
            limit_metrics,
            stop,
            links: Mutex::default(),
            next_id: Arc::new(AtomicU64::new(REMOTE_STREAM_BASE)),
        }
    }

    fn links(&self) -> MutexGuard<'_, HashMap<String, (u64, CancellationToken)>> {
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
        if !peer
            .certificate
            .as_ref()
            .is_some_and(|names| names.has_name(&self.name))
        {
            tracing::warn!(peer = %label, principal = %peer.principal(), "closing a peer link whose certificate does not name --peer-name {}: check the peer's --peer-cert-file", self.name);
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
        let flow = self
            .flow
            .negotiate(hello.metadata.get(metadata::TETHER_FLOW));
        let mut answer = Metadata::default();
        answer.push(metadata::SERVER_ID, self.hub.server_id.clone());
        answer.push(metadata::TETHER_VERSION, tether_observe::VERSION);
        if flow.is_credit() {
            let (key, value) = self.flow.announce();
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
        let replaced = self.stop.child_token();
        let number = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Some((_, older)) = self
            .links()
            .insert(peer_id.clone(), (number, replaced.clone()))
        {
            older.cancel();
        }
        let state = Arc::new(PeerState {
            hub: self.hub.clone(),
            peer_id: peer_id.as_str().into(),
            via: OnceLock::new(),
            remotes: Mutex::default(),
            next_stream_id: self.next_id.clone(),
            listed: OnceLock::new(),
        });
        let session = Link::new(
            SessionConfig {
                role: Role::Server,
                flow,
                dial_timeout: self.dial_timeout,
                close_timeout: CLOSE_TIMEOUT,
                limits: Limits::default(),
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
            tokio::select! {
                () = self.stop.cancelled() => TransportEnd::Final("server stopping".into()),
                () = replaced.cancelled() => TransportEnd::Final("a newer link from the same peer server replaced it".into()),
            }
        };
        let transport = Transport::native(opened.reader, opened.writer);
        let run = async {
            match self.keepalive {
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
        {
            let mut links = self.links();
            if links.get(&peer_id).is_some_and(|(n, _)| *n == number) {
                links.remove(&peer_id);
            }
        }
        tracing::info!(peer.server = %LogText(&peer_id), %reason, "peer server unlinked");
        Ok(())
    }
}

/// One inbound link's agents and what its hooks need.
#[derive(Debug)]
struct PeerState {
    hub: Arc<Hub>,
    peer_id: Arc<str>,
    /// The link as dials see it; weak, since the link holds these hooks.
    via: OnceLock<Weak<ViaPeer>>,
    /// The agents the peer announced, by agent ID, as registered.
    remotes: Mutex<HashMap<String, Arc<RemoteAgent>>>,
    next_stream_id: Arc<AtomicU64>,
    /// The link's agent count in the server's list of peer links.
    listed: OnceLock<Arc<std::sync::atomic::AtomicUsize>>,
}

impl PeerState {
    fn remotes(&self) -> MutexGuard<'_, HashMap<String, Arc<RemoteAgent>>> {
        self.remotes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes in what the peer announced: new or changed agents join their tenant's registry
    /// (an agent whose keys changed joins again, behind its own earlier stream), agents it
    /// no longer holds leave.
    fn apply(&self, update: PeerAgents) {
        let Some(via) = self.via.get().and_then(Weak::upgrade) else {
            return;
        };
        let running = self.hub.running();
        let mut remotes = self.remotes();
        for announced in update.up {
            if let Err(why) = check(&announced) {
                tracing::warn!(peer.server = %LogText(&self.peer_id), agent.id = %LogText(&announced.agent_id), "ignoring an agent the peer announced: {why}");
                continue;
            }
            if let Some(known) = remotes.get(&announced.agent_id)
                && *known.tenant == *announced.tenant
                && known.same_keys(&announced)
            {
                known.set_draining(announced.draining);
                continue;
            }
            if let Some(old) = remotes.remove(&announced.agent_id) {
                forget(&running, &old);
            }
            let Some(tenant) = running.tenants.named(&announced.tenant) else {
                tracing::warn!(peer.server = %LogText(&self.peer_id), agent.id = %LogText(&announced.agent_id), tenant = %LogText(&announced.tenant), "the peer holds an agent of a tenant this server's routing file does not have: it is not dialed from here");
                continue;
            };
            let remote = Arc::new(RemoteAgent::new(
                &announced,
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
            remotes.insert(announced.agent_id, remote);
        }
        for agent_id in update.down {
            if let Some(old) = remotes.remove(&agent_id) {
                forget(&running, &old);
            }
        }
        self.count(remotes.len());
    }

    fn count(&self, agents: usize) {
        if let Some(listed) = self.listed.get() {
            listed.store(agents, Ordering::Relaxed);
        }
        self.hub.peer_links.refresh_remote_agents();
    }

    /// Puts the link's agents back into the registries of every later generation: a reload
    /// that removed a tenant and added it again starts it with an empty registry. Returns
    /// only when the server no longer publishes generations (it is going away).
    async fn follow_reloads(&self) {
        let mut generations = self.hub.generations();
        while generations.changed().await.is_ok() {
            let running = generations.borrow_and_update().clone();
            for remote in self.remotes().values() {
                let Some(tenant) = running.tenants.named(&remote.tenant) else {
                    continue;
                };
                let mut registry = tenant.registry();
                if !registry.has_stream(&remote.agent_id, remote.stream_id) {
                    registry.add(Route::Remote(remote.clone()), &remote.identifiers);
                }
            }
        }
    }

    /// Takes every agent of the link out of selection: the link ended.
    fn forget_all(&self) {
        let running = self.hub.running();
        for (_, remote) in self.remotes().drain() {
            forget(&running, &remote);
        }
        self.count(0);
    }
}

/// Takes `remote` out of its tenant's registry.
fn forget(running: &crate::running::Running, remote: &RemoteAgent) {
    if let Some(tenant) = running.tenants.named(&remote.tenant) {
        tenant.registry().remove(&remote.agent_id, remote.stream_id);
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
    let identifiers = agent.hosts.len() + agent.ipv4.len() + agent.ipv6.len() + agent.cidrs.len();
    if identifiers > MAX_IDENTIFIERS {
        return Err(format!(
            "{identifiers} identifiers (at most {MAX_IDENTIFIERS})"
        ));
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
                let entry = {
                    let mut routes = via.routes();
                    match &result {
                        Ok(_) => routes.get_mut(&random).map(|entry| {
                            entry.opened = true;
                            entry.agent.clone()
                        }),
                        Err(_) => routes.remove(&random).map(|entry| entry.agent),
                    }
                };
                let Some(remote) = entry else {
                    return;
                };
                remote.health.dial_finished();
                crate::backend::session::judge(
                    &remote.health,
                    &state.hub.running().ejection,
                    state.hub.selection_metrics(),
                    &remote.agent_id,
                    result.as_ref().err(),
                );
                match &result {
                    Ok(id) => {
                        remote.health.connection_opened();
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
            Event::Opened(_) => m.established.inc(),
            Event::Ended(ended) => {
                m.connection_ended(&ended);
                let entry = via.routes().remove(&ended.dial_id);
                let followed = via.requests.remove(ended.dial_id);
                if let Some(entry) = entry {
                    if entry.opened {
                        entry.agent.health.connection_ended();
                    }
                    if let (Some(audit), Some(followed)) = (&entry.agent.audit, followed) {
                        if !followed.opened {
                            audit.opened(&followed, &entry.agent.agent_id, ended.id);
                        }
                        audit.connection(&followed, &entry.agent.agent_id, &ended, None);
                    }
                    tether_tunnel::log_ended(&ended, &entry.agent.agent_id, &state.hub.server_id);
                }
            }
            Event::StrayDialResponse { random } => {
                tracing::debug!(peer.server = %state.peer_id, dial.id = %random, "answer to a forwarded dial nobody waits for");
                m.dial_failure(DialFailure::UnrecognizedResponse);
            }
            _ => {}
        }
    }
}
