//! Everything that can end a native link, or refuse one.

use std::time::Duration;

use tether_conn::Code;

/// Why a native link failed. Its text names the side and what to check.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("native link: {0}")]
    Frame(tether_proto::link::LinkError),
    #[error("i/o: {0}")]
    Io(std::io::Error),
    /// The peer closed the connection at a frame boundary without a CLOSE: it stopped,
    /// restarted or gave the stream up (a resumable stream waits for it).
    #[error("the peer closed the connection without ending the stream")]
    PeerGone,
    /// The peer ended the stream, or refused it, with a status other than OK.
    #[error("status {}: {message}", code.name())]
    Closed { code: Code, message: String },
    #[error("peer did not answer PING within {0:?}")]
    Unresponsive(Duration),
    #[error("the peer sent a {0} frame where none may come")]
    Unexpected(&'static str),
    #[error("the server chose link version {0}, which this agent does not speak")]
    Version(u8),
    #[error("connection setup (the native link's HELLO and ACCEPT) did not finish in time")]
    HandshakeTimeout,
    /// The WebSocket upgrade that opens a link failed, or was refused on the way.
    #[error("WebSocket link: {0}")]
    Upgrade(String),
}

impl From<std::io::Error> for LinkError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

impl From<tether_proto::link::LinkError> for LinkError {
    fn from(error: tether_proto::link::LinkError) -> Self {
        Self::Frame(error)
    }
}

impl LinkError {
    /// Only one packet was malformed; the link can still be read.
    pub fn is_bad_packet(&self) -> bool {
        matches!(self, Self::Frame(e) if e.is_bad_packet())
    }

    /// The peer gave the stream up: it closed the connection without a CLOSE, or ended the
    /// stream with CANCELLED.
    pub fn is_cancelled(&self) -> bool {
        match self {
            Self::PeerGone => true,
            Self::Closed { code, .. } => *code == Code::CANCELLED,
            _ => false,
        }
    }

    /// The status code name for metrics, as the gRPC link reports its errors.
    pub fn code_name(&self) -> &'static str {
        match self {
            Self::Closed { code, .. } => code.name(),
            Self::PeerGone => "Canceled",
            Self::Frame(_) | Self::Unexpected(_) | Self::Version(_) => "Internal",
            _ => "Unavailable",
        }
    }
}
