//! The control-plane listener's settings (`--control-plane-listen`,
//! `--control-plane-endpoint`, `--control-plane-max-connections`), apart from the listener
//! itself so that the agent's configuration can name them.

use std::path::PathBuf;

/// Where the listener listens: `HOST:PORT` (an IP literal) or `unix:/path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ListenAddr {
    Tcp(std::net::SocketAddr),
    Unix(PathBuf),
}

impl std::str::FromStr for ListenAddr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs a socket path".into());
            }
            return Ok(Self::Unix(PathBuf::from(path)));
        }
        text.parse().map(Self::Tcp).map_err(|_| {
            format!("{text:?} is neither IP:PORT (for example 127.0.0.1:6443) nor unix:/path")
        })
    }
}

impl std::fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => addr.fmt(f),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

/// `--control-plane-listen`, `--control-plane-endpoint` and
/// `--control-plane-max-connections`.
#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    pub listen: ListenAddr,
    /// The `host:port` asked of the server; empty asks for its default endpoint.
    pub endpoint: String,
    /// Local connections carried at once; more are closed as they are accepted, so a
    /// process on the node cannot hold unbounded tunnels and descriptors.
    pub max_connections: usize,
    pub protocol: ControlPlaneProtocol,
}

/// What local clients speak on the control-plane listener.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ControlPlaneProtocol {
    /// Plain TCP: every connection goes to the configured endpoint.
    #[default]
    Tcp,
    /// HTTP CONNECT, for node components that honour `HTTPS_PROXY`: each request names its
    /// endpoint, which the server's allowlist must hold.
    HttpConnect,
}

impl std::fmt::Display for ControlPlaneProtocol {
    /// As `--control-plane-protocol` spells it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Tcp => "tcp",
            Self::HttpConnect => "http-connect",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_parse() {
        assert_eq!(
            "127.0.0.1:6443".parse::<ListenAddr>(),
            Ok(ListenAddr::Tcp("127.0.0.1:6443".parse().unwrap()))
        );
        assert_eq!(
            "unix:/run/tether/cp.sock".parse::<ListenAddr>(),
            Ok(ListenAddr::Unix("/run/tether/cp.sock".into()))
        );
        assert!("unix:".parse::<ListenAddr>().is_err());
        assert!("localhost:6443".parse::<ListenAddr>().is_err());
    }
}
