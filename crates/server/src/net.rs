//! Listeners: Unix sockets and TLS over TCP, with the handshake off the accept loop.

use std::io;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tether_grpc::{CertificateNames, PeerIdentity, PeerTransport, UnixCredentials};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::time::Instant;

use crate::tls_source::TlsSource;
use crate::unix_socket::SocketFile;

/// An accepted, ready-to-use byte stream.
pub(crate) trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Makes the coming close abortive (TCP RST) so the peer sees an error, not a clean end.
    /// Unix sockets have no such close; there it does nothing.
    fn abort_on_close(&self) {}

    /// The plain Unix socket, if that is what this is: its halves can wait for data without
    /// holding a read buffer.
    fn into_unix(self: Box<Self>) -> Result<UnixStream, Box<dyn Io>>;
}

/// The gRPC frontend's `:authority` rewrite, used on Unix sockets only (where a close is
/// never abortive, so the default applies). Not a plain socket: gRPC never asks.
impl Io for tether_grpc::AuthorityRewrite<Box<dyn Io>> {
    fn into_unix(self: Box<Self>) -> Result<UnixStream, Box<dyn Io>> {
        Err(self)
    }
}

impl Io for UnixStream {
    fn into_unix(self: Box<Self>) -> Result<UnixStream, Box<dyn Io>> {
        Ok(*self)
    }
}

impl Io for tether_tls::ServerTlsStream {
    fn abort_on_close(&self) {
        tether_tunnel::reset_on_close(self.tcp());
    }

    fn into_unix(self: Box<Self>) -> Result<UnixStream, Box<dyn Io>> {
        Err(self)
    }
}

/// A listening socket.
pub(crate) enum Listener {
    Unix {
        listener: UnixListener,
        file: SocketFile,
    },
    Tls {
        listener: TcpListener,
        tls: TlsSource,
    },
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Listener").field(&self.local_addr()).finish()
    }
}

/// A connection whose TLS handshake (if any) has not run yet, with what is known of its
/// peer so far (address, Unix credentials); [`ready`](Accepted::ready) adds the certificate.
pub(crate) struct Accepted {
    pending: Pending,
    pub(crate) peer: PeerIdentity,
}

enum Pending {
    Unix(UnixStream),
    Tls(TcpStream, Arc<rustls::ServerConfig>),
}

impl Listener {
    /// Binds a Unix socket readable and writable by owner and group only (upstream's 0770),
    /// with that mode from the moment it appears at `path` (see [`SocketFile`]).
    pub(crate) fn unix(path: &Path, delete_existing: bool) -> io::Result<Self> {
        let (listener, file) = SocketFile::bind(path, delete_existing)?;
        Ok(Self::Unix { listener, file })
    }

    pub(crate) async fn tls(addr: SocketAddr, tls: TlsSource) -> io::Result<Self> {
        Ok(Self::Tls {
            listener: TcpListener::bind(addr).await?,
            tls,
        })
    }

    /// Where it listens, for logs and for callers that bound port 0.
    pub(crate) fn local_addr(&self) -> String {
        match self {
            Self::Unix { file, .. } => file.path().display().to_string(),
            Self::Tls { listener, .. } => listener
                .local_addr()
                .map_or_else(|e| e.to_string(), |a| a.to_string()),
        }
    }

    pub(crate) fn tcp_addr(&self) -> Option<SocketAddr> {
        match self {
            Self::Tls { listener, .. } => listener.local_addr().ok(),
            Self::Unix { .. } => None,
        }
    }

