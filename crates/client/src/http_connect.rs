//! The HTTP CONNECT frontend: one new socket per dial, as kube-apiserver's EgressSelector.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::error::NO_AGENT;
use crate::{ClientError, DialError, ProxySocket, Transport};

/// Largest response head accepted: Go's `http.DefaultMaxHeaderBytes`, which newer
/// kube-apiservers apply.
const MAX_HEAD_BYTES: usize = 1 << 20;
/// Headers parsed in a response head; upstream sends at most three.
const MAX_HEADERS: usize = 64;
/// Most of an error body kept for [`DialError::Rejected`].
const MAX_BODY_BYTES: usize = 64 * 1024;
/// Read granularity while looking for the end of the head.
const READ_CHUNK: usize = 4096;

/// Dials `address` (`host:port`) through a proxy server's HTTP CONNECT frontend and returns
/// the socket, which carries the tunnelled bytes from then on.
///
/// The request is byte for byte what kube-apiserver sends. As kube-apiserver does, any byte
/// the server sends after the `200` head before we speak is a protocol error: it would have
/// to be the destination's, and a server that sends it before its `200` cannot be trusted to
/// keep the two apart. Closing the returned socket closes the tunnel; an abnormal close by the
/// server shows as a reset.
///
/// There is no deadline of its own: wrap it in `tokio::time::timeout`. Giving up closes the
/// socket, and the server abandons the dial.
pub async fn dial_http_connect(
    transport: &Transport,
    address: &str,
) -> Result<ProxySocket, DialError> {
    if address.is_empty()
        || address
            .bytes()
            .any(|b| b.is_ascii_whitespace() || b.is_ascii_control())
    {
        return Err(DialError::InvalidAddress(address.to_owned()));
    }
    let mut socket = transport.connect(b"http/1.1").await?;
    let request = format!("CONNECT {address} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    socket
        .write_all(request.as_bytes())
        .await
        .map_err(ClientError::Io)?;
    socket.flush().await.map_err(ClientError::Io)?;

    let mut buf = Vec::with_capacity(READ_CHUNK);
    let head = read_head(&mut socket, &mut buf).await?;
    let rest = buf.split_off(head.len);
    if head.status == 200 {
        if !rest.is_empty() {
            let message = format!(
                "unexpected {} bytes of buffered data after the 200 response",
                rest.len()
            );
            return Err(ClientError::Protocol(message).into());
        }
        return Ok(socket);
    }
    let body = read_body(&mut socket, rest, head.content_length).await;
    if head.status == 500 && body.contains(NO_AGENT) {
        return Err(DialError::NoAgent);
    }
    Err(DialError::Rejected {
        status: head.status,
        body,
    })
}

/// A parsed response head.
#[derive(Debug, PartialEq, Eq)]
struct Head {
    status: u16,
    /// Bytes the head occupies, up to and including the blank line.
    len: usize,
    content_length: Option<usize>,
}

/// Reads until `buf` holds a complete response head.
async fn read_head(socket: &mut ProxySocket, buf: &mut Vec<u8>) -> Result<Head, ClientError> {
    loop {
        if let Some(head) = parse_head(buf)? {
            return Ok(head);
        }
        if buf.len() >= MAX_HEAD_BYTES {
            return Err(ClientError::Protocol(format!(
                "response head exceeds {MAX_HEAD_BYTES} bytes"
            )));
        }
        buf.reserve(READ_CHUNK);
        if socket.read_buf(buf).await? == 0 {
            return Err(ClientError::Closed(
                "connection closed before a complete response".into(),
            ));
        }
    }
}

/// `None` while the head is incomplete.
fn parse_head(buf: &[u8]) -> Result<Option<Head>, ClientError> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut headers);
    let len = match response.parse(buf) {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => {
            return Err(ClientError::Protocol(format!(
                "malformed HTTP response: {e}"
            )));
        }
    };
    let status = response
        .code
        .ok_or_else(|| ClientError::Protocol("HTTP response without a status".into()))?;
    let content_length = response
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| std::str::from_utf8(h.value).ok()?.trim().parse().ok());
    Ok(Some(Head {
        status,
        len,
        content_length,
    }))
}

/// Reads an error body: `Content-Length` bytes, else until the server closes, at most
/// [`MAX_BODY_BYTES`]. A read error ends the body: the server may reset after writing it.
async fn read_body(
    socket: &mut ProxySocket,
    mut body: Vec<u8>,
    content_length: Option<usize>,
) -> String {
    let limit = content_length.unwrap_or(MAX_BODY_BYTES).min(MAX_BODY_BYTES);
    while body.len() < limit {
        body.reserve(READ_CHUNK);
        match socket.read_buf(&mut body).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    body.truncate(limit);
    String::from_utf8_lossy(&body).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_heads() {
        let ok = b"HTTP/1.1 200 Connection Established\r\n\r\n";
        assert_eq!(
            parse_head(ok).unwrap(),
            Some(Head {
                status: 200,
                len: ok.len(),
                content_length: None
            })
        );
        assert_eq!(parse_head(&ok[..ok.len() - 1]).unwrap(), None);
        let not_allowed = b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 45\r\n\r\nthis";
        let head = parse_head(not_allowed).unwrap().unwrap();
        assert_eq!((head.status, head.content_length), (405, Some(45)));
        assert!(matches!(
            parse_head(b"SSH-2.0-OpenSSH\r\n\r\n"),
            Err(ClientError::Protocol(_))
        ));
    }
}
