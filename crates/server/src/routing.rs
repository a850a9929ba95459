//! The routing file (`--routing-config`): the destination topology, client affinity and
//! outlier ejection. YAML, validated as a whole at start-up, so a typo stops the server with
//! the field's name instead of routing silently differently.
//!
//! ```yaml
//! zones:
//!   - zone: eu-1a
//!     region: eu-1
//!     cidrs: ["10.1.0.0/16", "fd00:1::/64"]
//! affinity: client          # or none (the default)
//! ejection:
//!   consecutive_failures: 5 # 0 disables ejection
//!   base_seconds: 10
//!   max_seconds: 300
//! bandwidth:                # the server's, shared by busy tenants by weight
//!   bytes_per_second: 1073741824
//! tenants:                  # absent: one implicit tenant, as upstream
//!   - name: acme
//!     clients: ["cert:apiserver.acme", "uid:1001"]
//!     agents: ["cert:agent.acme"]
//!     weight: 3             # 3 shares of bandwidth to 1 for each weightless tenant
//!     limits: {connections: 1000, pending_dials: 100, dials_per_second: 50,
//!              bytes_per_second: 104857600}  # both directions, all connections
//!   - name: initech          # its own socket, gated by its file mode
//!     frontend: {unix: /run/tether/initech.sock}
//!     agents: ["sa:initech"]  # ServiceAccounts of namespace initech (token authentication)
//!     control_plane_endpoints: ["10.0.2.10:6443"]  # its agents' reverse dials (absent: the
//!                                                  # server's list; []: none)
//!   - name: hooli            # its own TCP port: clients of its own CA, with these names
//!     clients: ["cert:apiserver.hooli"]
//!     frontend: {tcp: "0.0.0.0:8132", client_ca: /etc/tether/hooli-ca.crt}
//!     agents: ["cert:agent.hooli"]
//! destinations:             # absent: no destination policy on the server, as upstream
//!   - name: kubelets
//!     clients: ["cert:apiserver.acme"]
//!     rules:                # tether-policy's rules, one per item; errors name the line
//!       - allow to 10.0.0.0/8 port 10250
//!       - deny all
//! ```

use std::time::Duration;

use serde::Deserialize;
use tether_policy::Cidr;

pub use crate::backend::outlier::EjectionConfig;
use crate::backend::selection::SelectionConfig;
pub use crate::backend::selection::ZoneRule;
pub use crate::destinations::{DestinationPolicyConfig, MAX_DESTINATION_POLICIES};
pub use crate::identity::Identity;
pub use crate::tenant_config::{MAX_TENANTS, TenantConfig, TenantLimits};
use crate::tenant_frontend;
pub use crate::tenant_frontend::TenantFrontend;

/// A tenant's weight when the file gives none.
const DEFAULT_WEIGHT: u32 = 1;
/// The largest weight: shares stay within three orders of magnitude of each other.
const MAX_WEIGHT: u32 = 1000;

