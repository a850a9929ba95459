//! One agent stream on the server: its [`Link`] (the sans-IO table of its dials and
//! connections) and the hooks that turn the table's events into the server's metrics.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;
use tether_observe::time::monotonic_now;

use tether_observe::metrics::Gauge;
use tether_policy::Cidr;
use tether_proto::{Identifiers, Labels, Packet};
use tether_tunnel::{DialError, Direction, Ended, Event, Hooks, Initiator, Link, TransportError};

use super::health::{Health, TenantLoad};
use super::outlier::{EjectionConfig, Verdict};
use super::registry::Backend;
use super::selection::Candidate;
use super::selection_metrics::SelectionMetrics;
use crate::audit::Audit;
use crate::control_plane::{self, ControlPlaneEndpoints, ReverseDials};
use crate::identity::AgentProof;
use crate::metrics::{DialFailure, Segment, ServerMetrics};
use crate::request::Requests;

/// A connected agent stream.
#[derive(Debug)]
pub(crate) struct AgentSession {
    pub(crate) agent_id: String,
    pub(crate) stream_id: u64,
    pub(crate) identifiers: Identifiers,
    pub(crate) labels: Labels,
    /// The tether release the agent announced (`tether-version`); `None` from upstream's.
    pub(crate) version: Option<String>,
    /// `cidr` identifiers, and `ipv4`/`ipv6` ones as single addresses, for `destCIDR` and
    /// `topology`. Entries that do not parse are left out (upstream ignores `cidr` anyway).
    cidrs: Vec<Cidr>,
    pub(crate) health: Arc<Health>,
    pub(crate) link: Arc<Link>,
    /// Set by the agent's DRAIN; read on every dial's agent selection.
    draining: Arc<AtomicBool>,
    /// This agent's series of `tether_server_agent_pending_dials`.
    pub(crate) pending_gauge: Arc<Gauge>,
    pub(crate) requests: Arc<Requests>,
    pub(crate) connected_at: Instant,
    /// The agent connection's keepalive answers, for `/debug/agents`: the connection the
    /// stream runs on now (it changes when the stream resumes on another).
    pub(crate) keepalive: tether_grpc::CurrentPong,
    /// The transport the stream runs on now (`grpc` or `native`), for `/debug/agents`.
    transport: std::sync::Mutex<&'static str>,
    /// Set when the audit log is on.
    pub(crate) audit: Option<Arc<Audit>>,
    /// The tasks answering the agent's reverse dials; the stream waits for them when it
    /// ends (each ends promptly: the table ended their dials and connections).
    pub(crate) reverse_tasks: tokio_util::task::TaskTracker,
    /// What the agent proved at admission, checked again by each reload.
    pub(crate) proof: AgentProof,
    /// Set when a reload took the stream's tenant away (the tenant was removed, or the
    /// agent's identity moved to another): the stream takes no new dial and ends at the
    /// deadline.
    retirement: Arc<Retirement>,
}

/// A stream's end decided by a reload.
#[derive(Debug, Default)]
struct Retirement {
    decided: OnceLock<Retired>,
    notified: tokio::sync::Notify,
}

#[derive(Debug)]
struct Retired {
    why: String,
    /// When the stream and its connections are cut.
    deadline: tokio::time::Instant,
    /// The routing file's generation that decided it.
    generation: u64,
}

impl Retirement {
    /// The generation that cut the stream's connections, once its deadline passed.
    fn cut_by(&self) -> Option<u64> {
        let retired = self.decided.get()?;
        (tokio::time::Instant::now() >= retired.deadline).then_some(retired.generation)
    }
}

