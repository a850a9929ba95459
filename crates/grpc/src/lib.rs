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
mod budget;
pub mod client;
mod log_text;
mod peer;
pub mod server;
mod status;
mod stream;

pub use authority::AuthorityRewrite;
pub use budget::{FREE_PARTIAL_BYTES, PartialMessageBudget};
pub use log_text::LogText;
pub use peer::{
    CertificateError, CertificateNames, PeerIdentity, PeerTransport, Principal, UnixCredentials,
};
pub use status::{Code, Status};
pub use stream::{PacketReceiver, PacketSender};
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

use std::time::Duration;

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
    pub partial_message_budget: Option<std::sync::Arc<PartialMessageBudget>>,
}

/// Liveness probing by HTTP/2 PING.
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
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
        budget: Option<std::sync::Arc<PartialMessageBudget>>,
    ) -> Self {
        self.partial_message_budget = budget;
        self
    }
}

/// Everything that can end a call. The inner errors are plain fields, not `source()`s:
/// each message already holds their text, which a `{:#}` chain would print a second time.
#[derive(Debug, thiserror::Error)]
pub enum GrpcError {
    #[error("http/2: {0}")]
    H2(h2::Error),
    #[error("gRPC framing: {0}")]
    Frame(tether_proto::frame::FrameError),
    #[error("gRPC status {0}")]
    Status(Status),
    #[error("not a gRPC response: {0}")]
    NotGrpc(String),
    #[error("peer did not answer HTTP/2 PING within {0:?}")]
    PeerUnresponsive(Duration),
    #[error("connection setup (TLS, HTTP/2 preface, SETTINGS) did not finish in time")]
    HandshakeTimeout,
    #[error("i/o: {0}")]
    Io(std::io::Error),
}

impl From<h2::Error> for GrpcError {
    fn from(error: h2::Error) -> Self {
        Self::H2(error)
    }
}

impl From<tether_proto::frame::FrameError> for GrpcError {
    fn from(error: tether_proto::frame::FrameError) -> Self {
        Self::Frame(error)
    }
}

impl From<std::io::Error> for GrpcError {
    fn from(error: std::io::Error) -> Self {
        Self::Io(error)
    }
}

impl GrpcError {
    /// The gRPC code name for the `code` label of `stream_errors_total`.
    pub fn code_name(&self) -> &'static str {
        match self {
            Self::Status(s) => s.code.name(),
            Self::H2(_) if self.is_cancelled() => "Canceled",
            Self::Frame(_) => "Internal",
            _ => "Unavailable",
        }
    }

    /// Whether the peer gave the call up: an HTTP/2 reset with CANCEL (a peer stopping or
    /// restarting does that) or a CANCELLED status.
    pub fn is_cancelled(&self) -> bool {
        match self {
            Self::H2(e) => e.reason() == Some(h2::Reason::CANCEL),
            Self::Status(s) => s.code == Code::CANCELLED,
            _ => false,
        }
    }
}

/// How often a watched connection is PINGed (see [`LastPong::watch`]), whatever its
/// keepalive interval: a live peer is then heard at least this often.
pub const WATCHED_PING_INTERVAL: Duration = Duration::from_secs(1);

/// How often a watched connection's reads are polled while a PING waits for its PONG, so
/// that a read finding nothing records the silence within this (see [`LastPong::quiet`]).
const WATCHED_READ_POLL: Duration = Duration::from_millis(250);

/// A connection's signs of life: when its keepalive PING was last answered (read by
/// introspection, `/debug/agents`), when it last read a byte from the peer (server side), and
/// whether its owner watches it closely, which PINGs it every [`WATCHED_PING_INTERVAL`].
#[derive(Debug)]
pub struct LastPong {
    pong: std::sync::Mutex<Option<std::time::Instant>>,
    opened: std::time::Instant,
    /// When the connection last read a byte, in milliseconds after `opened`.
    heard_ms: std::sync::atomic::AtomicU64,
    /// When a read last found nothing to read, in milliseconds after `opened`.
    quiet_ms: std::sync::atomic::AtomicU64,
    watched: std::sync::atomic::AtomicBool,
    /// Wakes the keepalive loop when watching starts, for a PING at once.
    wake: tokio::sync::Notify,
}

impl Default for LastPong {
    fn default() -> Self {
        Self {
            pong: std::sync::Mutex::default(),
            opened: std::time::Instant::now(),
            heard_ms: std::sync::atomic::AtomicU64::new(0),
            quiet_ms: std::sync::atomic::AtomicU64::new(0),
            watched: std::sync::atomic::AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        }
    }
}

