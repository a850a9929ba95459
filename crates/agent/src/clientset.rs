//! Holding streams to every proxy server, through one address (`balancer`) or one to each
//! discovered address (`discovered`); letting go of servers whose Lease expired; and each
//! stream's life across the transports it is resumed on. What is held and what to do about
//! it is decided by `server_set`; this module connects, runs the streams' tasks and acts.

mod balancer;
mod discovered;
mod server_set;

use tether_observe::audit::AuditLog;
use tether_observe::time::monotonic_now;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tether_tunnel::{ResumeFailure, TransportEnd};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Config;
use crate::connect::{ConnectError, Connected, ServerConn};
use crate::destination::Destinations;
use crate::discovery::Discovery;
use crate::metrics::AgentMetrics;
use crate::server_count::ServerLeases;
use crate::session::ServerSession;
use server_set::{Added, Gone, Opened, Rules, Serial, ServerSet};

/// How long connecting to a server (TCP, TLS, HTTP/2, response headers) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping agent waits for its sessions to end.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a server whose Lease expired keeps its stream after being told this agent is
/// draining, for the connections still on it to finish.
const DISMISS_GRACE: Duration = Duration::from_secs(30);
/// Duplicates in a row, per server wanted, that are retried at the sync interval; beyond
/// them the interval backs off, so that a counted server that cannot be reached (its Lease
/// still valid after a crash) does not keep the agent dialing the balancer at full pace.
const DUPLICATES_PER_SERVER: usize = 3;

/// The agent's server connections.
#[derive(Debug)]
pub(crate) struct ClientSet {
    config: Config,
    metrics: Arc<AgentMetrics>,
    destinations: Arc<Destinations>,
    audit: Option<AuditLog>,
    servers: Mutex<Servers>,
    /// Bumped whenever a stream was added, broke or ended: wakes the sync loops.
    changes: watch::Sender<u64>,
}

/// What is known of the servers and, per server ID the set holds a stream for, what reaches
/// that stream and its task: under one lock, so that the two always agree.
#[derive(Debug)]
struct Servers {
    set: ServerSet,
    streams: HashMap<String, Handles>,
}

/// A held stream's session, the token that lets go of it, and where a new transport for it
/// goes (resumable streams only).
#[derive(Debug)]
struct Handles {
    session: Arc<ServerSession>,
    dismiss: CancellationToken,
    handover: Option<mpsc::Sender<Resume>>,
}

impl Servers {
    /// Tells the task of a stream the set let go of.
    fn dismiss(&self, server_id: &str) {
        if let Some(handles) = self.streams.get(server_id) {
            handles.dismiss.cancel();
        }
    }
}

/// What the sync loop found for a suspended stream.
#[derive(Debug)]
enum Resume {
    /// The server continues the stream on this new transport (boxed: it is large, and
    /// there is one per resume).
    Transport(Box<Connected>),
    /// The server no longer knows it: it restarted, or was replaced.
    Gone(String),
}

impl ClientSet {
    pub(crate) fn new(
        config: Config,
        metrics: Arc<AgentMetrics>,
        destinations: Arc<Destinations>,
        audit: Option<AuditLog>,
    ) -> Self {
        let set = ServerSet::new(Rules {
            agent_id: config.agent_id.clone(),
            through_balancer: config.discovery == Discovery::Balancer,
            server_connections: config.server_connections,
            count_source: config.lease_counting.as_ref().map(|c| c.source),
        });
        Self {
            config,
            metrics,
            destinations,
            audit,
            servers: Mutex::new(Servers {
                set,
                streams: HashMap::new(),
            }),
            changes: watch::Sender::new(0),
        }
    }

    fn servers(&self) -> MutexGuard<'_, Servers> {
        self.servers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest Lease reading, when counting by Lease.
    fn leases(&self) -> Option<ServerLeases> {
        self.config
            .lease_counting
            .as_ref()
            .and_then(|c| c.leases.borrow().clone())
    }

    /// How many servers to hold streams to now.
    pub(crate) fn target(&self) -> usize {
        let leases = self.leases();
        self.servers().set.target(leases.as_ref(), monotonic_now())
    }

