//! A tenant's own frontend listeners (`frontend:` in a routing file's tenant entry), as a
//! hosted control plane gives each tenant's kube-apiserver its own socket.
//!
//! A client on one must still prove it is the tenant's (`Tenants::admit_own_frontend`, at
//! accept and again at each dial), as Envoy checks a client certificate's names per filter
//! chain and linkerd authorizes per Server: the main frontend's CA signs every tenant's
//! client, so the listener alone proves nothing. A TCP listener therefore needs `cert:`
//! client identities or a client CA of the tenant's own (`client_ca`), whose certificates
//! then verify instead of the main frontend's; the routing file is refused otherwise. A Unix
//! socket is gated by its file mode, and by the tenant's `uid:` identities when it lists any.
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
    /// A TCP listener with mutual TLS, using the main frontend's certificate.
    pub tcp: Option<SocketAddr>,
    /// The CA bundle that verifies the TCP listener's clients instead of the main
    /// frontend's (`--server-ca-cert`); read when the listener is bound (at start-up, or by
    /// the reload that adds or changes it).
    pub client_ca: Option<PathBuf>,
}

impl TenantFrontend {
    /// Checks and normalises the routing file's `unix`, `tcp` and `client_ca` values.
    pub(crate) fn parse(
        unix: Option<&str>,
        tcp: Option<&str>,
        client_ca: Option<&str>,
    ) -> Result<Self, String> {
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
        let client_ca = match client_ca {
            None => None,
            Some("") => return Err("frontend.client_ca: name a CA bundle file".into()),
            Some(_) if tcp.is_none() => {
                return Err(
                    "frontend.client_ca verifies the tcp listener's client certificates: add frontend.tcp, or remove client_ca"
                        .into(),
                );
            }
            Some(path) => Some(PathBuf::from(path)),
        };
        Ok(Self {
            unix,
            tcp,
            client_ca,
        })
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

/// Whether two socket paths name the same file, lexically (`/run//a.sock` is `/run/a.sock`).
pub(crate) fn unix_overlaps(a: &Path, b: &Path) -> bool {
    a.components().eq(b.components())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_paths_overlap_as_listeners_would() {
        let unix = |s: &str| {
            TenantFrontend::parse(Some(s), None, None)
                .unwrap()
                .unix
                .unwrap()
        };
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
        for (unix, tcp, ca, expected) in [
            (None, None, None, "name a unix socket path"),
            (Some("run/a.sock"), None, None, "absolute path"),
            (Some("/run/../a.sock"), None, None, "\"..\""),
            (None, Some("localhost:80"), None, "not an IP:port"),
            (
                Some("/run/a.sock"),
                None,
                Some("/ca.crt"),
                "add frontend.tcp",
            ),
            (None, Some("127.0.0.1:80"), Some(""), "name a CA bundle"),
        ] {
            let err = TenantFrontend::parse(unix, tcp, ca).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }
}