/// Selection settings beyond `--proxy-strategies`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RoutingConfig {
    /// CIDR → zone rules; the longest matching prefix wins.
    pub zone_rules: Vec<ZoneRule>,
    /// Keep each client (by its proven identity) on one agent while that agent stays.
    pub client_affinity: bool,
    pub ejection: EjectionConfig,
    /// The server's bytes/s over all tenants, split among the busy ones by weight; `None`
    /// leaves the split to the machine.
    pub bandwidth: Option<u64>,
    /// Empty: every peer is in one implicit tenant without limits.
    pub tenants: Vec<TenantConfig>,
    /// Destination rules per frontend client, checked before any agent is chosen. Empty:
    /// the server lets every client ask for any destination (upstream's behaviour).
    pub destinations: Vec<DestinationPolicyConfig>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    zones: Vec<ZoneEntry>,
    #[serde(default)]
    affinity: Option<String>,
    #[serde(default)]
    ejection: Option<EjectionEntry>,
    #[serde(default)]
    bandwidth: Option<BandwidthEntry>,
    #[serde(default)]
    tenants: Vec<TenantEntry>,
    #[serde(default)]
    destinations: Vec<DestinationEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BandwidthEntry {
    bytes_per_second: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DestinationEntry {
    name: String,
    clients: Vec<String>,
    /// Each rule with its place in the file, so errors and denials name the line.
    rules: Vec<serde_saphyr::Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TenantEntry {
    name: String,
    #[serde(default)]
    clients: Vec<String>,
    agents: Vec<String>,
    #[serde(default)]
    limits: Option<LimitsEntry>,
    #[serde(default)]
    frontend: Option<FrontendEntry>,
    #[serde(default)]
    weight: Option<u32>,
    #[serde(default)]
    control_plane_endpoints: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FrontendEntry {
    unix: Option<String>,
    tcp: Option<String>,
    client_ca: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsEntry {
    connections: Option<u64>,
    pending_dials: Option<u64>,
    dials_per_second: Option<f64>,
    bytes_per_second: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ZoneEntry {
    zone: String,
    #[serde(default)]
    region: Option<String>,
    cidrs: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EjectionEntry {
    consecutive_failures: u32,
    base_seconds: f64,
    max_seconds: f64,
}

impl RoutingConfig {
    /// The settings tether's strategies read, which every tenant's registry shares.
    pub(crate) fn selection(&self) -> SelectionConfig {
        SelectionConfig {
            zone_rules: self.zone_rules.clone(),
            client_affinity: self.client_affinity,
        }
    }

    /// Parses and validates a routing file's text; errors name the entry at fault.
    pub fn from_yaml(text: &str) -> Result<Self, String> {
        // serde_saphyr starts its text with "error: ", which the caller's own prefix repeats.
        let file: File = serde_saphyr::from_str(text).map_err(|e| {
            let text = e.to_string();
            text.strip_prefix("error: ")
                .map_or(text.clone(), str::to_owned)
        })?;
        let mut zone_rules = Vec::new();
        for (n, entry) in file.zones.into_iter().enumerate() {
            let at = || format!("zones[{n}] ({:?})", entry.zone);
            if entry.zone.is_empty() {
                return Err(format!("zones[{n}]: zone must not be empty"));
            }
            if entry.cidrs.is_empty() {
                return Err(format!("{}: cidrs must list at least one block", at()));
            }
            for text in &entry.cidrs {
                let cidr = Cidr::parse(text).map_err(|e| format!("{}: {e}", at()))?;
                if let Some(other) = zone_rules.iter().find(|r: &&ZoneRule| r.cidr == cidr) {
                    return Err(format!(
                        "{}: {cidr} is already mapped to zone {:?}",
                        at(),
                        other.zone
                    ));
                }
                zone_rules.push(ZoneRule {
                    cidr,
                    zone: entry.zone.clone(),
                    region: entry.region.clone(),
                });
            }
        }
        let client_affinity = match file.affinity.as_deref() {
            None | Some("none") => false,
            Some("client") => true,
            Some(other) => {
                return Err(format!(
                    "affinity: expected \"client\" or \"none\", got {other:?}"
                ));
            }
        };
        let ejection = match file.ejection {
            None => EjectionConfig::default(),
            Some(e) => {
                let seconds = |what: &str, s: f64| {
                    Duration::try_from_secs_f64(s)
                        .ok()
                        .filter(|d| !d.is_zero())
                        .ok_or_else(|| {
                            format!(
                                "ejection.{what}: expected a positive number of seconds, got {s}"
                            )
                        })
                };
                let base = seconds("base_seconds", e.base_seconds)?;
                let max = seconds("max_seconds", e.max_seconds)?;
                if max < base {
                    return Err("ejection.max_seconds must not be less than base_seconds".into());
                }
                EjectionConfig {
                    consecutive_failures: e.consecutive_failures,
                    base_ejection: base,
                    max_ejection: max,
                }
            }
        };
        let bandwidth = match file.bandwidth {
            Some(BandwidthEntry {
                bytes_per_second: 0,
            }) => {
                return Err(
                    "bandwidth.bytes_per_second must be positive (leave bandwidth out for none)"
                        .into(),
                );
            }
            b => b.map(|b| b.bytes_per_second),
        };
        let tenants = tenants(file.tenants)?;
        if bandwidth.is_none()
            && let Some(t) = tenants.iter().find(|t| t.weight != DEFAULT_WEIGHT)
        {
            return Err(format!(
                "tenant {:?}: weight shares the server's bandwidth, which is not set: add bandwidth.bytes_per_second",
                t.name
            ));
        }
        Ok(Self {
            zone_rules,
            client_affinity,
            ejection,
            bandwidth,
            tenants,
            destinations: destinations(file.destinations)?,
        })
    }
}

/// The longest tenant (or other) name the routing file takes: it is a metric label.
pub(crate) const MAX_NAME_BYTES: usize = 63;

/// A name fit for a metric label: 1 to 63 letters, digits, `-`, `_` or `.`.
fn label_safe(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Validates the tenant table: unique names, identities in at most one tenant per side.
fn tenants(entries: Vec<TenantEntry>) -> Result<Vec<TenantConfig>, String> {
    if entries.len() > MAX_TENANTS {
        return Err(format!(
            "tenants: {} entries, more than the {MAX_TENANTS} allowed",
            entries.len()
        ));
    }
    let mut out: Vec<TenantConfig> = Vec::new();
    let mut owners: std::collections::HashMap<(bool, Identity), String> = Default::default();
    for (n, entry) in entries.into_iter().enumerate() {
        let at = format!("tenants[{n}] ({:?})", entry.name);
        if !label_safe(&entry.name) {
            return Err(format!(
                "{at}: name must be 1 to 63 letters, digits, '-', '_' or '.'"
            ));
        }
        if out.iter().any(|t| t.name == entry.name) {
            return Err(format!("{at}: the name is used twice"));
        }
        let frontend = entry
            .frontend
            .map(|f| {
                TenantFrontend::parse(f.unix.as_deref(), f.tcp.as_deref(), f.client_ca.as_deref())
            })
            .transpose()
            .map_err(|e| format!("{at}: {e}"))?;
        if let Some(frontend) = &frontend {
            check_frontend_is_its_own(&at, frontend, &out)?;
        }
        let mut parse = |side: &str, is_agent: bool, list: &[String]| {
            // A tenant with its own frontend may have no client identities: the socket is
            // the identity.
            if list.is_empty() && !(side == "clients" && frontend.is_some()) {
                let or = if is_agent {
                    ""
                } else {
                    ", or the tenant its own frontend"
                };
                return Err(format!("{at}: {side} must list at least one identity{or}"));
            }
            list.iter()
                .map(|text| {
                    let id = Identity::parse(text).map_err(|e| format!("{at}: {side}: {e}"))?;
                    if let Identity::ServiceAccount { namespace, name } = &id {
                        if !is_agent {
                            return Err(format!(
                                "{at}: {side}: {text}: sa: identities are agents' (their tokens)"
                            ));
                        }
                        // sa:NS covers every sa:NS:NAME: one agent would match two tenants.
                        let covering = out.iter().find(|t| {
                            t.agents.iter().any(|other| match other {
                                Identity::ServiceAccount {
                                    namespace: ns,
                                    name: n,
                                } => ns == namespace && (n.is_none() || name.is_none() || n == name),
                                _ => false,
                            })
                        });
                        if let Some(other) = covering {
                            return Err(format!(
                                "{at}: {side}: {text} overlaps an sa: identity of tenant {:?}; an agent belongs to one tenant",
                                other.name
                            ));
                        }
                    }
                    if let Some(other) = owners.insert((is_agent, id.clone()), entry.name.clone())
                    {
                        return Err(format!(
                            "{at}: {side}: {text} is already in tenant {other:?}; an identity belongs to one tenant"
                        ));
                    }
                    Ok(id)
                })
                .collect::<Result<Vec<_>, String>>()
        };
        let clients = parse("clients", false, &entry.clients)?;
        let agents = parse("agents", true, &entry.agents)?;
        if let Some(frontend) = &frontend {
            check_tcp_frontend_has_identities(&at, frontend, &clients)?;
        }
        let limits = match entry.limits {
            None => TenantLimits::default(),
            Some(l) => {
                if l.dials_per_second
                    .is_some_and(|r| !(r.is_finite() && r > 0.0))
                {
                    return Err(format!("{at}: limits.dials_per_second must be positive"));
                }
                if l.bytes_per_second == Some(0) {
                    return Err(format!(
                        "{at}: limits.bytes_per_second must be positive (leave it out for no limit)"
                    ));
                }
                TenantLimits {
                    connections: l.connections,
                    pending_dials: l.pending_dials,
                    dials_per_second: l.dials_per_second,
                    bytes_per_second: l.bytes_per_second,
                }
            }
        };
        let weight = match entry.weight {
            None => DEFAULT_WEIGHT,
            Some(w @ 1..=MAX_WEIGHT) => w,
            Some(w) => return Err(format!("{at}: weight must be 1 to {MAX_WEIGHT}, got {w}")),
        };
        if let Some(list) = &entry.control_plane_endpoints {
            crate::ControlPlaneEndpoints::parse(list.iter().map(String::as_str))
                .map_err(|e| format!("{at}: control_plane_endpoints: {e}"))?;
        }
        out.push(TenantConfig {
            name: entry.name,
            clients,
            agents,
            limits,
            frontend,
            weight,
            control_plane_endpoints: entry.control_plane_endpoints,
        });
    }
    Ok(out)
}

/// Refuses a tenant frontend that shares a socket or a port with an earlier tenant's.
fn check_frontend_is_its_own(
    at: &str,
    frontend: &TenantFrontend,
    earlier: &[TenantConfig],
) -> Result<(), String> {
    for other in earlier {
        let Some(theirs) = &other.frontend else {
            continue;
        };
        if let (Some(a), Some(b)) = (&frontend.unix, &theirs.unix)
            && tenant_frontend::unix_overlaps(a, b)
        {
            return Err(format!(
                "{at}: frontend.unix {} is already tenant {:?}'s socket",
                a.display(),
                other.name
            ));
        }
        if let (Some(a), Some(b)) = (frontend.tcp, theirs.tcp)
            && tether_observe::http::tcp_overlaps(a, b)
        {
            return Err(format!(
                "{at}: frontend.tcp {a} overlaps tenant {:?}'s {b}",
                other.name
            ));
        }
    }
    Ok(())
}

/// Refuses a tenant's TCP frontend that could not tell the tenant's clients from others:
/// the main frontend's CA signs every tenant's client certificates, so without `cert:`
/// client identities or a CA of the tenant's own, any of them would be the tenant's.
fn check_tcp_frontend_has_identities(
    at: &str,
    frontend: &TenantFrontend,
    clients: &[Identity],
) -> Result<(), String> {
    let has_names = clients.iter().any(|id| matches!(id, Identity::CertName(_)));
    match frontend.tcp {
        Some(addr) if !has_names && frontend.client_ca.is_none() => Err(format!(
            "{at}: frontend.tcp {addr} would admit every client certificate of the main \
             frontend's CA: add the tenant's client certificate names to clients \
             (\"cert:NAME\", the CN or a DNS/URI SAN), or a CA of the tenant's own as \
             frontend.client_ca"
        )),
        _ => Ok(()),
    }
}

/// Validates the destination policies: unique names, each client identity in at most one
/// entry, and rules that parse, with errors naming the entry and the file's line.
fn destinations(entries: Vec<DestinationEntry>) -> Result<Vec<DestinationPolicyConfig>, String> {
    if entries.len() > MAX_DESTINATION_POLICIES {
        return Err(format!(
            "destinations: {} entries, more than the {MAX_DESTINATION_POLICIES} allowed",
            entries.len()
        ));
    }
    let mut out: Vec<DestinationPolicyConfig> = Vec::new();
    let mut owners: std::collections::HashMap<Identity, String> = Default::default();
    for (n, entry) in entries.into_iter().enumerate() {
        let at = format!("destinations[{n}] ({:?})", entry.name);
        if !label_safe(&entry.name) {
            return Err(format!(
                "{at}: name must be 1 to 63 letters, digits, '-', '_' or '.'"
            ));
        }
        if out.iter().any(|d| d.name == entry.name) {
            return Err(format!("{at}: the name is used twice"));
        }
        if entry.clients.is_empty() {
            return Err(format!("{at}: clients must list at least one identity"));
        }
        let clients = entry
            .clients
            .iter()
            .map(|text| {
                let id = Identity::parse(text).map_err(|e| format!("{at}: clients: {e}"))?;
                if let Some(other) = owners.insert(id.clone(), entry.name.clone()) {
                    return Err(format!(
                        "{at}: clients: {text} already has destination policy {other:?}; a client has one"
                    ));
                }
                Ok(id)
            })
            .collect::<Result<Vec<_>, String>>()?;
        let lines = entry.rules.iter().map(|rule| {
            let line = usize::try_from(rule.referenced.line()).unwrap_or(usize::MAX);
            (line, rule.value.as_str())
        });
        let rules = tether_policy::RuleSet::parse_numbered(lines)
            .map_err(|e| format!("{at}: rules: {e}"))?;
        if rules.is_empty() {
            return Err(format!(
                "{at}: rules must list at least one rule (\"deny all\" refuses everything)"
            ));
        }
        out.push(DestinationPolicyConfig {
            name: entry.name,
            clients,
            rules,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_full_file() {
        let c = RoutingConfig::from_yaml(
            "zones:\n  - zone: a\n    region: r\n    cidrs: [\"10.1.0.0/16\", \"fd00:1::/64\"]\n  - zone: b\n    cidrs: [10.2.0.0/16]\naffinity: client\nejection:\n  consecutive_failures: 3\n  base_seconds: 0.5\n  max_seconds: 60\n",
        )
        .unwrap();
        assert_eq!(c.zone_rules.len(), 3);
        assert_eq!(c.zone_rules[1].zone, "a");
        assert_eq!(c.zone_rules[1].region.as_deref(), Some("r"));
        assert_eq!(c.zone_rules[2].region, None);
        assert!(c.client_affinity);
        assert_eq!(c.ejection.base_ejection, Duration::from_millis(500));
        assert_eq!(
            RoutingConfig::from_yaml("{}").unwrap(),
            RoutingConfig::default()
        );
        let shared = RoutingConfig::from_yaml(
            "bandwidth: {bytes_per_second: 1000}\ntenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], weight: 3}\n  - {name: b, clients: [\"cert:z\"], agents: [\"cert:w\"]}\n",
        )
        .unwrap();
        assert_eq!(shared.bandwidth, Some(1000));
        let weights: Vec<u32> = shared.tenants.iter().map(|t| t.weight).collect();
        assert_eq!(weights, [3, 1]);
        let t = RoutingConfig::from_yaml(
            "tenants:\n  - name: acme\n    clients: [\"cert:api.acme\", \"uid:1001\"]\n    agents: [\"cert:api.acme\"]\n    limits: {connections: 5, dials_per_second: 2.5}\n",
        )
        .unwrap()
        .tenants;
        assert_eq!(
            t[0].clients,
            [
                Identity::CertName("api.acme".into()),
                Identity::UnixUid(1001)
            ]
        );
        assert_eq!(t[0].limits.connections, Some(5));
        assert_eq!(t[0].limits.pending_dials, None);
    }

    #[test]
    fn a_tenant_may_name_its_own_control_plane_endpoints() {
        let t = RoutingConfig::from_yaml(
            "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], control_plane_endpoints: [\"10.0.0.1:6443\"]}\n  - {name: b, clients: [\"cert:z\"], agents: [\"cert:w\"], control_plane_endpoints: []}\n  - {name: c, clients: [\"cert:v\"], agents: [\"cert:u\"]}\n",
        )
        .unwrap()
        .tenants;
        assert_eq!(
            t[0].control_plane_endpoints,
            Some(vec!["10.0.0.1:6443".into()])
        );
        assert_eq!(t[1].control_plane_endpoints, Some(Vec::new()));
        assert_eq!(t[2].control_plane_endpoints, None);
        let err = RoutingConfig::from_yaml(
            "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], control_plane_endpoints: [\"kubeconfig\"]}\n",
        )
        .unwrap_err();
        assert!(
            err.contains(
                "tenants[0] (\"a\"): control_plane_endpoints: \"kubeconfig\" is not HOST:PORT"
            ),
            "{err}"
        );
    }

    #[test]
    fn the_books_example_is_valid() {
        let readme = include_str!("../../../docs/src/guide/multi-tenancy.md");
        let start = readme
            .find("# /etc/tether/routing.yaml")
            .expect("the book's \"Routing and tenants\" has the example");
        let block = &readme[start..];
        let block = &block[..block.find("```").unwrap()];
        let c = RoutingConfig::from_yaml(block).unwrap();
        assert_eq!(c.zone_rules.len(), 3);
        assert_eq!(c.tenants.len(), 3);
        assert_eq!(c.tenants[1].clients, [Identity::UnixUid(1002)]);
        assert_eq!(c.tenants[1].limits.bytes_per_second, Some(50 << 20));
        assert_eq!(
            c.tenants[2].frontend.as_ref().unwrap().unix.as_deref(),
            Some(std::path::Path::new("/run/tether/initech.sock"))
        );
        assert_eq!(
            c.tenants[2].agents,
            [Identity::ServiceAccount {
                namespace: "initech".into(),
                name: Some("konnectivity-agent".into())
            }]
        );
        assert_eq!(c.destinations.len(), 2);
        let kubelets = &c.destinations[0].rules;
        assert!(kubelets.check_requested("10.0.3.4", 10250).is_ok());
        assert!(kubelets.check_requested("169.254.169.254", 10250).is_err());
    }

    #[test]
    fn a_tcp_frontend_names_its_clients_or_its_own_ca() {
        let tenants = |yaml: &str| RoutingConfig::from_yaml(yaml).unwrap().tenants;
        let t = tenants(
            "tenants:\n  - {name: a, clients: [\"cert:api.a\"], agents: [\"cert:ag.a\"], frontend: {tcp: \"127.0.0.1:8131\"}}\n",
        );
        let frontend = t[0].frontend.as_ref().unwrap();
        assert_eq!(frontend.tcp, Some("127.0.0.1:8131".parse().unwrap()));
        assert_eq!(frontend.client_ca, None);
        let t = tenants(
            "tenants:\n  - {name: a, agents: [\"cert:ag.a\"], frontend: {tcp: \"127.0.0.1:8131\", client_ca: /etc/a/ca.crt}}\n",
        );
        assert!(t[0].clients.is_empty(), "its own CA is the gate");
        assert_eq!(
            t[0].frontend.as_ref().unwrap().client_ca.as_deref(),
            Some(std::path::Path::new("/etc/a/ca.crt"))
        );
        // A Unix socket alone needs no identity: its file mode is the gate.
        let t = tenants(
            "tenants:\n  - {name: a, agents: [\"cert:ag.a\"], frontend: {unix: /run/a.sock}}\n",
        );
        assert!(t[0].clients.is_empty());
    }

    #[test]
    fn destination_rules_parse_with_the_files_lines_and_errors_name_them() {
        let c = RoutingConfig::from_yaml(
            "affinity: none\ndestinations:\n  - name: kubelets\n    clients: [\"cert:api\", \"uid:0\"]\n    rules:\n      - allow to 10.0.0.0/8 port 10250  # kubelets\n      - deny all\n",
        )
        .unwrap();
        let d = &c.destinations[0];
        assert_eq!(d.name, "kubelets");
        assert_eq!(
            d.clients,
            [Identity::CertName("api".into()), Identity::UnixUid(0)]
        );
        assert_eq!(
            d.rules.to_string(),
            "allow to 10.0.0.0/8 port 10250\ndeny all\n"
        );
        let e = d.rules.check_requested("10.0.0.1", 22).unwrap_err();
        assert_eq!(e.rule, "line 7: deny all", "lines of the routing file");

        for (text, expected) in [
            (
                "destinations:\n  - name: a\n    clients: [\"cert:x\"]\n    rules:\n      - allow all\n      - deny host 10.0.0.1\n",
                "destinations[0] (\"a\"): rules: line 6: unknown condition \"host\"",
            ),
            (
                "destinations:\n  - {name: a, clients: [\"cert:x\"], rules: [\"deny to 10.0.0.1/8\"]}\n",
                "line 2: \"10.0.0.1/8\" has host bits set",
            ),
            (
                "destinations:\n  - {name: a, clients: [\"cert:x\"], rules: []}\n",
                "rules must list at least one rule",
            ),
            (
                "destinations:\n  - {name: a, clients: [], rules: [allow all]}\n",
                "clients must list",
            ),
            (
                "destinations:\n  - {name: a, clients: [\"x\"], rules: [allow all]}\n",
                "expected cert:NAME",
            ),
            (
                "destinations:\n  - {name: a, clients: [\"cert:x\"], rules: [allow all]}\n  - {name: b, clients: [\"cert:x\"], rules: [allow all]}\n",
                "cert:x already has destination policy \"a\"",
            ),
            (
                "destinations:\n  - {name: a, clients: [\"cert:x\"], rules: [allow all]}\n  - {name: a, clients: [\"cert:y\"], rules: [allow all]}\n",
                "used twice",
            ),
            (
                "destinations:\n  - {name: \"a b\", clients: [\"cert:x\"], rules: [allow all]}\n",
                "name must be",
            ),
            (
                "destinations:\n  - {name: a, clients: [\"cert:x\"], rule: [allow all]}\n",
                "rule",
            ),
        ] {
            let err = RoutingConfig::from_yaml(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }

    #[test]
    fn errors_name_the_entry() {
        for (text, expected) in [
            (
                "zones:\n  - zone: a\n    cidrs: [10.0.0.1/8]\n",
                "zones[0] (\"a\"): \"10.0.0.1/8\" has host bits set",
            ),
            ("zones:\n  - zone: a\n    cidrs: []\n", "cidrs must list"),
            (
                "zones:\n  - zone: a\n    cidrs: [10.0.0.0/8]\n  - zone: b\n    cidrs: [10.0.0.0/8]\n",
                "already mapped to zone \"a\"",
            ),
            ("affinity: sticky\n", "affinity: expected"),
            (
                "ejection:\n  consecutive_failures: 1\n  base_seconds: 10\n  max_seconds: 1\n",
                "max_seconds",
            ),
            (
                "ejection:\n  consecutive_failures: 1\n  base_seconds: -1\n  max_seconds: 1\n",
                "base_seconds",
            ),
            ("zonez: []\n", "zonez"),
            ("bandwidth: {bytes_per_second: 0}\n", "must be positive"),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], weight: 2}\n",
                "tenant \"a\": weight shares the server's bandwidth, which is not set",
            ),
            (
                "bandwidth: {bytes_per_second: 1}\ntenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], weight: 0}\n",
                "weight must be 1 to 1000, got 0",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: []}\n",
                "agents must list",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"x\"], agents: [\"cert:y\"]}\n",
                "expected cert:NAME",
            ),
            (
                "tenants:\n  - {name: \"a b\", clients: [\"cert:x\"], agents: [\"cert:y\"]}\n",
                "name must be",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"]}\n  - {name: b, clients: [\"cert:x\"], agents: [\"cert:z\"]}\n",
                "cert:x is already in tenant \"a\"",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"]}\n  - {name: a, clients: [\"cert:w\"], agents: [\"cert:z\"]}\n",
                "used twice",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"uid:x\"], agents: [\"cert:y\"]}\n",
                "uid must be a number",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], limits: {bytes_per_second: 0}}\n",
                "limits.bytes_per_second must be positive",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"sa:ns\"], agents: [\"cert:y\"]}\n",
                "sa: identities are agents'",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"sa:ns\"]}\n  - {name: b, clients: [\"cert:w\"], agents: [\"sa:ns:agent\"]}\n",
                "tenants[1] (\"b\"): agents: sa:ns:agent overlaps an sa: identity of tenant \"a\"",
            ),
            (
                "tenants:\n  - {name: a, agents: [\"cert:y\"]}\n",
                "clients must list at least one identity, or the tenant its own frontend",
            ),
            (
                "tenants:\n  - {name: a, agents: [\"cert:y\"], frontend: {}}\n",
                "tenants[0] (\"a\"): frontend: name a unix socket",
            ),
            (
                "tenants:\n  - {name: a, agents: [\"cert:y\"], frontend: {unix: /run/t.sock}}\n  - {name: b, agents: [\"cert:z\"], frontend: {unix: \"/run//t.sock\"}}\n",
                "tenants[1] (\"b\"): frontend.unix /run/t.sock is already tenant \"a\"'s socket",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], frontend: {tcp: \"0.0.0.0:8131\"}}\n  - {name: b, clients: [\"cert:w\"], agents: [\"cert:z\"], frontend: {tcp: \"127.0.0.1:8131\"}}\n",
                "frontend.tcp 127.0.0.1:8131 overlaps tenant \"a\"'s 0.0.0.0:8131",
            ),
            (
                "tenants:\n  - {name: a, agents: [\"cert:y\"], frontend: {tcp: \"127.0.0.1:8131\"}}\n",
                "tenants[0] (\"a\"): frontend.tcp 127.0.0.1:8131 would admit every client certificate of the main frontend's CA: add the tenant's client certificate names to clients (\"cert:NAME\", the CN or a DNS/URI SAN), or a CA of the tenant's own as frontend.client_ca",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"uid:1001\"], agents: [\"cert:y\"], frontend: {unix: /run/a.sock, tcp: \"127.0.0.1:8131\"}}\n",
                "tenants[0] (\"a\"): frontend.tcp 127.0.0.1:8131 would admit every client",
            ),
            (
                "tenants:\n  - {name: a, agents: [\"cert:y\"], frontend: {unix: /run/a.sock, client_ca: /ca.crt}}\n",
                "tenants[0] (\"a\"): frontend.client_ca verifies the tcp listener's client certificates: add frontend.tcp",
            ),
            (
                "tenants:\n  - {name: a, clients: [\"cert:x\"], agents: [\"cert:y\"], limits: {dials_per_second: 0}}\n",
                "dials_per_second",
            ),
        ] {
            let err = RoutingConfig::from_yaml(text).unwrap_err();
            assert!(err.contains(expected), "{text:?}: {err}");
        }
    }
}
