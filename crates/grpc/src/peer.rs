//! Who is on the other end of a connection, as the listener proved it.
//!
//! A [`PeerIdentity`] is built once per accepted connection (after the TLS handshake, if
//! any) and handed to every call on it, so that admission decisions (which agent ID a
//! certificate may claim, which client may dial) rest on what the transport verified rather
//! than on what the peer says about itself in metadata.

mod der;

use std::net::{IpAddr, SocketAddr};

pub use der::CertificateError;

/// How a connection reached the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerTransport {
    /// A Unix domain socket; the kernel vouches for the peer's credentials.
    Unix,
    /// TCP with TLS; the identity is the verified client certificate, if one was required.
    Tls,
    /// TCP without TLS (tests and in-process callers only; no listener serves this).
    Tcp,
}

/// The peer's process credentials on a Unix socket (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnixCredentials {
    pub uid: u32,
    pub gid: u32,
    /// Absent when the kernel did not report one.
    pub pid: Option<i32>,
}

/// The names in a verified client certificate's leaf: its subject CN and its SAN entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateNames {
    /// The subject's commonName, when present and text.
    pub common_name: Option<String>,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub uris: Vec<String>,
}

impl CertificateNames {
    /// Reads the names from a DER-encoded X.509 certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, CertificateError> {
        der::names(der)
    }

    /// True when `name` is the CN, a DNS SAN or a URI SAN (exact, case-insensitive for DNS).
    pub fn has_name(&self, name: &str) -> bool {
        self.common_name.as_deref() == Some(name)
            || self.dns.iter().any(|d| d.eq_ignore_ascii_case(name))
            || self.uris.iter().any(|u| u == name)
    }

    /// True when `ip` is an IP SAN.
    pub fn has_ip(&self, ip: IpAddr) -> bool {
        self.ips.contains(&ip)
    }
}

/// Everything the server knows for certain about a connection's peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerIdentity {
    pub transport: PeerTransport,
    /// The peer's socket address (TCP); `None` on Unix sockets.
    pub addr: Option<SocketAddr>,
    /// The verified client certificate's names; `None` without a client certificate.
    pub certificate: Option<CertificateNames>,
    /// The peer process (Unix sockets).
    pub unix: Option<UnixCredentials>,
}

impl PeerIdentity {
    /// A peer that proved nothing: an in-process caller or a test.
    pub fn unknown() -> Self {
        Self {
            transport: PeerTransport::Tcp,
            addr: None,
            certificate: None,
            unix: None,
        }
    }

    /// The identity that decides whether two connections belong to the same principal: the
    /// certificate's names (a renewed certificate with the same names is the same principal),
    /// else the Unix uid, else nothing (an unauthenticated peer).
    pub fn principal(&self) -> Principal {
        match (&self.certificate, &self.unix) {
            (Some(names), _) => Principal::Certificate(names.clone()),
            (None, Some(cred)) => Principal::UnixUser(cred.uid),
            (None, None) => Principal::Anonymous,
        }
    }
}

/// See [`PeerIdentity::principal`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Certificate(CertificateNames),
    UnixUser(u32),
    /// A bearer token's reviewed identity: the user name, with the node the token is bound to
    /// when it is bound to one (so agents of one ServiceAccount on different nodes differ).
    Token {
        username: String,
        node: Option<String>,
    },
    Anonymous,
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Certificate(names) => {
                write!(f, "certificate")?;
                if let Some(cn) = &names.common_name {
                    write!(f, " CN={}", crate::LogText(cn))?;
                }
                if let Some(dns) = names.dns.first() {
                    write!(f, " DNS={}", crate::LogText(dns))?;
                }
                Ok(())
            }
            Self::UnixUser(uid) => write!(f, "unix uid {uid}"),
            Self::Token { username, node } => {
                write!(f, "token of {}", crate::LogText(username))?;
                if let Some(node) = node {
                    write!(f, " on node {}", crate::LogText(node))?;
                }
                Ok(())
            }
            Self::Anonymous => write!(f, "no client certificate"),
        }
    }
}

#[cfg(test)]
mod tests {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use tether_tls::pki::{ClientSpec, Pki};

    use super::*;

    fn names_of(pem: &str) -> CertificateNames {
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        CertificateNames::from_der(&der).unwrap()
    }

    #[test]
    fn reads_cn_and_sans_of_generated_certificates() {
        let (pki, issued) = Pki::generate_with_clients(&[ClientSpec {
            common_name: "node-a",
            sans: &["node-a.example", "10.1.2.3", "fd00::7"],
        }])
        .unwrap();
        let node = names_of(&issued[0].cert_pem);
        assert_eq!(node.common_name.as_deref(), Some("node-a"));
        assert_eq!(node.dns, ["node-a.example"]);
        assert_eq!(
            node.ips,
            [
                "10.1.2.3".parse::<IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        assert!(node.has_name("node-a") && node.has_name("NODE-A.example"));
        assert!(!node.has_name("node-b"));

        let server = names_of(&pki.server_cert_pem);
        assert_eq!(server.common_name.as_deref(), Some("proxy-frontend"));
        assert!(server.dns.contains(&"localhost".to_owned()));
        let agent = names_of(&pki.agent_cert_pem);
        assert_eq!(agent.common_name.as_deref(), Some("proxy-agent"));
        assert!(agent.dns.is_empty() && agent.ips.is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let (pki, _) = Pki::generate_with_clients(&[]).unwrap();
        let der = CertificateDer::from_pem_slice(pki.agent_cert_pem.as_bytes()).unwrap();
        for cut in 0..der.len() {
            let _ = CertificateNames::from_der(&der[..cut]);
        }
        assert!(CertificateNames::from_der(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(CertificateNames::from_der(&[]).is_err());
    }
}
