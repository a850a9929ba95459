//! HTTP/2 settings per kind of connection, and the limits they are built from.

use std::sync::Arc;
use std::time::Duration;

use tether_conn::{Keepalive, PartialMessageBudget};

/// HTTP/2 settings for one kind of connection.
///
/// The receiver's connection window must exceed its stream window: when they are equal a
/// single busy stream throttles to a fraction of loopback speed (see
/// `shared/reference/peers-and-performance.md` §2b).
#[derive(Clone, Debug)]
pub struct H2Settings {
    pub stream_window: u32,
    pub connection_window: u32,
    pub max_frame_size: u32,
    pub max_send_buffer: usize,
    pub max_concurrent_streams: u32,
    /// Send an HTTP/2 PING this often and drop the connection when no PONG arrives within
    /// `timeout`. `None` disables pings (required against a peer that punishes them).
    pub keepalive: Option<Keepalive>,
    /// Close the connection (GOAWAY) once it has carried no stream for this long, so that a
    /// client that opens connections and leaves them empty cannot pin them forever.
    pub idle_timeout: Option<Duration>,
    /// Server side: offer `connection_window` only once a call on the connection has been
    /// accepted. Until then the peer may send HTTP/2's initial 64 KiB in all, so a client
    /// that is never admitted cannot make the server hold a window's worth of its data
    /// while its credentials are checked. For peers that send nothing before the response
    /// headers (agents); a frontend's first message comes with its call.
    pub window_on_accept: bool,
    /// Server side: the listener's budget for large incomplete messages (see
    /// [`PartialMessageBudget`]); `None` leaves each stream its window.
    pub partial_message_budget: Option<Arc<PartialMessageBudget>>,
}

const MIB: u32 = 1024 * 1024;

/// The smallest stream window a receiver offers: one largest message and its prefix. Flow-
/// control capacity is released only as whole messages are decoded, so a smaller window
/// could never let a large message complete.
pub const MIN_STREAM_WINDOW: u32 =
    (tether_proto::frame::MAX_MESSAGE_LEN + tether_proto::frame::PREFIX_LEN) as u32;

/// The largest HTTP/2 frame a tether end accepts: one DATA packet of the largest chunk
/// (64 KiB of payload) and its framing, so a tether peer sends each such packet in one
/// frame and the receiver decodes it in place (see `tether_proto::frame::Decoder`). At
/// 64 KiB exactly, every full packet came in two frames and was copied to be joined.
pub const MAX_FRAME_SIZE: u32 = 64 * 1024 + 1024;

/// Concurrent streams per frontend connection: what one connection can hold is bounded
/// (an idle tunnel is ~6 KiB of the server's memory, so ~23 MiB at the cap), with room for the reusable
/// tunnel, where one kube-apiserver connection carries every dial. Measured with tether-bench's
/// tunnel workload (BENCHMARKS.md): at 1,000, 980 held streams beside 64 dialling workers made
/// dials wait for a free stream (p50 3.3 → 8.0 ms, 27 % fewer dials/s); at 4,000 they did not.
pub const DEFAULT_FRONTEND_STREAMS: u32 = 4_000;

/// Concurrent streams per agent connection. Agents (tether's and upstream's) open one
/// `Connect` stream per connection and a new connection to reconnect or resume; the second
/// slot is for a new stream arriving while the server still counts the one it replaces.
/// Each stream can hold an incomplete message, so this bounds what one connection holds.
pub const AGENT_STREAMS: u32 = 2;

impl H2Settings {
    /// A multiplexed agent stream: one stream carries every tunnelled connection, so its
    /// window must cover the aggregate bandwidth-delay product.
    pub fn agent_stream() -> Self {
        Self {
            stream_window: 16 * MIB,
            connection_window: 32 * MIB,
            max_frame_size: MAX_FRAME_SIZE,
            max_send_buffer: 4 * MIB as usize,
            max_concurrent_streams: AGENT_STREAMS,
            keepalive: None,
            idle_timeout: None,
            window_on_accept: true,
            partial_message_budget: None,
        }
    }

    /// Frontend connections: one tunnelled connection per stream, possibly many streams per
    /// connection. A stalled stream holds at most its stream window (one largest message), and
    /// all streams of a connection together at most the connection window, which leaves room
    /// for a dozen stalled streams before others feel it.
    pub fn frontend() -> Self {
        Self {
            stream_window: MIN_STREAM_WINDOW,
            connection_window: 64 * MIB,
            max_frame_size: MAX_FRAME_SIZE,
            max_send_buffer: 2 * MIB as usize,
            max_concurrent_streams: DEFAULT_FRONTEND_STREAMS,
            keepalive: None,
            idle_timeout: None,
            window_on_accept: false,
            partial_message_budget: None,
        }
    }

    pub fn with_keepalive(mut self, keepalive: Option<Keepalive>) -> Self {
        self.keepalive = keepalive;
        self
    }

    pub fn with_idle_timeout(mut self, idle_timeout: Option<Duration>) -> Self {
        self.idle_timeout = idle_timeout;
        self
    }

    pub fn with_max_concurrent_streams(mut self, streams: u32) -> Self {
        self.max_concurrent_streams = streams;
        self
    }

    pub fn with_partial_message_budget(
        mut self,
        budget: Option<Arc<PartialMessageBudget>>,
    ) -> Self {
        self.partial_message_budget = budget;
        self
    }
}