impl Backend for Arc<AgentSession> {
    fn agent_id(&self) -> &str {
        &self.agent_id
    }
    fn stream_id(&self) -> u64 {
        self.stream_id
    }
    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
    fn is_tether(&self) -> bool {
        self.version.is_some()
    }
    fn candidate(&self, now: Instant) -> Candidate<'_> {
        self.health.candidate(
            &self.agent_id,
            &self.labels,
            &self.cidrs,
            self.is_draining(),
            now,
        )
    }
    fn mark_picked(&self, seq: u64) {
        self.health.mark_picked(seq);
    }
}

/// How an agent stream is watched for selection: the ejection rules, the selection metrics
/// and the totals of the tenant the agent belongs to.
#[derive(Clone, Debug)]
pub(crate) struct Watch {
    pub(crate) ejection: EjectionConfig,
    pub(crate) metrics: Arc<SelectionMetrics>,
    pub(crate) tenant: Arc<TenantLoad>,
    /// Bumped when the agent starts draining: peer servers hear of it.
    pub(crate) agents_changed: Arc<tokio::sync::watch::Sender<u64>>,
    /// Set when the audit log is on.
    pub(crate) audit: Option<Arc<Audit>>,
}

impl AgentSession {
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
        agent_id: String,
        stream_id: u64,
        identifiers: Identifiers,
        labels: Labels,
        version: Option<String>,
        config: tether_tunnel::SessionConfig,
        metrics: Arc<ServerMetrics>,
        watch: Watch,
        keepalive: Arc<tether_grpc::LastPong>,
        transport: &'static str,
        server_id: &str,
        control_plane: Option<Arc<ControlPlaneEndpoints>>,
        max_reverse_connections: usize,
        proof: AgentProof,
    ) -> Self {
        let draining = Arc::new(AtomicBool::new(false));
        let audit = watch.audit.clone();
        let reverse_tasks = tokio_util::task::TaskTracker::new();
        let reverse = Arc::new(ReverseDials {
            endpoints: control_plane,
            metrics: metrics.clone(),
            audit: audit.as_ref().map(|a| {
                Arc::new(tether_tunnel::StreamAudit::new(
                    a.log().clone(),
                    tether_tunnel::AuditSide::SERVER_REVERSE,
                    server_id.to_owned(),
                    agent_id.clone(),
                ))
            }),
            agent_id: agent_id.clone(),
            slots: control_plane::Slots::new(max_reverse_connections),
        });
        let pending_gauge = metrics.agent_pending_dials.with(&[&agent_id]);
        let requests = Arc::new(Requests::default());
        let retirement = Arc::new(Retirement::default());
        let health = Arc::new(Health::new(watch.tenant.clone()));
        let cidrs = identifiers
            .cidrs
            .iter()
            .chain(&identifiers.ipv4)
            .chain(&identifiers.ipv6)
            .filter_map(|text| Cidr::parse(text).ok())
            .collect();
        let hooks = ServerHooks {
            requests: requests.clone(),
            health: health.clone(),
            watch,
            queued_gauge: metrics.agent_queued_bytes.with(&[&agent_id]),
            pending_gauge: pending_gauge.clone(),
            agent_id: agent_id.clone(),
            server_id: server_id.to_owned(),
            draining: draining.clone(),
            metrics,
            audit: audit.clone(),
            reverse,
            reverse_tasks: reverse_tasks.clone(),
            retirement: retirement.clone(),
        };
        Self {
            link: Link::new(config, hooks),
            agent_id,
            stream_id,
            identifiers,
            labels,
            version,
            cidrs,
            health,
            draining,
            pending_gauge,
            requests,
            connected_at: monotonic_now(),
            keepalive: tether_grpc::CurrentPong::new(keepalive),
            transport: std::sync::Mutex::new(transport),
            audit,
            reverse_tasks,
            proof,
            retirement,
        }
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Ends the stream at `deadline` because of `why`, decided by routing-file `generation`;
    /// `false` when an earlier reload already did. The caller takes it out of its registry.
    pub(crate) fn retire(
        &self,
        why: String,
        deadline: tokio::time::Instant,
        generation: u64,
    ) -> bool {
        let retired = Retired {
            why,
            deadline,
            generation,
        };
        let first = self.retirement.decided.set(retired).is_ok();
        if first {
            self.retirement.notified.notify_waiters();
        }
        first
    }

    /// Why a reload ends the stream, if one does.
    pub(crate) fn retiring(&self) -> Option<&str> {
        self.retirement.decided.get().map(|r| r.why.as_str())
    }

    /// Resolves with the reason once a reload's deadline for this stream passed.
    pub(crate) async fn retired(&self) -> String {
        let retired = loop {
            let notified = self.retirement.notified.notified();
            if let Some(decided) = self.retirement.decided.get() {
                break decided;
            }
            notified.await;
        };
        tokio::time::sleep_until(retired.deadline).await;
        retired.why.clone()
    }
}

