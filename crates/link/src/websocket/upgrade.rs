//! The HTTP/1.1 upgrade that opens a WebSocket link (RFC 6455 §4).
//!
//! - The agent's `GET` asks for the subprotocol `tether.link.v1` and carries the HELLO's
//!   metadata as headers (`agentid`, `authorization`, `tether-*`, as gRPC carries them), its
//!   capabilities in `tether-link-capabilities`.
//! - The server's `101 Switching Protocols` carries the ACCEPT's metadata (`serverid`,
//!   `servercount`, `tether-*`) the same way.
//! - A refusal is an HTTP error status with the gRPC code in `tether-status` and the message
//!   as its body; an error status without `tether-status` came from something on the way.
//!
//! Heads are read up to the native link's control-frame limit (64 KiB).

use std::sync::Arc;

use base64::Engine as _;
use bytes::{Buf, BufMut, BytesMut};
use tether_conn::{Code, LastPong};
use tether_proto::link::{self, Hello};
use tether_proto::websocket::SUBPROTOCOL;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

use super::head::{
    STATUS_HEADER, accept_key, error_response, find, has_token, header, hello_of, stream_headers,
};
use super::stream::{Role, WsStream};
use crate::control::Control;
use crate::error::LinkError;
use crate::handshake::{Framing, Link, PendingLink, read_more, send_and_close};

/// The most headers a head may have.
const MAX_HEADERS: usize = 128;
/// The most of a refusal's body an agent reads, and of it quotes.
const MAX_REFUSAL_BODY: usize = 4 * 1024;
/// How long an agent waits for a refusal's body.
const REFUSAL_BODY_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

/// Where the agent's upgrade goes: the `Host` header and the request path (an Ingress or
/// proxy may route on either).
#[derive(Clone, Debug)]
pub struct Upgrade {
    pub host: String,
    pub path: String,
}

/// The agent's side: asks `upgrade` to switch `io` to a WebSocket with `hello`'s metadata,
/// and waits for the answer, as [`crate::connect`] does on the native link. The caller bounds
/// the wait.
pub async fn connect_websocket<IO>(
    io: IO,
    upgrade: &Upgrade,
    hello: &Hello,
) -> Result<(Hello, Link), LinkError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut io = io;
    let mut random = [0u8; 16];
    aws_lc_rs::rand::fill(&mut random)
        .map_err(|_| LinkError::Upgrade("no random source for Sec-WebSocket-Key".to_owned()))?;
    let key = base64::engine::general_purpose::STANDARD.encode(random);
    let mut head = BytesMut::new();
    head.put_slice(format!("GET {} HTTP/1.1\r\n", upgrade.path).as_bytes());
    header(&mut head, "host", upgrade.host.as_bytes())?;
    header(&mut head, "upgrade", b"websocket")?;
    header(&mut head, "connection", b"Upgrade")?;
    header(&mut head, "sec-websocket-key", key.as_bytes())?;
    header(&mut head, "sec-websocket-version", b"13")?;
    header(&mut head, "sec-websocket-protocol", SUBPROTOCOL.as_bytes())?;
    stream_headers(&mut head, hello)?;
    head.put_slice(b"\r\n");
    io.write_all(&head).await?;
    io.flush().await?;

    let mut buf = BytesMut::new();
    let head_len = read_head(&mut io, &mut buf).await?;
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    response
        .parse(&buf[..head_len])
        .map_err(|e| malformed("response", e))?;
    let status = response.code.unwrap_or(0);
    if status != 101 {
        let reason = response.reason.unwrap_or("").to_owned();
        let code = find(response.headers, STATUS_HEADER)
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u32>().ok());
        let length = find(response.headers, "content-length")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<usize>().ok());
        buf.advance(head_len);
        let body = read_body(&mut io, buf, length).await;
        return Err(match code {
            Some(code) => LinkError::Closed {
                code: Code(code),
                message: body,
            },
            None => LinkError::Upgrade(format!(
                "the server's address answered HTTP {status} {reason} ({body:?}): is a proxy \
                 on the way that does not pass WebSocket upgrades to the server's agent port, \
                 or a path (--websocket-path) it does not route?"
            )),
        });
    }
    let expected = accept_key(key.as_bytes());
    let checks = [
        ("upgrade", b"websocket".as_slice()),
        ("sec-websocket-accept", expected.as_bytes()),
        ("sec-websocket-protocol", SUBPROTOCOL.as_bytes()),
    ];
    for (name, want) in checks {
        let got = find(response.headers, name);
        if !got.is_some_and(|g| g.eq_ignore_ascii_case(want)) {
            return Err(LinkError::Upgrade(format!(
                "the server's 101 answer has {name}: {:?}, not {:?}",
                got.map(String::from_utf8_lossy),
                String::from_utf8_lossy(want)
            )));
        }
    }
    let answer = hello_of(response.headers, link::VERSION);
    buf.advance(head_len);
    let io = WsStream::new(io, Role::Agent, buf);
    let control = Control::new(Arc::new(LastPong::default()));
    Ok((answer, Link::new(io, BytesMut::new(), control, None)))
}

