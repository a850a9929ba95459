//! Who a peer is, as the tenant table and the destination policies name it: an identity
//! written in the routing file (`cert:`, `uid:`, `sa:`) and what a connection proved, which
//! it is matched against.

use tether_grpc::{PeerIdentity, PeerTransport};

/// A proven identity in the tenant table.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Identity {
    /// `cert:NAME`: the certificate's CN, a DNS SAN or a URI SAN.
    CertName(String),
    /// `uid:N`: the peer process's uid on a Unix socket frontend.
    UnixUid(u32),
    /// `sa:NAMESPACE` or `sa:NAMESPACE:NAME`: an agent whose token review (token
    /// authentication) proved a ServiceAccount of that namespace (and name).
    ServiceAccount {
        namespace: String,
        name: Option<String>,
    },
}

/// The prefix of a ServiceAccount's user name in a TokenReview.
const SERVICE_ACCOUNT_USER: &str = "system:serviceaccount:";

/// What a peer proved: its connection's identity and, for an agent with token
/// authentication, the reviewed user name (`system:serviceaccount:NS:NAME`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Proof<'a> {
    pub(crate) peer: &'a PeerIdentity,
    pub(crate) token_user: Option<&'a str>,
}

impl<'a> Proof<'a> {
    pub(crate) fn peer(peer: &'a PeerIdentity) -> Self {
        Self {
            peer,
            token_user: None,
        }
    }

    /// The ServiceAccount's namespace and name, when the token proved one.
    fn service_account(&self) -> Option<(&'a str, &'a str)> {
        self.token_user?
            .strip_prefix(SERVICE_ACCOUNT_USER)?
            .split_once(':')
    }
}

/// What an agent stream proved at admission, kept for its life: each new generation of the
/// routing file checks it again, and a stream whose identity moved to another tenant ends.
#[derive(Clone, Debug)]
pub(crate) struct AgentProof {
    pub(crate) peer: std::sync::Arc<PeerIdentity>,
    pub(crate) token_user: Option<String>,
}

impl AgentProof {
    pub(crate) fn proof(&self) -> Proof<'_> {
        Proof {
            peer: &self.peer,
            token_user: self.token_user.as_deref(),
        }
    }
}

impl std::fmt::Display for Proof<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.token_user {
            Some(user) => write!(f, "{}", tether_grpc::LogText(user)),
            None => write!(f, "{}", self.peer.principal()),
        }
    }
}

impl Identity {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text.split_once(':') {
            Some(("cert", name)) if !name.is_empty() => Ok(Self::CertName(name.to_owned())),
            Some(("uid", uid)) => uid
                .parse()
                .map(Self::UnixUid)
                .map_err(|_| format!("{text:?}: uid must be a number")),
            Some(("sa", account)) => {
                let (namespace, name) = match account.split_once(':') {
                    Some((namespace, name)) => (namespace, Some(name)),
                    None => (account, None),
                };
                if !is_dns_label(namespace) {
                    return Err(format!(
                        "{text:?}: the namespace must be a DNS label (lowercase letters, digits and '-', at most 63)"
                    ));
                }
                if name.is_some_and(|n| n.is_empty() || n.len() > 253 || n.contains(':')) {
                    return Err(format!(
                        "{text:?}: the ServiceAccount name must be 1 to 253 characters without ':'"
                    ));
                }
                Ok(Self::ServiceAccount {
                    namespace: namespace.to_owned(),
                    name: name.map(str::to_owned),
                })
            }
            _ => Err(format!(
                "{text:?}: expected cert:NAME (a certificate's CN or SAN), uid:N (a Unix socket peer) or sa:NAMESPACE[:NAME] (an agent's ServiceAccount, with token authentication)"
            )),
        }
    }

    pub(crate) fn matches(&self, proof: &Proof<'_>) -> bool {
        let peer = proof.peer;
        match self {
            Self::CertName(name) => peer.certificate.as_ref().is_some_and(|c| c.has_name(name)),
            Self::UnixUid(uid) => peer.unix.is_some_and(|u| u.uid == *uid),
            Self::ServiceAccount { namespace, name } => {
                proof.service_account().is_some_and(|(ns, n)| {
                    ns == namespace && name.as_ref().is_none_or(|name| name == n)
                })
            }
        }
    }

    /// Whether a peer arriving over `transport` can prove this identity at all: a
    /// certificate name over TLS, a uid on a Unix socket (a token is agents' only).
    pub(crate) fn provable_over(&self, transport: PeerTransport) -> bool {
        match self {
            Self::CertName(_) => transport == PeerTransport::Tls,
            Self::UnixUid(_) => transport == PeerTransport::Unix,
            Self::ServiceAccount { .. } => false,
        }
    }
}

/// A Kubernetes namespace name: an RFC 1123 label.
fn is_dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}
