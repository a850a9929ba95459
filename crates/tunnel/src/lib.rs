//! The I/O side of a multiplexed stream, shared by the server and the agent.
//!
//! [`tether_session::Session`] holds a stream's dials and connections without doing I/O;
//! this crate runs it: a [`Link`] is the one lock around the table plus the wakers of
//! everyone waiting on it, [`Link::run_transport`] feeds it the packets of the stream's
//! [`Transport`] and its deadlines and writes what it queues, and [`Tunnel`] /
//! [`PendingDial`] are what frontends, relays and dialers hold.
//!
//! A stream's reader never waits on one connection when the peer is a tether peer: each
//! connection's inbound queue is bounded by the credit it granted, and each connection
//! waits only for its own send window. With an upstream peer the reader parks on a full
//! connection while it makes progress, at most the stall period without progress.
#![forbid(unsafe_code)]

mod audit;
mod conn;
pub mod connect_head;
mod dial;
mod introspect;
mod link;
mod log;
mod relay;
mod resume;
mod socket;
mod splice;
mod stream;
mod transport;

pub use audit::{AuditSide, DialFacts, StreamAudit};
pub use conn::{Closed, ConnEvent, Tunnel, TunnelDown, TunnelUp};
pub use dial::{IncomingDial, PendingDial};
pub use link::{Direction, Hooks, Link};
pub use log::log_ended;
pub use relay::{
    ChunkRead, EndedBy, Local, Pace, RelayOptions, Relayed, relay, relay_client, relay_tcp,
};
pub use resume::{
    MAX_RESUME_FROM, ResumeFailure, ResumeMetrics, Suspension, format_resume_from, is_resume_token,
    parse_resume_from,
};
pub use socket::{MAX_CHUNK, reset_on_close, take_read};
pub use splice::{Spliced, splice};
pub use stream::TransportEnd;
pub use tether_session::{
    Abandoned, CloseError, ConnInfo, ConnState, DialCancel, DialError, Ended, Event, Flow,
    FlowConfig, Initiator, Limits, Outcome, PendingDialInfo, Replayed, ResumeError, Role, Session,
    SessionConfig,
};
pub use transport::{Reader, Transport, TransportError, Writer};
