//! The HTTP CONNECT frontend, byte-compatible with upstream since v0.34: the `200` goes out
//! only after the agent's dial succeeded, failures are plain-text 5xx responses.

use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_grpc::PeerIdentity;
use tether_proto::DialId;
use tether_tunnel::{ConnEvent, MAX_CHUNK, Tunnel, TunnelDown, TunnelUp};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tracing::Instrument as _;

use super::log_span;
use crate::byte_rate::ByteRate;
use crate::dial::{Dialed, Hub};
use crate::error::DialError;
use crate::limits::{Limit, LimitMetrics};
use crate::metrics::Initiator;
use crate::net::{ChunkRead, Io};
use crate::request::{FrontendKind, RequestContext};
use tether_tunnel::connect_head::{self, Head};

/// Go's `http.Server` ReadHeaderTimeout as upstream sets it.
const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Client bytes kept while the dial is under way; more than that waits in the socket.
const MAX_EARLY_BYTES: usize = 64 * 1024;
/// How long to wait for the agent's close after the client ended its side.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);

const ESTABLISHED: &[u8] = b"HTTP/1.1 200 Connection Established\r\n\r\n";

/// Serves one accepted connection from `peer`, its log lines in its connection span.
pub(crate) async fn serve(
    hub: Arc<Hub>,
    limits: LimitMetrics,
    io: Box<dyn Io>,
    peer: Arc<PeerIdentity>,
    tenant: Option<Arc<str>>,
) {
    hub.metrics.http_connections.inc();
    let span = log_span::connection(&hub.server_id);
    async {
        if let Err(e) = handle(&hub, &limits, io, peer.clone(), tenant).await {
            tracing::debug!(peer = peer.addr.map(tracing::field::display), error = %e, "http connect connection ended with an error");
        }
    }
    .instrument(span)
    .await;
    hub.metrics.http_connections.dec();
}

