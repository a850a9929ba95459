//! tether's native agent link over a byte stream (TLS in practice): the agent's
//! [`connect`], the server's [`read_hello`] and [`PendingLink`], and an open [`Link`]'s
//! halves, which move [`Packet`](tether_proto::Packet)s with no HTTP/2 between them. The
//! frames are `tether_proto::link`'s; ARCHITECTURE.md ("The native link") has the format.
//!
//! One task reads ([`LinkReader`]) and one writes ([`LinkWriter`]); a PING from the peer is
//! answered by the writer, which [`LinkWriter::wants_flush`] wakes. The owner runs the
//! keepalive ([`LinkHandle::keep_alive`]) on a task of its own, which ends with the link.
//!
//! The same link runs inside WebSocket binary messages ([`connect_websocket`],
//! [`read_upgrade`]) where only HTTP/1.1 passes between agent and server.
#![forbid(unsafe_code)]

mod control;
mod error;
mod handshake;
mod reader;
mod websocket;
mod writer;

pub use control::LinkHandle;
pub use error::LinkError;
pub use handshake::{Link, PendingLink, connect, read_hello};
pub use reader::LinkReader;
pub use websocket::{Upgrade, WsStream, connect_websocket, read_upgrade};
pub use writer::LinkWriter;
