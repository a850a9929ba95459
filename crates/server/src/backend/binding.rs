//! Identity binding: every routing identifier an agent claims must be proven by its credential.
//!
//! An agent names its own ID and the `host=`/`ipv4=`/`ipv6=` identifiers that `destHost`
//! routes by, so on their own they prove nothing: one node's credential could claim another
//! node's name or address and receive the kubelet dials meant for it. What proves them:
//! - a client certificate: `host=` is its CN or a DNS SAN, `ipv4=`/`ipv6=` an IP SAN;
//! - a token bound to a pod (`authentication.kubernetes.io/node-name`): `host=` is that
//!   node, `ipv4=`/`ipv6=` are addresses of that Node object, read from the Kubernetes API;
//! - nothing else: without a credential no claim is proven.
//!
//! A certificate shared by every node proves nothing about any one of them, so routing by
//! self-declared identifiers is `--agent-identity-binding=off`, a choice warned at start-up.

use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tether_grpc::{CertificateNames, Code, LogText, PeerIdentity, Principal, Status};
use tether_proto::Identifiers;

use crate::limits::{Limit, LimitMetrics};
use crate::warn_limit::WarnLimit;

/// `--agent-identity-binding`: what an agent's credential must prove.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IdentityBinding {
    /// Nothing: any credential may claim any identifier (upstream's behaviour).
    Off,
    /// Every `host=`, `ipv4=` and `ipv6=` identifier.
    #[default]
    Identifiers,
    /// The identifiers and the agent ID.
    All,
}

impl IdentityBinding {
    /// The flag's spelling of this value.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Identifiers => "identifiers",
            Self::All => "all",
        }
    }
}

impl FromStr for IdentityBinding {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "identifiers" => Ok(Self::Identifiers),
            "all" => Ok(Self::All),
            other => Err(format!(
                "unknown identity binding {other:?} (expected identifiers, all or off)"
            )),
        }
    }
}

impl fmt::Display for IdentityBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a Node's addresses could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeLookupError {
    /// The API server says there is no such Node.
    NotFound,
    /// No answer now (RBAC, outage, throttling): the text says what to check or grant.
    Unavailable(String),
}

/// A boxed future, so the trait stays object-safe without an async-trait dependency.
pub type NodeFuture<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<IpAddr>, NodeLookupError>> + Send + 'a>>;

/// Reads a Node's addresses (`status.addresses`), to prove a token agent's `ipv4=`/`ipv6=`.
/// Handed in by the binary, so this crate links no Kubernetes client.
pub trait NodeAddresses: Send + Sync + fmt::Debug + 'static {
    fn addresses<'a>(&'a self, node: &'a str) -> NodeFuture<'a>;
}

