//! The Konnectivity wire protocol, without I/O.
//!
//! - [`pb`]: the prost structs generated from `proto/konnectivity.proto` (checked in, guarded
//!   by `tests/generated_code.rs`).
//! - [`Packet`]: the validated domain form every other crate works with. Converting from the
//!   wire form rejects malformed packets with a [`ProtoError`] instead of guessing, so nothing
//!   downstream has to handle "a DATA packet without data".
//! - [`frame`]: gRPC length-prefixed message framing, usable over any byte stream.
//! - [`link`]: the frames of tether's native agent link (tether to tether, chosen by ALPN).
//! - [`metadata`]: the gRPC header keys both ends agree on.
//! - [`Identifiers`]: the agent identifiers that steer `destHost`/`defaultRoute` routing.
//! - [`Labels`]: tether's agent labels (zone, region) for topology-aware routing.
#![forbid(unsafe_code)]

pub mod frame;
pub mod identifiers;
pub mod labels;
pub mod link;
pub mod metadata;
mod packet;
pub mod pb;
mod random;
pub mod websocket;

pub use identifiers::Identifiers;
pub use labels::Labels;
pub use packet::{ConnectId, DialId, Forward, MAX_PEER_AGENTS, Packet, PeerAgents, ProtoError};
pub use random::random_u64;

/// gRPC method paths. The proto has no package, so these carry no prefix.
pub mod path {
    /// Frontend stream opened by clients such as kube-apiserver.
    pub const PROXY: &str = "/ProxyService/Proxy";
    /// Backend stream opened by agents.
    pub const CONNECT: &str = "/AgentService/Connect";
}