    /// Whether every counted server is connected (streams being let go of not included; a
    /// stream handed its resumed transport is).
    pub(crate) fn satisfied(&self) -> bool {
        let leases = self.leases();
        self.servers()
            .set
            .satisfied(leases.as_ref(), monotonic_now())
    }

    /// Lets go of servers whose Lease has not counted for a while as long as more streams
    /// than the count are held: each is told this agent is draining, and its stream ends
    /// once its connections did (or after [`DISMISS_GRACE`]).
    fn dismiss_surplus(&self) {
        let Some(leases) = self.leases() else {
            return;
        };
        let mut servers = self.servers();
        for id in servers.set.dismiss_surplus(&leases, monotonic_now()) {
            tracing::info!(server.id = %id, "letting go of a server whose Lease no longer counts");
            servers.dismiss(&id);
        }
    }

    pub(crate) fn agent_id(&self) -> &str {
        &self.config.agent_id
    }

    /// The destination dialer, for the policy file's state in `/debug/agents`.
    pub(crate) fn destinations(&self) -> &Destinations {
        &self.destinations
    }

    /// Servers currently connected (suspended streams are not).
    pub(crate) fn connected(&self) -> usize {
        self.servers().set.connected()
    }

    /// The current server sessions, each with the discovered address it was opened to, for
    /// introspection.
    pub(crate) fn session_list(&self) -> Vec<(Arc<ServerSession>, Option<SocketAddr>)> {
        let servers = self.servers();
        servers
            .streams
            .iter()
            .map(|(id, handles)| (handles.session.clone(), servers.set.endpoint(id)))
            .collect()
    }

    /// The stream to carry a reverse dial on: among servers that accepted reverse dials and
    /// are not being let go of, the one with the fewest connections.
    fn reverse_session(&self) -> Option<Arc<ServerSession>> {
        let servers = self.servers();
        servers
            .set
            .reverse_candidates()
            .filter_map(|id| servers.streams.get(id))
            .min_by_key(|handles| handles.session.link.inspect(|s| s.connection_count()))
            .map(|handles| handles.session.clone())
    }

    /// A stream to carry a reverse dial on, waiting for one at most `--resume-window` while
    /// one may come ([`ServerSet::reverse_may_come`]: a resume under way, the first
    /// connection), so that a connection made during a brief break is carried, not refused.
    pub(crate) async fn wait_for_reverse_session(&self) -> Option<Arc<ServerSession>> {
        let deadline = tokio::time::Instant::now() + self.config.resume_window;
        // Subscribed before looking, so that no change between the two is missed.
        let mut changes = self.changes.subscribe();
        loop {
            if let Some(session) = self.reverse_session() {
                return Some(session);
            }
            if !self.servers().set.reverse_may_come() {
                return None;
            }
            match tokio::time::timeout_at(deadline, changes.changed()).await {
                Ok(Ok(())) => {}
                _ => return None,
            }
        }
    }

    /// `--agent-identifiers`, as sent.
    pub(crate) fn identifiers(&self) -> &str {
        &self.config.identifiers
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.servers().set.is_draining()
    }

    /// The last server count a server announced.
    pub(crate) fn server_count(&self) -> usize {
        self.servers().set.server_count()
    }

    /// Holds streams to the servers until `stop`: through one address until enough are
    /// held, or one to each discovered address.
    pub(crate) async fn run(self: &Arc<Self>, drain: CancellationToken, stop: CancellationToken) {
        let tasks = TaskTracker::new();
        match self.config.discovery {
            Discovery::Balancer => self.run_balancer(&tasks, drain, &stop).await,
            _ => self.run_discovered(&tasks, drain, &stop).await,
        }
        tasks.close();
        if tokio::time::timeout(STOP_TIMEOUT, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!("server sessions did not end in time");
        }
    }