/// The server's reading of an agent stream's events.
#[derive(Debug)]
struct ServerHooks {
    agent_id: String,
    server_id: String,
    requests: Arc<Requests>,
    metrics: Arc<ServerMetrics>,
    draining: Arc<AtomicBool>,
    queued_gauge: Arc<Gauge>,
    pending_gauge: Arc<Gauge>,
    health: Arc<Health>,
    watch: Watch,
    audit: Option<Arc<Audit>>,
    reverse: Arc<ReverseDials>,
    reverse_tasks: tokio_util::task::TaskTracker,
    /// The stream's retirement, for the end records of the connections it cuts.
    retirement: Arc<Retirement>,
}

impl ServerHooks {
    /// The generation that cut a connection that ended with its stream, if a reload did.
    fn cut_by(&self, ended: &Ended) -> Option<u64> {
        matches!(ended.outcome.initiator, Initiator::Stream)
            .then(|| self.retirement.cut_by())
            .flatten()
    }

    fn dial_ended(&self) {
        self.metrics.pending_dials.dec();
        self.pending_gauge.dec();
        self.health.dial_finished();
    }

    fn judge(&self, error: Option<&DialError>) {
        judge(
            &self.health,
            &self.watch.ejection,
            &self.watch.metrics,
            &self.agent_id,
            error,
        );
    }
}

/// Feeds a settled dial to outlier ejection. The destination refusing, the agent not
/// answering in time, or the agent giving up all count against the agent: one of this
/// server's own, or one a peer holds (judged here by the dials this server sent it).
pub(crate) fn judge(
    health: &Health,
    ejection: &EjectionConfig,
    metrics: &SelectionMetrics,
    agent_id: &str,
    error: Option<&DialError>,
) {
    let ok = match error {
        None => true,
        Some(DialError::Endpoint(_) | DialError::Timeout | DialError::ClosedByPeer) => false,
        Some(_) => return,
    };
    match health.record(ejection, ok) {
        Verdict::Unchanged => {}
        Verdict::Ejected(length) => {
            tracing::warn!(agent.id = %agent_id, ejected_for = ?length, "ejecting agent from selection after consecutive failed dials");
            metrics.ejections.inc();
        }
        Verdict::Recovered => {
            tracing::info!(agent.id = %agent_id, "agent dials succeed again");
            metrics.recoveries.inc();
        }
    }
}