/// What an agent stream's credential proved: the principal that owns its agent ID.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Credential<'a> {
    Certificate(&'a CertificateNames),
    /// A reviewed bearer token, with the node it is bound to if any.
    Token(Option<&'a str>),
    None,
}

impl<'a> Credential<'a> {
    /// The credential of a stream from `peer` whose token (if any) proved `token`.
    pub(crate) fn of(peer: &'a PeerIdentity, token: Option<&'a Principal>) -> Self {
        match (token, &peer.certificate) {
            (Some(Principal::Token { node, .. }), _) => Self::Token(node.as_deref()),
            (_, Some(names)) => Self::Certificate(names),
            _ => Self::None,
        }
    }

    /// Whether the credential names `name` (a certificate name, or the node its token is
    /// bound to). A claimant that proves its agent ID owns the ID over one that does not.
    pub(crate) fn proves_name(&self, name: &str) -> bool {
        match self {
            Self::Certificate(names) => names.has_name(name),
            Self::Token(node) => *node == Some(name),
            Self::None => false,
        }
    }
}

/// Longest a Node lookup may take before the claim is refused as unavailable.
const NODE_LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Most names or addresses a refusal lists of what the credential proves.
const LISTED: usize = 8;

/// Applies `--agent-identity-binding` to agent streams.
#[derive(Debug)]
pub(crate) struct Binding {
    policy: IdentityBinding,
    /// Where token agents' Node addresses are read; `None` refuses their address claims.
    nodes: Option<Arc<dyn NodeAddresses>>,
    metrics: LimitMetrics,
    warn: WarnLimit,
}

/// A refused claim, before it is logged and counted.
struct Refusal(Status);

impl Binding {
    pub(crate) fn new(
        policy: IdentityBinding,
        nodes: Option<Arc<dyn NodeAddresses>>,
        metrics: LimitMetrics,
    ) -> Self {
        Self {
            policy,
            nodes,
            metrics,
            warn: WarnLimit::new(Duration::from_secs(1)),
        }
    }

    /// Checks that `credential` proves what the policy requires of `agent_id` and
    /// `identifiers`; the refusal (logged at most once a second, and counted) otherwise.
    pub(crate) async fn check(
        &self,
        agent_id: &str,
        identifiers: &Identifiers,
        credential: Credential<'_>,
        peer: &PeerIdentity,
    ) -> Result<(), Status> {
        let result = match self.policy {
            IdentityBinding::Off => Ok(()),
            IdentityBinding::Identifiers => self.identifiers(identifiers, credential).await,
            IdentityBinding::All => match agent_id_proof(agent_id, credential) {
                Ok(()) => self.identifiers(identifiers, credential).await,
                Err(refusal) => Err(refusal),
            },
        };
        result.map_err(|Refusal(status)| {
            self.metrics.hit(Limit::AgentIdentity);
            if let Some(suppressed) = self.warn.allow() {
                tracing::warn!(
                    agent.id = %LogText(agent_id),
                    peer = peer.addr.map(tracing::field::display),
                    suppressed,
                    "refusing agent stream: {}",
                    status.message
                );
            }
            status
        })
    }

    async fn identifiers(
        &self,
        identifiers: &Identifiers,
        credential: Credential<'_>,
    ) -> Result<(), Refusal> {
        for host in &identifiers.hosts {
            host_proof(host, credential)?;
        }
        let ips = identifiers.ipv4.iter().chain(&identifiers.ipv6);
        let claimed: Vec<(&String, Option<IpAddr>)> =
            ips.map(|text| (text, text.parse().ok())).collect();
        if claimed.is_empty() {
            return Ok(());
        }
        let node_addresses = match credential {
            Credential::Token(Some(node)) => Some(self.node_addresses(node, &claimed).await?),
            _ => None,
        };
        for (text, ip) in claimed {
            let proven = match (credential, ip, &node_addresses) {
                (_, None, _) => false,
                (Credential::Certificate(names), Some(ip), _) => names.has_ip(ip),
                (Credential::Token(_), Some(ip), Some(addresses)) => addresses.contains(&ip),
                _ => false,
            };
            if !proven {
                return Err(denied(format!(
                    "agent identifier {} is not proven by {}",
                    claim_text(identifiers, text),
                    proves(credential, node_addresses.as_deref())
                )));
            }
        }
        Ok(())
    }

    /// The addresses of `node`, or the refusal that names what to grant or check.
    async fn node_addresses(
        &self,
        node: &str,
        claimed: &[(&String, Option<IpAddr>)],
    ) -> Result<Vec<IpAddr>, Refusal> {
        let first = claimed.first().map_or("", |(text, _)| text.as_str());
        let Some(nodes) = &self.nodes else {
            return Err(Refusal(Status::new(
                Code::UNAVAILABLE,
                format!(
                    "cannot check the agent's address identifier {} against node {}: this \
                     server does not read Node objects; {OFF_ALLOWS}",
                    LogText(first),
                    LogText(node)
                ),
            )));
        };
        let lookup = tokio::time::timeout(NODE_LOOKUP_TIMEOUT, nodes.addresses(node)).await;
        match lookup {
            Ok(Ok(addresses)) => Ok(addresses),
            Ok(Err(NodeLookupError::NotFound)) => Err(denied(format!(
                "agent identifier {} is not proven: the token is bound to node {}, which has \
                 no Node object",
                LogText(first),
                LogText(node)
            ))),
            Ok(Err(NodeLookupError::Unavailable(why))) => Err(Refusal(Status::new(
                Code::UNAVAILABLE,
                format!(
                    "cannot check the agent's address identifier {} against node {}: {why}; \
                     {OFF_ALLOWS}",
                    LogText(first),
                    LogText(node)
                ),
            ))),
            Err(_) => Err(Refusal(Status::new(
                Code::UNAVAILABLE,
                format!(
                    "cannot check the agent's address identifier {} against node {}: reading \
                     the Node took longer than {NODE_LOOKUP_TIMEOUT:?}; {OFF_ALLOWS}",
                    LogText(first),
                    LogText(node)
                ),
            ))),
        }
    }
}

/// The end of every refusal: the flag that routes by self-declared identity.
const OFF_ALLOWS: &str = "--agent-identity-binding=off routes by self-declared identifiers \
    (any agent credential may then claim any node)";

fn denied(what: String) -> Refusal {
    Refusal(Status::new(
        Code::PERMISSION_DENIED,
        format!("{what}; {OFF_ALLOWS}"),
    ))
}

/// `ipv4=X` or `ipv6=X`, as the agent sent it.
fn claim_text(identifiers: &Identifiers, text: &str) -> String {
    let key = if identifiers.ipv4.iter().any(|ip| ip == text) {
        "ipv4"
    } else {
        "ipv6"
    };
    format!("{key}={}", LogText(text))
}

fn host_proof(host: &str, credential: Credential<'_>) -> Result<(), Refusal> {
    if credential.proves_name(host) {
        return Ok(());
    }
    Err(denied(format!(
        "agent identifier host={} is not proven by {}",
        LogText(host),
        proves(credential, None)
    )))
}

/// `--agent-identity-binding=all`: the agent ID is the credential's own name.
fn agent_id_proof(agent_id: &str, credential: Credential<'_>) -> Result<(), Refusal> {
    if credential.proves_name(agent_id) {
        return Ok(());
    }
    Err(Refusal(Status::new(
        Code::PERMISSION_DENIED,
        format!(
            "agent ID {} is not proven by {}; --agent-identity-binding=identifiers does not \
             require the agent ID to be proven",
            LogText(agent_id),
            proves(credential, None)
        ),
    )))
}

/// What the credential proves, for a refusal: its names (and addresses), bounded.
fn proves(credential: Credential<'_>, node_addresses: Option<&[IpAddr]>) -> String {
    match credential {
        Credential::Certificate(names) => {
            let listed: Vec<String> = names
                .common_name
                .iter()
                .map(|cn| format!("CN {}", LogText(cn)))
                .chain(names.dns.iter().map(|d| format!("DNS {}", LogText(d))))
                .chain(names.uris.iter().map(|u| format!("URI {}", LogText(u))))
                .chain(names.ips.iter().map(|ip| format!("IP {ip}")))
                .collect();
            format!("the client certificate, which names {}", list(&listed))
        }
        Credential::Token(Some(node)) => match node_addresses {
            Some(addresses) => {
                let listed: Vec<String> = addresses.iter().map(IpAddr::to_string).collect();
                format!(
                    "the agent's token, bound to node {} with addresses {}",
                    LogText(node),
                    list(&listed)
                )
            }
            None => format!("the agent's token, bound to node {}", LogText(node)),
        },
        Credential::Token(None) => "the agent's token, which is bound to no node (a token \
            projected into a pod names its node; a legacy Secret token or `kubectl create \
            token` without --bound-object-kind=Pod does not)"
            .into(),
        Credential::None => {
            "any credential: the agent presented no client certificate or token".into()
        }
    }
}

/// At most [`LISTED`] entries, then how many more.
fn list(entries: &[String]) -> String {
    if entries.is_empty() {
        return "nothing".into();
    }
    let shown = entries[..entries.len().min(LISTED)].join(", ");
    match entries.len().saturating_sub(LISTED) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tether_grpc::PeerTransport;

    use super::*;

    fn names(cn: &str, dns: &[&str], ips: &[&str]) -> CertificateNames {
        CertificateNames {
            common_name: Some(cn.into()),
            dns: dns.iter().map(|d| (*d).into()).collect(),
            ips: ips.iter().map(|i| i.parse().unwrap()).collect(),
            uris: vec![],
        }
    }

    fn peer(names: Option<CertificateNames>) -> PeerIdentity {
        PeerIdentity {
            transport: PeerTransport::Tls,
            addr: None,
            certificate: names,
            unix: None,
        }
    }

    /// Node objects as a table; a missing node is `NotFound`, `"down"` is unavailable.
    #[derive(Debug, Default)]
    struct Nodes(HashMap<&'static str, Vec<&'static str>>);

    impl NodeAddresses for Nodes {
        fn addresses<'a>(&'a self, node: &'a str) -> NodeFuture<'a> {
            Box::pin(async move {
                if node == "down" {
                    return Err(NodeLookupError::Unavailable("grant get on nodes".into()));
                }
                let addresses = self.0.get(node).ok_or(NodeLookupError::NotFound)?;
                Ok(addresses.iter().map(|a| a.parse().unwrap()).collect())
            })
        }
    }

    fn binding(policy: IdentityBinding) -> Binding {
        let nodes = Nodes(HashMap::from([
            ("node-1", vec!["10.0.0.1", "fd00::1"]),
            ("node-2", vec!["10.0.0.2"]),
        ]));
        let registry = tether_observe::metrics::Registry::new();
        Binding::new(
            policy,
            Some(Arc::new(nodes)),
            LimitMetrics::register(&registry),
        )
    }

    fn ids(query: &str) -> Identifiers {
        Identifiers::parse(query).unwrap()
    }

    async fn check(b: &Binding, id: &str, q: &str, credential: Credential<'_>) -> Option<Status> {
        b.check(id, &ids(q), credential, &peer(None)).await.err()
    }

    #[tokio::test]
    async fn certificates_prove_hosts_by_name_and_addresses_by_ip_san() {
        let b = binding(IdentityBinding::default());
        let node1 = names("node-1", &["node-1.example"], &["10.0.0.1"]);
        let cert = Credential::Certificate(&node1);
        let q = "host=node-1&host=node-1.example&ipv4=10.0.0.1";
        assert!(check(&b, "any-id", q, cert).await.is_none());
        for q in [
            "host=node-2",
            "ipv4=10.0.0.2",
            "ipv6=fd00::1",
            "ipv4=not-an-ip",
        ] {
            let err = check(&b, "node-1", q, cert).await.expect(q);
            assert_eq!(err.code, Code::PERMISSION_DENIED, "{q}: {err}");
            assert!(err.message.contains(q), "{q}: {err}");
            assert!(
                err.message
                    .contains("CN node-1, DNS node-1.example, IP 10.0.0.1")
            );
            assert!(
                err.message.contains("--agent-identity-binding=off"),
                "{err}"
            );
        }
    }

    #[tokio::test]
    async fn tokens_prove_their_node_and_its_addresses() {
        let b = binding(IdentityBinding::Identifiers);
        let on = |node| Credential::Token(Some(node));
        let q = "host=node-1&ipv4=10.0.0.1&ipv6=fd00::1";
        assert!(check(&b, "x", q, on("node-1")).await.is_none());
        for (node, q, says) in [
            ("node-2", "host=node-1", "bound to node node-2"),
            ("node-2", "ipv4=10.0.0.1", "node-2 with addresses 10.0.0.2"),
            (
                "node-1",
                "ipv4=10.0.0.2",
                "node-1 with addresses 10.0.0.1, fd00::1",
            ),
            ("gone", "ipv4=10.0.0.1", "no Node object"),
        ] {
            let err = check(&b, "x", q, on(node)).await.expect(q);
            assert_eq!(err.code, Code::PERMISSION_DENIED, "{q}: {err}");
            assert!(err.message.contains(says), "{q}: {err}");
        }
        let err = check(&b, "x", "host=node-1", Credential::Token(None))
            .await
            .unwrap();
        assert!(err.message.contains("bound to no node"), "{err}");
        let err = check(&b, "x", "ipv4=10.0.0.9", on("down")).await.unwrap();
        assert_eq!(err.code, Code::UNAVAILABLE, "{err}");
        assert!(err.message.contains("grant get on nodes"), "{err}");
        // Without address claims no Node is read.
        assert!(check(&b, "x", "host=down", on("down")).await.is_none());
    }

    #[tokio::test]
    async fn without_a_node_reader_token_addresses_are_unavailable() {
        let registry = tether_observe::metrics::Registry::new();
        let b = Binding::new(
            IdentityBinding::Identifiers,
            None,
            LimitMetrics::register(&registry),
        );
        let err = check(&b, "x", "ipv4=10.0.0.1", Credential::Token(Some("node-1")))
            .await
            .unwrap();
        assert_eq!(err.code, Code::UNAVAILABLE, "{err}");
    }

    #[tokio::test]
    async fn no_credential_proves_nothing_and_off_checks_nothing() {
        let b = binding(IdentityBinding::Identifiers);
        let err = check(&b, "x", "ipv4=10.0.0.1", Credential::None)
            .await
            .unwrap();
        assert!(
            err.message.contains("no client certificate or token"),
            "{err}"
        );
        assert!(check(&b, "x", "", Credential::None).await.is_none());
        let off = binding(IdentityBinding::Off);
        assert!(
            check(&off, "x", "host=a&ipv4=10.9.9.9", Credential::None)
                .await
                .is_none()
        );
    }

    #[tokio::test]
    async fn all_also_requires_the_agent_id() {
        let b = binding(IdentityBinding::All);
        let node1 = names("node-1", &[], &[]);
        assert!(
            check(&b, "node-1", "", Credential::Certificate(&node1))
                .await
                .is_none()
        );
        assert!(
            check(&b, "node-1", "", Credential::Token(Some("node-1")))
                .await
                .is_none()
        );
        for credential in [
            Credential::Certificate(&node1),
            Credential::Token(Some("node-1")),
            Credential::None,
        ] {
            let err = check(&b, "node-2", "", credential).await.unwrap();
            assert_eq!(err.code, Code::PERMISSION_DENIED, "{err}");
            assert!(err.message.contains("agent ID node-2"), "{err}");
        }
        let identifiers = binding(IdentityBinding::Identifiers);
        assert!(
            check(&identifiers, "node-2", "", Credential::Certificate(&node1))
                .await
                .is_none()
        );
    }

    #[test]
    fn long_name_lists_are_bounded() {
        let many: Vec<String> = (0..100).map(|i| format!("n{i}")).collect();
        let text = list(&many);
        assert!(text.ends_with("n7 and 92 more"), "{text}");
        assert_eq!(list(&[]), "nothing");
    }

    #[test]
    fn the_flag_values_parse() {
        for value in ["off", "identifiers", "all"] {
            assert_eq!(value.parse::<IdentityBinding>().unwrap().as_str(), value);
        }
        assert!("on".parse::<IdentityBinding>().is_err());
        assert_eq!(IdentityBinding::default(), IdentityBinding::Identifiers);
    }
}
