//! [`GrpcClient`]: dials through a proxy server's gRPC frontend.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tether_grpc::H2Settings;
use tether_grpc::client::Channel;
use tokio::sync::oneshot;

use crate::{ClientError, DialError, Transport, TunnelStream, call};

/// How long a dial may wait for its DIAL_RSP: the Go client's backstop.
pub const DEFAULT_DIAL_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of the gRPC frontend (`ProxyService.Proxy`).
///
/// One HTTP/2 connection carries one `Proxy` call per dial, like the Go client's
/// `CreateGRPCTunnel` and kube-apiserver's newer GRPC dialer: upstream servers support one
/// connection per call, and one connection saves a handshake per dial. Clones share the
/// connection, and dials may run concurrently. Once [`is_closed`](Self::is_closed) turns
/// true every dial fails; connect again.
#[derive(Clone, Debug)]
pub struct GrpcClient {
    channel: Channel,
    /// The frontend's TLS refusal, if one came inside HTTP/2 (see [`tether_tls::Watched`]).
    refusal: Arc<OnceLock<rustls::Error>>,
    authority: String,
}

impl GrpcClient {
    /// Connects to the frontend and performs the HTTP/2 handshake (h2c over a Unix socket,
    /// ALPN `h2` over TLS). There is no deadline of its own: wrap it in
    /// `tokio::time::timeout` (kube-apiserver allows 30 s).
    pub async fn connect(transport: &Transport) -> Result<Self, ClientError> {
        let socket = transport.connect(b"h2").await?;
        let (socket, refusal) = tether_tls::Watched::new(socket);
        let authority = transport.authority().to_owned();
        let settings = H2Settings::frontend();
        let handshake = Channel::handshake(socket, &settings, &authority, transport.is_tls());
        let (channel, driver) = match handshake.await {
            Ok(connected) => connected,
            Err(error) => return Err(tls_refusal(&refusal, &authority, error.into())),
        };
        // A library has no task tracker to hand this to: the driver ends by itself once the
        // last clone of this client and the last stream opened on it are dropped.
        tokio::spawn(driver.run());
        Ok(Self {
            channel,
            refusal,
            authority,
        })
    }

    /// Dials `address` (`host:port`, TCP) through the proxy, waiting at most
    /// [`DEFAULT_DIAL_TIMEOUT`] for the answer.
    pub async fn dial(&self, address: &str) -> Result<TunnelStream, DialError> {
        self.dial_with_timeout(address, DEFAULT_DIAL_TIMEOUT).await
    }

    /// Dials `address`, giving up after `timeout`. A dial given up on, by the timeout or by
    /// dropping this future, is cancelled with DIAL_CLS so the server forgets it.
    pub async fn dial_with_timeout(
        &self,
        address: &str,
        timeout: Duration,
    ) -> Result<TunnelStream, DialError> {
        tokio::time::timeout(timeout, self.open(address))
            .await
            .unwrap_or(Err(DialError::Timeout))
    }

    /// True once the HTTP/2 connection has ended.
    pub fn is_closed(&self) -> bool {
        self.channel.is_closed()
    }

    async fn open(&self, address: &str) -> Result<TunnelStream, DialError> {
        let opened = async {
            let (tx, rx) = self.channel.call(tether_proto::path::PROXY, &[]).await?;
            let (result_tx, result_rx) = oneshot::channel();
            tokio::spawn(call::run(tx, rx, address.to_owned(), result_tx));
            result_rx.await.unwrap_or_else(|_| {
                let gone =
                    ClientError::Closed("the call's task ended before the dial response".into());
                Err(gone.into())
            })
        };
        opened.await.map_err(|error| match error {
            DialError::Proxy(error) => {
                DialError::Proxy(tls_refusal(&self.refusal, &self.authority, error))
            }
            other => other,
        })
    }
}

/// `error`, or the TLS refusal behind it when the frontend's TLS refused this client inside
/// HTTP/2 (the rustls error, which [`ClientError::handshake_failure`] reads).
fn tls_refusal(
    refusal: &OnceLock<rustls::Error>,
    authority: &str,
    error: ClientError,
) -> ClientError {
    match (refusal.get(), &error) {
        (Some(tls), ClientError::Grpc(_) | ClientError::Io(_)) => ClientError::Tls {
            server_name: authority.to_owned(),
            error: std::io::Error::new(std::io::ErrorKind::InvalidData, tls.clone()),
        },
        _ => error,
    }
}
