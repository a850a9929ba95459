//! One selection's dialer: straight to the destination, or through a proxy server's gRPC or
//! HTTP CONNECT frontend, as kube-apiserver dials for that selection.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Mutex;

use super::config::{Connection, TcpTransport};
use super::error::EgressError;
use crate::{
    DEFAULT_DIAL_TIMEOUT, DialError, GrpcClient, ProxySocket, Transport, TunnelStream,
    dial_http_connect,
};

/// How long reaching the proxy server (and a direct TCP connect) may take: Go's
/// `http.DefaultTransport` dial timeout, which kube-apiserver also gives its gRPC connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Dials destinations for one egress selection. Cheap to share behind an `Arc`; dials may run
/// concurrently.
#[derive(Debug)]
pub struct EgressDialer {
    route: Route,
}

#[derive(Debug)]
enum Route {
    /// `Direct`: a plain TCP connection to the destination.
    Direct,
    /// `GRPC`: one HTTP/2 connection, one `Proxy` call per dial, reconnected once it ends.
    Grpc {
        transport: Transport,
        client: Mutex<Option<GrpcClient>>,
    },
    /// `HTTPConnect`: a new socket and CONNECT request per dial, as kube-apiserver does.
    HttpConnect(Transport),
}

impl EgressDialer {
    /// The dialer a validated connection describes. Loads TLS credentials now, so that a bad
    /// file shows at start-up rather than at the first dial.
    pub(crate) fn new(connection: &Connection) -> Result<Self, EgressError> {
        let transport = connection.transport.as_ref();
        let route = match connection.proxy_protocol.as_str() {
            "Direct" => Route::Direct,
            "GRPC" => {
                let uds = transport.and_then(|t| t.uds.as_ref());
                let uds = uds.ok_or_else(|| unsupported("GRPC needs a uds transport"))?;
                Route::Grpc {
                    transport: Transport::Unix(uds.uds_name.clone().into()),
                    client: Mutex::new(None),
                }
            }
            "HTTPConnect" => match transport.map(|t| (&t.uds, &t.tcp)) {
                Some((Some(uds), None)) => {
                    Route::HttpConnect(Transport::Unix(uds.uds_name.clone().into()))
                }
                Some((None, Some(tcp))) => Route::HttpConnect(tls_transport(tcp)?),
                _ => return Err(unsupported("HTTPConnect needs exactly one of tcp and uds")),
            },
            other => return Err(unsupported(&format!("unknown proxyProtocol {other:?}"))),
        };
        Ok(Self { route })
    }

    /// Opens a connection to `address` (`host:port`). Reaching the proxy server may take
    /// [`CONNECT_TIMEOUT`], the proxy's answer [`DEFAULT_DIAL_TIMEOUT`] more.
    pub async fn dial(&self, address: &str) -> Result<EgressStream, DialError> {
        match &self.route {
            Route::Direct => {
                let connect = TcpStream::connect(address);
                match tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
                    Ok(Ok(tcp)) => Ok(EgressStream::Direct(tcp)),
                    Ok(Err(e)) => Err(DialError::Endpoint {
                        message: format!("dial tcp {address}: {e}"),
                    }),
                    Err(_) => Err(DialError::Timeout),
                }
            }
            Route::Grpc { transport, client } => {
                let client = self.grpc_client(transport, client).await?;
                client.dial(address).await.map(EgressStream::Grpc)
            }
            Route::HttpConnect(transport) => {
                let dial = dial_http_connect(transport, address);
                tokio::time::timeout(CONNECT_TIMEOUT + DEFAULT_DIAL_TIMEOUT, dial)
                    .await
                    .unwrap_or(Err(DialError::Timeout))
                    .map(EgressStream::HttpConnect)
            }
        }
    }

    /// The shared gRPC client, connecting first if there is none or it has closed. Dials
    /// wait for one connection attempt rather than each making its own.
    async fn grpc_client(
        &self,
        transport: &Transport,
        slot: &Mutex<Option<GrpcClient>>,
    ) -> Result<GrpcClient, DialError> {
        let mut slot = slot.lock().await;
        if let Some(client) = slot.as_ref().filter(|c| !c.is_closed()) {
            return Ok(client.clone());
        }
        *slot = None;
        let connect = GrpcClient::connect(transport);
        let client = tokio::time::timeout(CONNECT_TIMEOUT, connect)
            .await
            .map_err(|_| DialError::Timeout)??;
        *slot = Some(client.clone());
        Ok(client)
    }
}

/// An `https://host:port` URL and mutual-TLS files as a [`Transport`].
fn tls_transport(tcp: &TcpTransport) -> Result<Transport, EgressError> {
    let Some(rest) = tcp.url.strip_prefix("https://") else {
        // Validation lets http:// through, but kube-apiserver cannot dial it (it always
        // speaks TLS over TCP, and panics without a tlsConfig), and tether sends no proxy
        // traffic in plaintext over TCP.
        return Err(unsupported(&format!(
            "tcp url {:?}: only https:// is supported over TCP (use a uds transport for a local \
             plaintext proxy)",
            tcp.url
        )));
    };
    let addr = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = host_of(addr)
        .ok_or_else(|| unsupported(&format!("tcp url {:?}: want https://host:port", tcp.url)))?;
    let tls = tcp
        .tls_config
        .as_ref()
        .ok_or_else(|| unsupported("https:// needs tlsConfig"))?;
    if tls.ca_bundle.is_empty() {
        return Err(unsupported(
            "tlsConfig.caBundle is empty: tether-client verifies the proxy server against a CA \
             bundle only, not the system trust roots",
        ));
    }
    let config = tether_tls::client_config(
        tls.ca_bundle.as_ref(),
        Some((tls.client_cert.as_ref(), tls.client_key.as_ref())),
        Vec::new(),
        &tether_tls::TlsOptions::default(),
    )
    .map_err(|e| EgressError::Transport(e.to_string()))?;
    let server_name = if tls.tls_server_name.is_empty() {
        host.to_owned()
    } else {
        tls.tls_server_name.clone()
    };
    Ok(Transport::Tls {
        addr: addr.to_owned(),
        server_name,
        tls: Arc::clone(&config),
    })
}

/// The host of `host:port` or `[v6]:port`; `None` without a port.
fn host_of(addr: &str) -> Option<&str> {
    let (host, port) = addr.rsplit_once(':')?;
    if port.is_empty() || !port.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    (!host.is_empty()).then_some(host)
}

fn unsupported(reason: &str) -> EgressError {
    EgressError::Transport(reason.to_owned())
}

/// A connection to the destination, however it was made.
#[derive(Debug)]
pub enum EgressStream {
    Direct(TcpStream),
    Grpc(TunnelStream),
    HttpConnect(ProxySocket),
}

macro_rules! each {
    ($self:expr, $s:ident => $e:expr) => {
        match $self {
            EgressStream::Direct($s) => $e,
            EgressStream::Grpc($s) => $e,
            EgressStream::HttpConnect($s) => $e,
        }
    };
}

impl AsyncRead for EgressStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        each!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for EgressStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self.get_mut(), s => Pin::new(s).poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        each!(self, s => s.is_write_vectored())
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}

#[cfg(test)]
mod tests {
    use super::host_of;

    #[test]
    fn hosts_of_addresses() {
        assert_eq!(host_of("proxy.example:8131"), Some("proxy.example"));
        assert_eq!(host_of("[::1]:8131"), Some("::1"));
        assert_eq!(host_of("proxy.example"), None);
        assert_eq!(host_of(":8131"), None);
        assert_eq!(host_of("proxy.example:"), None);
    }
}