    fn start_draining(&self) {
        {
            let mut servers = self.servers();
            servers.set.start_draining();
            for handles in servers.streams.values() {
                handles.session.drain();
            }
        }
        let open = self.open_connections();
        tracing::info!(
            open,
            "{}",
            crate::drain::announcement(open, self.config.drain_timeout)
        );
    }

    /// Connections and pending dials on every server stream: what a draining agent waits
    /// for.
    pub(crate) fn open_connections(&self) -> usize {
        self.servers()
            .streams
            .values()
            .map(|handles| {
                handles
                    .session
                    .link
                    .inspect(|s| s.connection_count() + s.pending_dial_count())
            })
            .sum()
    }

    fn address(&self) -> String {
        format!("{}:{}", self.config.server_host, self.config.server_port)
    }

    /// Registers a new stream unless its server is already connected (false for a
    /// duplicate), or hands it to the suspended stream it resumes. `endpoint` is the
    /// discovered address it was opened to.
    fn add(
        self: &Arc<Self>,
        connected: Connected,
        endpoint: Option<SocketAddr>,
        tasks: &TaskTracker,
        stop: &CancellationToken,
    ) -> bool {
        self.servers().set.announced(connected.answer.server_count);
        self.metrics.known_server_count.set(self.target() as i64);
        let Some(connected) = self.resume_suspended(connected, endpoint) else {
            self.note_change();
            return true;
        };
        let flow = self
            .config
            .flow
            .negotiate(connected.answer.server_flow.as_deref());
        let credit = flow.is_credit();
        let server_id = connected.answer.server_id.clone();
        let session = Arc::new(ServerSession::new(
            &self.config.agent_id,
            server_id.clone(),
            flow,
            self.metrics.clone(),
            self.destinations.clone(),
            self.config.dial_timeout,
            connected.server.liveness(),
            connected.server.transport_name(),
            self.audit.clone(),
            connected.answer.resume_token.clone().filter(|_| credit),
            connected.answer.server_version.clone(),
        ));
        let dismiss = CancellationToken::new();
        let (handover, resumes) = mpsc::channel(1);
        let (serial, draining) = {
            let mut servers = self.servers();
            let serial = match servers.set.add(&connected.answer, endpoint, credit) {
                Added::Held(serial) => serial,
                Added::Duplicate => {
                    drop(servers);
                    tracing::debug!(server.id = %server_id, "already connected to this server; closing the duplicate");
                    connected.transport.abort();
                    return false;
                }
                Added::Undiscovered => {
                    drop(servers);
                    tracing::info!(server.id = %server_id, "discovery no longer finds the address this stream was opened to; closing it");
                    connected.transport.abort();
                    return false;
                }
            };
            servers.streams.insert(
                server_id.clone(),
                Handles {
                    session: session.clone(),
                    dismiss: dismiss.clone(),
                    handover: session.resume_token.is_some().then_some(handover),
                },
            );
            (serial, servers.set.is_draining())
        };
        self.note_change();
        self.metrics.open_server_connections.inc();
        self.start_keepalive(&connected.server, credit);
        if draining {
            session.drain();
        }
        tracing::info!(server.id = %server_id, server.count = connected.answer.server_count, transport = connected.server.transport_name(), credit, reverse = connected.answer.reverse, resumable = session.resume_token.is_some(), "connected to proxy server");
        if self.config.control_plane.is_some() && !connected.answer.reverse {
            // Once per server stream: the listener carries nothing through this server.
            tracing::warn!(
                server.id = %server_id,
                "this proxy server does not accept control-plane connections (an upstream proxy-server, or a tether server without --control-plane-endpoints): --control-plane-listen is off through it"
            );
        }
        let span = tracing::info_span!("server", server.id = %server_id);
        tasks.spawn(
            self.clone()
                .hold(session, serial, connected, dismiss, resumes, stop.clone())
                .instrument(span),
        );
        true
    }