    /// Waits for the next connection. Cancel-safe.
    pub(crate) async fn accept(&self) -> io::Result<Accepted> {
        match self {
            Self::Unix { listener, .. } => {
                let stream = listener.accept().await?.0;
                let unix = stream.peer_cred().ok().map(|cred| UnixCredentials {
                    uid: cred.uid(),
                    gid: cred.gid(),
                    pid: cred.pid(),
                });
                Ok(Accepted {
                    pending: Pending::Unix(stream),
                    peer: PeerIdentity {
                        transport: PeerTransport::Unix,
                        addr: None,
                        certificate: None,
                        unix,
                    },
                })
            }
            Self::Tls { listener, tls } => {
                let (stream, addr) = listener.accept().await?;
                stream.set_nodelay(true)?;
                Ok(Accepted {
                    pending: Pending::Tls(stream, tls.config()),
                    peer: PeerIdentity {
                        transport: PeerTransport::Tls,
                        addr: Some(addr),
                        certificate: None,
                        unix: None,
                    },
                })
            }
        }
    }
}

/// How long a refused TLS peer may take to read the alert that says why.
const ALERT_LINGER: Duration = Duration::from_secs(1);
/// How much a refused TLS peer may send meanwhile, all of it discarded.
const ALERT_LINGER_BYTES: usize = 256 << 10;

/// Closes a connection whose handshake this side refused so that the peer reads the alert.
/// In TLS 1.3 a client sends its first data (the HTTP/2 preface) right after its
/// certificate; a close with that data unread would be a TCP RST, and a RST discards the
/// alert in the peer's receive buffer, which then reports "broken pipe" instead of the
/// refusal. So: FIN after the alert, then read and discard until the peer closes, for at most
/// [`ALERT_LINGER`] (within the setup deadline) and [`ALERT_LINGER_BYTES`].
async fn close_after_alert(mut stream: TcpStream, deadline: Instant) {
    use tokio::io::AsyncWriteExt as _;
    let deadline = deadline.min(Instant::now() + ALERT_LINGER);
    let drain = async {
        stream.shutdown().await?;
        let mut buf = [0u8; 4096];
        let mut discarded = 0;
        while discarded < ALERT_LINGER_BYTES {
            match stream.read(&mut buf).await? {
                0 => break,
                n => discarded += n,
            }
        }
        io::Result::Ok(())
    };
    let _ended = tokio::time::timeout_at(deadline, drain).await;
}

/// A connection set up: its stream, who the peer proved to be, and the ALPN protocol TLS
/// chose (on the agent port, `tether/1` for the native link or `h2`).
pub(crate) struct Ready {
    pub(crate) io: Box<dyn Io>,
    pub(crate) peer: PeerIdentity,
    pub(crate) alpn: Option<Vec<u8>>,
}

impl Accepted {
    /// Completes the TLS handshake by `deadline` and returns the stream with the peer's
    /// identity, including the verified client certificate's names.
    pub(crate) async fn ready(self, deadline: Instant) -> io::Result<Ready> {
        let mut peer = self.peer;
        match self.pending {
            Pending::Unix(stream) => Ok(Ready {
                io: Box::new(stream),
                peer,
                alpn: None,
            }),
            Pending::Tls(stream, config) => {
                let accept = tether_tls::accept(stream, config);
                let tls = match tokio::time::timeout_at(deadline, accept).await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err((error, stream))) => {
                        close_after_alert(stream, deadline).await;
                        return Err(error);
                    }
                    Err(_) => {
                        let timeout = "TLS handshake timed out";
                        return Err(io::Error::new(io::ErrorKind::TimedOut, timeout));
                    }
                };
                peer.certificate = tls
                    .connection()
                    .peer_certificates()
                    .and_then(|chain| chain.first())
                    .and_then(|leaf| match CertificateNames::from_der(leaf) {
                        Ok(names) => Some(names),
                        Err(e) => {
                            tracing::debug!(error = %e, "could not read the client certificate's names");
                            None
                        }
                    });
                let alpn = tls.connection().alpn_protocol().map(<[u8]>::to_vec);
                Ok(Ready {
                    io: Box::new(tls),
                    peer,
                    alpn,
                })
            }
        }
    }

    /// The peer's address, for logs.
    pub(crate) fn peer_label(&self) -> String {
        match self.peer.addr {
            Some(addr) => addr.to_string(),
            None => "unix".to_owned(),
        }
    }
}
