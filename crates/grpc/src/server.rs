//! Accepting gRPC calls on HTTP/2 connections.

mod handshake;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::error::GrpcError;
use crate::settings::{H2Settings, MIN_STREAM_WINDOW};
use crate::status::Status;
use crate::stream::{CallEnd, PacketReceiver, PacketSender};
use crate::stream_count::{StreamCount, StreamGuard};
use tether_conn::PartialMessageBudget;
use tether_conn::PeerIdentity;

/// A call a client opened; answer it with [`accept`](Self::accept) or [`reject`](Self::reject).
#[derive(Debug)]
pub struct IncomingCall {
    path: String,
    metadata: HeaderMap,
    peer: Arc<PeerIdentity>,
    last_pong: Arc<tether_conn::LastPong>,
    recv: h2::RecvStream,
    respond: h2::server::SendResponse<Bytes>,
    budget: Option<Arc<PartialMessageBudget>>,
    /// Told when the call is accepted, for connections that open their window only then.
    accepted: Arc<tokio::sync::Notify>,
    _stream: StreamGuard,
}

impl IncomingCall {
    /// The method path, e.g. `/AgentService/Connect`.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// Request headers: gRPC metadata and the standard ones (`user-agent`).
    pub fn metadata(&self) -> &HeaderMap {
        &self.metadata
    }

    /// Who opened the call, as the listener verified it.
    pub fn peer(&self) -> &Arc<PeerIdentity> {
        &self.peer
    }

    /// When the peer last answered the connection's keepalive PING.
    pub fn last_pong(&self) -> &Arc<tether_conn::LastPong> {
        &self.last_pong
    }

