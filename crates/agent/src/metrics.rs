//! The agent's Prometheus metrics, with upstream's names and labels.

use std::sync::{Arc, OnceLock};

use tether_observe::metrics::{Counter, CounterVec, Gauge, Histogram, Registry};
use tether_proto::Packet;

const PREFIX: &str = "konnectivity_network_proxy_agent_";

/// Upstream's buckets for connection lifetimes (the server's `connection_duration_seconds`).
const LIFETIME_BUCKETS: [f64; 12] = [
    1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 14400.0, 43200.0, 86400.0,
];

/// Handles on every agent metric.
#[derive(Debug)]
pub(crate) struct AgentMetrics {
    pub(crate) dial_duration: Arc<Histogram>,
    endpoint_dial_failures: Arc<CounterVec>,
    pub(crate) open_server_connections: Arc<Gauge>,
    pub(crate) known_server_count: Arc<Gauge>,
    pub(crate) open_endpoint_connections: Arc<Gauge>,
    /// Upstream's (ANP#908): how long endpoint connections lived, and why they closed.
    endpoint_connection_duration: Arc<Histogram>,
    endpoint_close_reasons: Arc<CounterVec>,
    stream_packets: Arc<CounterVec>,
    /// `stream_packets` children, [received, sent] by packet type, looked up once.
    packet_counters: [[OnceLock<Arc<Counter>>; Packet::TYPE_NAMES.len()]; 2],
    stream_errors: Arc<CounterVec>,
    server_connection_failures: Arc<CounterVec>,
    /// tether: in-flight dials abandoned because the server cancelled them (DIAL_CLS).
    pub(crate) dials_cancelled: Arc<Counter>,
    /// tether: open connections closed because a reloaded destination policy denies them.
    pub(crate) policy_cuts: Arc<Counter>,
    /// tether: open connections from the control-plane listener (reverse dials).
    pub(crate) control_plane_connections: Arc<Gauge>,
    /// tether: reverse dials by result.
    control_plane_dials: Arc<CounterVec>,
    /// tether: suspended and resumed agent streams.
    pub(crate) resume: tether_tunnel::ResumeMetrics,
}

/// How a reverse dial from the control-plane listener ended: the `result` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ReverseDial {
    Connected,
    /// The server answered with an error (not allowed, or its dial failed).
    Refused,
    /// No answer in time.
    Timeout,
    /// No connected server accepts reverse dials.
    Unavailable,
    /// The stream ended, or the server forgot the dial.
    Lost,
    /// Closed at accept: `--control-plane-max-connections` were open.
    OverLimit,
}

/// Why an endpoint dial failed: upstream's `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DialFailure {
    Timeout,
    Unknown,
    /// tether: the destination policy denied the address (label `policy`).
    Policy,
}

