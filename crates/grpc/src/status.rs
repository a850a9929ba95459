//! gRPC status codes and their HTTP/2 trailer encoding.

use http::HeaderMap;

/// A gRPC status code. Only the codes tether produces or reports are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Code(pub u32);

impl Code {
    pub const OK: Self = Self(0);
    pub const CANCELLED: Self = Self(1);
    pub const UNKNOWN: Self = Self(2);
    pub const INVALID_ARGUMENT: Self = Self(3);
    pub const DEADLINE_EXCEEDED: Self = Self(4);
    pub const ALREADY_EXISTS: Self = Self(6);
    pub const PERMISSION_DENIED: Self = Self(7);
    pub const RESOURCE_EXHAUSTED: Self = Self(8);
    pub const FAILED_PRECONDITION: Self = Self(9);
    pub const UNIMPLEMENTED: Self = Self(12);
    pub const INTERNAL: Self = Self(13);
    pub const UNAVAILABLE: Self = Self(14);
    pub const UNAUTHENTICATED: Self = Self(16);

    /// grpc-go's spelling, used in metric labels.
    pub fn name(self) -> &'static str {
        const NAMES: [&str; 17] = [
            "OK",
            "Canceled",
            "Unknown",
            "InvalidArgument",
            "DeadlineExceeded",
            "NotFound",
            "AlreadyExists",
            "PermissionDenied",
            "ResourceExhausted",
            "FailedPrecondition",
            "Aborted",
            "OutOfRange",
            "Unimplemented",
            "Internal",
            "Unavailable",
            "DataLoss",
            "Unauthenticated",
        ];
        NAMES.get(self.0 as usize).copied().unwrap_or("Unknown")
    }
}

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
