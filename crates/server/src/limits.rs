//! Limits and deadlines that keep one peer from exhausting the server, with their defaults.
//!
//! Each one is a flag of `tether server` (see docs/src/reference/flags.md and SECURITY.md) and is
//! counted in `tether_server_limit_hits_total{limit}` when it refuses or closes something.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_observe::metrics::{Counter, CounterVec, Registry};

/// The default of `--control-plane-max-connections-per-stream`.
pub const DEFAULT_MAX_REVERSE_CONNECTIONS_PER_STREAM: usize = 256;

/// The server's limits; `Default` is the safe default every flag documents.
#[derive(Clone, Debug)]
pub struct Limits {
    /// From TCP accept through TLS, the HTTP/2 preface and the client's first SETTINGS.
    pub setup_timeout: Duration,
    /// An HTTP/2 connection carrying no stream is closed (GOAWAY) after this; `None` never.
    pub idle_connection_timeout: Option<Duration>,
    /// Open connections on the frontend listener; more are closed at accept.
    pub max_frontend_connections: usize,
    /// Open connections on the agent listener: every agent of the largest tenant
    /// (`max_agents`) with a second connection while it reconnects or resumes.
    pub max_agent_connections: usize,
    /// Connections from one IP address on the agent listener that no agent stream has been
    /// admitted on yet (TLS, then the credential and admission checks); admitted ones do not
    /// count, so any number of agents may share an address. 0 means no limit.
    pub max_agent_connections_per_address: usize,
    /// Open connections from one IP address on a TCP frontend; 0 means no limit.
    pub max_frontend_connections_per_address: usize,
    /// Concurrent streams per frontend HTTP/2 connection.
    pub max_streams_per_frontend_connection: u32,
    /// Distinct connected agent IDs per tenant.
    pub max_agents: usize,
    /// How long a gRPC frontend stream may take to send its DIAL_REQ; stray packets before
    /// it do not extend the deadline.
    pub first_packet_timeout: Duration,
    /// Reverse dials one agent stream may have under way or connected at once (counted in
    /// `tether_server_control_plane_dials_total{result="over_limit"}`).
    pub max_reverse_connections_per_stream: usize,
    /// Bytes of large incomplete messages (beyond `tether_grpc::FREE_PARTIAL_BYTES` each) all
    /// agent streams may hold at once; a stream whose message would exceed it is ended with
    /// RESOURCE_EXHAUSTED. Agents' messages are far smaller, so only a peer that holds
    /// messages open on purpose meets it.
    pub agent_partial_message_bytes: usize,
    /// Open connections on the health port, and on the admin port; more are closed at accept.
    pub max_http_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            setup_timeout: Duration::from_secs(10),
            idle_connection_timeout: Some(Duration::from_secs(3600)),
            max_frontend_connections: 20_000,
            max_agent_connections: 40_000,
            max_agent_connections_per_address: 100,
            max_frontend_connections_per_address: 0,
            max_streams_per_frontend_connection: tether_grpc::DEFAULT_FRONTEND_STREAMS,
            max_agents: 20_000,
            first_packet_timeout: Duration::from_secs(60),
            max_reverse_connections_per_stream: DEFAULT_MAX_REVERSE_CONNECTIONS_PER_STREAM,
            agent_partial_message_bytes: 64 << 20,
            max_http_connections: tether_observe::http::DEFAULT_MAX_CONNECTIONS,
        }
    }
}

/// `limit` label values of `tether_server_limit_hits_total`.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Limit {
    SetupTimeout,
    ListenerConnections,
    AddressConnections,
    Agents,
    DuplicateAgentId,
    AgentIdentity,
    AgentToken,
    BadAgentMetadata,
    BadDialAddress,
    PartialMessages,
    HttpConnections,
}

impl Limit {
    fn label(self) -> &'static str {
        match self {
            Self::SetupTimeout => "setup_timeout",
            Self::ListenerConnections => "listener_connections",
            Self::AddressConnections => "address_connections",
            Self::Agents => "agents",
            Self::DuplicateAgentId => "duplicate_agent_id",
            Self::AgentIdentity => "agent_identity",
            Self::AgentToken => "agent_token",
            Self::BadAgentMetadata => "bad_agent_metadata",
            Self::BadDialAddress => "bad_dial_address",
            Self::PartialMessages => "partial_messages",
            Self::HttpConnections => "http_connections",
        }
    }
}

/// Counts refusals and closes by limit.
#[derive(Clone, Debug)]
pub(crate) struct LimitMetrics {
    hits: Arc<CounterVec>,
}

impl LimitMetrics {
    pub(crate) fn register(registry: &Registry) -> Self {
        let hits = registry.counter_vec(
            "tether_server_limit_hits_total",
            "Connections, streams and requests refused or closed by a server limit or check, by limit",
            &["limit"],
        );
        // Present from the start, so that alerts on them need no absent() special case.
        for limit in [Limit::SetupTimeout, Limit::DuplicateAgentId] {
            hits.with(&[limit.label()]);
        }
        Self { hits }
    }