impl AgentMetrics {
    pub(crate) fn register(registry: &Registry) -> Self {
        let name = |n: &str| format!("{PREFIX}{n}");
        let m = Self {
            dial_duration: registry.histogram(
                &name("dial_duration_seconds"),
                "Latency of dial to the remote endpoint in seconds",
                &[0.005, 0.025, 0.1, 0.5, 2.5, 10.0, 30.0],
            ),
            endpoint_dial_failures: registry.counter_vec(
                &name("endpoint_dial_failure_total"),
                "Number of failures dialing the remote endpoint, by reason (example: timeout).",
                &["reason"],
            ),
            open_server_connections: registry.gauge(
                &name("open_server_connections"),
                "Current number of open server connections.",
            ),
            known_server_count: registry.gauge(
                &name("known_server_count"),
                "Current number of servers agent is trying to connect to.",
            ),
            open_endpoint_connections: registry.gauge(
                &name("open_endpoint_connections"),
                "Current number of open endpoint connections.",
            ),
            endpoint_connection_duration: registry.histogram(
                &name("endpoint_connection_duration_seconds"),
                "Duration in seconds an endpoint connection was established (post-dial) before being closed.",
                &LIFETIME_BUCKETS,
            ),
            endpoint_close_reasons: registry.counter_vec(
                &name("endpoint_connection_close_total"),
                "Number of established endpoint connections (post-dial) that were closed, by reason for the close.",
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
            server_connection_failures: registry.counter_vec(
                &name("server_connection_failure_count"),
                "Count of failures to send to or receive from the proxy server, labeled by the direction (from_server or to_server). DEPRECATED, please use stream_events_error_total",
                &["direction"],
            ),
            dials_cancelled: registry.counter(
                "tether_agent_dials_cancelled_total",
                "In-flight dials abandoned because the server cancelled them (DIAL_CLS)",
            ),
            policy_cuts: registry.counter(
                "tether_agent_destination_policy_connections_closed_total",
                "Open connections closed because a reloaded destination policy denies their destination (the client sees the close with the policy's error)",
            ),
            control_plane_connections: registry.gauge(
                "tether_agent_control_plane_connections",
                "Open connections from the control-plane listener, carried to the server (reverse dials)",
            ),
            control_plane_dials: registry.counter_vec(
                "tether_agent_control_plane_dials_total",
                "Reverse dials from the control-plane listener, by result (connected, refused, timeout, unavailable, lost)",
                &["result"],
            ),
            resume: tether_tunnel::ResumeMetrics::register(registry, "agent"),
        };
        // Registered, never counted, as upstream's (which sends watch results to
        // lease_lists_total). lease_lists_total and lease_list_latency_seconds belong to
        // tether-kube's Lease counter, registered when it runs.
        registry.counter_vec(
            &name("lease_watches_total"),
            "Count of server lease watch calls made by the agent to the k8s apiserver, labeled by HTTP response code and reason",
            &["http_response_code", "reason"],
        );
        m.known_server_count.set(1);
        m
    }

    /// An endpoint connection ended: its lifetime, and upstream's reason (ANP#908): the
    /// server closed it (CLOSE_REQ), the endpoint did, or the agent's stream to the server
    /// ended under it.
    pub(crate) fn endpoint_connection_ended(&self, ended: &tether_tunnel::Ended) {
        use tether_tunnel::Initiator as By;
        self.endpoint_connection_duration
            .observe(ended.duration().as_secs_f64());
        let reason = match ended.outcome.initiator {
            By::Peer => "server_close",
            By::Local => "endpoint_close",
            By::Stream => "agent_shutdown",
        };
        self.endpoint_close_reasons.with(&[reason]).inc();
    }

    pub(crate) fn endpoint_dial_failure(&self, reason: DialFailure) {
        let label = match reason {
            DialFailure::Timeout => "timeout",
            DialFailure::Unknown => "unknown",
            DialFailure::Policy => "policy",
        };
        self.endpoint_dial_failures.with(&[label]).inc();
    }

    pub(crate) fn control_plane_dial(&self, result: ReverseDial) {
        let label = match result {
            ReverseDial::Connected => "connected",
            ReverseDial::Refused => "refused",
            ReverseDial::Timeout => "timeout",
            ReverseDial::Unavailable => "unavailable",
            ReverseDial::Lost => "lost",
            ReverseDial::OverLimit => "over_limit",
        };
        self.control_plane_dials.with(&[label]).inc();
    }

    /// `sent` is true for packets to the server (`from_agent`), false for received ones.
    pub(crate) fn packet(&self, sent: bool, packet: &Packet) {
        let index = packet.type_index();
        self.packet_counters[usize::from(sent)][index]
            .get_or_init(|| {
                let segment = if sent { "from_agent" } else { "to_agent" };
                self.stream_packets
                    .with(&[segment, Packet::TYPE_NAMES[index]])
            })
            .inc();
    }

    pub(crate) fn stream_error(&self, sent: bool, code: &str) {
        let segment = if sent { "from_agent" } else { "to_agent" };
        self.stream_errors.with(&[segment, code, "Unknown"]).inc();
        let direction = if sent { "to_server" } else { "from_server" };
        self.server_connection_failures.with(&[direction]).inc();
    }
}
