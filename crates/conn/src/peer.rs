//! Who is on the other end of a connection, as the listener proved it.
//!
//! A [`PeerIdentity`] is built once per accepted connection (after the TLS handshake, if
//! any) and handed to every call on it, so that admission decisions (which agent ID a
//! certificate may claim, which client may dial) rest on what the transport verified rather
//! than on what the peer says about itself in metadata.

use std::net::SocketAddr;

use crate::certificate::CertificateNames;

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
                    write!(f, " CN={}", crate::log_text::LogText(cn))?;
                }
                if let Some(dns) = names.dns.first() {
                    write!(f, " DNS={}", crate::log_text::LogText(dns))?;
                }
                Ok(())
            }
            Self::UnixUser(uid) => write!(f, "unix uid {uid}"),
            Self::Token { username, node } => {
                write!(f, "token of {}", crate::log_text::LogText(username))?;
                if let Some(node) = node {
                    write!(f, " on node {}", crate::log_text::LogText(node))?;
                }
                Ok(())
            }
            Self::Anonymous => write!(f, "no client certificate"),
        }
    }
}
