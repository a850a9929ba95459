//! Destination policy per frontend client: which destinations each client may ask any agent
//! for, checked before an agent is chosen, so a denied request never reaches one.
//!
//! The routing file's `destinations` entries each list client identities (`cert:NAME`,
//! `uid:N`, the identities tenancy uses) and tether-policy rules. The server never resolves
//! names: IP literals are matched by `to` blocks and names by `name` suffixes
//! ([`RuleSet::check_requested`]); the agent's own policy still checks every resolved
//! address of what gets through. Without entries nothing is checked (upstream's behaviour);
//! with them, a client that no entry lists is refused (fail closed, as tenancy).

use std::sync::Arc;
use std::time::Duration;

use tether_grpc::PeerIdentity;
use tether_observe::metrics::{CounterVec, Registry as Metrics};
use tether_policy::RuleSet;

use crate::identity::{Identity, Proof};
use crate::metrics::{DialFailure, ServerMetrics};
use crate::request::RequestContext;
use crate::warn_limit::WarnLimit;

/// Most entries a routing file may declare: bounds the `policy` label's cardinality.
pub const MAX_DESTINATION_POLICIES: usize = 10_000;

/// One `destinations` entry: the rules for the frontend clients it lists.
#[derive(Clone, Debug, PartialEq)]
pub struct DestinationPolicyConfig {
    /// The `policy` label and the name refusals give.
    pub name: String,
    pub clients: Vec<Identity>,
    pub rules: RuleSet,
}

/// Why a request was refused: the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Refusal {
    /// A rule of the client's policy, or its implicit deny.
    Rule,
    /// Policies are configured and none lists the client.
    NoPolicy,
    /// More than one entry lists one of the client's names.
    Ambiguous,
}

impl Refusal {
    fn label(self) -> &'static str {
        match self {
            Self::Rule => "rule",
            Self::NoPolicy => "no_policy",
            Self::Ambiguous => "ambiguous",
        }
    }
}

/// The policies at run time.
#[derive(Debug)]
pub(crate) struct DestinationPolicies {
    /// Empty: no server-side policy.
    entries: Vec<DestinationPolicyConfig>,
    refusals: Arc<CounterVec>,
    server: Arc<ServerMetrics>,
    /// A client can ask for denied destinations at will: one log line a second at most.
    log: WarnLimit,
}

impl DestinationPolicies {
    pub(crate) fn new(
        entries: &[DestinationPolicyConfig],
        metrics: &Metrics,
        server: Arc<ServerMetrics>,
    ) -> Self {
        Self {
            entries: entries.to_vec(),
            refusals: metrics.counter_vec(
                "tether_server_destination_policy_refusals_total",
                "Dials the server's destination policy refused before choosing an agent, by policy and reason (rule, no_policy, ambiguous)",
                &["policy", "reason"],
            ),
            server,
            log: WarnLimit::new(Duration::from_secs(1)),
        }
    }

    /// The policies of another generation of the routing file, counted in the same series.
    pub(crate) fn next(&self, entries: &[DestinationPolicyConfig]) -> Self {
        Self {
            entries: entries.to_vec(),
            refusals: self.refusals.clone(),
            server: self.server.clone(),
            log: WarnLimit::new(Duration::from_secs(1)),
        }
    }

    /// Whether these are the policies `entries` declare.
    pub(crate) fn same_as(&self, entries: &[DestinationPolicyConfig]) -> bool {
        self.entries == entries
    }

    /// `Ok` when `request`'s client may ask for its address; otherwise counts and logs the
    /// refusal and returns its text for the client.
    pub(crate) fn check(&self, request: &RequestContext) -> Result<(), String> {
        if self.entries.is_empty() {
            return Ok(());
        }
        let (policy, refusal, text) = match self.judge(&request.peer, &request.address) {
            Ok(()) => return Ok(()),
            Err(refused) => refused,
        };
        self.refusals.with(&[policy, refusal.label()]).inc();
        self.server.dial_failure(DialFailure::Policy);
        if let Some(suppressed) = self.log.allow() {
            tracing::info!(
                dial.id = %request.dial_id,
                frontend = request.frontend.as_str(),
                peer = %request.peer.principal(),
                address = %tether_grpc::LogText(&request.address),
                policy,
                reason = %text,
                suppressed,
                "dial refused by destination policy"
            );
        }
        Err(text)
    }