    /// Accepts the call, sending response headers with `metadata` at once (upstream agents
    /// require `serverid`/`servercount` before the first message).
    pub fn accept(
        mut self,
        metadata: &[(&'static str, String)],
    ) -> Result<(PacketSender, PacketReceiver), GrpcError> {
        let mut response = grpc_response();
        for (key, value) in metadata {
            let value = HeaderValue::from_str(value)
                .map_err(|_| GrpcError::NotGrpc(format!("invalid metadata value for {key}")))?;
            response.headers_mut().insert(*key, value);
        }
        let send = self.respond.send_response(response, false)?;
        self.accepted.notify_one();
        let ending = Arc::new(CallEnd::default());
        Ok((
            PacketSender::new(send, Some(ending.clone())),
            PacketReceiver::server(self.recv, self._stream, ending, self.budget),
        ))
    }

    /// Refuses the call with a trailers-only response carrying `status`.
    pub fn reject(mut self, status: &Status) {
        let mut response = grpc_response();
        status.write_to(response.headers_mut());
        let _ = self.respond.send_response(response, true);
    }
}

fn grpc_response() -> Response<()> {
    let mut response = Response::new(());
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    response
}

/// What the listener knows about a connection before HTTP/2 starts.
#[derive(Clone, Debug)]
pub struct Connection {
    pub peer: Arc<PeerIdentity>,
    /// Connection setup (from TCP accept through the client's first SETTINGS) must be done
    /// by then, or the connection is closed.
    pub setup_deadline: Option<Instant>,
}

impl Connection {
    /// A connection with an unknown peer and no setup deadline (tests, in-process callers).
    pub fn unchecked() -> Self {
        Self {
            peer: Arc::new(PeerIdentity::unknown()),
            setup_deadline: None,
        }
    }
}

/// Serves one HTTP/2 connection: every call becomes a task running `on_call`.
///
/// When `shutdown` resolves the connection sends GOAWAY and returns once open calls ended;
/// the caller bounds that with its own grace period. Returns an error when the connection
/// failed, the peer stopped answering keepalive pings, or setup missed its deadline; returns
/// `Ok` after an idle connection was closed.
pub async fn serve_connection<IO, F, Fut>(
    io: IO,
    settings: &H2Settings,
    connection: Connection,
    mut on_call: F,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GrpcError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(IncomingCall) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // Every byte read is a sign of the peer's life (see `LastPong::heard`).
    let last_pong = Arc::new(tether_conn::LastPong::default());
    let (io, setup_done) =
        handshake::SetupWatch::new(tether_conn::Heard::new(io, last_pong.clone()));
    let mut builder = h2::server::Builder::new();
    // Without this, the connection window stays at HTTP/2's initial 64 KiB until a call is
    // accepted (see `H2Settings::window_on_accept`).
    if !settings.window_on_accept {
        builder.initial_connection_window_size(settings.connection_window);
    }
    let handshake = builder
        .initial_window_size(settings.stream_window.max(MIN_STREAM_WINDOW))
        .max_frame_size(settings.max_frame_size)
        .max_send_buffer_size(settings.max_send_buffer)
        .max_concurrent_streams(settings.max_concurrent_streams)
        .max_header_list_size(1024 * 1024)
        .handshake::<_, Bytes>(io);
    // Boxed, so the connection's future does not keep room for it (about 1.3 KiB) after.
    let handshake = Box::pin(handshake);
    let mut conn = match connection.setup_deadline {
        Some(deadline) => tokio::time::timeout_at(deadline, handshake)
            .await
            .map_err(|_| GrpcError::HandshakeTimeout)??,
        None => handshake.await?,
    };
    let far_future = Instant::now() + std::time::Duration::from_secs(86_400 * 365);
    let setup_deadline = tokio::time::sleep_until(connection.setup_deadline.unwrap_or(far_future));
    let streams = StreamCount::new();
    let idle_check = tokio::time::sleep_until(
        settings
            .idle_timeout
            .map_or(far_future, |idle| Instant::now() + idle),
    );
    let ping_pong = settings.keepalive.zip(conn.ping_pong());
    let pongs = last_pong.clone();
    let keepalive = async move {
        match ping_pong {
            Some((k, pp)) => crate::pinger::keep_alive(pp, k, pongs).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(keepalive, shutdown, setup_deadline, idle_check);
    // Every call's task belongs to this connection: it returns only when they have ended.
    let calls = TaskTracker::new();
    let accepted = Arc::new(tokio::sync::Notify::new());
    let mut window_open = !settings.window_on_accept;
    let mut shutting_down = false;
    let result = loop {
        tokio::select! {
            next = conn.accept() => match next {
                Some(Ok((request, respond))) => {
                    let (parts, recv) = request.into_parts();
                    let is_grpc = parts
                        .headers
                        .get(http::header::CONTENT_TYPE)
                        .and_then(|v| v.to_str().ok())
                        .is_some_and(|v| v.starts_with("application/grpc"));
                    if !is_grpc || parts.method != http::Method::POST {
                        let mut respond = respond;
                        let mut response = Response::new(());
                        *response.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
                        let _ = respond.send_response(response, true);
                        continue;
                    }
                    let call = IncomingCall {
                        path: parts.uri.path().to_owned(),
                        metadata: parts.headers,
                        peer: connection.peer.clone(),
                        last_pong: last_pong.clone(),
                        recv,
                        respond,
                        budget: settings.partial_message_budget.clone(),
                        accepted: accepted.clone(),
                        _stream: streams.guard(),
                    };
                    calls.spawn(on_call(call));
                }
                Some(Err(e)) => break Err(e.into()),
                None => break Ok(()),
            },
            () = accepted.notified(), if !window_open => {
                window_open = true;
                conn.set_target_window_size(settings.connection_window);
            }
            () = &mut shutdown, if !shutting_down => {
                shutting_down = true;
                conn.graceful_shutdown();
            }
            err = &mut keepalive => break Err(err),
            () = &mut setup_deadline, if !setup_done.load(Ordering::Relaxed) => {
                break Err(GrpcError::HandshakeTimeout);
            }
            () = &mut idle_check, if !shutting_down => {
                let Some(idle) = settings.idle_timeout else { continue };
                match streams.idle_since() {
                    Some(since) if since + idle <= Instant::now() => {
                        shutting_down = true;
                        conn.graceful_shutdown();
                    }
                    Some(since) => idle_check.as_mut().reset(since + idle),
                    None => idle_check.as_mut().reset(Instant::now() + idle),
                }
            }
        }
    };
    // With the connection gone, every call's stream fails, so its task ends promptly.
    drop(conn);
    calls.close();
    calls.wait().await;
    result
}
