//! The smallest correct forwarder (`tether-bench relay`), run as its own process: two of
//! them in series are the `relay-limit` anchors, the cost of a proxy chain itself (three
//! sockets in series, two extra processes) without any protocol on top.
//!
//! Per accepted connection it dials `--to` and copies both ways with
//! `copy_bidirectional_with_sizes` and large buffers, half-closes passed on. With
//! `--tls-connect` the outgoing leg is mutual TLS as a client, with `--tls-accept` the
//! incoming leg is mutual TLS as a server: the same rustls (aws-lc-rs) configs, cipher suites and
//! protocol versions as tether's agent link. Runs on a single-threaded runtime (see
//! BENCHMARKS.md). With `--cut-on-sigusr1` it stands for a middlebox between an agent and
//! its server (the `resume` workload): SIGUSR1 closes every connection through it at once.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use rustls::pki_types::ServerName;
use tether_tls::TlsOptions;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// Buffer per direction and connection: as large as the bulk workload's writes.
const COPY_BUF: usize = 256 * 1024;

/// Deadline of the dial and of the TLS handshake of one connection.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Which leg of the relay is mutual TLS.
#[derive(Clone, Debug)]
pub enum Tls {
    /// Both legs plain TCP.
    None,
    /// Connect to `--to` as a TLS client with this certificate (relay A).
    Connect(TlsFiles),
    /// Accept TLS clients with this certificate, requiring theirs (relay B).
    Accept(TlsFiles),
}

/// PEM files of one side of the TLS leg.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    /// The CA that verifies the peer.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Serves until killed; prints `127.0.0.1:<port>` on stdout once listening.
pub async fn serve(listen: &str, to: &str, tls: Tls, cut_on_signal: bool) -> anyhow::Result<()> {
    let listener = TcpListener::bind(listen).await?;
    println!("{}", listener.local_addr()?);
    let cuts = tokio::sync::watch::Sender::new(0u64);
    if cut_on_signal {
        let mut signals =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::user_defined1())?;
        let cuts = cuts.clone();
        tokio::spawn(async move {
            while signals.recv().await.is_some() {
                cuts.send_modify(|n| *n += 1);
            }
        });
    }
    run(listener, to, tls, cuts).await
}

