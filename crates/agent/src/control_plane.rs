//! The control-plane listener (`--control-plane-listen`): connections from the node to the
//! control plane, each carried as a reverse dial over a server stream whose server accepted
//! them (`tether-reverse`). The server dials only its allowlisted endpoints; this end asks
//! for one (`--control-plane-endpoint`, empty: the server's default).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tether_observe::time::monotonic_now;

use bytes::{Bytes, BytesMut};
use tether_proto::DialId;
use tether_tunnel::connect_head::{self, Head};
use tether_tunnel::{CloseError, DialError, DialFacts, RelayOptions, Tunnel, relay_client};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::clientset::ClientSet;
use crate::control_plane_config::{ControlPlaneProtocol, ListenAddr};
use crate::metrics::{AgentMetrics, ReverseDial};

/// The bound listener.
#[derive(Debug)]
pub(crate) enum Listener {
    Tcp(TcpListener),
    /// The path is removed when the listener stops.
    Unix(UnixListener, PathBuf),
}

/// An accepted local connection.
enum Local {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Local {
    /// Closes a connection that is not carried: a TCP client sees a reset, so that it can
    /// tell the refusal from an endpoint that answered and closed (a Unix socket has no
    /// reset; its client reads an end of stream).
    fn refuse(self) {
        if let Local::Tcp(stream) = &self {
            tether_tunnel::reset_on_close(stream);
        }
    }
}

impl Listener {
    /// Binds now, so that a bad address is a start-up error. A socket file left by an
    /// earlier run is replaced; any other file at the path is an error.
    pub(crate) async fn bind(addr: &ListenAddr) -> std::io::Result<Self> {
        match addr {
            ListenAddr::Tcp(addr) => TcpListener::bind(addr).await.map(Self::Tcp),
            ListenAddr::Unix(path) => {
                use std::os::unix::fs::FileTypeExt as _;
                if std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
                    std::fs::remove_file(path)?;
                }
                UnixListener::bind(path).map(|l| Self::Unix(l, path.clone()))
            }
        }
    }

    pub(crate) fn local_addr(&self) -> String {
        match self {
            Self::Tcp(l) => l
                .local_addr()
                .map_or_else(|e| e.to_string(), |a| a.to_string()),
            Self::Unix(_, path) => format!("unix:{}", path.display()),
        }
    }

