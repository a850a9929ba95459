//! The rules every agent applies before its policy file's.

use std::net::SocketAddr;

use crate::cidr::Cidr;
use crate::rule::{Action, PortRange, Rule};

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
    pub(crate) why: &'static str,
}

impl Builtins {
    pub(crate) fn rules(&self) -> Vec<BuiltinRule> {
        let mut rules = Vec::new();
        for listener in &self.own_listeners {
            let ip = listener.ip();
            let reaches = if ip.is_unspecified() || ip.is_loopback() {
                blocks(&LOOPBACK)
            } else {
                vec![Cidr::parse(&ip.to_string()).expect("an address is a block")]
            };
            rules.push(BuiltinRule {
                rule: Rule {
                    ports: vec![PortRange {
                        first: listener.port(),
                        last: listener.port(),
                    }],
                    ..deny(reaches)
                },
                why: "the agent's own listener",
            });
        }
        if !self.allow_link_local {
            rules.push(BuiltinRule {
                rule: deny(blocks(&LINK_LOCAL)),
                why: "link-local and cloud metadata; --allow-link-local-destinations permits it",
            });
        }
        if !self.allow_loopback {
            rules.push(BuiltinRule {
                rule: deny(blocks(&LOOPBACK)),
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
