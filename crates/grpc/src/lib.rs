//! gRPC bidirectional streams of Konnectivity [`Packet`]s over HTTP/2.
//!
//! tether speaks gRPC directly on the `h2` crate instead of through a gRPC framework: the
//! framing is five bytes, and owning the HTTP/2 layer lets tether choose the windows per
//! stream kind, coalesce small packets into large writes, and keep per-stream back-pressure
//! honest (capacity is reserved before data is handed to h2, so nothing buffers unbounded).
//!
//! - [`server`]: accept HTTP/2 connections and route each incoming call.
//! - [`client`]: open calls on an HTTP/2 connection.
//! - [`PacketSender`] / [`PacketReceiver`]: the two halves of an open call.
#![forbid(unsafe_code)]

mod authority;
pub mod client;
mod error;
mod pinger;
pub mod server;
mod settings;
mod status;
mod stream;
mod stream_count;

pub use authority::AuthorityRewrite;
pub use error::GrpcError;
pub use settings::{
    AGENT_STREAMS, DEFAULT_FRONTEND_STREAMS, H2Settings, MAX_FRAME_SIZE, MIN_STREAM_WINDOW,
};
pub use status::{Code, Status};
pub use stream::{PacketReceiver, PacketSender};
pub use tether_conn::{
    CertificateError, CertificateNames, CurrentPong, FREE_PARTIAL_BYTES, Keepalive, LastPong,
    LogText, PartialMessageBudget, PeerIdentity, PeerTransport, Principal, UnixCredentials,
    WATCHED_PING_INTERVAL,
};
pub use tether_proto::Packet;

/// A stream's request or response headers as transport-neutral metadata: every key and
/// value, repeats and their order kept.
pub fn metadata_of(headers: &http::HeaderMap) -> tether_proto::metadata::Metadata {
    headers
        .iter()
        .map(|(key, value)| {
            (
                key.as_str(),
                bytes::Bytes::copy_from_slice(value.as_bytes()),
            )
        })
        .collect()
}
