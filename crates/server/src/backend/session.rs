//! One agent stream on the server: its [`Link`] (the sans-IO table of its dials and
//! connections) and the hooks that turn the table's events into the server's metrics.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use tether_grpc::GrpcError;
use tether_observe::metrics::Gauge;
use tether_proto::{DialId, Identifiers, Packet};
use tether_tunnel::{CloseError, DialError, Direction, Event, Hooks, Link};

use super::registry::Backend;
use crate::audit::{Audit, StreamAudit};
use crate::metrics::{DialFailure, Segment, ServerMetrics};
use crate::request::RequestContext;

/// Who asked for each of a stream's dials and connections, by dial ID: what introspection
/// shows as the client and frontend. Written once when a dial starts and once when it ends,
/// never per packet.
#[derive(Debug, Default)]
pub(crate) struct Requests(Mutex<HashMap<DialId, Arc<RequestContext>>>);

impl Requests {
    pub(crate) fn lock(&self) -> MutexGuard<'_, HashMap<DialId, Arc<RequestContext>>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Records `request` unless its dial ID is taken (the table then refuses the dial).
    pub(crate) fn insert(&self, request: &RequestContext) -> bool {
        match self.lock().entry(request.dial_id) {
            std::collections::hash_map::Entry::Occupied(_) => false,
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Arc::new(request.clone()));
                true
            }
        }
    }

    pub(crate) fn remove(&self, dial_id: DialId) {
        self.lock().remove(&dial_id);
    }
}

/// A connected agent stream.
#[derive(Debug)]
pub(crate) struct AgentSession {
    pub(crate) agent_id: String,
    pub(crate) stream_id: u64,
    pub(crate) identifiers: Identifiers,
    pub(crate) link: Arc<Link>,
    /// Set by the agent's DRAIN; read on every dial's agent selection.
    draining: Arc<AtomicBool>,
    /// This agent's series of `tether_server_agent_pending_dials`.
    pub(crate) pending_gauge: Arc<Gauge>,
    pub(crate) requests: Arc<Requests>,
    pub(crate) connected_at: Instant,
    /// The agent connection's keepalive answers, for `/debug/agents`.
    pub(crate) keepalive: Arc<tether_grpc::LastPong>,
    /// Set when the audit log is on.
    pub(crate) audit: Option<Arc<StreamAudit>>,
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
}

impl AgentSession {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        agent_id: String,
        stream_id: u64,
        identifiers: Identifiers,
        config: tether_tunnel::SessionConfig,
        metrics: Arc<ServerMetrics>,
        keepalive: Arc<tether_grpc::LastPong>,
        server_id: &str,
        audit: Option<Arc<Audit>>,
    ) -> Self {
        let draining = Arc::new(AtomicBool::new(false));
        let audit = audit.map(|audit| Arc::new(StreamAudit::new(audit, agent_id.clone())));
        let pending_gauge = metrics.agent_pending_dials.with(&[&agent_id]);
        let requests = Arc::new(Requests::default());
        let hooks = ServerHooks {
            requests: requests.clone(),
            queued_gauge: metrics.agent_queued_bytes.with(&[&agent_id]),
            pending_gauge: pending_gauge.clone(),
            agent_id: agent_id.clone(),
            server_id: server_id.to_owned(),
            draining: draining.clone(),
            metrics,
            audit: audit.clone(),
        };
        Self {
            link: Link::new(config, hooks),
            agent_id,
            stream_id,
            identifiers,
            draining,
            pending_gauge,
            requests,
            connected_at: Instant::now(),
            keepalive,
            audit,
        }
    }

    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
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
    audit: Option<Arc<StreamAudit>>,
}

impl ServerHooks {
    fn dial_ended(&self) {
        self.metrics.pending_dials.dec();
        self.pending_gauge.dec();
    }
}

impl Hooks for ServerHooks {
    fn on_event(&self, _link: &Arc<Link>, event: Event) {
        let m = &self.metrics;
        match event {
            Event::DialSettled {
                random,
                latency,
                result,
            } => {
                self.dial_ended();
                if let Some(audit) = &self.audit {
                    audit.settled(random, latency, &result);
                }
                if let Err(error) = &result {
                    self.requests.remove(random);
                    tracing::info!(
                        dial.id = %random,
                        agent.id = %self.agent_id,
                        server.id = %self.server_id,
                        error = %crate::dial::DialError::from(error.clone()),
                        "dial failed"
                    );
                }
                if let Some(latency) = latency {
                    m.dial_duration.observe(latency.as_secs_f64());
                }
                let failure = match result {
                    Ok(_) => return,
                    Err(DialError::Endpoint(_)) => DialFailure::ErrorResponse,
                    Err(DialError::Timeout) => DialFailure::BackendDialTimeout,
                    Err(DialError::ClosedByPeer | DialError::StreamLost(_)) => {
                        DialFailure::BackendClose
                    }
                    // Refused before DIAL_REQ left; never settled through an event.
                    Err(DialError::Duplicate(_) | DialError::TooManyPending { .. }) => return,
                };
                m.dial_failure(failure);
            }
            Event::StrayDialResponse { random } => {
                tracing::debug!(agent.id = %self.agent_id, dial.id = %random, "answer to a dial nobody waits for");
                m.dial_failure(DialFailure::UnrecognizedResponse);
            }
            Event::Opened(_) => m.established.inc(),
            Event::Ended(ended) => {
                self.requests.remove(ended.dial_id);
                if let Some(audit) = &self.audit {
                    audit.ended(&ended);
                }
                m.established.dec();
                m.connection_duration
                    .observe(ended.duration().as_secs_f64());
                if let Some(CloseError::Overflow { .. }) = ended.outcome.error {
                    m.overflow_closes.inc();
                }
                tether_tunnel::log_ended(&ended, &self.agent_id, &self.server_id);
            }
            Event::PeerDraining => {
                tracing::info!(agent.id = %self.agent_id, "agent is draining");
                self.draining.store(true, Ordering::Release);
            }
            Event::Ignored { packet } => {
                tracing::debug!(agent.id = %self.agent_id, packet, "ignoring a packet agents do not send");
            }
            _ => {}
        }
    }

    fn on_queued(&self, bytes: usize) {
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

    fn on_bad_packet(&self, error: &GrpcError) {
        tracing::debug!(agent.id = %self.agent_id, %error, "dropping a malformed packet from the agent");
        self.metrics
            .stream_error(Segment::FromAgent, "InvalidArgument", "Unknown");
    }

    fn on_stream_error(&self, direction: Direction, error: &GrpcError) {
        let segment = match direction {
            Direction::In => Segment::FromAgent,
            Direction::Out => Segment::ToAgent,
        };
        self.metrics
            .stream_error(segment, error.code_name(), "Unknown");
    }
}
