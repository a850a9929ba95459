//! One `AgentService.Connect` stream: the connections a server asked this agent to open.
//! The stream's state is a [`Link`] (the shared sans-IO table); this module dials and
//! relays what the table asks for.

use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_observe::time::monotonic_now;

use tether_observe::audit::AuditLog;
use tether_proto::Packet;
use tether_tunnel::{
    AuditSide, CloseError, DialCancel, DialFacts, Direction, Event, Flow, Hooks, IncomingDial,
    Limits, Link, Role, SessionConfig, StreamAudit, TransportError,
};
use tokio_util::task::TaskTracker;

use crate::destination::Destinations;
use crate::metrics::{AgentMetrics, DialFailure};

/// A server stream and its connections.
#[derive(Debug)]
pub(crate) struct ServerSession {
    pub(crate) server_id: String,
    pub(crate) link: Arc<Link>,
    pub(crate) connected_at: Instant,
    /// The server connection's keepalive answers, for `/debug/agents`: the connection the
    /// stream runs on now (it changes when the stream resumes on another).
    pub(crate) keepalive: tether_grpc::CurrentPong,
    /// The transport the stream runs on now (`grpc` or `native`), for `/debug/agents`.
    transport: std::sync::Mutex<&'static str>,
    /// The server's name for this stream when it is resumable (`tether-resume`).
    pub(crate) resume_token: Option<String>,
    /// The server's tether release (`tether-version`); `None` from an upstream server.
    pub(crate) server_version: Option<String>,
    /// The audit trail of reverse dials on this stream, when auditing.
    pub(crate) reverse_audit: Option<Arc<StreamAudit>>,
    /// Dial-and-relay tasks; the session waits for them when it ends.
    tasks: TaskTracker,
}

/// How long, after the agent closed a reverse connection, the server's CLOSE_RSP may take.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

impl ServerSession {
    /// The transport the stream runs on now.
    pub(crate) fn transport(&self) -> &'static str {
        *self.transport.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The stream resumed on a connection of this transport.
    pub(crate) fn set_transport(&self, transport: &'static str) {
        *self.transport.lock().unwrap_or_else(|e| e.into_inner()) = transport;
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        agent_id: &str,
        server_id: String,
        flow: Flow,
        metrics: Arc<AgentMetrics>,
        destinations: Arc<Destinations>,
        dial_timeout: Duration,
        keepalive: Arc<tether_grpc::LastPong>,
        transport: &'static str,
        audit: Option<AuditLog>,
        resume_token: Option<String>,
        server_version: Option<String>,
    ) -> Self {
        let tasks = TaskTracker::new();
        let config = SessionConfig {
            role: Role::Agent,
            flow,
            // Both for destinations and for the server's answer to a reverse dial.
            dial_timeout,
            // Only reverse connections, which the agent dialed, wait for a close.
            close_timeout: CLOSE_TIMEOUT,
            limits: Limits::default(),
            resumable: resume_token.is_some(),
            peering: false,
        };
        let stream_audit = |side| {
            audit.clone().map(|log| {
                Arc::new(StreamAudit::new(
                    log,
                    side,
                    server_id.clone(),
                    agent_id.to_owned(),
                ))
            })
        };
        let reverse_audit = stream_audit(AuditSide::AGENT_REVERSE);
        let hooks = AgentHooks {
            ids: Arc::new(StreamIds {
                agent_id: agent_id.to_owned(),
                server_id: server_id.clone(),
            }),
            metrics,
            destinations,
            tasks: tasks.clone(),
            dial_timeout,
            audit: stream_audit(AuditSide::AGENT_FORWARD),
            reverse_audit: reverse_audit.clone(),
        };
        Self {
            server_id,
            link: Link::new(config, hooks),
            connected_at: monotonic_now(),
            keepalive: tether_grpc::CurrentPong::new(keepalive),
            resume_token,
            server_version,
            transport: std::sync::Mutex::new(transport),
            reverse_audit,
            tasks,
        }
    }

    /// Tells the server this agent is going away.
    pub(crate) fn drain(&self) {
        self.link.update(|s, _| s.drain());
    }

    /// Whether no connection or dial is left on this stream.
    pub(crate) fn is_idle(&self) -> bool {
        self.link
            .update(|s, _| s.connection_count() == 0 && s.pending_dial_count() == 0)
    }

    /// Ends the stream with `reason`, then waits for its connections' tasks (each ends
    /// promptly: the table ended their dials and connections).
    pub(crate) async fn close(&self, reason: &str) {
        self.link.close(reason);
        self.tasks.close();
        self.tasks.wait().await;
    }
}

/// Who is at each end of the stream, for every log line about its connections.
#[derive(Debug)]
struct StreamIds {
    agent_id: String,
    server_id: String,
}

/// The agent's reading of a server stream's events.
#[derive(Debug)]
struct AgentHooks {
    ids: Arc<StreamIds>,
    metrics: Arc<AgentMetrics>,
    destinations: Arc<Destinations>,
    tasks: TaskTracker,
    dial_timeout: Duration,
    audit: Option<Arc<StreamAudit>>,
    reverse_audit: Option<Arc<StreamAudit>>,
}

