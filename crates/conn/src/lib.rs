//! What every agent or frontend connection has, whatever transport runs on it (gRPC over
//! HTTP/2, tether's native link): who the peer is as the listener proved it
//! ([`PeerIdentity`]), its signs of life ([`LastPong`], [`keep_alive`]), the listener's
//! budget for large incomplete messages, and how peer-supplied text reaches a log line.
#![forbid(unsafe_code)]

mod budget;
mod certificate;
mod code;
mod heard;
mod liveness;
mod log_text;
mod peer;

pub use budget::{Draw, Exhausted, FREE_PARTIAL_BYTES, PartialMessageBudget};
pub use certificate::{CertificateError, CertificateNames};
pub use code::Code;
pub use heard::Heard;
pub use liveness::{
    CurrentPong, Keepalive, KeepaliveEnd, LastPong, Pinger, WATCHED_PING_INTERVAL,
    WATCHED_READ_POLL, keep_alive,
};
pub use log_text::LogText;
pub use peer::{PeerIdentity, PeerTransport, Principal, UnixCredentials};
