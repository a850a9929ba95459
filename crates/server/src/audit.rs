//! The server's audit records: every refused or failed dial, and every tunneled connection
//! twice, when it opens and when it ends, written through [`tether_observe::audit`] (off the
//! data path, bounded, dropped and counted when the writer falls behind).
//!
//! The agent stream's [`Requests`](crate::request::Requests) follow each dial from
//! DIAL_REQ to its connection's end, so a connection's two records carry the
//! [`RequestContext`] it was dialed with and the configuration generation in force then; the
//! end record adds the table's typed [`Ended`] outcome. The opening is recorded when the
//! agent's DIAL_RSP settles the dial, the moment the client is answered, and before the end
//! record in any case (see [`Requests::answered`](crate::request::Requests::answered)): a
//! connection that runs for hours is in the log from its first byte.
//!
//! Records name the tenant: the one the request arrived for or was resolved to, or, for the
//! records of an agent's stream, the agent's ([`Audit::for_tenant`]).

use std::time::Duration;

use tether_grpc::{PeerIdentity, PeerTransport};
use tether_observe::audit::AuditLog;
use tether_observe::audit::{AuditEvent, AuditRecord, millis};
use tether_proto::ConnectId;
use tether_tunnel::{CloseError, Ended, Initiator};

use crate::request::{Followed, FrontendKind, Hop, RequestContext};

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

    /// The records of one agent stream, stamped with the agent's tenant.
    pub(crate) fn for_tenant(&self, tenant: &str) -> Self {
        Self {
            log: self.log.for_tenant(tenant),
            server_id: self.server_id.clone(),
        }
    }

    /// The log itself, for the records of reverse dials (written per agent stream).
    pub(crate) fn log(&self) -> &AuditLog {
        &self.log
    }

    fn record(&self, request: &RequestContext, event: AuditEvent) -> AuditRecord {
        let (client, client_pid) = client(&request.peer);
        AuditRecord {
            event: Some(event),
            side: "server",
            server_id: self.server_id.clone(),
            tenant: tenant_name(request.tenant.as_deref()),
            dial_id: Some(request.dial_id.to_string()),
            frontend: Some(request.frontend.as_str()),
            transport: Some(transport(&request.peer)),
            client,
            client_pid,
            via_server: match &request.hop {
                Some(Hop::Via(server)) => Some(server.to_string()),
                _ => None,
            },
            from_server: match &request.hop {
                Some(Hop::From(server)) => Some(server.to_string()),
                _ => None,
            },
            requested: request.address.clone(),
            outcome: "error",
            ..Default::default()
        }
    }

    /// A dial refused before any agent was asked (bad address, no agent, limits, policy);
    /// `tenant` once the request's tenant was resolved.
    pub(crate) fn refused(&self, request: &RequestContext, tenant: Option<&str>, reason: &str) {
        let record = self.record(request, AuditEvent::DialRefused);
        self.log.record(AuditRecord {
            tenant: tenant_name(tenant).or(record.tenant.clone()),
            reason: Some(reason.to_owned()),
            ..record
        });
    }

    /// A frontend request refused before it named a dial (the HTTP CONNECT head parser's
    /// 431, 400 and 405, or a head not complete in time).
    pub(crate) fn request_refused(
        &self,
        frontend: FrontendKind,
        peer: &PeerIdentity,
        tenant: Option<&str>,
        reason: &str,
    ) {
        let (client, client_pid) = client(peer);
        self.log.record(AuditRecord {
            event: Some(AuditEvent::RequestRefused),
            side: "server",
            server_id: self.server_id.clone(),
            tenant: tenant_name(tenant),
            frontend: Some(frontend.as_str()),
            transport: Some(transport(peer)),
            client,
            client_pid,
            outcome: "error",
            reason: Some(reason.to_owned()),
            ..Default::default()
        });
    }

    /// A dial an agent was asked for (or was about to be) that produced no connection.
    pub(crate) fn failed(
        &self,
        request: &RequestContext,
        agent_id: &str,
        latency: Option<Duration>,
        error: &crate::error::DialError,
    ) {
        self.log.record(AuditRecord {
            agent_id: Some(agent_id.to_owned()),
            dial_latency_ms: latency.map(millis),
            reason: Some(error.to_string()),
            ..self.record(request, AuditEvent::DialFailed)
        });
    }

    /// A connection's opening: the agent answered its dial with connection `id`.
    pub(crate) fn opened(&self, followed: &Followed, agent_id: &str, id: ConnectId) {
        self.log
            .record(self.connection_record(followed, agent_id, id).opened());
    }

    /// What a connection's two records share: the request, the agent, the connection and the
    /// generation.
    fn connection_record(&self, followed: &Followed, agent_id: &str, id: ConnectId) -> AuditRecord {
        AuditRecord {
            generation: Some(followed.generation),
            agent_id: Some(agent_id.to_owned()),
            connection_id: Some(id.0),
            dial_latency_ms: followed.latency.map(millis),
            ..self.record(&followed.request, AuditEvent::Connection)
        }
    }

    /// A connection's end, with the request it was dialed for; `cut_by_generation` when a
    /// reload's retirement of its agent stream cut it.
    pub(crate) fn connection(
        &self,
        followed: &Followed,
        agent_id: &str,
        ended: &Ended,
        cut_by_generation: Option<u64>,
    ) {
        let closed_by = match (&ended.outcome.error, ended.outcome.initiator) {
            (Some(CloseError::Overflow { .. } | CloseError::CloseTimeout), _) => "server",
            (_, Initiator::Local) => "client",
            (_, Initiator::Peer) => "agent",
            (_, Initiator::Stream) => "stream",
        };
        let record = AuditRecord {
            // The server sends the client's bytes to the agent, which writes them to the
            // destination.
            bytes_to_destination: Some(ended.bytes_to_peer),
            bytes_from_destination: Some(ended.bytes_from_peer),
            duration_ms: Some(millis(ended.duration())),
            cut_by_generation,
            ..self.connection_record(followed, agent_id, ended.id)
        };
        let error = ended.outcome.error.as_ref().map(ToString::to_string);
        self.log.record(record.ended(closed_by, error));
    }
}

/// A tenant's name for a record; the implicit tenant (no tenant table) has none.
fn tenant_name(tenant: Option<&str>) -> Option<String> {
    tenant.filter(|name| !name.is_empty()).map(str::to_owned)
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
