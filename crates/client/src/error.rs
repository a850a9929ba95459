//! Errors: [`ClientError`] for the way to the proxy server, [`DialError`] for one dial.

use std::io;

use tether_grpc::GrpcError;

/// The dial error text a proxy server answers when it has no agent to dial through. The gRPC
/// frontend sends it as the DIAL_RSP error; HTTP CONNECT puts it in a 500 body.
pub(crate) const NO_AGENT: &str = "No agent available";

/// Reaching or talking to the proxy server failed; nothing was learnt about the destination.
/// The inner errors are plain fields, not `source()`s: each message already holds their
/// text, which a `{:#}` chain would print a second time.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("connecting to {target}: {error}")]
    Connect { target: String, error: io::Error },
    #[error("invalid TLS server name {0:?}")]
    ServerName(String),
    #[error("TLS handshake with {server_name}: {error}")]
    Tls {
        server_name: String,
        error: io::Error,
    },
    #[error("gRPC: {0}")]
    Grpc(GrpcError),
    #[error("i/o with the proxy server: {0}")]
    Io(io::Error),
    /// The proxy server ended the conversation before answering.
    #[error("proxy server closed: {0}")]
    Closed(String),
    /// The proxy server answered something the protocol does not allow.
    #[error("protocol violation by the proxy server: {0}")]
    Protocol(String),
}

/// Why a dial produced no connection.
///
/// The variants tell a *dial failure* from a *tunnel failure*, which callers handle
/// differently (kube-apiserver labels them `proxy` and `connect`, and only a tunnel failure
/// is a reason to reconnect to the proxy server):
/// - dial failures, where the proxy server answered and the destination could not be
///   reached through it: [`NoAgent`](Self::NoAgent), [`Endpoint`](Self::Endpoint),
///   [`Rejected`](Self::Rejected), [`DialClosed`](Self::DialClosed);
/// - tunnel failures, where the answer never came: [`Proxy`](Self::Proxy),
///   [`Timeout`](Self::Timeout);
/// - [`InvalidAddress`](Self::InvalidAddress): nothing was sent.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The proxy server has no agent that could dial the destination.
    #[error("{NO_AGENT}")]
    NoAgent,
    /// The agent's dial failed; `message` is its error text, e.g.
    /// `dial tcp 10.0.0.1:443: connect: connection refused`.
    #[error("{message}")]
    Endpoint { message: String },
    /// The HTTP CONNECT frontend answered with a status other than 200. For 502, 503 and 504
    /// the body is the agent's dial error text.
    #[error("proxy server answered HTTP {status}: {}", body.trim_end())]
    Rejected { status: u16, body: String },
    /// The proxy server abandoned the dial (DIAL_CLS), e.g. because the agent went away.
    #[error("dial closed by the proxy server")]
    DialClosed,
    /// No dial response within the deadline. The dial was cancelled with DIAL_CLS.
    #[error("timed out waiting for the dial response")]
    Timeout,
    /// The destination cannot be put into a request (HTTP CONNECT needs a bare `host:port`).
    #[error("invalid destination address {0:?}")]
    InvalidAddress(String),
    /// The proxy server could not be reached or broke the protocol.
    #[error(transparent)]
    Proxy(#[from] ClientError),
}

impl ClientError {
    /// The TLS failure behind this error, if the proxy server's TLS refused or was refused:
    /// what `tether dial` explains. A refusal that arrives inside HTTP/2 (TLS 1.3 sends a
    /// client certificate's rejection after the handshake) survives only when h2 kept the
    /// io error.
    pub fn handshake_failure(&self) -> Option<tether_tls::HandshakeFailure> {
        let io = match self {
            Self::Tls { error, .. } | Self::Io(error) | Self::Connect { error, .. } => error,
            Self::Grpc(GrpcError::Io(error)) => error,
            Self::Grpc(GrpcError::H2(error)) => error.get_io()?,
            _ => return None,
        };
        tether_tls::HandshakeFailure::find(io)
    }
}

impl DialError {
    /// See [`ClientError::handshake_failure`].
    pub fn handshake_failure(&self) -> Option<tether_tls::HandshakeFailure> {
        match self {
            Self::Proxy(error) => error.handshake_failure(),
            _ => None,
        }
    }
}

impl From<GrpcError> for ClientError {
    fn from(e: GrpcError) -> Self {
        Self::Grpc(e)
    }
}

impl From<io::Error> for ClientError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<GrpcError> for DialError {
    fn from(e: GrpcError) -> Self {
        Self::Proxy(ClientError::Grpc(e))
    }
}