    /// A new stream from a server whose stream is suspended: hands it over when the server
    /// resumed that stream, closes it when the server resumed one the agent no longer
    /// holds, and otherwise ends the suspended streams it shows are gone (the same server
    /// ID without the stream: it restarted; the only server, under another ID: it was
    /// replaced). Gives the stream back when it is a new one.
    fn resume_suspended(
        &self,
        connected: Connected,
        endpoint: Option<SocketAddr>,
    ) -> Option<Connected> {
        let mut servers = self.servers();
        let gone = match servers.set.opened(&connected.answer, endpoint) {
            Opened::Resumes => {
                let handover = servers
                    .streams
                    .get(&connected.answer.server_id)
                    .and_then(|handles| handles.handover.clone());
                drop(servers);
                // A full or closed hand-over means the stream's task is ending; the
                // transport is dropped with the message and the next sync starts anew.
                if let Some(handover) = handover {
                    let _ = handover.try_send(Resume::Transport(Box::new(connected)));
                }
                return None;
            }
            Opened::Stale => {
                drop(servers);
                tracing::info!(server.id = %connected.answer.server_id, "the proxy server resumed a stream this agent no longer holds (it ended while the resume was under way); closing it and connecting anew");
                connected.transport.abort();
                return None;
            }
            Opened::Own(gone) => gone,
        };
        for gone in gone {
            let (handover, why) = match gone {
                // Its task ends it; the new stream takes its place at once.
                Gone::Restarted(id) => (
                    servers.streams.remove(&id).and_then(|h| h.handover),
                    "the proxy server no longer knows this stream (it restarted)".to_owned(),
                ),
                Gone::Replaced(id) => {
                    let at = endpoint.map_or_else(
                        || "the only proxy server".to_owned(),
                        |e| format!("the proxy server at {e}"),
                    );
                    let why = format!(
                        "{at} is now {} (server {id} is gone)",
                        connected.answer.server_id
                    );
                    (
                        servers.streams.get(&id).and_then(|h| h.handover.clone()),
                        why,
                    )
                }
            };
            if let Some(handover) = handover {
                let _ = handover.try_send(Resume::Gone(why));
            }
        }
        Some(connected)
    }

    fn start_keepalive(&self, server: &ServerConn, credit: bool) {
        let keepalive = if credit {
            self.config.keepalive
        } else {
            self.config.legacy_keepalive
        };
        if let Some(k) = keepalive {
            server.start_keepalive(k);
        }
    }

    /// Marks a stream suspended or not, if it is still this set's stream for its server.
    fn set_suspended(&self, server_id: &str, serial: Serial, suspended: bool) {
        self.servers()
            .set
            .set_suspended(server_id, serial, suspended);
        self.note_change();
    }