async fn handle(
    hub: &Hub,
    limits: &LimitMetrics,
    mut io: Box<dyn Io>,
    peer: Arc<PeerIdentity>,
    tenant: Option<Arc<str>>,
) -> std::io::Result<()> {
    let mut buf = BytesMut::with_capacity(4096);
    let head =
        tokio::time::timeout(READ_HEADER_TIMEOUT, connect_head::read(&mut io, &mut buf)).await;
    let refused = |reason: &str| {
        if let Some(audit) = &hub.audit {
            audit.request_refused(FrontendKind::HttpConnect, &peer, tenant.as_deref(), reason);
        }
    };
    let target = match head {
        Err(_) => {
            refused(&format!(
                "no complete request head within {READ_HEADER_TIMEOUT:?}"
            ));
            return Ok(());
        }
        // The client left before its head was complete: nothing was refused.
        Ok(Err(reply)) if reply.is_empty() => return Ok(()),
        Ok(Err(reply)) => {
            refused(status_line(&reply));
            return respond(&mut io, &reply).await;
        }
        Ok(Ok(Head::Connect(target))) => target,
        Ok(Ok(Head::OtherMethod)) => {
            refused("405 Method Not Allowed: only CONNECT is served");
            let body = "this proxy only supports CONNECT passthrough\n";
            let reply = format!(
                "HTTP/1.1 405 Method Not Allowed\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nDate: {}\r\nContent-Length: {}\r\n\r\n{body}",
                // An RFC 7231 IMF-fixdate, as Go's `http.TimeFormat`.
                tether_observe::time::Civil::from_system_time(std::time::SystemTime::now())
                    .http_date(),
                body.len()
            );
            return respond(&mut io, reply.as_bytes()).await;
        }
    };

    let random = DialId::random();
    log_span::record_dial(random);
    let request = RequestContext::new(
        FrontendKind::HttpConnect,
        peer,
        "tcp".into(),
        target.clone(),
        random,
        tenant,
    );
    if let Err(error) = super::address::check_dial_address(&target) {
        limits.hit(Limit::BadDialAddress);
        hub.refused(&request, None, &error);
        let reply = format!(
            "HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n{error}\n"
        );
        return respond(&mut io, reply.as_bytes()).await;
    }

    // Dial, keeping bytes the client sends early and noticing if it leaves.
    let (dialed, early) = {
        let mut early = buf;
        let frontend_gone = async {
            loop {
                if early.len() >= MAX_EARLY_BYTES {
                    return std::future::pending().await;
                }
                match io.read_buf(&mut early).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        };
        let dialed = hub.dial(&request, frontend_gone).await;
        // Nothing came early: give the head's buffer back rather than hold it idle.
        let early = if early.is_empty() {
            Bytes::new()
        } else {
            early.freeze()
        };
        (dialed, early)
    };
    let (mut tunnel, byte_rate) = match dialed {
        Ok(Dialed { tunnel, byte_rate }) => (tunnel, byte_rate),
        Err(DialError::FrontendGone) => return Ok(()),
        Err(e) => {
            tracing::debug!(%target, error = %tether_grpc::LogText(&e.to_string()), "dial failed");
            return respond(&mut io, &dial_error_response(&e)).await;
        }
    };
    io.write_all(ESTABLISHED).await?;

    log_span::record_connection(tunnel.connect_id());
    let (initiator, closed, mut io): (_, _, Box<dyn Io>) = match io.into_unix() {
        Ok(unix) => {
            let (mut rd, mut wr) = unix.into_split();
            let (initiator, closed) =
                relay(&mut tunnel, &mut rd, &mut wr, early, byte_rate.as_deref()).await;
            let unix = rd
                .reunite(wr)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            (initiator, closed, Box::new(unix))
        }
        Err(io) => {
            let (mut rd, mut wr) = tokio::io::split(io);
            let (initiator, closed) =
                relay(&mut tunnel, &mut rd, &mut wr, early, byte_rate.as_deref()).await;
            (initiator, closed, rd.unsplit(wr))
        }
    };
    hub.metrics.connection_closed(initiator, closed.is_err());
    match closed {
        // A normal close: flush and send FIN.
        Ok(()) => {
            let _ = io.shutdown().await;
        }
        // The agent, its connection or the destination failed: make the client see it.
        Err(error) => {
            tracing::debug!(error = error.as_deref(), "closing connection abortively");
            io.abort_on_close();
        }
    }
    Ok(())
}

/// Relays until one side ends; says who ended it and whether abnormally (with the reason).
/// With `byte_rate`, each direction waits for the tenant's bucket after moving a chunk.
async fn relay<R: ChunkRead, W: AsyncWrite + Unpin>(
    tunnel: &mut Tunnel,
    rd: &mut R,
    wr: &mut W,
    early: Bytes,
    byte_rate: Option<&ByteRate>,
) -> (Initiator, Result<(), Option<String>>) {
    let Tunnel { up, down, .. } = tunnel;
    let mut to_agent = pin!(client_to_agent(up, rd, early, byte_rate));
    let mut to_client = pin!(agent_to_client(down, wr, byte_rate));
    tokio::select! {
        closed = &mut to_client => (Initiator::Agent, closed),
        () = &mut to_agent => match tokio::time::timeout(CLOSE_TIMEOUT, &mut to_client).await {
            Ok(closed) => (Initiator::Client, closed),
            Err(_) => (
                Initiator::Client,
                Err(Some("timed out waiting for the agent to close".to_owned())),
            ),
        },
    }
}

/// The status of one of the head parser's canned responses (`431 Request Header Fields Too
/// Large`), for its audit record.
fn status_line(reply: &[u8]) -> &str {
    let line = reply.split(|&b| b == b'\r').next().unwrap_or_default();
    let line = std::str::from_utf8(line).unwrap_or_default();
    line.strip_prefix("HTTP/1.1 ").unwrap_or(line)
}

async fn respond(io: &mut Box<dyn Io>, reply: &[u8]) -> std::io::Result<()> {
    if !reply.is_empty() {
        io.write_all(reply).await?;
    }
    io.shutdown().await
}

/// Upstream's responses for a failed dial, byte for byte.
fn dial_error_response(error: &DialError) -> Vec<u8> {
    let (status, body) = match error {
        DialError::NoAgent => {
            return b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: No agent available".to_vec();
        }
        DialError::Endpoint(text) => (status_for_dial_error(text), text.clone()),
        DialError::AgentGone(e) => (502, format!("Backend context error: {e}\r\n")),
        DialError::Timeout => (
            504,
            "Backend dial timeout: timed out waiting for backend dial\r\n".to_owned(),
        ),
        DialError::DialClosed => (
            502,
            "Backend context error: dial closed by agent\r\n".to_owned(),
        ),
        DialError::NoTenant(text) | DialError::Policy(text) => (403, format!("{text}\r\n")),
        DialError::TenantLimit(text) => (429, format!("{text}\r\n")),
        DialError::Duplicate(_) | DialError::TooManyPending(_) | DialError::FrontendGone => {
            (500, format!("{error}\r\n"))
        }
    };
    format!(
        "HTTP/1.1 {status} {}\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{body}",
        tether_observe::http::reason_phrase(status)
    )
    .into_bytes()
}

/// Upstream's mapping of an agent's dial error text to an HTTP status.
fn status_for_dial_error(text: &str) -> u16 {
    let text = text.to_ascii_lowercase();
    if ["timeout", "i/o timeout", "deadline exceeded"]
        .iter()
        .any(|s| text.contains(s))
    {
        504
    } else if text.contains("too many open files") {
        503
    } else {
        502
    }
}

async fn client_to_agent<R: ChunkRead>(
    up: &TunnelUp,
    rd: &mut R,
    early: Bytes,
    byte_rate: Option<&ByteRate>,
) {
    if !early.is_empty() {
        let len = early.len();
        if up.send(early).await.is_err() {
            return;
        }
        if let Some(rate) = byte_rate {
            rate.take(len).await;
        }
    }
    let mut buf = BytesMut::new();
    loop {
        match rd.read_chunk(&mut buf, MAX_CHUNK).await {
            Ok(0) | Err(_) => {
                up.close_request();
                return;
            }
            Ok(len) => {
                if up.send(tether_tunnel::take_read(&mut buf)).await.is_err() {
                    return;
                }
                // Over the tenant's rate: read nothing more until the bucket refills.
                if let Some(rate) = byte_rate {
                    rate.take(len).await;
                }
            }
        }
    }
}

/// Writes agent data to the client; `Err` carries the reason of an abnormal close.
async fn agent_to_client<W: AsyncWrite + Unpin>(
    down: &mut TunnelDown,
    wr: &mut W,
    byte_rate: Option<&ByteRate>,
) -> Result<(), Option<String>> {
    loop {
        let event = down
            .recv_flushed(wr)
            .await
            .map_err(|e| Some(e.to_string()))?;
        match event {
            ConnEvent::Data(data) => {
                wr.write_all(&data).await.map_err(|e| Some(e.to_string()))?;
                // Over the tenant's rate: return the agent's credit only once it refills.
                if let Some(rate) = byte_rate {
                    rate.take(data.len()).await;
                }
                down.consumed();
            }
            ConnEvent::Closed(None) => return Ok(()),
            ConnEvent::Closed(Some(error)) => return Err(Some(error.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_audited_by_its_status() {
        assert_eq!(
            status_line(connect_head::TOO_LARGE),
            "431 Request Header Fields Too Large"
        );
        assert_eq!(status_line(connect_head::BAD_REQUEST), "400 Bad Request");
    }

    #[test]
    fn dial_error_statuses_follow_upstream() {
        assert_eq!(
            status_for_dial_error("dial tcp 10.0.0.1:80: i/o timeout"),
            504
        );
        assert_eq!(status_for_dial_error("context deadline exceeded"), 504);
        assert_eq!(status_for_dial_error("socket: too many open files"), 503);
        assert_eq!(
            status_for_dial_error("dial tcp 127.0.0.1:1: connect: connection refused"),
            502
        );
        assert_eq!(
            dial_error_response(&DialError::Endpoint("dial tcp 127.0.0.1:18999: connect: connection refused".into())),
            b"HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\ndial tcp 127.0.0.1:18999: connect: connection refused"
        );
        assert_eq!(
            dial_error_response(&DialError::NoAgent),
            b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: No agent available"
        );
    }
}