/// Forwards every connection accepted on `listener` to `to`, until a cut closes it.
async fn run(
    listener: TcpListener,
    to: &str,
    tls: Tls,
    cuts: tokio::sync::watch::Sender<u64>,
) -> anyhow::Result<()> {
    let opts = TlsOptions::default();
    let (connector, acceptor) = match &tls {
        Tls::None => (None, None),
        Tls::Connect(f) => {
            let config =
                tether_tls::client_config(&f.ca, Some((&f.cert, &f.key)), Vec::new(), &opts)
                    .context("--tls-connect certificates")?;
            (Some(TlsConnector::from(config)), None)
        }
        Tls::Accept(f) => {
            let config = tether_tls::server_config(&f.cert, &f.key, Some(&f.ca), &[], &opts)
                .context("--tls-accept certificates")?;
            (None, Some(TlsAcceptor::from(config)))
        }
    };
    let to: Arc<str> = Arc::from(to);
    loop {
        let (socket, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                eprintln!("relay: accept: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let (to, connector, acceptor) = (Arc::clone(&to), connector.clone(), acceptor.clone());
        let mut cut = cuts.subscribe();
        tokio::spawn(async move {
            tokio::select! {
                result = forward(socket, &to, connector, acceptor) => if let Err(e) = result {
                    eprintln!("relay: {e:#}");
                },
                // Both sockets are dropped, unannounced: each end sees its connection gone.
                _ = cut.changed() => {}
            }
        });
    }
}

/// Sets up one connection's far leg (and TLS), then copies until both sides are done.
async fn forward(
    incoming: TcpStream,
    to: &str,
    connector: Option<TlsConnector>,
    acceptor: Option<TlsAcceptor>,
) -> anyhow::Result<()> {
    incoming.set_nodelay(true)?;
    let setup = async {
        let outgoing = TcpStream::connect(to)
            .await
            .with_context(|| format!("dialing {to}"))?;
        outgoing.set_nodelay(true)?;
        anyhow::Ok(outgoing)
    };
    match (connector, acceptor) {
        (Some(connector), _) => {
            let work = async {
                let outgoing = setup.await?;
                let name = ServerName::try_from("127.0.0.1")?;
                connector
                    .connect(name, outgoing)
                    .await
                    .context("TLS handshake with the next relay")
            };
            let outgoing = deadline(work).await?;
            copy(incoming, outgoing).await;
        }
        (None, Some(acceptor)) => {
            let work = async {
                let incoming = acceptor
                    .accept(incoming)
                    .await
                    .context("TLS handshake with the previous relay")?;
                // Dialled only once the peer proved who it is.
                Ok((incoming, setup.await?))
            };
            let (incoming, outgoing) = deadline(work).await?;
            copy(incoming, outgoing).await;
        }
        (None, None) => {
            let outgoing = deadline(setup).await?;
            copy(incoming, outgoing).await;
        }
    }
    Ok(())
}

async fn deadline<T>(work: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::time::timeout(HANDSHAKE_TIMEOUT, work)
        .await
        .with_context(|| format!("connection setup took over {HANDSHAKE_TIMEOUT:?}"))?
}

/// Copies both ways. Errors here are the peers' doing (the head-of-line workload resets
/// its stalled connection), so they end the connection quietly.
async fn copy<A, B>(mut a: A, mut b: B)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let _ = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, COPY_BUF, COPY_BUF).await;
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tether_tls::pki::{Pki, PkiFiles};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    const LIMIT: Duration = Duration::from_secs(20);

    /// Echoes each connection until EOF, then closes its side; counts connections.
    async fn echo_target() -> (SocketAddr, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = Arc::clone(&accepted);
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        (addr, accepted)
    }

    async fn relay(to: SocketAddr, tls: Tls) -> SocketAddr {
        cutting_relay(to, tls).await.0
    }

    /// A relay, and what cuts every connection through it.
    async fn cutting_relay(
        to: SocketAddr,
        tls: Tls,
    ) -> (SocketAddr, tokio::sync::watch::Sender<u64>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let cuts = tokio::sync::watch::Sender::new(0);
        let relay_cuts = cuts.clone();
        tokio::spawn(async move { run(listener, &to.to_string(), tls, relay_cuts).await });
        (addr, cuts)
    }

    /// A throwaway PKI in a directory removed on drop.
    struct TempPki {
        _dir: tempfile::TempDir,
        files: PkiFiles,
    }

    impl TempPki {
        fn new() -> Self {
            let dir = tempfile::tempdir().unwrap();
            let files = Pki::generate().unwrap().write_to(dir.path()).unwrap();
            Self { _dir: dir, files }
        }

        fn files(&self, cert: &std::path::Path, key: &std::path::Path) -> TlsFiles {
            TlsFiles {
                ca: self.files.ca_cert.clone(),
                cert: cert.to_owned(),
                key: key.to_owned(),
            }
        }
    }

    /// Sends 1 MiB, half-closes, and expects the same bytes back followed by EOF.
    async fn round_trip(addr: SocketAddr) {
        let mut s = TcpStream::connect(addr).await.unwrap();
        let sent: Vec<u8> = (0..1 << 20).map(|i| (i % 251) as u8).collect();
        let (mut r, mut w) = s.split();
        let write = async {
            w.write_all(&sent).await.unwrap();
            w.shutdown().await.unwrap();
        };
        let mut got = Vec::new();
        let (_, read) = tokio::join!(write, r.read_to_end(&mut got));
        read.unwrap();
        assert_eq!(got.len(), sent.len());
        assert!(got == sent, "bytes changed on the way");
    }

    #[tokio::test]
    async fn plain_chain_carries_bytes_both_ways_and_passes_half_close_on() {
        let (target, accepted) = echo_target().await;
        let b = relay(target, Tls::None).await;
        let a = relay(b, Tls::None).await;
        tokio::time::timeout(LIMIT, round_trip(a)).await.unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_cut_closes_every_connection_and_new_ones_pass() {
        let (target, accepted) = echo_target().await;
        let (relay, cuts) = cutting_relay(target, Tls::None).await;
        let mut open = TcpStream::connect(relay).await.unwrap();
        open.write_all(b"x").await.unwrap();
        let mut byte = [0u8; 1];
        open.read_exact(&mut byte).await.unwrap();
        cuts.send_modify(|n| *n += 1);
        let read = tokio::time::timeout(LIMIT, open.read(&mut byte))
            .await
            .unwrap();
        assert!(
            matches!(read, Ok(0) | Err(_)),
            "the cut connection ended: {read:?}"
        );
        tokio::time::timeout(LIMIT, round_trip(relay))
            .await
            .unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn mutual_tls_chain_carries_bytes_both_ways_and_passes_half_close_on() {
        let pki = TempPki::new();
        let (target, accepted) = echo_target().await;
        let p = &pki.files;
        let b = relay(
            target,
            Tls::Accept(pki.files(&p.server_cert, &p.server_key)),
        )
        .await;
        let a = relay(b, Tls::Connect(pki.files(&p.agent_cert, &p.agent_key))).await;
        tokio::time::timeout(LIMIT, async {
            round_trip(a).await;
            round_trip(a).await;
        })
        .await
        .unwrap();
        assert_eq!(accepted.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn tls_relay_refuses_a_peer_without_certificate_and_dials_nothing() {
        let pki = TempPki::new();
        let (target, accepted) = echo_target().await;
        let p = &pki.files;
        let b = relay(
            target,
            Tls::Accept(pki.files(&p.server_cert, &p.server_key)),
        )
        .await;
        let config =
            tether_tls::client_config(&p.ca_cert, None, Vec::new(), &TlsOptions::default())
                .unwrap();
        let outcome = tokio::time::timeout(LIMIT, async {
            let tcp = TcpStream::connect(b).await.unwrap();
            let name = ServerName::try_from("127.0.0.1").unwrap();
            // TLS 1.3 clients finish before the server rejects them: the refusal shows on
            // the first read.
            let mut tls = TlsConnector::from(config).connect(name, tcp).await?;
            tls.write_all(b"hello").await?;
            let mut buf = [0u8; 16];
            tls.read(&mut buf).await
        })
        .await
        .unwrap();
        assert!(
            matches!(outcome, Err(_) | Ok(0)),
            "a peer without a certificate got {outcome:?}"
        );
        assert_eq!(accepted.load(Ordering::SeqCst), 0, "the target was dialled");
    }
}