    /// Wakes the sync loops: a stream was added, broke or ended.
    fn note_change(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Owns one server stream across the transports it runs on, until it ends for good.
    async fn hold(
        self: Arc<Self>,
        session: Arc<ServerSession>,
        serial: Serial,
        connected: Connected,
        dismiss: CancellationToken,
        mut resumes: mpsc::Receiver<Resume>,
        stop: CancellationToken,
    ) {
        let Connected {
            mut server,
            mut transport,
            ..
        } = connected;
        let metrics = &self.metrics.resume;
        let window = self.config.resume_window;
        let reason = loop {
            let dismissed = async {
                dismiss.cancelled().await;
                session.drain();
                let idle = async {
                    while !session.is_idle() {
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                };
                let _ = tokio::time::timeout(DISMISS_GRACE, idle).await;
            };
            let ended = async {
                tokio::select! {
                    reason = server.closed() => TransportEnd::Broken(reason),
                    () = stop.cancelled() => TransportEnd::Final("agent stopping".to_owned()),
                    () = dismissed => TransportEnd::Final("its Lease no longer counts".to_owned()),
                }
            };
            let end = session.link.run_transport(transport, ended).await;
            let TransportEnd::Broken(why) = end else {
                break end.reason().to_owned();
            };
            if stop.is_cancelled() || dismiss.is_cancelled() {
                break why;
            }
            let Some(suspension) = session.link.suspend(window, metrics) else {
                break why;
            };
            self.set_suspended(&session.server_id, serial, true);
            self.metrics.open_server_connections.dec();
            tracing::info!(%why, ?window, "server stream broke; reconnecting to resume it");
            let next = session
                .link
                .wait_resumed(async {
                    tokio::select! {
                        () = stop.cancelled() => None,
                        // Its server left discovery or lost its Lease: nothing to wait for.
                        () = dismiss.cancelled() => None,
                        next = resumes.recv() => next,
                    }
                })
                .await
                .flatten();
            let resumed = match next {
                Some(Resume::Transport(resumed)) => resumed,
                Some(Resume::Gone(gone)) => {
                    metrics.failed(ResumeFailure::Unknown);
                    break format!("{gone}; the stream broke: {why}");
                }
                None if stop.is_cancelled() => {
                    metrics.failed(ResumeFailure::Stopping);
                    break format!("agent stopping while the stream was suspended ({why})");
                }
                None if dismiss.is_cancelled() => {
                    metrics.failed(ResumeFailure::Unknown);
                    break format!(
                        "its server is gone from discovery or its Lease expired while the stream was suspended ({why})"
                    );
                }
                None => {
                    metrics.failed(ResumeFailure::WindowExpired);
                    break format!("not resumed within --resume-window {window:?} ({why})");
                }
            };
            let server_received = resumed.answer.resumed.unwrap_or(0);
            if let Err(e) = session.link.resume(server_received, suspension, metrics) {
                metrics.failed(ResumeFailure::BadSequence);
                resumed.transport.abort();
                break format!("cannot resume: {e}");
            }
            session.keepalive.replace(resumed.server.liveness());
            session.set_transport(resumed.server.transport_name());
            self.start_keepalive(&resumed.server, true);
            let resumed = *resumed;
            (server, transport) = (resumed.server, resumed.transport);
            self.set_suspended(&session.server_id, serial, false);
            self.metrics.open_server_connections.inc();
            tracing::info!("server stream resumed");
        };
        session.close(&reason).await;
        tracing::info!(%reason, "disconnected from proxy server");
        {
            let mut servers = self.servers();
            if let Some(ended) = servers.set.ended(&session.server_id, serial) {
                servers.streams.remove(&session.server_id);
                if !ended.is_suspended() {
                    self.metrics.open_server_connections.dec();
                }
            }
        }
        self.note_change();
    }

    /// Connects (to `endpoint`, or through the balancer) and opens a stream, asking to
    /// resume the suspended streams opened the same way. The connection's driver runs on
    /// `tasks`, so stopping the agent waits for it too.
    async fn connect_once(
        &self,
        tasks: &TaskTracker,
        endpoint: Option<SocketAddr>,
    ) -> Result<Connected, ConnectError> {
        let deadline = tokio::time::Instant::now() + CONNECT_TIMEOUT;
        let resume_from: Vec<(String, u64)> = {
            let servers = self.servers();
            servers
                .set
                .resumable_at(endpoint)
                .filter_map(|(id, token)| {
                    let point = servers.streams.get(id)?.session.link.resume_point()?;
                    Some((token.to_owned(), point))
                })
                .collect()
        };
        let attempt =
            crate::connect::connect(&self.config, endpoint, &resume_from, tasks, deadline);
        tokio::time::timeout_at(deadline, attempt)
            .await
            .map_err(|_| ConnectError::Timeout(CONNECT_TIMEOUT))?
    }
}

/// Resolves when the Lease reading changes; never without Lease counting.
async fn lease_changed(
    updates: &mut Option<tokio::sync::watch::Receiver<Option<ServerLeases>>>,
) -> Result<(), tokio::sync::watch::error::RecvError> {
    match updates {
        Some(updates) => updates.changed().await,
        None => std::future::pending().await,
    }
}

/// `d` plus up to 10 % (upstream's jitter), so many agents do not reconnect in lockstep.
fn jitter(d: Duration) -> Duration {
    d + d.mul_f64((tether_proto::random_u64() % 1000) as f64 / 10_000.0)
}

async fn sleep(d: Duration) {
    if d == Duration::MAX {
        std::future::pending::<()>().await;
    } else {
        tokio::time::sleep(d).await;
    }
}
