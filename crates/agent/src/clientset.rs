//! Holding streams to every proxy server, through one address (`balancer`) or one to each
//! discovered address (`discovered`); letting go of servers whose Lease expired; and each
//! stream's life across the transports it is resumed on.

mod balancer;
mod discovered;

use tether_observe::audit::AuditLog;
use tether_observe::time::monotonic_now;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use std::time::Instant;

use tether_tunnel::{ResumeFailure, TransportEnd};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Config;
use crate::connect::{ConnectError, Connected, ServerConn};
use crate::destination::Destinations;
use crate::discovery::{Discovery, Endpoints};
use crate::metrics::AgentMetrics;
use crate::server_count::{self, ServerLeases, Uncounted};
use crate::session::ServerSession;

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
    sessions: Mutex<HashMap<String, Held>>,
    /// The last `servercount` a server announced; 0 counts as 1, as upstream.
    server_count: AtomicUsize,
    draining: AtomicBool,
    /// Connected servers beyond the count without a valid Lease, and since when.
    uncounted: Mutex<Uncounted>,
    /// Bumped whenever a stream was added, broke or ended: wakes the sync loops.
    changes: watch::Sender<u64>,
    /// The servers' addresses as discovery last found them (empty with a balancer).
    endpoints: watch::Sender<Endpoints>,
    /// Discovered addresses whose stream turned out to be a server already held through
    /// another address (one server, two addresses: IPv4 and IPv6), and that server's ID.
    aliases: Mutex<HashMap<SocketAddr, String>>,
    /// With `--agent-server-connections`: addresses that could not be reached, passed
    /// over until then.
    passed_over: Mutex<HashMap<SocketAddr, Instant>>,
}

/// A server stream, and the token that lets go of it when its server's Lease expired.
#[derive(Debug)]
struct Held {
    session: Arc<ServerSession>,
    dismiss: CancellationToken,
    /// Where a new transport for a resumable stream goes.
    handover: Option<mpsc::Sender<Resume>>,
    /// The stream's transport broke; it waits to be resumed (not counted as connected).
    suspended: bool,
    /// A suspended stream was handed a resumed transport that its task has not taken yet.
    resuming: bool,
    /// The discovered address the stream was opened to; `None` through a balancer.
    endpoint: Option<SocketAddr>,
}

impl Held {
    /// Has a working transport, or is being handed one, and is not being let go of.
    fn is_live(&self) -> bool {
        !self.dismiss.is_cancelled() && (!self.suspended || self.resuming)
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
        Self {
            config,
            metrics,
            destinations,
            audit,
            sessions: Mutex::new(HashMap::new()),
            server_count: AtomicUsize::new(1),
            draining: AtomicBool::new(false),
            uncounted: Mutex::new(Uncounted::default()),
            changes: watch::Sender::new(0),
            endpoints: watch::Sender::new(Endpoints::new()),
            aliases: Mutex::new(HashMap::new()),
            passed_over: Mutex::new(HashMap::new()),
        }
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, Held>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
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
        if self.config.discovery != Discovery::Balancer {
            return self.discovered_target();
        }
        let count = server_count::target(
            self.config.lease_counting.as_ref().map(|c| c.source),
            self.leases().as_ref(),
            self.server_count.load(Ordering::Acquire),
        );
        // Through a balancer, K streams to whichever servers it picks.
        self.config
            .server_connections
            .map_or(count, |k| count.min(k.get()))
    }

    /// Whether every counted server is connected (streams being let go of not included; a
    /// stream handed its resumed transport is).
    pub(crate) fn satisfied(&self) -> bool {
        let target = self.target();
        // With K servers only, no one server's Lease has to be among them.
        let leases = self
            .leases()
            .filter(|_| self.config.server_connections.is_none());
        let sessions = self.sessions();
        if self.config.discovery != Discovery::Balancer && !self.every_endpoint_held(&sessions) {
            return false;
        }
        let kept = sessions
            .iter()
            .filter(|(_, held)| held.is_live())
            .map(|(id, _)| id.as_str());
        server_count::satisfied(kept, target, leases.as_ref())
    }

