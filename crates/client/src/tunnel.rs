//! [`TunnelStream`]: the caller's side of a connection tunnelled over a gRPC `Proxy` call.
//!
//! The call itself is driven by a task (see `relay`); the stream talks to it through two
//! bounded channels and learns how the tunnel ended from a [`TunnelEnd`] the task sets
//! before dropping its channel ends.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use tether_grpc::GrpcError;
use tether_proto::ConnectId;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::PollSender;

/// Largest payload of one DATA packet; bigger writes are split.
pub(crate) const MAX_CHUNK: usize = 64 * 1024;
/// Chunks received but not yet read. With the HTTP/2 stream window this bounds what a
/// tunnel buffers when its reader stalls.
const INBOUND_CHUNKS: usize = 16;
/// Chunks written but not yet encoded by the task: at most 256 KiB.
const OUTBOUND_CHUNKS: usize = 4;

/// A connection tunnelled through the proxy server's gRPC frontend.
///
/// - Writes become DATA packets of at most 64 KiB. A write completes once the stream's task
///   took the chunk, so `flush` has nothing to wait for; the task applies HTTP/2 flow control.
/// - `shutdown` sends CLOSE_REQ. Konnectivity has no half-close: the proxy answers with
///   CLOSE_RSP after the destination's socket is closed, and reads return what arrived
///   before it, then EOF.
/// - Reads return EOF after a normal close (CLOSE_RSP without error, sent by the proxy when
///   the destination closed or in answer to `shutdown`), and an error of kind
///   `ConnectionReset` (the proxy reported a failure) or `ConnectionAborted` (the proxy
///   stream broke, or no CLOSE_RSP came within 10 s of CLOSE_REQ) after an abnormal one.
///   Writes after the end fail with the same error, or `BrokenPipe` after a normal close.
/// - Dropping the stream without `shutdown` closes the tunnel the same way, in the
///   background.
#[derive(Debug)]
pub struct TunnelStream {
    connect_id: ConnectId,
    inbound: mpsc::Receiver<Bytes>,
    /// The unread rest of the chunk last received.
    pending: Bytes,
    outbound: PollSender<Bytes>,
    /// Dropped on shutdown (or with the stream): starts the relay's close deadline.
    closing: Option<oneshot::Sender<()>>,
    end: TunnelEnd,
}

/// The relay task's ends of a [`TunnelStream`]'s channels.
#[derive(Debug)]
pub(crate) struct TaskSide {
    pub(crate) inbound: mpsc::Sender<Bytes>,
    pub(crate) outbound: mpsc::Receiver<Bytes>,
    /// Resolves (with an error) once the stream is shut down or dropped.
    pub(crate) closing: oneshot::Receiver<()>,
    pub(crate) end: TunnelEnd,
}

/// A new tunnel for connection `connect_id`: the caller's stream and the task's side.
pub(crate) fn pair(connect_id: ConnectId) -> (TunnelStream, TaskSide) {
    let (inbound_tx, inbound_rx) = mpsc::channel(INBOUND_CHUNKS);
    let (outbound_tx, outbound_rx) = mpsc::channel(OUTBOUND_CHUNKS);
    let (closing_tx, closing_rx) = oneshot::channel();
    let end = TunnelEnd::default();
    let stream = TunnelStream {
        connect_id,
        inbound: inbound_rx,
        pending: Bytes::new(),
        outbound: PollSender::new(outbound_tx),
        closing: Some(closing_tx),
        end: end.clone(),
    };
    let task = TaskSide {
        inbound: inbound_tx,
        outbound: outbound_rx,
        closing: closing_rx,
        end,
    };
    (stream, task)
}

impl TunnelStream {
    /// The connection's ID, allocated by the agent; the proxy server and agent log it.
    pub fn connect_id(&self) -> ConnectId {
        self.connect_id
    }
}

