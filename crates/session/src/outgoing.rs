//! What the table hands the stream's writer, on its own so that the writer's queue (`fair`)
//! can hold it without using the table that fills the queue.

use tether_proto::{ConnectId, Packet};

/// A packet for the writer, with (legacy peers) the window it gives back once written.
#[derive(Debug)]
pub struct Outgoing {
    pub packet: Packet,
    /// `Some((id, cost))`: call [`Session::transmitted`](crate::Session::transmitted) with it
    /// after the packet is written.
    pub release: Option<(ConnectId, u32)>,
    /// A reply the peer's packet asked for; counted against the reply backlog.
    pub(crate) reply: bool,
}