impl Hooks for ServerHooks {
    fn on_event(&self, link: &Arc<Link>, event: Event) {
        let m = &self.metrics;
        match event {
            Event::DialRequested {
                random,
                protocol,
                address,
                ..
            } => {
                self.reverse_tasks.spawn(control_plane::serve(
                    link.incoming_dial(random),
                    protocol,
                    address,
                    self.reverse.clone(),
                ));
            }
            Event::DialCancelled { random, why } => {
                tracing::debug!(agent.id = %self.agent_id, dial.id = %random, %why, "reverse dial no longer wanted");
            }
            Event::Opened(id) if id.is_reverse() => m.control_plane_connections.inc(),
            Event::Ended(ended) if ended.id.is_reverse() => {
                m.control_plane_connections.dec();
                tether_tunnel::log_ended(&ended, &self.agent_id, &self.server_id);
                if let Some(audit) = &self.reverse.audit {
                    let cut = self.cut_by(&ended);
                    audit.ended(ended, cut);
                }
            }
            Event::DialSettled {
                random,
                latency,
                result,
            } => {
                self.dial_ended();
                self.judge(result.as_ref().err());
                match &result {
                    // The connection's opening, in the audit log from the moment the client
                    // is answered; its end record carries the latency too.
                    Ok(id) => {
                        if let Some(audit) = &self.audit {
                            self.requests.answered(random, latency, |followed| {
                                audit.opened(followed, &self.agent_id, *id);
                            });
                        }
                    }
                    Err(error) => {
                        let followed = self.requests.remove(random);
                        let error = crate::error::DialError::from(error.clone());
                        let request = followed.as_ref().map(|f| &f.request);
                        tracing::info!(
                            dial.id = %random,
                            agent.id = %self.agent_id,
                            server.id = %self.server_id,
                            address = request.map(|r| r.address.as_str()),
                            client = request.and_then(|r| r.peer.addr).map(tracing::field::display),
                            error = %tether_grpc::LogText(&error.to_string()),
                            "dial failed"
                        );
                        if let (Some(audit), Some(followed)) = (&self.audit, followed) {
                            audit.failed(&followed.request, &self.agent_id, latency, &error);
                        }
                    }
                }
                m.dial_settled(latency, &result);
            }
            Event::StrayDialResponse { random } => {
                tracing::debug!(agent.id = %self.agent_id, dial.id = %random, "answer to a dial nobody waits for");
                m.dial_failure(DialFailure::UnrecognizedResponse);
            }
            Event::Opened(_) => {
                m.connection_opened();
                self.health.connection_opened();
            }
            Event::Ended(ended) => {
                let followed = self.requests.remove(ended.dial_id);
                if let (Some(audit), Some(followed)) = (&self.audit, followed) {
                    // The dial's answer is handled after its end (another task ran the end's
                    // hooks first): the opening comes first all the same.
                    if !followed.opened {
                        audit.opened(&followed, &self.agent_id, ended.id);
                    }
                    audit.connection(&followed, &self.agent_id, &ended, self.cut_by(&ended));
                }
                m.connection_ended(&ended);
                self.health.connection_ended();
                tether_tunnel::log_ended(&ended, &self.agent_id, &self.server_id);
            }
            Event::PeerDraining => {
                tracing::info!(agent.id = %self.agent_id, "agent is draining");
                self.draining.store(true, Ordering::Release);
                self.watch
                    .agents_changed
                    .send_modify(|n| *n = n.wrapping_add(1));
            }
            Event::Ignored { packet } => {
                tracing::debug!(agent.id = %self.agent_id, packet, "ignoring a packet agents do not send");
            }
            _ => {}
        }
    }

    fn on_queued(&self, bytes: usize) {
        self.health.set_queued(bytes);
        self.queued_gauge
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    fn on_packet(&self, direction: Direction, packet: &Packet) {
        let segment = match direction {
            Direction::In => Segment::FromAgent,
            Direction::Out => Segment::ToAgent,
        };
        self.metrics.packet(segment, packet);
    }

    fn on_bad_packet(&self, error: &TransportError) {
        tracing::debug!(agent.id = %self.agent_id, %error, "dropping a malformed packet from the agent");
        self.metrics
            .stream_error(Segment::FromAgent, "InvalidArgument", "Unknown");
    }

    fn on_stream_error(&self, direction: Direction, error: &TransportError) {
        let segment = match direction {
            Direction::In => Segment::FromAgent,
            Direction::Out => Segment::ToAgent,
        };
        self.metrics
            .stream_error(segment, error.code_name(), "Unknown");
    }
}
