//! Reaching a proxy server's frontend: a Unix socket, or TCP with TLS.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::ClientError;

/// How to reach a proxy server's frontend.
#[derive(Clone, Debug)]
pub enum Transport {
    /// A Unix socket (upstream's `--uds-name`): plaintext, access is gated by file mode.
    Unix(PathBuf),
    /// TCP with TLS, normally mutual (upstream's `--server-port` with `--server-ca-cert`).
    ///
    /// `tls` is used as given except for ALPN, which is set per frontend (`h2` for gRPC,
    /// `http/1.1` for HTTP CONNECT) so that one config serves both.
    Tls {
        /// `host:port`.
        addr: String,
        /// The name the server certificate must carry.
        server_name: String,
        tls: Arc<rustls::ClientConfig>,
    },
}

impl Transport {
    /// Opens a socket to the frontend, offering `alpn` when TLS is used.
    pub(crate) async fn connect(&self, alpn: &[u8]) -> Result<ProxySocket, ClientError> {
        match self {
            Self::Unix(path) => UnixStream::connect(path)
                .await
                .map(ProxySocket::Unix)
                .map_err(|error| ClientError::Connect {
                    target: path.display().to_string(),
                    error,
                }),
            Self::Tls {
                addr,
                server_name,
                tls,
            } => {
                let name = ServerName::try_from(server_name.clone())
                    .map_err(|_| ClientError::ServerName(server_name.clone()))?;
                let tcp = TcpStream::connect(addr.as_str()).await.map_err(|error| {
                    ClientError::Connect {
                        target: addr.clone(),
                        error,
                    }
                })?;
                // Both frontends carry interactive traffic; don't let Nagle delay small writes.
                tcp.set_nodelay(true)?;
                let stream = TlsConnector::from(with_alpn(tls, alpn))
                    .connect(name, tcp)
                    .await
                    .map_err(|error| ClientError::Tls {
                        server_name: server_name.clone(),
                        error,
                    })?;
                Ok(ProxySocket::Tls(Box::new(stream)))
            }
        }
    }

    /// The gRPC `:authority`: `localhost` over a Unix socket (as grpc-go sends for `unix:`
    /// targets), else the address dialed.
    pub(crate) fn authority(&self) -> &str {
        match self {
            Self::Unix(_) => "localhost",
            Self::Tls { addr, .. } => addr,
        }
    }

    pub(crate) fn is_tls(&self) -> bool {
        matches!(self, Self::Tls { .. })
    }
}

/// `config` offering exactly `alpn`; cloned only when it offers something else.
fn with_alpn(config: &Arc<rustls::ClientConfig>, alpn: &[u8]) -> Arc<rustls::ClientConfig> {
    if config.alpn_protocols == [alpn] {
        return Arc::clone(config);
    }
    let mut config = rustls::ClientConfig::clone(config);
    config.alpn_protocols = vec![alpn.to_vec()];
    Arc::new(config)
}

/// A connected socket to the proxy server. After a successful HTTP CONNECT it carries the
/// tunnelled bytes directly.
#[derive(Debug)]
pub enum ProxySocket {
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for ProxySocket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ProxySocket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Unix(s) => s.is_write_vectored(),
            Self::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}
