//! Everything that can end a gRPC call.

use std::time::Duration;

use crate::status::{Code, Status};

/// Everything that can end a call. The inner errors are plain fields, not `source()`s:
/// each message already holds their text, which a `{:#}` chain would print a second time.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("http/2: {0}")]
    H2(h2::Error),
    #[error("gRPC framing: {0}")]
    Frame(tether_proto::frame::FrameError),
    #[error("gRPC status {0}")]
    Status(Status),
    #[error("not a gRPC response: {0}")]
    NotGrpc(String),
    #[error("peer did not answer HTTP/2 PING within {0:?}")]
    PeerUnresponsive(Duration),
    #[error("connection setup (TLS, HTTP/2 preface, SETTINGS) did not finish in time")]
    HandshakeTimeout,
    #[error("i/o: {0}")]
    Io(std::io::Error),
}

impl From<h2::Error> for GrpcError {
    fn from(error: h2::Error) -> Self {
        Self::H2(error)
    }
}

impl From<tether_proto::frame::FrameError> for GrpcError {
    fn from(error: tether_proto::frame::FrameError) -> Self {
        Self::Frame(error)
    }
}

impl From<std::io::Error> for GrpcError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

impl GrpcError {
    /// The gRPC code name for the `code` label of `stream_errors_total`.
    pub fn code_name(&self) -> &'static str {
        match self {
            Self::Status(s) => s.code.name(),
            Self::H2(_) if self.is_cancelled() => "Canceled",
            Self::Frame(_) => "Internal",
            _ => "Unavailable",
        }
    }

    /// Whether the peer gave the call up: an HTTP/2 reset with CANCEL (a peer stopping or
    /// restarting does that) or a CANCELLED status.
    pub fn is_cancelled(&self) -> bool {
        match self {
            Self::H2(e) => e.reason() == Some(h2::Reason::CANCEL),
            Self::Status(s) => s.code == Code::CANCELLED,
            _ => false,
        }
    }
}

impl GrpcError {
    /// True when only one packet was malformed and the stream can still be read.
    pub fn is_bad_packet(&self) -> bool {
        matches!(
            self,
            Self::Frame(tether_proto::frame::FrameError::Packet(_))
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error chain prints the inner text once: the variants hold it, they are not its
    /// `source()`.
    #[test]
    fn the_inner_error_is_no_source() {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, "received fatal alert");
        let error = GrpcError::from(io);
        assert!(std::error::Error::source(&error).is_none());
        assert_eq!(error.to_string(), "i/o: received fatal alert");
        let h2 = GrpcError::from(h2::Error::from(h2::Reason::PROTOCOL_ERROR));
        assert!(std::error::Error::source(&h2).is_none());
    }
}
