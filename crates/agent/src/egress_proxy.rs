//! The agent's TCP connections to proxy servers: direct, or through an HTTP(S) proxy with an
//! HTTP/1.1 CONNECT tunnel, as upstream's agent does through grpc-go's default proxy mapper.
//! Which proxy (from `--https-proxy` or `HTTPS_PROXY`/`NO_PROXY`) is `tether_proxy_env`'s
//! decision; `connect` is the CONNECT exchange and the proxy's answer.
//!
//! The server's own TLS handshake runs inside the tunnel afterwards, with the server's name,
//! exactly as without a proxy.

mod connect;

use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::either::Either;

pub use connect::{AnswerError, Refusal};
pub use tether_proxy_env::{
    EnvironmentError, ProxyEnvironment, ProxyScheme, ProxySetting, ProxyUrl, ProxyUrlError, Route,
    route,
};

/// A connection on which the server's TLS handshake starts: a TCP connection to the server
/// or through an `http://` proxy's tunnel, or a TLS connection to an `https://` proxy
/// carrying the tunnel.
pub(crate) type EgressStream = Either<TcpStream, tokio_rustls::client::TlsStream<TcpStream>>;

/// How the agent reaches its servers.
#[derive(Clone, Debug, Default)]
pub enum Egress {
    #[default]
    Direct,
    Proxy(Arc<EgressProxy>),
}

/// A proxy to tunnel through.
#[derive(Debug)]
pub struct EgressProxy {
    url: ProxyUrl,
    /// TLS to an `https://` proxy; `None` for `http://`.
    tls: Option<Arc<rustls::ClientConfig>>,
}

impl EgressProxy {
    /// `tls` verifies an `https://` proxy (its own CA bundle) and is required for one; it is
    /// not used for an `http://` proxy.
    pub fn new(url: ProxyUrl, tls: Option<Arc<rustls::ClientConfig>>) -> Result<Self, String> {
        match (url.scheme, tls) {
            (ProxyScheme::Https, None) => Err(format!(
                "the proxy {url} is https://, which needs the CA bundle that verifies its certificate"
            )),
            (ProxyScheme::Https, tls) => Ok(Self { url, tls }),
            (ProxyScheme::Http, _) => Ok(Self { url, tls: None }),
        }
    }
}

/// Why the connection to a server could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error("connecting to {server}: {error}")]
    Server {
        server: String,
        error: std::io::Error,
    },
    #[error("connecting to proxy {proxy}: {error}")]
    Proxy {
        proxy: ProxyUrl,
        error: std::io::Error,
    },
    #[error(
        "TLS handshake with proxy {proxy}: {error} (the URL says https://, so the agent speaks TLS to the proxy; upstream's agent speaks plain HTTP to every proxy: if this one does not speak TLS, write http://)"
    )]
    ProxyTls {
        proxy: ProxyUrl,
        error: std::io::Error,
    },
    #[error("proxy {proxy}: {error}")]
    Answer { proxy: ProxyUrl, error: AnswerError },
    #[error("proxy {proxy}: {phase} took longer than {waited:?}")]
    Timeout {
        proxy: ProxyUrl,
        phase: &'static str,
        waited: Duration,
    },
}

impl Egress {
    /// The proxy, when there is one.
    pub fn proxy(&self) -> Option<&ProxyUrl> {
        match self {
            Self::Direct => None,
            Self::Proxy(proxy) => Some(&proxy.url),
        }
    }

