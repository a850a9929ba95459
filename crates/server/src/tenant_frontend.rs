//! A tenant's own frontend listeners (`frontend:` in a routing file's tenant entry): every
//! client that arrives on one belongs to that tenant, whatever it proves, as a hosted
//! control plane gives each tenant's kube-apiserver its own socket. Access to a socket is
//! gated by its file mode; a TCP listener asks for the main frontend's client certificates.
//!
//! Two listeners that would share an address are refused at start-up: a Unix socket bound
//! again silently takes the first one's clients (with `--delete-existing-uds-file`), and a
//! TCP port could be answered by either tenant.

use std::net::SocketAddr;
use std::path::{Component, Path, PathBuf};

/// Where one tenant's own frontend listens; at least one of the two is set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TenantFrontend {
    /// A Unix socket (absolute path).
    pub unix: Option<PathBuf>,
    /// A TCP listener with mutual TLS, using the main frontend's certificates.
    pub tcp: Option<SocketAddr>,
}

impl TenantFrontend {
    /// Checks and normalises the routing file's `unix` and `tcp` values.
    pub(crate) fn parse(unix: Option<&str>, tcp: Option<&str>) -> Result<Self, String> {
        if unix.is_none() && tcp.is_none() {
            return Err("frontend: name a unix socket path, a tcp address, or both".into());
        }
        let unix = unix.map(socket_path).transpose()?;
        let tcp = tcp
            .map(|text| {
                text.parse::<SocketAddr>().map_err(|_| {
                    format!("frontend.tcp: {text:?} is not an IP:port (such as 127.0.0.1:8131)")
                })
            })
            .transpose()?;
        Ok(Self { unix, tcp })
    }
}

/// An absolute socket path without `..`, written the one way `Path` compares equal.
fn socket_path(text: &str) -> Result<PathBuf, String> {
    let path = Path::new(text);
    if !path.is_absolute() {
        return Err(format!("frontend.unix: {text:?} must be an absolute path"));
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("frontend.unix: {text:?} must not contain \"..\""));
    }
    Ok(path.components().collect())
}

/// Whether two TCP listeners would take the same connections: the same (non-zero) port on
/// the same address, or on any address when either is the unspecified one.
pub(crate) fn tcp_overlaps(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// Whether two socket paths name the same file, lexically (`/run//a.sock` is `/run/a.sock`).
pub(crate) fn unix_overlaps(a: &Path, b: &Path) -> bool {
    a.components().eq(b.components())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_overlap_as_listeners_would() {
        let addr = |s: &str| s.parse::<SocketAddr>().unwrap();
        assert!(tcp_overlaps(addr("127.0.0.1:8131"), addr("127.0.0.1:8131")));
        assert!(tcp_overlaps(addr("0.0.0.0:8131"), addr("127.0.0.1:8131")));
        assert!(tcp_overlaps(addr("[::]:8131"), addr("127.0.0.1:8131")));
        assert!(!tcp_overlaps(
            addr("127.0.0.1:8131"),
            addr("127.0.0.2:8131")
        ));
        assert!(!tcp_overlaps(
            addr("127.0.0.1:8131"),
            addr("127.0.0.1:8132")
        ));
        assert!(
            !tcp_overlaps(addr("127.0.0.1:0"), addr("127.0.0.1:0")),
            "ephemeral"
        );
        let unix = |s: &str| TenantFrontend::parse(Some(s), None).unwrap().unix.unwrap();
        assert!(unix_overlaps(
            &unix("/run//t/./a.sock"),
            Path::new("/run/t/a.sock")
        ));
        assert!(!unix_overlaps(
            &unix("/run/t/a.sock"),
            Path::new("/run/t/b.sock")
        ));
    }

    #[test]
    fn bad_frontends_are_refused_with_the_field() {
        for (unix, tcp, expected) in [
            (None, None, "name a unix socket path"),
            (Some("run/a.sock"), None, "absolute path"),
            (Some("/run/../a.sock"), None, "\"..\""),
            (None, Some("localhost:80"), "not an IP:port"),
        ] {
            let err = TenantFrontend::parse(unix, tcp).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }
}
