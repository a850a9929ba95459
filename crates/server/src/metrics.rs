//! The server's Prometheus metrics: upstream's names and labels, plus tether's own.

use std::sync::{Arc, OnceLock};

use tether_observe::metrics::{Counter, CounterVec, Gauge, GaugeVec, Histogram, Registry};
use tether_proto::Packet;

const PREFIX: &str = "konnectivity_network_proxy_server_";
/// Upstream's latency buckets for dial and write durations.
const LATENCY_BUCKETS: [f64; 9] = [1e-6, 1e-5, 1e-4, 0.005, 0.025, 0.1, 0.5, 2.5, 12.5];
const LIFETIME_BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

/// Why a dial failed: the `reason` label of `dial_failure_count`, upstream's values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DialFailure {
    NoAgent,
    ErrorResponse,
    UnrecognizedResponse,
    SendRsp,
    BackendClose,
    BackendDialTimeout,
    FrontendClose,
    /// tether: the server's destination policy refused the client's request.
    Policy,
}

impl DialFailure {
    fn label(self) -> &'static str {
        match self {
            Self::NoAgent => "no_agent",
            Self::ErrorResponse => "error_response",
            Self::UnrecognizedResponse => "unrecognized_response",
            Self::SendRsp => "send_rsp",
            Self::BackendClose => "backend_close",
            Self::BackendDialTimeout => "backend_dial_timeout",
            Self::FrontendClose => "frontend_close",
            Self::Policy => "policy",
        }
    }
}

/// Who ended a tunnelled connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Initiator {
    /// The frontend's client (kube-apiserver) closed or went away.
    Client,
    /// The agent closed: the destination ended, failed, or the agent was lost.
    Agent,
}

/// Stream segments, the `segment` label.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Segment {
    FromClient,
    ToClient,
    FromAgent,
    ToAgent,
}

impl Segment {
    fn label(self) -> &'static str {
        match self {
            Self::FromClient => "from_client",
            Self::ToClient => "to_client",
            Self::FromAgent => "from_agent",
            Self::ToAgent => "to_agent",
        }
    }
}

/// Handles on every server metric. Created once per server and shared.
#[derive(Debug)]
pub(crate) struct ServerMetrics {
    pub(crate) dial_duration: Arc<Histogram>,
    pub(crate) frontend_write_duration: Arc<Histogram>,
    pub(crate) connection_duration: Arc<Histogram>,
    /// Upstream's close reasons (ANP#908): `frontend_close`, `backend_close`,
    /// `stream_shutdown`; `tether_server_connection_closes_total` says more.
    close_reasons: Arc<CounterVec>,
    grpc_connections: Arc<GaugeVec>,
    pub(crate) http_connections: Arc<Gauge>,
    pub(crate) ready_backend_connections: Arc<Gauge>,
    ready_backends: Arc<GaugeVec>,
    /// tether: connected agent IDs by implementation, to follow a migration.
    connected_agents: Arc<GaugeVec>,
    pub(crate) pending_dials: Arc<Gauge>,
    established: Arc<Gauge>,
    /// tether: connections established since start, so that opened = closed + open can be
    /// checked per process (closed: `connection_duration`'s count).
    connections_opened: Arc<Counter>,
    dial_failures: Arc<CounterVec>,
    stream_packets: Arc<CounterVec>,
    /// `stream_packets` children by segment and packet type, looked up once: counting a
    /// packet must not take the vector's lock.
    packet_counters: [[OnceLock<Arc<Counter>>; Packet::TYPE_NAMES.len()]; 4],
    stream_errors: Arc<CounterVec>,
    /// tether: connections closed by the server because their peer overran its buffer.
    pub(crate) overflow_closes: Arc<Counter>,
    /// tether: bytes received from each agent and not yet written to frontends.
    pub(crate) agent_queued_bytes: Arc<GaugeVec>,
    /// tether: dials waiting for each agent's answer.
    pub(crate) agent_pending_dials: Arc<GaugeVec>,
    /// tether: how tunnelled connections ended.
    connection_closes: Arc<CounterVec>,
    /// tether: open connections agents carried to control-plane endpoints (reverse dials).
    pub(crate) control_plane_connections: Arc<Gauge>,
    /// tether: reverse dials by result.
    control_plane_dials: Arc<CounterVec>,
    /// tether: suspended and resumed agent streams.
    pub(crate) resume: tether_tunnel::ResumeMetrics,
}

/// How an agent's reverse dial ended on the server: the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReverseDial {
    Connected,
    /// Not an allowed control-plane endpoint, or the feature is off.
    Refused,
    /// The agent's stream already holds its limit of reverse connections.
    OverLimit,
    /// The endpoint could not be reached.
    Failed,
    /// The agent gave up, or its stream ended, first.
    Cancelled,
}

