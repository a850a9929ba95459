//! The multiplexing core shared by the server and the agent.
//!
//! An agent stream carries many tunnelled connections. Upstream processes that stream
//! serially with tiny fixed buffers, so one slow reader stalls every connection on the agent
//! (kubernetes-sigs/apiserver-network-proxy#180). tether never blocks the stream's reader:
//!
//! - every connection has its own inbound queue ([`flow::Inbound`]) whose size is bounded
//!   by flow control, so the reader can always hand a packet over without waiting;
//! - every connection has its own send window ([`flow::SendWindow`]), so a connection
//!   waits for its own credit and never for another's;
//! - one writer task per stream ([`writer`]) coalesces packets into large HTTP/2 writes.
//!
//! Between tether peers the window is end-to-end credit ([`Packet::Credit`], negotiated with
//! the `tether-flow` header). With an upstream peer, which knows no credit, the window is
//! local (bytes handed to HTTP/2 but not yet written) and inbound queues are bounded by a
//! byte limit: a connection that exceeds it is closed with an error, alone.
//!
//! [`Packet::Credit`]: tether_proto::Packet::Credit
#![forbid(unsafe_code)]

pub mod flow;
pub mod writer;

pub use flow::{
    ConnEvent, Flow, FlowConfig, Full, Inbound, InboundQueue, Overflow, QueueObserver, SendWindow,
    chunk_cost, take_read,
};
pub use writer::{Outbound, run_writer};
