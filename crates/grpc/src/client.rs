//! Opening gRPC calls on an HTTP/2 connection.

use bytes::Bytes;
use http::{HeaderValue, Request, uri};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;

use crate::{GrpcError, H2Settings, PacketReceiver, PacketSender};

/// One HTTP/2 connection to a server. Cheap to clone; every clone opens calls on the same
/// connection. The connection is driven by a task that ends when the connection does.
#[derive(Clone, Debug)]
pub struct Channel {
    send_request: h2::client::SendRequest<Bytes>,
    scheme: uri::Scheme,
    authority: uri::Authority,
    closed: watch::Receiver<Option<String>>,
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
        let keepalive = settings.keepalive.zip(conn.ping_pong());
        tokio::spawn(async move {
            let keepalive = async {
                match keepalive {
                    Some((k, pp)) => crate::keep_alive(pp, k).await,
                    None => std::future::pending().await,
                }
            };
            let reason = tokio::select! {
                result = &mut conn => match result {
                    Ok(()) => "connection closed".to_owned(),
                    Err(e) => e.to_string(),
                },
                err = keepalive => err.to_string(),
            };
            tracing::debug!(%reason, "http/2 client connection ended");
            let _ = closed_tx.send(Some(reason));
        });
        Ok(Self {
            send_request,
            scheme: if tls { uri::Scheme::HTTPS } else { uri::Scheme::HTTP },
            authority,
            closed,
        })
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
        headers.insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
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
        Ok((PacketSender::new(send, false), PacketReceiver::client(response)))
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
