//! How dials and connections end: typed, so metrics, logs and audit records read one value
//! instead of parsing strings.

use std::time::{Duration, Instant};

use tether_proto::{ConnectId, DialId};

/// Who ended a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Initiator {
    /// This end: the frontend client (server) or the destination (agent), or this table
    /// enforcing a limit.
    Local,
    /// The peer at the other end of the stream.
    Peer,
    /// Neither: the stream itself ended.
    Stream,
}

impl Initiator {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Local => "local",
            Self::Peer => "peer",
            Self::Stream => "stream",
        }
    }
}

/// Why a connection ended abnormally.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CloseError {
    /// The peer closed with this error text (truncated to the table's bound).
    Peer(String),
    /// This end closed with this error (e.g. the destination failed).
    Local(String),
    /// The peer sent past the connection's queue limit (a tether peer past its credit, or an
    /// upstream peer to a reader that made no progress for the stall period).
    Overflow { limit: usize },
    /// The stream carrying the connection ended.
    StreamLost(String),
    /// After a local close, the peer did not confirm in time.
    CloseTimeout,
    /// The peer answered a dial that this end had already given up.
    Abandoned,
}

impl std::fmt::Display for CloseError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Peer(text) | Self::Local(text) | Self::StreamLost(text) => f.write_str(text),
            Self::Overflow { limit } => write!(f, "connection buffer of {limit} bytes exceeded"),
            Self::CloseTimeout => f.write_str("timed out waiting for the agent to close"),
            Self::Abandoned => f.write_str("dial abandoned before its answer"),
        }
    }
}

/// The one outcome of an established connection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub initiator: Initiator,
    /// `None` for a normal close.
    pub error: Option<CloseError>,
}

/// An established connection whose outcome was just decided. Emitted exactly once per
/// connection, and the record every later consumer (metrics, audit) reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub id: ConnectId,
    /// The dial that opened it, so a log line names both ids.
    pub dial_id: DialId,
    pub outcome: Outcome,
    /// Payload bytes received from the peer.
    pub bytes_from_peer: u64,
    /// Payload bytes sent to the peer.
    pub bytes_to_peer: u64,
    pub opened_at: Instant,
    pub ended_at: Instant,
}

impl Ended {
    pub fn duration(&self) -> Duration {
        self.ended_at.saturating_duration_since(self.opened_at)
    }
}

/// Why a dial through the peer produced no connection (server role).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DialError {
    /// The agent tried and failed; its error text (truncated).
    Endpoint(String),
    /// The stream ended before the answer.
    StreamLost(String),
    /// No answer before the dial deadline.
    Timeout,
    /// The agent sent DIAL_CLS.
    ClosedByPeer,
    /// A dial with this ID is already pending on this stream.
    Duplicate(DialId),
    /// The stream already has its maximum of pending dials.
    TooManyPending { limit: usize },
}

/// Why the agent should stop dialing (agent role).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DialCancel {
    /// The server sent DIAL_CLS.
    ByPeer,
    /// The dial deadline passed; the table already answered with a timeout error.
    Timeout,
    /// The stream ended.
    StreamLost,
}

impl std::fmt::Display for DialCancel {
    /// A log field's value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::ByPeer => "cancelled by the peer",
            Self::Timeout => "dial timeout",
            Self::StreamLost => "stream lost",
        })
    }
}
