//! The HTTP CONNECT frontend, byte-compatible with upstream since v0.34: the `200` goes out
//! only after the agent's dial succeeded, failures are plain-text 5xx responses.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_grpc::PeerIdentity;
use tether_proto::DialId;

use tether_tunnel::{EndedBy, Pace, RelayOptions, relay_client};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tracing::Instrument as _;

use super::log_span;
use crate::dial::{Dialed, Hub};
use crate::error::DialError;
use crate::limits::{Limit, LimitMetrics};
use crate::metrics::Initiator;
use crate::net::Io;
use crate::request::{FrontendKind, RequestContext};
use tether_tunnel::connect_head::{self, Head};

/// Go's `http.Server` ReadHeaderTimeout as upstream sets it.
const READ_HEADER_TIMEOUT: Duration = Duration::from_secs(60);
/// Client bytes kept while the dial is under way; more than that waits in the socket.
const MAX_EARLY_BYTES: usize = 64 * 1024;

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
                tether_observe::time::Civil::from_system_time(tether_observe::time::wall_clock())
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
        // Boxed: the dial's state is the largest this connection ever holds, and only for
        // the dial; inline, the connection would keep room for it for its whole life.
        let dialed = Box::pin(hub.dial(&request, frontend_gone)).await;
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
    let options = RelayOptions {
        early,
        pace: byte_rate.as_deref().map(|rate| rate as &dyn Pace),
    };
    let (relayed, io): (_, Box<dyn Io>) = match io.into_unix() {
        Ok(unix) => {
            let (mut rd, mut wr) = unix.into_split();
            let relayed = relay_client(&mut tunnel, &mut rd, &mut wr, options).await;
            let unix = rd
                .reunite(wr)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            (relayed, Box::new(unix))
        }
        Err(io) => {
            let (mut rd, mut wr) = tokio::io::split(io);
            let relayed = relay_client(&mut tunnel, &mut rd, &mut wr, options).await;
            (relayed, rd.unsplit(wr))
        }
    };
    let initiator = match relayed.ended_by {
        EndedBy::Peer => Initiator::Agent,
        EndedBy::Socket | EndedBy::Cut => Initiator::Client,
    };
    hub.metrics
        .connection_closed(initiator, relayed.error.is_some());
    if let Some(error) = relayed.error {
        // The agent, its connection or the destination failed: make the client see it (the
        // relay already ended a normal close with a FIN).
        tracing::debug!(%error, "closing connection abortively");
        io.abort_on_close();
    }
    Ok(())
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