    /// The decision without side effects: the refusing policy's name ("" when none
    /// applies), the reason label and the text.
    fn judge(&self, peer: &PeerIdentity, address: &str) -> Result<(), (&str, Refusal, String)> {
        let mut listing = self.entries.iter().filter(|entry| {
            entry
                .clients
                .iter()
                .any(|id| id.matches(&Proof::peer(peer)))
        });
        let entry = match (listing.next(), listing.next()) {
            (Some(entry), None) => entry,
            (None, _) => {
                return Err((
                    "",
                    Refusal::NoPolicy,
                    format!(
                        "policy: client identity {} has no destination policy on this server",
                        peer.principal()
                    ),
                ));
            }
            (Some(a), Some(b)) => {
                return Err((
                    "",
                    Refusal::Ambiguous,
                    format!(
                        "policy: client identity {} matches destination policies {:?} and {:?}; refusing rather than guessing",
                        peer.principal(),
                        a.name,
                        b.name
                    ),
                ));
            }
        };
        // The frontend already checked the address: `host:port` or `[ipv6]:port`.
        let checked = match address.rsplit_once(':') {
            Some((host, port)) => match port.parse::<u16>() {
                Ok(port) => entry.rules.check_requested(host, port),
                Err(_) => entry.rules.check_requested(address, 0),
            },
            None => entry.rules.check_requested(address, 0),
        };
        checked.map_err(|denied| {
            (
                entry.name.as_str(),
                Refusal::Rule,
                format!(
                    "policy: {} denied by server policy {:?} ({})",
                    denied.destination, entry.name, denied.rule
                ),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use tether_grpc::{PeerTransport, UnixCredentials};

    use super::*;
    use crate::routing::RoutingConfig;
    use crate::tenant::tests::cert;

    fn policies(yaml: &str) -> DestinationPolicies {
        let routing = RoutingConfig::from_yaml(yaml).unwrap();
        let metrics = Metrics::new();
        let server = Arc::new(ServerMetrics::register(&metrics));
        DestinationPolicies::new(&routing.destinations, &metrics, server)
    }

    const TWO: &str = "destinations:
  - name: kubelets
    clients: [\"cert:api.a\"]
    rules:
      - allow to 10.0.0.0/8,fd00::/8 port 10250
      - allow name nodes.example port 10250
      - deny all
  - name: local
    clients: [\"uid:1001\"]
    rules:
      - deny to 169.254.0.0/16
      - allow all
";

    #[test]
    fn each_client_gets_its_own_rules_and_the_reason_names_policy_and_line() {
        let p = policies(TWO);
        let api = cert(&["api.a"]);
        assert!(p.judge(&api, "10.1.2.3:10250").is_ok());
        assert!(p.judge(&api, "[fd00::1]:10250").is_ok());
        assert!(p.judge(&api, "n1.Nodes.Example:10250").is_ok());
        let (policy, refusal, text) = p.judge(&api, "10.1.2.3:2379").unwrap_err();
        assert_eq!((policy, refusal), ("kubelets", Refusal::Rule));
        assert_eq!(
            text,
            "policy: 10.1.2.3:2379 denied by server policy \"kubelets\" (line 7: deny all)"
        );
        let (_, _, text) = p.judge(&api, "[::ffff:169.254.169.254]:10250").unwrap_err();
        assert!(text.contains("line 7"), "{text}");

        let unix = PeerIdentity {
            transport: PeerTransport::Unix,
            addr: None,
            certificate: None,
            unix: Some(UnixCredentials {
                uid: 1001,
                gid: 0,
                pid: None,
            }),
        };
        assert!(p.judge(&unix, "10.1.2.3:2379").is_ok());
        let (policy, _, text) = p.judge(&unix, "169.254.169.254:80").unwrap_err();
        assert_eq!(policy, "local");
        assert!(text.contains("(line 11: deny to 169.254.0.0/16)"), "{text}");
    }

    #[test]
    fn unlisted_and_ambiguous_clients_are_refused_and_no_policy_checks_nothing() {
        let p = policies(TWO);
        let (policy, refusal, text) = p.judge(&cert(&["other"]), "10.1.2.3:10250").unwrap_err();
        assert_eq!((policy, refusal), ("", Refusal::NoPolicy));
        assert!(text.contains("has no destination policy"), "{text}");
        let p = policies(
            "destinations:
  - {name: a, clients: [\"cert:x\"], rules: [allow all]}
  - {name: b, clients: [\"cert:y\"], rules: [allow all]}
",
        );
        let (_, refusal, text) = p.judge(&cert(&["x", "y"]), "10.0.0.1:80").unwrap_err();
        assert_eq!(refusal, Refusal::Ambiguous);
        assert!(text.contains("\"a\" and \"b\""), "{text}");
        let none = policies("{}");
        let request = RequestContext::to("169.254.169.254:80");
        assert!(none.check(&request).is_ok());
    }

    #[test]
    fn refusals_are_counted_by_policy_and_reason() {
        let routing = RoutingConfig::from_yaml(TWO).unwrap();
        let metrics = Metrics::new();
        let server = Arc::new(ServerMetrics::register(&metrics));
        let p = DestinationPolicies::new(&routing.destinations, &metrics, server);
        // `RequestContext::to` comes from a peer that proved nothing: no policy lists it.
        assert!(p.check(&RequestContext::to("10.0.0.1:10250")).is_err());
        let text = metrics.render();
        assert!(
            text.contains(
                "tether_server_destination_policy_refusals_total{policy=\"\",reason=\"no_policy\"} 1"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "konnectivity_network_proxy_server_dial_failure_count{reason=\"policy\"} 1"
            ),
            "{text}"
        );
    }
}
