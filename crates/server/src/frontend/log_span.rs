//! The span a frontend connection's log lines are emitted in. It carries the connection's
//! ids (server, dial, agent, connection), each filled in once known, so that every line of
//! the connection, wherever in the frontend or the dial it is written, can be found with one
//! `grep` in the server's log as in the agent's.
//!
//! It is a DEBUG span: below `-v=5` it is disabled and costs a branch per poll. The
//! connection's INFO lines are written by its agent stream, with the same ids as fields.

use tether_proto::{ConnectId, DialId};
use tracing::Span;
use tracing::field::{Empty, display};

/// A span for one frontend connection (an HTTP CONNECT socket or a gRPC `Proxy` stream).
pub(crate) fn connection(server_id: &str) -> Span {
    tracing::debug_span!(
        "connection",
        server.id = %server_id,
        dial.id = Empty,
        agent.id = Empty,
        connect.id = Empty,
    )
}

/// Records the dial id in the current connection span, once the request named it.
pub(crate) fn record_dial(dial_id: DialId) {
    Span::current().record("dial.id", display(dial_id));
}

/// Records the agent chosen for the dial in the current connection span.
pub(crate) fn record_agent(agent_id: &str) {
    Span::current().record("agent.id", display(agent_id));
}

/// Records the id the agent gave the connection in the current connection span.
pub(crate) fn record_connection(connect_id: ConnectId) {
    Span::current().record("connect.id", display(connect_id));
}
