//! Opening gRPC calls on an HTTP/2 connection.

use bytes::Bytes;
use http::{HeaderValue, Request, uri};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite};

use tokio::sync::{Notify, watch};

use crate::{GrpcError, H2Settings, PacketReceiver, PacketSender};

/// One HTTP/2 connection to a server. Cheap to clone; every clone opens calls on the same
/// connection. The connection is driven by a task that ends when the connection does.
#[derive(Clone, Debug)]
pub struct Channel {
    send_request: h2::client::SendRequest<Bytes>,
    scheme: uri::Scheme,
    authority: uri::Authority,
    closed: watch::Receiver<Option<String>>,
    /// Taken by the first [`Channel::start_keepalive`].
    ping_pong: Arc<Mutex<Option<h2::PingPong>>>,
    /// Ends the connection when keepalive gives up on the peer.
    kill: Arc<Notify>,
    last_pong: Arc<crate::LastPong>,
}

impl Channel {
    /// Performs the HTTP/2 handshake on `io` (already TLS-wrapped where needed) and spawns
    /// the connection driver. `authority` is sent as `:authority`; `tls` picks the scheme.
    pub async fn handshake<IO>(
        io: IO,
        settings: &H2Settings,
        authority: &str,
        tls: bool,
    ) -> Result<Self, GrpcError>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let authority: uri::Authority = authority
            .parse()
            .or_else(|_| "localhost".parse())
            .expect("static authority parses");
        let (send_request, mut conn) = h2::client::Builder::new()
            .initial_window_size(settings.stream_window)
            .initial_connection_window_size(settings.connection_window)
            .max_frame_size(settings.max_frame_size)
            .max_send_buffer_size(settings.max_send_buffer)
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await?;
        let (closed_tx, closed) = watch::channel(None);
        let ping_pong = Arc::new(Mutex::new(conn.ping_pong()));
        let kill = Arc::new(Notify::new());
        let killed = kill.clone();
        tokio::spawn(async move {
            let reason = tokio::select! {
                result = &mut conn => match result {
                    Ok(()) => "connection closed".to_owned(),
                    Err(e) => e.to_string(),
                },
                () = killed.notified() => "peer stopped answering keepalive pings".to_owned(),
            };
            tracing::debug!(%reason, "http/2 client connection ended");
            let _ = closed_tx.send(Some(reason));
        });
        let channel = Self {
            send_request,
            scheme: if tls {
                uri::Scheme::HTTPS
            } else {
                uri::Scheme::HTTP
            },
            authority,
            closed,
            ping_pong,
            kill,
            last_pong: Arc::default(),
        };
        if let Some(keepalive) = settings.keepalive {
            channel.start_keepalive(keepalive);
        }
        Ok(channel)
    }

    /// Starts probing the peer with HTTP/2 PINGs and drops the connection when one goes
    /// unanswered. Deferred from the handshake because the right interval depends on who
    /// the peer turns out to be. Only the first call has an effect.
    pub fn start_keepalive(&self, keepalive: crate::Keepalive) {
        let Some(ping_pong) = self.ping_pong.lock().ok().and_then(|mut p| p.take()) else {
            return;
        };
        let kill = self.kill.clone();
        let last_pong = self.last_pong.clone();
        tokio::spawn(async move {
            let error = crate::keep_alive(ping_pong, keepalive, last_pong).await;
            tracing::debug!(%error, "keepalive ended");
            // notify_one stores a permit, so the driver sees it even if not yet waiting.
            kill.notify_one();
        });
    }

    /// When the server last answered a keepalive PING.
    pub fn last_pong(&self) -> Arc<crate::LastPong> {
        self.last_pong.clone()
    }

    /// Opens a call. Returns at once: the response headers are awaited lazily by the
    /// receiver, because gRPC servers may hold them back until their first message.
    pub async fn call(
        &self,
        path: &str,
        metadata: &[(&'static str, String)],
    ) -> Result<(PacketSender, PacketReceiver), GrpcError> {
        let uri = uri::Builder::new()
            .scheme(self.scheme.clone())
            .authority(self.authority.clone())
            .path_and_query(path)
            .build()
            .map_err(|e| GrpcError::NotGrpc(e.to_string()))?;
        let mut request = Request::post(uri).body(()).expect("valid request parts");
        let headers = request.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(http::header::TE, HeaderValue::from_static("trailers"));
        headers.insert(
            http::header::USER_AGENT,
            HeaderValue::from_static(concat!("tether/", env!("CARGO_PKG_VERSION"))),
        );
        for (key, value) in metadata {
            let value = HeaderValue::from_str(value)
                .map_err(|_| GrpcError::NotGrpc(format!("invalid metadata value for {key}")))?;
            headers.insert(*key, value);
        }
        let mut send_request = self.send_request.clone().ready().await?;
        let (response, send) = send_request.send_request(request, false)?;
        Ok((
            PacketSender::new(send, false),
            PacketReceiver::client(response),
        ))
    }

    /// Resolves with the reason once the connection has ended.
    pub async fn closed(&self) -> String {
        let mut closed = self.closed.clone();
        match closed.wait_for(Option::is_some).await {
            Ok(reason) => reason.clone().unwrap_or_default(),
            Err(_) => "connection driver gone".to_owned(),
        }
    }

    /// True once the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.borrow().is_some()
    }
}
