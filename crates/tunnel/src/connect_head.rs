//! An HTTP CONNECT request head, parsed without I/O so that it can be fuzzed: the reader
//! appends bytes and asks again until the head is complete or refused. The server's HTTP
//! CONNECT frontend and the agent's control-plane proxy read their clients with it.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt as _};

/// The head limit upstream's frontend enforces (Go's 1 MiB `MaxHeaderBytes` plus the 4 KiB
/// slack net/http adds), on every transport.
pub const MAX_HEAD_BYTES: usize = (1 << 20) + 4096;
/// Header lines beyond this are refused as too large.
pub const MAX_HEADERS: usize = 64;

/// What the client asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Head {
    /// `CONNECT target`: the target as sent (checked as a dial address later).
    Connect(String),
    /// Any other method: answered 405, as upstream.
    OtherMethod,
}

/// One look at the bytes received so far.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Parsed {
    /// The head is complete; it has been taken off the front of the buffer, and what follows
    /// (bytes the client sent early) stays in it.
    Head(Head),
    /// Read more and ask again.
    Partial,
    /// Refuse with this response and close.
    Refuse(&'static [u8]),
}

pub const TOO_LARGE: &[u8] = b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n431 Request Header Fields Too Large";
pub const BAD_REQUEST: &[u8] = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request";

/// Parses the head at the front of `buf`.
pub fn parse(buf: &mut BytesMut) -> Parsed {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(buf) {
        // The limit holds however the head arrived: one TLS record may complete a head far
        // larger than the limit in a single read.
        Ok(httparse::Status::Complete(len)) if len > MAX_HEAD_BYTES => Parsed::Refuse(TOO_LARGE),
        Ok(httparse::Status::Complete(len)) => {
            let head = match (request.method, request.path) {
                (Some("CONNECT"), Some(target)) if !target.is_empty() => {
                    Head::Connect(target.to_owned())
                }
                (Some("CONNECT"), _) => return Parsed::Refuse(BAD_REQUEST),
                _ => Head::OtherMethod,
            };
            let _ = buf.split_to(len);
            Parsed::Head(head)
        }
        Ok(httparse::Status::Partial) if buf.len() > MAX_HEAD_BYTES => Parsed::Refuse(TOO_LARGE),
        Ok(httparse::Status::Partial) => Parsed::Partial,
        Err(httparse::Error::TooManyHeaders) => Parsed::Refuse(TOO_LARGE),
        Err(_) => Parsed::Refuse(BAD_REQUEST),
    }
}

/// Reads from `io` into `buf` until the head is complete; `Err` carries the response for a
/// bad request (empty when the client left). What follows the head stays in `buf`. No
/// deadline of its own: callers bound it.
pub async fn read<R: AsyncRead + Unpin>(io: &mut R, buf: &mut BytesMut) -> Result<Head, Vec<u8>> {
    loop {
        match parse(buf) {
            Parsed::Head(head) => return Ok(head),
            Parsed::Refuse(reply) => return Err(reply.to_vec()),
            Parsed::Partial => {}
        }
        buf.reserve(4096);
        match io.read_buf(buf).await {
            Ok(0) | Err(_) => return Err(Vec::new()),
            Ok(_) => {}
        }
    }
}
