//! Audit records that join what a connection's task knows with the table's outcome: the
//! agent's for forward dials it answered, and both ends' for reverse dials (the agent dials,
//! the server answers). Records share the dial id across the two ends.
//!
//! A connection's record joins two halves that arrive in either order: what the connection's
//! task knows (request, dialed address, dial latency) and the table's typed [`Ended`]. The
//! second half to arrive writes the record, so no interleaving loses one.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tether_observe::audit::{AuditEvent, AuditLog, AuditRecord, millis};
use tether_proto::{ConnectId, DialId};
use tether_session::{CloseError, Ended, Initiator};

/// What the connection's task knows about one dial.
#[derive(Clone, Debug)]
pub struct DialFacts {
    pub dial_id: DialId,
    pub requested: String,
    /// The socket address the answerer connected to.
    pub dialed: Option<String>,
    pub latency: Option<Duration>,
}

/// Which end writes the records, and what the names in `closed_by` are from there.
#[derive(Clone, Copy, Debug)]
pub struct AuditSide {
    /// `server` or `agent`.
    pub side: &'static str,
    /// `Some("reverse")` for reverse dials.
    pub direction: Option<&'static str>,
    /// This end answered the dials (it wrote to the destination what the peer sent).
    pub answerer: bool,
    /// Who `Initiator::Local` is: `destination` (answerer) or `client` (dialer).
    pub local: &'static str,
    /// Who `Initiator::Peer` is.
    pub peer: &'static str,
}

impl AuditSide {
    /// The agent answering the server's dials.
    pub const AGENT_FORWARD: Self = Self {
        side: "agent",
        direction: None,
        answerer: true,
        local: "destination",
        peer: "server",
    };
    /// The agent dialing for a client on its control-plane listener.
    pub const AGENT_REVERSE: Self = Self {
        side: "agent",
        direction: Some("reverse"),
        answerer: false,
        local: "client",
        peer: "server",
    };
    /// The server dialing a control-plane endpoint for an agent.
    pub const SERVER_REVERSE: Self = Self {
        side: "server",
        direction: Some("reverse"),
        answerer: true,
        local: "destination",
        peer: "agent",
    };
}

#[derive(Debug)]
enum Half {
    Facts(DialFacts),
    Ended(Ended),
}

/// One stream's audit trail, from one end.
#[derive(Debug)]
pub struct StreamAudit {
    log: AuditLog,
    side: AuditSide,
    server_id: String,
    agent_id: String,
    halves: Mutex<HashMap<ConnectId, Half>>,
}

impl StreamAudit {
    pub fn new(log: AuditLog, side: AuditSide, server_id: String, agent_id: String) -> Self {
        Self {
            log,
            side,
            server_id,
            agent_id,
            halves: Mutex::default(),
        }
    }

    fn halves(&self) -> MutexGuard<'_, HashMap<ConnectId, Half>> {
        self.halves.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn record(&self, facts: &DialFacts, event: AuditEvent) -> AuditRecord {
        AuditRecord {
            event: Some(event),
            side: self.side.side,
            server_id: self.server_id.clone(),
            agent_id: Some(self.agent_id.clone()),
            dial_id: Some(facts.dial_id.to_string()),
            direction: self.side.direction,
            requested: facts.requested.clone(),
            dialed: facts.dialed.clone(),
            dial_latency_ms: facts.latency.map(millis),
            outcome: "error",
            ..Default::default()
        }
    }

    /// A dial that produced no connection: refused (by policy or an allowlist), or failed.
    pub fn dial_ended(&self, facts: &DialFacts, refused: bool, reason: &str) {
        let event = if refused {
            AuditEvent::DialRefused
        } else {
            AuditEvent::DialFailed
        };
        self.log.record(AuditRecord {
            reason: Some(reason.to_owned()),
            ..self.record(facts, event)
        });
    }

    /// The connection's task's half, right after the connection was established.
    pub fn connected(&self, id: ConnectId, facts: DialFacts) {
        let mut halves = self.halves();
        match halves.remove(&id) {
            Some(Half::Ended(ended)) => {
                drop(halves);
                self.write(&facts, &ended);
            }
            _ => {
                halves.insert(id, Half::Facts(facts));
            }
        }
    }

    /// The table's half.
    pub fn ended(&self, ended: Ended) {
        let mut halves = self.halves();
        match halves.remove(&ended.id) {
            Some(Half::Facts(facts)) => {
                drop(halves);
                self.write(&facts, &ended);
            }
            _ => {
                halves.insert(ended.id, Half::Ended(ended));
            }
        }
    }

    fn write(&self, facts: &DialFacts, ended: &Ended) {
        let closed_by = match (&ended.outcome.error, ended.outcome.initiator) {
            (Some(CloseError::Overflow { .. } | CloseError::CloseTimeout), _) => self.side.side,
            (_, Initiator::Local) => self.side.local,
            (_, Initiator::Peer) => self.side.peer,
            (_, Initiator::Stream) => "stream",
        };
        // The answerer writes what it receives from the peer to the destination; the dialer
        // sends its client's bytes to the peer, toward the destination.
        let (to_destination, from_destination) = if self.side.answerer {
            (ended.bytes_from_peer, ended.bytes_to_peer)
        } else {
            (ended.bytes_to_peer, ended.bytes_from_peer)
        };
        let record = AuditRecord {
            connection_id: Some(ended.id.0),
            bytes_to_destination: Some(to_destination),
            bytes_from_destination: Some(from_destination),
            duration_ms: Some(millis(ended.duration())),
            ..self.record(facts, AuditEvent::Connection)
        };
        let error = ended.outcome.error.as_ref().map(ToString::to_string);
        self.log.record(record.ended(closed_by, error));
    }
}
