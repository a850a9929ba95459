//! The smallest correct forwarder (`tether-bench relay`), run as its own process: two of
//! them in series are the `relay-limit` anchors, the cost of a proxy chain itself (three
//! sockets in series, two extra processes) without any protocol on top.
//!
//! Per accepted connection it dials `--to` and copies both ways with
//! `copy_bidirectional_with_sizes` and large buffers, half-closes passed on. With
//! `--tls-connect` the outgoing leg is mutual TLS as a client, with `--tls-accept` the
//! incoming leg is mutual TLS as a server: the same rustls (ring) configs, cipher suites and
//! protocol versions as tether's agent link. Runs on a single-threaded runtime (see
//! BENCHMARKS.md).

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
pub async fn serve(listen: &str, to: &str, tls: Tls) -> anyhow::Result<()> {
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
    let listener = TcpListener::bind(listen).await?;
    println!("{}", listener.local_addr()?);
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
        tokio::spawn(async move {
            if let Err(e) = forward(socket, &to, connector, acceptor).await {
                eprintln!("relay: {e:#}");
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