impl ServerMetrics {
    pub(crate) fn register(registry: &Registry) -> Self {
        let name = |n: &str| format!("{PREFIX}{n}");
        let m = Self {
            dial_duration: registry.histogram(
                &name("dial_duration_seconds"),
                "Latency of dial to the remote endpoint in seconds",
                &LATENCY_BUCKETS,
            ),
            frontend_write_duration: registry.histogram(
                &name("frontend_write_duration_seconds"),
                "Latency of write to the frontend in seconds",
                &LATENCY_BUCKETS,
            ),
            connection_duration: registry.histogram(
                &name("connection_duration_seconds"),
                "Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.",
                &LIFETIME_BUCKETS,
            ),
            grpc_connections: registry.gauge_vec(
                &name("grpc_connections"),
                "Number of current grpc connections, partitioned by service method.",
                &["service_method"],
            ),
            http_connections: registry.gauge(
                &name("http_connections"),
                "Number of current HTTP CONNECT connections",
            ),
            ready_backend_connections: registry.gauge(
                &name("ready_backend_connections"),
                "Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
            ),
            ready_backends: registry.gauge_vec(
                &name("ready_backends"),
                "Number of konnectivity agent connected to the proxy server",
                &["proxy_strategy"],
            ),
            connected_agents: registry.gauge_vec(
                "tether_server_connected_agents",
                "Connected agent IDs by implementation: tether (its agents announce their version) or upstream",
                &["implementation"],
            ),
            pending_dials: registry.gauge(
                &name("pending_backend_dials"),
                "Current number of pending backend dial requests",
            ),
            established: registry.gauge(
                &name("established_connections"),
                "Current number of established end-to-end connections (post-dial).",
            ),
            dial_failures: registry.counter_vec(
                &name("dial_failure_count"),
                "Number of dial failures observed. Multiple failures can occur for a single dial request.",
                &["reason"],
            ),
            stream_packets: registry.counter_vec(
                &name("stream_packets_total"),
                "Count of packets processed, by segment and packet type (example: from_client, DIAL_REQ)",
                &["segment", "packet_type"],
            ),
            packet_counters: Default::default(),
            stream_errors: registry.counter_vec(
                &name("stream_errors_total"),
                "Count of gRPC stream errors, by segment, grpc Code, packet type. (example: from_agent, Code.Unavailable, DIAL_RSP)",
                &["segment", "code", "packet_type"],
            ),
            overflow_closes: registry.counter(
                "tether_server_connection_overflow_closes_total",
                "Connections closed because a peer without flow control overran the per-connection buffer",
            ),
            agent_queued_bytes: registry.gauge_vec(
                "tether_server_agent_queued_bytes",
                "Bytes received from an agent and not yet written to frontends, per agent",
                &["agent_id"],
            ),
            agent_pending_dials: registry.gauge_vec(
                "tether_server_agent_pending_dials",
                "Dials waiting for an agent's answer, per agent",
                &["agent_id"],
            ),
            close_reasons: registry.counter_vec(
                &name("connection_close_total"),
                "Number of established end-to-end connections (post-dial) that were closed, by reason for the close.",
                &["reason"],
            ),
            connections_opened: registry.counter(
                "tether_server_connections_opened_total",
                "Tunnelled connections established (post-dial) since start; with connection_duration_seconds_count (closed) and established_connections (open): opened = closed + open",
            ),
            connection_closes: registry.counter_vec(
                "tether_server_connection_closes_total",
                "Tunnelled connections that ended, by who ended them (client, agent) and how (normal, error)",
                &["initiator", "outcome"],
            ),
            control_plane_connections: registry.gauge(
                "tether_server_control_plane_connections",
                "Open connections agents carried to control-plane endpoints (reverse dials)",
            ),
            control_plane_dials: registry.counter_vec(
                "tether_server_control_plane_dials_total",
                "Agents' reverse dials to control-plane endpoints, by result (connected, refused, over_limit, failed, cancelled)",
                &["result"],
            ),
            resume: tether_tunnel::ResumeMetrics::register(registry, "server"),
        };
        // Upstream exposes these even when they stay at zero; keep the names present.
        // full_receive_channels stays 0: tether never blocks a stream reader.
        registry.gauge_vec(
            &name("full_receive_channels"),
            "Number of current connections blocked by a full receive channel, partitioned by service method.",
            &["service_method"],
        );
        // Shared with tether-kube's Lease garbage collector, which counts into it.
        registry.shared_counter(
            &name("culled_leases_count"),
            "Count of expired leases that the lease garbage collection controller has culled.",
        );
        for method in ["Proxy", "Connect"] {
            m.grpc_connections.with(&[method]).set(0);
        }
        m.set_connected_agents(0, 0);
        m
    }

