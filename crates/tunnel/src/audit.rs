//! Audit records that join what a connection's task knows with the table's outcome: the
//! agent's for forward dials it answered, and both ends' for reverse dials (the agent dials,
//! the server answers). Records share the dial id across the two ends.
//!
//! A connection has two records. Its opening (`connection_opened`) is written by the
//! connection's task as soon as the connection is established, with what the task knows
//! (request, dialed address, dial latency). Its end (`connection`) joins that with the
//! table's typed [`Ended`]; the two halves arrive in either order, and the second to arrive
//! writes the record, so no interleaving loses one, and the opening is always written first.

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

/// What is known of one connection until both its halves arrived.
#[derive(Debug, Default)]
struct Halves {
    facts: Option<DialFacts>,
    ended: Option<Ended>,
    /// The configuration generation that cut the connection, if one did.
    cut_by_generation: Option<u64>,
}

/// One stream's audit trail, from one end.
#[derive(Debug)]
pub struct StreamAudit {
    log: AuditLog,
    side: AuditSide,
    server_id: String,
    agent_id: String,
    halves: Mutex<HashMap<ConnectId, Halves>>,
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

    fn halves(&self) -> MutexGuard<'_, HashMap<ConnectId, Halves>> {
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

    /// The connection's task's half, right after the connection was established: records the
    /// opening.
    pub fn connected(&self, id: ConnectId, facts: DialFacts) {
        // Before the facts are in the table: the end record cannot be written before this.
        self.log.record(
            AuditRecord {
                connection_id: Some(id.0),
                ..self.record(&facts, AuditEvent::Connection)
            }
            .opened(),
        );
        self.complete(id, |halves| halves.facts = Some(facts));
    }

    /// The table's half; `cut_by_generation` when the end is a reload's cut known there.
    pub fn ended(&self, ended: Ended, cut_by_generation: Option<u64>) {
        self.complete(ended.id, |halves| {
            halves.ended = Some(ended);
            halves.cut_by_generation = halves.cut_by_generation.or(cut_by_generation);
        });
    }

    /// Marks open connection `id` (its opening recorded) as cut by configuration generation
    /// `generation`, before its end arrives: its end record says so.
    pub fn cut(&self, id: ConnectId, generation: u64) {
        if let Some(known) = self.halves().get_mut(&id) {
            known.cut_by_generation = Some(generation);
        }
    }

    /// Adds what `add` knows of connection `id`; the second half to arrive writes the end.
    fn complete(&self, id: ConnectId, add: impl FnOnce(&mut Halves)) {
        let mut halves = self.halves();
        let known = halves.entry(id).or_default();
        add(known);
        if known.facts.is_none() || known.ended.is_none() {
            return;
        }
        let Some(Halves {
            facts: Some(facts),
            ended: Some(ended),
            cut_by_generation,
        }) = halves.remove(&id)
        else {
            return;
        };
        drop(halves);
        self.write(&facts, &ended, cut_by_generation);
    }

    fn write(&self, facts: &DialFacts, ended: &Ended, cut_by_generation: Option<u64>) {
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
            cut_by_generation,
            ..self.record(facts, AuditEvent::Connection)
        };
        let error = ended.outcome.error.as_ref().map(ToString::to_string);
        self.log.record(record.ended(closed_by, error));
    }
}

#[cfg(test)]
mod tests {

    use tether_observe::audit::AuditTarget;
    use tether_observe::metrics::Registry;
    use tether_session::Outcome;

    use super::*;

    fn ended(id: ConnectId, dial_id: DialId) -> Ended {
        let now = tether_observe::time::monotonic_now();
        Ended {
            id,
            dial_id,
            outcome: Outcome {
                initiator: Initiator::Peer,
                error: None,
            },
            bytes_from_peer: 10,
            bytes_to_peer: 20,
            opened_at: now,
            ended_at: now,
        }
    }

    fn facts(dial_id: DialId) -> DialFacts {
        DialFacts {
            dial_id,
            requested: "10.0.0.5:10250".into(),
            dialed: Some("10.0.0.5:10250".into()),
            latency: Some(Duration::from_millis(2)),
        }
    }

    /// Both interleavings of the task's half and the table's: an opening then an end, each
    /// once, the opening first, with the same dial and connection ids.
    #[tokio::test]
    async fn a_connection_is_recorded_when_it_opens_and_when_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("audit.log");
        let (log, writer) =
            AuditLog::open(&AuditTarget::File(path.clone()), &Registry::new()).unwrap();
        let task = writer.spawn();
        let audit = StreamAudit::new(log, AuditSide::AGENT_FORWARD, "s".into(), "a".into());
        // The task first, as usually.
        audit.connected(ConnectId(1), facts(DialId(11)));
        audit.ended(ended(ConnectId(1), DialId(11)), None);
        // The table first: the connection ended before its task got to record it.
        audit.ended(ended(ConnectId(2), DialId(22)), None);
        audit.connected(ConnectId(2), facts(DialId(22)));
        // Cut by a reload: marked while open (the agent's policy), or told with the end (the
        // server's retired stream), before its opening was recorded.
        audit.connected(ConnectId(3), facts(DialId(33)));
        audit.cut(ConnectId(3), 7);
        audit.ended(ended(ConnectId(3), DialId(33)), None);
        audit.ended(ended(ConnectId(4), DialId(44)), Some(5));
        audit.connected(ConnectId(4), facts(DialId(44)));
        // A cut of a connection already recorded leaves nothing behind.
        audit.cut(ConnectId(1), 9);
        assert!(audit.halves().is_empty());
        task.finish().await;
        let records: Vec<serde_json::Value> = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect();
        let summary: Vec<(&str, &str, i64)> = records
            .iter()
            .map(|r| {
                (
                    r["event"].as_str().unwrap(),
                    r["dial_id"].as_str().unwrap(),
                    r["connection_id"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("connection_opened", "11", 1),
                ("connection", "11", 1),
                ("connection_opened", "22", 2),
                ("connection", "22", 2),
                ("connection_opened", "33", 3),
                ("connection", "33", 3),
                ("connection_opened", "44", 4),
                ("connection", "44", 4),
            ]
        );
        let cuts: Vec<Option<u64>> = records
            .iter()
            .map(|r| r.get("cut_by_generation").and_then(|g| g.as_u64()))
            .collect();
        assert_eq!(cuts, [None, None, None, None, None, Some(7), None, Some(5)]);
        let opened = &records[0];
        assert_eq!(opened["side"], "agent");
        assert_eq!(opened["dialed"], "10.0.0.5:10250");
        assert_eq!(opened["outcome"], "ok");
        assert!(opened.get("closed_by").is_none() && opened.get("duration_ms").is_none());
        assert_eq!(records[1]["closed_by"], "server");
        assert_eq!(records[1]["bytes_to_destination"], 10);
    }
}