    pub(crate) fn hit(&self, limit: Limit) {
        self.counter(limit).inc();
    }

    /// The counter of one limit, for code that counts without this type.
    pub(crate) fn counter(&self, limit: Limit) -> Arc<Counter> {
        self.hits.with(&[limit.label()])
    }
}

/// Connection slots of one listener: a total cap, and a cap per address on the connections
/// not yet admitted. A connection leaves its address's count once [`SlotAdmission::admit`] is
/// called for it (the agent listener does so when a stream's credential is accepted), so a
/// flood of strangers from one address stays bounded while any number of authenticated
/// agents may share an address (nodes behind a NAT gateway or a load balancer's SNAT).
#[derive(Debug)]
pub(crate) struct ConnectionSlots {
    max_total: usize,
    max_per_address: usize,
    state: Mutex<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    total: usize,
    per_address: HashMap<IpAddr, usize>,
}

/// Holds one slot until dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<ConnectionSlots>,
    admission: SlotAdmission,
}

/// Takes a connection out of its address's count of connections not yet admitted; shared
/// with whatever decides that the connection's peer is admitted.
#[derive(Clone, Debug)]
pub(crate) struct SlotAdmission {
    slots: Arc<ConnectionSlots>,
    /// The address still counted, until the connection is admitted or closed.
    counted: Arc<Mutex<Option<IpAddr>>>,
}

impl ConnectionSlots {
    pub(crate) fn new(max_total: usize, max_per_address: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_address,
            state: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes a slot for a connection from `address`, or says which limit refused it.
    pub(crate) fn take(self: &Arc<Self>, address: Option<IpAddr>) -> Result<Slot, Limit> {
        let mut state = self.lock();
        if state.total >= self.max_total {
            return Err(Limit::ListenerConnections);
        }
        if let Some(ip) = address
            && self.max_per_address > 0
        {
            let n = state.per_address.entry(ip).or_default();
            if *n >= self.max_per_address {
                return Err(Limit::AddressConnections);
            }
            *n += 1;
        }
        state.total += 1;
        Ok(Slot {
            slots: self.clone(),
            admission: SlotAdmission {
                slots: self.clone(),
                counted: Arc::new(Mutex::new(address.filter(|_| self.max_per_address > 0))),
            },
        })
    }

    fn uncount(&self, ip: IpAddr) {
        let mut state = self.lock();
        if let Some(n) = state.per_address.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                state.per_address.remove(&ip);
            }
        }
    }
}

impl Slot {
    /// The handle that admits this slot's connection.
    pub(crate) fn admission(&self) -> SlotAdmission {
        self.admission.clone()
    }
}

impl SlotAdmission {
    /// The connection's peer is admitted: it no longer counts against its address's cap.
    /// Idempotent: later calls (more streams on the connection) do nothing.
    pub(crate) fn admit(&self) {
        let counted = self
            .counted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(ip) = counted {
            self.slots.uncount(ip);
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.admission.admit();
        self.slots.lock().total -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_cap_total_and_per_address_and_come_back() {
        let slots = ConnectionSlots::new(3, 2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let a1 = slots.take(Some(a)).unwrap();
        let _a2 = slots.take(Some(a)).unwrap();
        assert!(matches!(
            slots.take(Some(a)),
            Err(Limit::AddressConnections)
        ));
        let _b1 = slots.take(Some(b)).unwrap();
        assert!(matches!(slots.take(None), Err(Limit::ListenerConnections)));
        drop(a1);
        let _a3 = slots.take(Some(a)).unwrap();
    }

    #[test]
    fn admitted_connections_leave_their_address_count_but_not_the_total() {
        let slots = ConnectionSlots::new(4, 1);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let first = slots.take(Some(a)).unwrap();
        assert!(matches!(
            slots.take(Some(a)),
            Err(Limit::AddressConnections)
        ));
        first.admission().admit();
        first.admission().admit();
        let second = slots.take(Some(a)).unwrap();
        second.admission().admit();
        let _third = slots.take(Some(a)).unwrap();
        assert!(matches!(
            slots.take(Some(a)),
            Err(Limit::AddressConnections)
        ));
        let _fourth = slots.take(None).unwrap();
        assert!(matches!(slots.take(None), Err(Limit::ListenerConnections)));
        // An admitted connection's close gives back its total slot only.
        drop(first);
        drop(second);
        assert!(matches!(
            slots.take(Some(a)),
            Err(Limit::AddressConnections)
        ));
        let _fifth = slots.take(Some("10.0.0.2".parse().unwrap())).unwrap();
    }
}
