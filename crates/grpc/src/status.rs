//! gRPC status codes and their HTTP/2 trailer encoding.

use http::HeaderMap;
pub use tether_conn::Code;

/// A gRPC status: code plus human-readable message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.name(), self.message)
    }
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    pub fn ok() -> Self {
        Self::new(Code::OK, "")
    }

    /// Writes `grpc-status` and `grpc-message` into trailers (or trailers-only headers).
    pub(crate) fn write_to(&self, headers: &mut HeaderMap) {
        headers.insert("grpc-status", self.code.0.into());
        if let (false, Ok(v)) = (
            self.message.is_empty(),
            percent_encode(&self.message).parse(),
        ) {
            headers.insert("grpc-message", v);
        }
    }

    /// Reads a status from trailers; `None` if `grpc-status` is absent.
    pub(crate) fn read_from(headers: &HeaderMap) -> Option<Self> {
        let code = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
        let message = headers
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .map(percent_decode)
            .unwrap_or_default();
        Some(Self::new(Code(code), message))
    }
}

/// gRPC's grpc-message encoding: percent-encode everything outside printable ASCII and '%'.
fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if (0x20..0x7f).contains(&b) && b != b'%' {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = || std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok();
        match (bytes[i], hex().and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_round_trips_through_trailers() {
        let status = Status::new(Code::UNAVAILABLE, "agent gone: 100% — ärger\n");
        let mut headers = HeaderMap::new();
        status.write_to(&mut headers);
        assert_eq!(Status::read_from(&headers), Some(status));
    }
}