    async fn accept(&self) -> std::io::Result<Local> {
        match self {
            Self::Tcp(l) => {
                let (stream, _) = l.accept().await?;
                let _ = stream.set_nodelay(true);
                Ok(Local::Tcp(stream))
            }
            Self::Unix(l, _) => l.accept().await.map(|(s, _)| Local::Unix(s)),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Self::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// How often a refusal over `max_connections` is logged at most.
const OVER_LIMIT_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// Accepts until `stop`, then waits for the connections (they end with their streams).
pub(crate) async fn serve(
    listener: Listener,
    endpoint: String,
    (max_connections, protocol): (usize, ControlPlaneProtocol),
    clientset: Arc<ClientSet>,
    metrics: Arc<AgentMetrics>,
    stop: CancellationToken,
) {
    tracing::info!(listen = %listener.local_addr(), endpoint = %endpoint, max_connections, %protocol, "control-plane listener started");
    let tasks = TaskTracker::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let mut last_refusal_log: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            () = stop.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok(local) => {
                let Ok(slot) = slots.clone().try_acquire_owned() else {
                    // Closed before anything is dialed.
                    local.refuse();
                    metrics.control_plane_dial(ReverseDial::OverLimit);
                    if last_refusal_log.is_none_or(|at| at.elapsed() >= OVER_LIMIT_LOG_INTERVAL) {
                        last_refusal_log = Some(monotonic_now());
                        tracing::warn!(
                            max_connections,
                            "closing a control-plane connection: --control-plane-max-connections are open"
                        );
                    }
                    continue;
                };
                let (endpoint, clientset, metrics) =
                    (endpoint.clone(), clientset.clone(), metrics.clone());
                tasks.spawn(async move {
                    carry(local, endpoint, protocol, clientset, metrics).await;
                    drop(slot);
                });
            }
            Err(error) => {
                // Out of descriptors, typically: back off instead of spinning.
                tracing::warn!(%error, "control-plane listener: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    drop(listener);
    tasks.close();
    tasks.wait().await;
}

/// Carries one local connection: a reverse dial, then the relay until either side ends.
/// A TCP client sees a reset, not a clean end, when the connection ended abnormally or its
/// reverse dial failed.
async fn carry(
    local: Local,
    endpoint: String,
    protocol: ControlPlaneProtocol,
    clientset: Arc<ClientSet>,
    metrics: Arc<AgentMetrics>,
) {
    match local {
        Local::Tcp(mut stream) => {
            match open(&mut stream, endpoint, protocol, &clientset, &metrics).await {
                Ok(Some((mut tunnel, early))) => {
                    let (mut rd, mut wr) = stream.into_split();
                    let options = RelayOptions { early, pace: None };
                    let relayed = relay_client(&mut tunnel, &mut rd, &mut wr, options).await;
                    if relayed.error.is_some()
                        && let Ok(stream) = rd.reunite(wr)
                    {
                        tether_tunnel::reset_on_close(&stream);
                    }
                }
                Ok(None) => {}
                Err(_) => tether_tunnel::reset_on_close(&stream),
            }
        }
        Local::Unix(mut stream) => {
            if let Ok(Some((mut tunnel, early))) =
                open(&mut stream, endpoint, protocol, &clientset, &metrics).await
            {
                let (mut rd, mut wr) = stream.into_split();
                let options = RelayOptions { early, pace: None };
                relay_client(&mut tunnel, &mut rd, &mut wr, options).await;
            }
        }
    }
}

/// Reads the client's request (for HTTP CONNECT), dials the endpoint through a server that
/// accepts reverse dials and answers the client: the tunnel and the bytes the client sent
/// behind its request head, or `None` when the client was answered and the connection is
/// over. `Err` when it ends abnormally: the client left before the answer, or the dial
/// failed on a raw TCP listener, which has no answer to give but a reset.
async fn open<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    endpoint: String,
    protocol: ControlPlaneProtocol,
    clientset: &ClientSet,
    metrics: &AgentMetrics,
) -> Result<Option<(Tunnel, Bytes)>, CloseError> {
    let (endpoint, early) = match protocol {
        ControlPlaneProtocol::Tcp => (endpoint, Bytes::new()),
        ControlPlaneProtocol::HttpConnect => match read_connect(stream).await {
            Ok(asked) => asked,
            Err(reply) => {
                answer(stream, &reply).await;
                return Ok(None);
            }
        },
    };
    let Some(session) = clientset.wait_for_reverse_session().await else {
        tracing::info!(
            "closing a control-plane connection: no connected proxy server accepts reverse dials"
        );
        metrics.control_plane_dial(ReverseDial::Unavailable);
        let reason = "no connected proxy server accepts reverse dials";
        if protocol == ControlPlaneProtocol::Tcp {
            return Err(CloseError::Local(reason.into()));
        }
        answer(stream, &http_error(503, reason)).await;
        return Ok(None);
    };
    let random = DialId::random();
    let mut facts = DialFacts {
        dial_id: random,
        requested: endpoint.clone(),
        dialed: None,
        latency: None,
    };
    let started = monotonic_now();
    let answered = match session.link.dial(random, "tcp".into(), endpoint) {
        Ok(mut pending) => pending.answer().await,
        Err(error) => Err(error),
    };
    facts.latency = Some(started.elapsed());
    let tunnel = match answered {
        Ok(tunnel) => tunnel,
        Err(error) => {
            let result = match &error {
                DialError::Endpoint(_) => ReverseDial::Refused,
                DialError::Timeout => ReverseDial::Timeout,
                _ => ReverseDial::Lost,
            };
            let reason = dial_error_text(&error);
            tracing::info!(
                dial.id = %random,
                server.id = %session.server_id,
                requested = %facts.requested,
                error = %reason,
                "control-plane dial failed"
            );
            metrics.control_plane_dial(result);
            if let Some(audit) = &session.reverse_audit {
                audit.dial_ended(&facts, result == ReverseDial::Refused, &reason);
            }
            if protocol == ControlPlaneProtocol::Tcp {
                return Err(CloseError::Local(reason));
            }
            let status = match result {
                ReverseDial::Refused => 403,
                ReverseDial::Timeout => 504,
                _ => 502,
            };
            answer(stream, &http_error(status, &reason)).await;
            return Ok(None);
        }
    };
    metrics.control_plane_dial(ReverseDial::Connected);
    if let Some(audit) = &session.reverse_audit {
        audit.connected(tunnel.connect_id(), facts);
    }
    if protocol == ControlPlaneProtocol::HttpConnect && stream.write_all(ESTABLISHED).await.is_err()
    {
        return Err(CloseError::Local(
            "the client left before the answer".into(),
        ));
    }
    Ok(Some((tunnel, early)))
}

/// The answer to a CONNECT whose reverse dial succeeded.
const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection established\r\n\r\n";

/// How long a client of the HTTP CONNECT listener may take to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(10);

/// Reads a CONNECT request head: the endpoint asked for and the bytes sent after the head,
/// or the response that refuses the request (empty: the client left or was too slow).
async fn read_connect<S: AsyncRead + Unpin>(stream: &mut S) -> Result<(String, Bytes), Vec<u8>> {
    let mut buf = BytesMut::new();
    match tokio::time::timeout(HEAD_TIMEOUT, connect_head::read(stream, &mut buf)).await {
        Ok(Ok(Head::Connect(target))) => Ok((target, buf.freeze())),
        Ok(Ok(Head::OtherMethod)) => Err(http_error(405, "only CONNECT is proxied here")),
        Ok(Err(reply)) => Err(reply),
        Err(_) => Err(Vec::new()),
    }
}

/// An HTTP error response with `text` as its body; the connection closes after it.
fn http_error(status: u16, text: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status} {}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{text}\n",
        tether_observe::http::reason_phrase(status)
    )
    .into_bytes()
}

/// Writes `reply` (if any) and closes the sending side, within a bound.
async fn answer<S: AsyncWrite + Unpin>(stream: &mut S, reply: &[u8]) {
    let _ = tokio::time::timeout(HEAD_TIMEOUT, async {
        if !reply.is_empty() {
            stream.write_all(reply).await?;
        }
        stream.shutdown().await
    })
    .await;
}

/// The reason a reverse dial failed, for the log and the audit record.
fn dial_error_text(error: &DialError) -> String {
    match error {
        DialError::Endpoint(text) => text.clone(),
        DialError::StreamLost(reason) => format!("the server stream ended: {reason}"),
        DialError::Timeout => "the server did not answer in time".into(),
        DialError::ClosedByPeer => "the server closed the dial".into(),
        DialError::Duplicate(id) => format!("dial ID {id} is already pending"),
        DialError::TooManyPending { limit } => {
            format!("too many pending dials on the stream (limit {limit})")
        }
    }
}
