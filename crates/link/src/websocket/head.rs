//! The heads of the WebSocket upgrade, without I/O: writing the agent's metadata as headers
//! and reading it back, the server's `101` and its refusals, and `Sec-WebSocket-Accept`.

use base64::Engine as _;
use bytes::{BufMut, Bytes, BytesMut};
use tether_conn::Code;
use tether_proto::link::Hello;
use tether_proto::metadata::Metadata;
use tether_proto::websocket::{ACCEPT_GUID, SUBPROTOCOL};

use crate::error::LinkError;

/// The header that carries a refusal's gRPC status code.
pub(crate) const STATUS_HEADER: &str = "tether-status";
/// The header that carries the link's capabilities, comma-separated.
const CAPABILITIES_HEADER: &str = "tether-link-capabilities";
/// Headers that make the upgrade, not the stream's metadata.
const MECHANICS: &[&str] = &[
    "host",
    "upgrade",
    "connection",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-protocol",
    "sec-websocket-accept",
    "sec-websocket-extensions",
    "content-length",
    "content-type",
    "transfer-encoding",
    STATUS_HEADER,
    CAPABILITIES_HEADER,
];

/// Writes the `101` that accepts the upgrade, with `answer`'s metadata.
pub(crate) fn switching(accept: &str, answer: &Hello, out: &mut BytesMut) -> Result<(), LinkError> {
    out.put_slice(b"HTTP/1.1 101 Switching Protocols\r\n");
    header(out, "upgrade", b"websocket")?;
    header(out, "connection", b"Upgrade")?;
    header(out, "sec-websocket-accept", accept.as_bytes())?;
    header(out, "sec-websocket-protocol", SUBPROTOCOL.as_bytes())?;
    stream_headers(out, answer)?;
    out.put_slice(b"\r\n");
    Ok(())
}

/// Writes a refusal: an HTTP status near `code`, the code itself, and `message` as the body.
pub(crate) fn refusal(code: Code, message: &str, out: &mut BytesMut) {
    let status = match code {
        Code::UNAUTHENTICATED => 401,
        Code::PERMISSION_DENIED => 403,
        Code::RESOURCE_EXHAUSTED => 429,
        Code::UNAVAILABLE => 503,
        Code::INVALID_ARGUMENT | Code::FAILED_PRECONDITION => 400,
        Code::UNIMPLEMENTED => 501,
        _ => 500,
    };
    let code = code.0.to_string();
    error_response(status, message, &[(STATUS_HEADER, &code)], out);
}

/// Writes an error response: `status`, the `extra` headers, and `message` as a text body.
pub(crate) fn error_response(
    status: u16,
    message: &str,
    extra: &[(&str, &str)],
    out: &mut BytesMut,
) {
    let reason = http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or_default();
    out.put_slice(format!("HTTP/1.1 {status} {reason}\r\n").as_bytes());
    for (name, value) in extra {
        out.put_slice(format!("{name}: {value}\r\n").as_bytes());
    }
    out.put_slice(
        format!(
            "content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\n\
             connection: close\r\n\r\n",
            message.len()
        )
        .as_bytes(),
    );
    out.put_slice(message.as_bytes());
}

/// Appends one header; a value that cannot travel in one is an error.
pub(crate) fn header(out: &mut BytesMut, name: &str, value: &[u8]) -> Result<(), LinkError> {
    let valid = |b: &u8| *b == b'\t' || (b' '..=b'~').contains(b) || *b >= 0x80;
    if !value.iter().all(valid) {
        return Err(LinkError::Upgrade(format!(
            "the value of {name} holds a control character and cannot travel in an HTTP header"
        )));
    }
    out.put_slice(name.as_bytes());
    out.put_slice(b": ");
    out.put_slice(value);
    out.put_slice(b"\r\n");
    Ok(())
}

/// A HELLO's or ACCEPT's capabilities and metadata, as headers.
pub(crate) fn stream_headers(out: &mut BytesMut, hello: &Hello) -> Result<(), LinkError> {
    if !hello.capabilities.is_empty() {
        header(
            out,
            CAPABILITIES_HEADER,
            hello.capabilities.join(", ").as_bytes(),
        )?;
    }
    for (name, value) in hello.metadata.iter() {
        let token = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !token || MECHANICS.contains(&name) {
            return Err(LinkError::Upgrade(format!(
                "the metadata key {name:?} cannot travel as an HTTP header of its own"
            )));
        }
        header(out, name, value)?;
    }
    Ok(())
}

/// The HELLO or ACCEPT a head's headers carry.
pub(crate) fn hello_of(headers: &[httparse::Header<'_>], version: u8) -> Hello {
    let capabilities = find(headers, CAPABILITIES_HEADER)
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|c| !c.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let metadata: Metadata = headers
        .iter()
        .filter(|h| !MECHANICS.iter().any(|m| h.name.eq_ignore_ascii_case(m)))
        .map(|h| (h.name, Bytes::copy_from_slice(h.value)))
        .collect();
    Hello {
        version,
        capabilities,
        metadata,
    }
}

pub(crate) fn find<'a>(headers: &[httparse::Header<'a>], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case(name))
        .map(|h| h.value)
}

/// Whether a comma-separated header holds `token` (case-insensitive).
pub(crate) fn has_token(value: Option<&[u8]>, token: &str) -> bool {
    value
        .and_then(|v| std::str::from_utf8(v).ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// `Sec-WebSocket-Accept` for `key`: base64 of SHA-1 over the key and the RFC's GUID.
pub(crate) fn accept_key(key: &[u8]) -> String {
    let mut ctx = aws_lc_rs::digest::Context::new(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(key);
    ctx.update(ACCEPT_GUID.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(ctx.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_key_is_the_rfc_example() {
        // RFC 6455 §1.3.
        assert_eq!(
            accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="),
            "s3pPLMBiTxaQ9kYGzzhZRbK+xOo="
        );
    }
}