/// The server's side, first step: reads the agent's upgrade by `deadline`, as
/// [`crate::read_hello`] reads a HELLO. A request that is no WebSocket upgrade for this link
/// is answered with an HTTP error that says what is missing.
pub async fn read_upgrade<IO>(
    io: IO,
    deadline: Instant,
    life: Arc<LastPong>,
) -> Result<(Hello, PendingLink<IO>), LinkError>
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut io = io;
    let mut buf = BytesMut::new();
    let head_len = tokio::time::timeout_at(deadline, read_head(&mut io, &mut buf))
        .await
        .map_err(|_| LinkError::HandshakeTimeout)?;
    let head_len = match head_len {
        Ok(len) => len,
        Err(e @ LinkError::Upgrade(_)) => {
            answer_error(&mut io, 431, &e.to_string(), &[]).await;
            return Err(e);
        }
        Err(e) => return Err(e),
    };
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    let checked = match request.parse(&buf[..head_len]) {
        Ok(_) => check_request(&request),
        Err(e) => Err(Refusal::bad(malformed("request", e).to_string())),
    };
    let accept = match checked {
        Ok(accept) => accept,
        Err(refusal) => {
            answer_error(&mut io, refusal.status, &refusal.message, refusal.headers).await;
            return Err(LinkError::Upgrade(refusal.message));
        }
    };
    let hello = hello_of(request.headers, link::VERSION);
    buf.advance(head_len);
    let pending = PendingLink::new(io, buf, Framing::WebSocket { accept }, life);
    Ok((hello, pending))
}

/// A request the server answers with an error status.
struct Refusal {
    status: u16,
    message: String,
    headers: &'static [(&'static str, &'static str)],
}

impl Refusal {
    fn bad(message: String) -> Self {
        Self {
            status: 400,
            message,
            headers: &[],
        }
    }
}

/// Checks a request is this link's upgrade; its `Sec-WebSocket-Accept` if it is.
fn check_request(request: &httparse::Request<'_, '_>) -> Result<String, Refusal> {
    let headers = &*request.headers;
    if request.method != Some("GET") || request.version != Some(1) {
        return Err(Refusal::bad(format!(
            "the agent port takes a WebSocket upgrade (GET, HTTP/1.1) here, not {} HTTP/1.{}",
            request.method.unwrap_or("?"),
            request.version.unwrap_or(0)
        )));
    }
    if !has_token(find(headers, "upgrade"), "websocket")
        || !has_token(find(headers, "connection"), "upgrade")
    {
        return Err(Refusal::bad(
            "a request without 'Upgrade: websocket' and 'Connection: Upgrade': a proxy on the \
             way must pass WebSocket upgrades to the agent port"
                .to_owned(),
        ));
    }
    if find(headers, "sec-websocket-version") != Some(b"13".as_slice()) {
        return Err(Refusal {
            status: 426,
            message: "WebSocket version 13 (RFC 6455) only".to_owned(),
            headers: &[("sec-websocket-version", "13")],
        });
    }
    if !has_token(find(headers, "sec-websocket-protocol"), SUBPROTOCOL) {
        return Err(Refusal::bad(format!(
            "the upgrade does not ask for the subprotocol {SUBPROTOCOL}, the only one this \
             server speaks"
        )));
    }
    let key = find(headers, "sec-websocket-key")
        .filter(|key| {
            base64::engine::general_purpose::STANDARD
                .decode(key)
                .is_ok_and(|k| k.len() == 16)
        })
        .ok_or_else(|| {
            Refusal::bad("a missing or malformed Sec-WebSocket-Key (16 bytes, base64)".to_owned())
        })?;
    Ok(accept_key(key))
}