impl AsyncRead for TunnelStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        while this.pending.is_empty() {
            match ready!(this.inbound.poll_recv(cx)) {
                Some(chunk) => this.pending = chunk,
                // The task ended the tunnel and everything it received has been read.
                None => return Poll::Ready(this.end.read_result()),
            }
        }
        let n = this.pending.len().min(buf.remaining());
        buf.put_slice(&this.pending.split_to(n));
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for TunnelStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if buf.is_empty() {
            return Poll::Ready(Ok(0));
        }
        let this = self.get_mut();
        if ready!(this.outbound.poll_reserve(cx)).is_err() {
            return Poll::Ready(Err(this.end.write_error()));
        }
        let n = buf.len().min(MAX_CHUNK);
        match this.outbound.send_item(Bytes::copy_from_slice(&buf[..n])) {
            Ok(()) => Poll::Ready(Ok(n)),
            Err(_) => Poll::Ready(Err(this.end.write_error())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        // The task sends CLOSE_REQ once it has sent everything written before.
        let this = self.get_mut();
        this.outbound.close();
        this.closing = None;
        Poll::Ready(Ok(()))
    }
}

/// How a tunnel ended, shared between the task (which sets it once) and the stream.
#[derive(Clone, Debug, Default)]
pub(crate) struct TunnelEnd(Arc<OnceLock<Result<(), Failure>>>);

impl TunnelEnd {
    pub(crate) fn set(&self, end: Result<(), Failure>) {
        let _ = self.0.set(end);
    }

    fn read_result(&self) -> io::Result<()> {
        match self.0.get() {
            Some(Ok(())) => Ok(()),
            Some(Err(failure)) => Err(failure.to_io()),
            None => Err(Failure::task_gone().to_io()),
        }
    }

    fn write_error(&self) -> io::Error {
        match self.0.get() {
            Some(Err(failure)) => failure.to_io(),
            Some(Ok(())) | None => io::Error::new(io::ErrorKind::BrokenPipe, "tunnel closed"),
        }
    }
}

/// Why a tunnel ended abnormally; every read and write that hits it gets it as an error.
#[derive(Clone, Debug)]
pub(crate) struct Failure {
    kind: io::ErrorKind,
    message: String,
}

impl Failure {
    /// CLOSE_RSP carrying an error: the agent, its connection or the destination failed.
    pub(crate) fn closed_by_proxy(error: &str) -> Self {
        Self {
            kind: io::ErrorKind::ConnectionReset,
            message: format!("connection closed by the proxy: {error}"),
        }
    }

    /// The call failed. A status or reset from the server is the peer's verdict; anything
    /// else (the HTTP/2 connection dropped, a framing error) is a local abort.
    pub(crate) fn stream(error: &GrpcError) -> Self {
        let kind = match error {
            GrpcError::Status(_) => io::ErrorKind::ConnectionReset,
            GrpcError::H2(e) if e.is_remote() => io::ErrorKind::ConnectionReset,
            _ => io::ErrorKind::ConnectionAborted,
        };
        Self {
            kind,
            message: format!("proxy stream failed: {error}"),
        }
    }

    /// The server ended the call cleanly but without CLOSE_RSP: data may be missing.
    pub(crate) fn ended_without_close() -> Self {
        Self {
            kind: io::ErrorKind::ConnectionAborted,
            message: "the proxy ended the stream without CLOSE_RSP".to_owned(),
        }
    }

    pub(crate) fn close_timeout() -> Self {
        Self {
            kind: io::ErrorKind::ConnectionAborted,
            message: "the proxy did not complete the close in time".to_owned(),
        }
    }

    /// The task was dropped without ending the tunnel (the runtime is shutting down).
    fn task_gone() -> Self {
        Self {
            kind: io::ErrorKind::ConnectionAborted,
            message: "the tunnel's task ended".to_owned(),
        }
    }

    fn to_io(&self) -> io::Error {
        io::Error::new(self.kind, self.message.clone())
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
