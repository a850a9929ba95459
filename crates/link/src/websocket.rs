//! The native link inside WebSocket binary messages, for paths to the server that pass only
//! HTTP/1.1 and its upgrades (an L7 load balancer or reverse proxy, an Ingress). The agent
//! opts in; the server accepts it on its agent port when TLS chose `http/1.1`.
//!
//! The upgrade ([`upgrade`], its heads in [`head`]) carries what HELLO and ACCEPT carry on the native link, as
//! headers; after it, the frames are the native link's, unchanged, on a [`WsStream`].

pub(crate) mod head;
mod stream;
mod upgrade;

pub(crate) use stream::Role;
pub use stream::WsStream;
pub use upgrade::{Upgrade, connect_websocket, read_upgrade};
