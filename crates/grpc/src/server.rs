//! Accepting gRPC calls on HTTP/2 connections.

use std::future::Future;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::{GrpcError, H2Settings, PacketReceiver, PacketSender, Status};

/// A call a client opened; answer it with [`accept`](Self::accept) or [`reject`](Self::reject).
#[derive(Debug)]
pub struct IncomingCall {
    path: String,
    metadata: HeaderMap,
    recv: h2::RecvStream,
    respond: h2::server::SendResponse<Bytes>,
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
        Ok((
            PacketSender::new(send, true),
            PacketReceiver::server(self.recv),
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

/// Serves one HTTP/2 connection: every call becomes a task running `on_call`.
///
/// When `shutdown` resolves the connection sends GOAWAY and returns once open calls ended;
/// the caller bounds that with its own grace period. Returns an error when the connection
/// failed or the peer stopped answering keepalive pings.
pub async fn serve_connection<IO, F, Fut>(
    io: IO,
    settings: &H2Settings,
    mut on_call: F,
    shutdown: impl Future<Output = ()>,
) -> Result<(), GrpcError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(IncomingCall) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut conn = h2::server::Builder::new()
        .initial_window_size(settings.stream_window)
        .initial_connection_window_size(settings.connection_window)
        .max_frame_size(settings.max_frame_size)
        .max_send_buffer_size(settings.max_send_buffer)
        .max_concurrent_streams(settings.max_concurrent_streams)
        .max_header_list_size(1024 * 1024)
        .handshake::<_, Bytes>(io)
        .await?;
    let ping_pong = settings.keepalive.zip(conn.ping_pong());
    let keepalive = async move {
        match ping_pong {
            Some((k, pp)) => crate::keep_alive(pp, k).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(keepalive, shutdown);
    let mut shutting_down = false;
    loop {
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
                        recv,
                        respond,
                    };
                    tokio::spawn(on_call(call));
                }
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(()),
            },
            () = &mut shutdown, if !shutting_down => {
                shutting_down = true;
                conn.graceful_shutdown();
            }
            err = &mut keepalive => return Err(err),
        }
    }
}
