//! The agent's audit records: each dial the server asked for that failed or was refused by
//! policy, and each connection, with the address the agent actually connected to (the server
//! knows only the requested one). Records share the dial id with the server's.
//!
//! A connection's record joins two halves that arrive in either order: what the connection's
//! task knows (request, dialed address, dial latency) and the table's typed [`Ended`]. The
//! second half to arrive writes the record, so no interleaving loses one.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tether_observe::audit::{AuditEvent, AuditLog, AuditRecord, millis};
use tether_proto::{ConnectId, DialId};
use tether_tunnel::{CloseError, Ended, Initiator};

/// What the connection's task knows about one dial.
#[derive(Clone, Debug)]
pub(crate) struct DialFacts {
    pub(crate) dial_id: DialId,
    pub(crate) requested: String,
    pub(crate) dialed: Option<String>,
    pub(crate) latency: Option<Duration>,
}

#[derive(Debug)]
enum Half {
    Facts(DialFacts),
    Ended(Ended),
}

/// One server stream's audit trail.
#[derive(Debug)]
pub(crate) struct StreamAudit {
    log: AuditLog,
    server_id: String,
    agent_id: String,
    halves: Mutex<HashMap<ConnectId, Half>>,
}

impl StreamAudit {
    pub(crate) fn new(log: AuditLog, server_id: String, agent_id: String) -> Self {
        Self {
            log,
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
            side: "agent",
            server_id: self.server_id.clone(),
            agent_id: Some(self.agent_id.clone()),
            dial_id: Some(facts.dial_id.to_string()),
            requested: facts.requested.clone(),
            dialed: facts.dialed.clone(),
            dial_latency_ms: facts.latency.map(millis),
            outcome: "error",
            ..Default::default()
        }
    }

    /// A dial that produced no connection: refused by policy, or failed.
    pub(crate) fn dial_ended(&self, facts: &DialFacts, refused: bool, reason: &str) {
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

    /// The connection's task's half, right after the connection was accepted.
    pub(crate) fn connected(&self, id: ConnectId, facts: DialFacts) {
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
    pub(crate) fn ended(&self, ended: Ended) {
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
            (Some(CloseError::Overflow { .. } | CloseError::CloseTimeout), _) => "agent",
            (_, Initiator::Local) => "destination",
            (_, Initiator::Peer) => "server",
            (_, Initiator::Stream) => "stream",
        };
        let record = AuditRecord {
            connection_id: Some(ended.id.0),
            // The agent writes what it receives from the server to the destination.
            bytes_to_destination: Some(ended.bytes_from_peer),
            bytes_from_destination: Some(ended.bytes_to_peer),
            duration_ms: Some(millis(ended.duration())),
            ..self.record(facts, AuditEvent::Connection)
        };
        let error = ended.outcome.error.as_ref().map(ToString::to_string);
        self.log.record(record.ended(closed_by, error));
    }
}