/// Answers a request that is not this link's upgrade, within a short bound.
async fn answer_error<IO: AsyncWrite + Unpin>(
    io: &mut IO,
    status: u16,
    message: &str,
    extra: &[(&str, &str)],
) {
    let mut out = BytesMut::new();
    error_response(status, message, extra, &mut out);
    send_and_close(io, &out).await;
}

fn malformed(what: &str, e: httparse::Error) -> LinkError {
    LinkError::Upgrade(format!("a malformed HTTP/1.1 upgrade {what}: {e}"))
}

/// Reads until a whole head (ending in an empty line) is in `buf`; its length.
async fn read_head<IO: AsyncRead + Unpin>(
    io: &mut IO,
    buf: &mut BytesMut,
) -> Result<usize, LinkError> {
    loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            return Ok(at + 4);
        }
        if buf.len() > link::MAX_CONTROL_LEN {
            return Err(LinkError::Upgrade(format!(
                "an HTTP head over {} bytes",
                link::MAX_CONTROL_LEN
            )));
        }
        read_more(io, buf).await?;
    }
}

/// A refusal's body as text: what came with the head and up to its length, at most
/// [`MAX_REFUSAL_BODY`], and what came within [`REFUSAL_BODY_WAIT`] (a proxy may keep the
/// connection open after a body of no stated length).
async fn read_body<IO: AsyncRead + Unpin>(
    io: &mut IO,
    mut buf: BytesMut,
    length: Option<usize>,
) -> String {
    let want = length.unwrap_or(MAX_REFUSAL_BODY).min(MAX_REFUSAL_BODY);
    let read = async {
        while buf.len() < want {
            buf.reserve(want - buf.len());
            match io.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    let _ = tokio::time::timeout(REFUSAL_BODY_WAIT, read).await;
    buf.truncate(want);
    String::from_utf8_lossy(&buf).trim().to_owned()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use tokio::io::DuplexStream;

    use super::*;

    fn hello(pairs: &[(&str, &str)]) -> Hello {
        Hello {
            version: link::VERSION,
            capabilities: Vec::new(),
            metadata: pairs
                .iter()
                .map(|(k, v)| (*k, Bytes::from(v.to_string())))
                .collect(),
        }
    }

    fn upgrade() -> Upgrade {
        Upgrade {
            host: "server.test:8091".to_owned(),
            path: "/tether/link".to_owned(),
        }
    }

    async fn server_side(
        io: DuplexStream,
    ) -> Result<(Hello, PendingLink<DuplexStream>), LinkError> {
        let deadline = Instant::now() + Duration::from_secs(10);
        read_upgrade(io, deadline, Arc::new(LastPong::default())).await
    }

    #[tokio::test]
    async fn metadata_travels_as_headers_both_ways() {
        let (agent_io, server_io) = tokio::io::duplex(64 * 1024);
        let mut sent = hello(&[("agentid", "node-1"), ("authorization", "Bearer x.y.z")]);
        sent.capabilities = vec!["later".to_owned()];
        let answer = hello(&[("serverid", "s-1"), ("servercount", "3")]);
        let server = async {
            let (got, pending) = server_side(server_io).await.unwrap();
            assert_eq!(pending.transport_name(), "websocket");
            pending.accept(&answer, None).await.unwrap();
            got
        };
        let to = upgrade();
        let (agent, got) = tokio::join!(connect_websocket(agent_io, &to, &sent), server);
        let (answered, _link) = agent.unwrap();
        assert_eq!(got.capabilities, ["later"]);
        assert_eq!(got.metadata.get("agentid"), Some("node-1"));
        assert_eq!(got.metadata.get("authorization"), Some("Bearer x.y.z"));
        assert_eq!(answered.metadata.get("serverid"), Some("s-1"));
        assert_eq!(answered.metadata.get("servercount"), Some("3"));
        assert_eq!(answered.version, link::VERSION);
    }

    #[tokio::test]
    async fn a_refusal_reaches_the_agent_as_its_status_and_message() {
        let (agent_io, server_io) = tokio::io::duplex(64 * 1024);
        let server = async {
            let (_, pending) = server_side(server_io).await.unwrap();
            pending
                .refuse(Code::UNAUTHENTICATED, "token rejected: expired")
                .await;
        };
        let (to, sent) = (upgrade(), hello(&[("agentid", "a")]));
        let (agent, ()) = tokio::join!(connect_websocket(agent_io, &to, &sent), server);
        match agent.unwrap_err() {
            LinkError::Closed { code, message } => {
                assert_eq!(code, Code::UNAUTHENTICATED);
                assert_eq!(message, "token rejected: expired");
            }
            other => panic!("{other}"),
        }
    }

    #[tokio::test]
    async fn a_proxys_own_error_is_named_even_when_it_keeps_the_connection_open() {
        let (agent_io, mut proxy) = tokio::io::duplex(64 * 1024);
        let proxy_side = async move {
            let mut buf = BytesMut::new();
            read_head(&mut proxy, &mut buf).await.unwrap();
            let answer = "HTTP/1.1 404 Not Found\r\ncontent-type: text/plain\r\n\r\nno route";
            proxy.write_all(answer.as_bytes()).await.unwrap();
            // Kept open, with no length stated: the agent stops waiting for more by itself.
            proxy
        };
        let (to, sent) = (upgrade(), hello(&[("agentid", "a")]));
        let (agent, _proxy) = tokio::join!(connect_websocket(agent_io, &to, &sent), proxy_side);
        let err = agent.unwrap_err().to_string();
        assert!(
            err.contains("HTTP 404 Not Found")
                && err.contains("no route")
                && err.contains("--websocket-path"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn metadata_that_cannot_be_a_header_is_an_error_at_the_agent() {
        for pair in [
            ("agentid", "a\r\nx: y"),
            ("bad key", "v"),
            ("host", "elsewhere"),
        ] {
            let (agent_io, _server_io) = tokio::io::duplex(64 * 1024);
            let err = connect_websocket(agent_io, &upgrade(), &hello(&[pair]))
                .await
                .unwrap_err();
            assert!(matches!(err, LinkError::Upgrade(_)), "{pair:?}: {err}");
        }
    }

    #[tokio::test]
    async fn requests_that_are_no_upgrade_are_answered_with_what_is_missing() {
        let upgrade = "upgrade: websocket\r\nconnection: Upgrade\r\n";
        let key = "sec-websocket-key: dGhlIHNhbXBsZSBub25jZQ==\r\n";
        let version = "sec-websocket-version: 13\r\n";
        let protocol = "sec-websocket-protocol: tether.link.v1\r\n";
        for (request, status, says) in [
            (
                format!("POST / HTTP/1.1\r\n{upgrade}{key}{version}{protocol}\r\n"),
                "400",
                "GET",
            ),
            (
                format!("GET / HTTP/1.1\r\n{key}{version}{protocol}\r\n"),
                "400",
                "Upgrade",
            ),
            (
                format!(
                    "GET / HTTP/1.1\r\n{upgrade}{key}sec-websocket-version: 8\r\n{protocol}\r\n"
                ),
                "426",
                "version 13",
            ),
            (
                format!("GET / HTTP/1.1\r\n{upgrade}{key}{version}\r\n"),
                "400",
                "tether.link.v1",
            ),
            (
                format!(
                    "GET / HTTP/1.1\r\n{upgrade}sec-websocket-key: short\r\n{version}{protocol}\r\n"
                ),
                "400",
                "Sec-WebSocket-Key",
            ),
            (
                "GET / HTTP/1.1\r\nbad header\r\n\r\n".to_owned(),
                "400",
                "malformed",
            ),
            (
                format!("GET / HTTP/1.1\r\nx: {}\r\n", "a".repeat(70_000)),
                "431",
                "over",
            ),
        ] {
            let (mut peer, server_io) = tokio::io::duplex(128 * 1024);
            peer.write_all(request.as_bytes()).await.unwrap();
            let err = server_side(server_io).await.unwrap_err();
            assert!(err.to_string().contains(says), "{request:.40}: {err}");
            let mut answer = String::new();
            peer.read_to_string(&mut answer).await.unwrap();
            assert!(
                answer.starts_with(&format!("HTTP/1.1 {status} ")),
                "{answer}"
            );
            assert!(answer.contains(says), "{answer}");
        }
    }
}
