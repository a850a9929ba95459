//! The server's audit records: every refused or failed dial and every tunneled connection,
//! written through [`tether_observe::audit`] (off the data path, bounded, dropped and counted
//! when the writer falls behind).
//!
//! A dial is followed from DIAL_REQ to its connection's end by the agent stream's hooks, so
//! the one record per connection carries the [`RequestContext`] it was dialed with next to the
//! table's typed [`Ended`] outcome.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tether_grpc::{PeerIdentity, PeerTransport};
use tether_observe::audit::{AuditEvent, AuditLog, AuditRecord, millis};
use tether_proto::{ConnectId, DialId};
use tether_tunnel::{CloseError, DialError, Ended, Initiator};

use crate::request::RequestContext;

/// Writes the server's records.
#[derive(Debug)]
pub(crate) struct Audit {
    log: AuditLog,
    server_id: String,
}

impl Audit {
    pub(crate) fn new(log: AuditLog, server_id: String) -> Self {
        Self { log, server_id }
    }

    fn record(&self, request: &RequestContext, event: AuditEvent) -> AuditRecord {
        let (client, client_pid) = client(&request.peer);
        AuditRecord {
            event: Some(event),
            side: "server",
            server_id: self.server_id.clone(),
            dial_id: Some(request.dial_id.to_string()),
            frontend: Some(request.frontend.as_str()),
            transport: Some(transport(&request.peer)),
            client,
            client_pid,
            requested: request.address.clone(),
            outcome: "error",
            ..Default::default()
        }
    }

    /// A dial refused before any agent was asked (bad address, no agent, limits).
    pub(crate) fn refused(&self, request: &RequestContext, reason: &str) {
        self.log.record(AuditRecord {
            reason: Some(reason.to_owned()),
            ..self.record(request, AuditEvent::DialRefused)
        });
    }

    fn failed(
        &self,
        request: &RequestContext,
        agent_id: &str,
        latency: Option<Duration>,
        reason: String,
    ) {
        self.log.record(AuditRecord {
            agent_id: Some(agent_id.to_owned()),
            dial_latency_ms: latency.map(millis),
            reason: Some(reason),
            ..self.record(request, AuditEvent::DialFailed)
        });
    }
}

/// The client identity as the listener proved it, and its pid on a Unix socket.
fn client(peer: &PeerIdentity) -> (Option<String>, Option<i32>) {
    let principal = peer.principal().to_string();
    (
        Some(principal),
        peer.unix.and_then(|credentials| credentials.pid),
    )
}

fn transport(peer: &PeerIdentity) -> &'static str {
    match peer.transport {
        PeerTransport::Unix => "uds",
        PeerTransport::Tls => "tls",
        PeerTransport::Tcp => "tcp",
    }
}

/// One agent stream's dials in flight and connections open, each waiting for its record.
#[derive(Debug)]
pub(crate) struct StreamAudit {
    audit: Arc<Audit>,
    agent_id: String,
    followed: Mutex<Followed>,
}

#[derive(Debug, Default)]
struct Followed {
    dials: HashMap<DialId, RequestContext>,
    connections: HashMap<ConnectId, (RequestContext, Option<Duration>)>,
}

impl StreamAudit {
    pub(crate) fn new(audit: Arc<Audit>, agent_id: String) -> Self {
        Self {
            audit,
            agent_id,
            followed: Mutex::default(),
        }
    }

    fn followed(&self) -> MutexGuard<'_, Followed> {
        self.followed.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Called before DIAL_REQ leaves, so the answer's hook always finds the request.
    pub(crate) fn dialing(&self, request: &RequestContext) {
        self.followed()
            .dials
            .insert(request.dial_id, request.clone());
    }

    /// The dial ended without an answer from the agent: never sent (limits, stream gone) or
    /// given up by the frontend while pending.
    pub(crate) fn unanswered(&self, random: DialId, reason: &str) {
        let request = self.followed().dials.remove(&random);
        if let Some(request) = request {
            self.audit
                .failed(&request, &self.agent_id, None, reason.to_owned());
        }
    }

    /// The table settled the dial: a failure is recorded now, a connection when it ends.
    pub(crate) fn settled(
        &self,
        random: DialId,
        latency: Option<Duration>,
        result: &Result<ConnectId, DialError>,
    ) {
        let mut followed = self.followed();
        let Some(request) = followed.dials.remove(&random) else {
            return;
        };
        match result {
            Ok(id) => {
                followed.connections.insert(*id, (request, latency));
            }
            Err(error) => {
                drop(followed);
                self.audit
                    .failed(&request, &self.agent_id, latency, dial_error_text(error));
            }
        }
    }

    pub(crate) fn ended(&self, ended: &Ended) {
        let Some((request, latency)) = self.followed().connections.remove(&ended.id) else {
            return;
        };
        let closed_by = match (&ended.outcome.error, ended.outcome.initiator) {
            (Some(CloseError::Overflow { .. } | CloseError::CloseTimeout), _) => "server",
            (_, Initiator::Local) => "client",
            (_, Initiator::Peer) => "agent",
            (_, Initiator::Stream) => "stream",
        };
        let record = AuditRecord {
            agent_id: Some(self.agent_id.clone()),
            connection_id: Some(ended.id.0),
            dial_latency_ms: latency.map(millis),
            // The server sends the client's bytes to the agent, which writes them to the
            // destination.
            bytes_to_destination: Some(ended.bytes_to_peer),
            bytes_from_destination: Some(ended.bytes_from_peer),
            duration_ms: Some(millis(ended.duration())),
            ..self.audit.record(&request, AuditEvent::Connection)
        };
        let error = ended.outcome.error.as_ref().map(ToString::to_string);
        self.audit.log.record(record.ended(closed_by, error));
    }
}

fn dial_error_text(error: &DialError) -> String {
    crate::dial::DialError::from(error.clone()).to_string()
}
