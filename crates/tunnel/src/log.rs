//! The one log line of a connection's end, the same on the server and the agent.
//!
//! Every connection gets exactly one: INFO when it ended abnormally (an error on either end,
//! a lost stream, an overflow, a close never confirmed), DEBUG for a normal close, which is
//! not news. Each carries the connection's, dial's, agent's and server's IDs, so one `grep`
//! for any of them follows the connection across the server's and the agent's logs.
//!
//! The error text and the other end's ID come from the peer: they are shown through
//! [`LogText`], escaped and bounded, so a CLOSE_RSP error cannot forge a log line.

use tether_grpc::LogText;
use tether_session::Ended;

/// Logs `ended` as seen by the stream between `agent_id` and `server_id`.
pub fn log_ended(ended: &Ended, agent_id: &str, server_id: &str) {
    let duration_ms = ended.duration().as_millis() as u64;
    match &ended.outcome.error {
        Some(error) => tracing::info!(
            connect.id = %ended.id,
            dial.id = %ended.dial_id,
            agent.id = %LogText(agent_id),
            server.id = %LogText(server_id),
            initiator = ended.outcome.initiator.as_str(),
            error = %LogText(&error.to_string()),
            bytes_from_peer = ended.bytes_from_peer,
            bytes_to_peer = ended.bytes_to_peer,
            duration_ms,
            "connection ended abnormally"
        ),
        None => tracing::debug!(
            connect.id = %ended.id,
            dial.id = %ended.dial_id,
            agent.id = %LogText(agent_id),
            server.id = %LogText(server_id),
            initiator = ended.outcome.initiator.as_str(),
            bytes_from_peer = ended.bytes_from_peer,
            bytes_to_peer = ended.bytes_to_peer,
            duration_ms,
            "connection closed"
        ),
    }
}
