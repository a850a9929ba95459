//! Destination policy: which addresses an agent may dial on a server's behalf.
//!
//! Without a policy an agent dials whatever a frontend client names, which reaches the
//! node's loopback services, cloud metadata at 169.254.169.254 and anything else the node can
//! route to. A [`Policy`] is an ordered list of allow/deny rules by address block, port and
//! DNS name, in the spirit of a NetworkPolicy's `ipBlock` and `ports`, checked **after name
//! resolution on every resolved address**: a name that resolves to a denied address is
//! refused, even if it also resolves to allowed ones, so a name cannot smuggle a denied IP.
//!
//! # The file format
//!
//! One rule per line; `#` starts a comment; blank lines are ignored. The first rule that
//! matches an address decides; an address no rule matches is **denied** (a policy file is an
//! allowlist unless it ends in `allow all`).
//!
//! ```text
//! # action  conditions (all must hold; each at most once; lists are comma-separated)
//! deny  to 10.0.0.0/24 port 2379-2380        # etcd
//! allow to 10.0.0.0/8,fd00::/8 port 443,10250
//! allow name svc.cluster.local port 443
//! deny  all
//! ```
//!
//! - `to CIDR,...`: the address is in one of the blocks (`10.0.0.0/8`, `fe80::/10`, or a
//!   single address). Host bits must be zero. IPv4-mapped IPv6 addresses and blocks are
//!   matched as the IPv4 addresses they are, so `::ffff:169.254.169.254` is 169.254.169.254.
//!   An IPv6 address that embeds an IPv4 address a translator or tunnel leads to (NAT64
//!   `64:ff9b::/96` and `64:ff9b:1::/48`, 6to4 `2002::/16`, Teredo `2001::/32`, SIIT
//!   `::ffff:0:0/96`, IPv4-compatible `::a.b.c.d`) is checked as itself and as that IPv4
//!   address, and must be allowed as both: `deny to 169.254.169.254` refuses
//!   `64:ff9b::a9fe:a9fe`.
//! - `port P,LO-HI,...`: the destination port is one of these.
//! - `name SUFFIX,...`: the requested host is a DNS name at or below a suffix, on label
//!   boundaries (`cluster.local` matches `a.svc.cluster.local`, not `evilcluster.local`);
//!   case and a trailing dot do not matter; never matches a host given as an IP literal. A
//!   name condition says nothing about where the name resolves: combine it with `to` to pin
//!   both.
//! - `all`: no conditions, matches everything.
//!
//! Parse errors carry the 1-based line number ([`ParseError`]).
//!
//! # Built-in rules
//!
//! [`Builtins`] are checked before the file's rules and the file cannot override them:
//! - the agent's own health and admin listeners are always denied: on their port, at the
//!   address they are bound to, and, when bound to all interfaces, at every address of this
//!   host (its interfaces' addresses, listed when a dial names such a port) and loopback;
//! - link-local addresses (169.254.0.0/16, fe80::/10) and AWS's `fd00:ec2::254` are denied
//!   unless `allow_link_local`;
//! - the node's loopback (127.0.0.0/8, ::1, and 0.0.0.0/8 and ::, which Linux connects to
//!   the local host) is **allowed by default** and denied by `allow_loopback = false`.
//!
//! Loopback stays open by default for compatibility: tether's tests, the interop matrix and
//! upstream's integration suite dial 127.0.0.1 targets through agents, and a dial denied at
//! run time cannot be turned into a start-up error naming the flag. The listener rule still
//! closes the agent's own `/metrics` and admin endpoints, the case the security review
//! found. Deployments whose nodes run loopback-only services (etcd on control-plane nodes,
//! kubelet's healthz port) should deny loopback.
//!
//! Without a policy file, every address the built-in rules do not deny is allowed.
//!
//! # Before resolution
//!
//! The proxy server checks a client's request before any agent is chosen, and never
//! resolves names: [`RuleSet::check_requested`] matches IP literals by `to` and names by
//! `name` only (a `to` condition never holds for a name), with no built-in rules. The agent's
//! check after resolution still applies to whatever the server lets through.
#![forbid(unsafe_code)]

