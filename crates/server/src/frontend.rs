//! Frontends: where clients such as kube-apiserver ask for connections.
//!
//! One per server process, as upstream: gRPC `ProxyService` or HTTP CONNECT, each over a
//! Unix socket or mutual-TLS TCP; plus, in the same mode, each tenant's own frontends.

mod address;
pub(crate) mod connection;
pub(crate) mod grpc;
pub(crate) mod http_connect;
pub(crate) mod log_span;

/// `--mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Grpc,
    HttpConnect,
}

impl std::fmt::Display for Mode {
    /// As `--mode` spells it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Grpc => "grpc",
            Self::HttpConnect => "http-connect",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "grpc" => Ok(Self::Grpc),
            "http-connect" => Ok(Self::HttpConnect),
            other => Err(format!(
                "unknown mode {other:?} (expected grpc or http-connect)"
            )),
        }
    }
}
