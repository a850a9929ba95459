//! The sans-IO core of a multiplexed stream, shared by server and agent.
//!
//! An agent stream (`AgentService.Connect`) carries many tunnelled connections. This crate
//! holds everything about them that is state: pending dials with their deadlines,
//! established connections with their inbound queues and send windows, the packets waiting
//! for the stream's writer, and one typed [`Outcome`] per connection. It does no I/O,
//! spawns nothing and reads no clock (quinn-proto is the model): a driver feeds it packets
//! ([`Session::handle_packet`]), the time ([`Session::handle_timeout`]) and its owners'
//! commands, and acts on the [`Event`]s it returns. The server's side of an agent stream and
//! the agent's side of a server stream are two [`Role`]s of the same table.
//!
//! Flow control: between tether peers every connection has its own credit window
//! ([`Packet::Credit`](tether_proto::Packet::Credit), negotiated with the `tether-flow`
//! header), so a slow reader stalls only its own connection; a peer that overruns its
//! credit loses that connection alone. With an upstream peer, which knows no credit, the
//! send window is local (bytes queued but not yet written) and a full inbound queue parks
//! the stream's reader until the connection makes progress or stalls.
#![forbid(unsafe_code)]

mod conn;
mod fair;
pub mod flow;
mod outcome;
mod outgoing;
mod resume;
mod session;
mod timers;

pub use flow::{Flow, FlowConfig, MIN_WINDOW, chunk_cost};
pub use outcome::{CloseError, DialCancel, DialError, Ended, Initiator, Outcome};
pub use outgoing::Outgoing;
pub use resume::{Replayed, ResumeError};
pub use session::{
    Abandoned, ConnInfo, ConnState, Event, Limits, PendingDialInfo, Recv, Role, SendError, Session,
    SessionConfig, Violation,
};