mod builtin;
mod cidr;
mod embedded;
mod host;
mod parse;
mod requested;
mod rule;

use std::fmt;
use std::net::{IpAddr, SocketAddr};

pub use builtin::Builtins;
pub use cidr::Cidr;
pub use parse::{MAX_RULES, ParseError, RuleSet};
pub use requested::RequestDenied;
pub use rule::{Action, NameSuffix, PortRange, Rule};

use builtin::BuiltinRule;
use rule::{Destination, dns_name};

/// The built-in rules, then a policy file's rules if there is one.
#[derive(Clone, Debug)]
pub struct Policy {
    builtins: Vec<BuiltinRule>,
    file: Option<RuleSet>,
}

/// A refused destination: which address, and the rule that refused it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    pub address: SocketAddr,
    /// The rule, as `line N: RULE`, `built-in rule: RULE (why)`, or the implicit deny.
    pub rule: String,
}

impl fmt::Display for Denied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy: {} denied by {}", self.address, self.rule)
    }
}

impl std::error::Error for Denied {}

impl Policy {
    pub fn new(builtins: &Builtins, file: Option<RuleSet>) -> Self {
        Self {
            builtins: builtins.rules(),
            file,
        }
    }

    /// Checks every address `host` resolved to; the first denied one refuses the dial. An
    /// IPv6 address that embeds an IPv4 address (NAT64, 6to4, Teredo, IPv4-compatible) is
    /// judged as itself and as that IPv4 address, and refused if either is denied.
    /// `host` is the host as requested (a name or an IP literal, brackets allowed).
    pub fn check(&self, host: &str, port: u16, addrs: &[IpAddr]) -> Result<(), Denied> {
        let name = dns_name(host);
        for &ip in addrs {
            for judged in embedded::judged_as(ip) {
                let dest = Destination {
                    name: name.as_deref(),
                    port,
                    ip: Some(judged.ip),
                };
                if let Some(rule) = self.denying_rule(&dest) {
                    return Err(Denied {
                        address: SocketAddr::new(ip, port),
                        rule: judged.explain(rule),
                    });
                }
            }
        }
        Ok(())
    }

