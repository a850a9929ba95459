//! Shared test helpers: deadlines, listeners, TLS credentials.

use std::future::Future;
use std::time::Duration;

use tempfile::TempDir;
use tether_client::Transport;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio_rustls::TlsAcceptor;

/// Every test finishes well within this, or fails instead of hanging.
const TEST_DEADLINE: Duration = Duration::from_secs(60);

/// Runs `fut` under [`TEST_DEADLINE`].
pub(crate) async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_DEADLINE, fut)
        .await
        .expect("test exceeded its deadline")
}

/// A stream a stand-in peer serves.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

/// A listening socket for a stand-in peer, and the transport that reaches it.
pub(crate) enum Listener {
    Unix(UnixListener),
    Tls(TcpListener, TlsAcceptor),
}

impl Listener {
    /// A Unix socket in `dir`.
    pub(crate) fn unix(dir: &TempDir) -> (Self, Transport) {
        let path = dir.path().join("proxy.sock");
        let listener = UnixListener::bind(&path).expect("bind unix socket");
        (Self::Unix(listener), Transport::Unix(path))
    }

    /// Mutual TLS on loopback. The server accepts only `server_alpn`; the client config
    /// offers `h2`, so a transport that did not set ALPN per frontend would fail HTTP CONNECT.
    pub(crate) async fn tls(dir: &TempDir, server_alpn: &[u8]) -> (Self, Transport) {
        let pki = tether_tls::pki::Pki::generate().expect("generate PKI");
        let files = pki.write_to(dir.path()).expect("write PKI");
        let server = tether_tls::server_config(
            &files.server_cert,
            &files.server_key,
            Some(&files.ca_cert),
            &[server_alpn],
            &tether_tls::TlsOptions::default(),
        )
        .expect("server TLS config");
        let client = tether_tls::client_config_from_pem(
            &pki.ca_cert_pem,
            Some((&pki.client_cert_pem, &pki.client_key_pem)),
            vec![b"h2".to_vec()],
        )
        .expect("client TLS config");
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind loopback");
        let addr = listener.local_addr().expect("local address");
        let transport = Transport::Tls {
            addr: addr.to_string(),
            server_name: "localhost".to_owned(),
            tls: client,
        };
        (Self::Tls(listener, TlsAcceptor::from(server)), transport)
    }

    /// Accepts the next connection, completing the TLS handshake if any; `None` when the
    /// handshake failed (the client is told, the listener stays usable).
    pub(crate) async fn accept(&self) -> std::io::Result<Option<Box<dyn Io>>> {
        match self {
            Self::Unix(listener) => Ok(Some(Box::new(listener.accept().await?.0))),
            Self::Tls(listener, acceptor) => {
                let (tcp, _) = listener.accept().await?;
                Ok(acceptor
                    .accept(tcp)
                    .await
                    .ok()
                    .map(|tls| Box::new(tls) as Box<dyn Io>))
            }
        }
    }
}

/// `len` bytes of a pattern that differs per `seed`, so swapped or shifted data shows.
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()[0]
        })
        .collect()
}

/// Shared handle to a spawned accept loop; the loop stops when this is dropped.
pub(crate) struct AbortOnDrop(pub(crate) tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
