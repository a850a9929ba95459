//! The rules every agent applies before its policy file's.

use std::net::SocketAddr;

use crate::cidr::Cidr;
use crate::host;
use crate::rule::{Action, Destination, PortRange, Rule};

/// Link-local blocks (cloud metadata lives at 169.254.169.254) and AWS's IPv6 metadata
/// address, which is not link-local.
const LINK_LOCAL: [&str; 3] = ["169.254.0.0/16", "fe80::/10", "fd00:ec2::254/128"];

/// The node itself: loopback, and the unspecified addresses, which Linux connects to the
/// local host.
const LOOPBACK: [&str; 4] = ["127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"];

/// Which built-in rules apply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Builtins {
    /// Allow the agent node's loopback. On by default: tether's tests, the interop matrix
    /// and upstream's integration suite dial loopback targets through agents.
    pub allow_loopback: bool,
    /// Allow link-local destinations, cloud metadata included. Off by default.
    pub allow_link_local: bool,
    /// The agent's own listeners (health, admin): never a destination, whatever else holds.
    /// One bound to all interfaces is refused on every address of this host.
    pub own_listeners: Vec<SocketAddr>,
}

impl Default for Builtins {
    fn default() -> Self {
        Self {
            allow_loopback: true,
            allow_link_local: false,
            own_listeners: Vec::new(),
        }
    }
}

/// A built-in rule and why it exists, for error messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct BuiltinRule {
    pub(crate) rule: Rule,
    /// The rule also holds for every address of this host on its ports: a listener bound to
    /// all interfaces answers on each of them, not only on loopback.
    pub(crate) every_host_address: bool,
    pub(crate) why: &'static str,
}

impl BuiltinRule {
    /// Whether the rule holds for `dest`. A rule about this host's addresses fails closed:
    /// when the addresses cannot be listed, it holds, and the error says so.
    pub(crate) fn holds(&self, dest: &Destination<'_>) -> Result<bool, String> {
        if self.rule.matches(dest) {
            return Ok(true);
        }
        match dest.ip {
            Some(ip) if self.every_host_address && self.rule.port_matches(dest.port) => {
                host::is_own_address(ip).map_err(|e| {
                    format!(
                        "{} (this host's addresses could not be listed: {e})",
                        self.text()
                    )
                })
            }
            _ => Ok(false),
        }
    }

    /// The rule as error messages show it: its syntax, what else it covers, and why.
    pub(crate) fn text(&self) -> String {
        if self.every_host_address {
            format!(
                "built-in rule: {} and every address of this host ({})",
                self.rule, self.why
            )
        } else {
            format!("built-in rule: {} ({})", self.rule, self.why)
        }
    }
}

impl Builtins {
    pub(crate) fn rules(&self) -> Vec<BuiltinRule> {
        let mut rules = Vec::new();
        for listener in &self.own_listeners {
            let ip = listener.ip().to_canonical();
            // Bound to all interfaces, a listener answers on loopback and on every address
            // of the host; bound to loopback, on all of loopback (Linux routes 127/8 to it).
            let (reaches, every_host_address) = if ip.is_unspecified() {
                (blocks(&LOOPBACK), true)
            } else if ip.is_loopback() {
                (blocks(&LOOPBACK), false)
            } else {
                (
                    vec![Cidr::parse(&ip.to_string()).expect("an address is a block")],
                    false,
                )
            };
            rules.push(BuiltinRule {
                rule: Rule {
                    ports: vec![PortRange {
                        first: listener.port(),
                        last: listener.port(),
                    }],
                    ..deny(reaches)
                },
                every_host_address,
                why: "the agent's own listener",
            });
        }
        if !self.allow_link_local {
            rules.push(BuiltinRule {
                rule: deny(blocks(&LINK_LOCAL)),
                every_host_address: false,
                why: "link-local and cloud metadata; --allow-link-local-destinations permits it",
            });
        }
        if !self.allow_loopback {
            rules.push(BuiltinRule {
                rule: deny(blocks(&LOOPBACK)),
                every_host_address: false,
                why: "the agent node's loopback; --allow-loopback-destinations permits it",
            });
        }
        rules
    }
}

fn deny(to: Vec<Cidr>) -> Rule {
    Rule {
        action: Action::Deny,
        to,
        names: Vec::new(),
        ports: Vec::new(),
    }
}

fn blocks(list: &[&str]) -> Vec<Cidr> {
    list.iter()
        .map(|c| Cidr::parse(c).expect("built-in blocks are valid"))
        .collect()
}
