//! Opening gRPC calls on an HTTP/2 connection.

use bytes::Bytes;
use http::{HeaderValue, Request, uri};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite};

use tokio::sync::{oneshot, watch};

use crate::error::GrpcError;
use crate::settings::{H2Settings, MIN_STREAM_WINDOW};
use crate::stream::{PacketReceiver, PacketSender};

/// One HTTP/2 connection to a server. Cheap to clone; every clone opens calls on the same
/// connection. The connection makes progress only while its [`ChannelDriver`] runs.
#[derive(Clone, Debug)]
pub struct Channel {
    send_request: h2::client::SendRequest<Bytes>,
    scheme: uri::Scheme,
    authority: uri::Authority,
    closed: watch::Receiver<Option<String>>,
    /// Taken by the first [`Channel::start_keepalive`], which hands the settings to the driver.
    keepalive: Arc<Mutex<Option<oneshot::Sender<tether_conn::Keepalive>>>>,
    last_pong: Arc<tether_conn::LastPong>,
}

/// Drives one [`Channel`]'s HTTP/2 connection and its keepalive pings. The caller spawns
/// [`run`](Self::run) on a task it owns (a server or agent tracks it so that shutting down
/// waits for it); it ends when the connection does, or when keepalive gives up on the peer.
#[must_use = "a channel makes no progress unless its driver runs"]
pub struct ChannelDriver<IO> {
    connection: h2::client::Connection<IO, Bytes>,
    ping_pong: Option<h2::PingPong>,
    keepalive: oneshot::Receiver<tether_conn::Keepalive>,
    closed: watch::Sender<Option<String>>,
    last_pong: Arc<tether_conn::LastPong>,
}

impl<IO> std::fmt::Debug for ChannelDriver<IO> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelDriver").finish_non_exhaustive()
    }
}

impl<IO: AsyncRead + AsyncWrite + Unpin> ChannelDriver<IO> {
    /// Runs the connection to its end and records why it ended for [`Channel::closed`].
    pub async fn run(self) {
        let Self {
            mut connection,
            ping_pong,
            keepalive,
            closed,
            last_pong,
        } = self;
        let pings = async {
            match (ping_pong, keepalive.await) {
                (Some(ping_pong), Ok(settings)) => {
                    crate::pinger::keep_alive(ping_pong, settings, last_pong).await
                }
                // No keepalive was asked for (or every channel handle is gone): only the
                // connection can end the driver.
                _ => std::future::pending().await,
            }
        };
        let reason = tokio::select! {
            result = &mut connection => match result {
                Ok(()) => "connection closed".to_owned(),
                Err(e) => e.to_string(),
            },
            error = pings => format!("peer stopped answering keepalive pings: {error}"),
        };
        tracing::debug!(%reason, "http/2 client connection ended");
        let _ = closed.send(Some(reason));
    }
}

impl Channel {
    /// Performs the HTTP/2 handshake on `io` (already TLS-wrapped where needed). `authority`
    /// is sent as `:authority`; `tls` picks the scheme. Spawn the returned driver before
    /// awaiting anything on the channel.
    pub async fn handshake<IO>(
        io: IO,
        settings: &H2Settings,
        authority: &str,
        tls: bool,
    ) -> Result<(Self, ChannelDriver<IO>), GrpcError>
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let authority: uri::Authority = authority
            .parse()
            .or_else(|_| "localhost".parse())
            .expect("static authority parses");
        let (send_request, mut connection) = h2::client::Builder::new()
            .initial_window_size(settings.stream_window.max(MIN_STREAM_WINDOW))
            .initial_connection_window_size(settings.connection_window)
            .max_frame_size(settings.max_frame_size)
            .max_send_buffer_size(settings.max_send_buffer)
            .enable_push(false)
            .handshake::<_, Bytes>(io)
            .await?;
        let (closed_tx, closed) = watch::channel(None);
        let (keepalive_tx, keepalive_rx) = oneshot::channel();
        let last_pong = Arc::new(tether_conn::LastPong::default());
        let driver = ChannelDriver {
            last_pong: last_pong.clone(),
            ping_pong: connection.ping_pong(),
            connection,
            keepalive: keepalive_rx,
            closed: closed_tx,
        };
        let channel = Self {
            send_request,
            scheme: if tls {
                uri::Scheme::HTTPS
            } else {
                uri::Scheme::HTTP
            },
            authority,
            closed,
            keepalive: Arc::new(Mutex::new(Some(keepalive_tx))),
            last_pong,
        };
        if let Some(keepalive) = settings.keepalive {
            channel.start_keepalive(keepalive);
        }
        Ok((channel, driver))
    }

    /// Starts probing the peer with HTTP/2 PINGs; the driver drops the connection when one
    /// goes unanswered. Deferred from the handshake because the right interval depends on who
    /// the peer turns out to be. Only the first call has an effect.
    pub fn start_keepalive(&self, keepalive: tether_conn::Keepalive) {
        let sender = self
            .keepalive
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(sender) = sender {
            let _ = sender.send(keepalive);
        }
    }

    /// When the server last answered a keepalive PING.
    pub fn last_pong(&self) -> Arc<tether_conn::LastPong> {
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
            PacketSender::new(send, None),
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