impl Hooks for AgentHooks {
    fn on_event(&self, link: &Arc<Link>, event: Event) {
        match event {
            Event::DialRequested {
                random,
                protocol,
                address,
                ..
            } => {
                let dial = link.incoming_dial(random);
                self.tasks.spawn(serve_connection(
                    dial,
                    self.ids.clone(),
                    protocol,
                    address,
                    self.dial_timeout,
                    self.destinations.clone(),
                    self.metrics.clone(),
                    self.audit.clone(),
                ));
            }
            Event::DialCancelled { random, why } => {
                tracing::debug!(
                    dial.id = %random,
                    agent.id = %self.ids.agent_id,
                    server.id = %self.ids.server_id,
                    %why,
                    "dial no longer wanted"
                );
                if why == DialCancel::ByPeer {
                    self.metrics.dials_cancelled.inc();
                }
            }
            Event::Opened(id) if id.is_reverse() => {
                self.metrics.control_plane_connections.inc();
            }
            Event::Opened(_) => self.metrics.open_endpoint_connections.inc(),
            Event::Ended(ended) => {
                let audit = if ended.id.is_reverse() {
                    self.metrics.control_plane_connections.dec();
                    &self.reverse_audit
                } else {
                    self.metrics.open_endpoint_connections.dec();
                    self.metrics.endpoint_connection_ended(&ended);
                    &self.audit
                };
                tether_tunnel::log_ended(&ended, &self.ids.agent_id, &self.ids.server_id);
                if let Some(audit) = audit {
                    audit.ended(ended, None);
                }
            }
            _ => {}
        }
    }

    fn on_packet(&self, direction: Direction, packet: &Packet) {
        self.metrics.packet(direction == Direction::Out, packet);
    }

    fn on_bad_packet(&self, error: &TransportError) {
        tracing::debug!(%error, "dropping a malformed packet from the server");
    }

    fn on_stream_error(&self, direction: Direction, error: &TransportError) {
        self.metrics
            .stream_error(direction == Direction::Out, error.code_name());
    }
}

/// Dials, reports the outcome, and relays until either side closes.
#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    incoming: IncomingDial,
    ids: Arc<StreamIds>,
    protocol: String,
    address: String,
    timeout: Duration,
    destinations: Arc<Destinations>,
    metrics: Arc<AgentMetrics>,
    audit: Option<Arc<StreamAudit>>,
) {
    let started = monotonic_now();
    let mut facts = DialFacts {
        dial_id: incoming.random(),
        requested: address,
        dialed: None,
        latency: None,
    };
    let dialed = tokio::select! {
        dialed = destinations.dial(&protocol, &facts.requested, timeout) => dialed,
        () = incoming.abandoned() => return,
    };
    facts.latency = Some(started.elapsed());
    let crate::destination::Dialed { stream, watch } = match dialed {
        Ok(dialed) => dialed,
        Err((reason, error)) => {
            tracing::info!(
                dial.id = %incoming.random(),
                agent.id = %ids.agent_id,
                server.id = %ids.server_id,
                address = %facts.requested,
                %error,
                "dial failed"
            );
            metrics.endpoint_dial_failure(reason);
            if let Some(audit) = &audit {
                audit.dial_ended(&facts, reason == DialFailure::Policy, &error);
            }
            incoming.fail(error);
            return;
        }
    };
    // `None`: cancelled or timed out meanwhile; dropping the socket closes it.
    let Some(mut tunnel) = incoming.accept() else {
        return;
    };
    metrics
        .dial_duration
        .observe(started.elapsed().as_secs_f64());
    let peer = stream.peer_addr().ok();
    let connect_id = tunnel.connect_id();
    let dial_id = facts.dial_id;
    let requested = facts.requested.clone();
    if let Some(audit) = &audit {
        facts.dialed = peer.map(|a| a.to_string());
        audit.connected(connect_id, facts);
    }
    // A policy generation applied while the connection is open and denying its destination
    // ends it, with the policy's error for the client to see.
    let cut = async {
        let Some(peer) = peer else {
            return std::future::pending().await;
        };
        let revoked = watch.revoked(peer.ip()).await;
        metrics.policy_cuts.inc();
        if let Some(audit) = &audit {
            audit.cut(connect_id, revoked.generation);
        }
        tracing::warn!(
            connect.id = %connect_id,
            dial.id = %dial_id,
            agent.id = %ids.agent_id,
            server.id = %ids.server_id,
            address = %requested,
            dialed = %peer,
            generation = revoked.generation,
            rule = %revoked.denied.rule,
            "closing an open connection: the reloaded destination policy denies it"
        );
        CloseError::Local(revoked.close_text())
    };
    let outcome = tether_tunnel::relay_tcp(&mut tunnel, stream, cut).await;
    tunnel.finish(outcome);
}