    /// Counts a tunnelled connection's end.
    pub(crate) fn connection_closed(&self, initiator: Initiator, error: bool) {
        let initiator = match initiator {
            Initiator::Client => "client",
            Initiator::Agent => "agent",
        };
        let outcome = if error { "error" } else { "normal" };
        self.connection_closes.with(&[initiator, outcome]).inc();
    }

    /// Counts an established connection's end under upstream's reason (ANP#908), by the
    /// upstream code path that would have removed it: a close exchange with the agent
    /// (CLOSE_RSP, whoever started it: `removeEstablished`), the agent's stream going away
    /// (`removeEstablishedForBackendConn`), or the frontend's stream or connection failing
    /// without a close (`removeEstablishedForStream`).
    pub(crate) fn connection_close_reason(&self, outcome: &tether_tunnel::Outcome) {
        use tether_tunnel::Initiator as By;
        let reason = match (outcome.initiator, &outcome.error) {
            (By::Stream, _) => "backend_close",
            (By::Local, Some(_)) => "stream_shutdown",
            (By::Local | By::Peer, _) => "frontend_close",
        };
        self.close_reasons.with(&[reason]).inc();
    }

    /// Drops the per-agent series of an agent that has no stream left.
    pub(crate) fn forget_agent(&self, agent_id: &str) {
        self.agent_queued_bytes.remove(&[agent_id]);
        self.agent_pending_dials.remove(&[agent_id]);
    }

    pub(crate) fn control_plane_dial(&self, result: ReverseDial) {
        let label = match result {
            ReverseDial::Connected => "connected",
            ReverseDial::Refused => "refused",
            ReverseDial::OverLimit => "over_limit",
            ReverseDial::Failed => "failed",
            ReverseDial::Cancelled => "cancelled",
        };
        self.control_plane_dials.with(&[label]).inc();
    }

    pub(crate) fn dial_failure(&self, reason: DialFailure) {
        self.dial_failures.with(&[reason.label()]).inc();
    }

    /// Counts a dial the agent's answer (or its deadline) settled: its latency, and why it
    /// failed, if it did.
    pub(crate) fn dial_settled(
        &self,
        latency: Option<std::time::Duration>,
        result: &Result<tether_proto::ConnectId, tether_tunnel::DialError>,
    ) {
        use tether_tunnel::DialError as E;
        if let Some(latency) = latency {
            self.dial_duration.observe(latency.as_secs_f64());
        }
        let failure = match result {
            Ok(_) => return,
            Err(E::Endpoint(_)) => DialFailure::ErrorResponse,
            Err(E::Timeout) => DialFailure::BackendDialTimeout,
            Err(E::ClosedByPeer | E::StreamLost(_)) => DialFailure::BackendClose,
            // Refused before the dial request left; never settled through an event.
            Err(E::Duplicate(_) | E::TooManyPending { .. }) => return,
        };
        self.dial_failure(failure);
    }

    /// Counts a connection established end to end.
    pub(crate) fn connection_opened(&self) {
        self.established.inc();
        self.connections_opened.inc();
    }

    /// Counts an established connection's end: the gauge, its duration and its reason.
    pub(crate) fn connection_ended(&self, ended: &tether_tunnel::Ended) {
        self.established.dec();
        self.connection_duration
            .observe(ended.duration().as_secs_f64());
        self.connection_close_reason(&ended.outcome);
        if let Some(tether_tunnel::CloseError::Overflow { .. }) = ended.outcome.error {
            self.overflow_closes.inc();
        }
    }

    pub(crate) fn packet(&self, segment: Segment, packet: &Packet) {
        let index = packet.type_index();
        self.packet_counters[segment as usize][index]
            .get_or_init(|| {
                self.stream_packets
                    .with(&[segment.label(), Packet::TYPE_NAMES[index]])
            })
            .inc();
    }

    pub(crate) fn stream_error(&self, segment: Segment, code: &str, packet_type: &str) {
        self.stream_errors
            .with(&[segment.label(), code, packet_type])
            .inc();
    }

    pub(crate) fn grpc_stream(&self, method: &str) -> Arc<Gauge> {
        self.grpc_connections.with(&[method])
    }

    /// Sets `tether_server_connected_agents`: two series, whatever the fleet.
    pub(crate) fn set_connected_agents(&self, tether: usize, upstream: usize) {
        for (implementation, n) in [("tether", tether), ("upstream", upstream)] {
            self.connected_agents
                .with(&[implementation])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }

    pub(crate) fn set_ready_backends(&self, strategy: &str, n: usize) {
        self.ready_backends
            .with(&[strategy])
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}