    /// Opens a connection to the server at `host:port`, through the proxy if there is one;
    /// every step with the proxy ends by `deadline` (the server connection's own).
    pub(crate) async fn dial(
        &self,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<EgressStream, DialError> {
        let Self::Proxy(proxy) = self else {
            let server = tether_proxy_env::join_host_port(host, port);
            let tcp = TcpStream::connect((host, port))
                .await
                .and_then(nodelay)
                .map_err(|error| DialError::Server { server, error })?;
            return Ok(Either::Left(tcp));
        };
        let url = &proxy.url;
        // The time allowed, to the millisecond (the deadline was set just before this call).
        let allowed = deadline
            .saturating_duration_since(Instant::now())
            .as_micros()
            + 500;
        let allowed = Duration::from_millis(u64::try_from(allowed / 1000).unwrap_or(u64::MAX));
        let timeout = |phase| DialError::Timeout {
            proxy: url.clone(),
            phase,
            waited: allowed,
        };
        let tcp = tokio::time::timeout_at(deadline, TcpStream::connect(url.address()))
            .await
            .map_err(|_| timeout("connecting"))?
            .and_then(nodelay)
            .map_err(|error| DialError::Proxy {
                proxy: url.clone(),
                error,
            })?;
        let mut stream = match &proxy.tls {
            None => Either::Left(tcp),
            Some(tls) => {
                let name =
                    ServerName::try_from(url.host.clone()).map_err(|_| DialError::Proxy {
                        proxy: url.clone(),
                        error: std::io::Error::other(
                            "the proxy host is not a valid TLS server name",
                        ),
                    })?;
                let handshake = tokio_rustls::TlsConnector::from(tls.clone()).connect(name, tcp);
                let tls = tokio::time::timeout_at(deadline, handshake)
                    .await
                    .map_err(|_| timeout("the TLS handshake"))?
                    .map_err(|error| DialError::ProxyTls {
                        proxy: url.clone(),
                        error,
                    })?;
                Either::Right(tls)
            }
        };
        let target = tether_proxy_env::join_host_port(host, port);
        let credentials = url.basic_credentials();
        let exchange = connect::connect(&mut stream, &target, credentials.as_deref());
        tokio::time::timeout_at(deadline, exchange)
            .await
            .map_err(|_| timeout("answering CONNECT"))?
            .map_err(|error| DialError::Answer {
                proxy: url.clone(),
                error,
            })?;
        Ok(stream)
    }
}

/// gRPC's small frames must not wait for Nagle's algorithm.
fn nodelay(tcp: TcpStream) -> std::io::Result<TcpStream> {
    tcp.set_nodelay(true)?;
    Ok(tcp)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpListener;

    fn via(listener: &TcpListener) -> Egress {
        let url = ProxyUrl::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        Egress::Proxy(Arc::new(EgressProxy::new(url, None).unwrap()))
    }

    /// A proxy that accepts and never answers: the dial ends at the deadline, naming the step.
    #[tokio::test]
    async fn a_silent_proxy_times_out_at_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let egress = via(&listener);
        let silent = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut sink = Vec::new();
            let _ = conn.read_to_end(&mut sink).await;
        });
        let started = Instant::now();
        let err = egress
            .dial("server.example", 8091, started + Duration::from_millis(300))
            .await
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(
            err.contains("answering CONNECT took longer than 300ms"),
            "{err}"
        );
        silent.abort();
    }

    #[tokio::test]
    async fn a_refused_proxy_connection_names_the_proxy() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let egress = via(&listener);
        let address = listener.local_addr().unwrap();
        drop(listener);
        let err = egress
            .dial(
                "server.example",
                8091,
                Instant::now() + Duration::from_secs(5),
            )
            .await
            .unwrap_err();
        assert!(matches!(err, DialError::Proxy { .. }), "{err}");
        assert!(
            err.to_string()
                .starts_with(&format!("connecting to proxy http://{address}: ")),
            "{err}"
        );
    }

    /// An answer of 200 leaves the connection as the tunnel: what the "server" sends arrives.
    #[tokio::test]
    async fn a_200_answer_hands_over_the_tunnel() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let egress = via(&listener);
        let proxy = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            while !request.ends_with(b"\r\n\r\n") {
                let mut byte = [0];
                assert_eq!(conn.read(&mut byte).await.unwrap(), 1);
                request.push(byte[0]);
            }
            conn.write_all(b"HTTP/1.1 200 Connection established\r\n\r\nhello")
                .await
                .unwrap();
            String::from_utf8(request).unwrap()
        });
        let mut stream = egress
            .dial("fd00::1", 8091, Instant::now() + Duration::from_secs(5))
            .await
            .unwrap();
        let mut hello = [0; 5];
        stream.read_exact(&mut hello).await.unwrap();
        assert_eq!(&hello, b"hello");
        let request = proxy.await.unwrap();
        assert!(request.starts_with("CONNECT [fd00::1]:8091 HTTP/1.1\r\nHost: [fd00::1]:8091\r\n"));
    }

    #[test]
    fn an_https_proxy_needs_its_ca() {
        let url = ProxyUrl::parse("https://proxy:3129").unwrap();
        let err = EgressProxy::new(url, None).unwrap_err();
        assert!(
            err.contains("https://proxy:3129") && err.contains("CA bundle"),
            "{err}"
        );
    }
}