    /// The text of the rule that denies `dest`, or `None` if it is allowed.
    fn denying_rule(&self, dest: &Destination<'_>) -> Option<String> {
        for builtin in &self.builtins {
            match builtin.holds(dest) {
                Ok(false) => continue,
                Ok(true) if builtin.rule.action == Action::Allow => return None,
                Ok(true) => return Some(builtin.text()),
                Err(text) => return Some(text),
            }
        }
        let file = self.file.as_ref()?;
        match file.first_match(dest) {
            Some((_, rule)) if rule.action == Action::Allow => None,
            Some((line, rule)) => Some(format!("line {line}: {rule}")),
            None => Some("the policy file: no rule allows it".to_owned()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn file(text: &str) -> Option<RuleSet> {
        Some(RuleSet::parse(text).unwrap())
    }

    #[test]
    fn builtins_deny_metadata_in_every_spelling_and_allow_the_rest() {
        let policy = Policy::new(&Builtins::default(), None);
        for ip in [
            "169.254.169.254",
            "::ffff:169.254.169.254",
            "fe80::1",
            "fd00:ec2::254",
        ] {
            let e = policy.check(ip, 80, &ips(&[ip])).unwrap_err();
            assert!(e.to_string().starts_with("policy: "), "{e}");
            assert!(e.rule.contains("link-local"), "{e}");
        }
        assert!(policy.check("127.0.0.1", 80, &ips(&["127.0.0.1"])).is_ok());
        assert!(policy.check("10.1.2.3", 80, &ips(&["10.1.2.3"])).is_ok());
        let open = Builtins {
            allow_link_local: true,
            ..Builtins::default()
        };
        let policy = Policy::new(&open, None);
        assert!(policy.check("x", 80, &ips(&["169.254.169.254"])).is_ok());
    }

    #[test]
    fn loopback_and_own_listeners() {
        let closed = Builtins {
            allow_loopback: false,
            own_listeners: vec!["0.0.0.0:8093".parse().unwrap()],
            ..Builtins::default()
        };
        let policy = Policy::new(&closed, file("allow all"));
        for ip in [
            "127.0.0.1",
            "127.9.9.9",
            "::1",
            "0.0.0.0",
            "::",
            "::ffff:127.0.0.1",
        ] {
            let e = policy.check("localhost", 80, &ips(&[ip])).unwrap_err();
            assert!(
                e.rule.contains("--allow-loopback-destinations"),
                "{ip}: {e}"
            );
        }
        let open = Builtins {
            own_listeners: vec![
                "0.0.0.0:8093".parse().unwrap(),
                "10.0.0.5:8094".parse().unwrap(),
            ],
            ..Builtins::default()
        };
        let policy = Policy::new(&open, None);
        assert!(policy.check("127.0.0.1", 80, &ips(&["127.0.0.1"])).is_ok());
        let e = policy
            .check("127.0.0.1", 8093, &ips(&["127.0.0.1"]))
            .unwrap_err();
        assert!(e.rule.contains("own listener"), "{e}");
        assert!(policy.check("10.0.0.5", 8094, &ips(&["10.0.0.5"])).is_err());
        assert!(policy.check("10.0.0.6", 8094, &ips(&["10.0.0.6"])).is_ok());
    }

    /// The review's spellings of 169.254.169.254 that embed it in IPv6 (N8), and the other
    /// embeddings of it.
    const EMBEDDED_METADATA: [&str; 8] = [
        "::169.254.169.254",
        "::a9fe:a9fe",
        "64:ff9b::a9fe:a9fe",
        "2002:a9fe:a9fe::1",
        "64:ff9b:1::a9fe:a9fe",
        "::ffff:0:a9fe:a9fe",
        "2001:0:4136:e378:8000:63bf:5601:5601",
        "2001:0:a9fe:a9fe:8000:63bf:bec9:1c87",
    ];

    #[test]
    fn a_deny_of_an_ipv4_address_refuses_every_ipv6_form_embedding_it() {
        let policy = Policy::new(&Builtins::default(), None);
        for ip in EMBEDDED_METADATA {
            let e = policy.check(ip, 80, &ips(&[ip])).unwrap_err();
            assert!(e.rule.contains("link-local"), "{ip}: {e}");
            assert!(
                e.rule
                    .contains("as 169.254.169.254, the IPv4 address it embeds by"),
                "{ip}: {e}"
            );
            assert_eq!(e.address, SocketAddr::new(ips(&[ip])[0], 80), "{ip}");
        }
        // A file's rule too, with the built-in one out of the way.
        let open = Builtins {
            allow_link_local: true,
            ..Builtins::default()
        };
        let policy = Policy::new(&open, file("deny to 169.254.169.254\nallow all\n"));
        for ip in EMBEDDED_METADATA {
            let e = policy.check(ip, 80, &ips(&[ip])).unwrap_err();
            assert!(
                e.rule
                    .starts_with("line 1: deny to 169.254.169.254/32, as "),
                "{ip}: {e}"
            );
        }
        assert!(policy.check("x", 80, &ips(&["64:ff9b::a9fe:a9ff"])).is_ok());
        // The IPv6 form is judged as itself too, and must be allowed as both.
        let policy = Policy::new(&open, file("deny to 2002::/16\nallow all\n"));
        assert!(policy.check("x", 80, &ips(&["2002:a9fe:a9fe::1"])).is_err());
        let policy = Policy::new(&open, file("allow to 64:ff9b::/96\n"));
        let e = policy
            .check("x", 443, &ips(&["64:ff9b::102:304"]))
            .unwrap_err();
        assert_eq!(
            e.rule,
            "the policy file: no rule allows it, as 1.2.3.4, the IPv4 address it embeds by NAT64 (64:ff9b::/96)"
        );
        let policy = Policy::new(&open, file("allow to 64:ff9b::/96,1.2.3.0/24\n"));
        assert!(policy.check("x", 443, &ips(&["64:ff9b::102:304"])).is_ok());
    }

    #[test]
    fn a_listener_on_all_interfaces_is_refused_on_every_address_of_the_host() {
        let builtins = Builtins {
            own_listeners: vec![
                "0.0.0.0:8093".parse().unwrap(),
                "[::]:8094".parse().unwrap(),
            ],
            ..Builtins::default()
        };
        let policy = Policy::new(&builtins, None);
        let host: Vec<IpAddr> = if_addrs::get_if_addrs()
            .unwrap()
            .iter()
            .map(if_addrs::Interface::ip)
            .filter(|ip| {
                !ip.is_loopback() && !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local())
            })
            .collect();
        // Whatever this host has (a node IP, a pod IP), and the loopback spellings.
        for ip in
            host.iter()
                .copied()
                .chain(ips(&["127.0.0.1", "127.3.2.1", "::1", "0.0.0.0", "::"]))
        {
            for port in [8093, 8094] {
                let e = policy.check("node.test", port, &[ip]).unwrap_err();
                assert!(
                    e.rule.contains("the agent's own listener")
                        && e.rule.contains("every address of this host"),
                    "{ip}: {e}"
                );
            }
            assert!(policy.check("node.test", 8095, &[ip]).is_ok(), "{ip}");
        }
        // The loopback address embedded by NAT64 is refused too.
        assert!(policy.check("x", 8093, &ips(&["64:ff9b::7f00:1"])).is_err());
        // Another host's listener on the same port is not this agent's.
        assert!(
            policy
                .check("x", 8093, &ips(&["203.0.113.77", "2001:db8::77"]))
                .is_ok()
        );
        // Bound to one address, a listener is refused there only.
        let one = Builtins {
            own_listeners: vec!["203.0.113.77:8093".parse().unwrap()],
            ..Builtins::default()
        };
        let policy = Policy::new(&one, None);
        assert!(policy.check("x", 8093, &ips(&["203.0.113.77"])).is_err());
        for ip in host {
            assert!(policy.check("x", 8093, &[ip]).is_ok(), "{ip}");
        }
    }

    #[test]
    fn first_match_wins_and_every_resolved_address_counts() {
        let policy = Policy::new(
            &Builtins::default(),
            file(
                "deny to 10.0.0.0/24 port 2379-2380\n\
                 allow to 10.0.0.0/8 port 1-65535\n\
                 allow name svc.cluster.local\n",
            ),
        );
        assert!(policy.check("10.0.0.9", 443, &ips(&["10.0.0.9"])).is_ok());
        let e = policy
            .check("10.0.0.9", 2379, &ips(&["10.0.0.9"]))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "policy: 10.0.0.9:2379 denied by line 1: deny to 10.0.0.0/24 port 2379-2380"
        );
        // Unmatched: the implicit deny.
        let e = policy
            .check("192.0.2.1", 80, &ips(&["192.0.2.1"]))
            .unwrap_err();
        assert!(e.rule.contains("no rule allows it"), "{e}");
        // A name rule matches names, never literals; every address of a name is checked.
        let name = "Kube-DNS.kube-system.svc.cluster.local.";
        assert!(policy.check(name, 53, &ips(&["192.0.2.1"])).is_ok());
        let e = policy
            .check(name, 53, &ips(&["192.0.2.1", "169.254.169.254"]))
            .unwrap_err();
        assert_eq!(e.address, "169.254.169.254:53".parse().unwrap());
        assert!(
            policy
                .check("[2001:db8::1]", 80, &ips(&["2001:db8::1"]))
                .is_err()
        );
    }
}