    /// Lets go of servers whose Lease has not counted for a while as long as more streams
    /// than the count are held: each is told this agent is draining, and its stream ends
    /// once its connections did (or after [`DISMISS_GRACE`]).
    fn dismiss_surplus(&self) {
        let Some(leases) = self.leases() else {
            return;
        };
        let target = self.target();
        let sessions = self.sessions();
        let kept = sessions
            .iter()
            .filter(|(_, held)| !held.dismiss.is_cancelled())
            .map(|(id, _)| id.as_str());
        let surplus = server_count::surplus(kept, target, &leases);
        let due = self
            .uncounted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .due(surplus, monotonic_now());
        for id in due {
            tracing::info!(server.id = %id, "letting go of a server whose Lease no longer counts");
            if let Some(held) = sessions.get(&id) {
                held.dismiss.cancel();
            }
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
        self.sessions()
            .values()
            .filter(|held| !held.suspended)
            .count()
    }

    /// The current server sessions, each with the discovered address it was opened to, for
    /// introspection.
    pub(crate) fn session_list(&self) -> Vec<(Arc<ServerSession>, Option<SocketAddr>)> {
        self.sessions()
            .values()
            .map(|held| (held.session.clone(), held.endpoint))
            .collect()
    }

    /// The stream to carry a reverse dial on: among servers that accepted reverse dials and
    /// are not being let go of, the one with the fewest connections.
    pub(crate) fn reverse_session(&self) -> Option<Arc<ServerSession>> {
        self.sessions()
            .values()
            .filter(|held| held.session.reverse && !held.dismiss.is_cancelled() && !held.suspended)
            .min_by_key(|held| held.session.link.inspect(|s| s.connection_count()))
            .map(|held| held.session.clone())
    }

    /// `--agent-identifiers`, as sent.
    pub(crate) fn identifiers(&self) -> &str {
        &self.config.identifiers
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// The last server count a server announced.
    pub(crate) fn server_count(&self) -> usize {
        self.server_count.load(Ordering::Acquire)
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
        self.draining.store(true, Ordering::Release);
        for held in self.sessions().values() {
            held.session.drain();
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
        self.sessions()
            .values()
            .map(|held| {
                held.session
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
        self.server_count
            .store(connected.answer.server_count.max(1), Ordering::Release);
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
            connected.answer.reverse,
            connected.answer.resume_token.clone().filter(|_| credit),
            connected.answer.server_version.clone(),
        ));
        let dismiss = CancellationToken::new();
        let (handover, resumes) = mpsc::channel(1);
        {
            let mut sessions = self.sessions();
            if sessions.contains_key(&server_id) {
                tracing::debug!(server.id = %server_id, "already connected to this server; closing the duplicate");
                drop(sessions);
                if let Some(endpoint) = endpoint {
                    self.aliases().insert(endpoint, server_id);
                }
                connected.transport.abort();
                return false;
            }
            if let Some(endpoint) = endpoint {
                // The address now holds a stream of its own: whatever server it stood for
                // before (one that has since gone) no longer matters.
                self.aliases().remove(&endpoint);
            }
            sessions.insert(
                server_id.clone(),
                Held {
                    session: session.clone(),
                    dismiss: dismiss.clone(),
                    handover: session.resume_token.is_some().then_some(handover),
                    suspended: false,
                    resuming: false,
                    endpoint,
                },
            );
        }
        self.note_change();
        self.metrics.open_server_connections.inc();
        self.start_keepalive(&connected.server, credit);
        if self.draining.load(Ordering::Acquire) {
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
                .hold(session, connected, dismiss, resumes, stop.clone())
                .instrument(span),
        );
        true
    }

    /// A new stream from a server whose stream is suspended: hands it over when the server
    /// resumed that stream, and otherwise ends the suspended streams it shows are gone (the
    /// same server ID without the stream: it restarted; the only server, under another
    /// ID: it was replaced). Gives the stream back when it is a new one.
    fn resume_suspended(
        &self,
        connected: Connected,
        endpoint: Option<SocketAddr>,
    ) -> Option<Connected> {
        let mut sessions = self.sessions();
        let suspended = |held: &Held| held.suspended && held.handover.is_some();
        if let Some(held) = sessions
            .get_mut(&connected.answer.server_id)
            .filter(|held| suspended(held))
        {
            let handover = held.handover.clone()?;
            let same = connected.answer.resume_token.is_some()
                && connected.answer.resume_token == held.session.resume_token;
            if connected.answer.resumed.is_none() || !same {
                // Its task ends it; the new stream takes its place at once.
                sessions.remove(&connected.answer.server_id);
            } else {
                // The next sync must not ask for it again before its task has taken this
                // transport: that request would carry a count the stream is about to pass.
                held.resuming = true;
            }
            drop(sessions);
            return match connected.answer.resumed.filter(|_| same) {
                Some(_) => {
                    // A full or closed hand-over means the stream's task is ending; the
                    // transport is dropped with the message and the next sync starts anew.
                    let _ = handover.try_send(Resume::Transport(Box::new(connected)));
                    None
                }
                None => {
                    let _ = handover.try_send(Resume::Gone(
                        "the proxy server no longer knows this stream (it restarted)".into(),
                    ));
                    Some(connected)
                }
            };
        }
        // A server that answers where a suspended stream's server was, under another ID,
        // replaced it: at its discovered address, or as the only server behind a balancer.
        let replaced = |held: &Held| match endpoint {
            Some(endpoint) => held.endpoint == Some(endpoint),
            None => connected.answer.server_count <= 1,
        };
        for (id, held) in sessions.iter().filter(|(_, h)| suspended(h) && replaced(h)) {
            if let Some(handover) = &held.handover {
                let at = endpoint.map_or_else(
                    || "the only proxy server".to_owned(),
                    |e| format!("the proxy server at {e}"),
                );
                let _ = handover.try_send(Resume::Gone(format!(
                    "{at} is now {} (server {id} is gone)",
                    connected.answer.server_id
                )));
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
    fn set_suspended(&self, session: &Arc<ServerSession>, suspended: bool) {
        if let Some(held) = self.sessions().get_mut(&session.server_id)
            && Arc::ptr_eq(&held.session, session)
        {
            held.suspended = suspended;
            held.resuming = false;
        }
        self.note_change();
    }

    /// Wakes the sync loops: a stream was added, broke or ended.
    fn note_change(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn aliases(&self) -> MutexGuard<'_, HashMap<SocketAddr, String>> {
        self.aliases.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Owns one server stream across the transports it runs on, until it ends for good.
    async fn hold(
        self: Arc<Self>,
        session: Arc<ServerSession>,
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
            self.set_suspended(&session, true);
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
            self.set_suspended(&session, false);
            self.metrics.open_server_connections.inc();
            tracing::info!("server stream resumed");
        };
        session.close(&reason).await;
        tracing::info!(%reason, "disconnected from proxy server");
        let mut sessions = self.sessions();
        if let Some(held) = sessions.get(&session.server_id)
            && Arc::ptr_eq(&held.session, &session)
        {
            if !held.suspended {
                self.metrics.open_server_connections.dec();
            }
            sessions.remove(&session.server_id);
        }
        drop(sessions);
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
        let resume_from: Vec<(String, u64)> = self
            .sessions()
            .values()
            .filter(|held| held.suspended && !held.resuming && held.endpoint == endpoint)
            .filter_map(|held| {
                let token = held.session.resume_token.clone()?;
                Some((token, held.session.link.resume_point()?))
            })
            .collect();
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