impl LastPong {
    pub fn get(&self) -> Option<std::time::Instant> {
        *self.pong.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, at: std::time::Instant) {
        *self.pong.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// When the connection last read a byte from its peer (when it opened, before any);
    /// only server connections record it.
    pub fn heard(&self) -> std::time::Instant {
        let ms = self.heard_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.opened + Duration::from_millis(ms)
    }

    /// When a read last found nothing to read (when it opened, before any): the moment up
    /// to which the peer is known to have been silent since [`heard`](Self::heard).
    pub fn quiet(&self) -> std::time::Instant {
        let ms = self.quiet_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.opened + Duration::from_millis(ms)
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn heard_now(&self) {
        self.heard_ms
            .store(self.elapsed_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn quiet_now(&self) {
        self.quiet_ms
            .store(self.elapsed_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Watches the connection closely (PINGs every [`WATCHED_PING_INTERVAL`], the first at
    /// once) or stops. Needs keepalive configured on the connection.
    pub fn watch(&self, on: bool) {
        let was = self.watched.swap(on, std::sync::atomic::Ordering::Relaxed);
        if on && !was {
            self.wake.notify_one();
        }
    }

    fn is_watched(&self) -> bool {
        self.watched.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn ping_interval(&self, keepalive: &Keepalive) -> Duration {
        if self.is_watched() {
            keepalive.interval.min(WATCHED_PING_INTERVAL)
        } else {
            keepalive.interval
        }
    }
}

/// The [`LastPong`] of whichever connection a stream runs on now: a resumable agent stream
/// moves to a new connection when it resumes.
#[derive(Debug)]
pub struct CurrentPong(std::sync::Mutex<std::sync::Arc<LastPong>>);

impl CurrentPong {
    pub fn new(last_pong: std::sync::Arc<LastPong>) -> Self {
        Self(std::sync::Mutex::new(last_pong))
    }

    /// When the current connection's keepalive PING was last answered.
    pub fn get(&self) -> Option<std::time::Instant> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get()
    }

    /// When the current connection last read a byte from the peer.
    pub fn heard(&self) -> std::time::Instant {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).heard()
    }

    /// When a read on the current connection last found nothing to read.
    pub fn quiet(&self) -> std::time::Instant {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).quiet()
    }

    /// Watches the current connection closely, or stops (see [`LastPong::watch`]).
    pub fn watch(&self, on: bool) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).watch(on);
    }

    /// The stream moved to another connection.
    pub fn replace(&self, last_pong: std::sync::Arc<LastPong>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = last_pong;
    }
}

/// Drives pings on `ping_pong` until one goes unanswered; used by both ends. While the
/// connection is watched, this future also wakes every [`WATCHED_READ_POLL`] as it waits for
/// a PONG: the connection's task then polls its reads again, and a read that finds nothing
/// records the peer's silence (see [`LastPong::quiet`]). No packet is sent for it.
pub(crate) async fn keep_alive(
    mut ping_pong: h2::PingPong,
    keepalive: Keepalive,
    last_pong: std::sync::Arc<LastPong>,
) -> GrpcError {
    loop {
        tokio::select! {
            () = tokio::time::sleep(last_pong.ping_interval(&keepalive)) => {}
            () = last_pong.wake.notified() => {}
        }
        let pong = ping_pong.ping(h2::Ping::opaque());
        let mut pong = std::pin::pin!(pong);
        let deadline = tokio::time::Instant::now() + keepalive.timeout;
        let answered = loop {
            let tick = if last_pong.is_watched() {
                WATCHED_READ_POLL
            } else {
                keepalive.timeout
            };
            tokio::select! {
                answered = &mut pong => break Some(answered),
                () = tokio::time::sleep_until(deadline) => break None,
                () = tokio::time::sleep(tick) => {}
            }
        };
        match answered {
            Some(Ok(_pong)) => last_pong.set(std::time::Instant::now()),
            Some(Err(e)) => return GrpcError::H2(e),
            None => return GrpcError::PeerUnresponsive(keepalive.timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error chain prints the inner text once: the variants hold it, they are not its
    /// `source()`.
    #[test]
    fn the_inner_error_is_no_source() {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, "received fatal alert");
        let error = GrpcError::from(io);
        assert!(std::error::Error::source(&error).is_none());
        assert_eq!(error.to_string(), "i/o: received fatal alert");
        let h2 = GrpcError::from(h2::Error::from(h2::Reason::PROTOCOL_ERROR));
        assert!(std::error::Error::source(&h2).is_none());
    }
}
