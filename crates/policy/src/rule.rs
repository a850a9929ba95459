//! One rule: an action and the conditions a destination must meet for it to apply.

use std::fmt;
use std::net::IpAddr;

use crate::cidr::Cidr;

/// What a matching rule does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Allow,
    Deny,
}

/// An inclusive port range; a single port is a range of one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PortRange {
    pub first: u16,
    pub last: u16,
}

/// A DNS name suffix matched on label boundaries: `cluster.local` matches `cluster.local`
/// and `kube-dns.kube-system.svc.cluster.local`, never `evilcluster.local`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameSuffix(String);

impl NameSuffix {
    /// Lower-case labels of letters, digits, `-` and `_`; a leading or trailing dot is dropped.
    pub fn parse(text: &str) -> Result<Self, String> {
        let name = text.strip_prefix('.').unwrap_or(text);
        let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        let valid_label = |label: &str| {
            !label.is_empty()
                && label.len() <= 63
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if name.len() > 253 || !name.split('.').all(valid_label) {
            return Err(format!("{text:?} is not a DNS name suffix"));
        }
        Ok(Self(name))
    }

    /// Whether the destination host `host` (already lower-case, no trailing dot) is this
    /// name or below it.
    fn matches(&self, host: &str) -> bool {
        match host.strip_suffix(self.0.as_str()) {
            Some("") => true,
            Some(rest) => rest.ends_with('.'),
            None => false,
        }
    }
}

/// A rule applies when every condition it has holds; a rule without conditions (`all`)
/// applies to everything.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    pub action: Action,
    /// The address is in one of these blocks. Never holds when the address is unknown: a
    /// name checked before resolution (the proxy server's check).
    pub to: Vec<Cidr>,
    /// The requested host is a DNS name (not an IP literal) at or below one of these.
    pub names: Vec<NameSuffix>,
    /// The port is in one of these ranges.
    pub ports: Vec<PortRange>,
}

/// A destination as rules see it: one resolved address of one requested host and port, or a
/// requested host before resolution.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Destination<'a> {
    /// Lower-case, without a trailing dot; `None` when the host was an IP literal.
    pub(crate) name: Option<&'a str>,
    pub(crate) port: u16,
    /// `None` for a name that was not resolved.
    pub(crate) ip: Option<IpAddr>,
}

/// The requested host as name rules see it: lower-case without a trailing dot, or `None`
/// for an IP literal.
pub(crate) fn dns_name(host: &str) -> Option<String> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if bare.parse::<IpAddr>().is_ok() {
        return None;
    }
    let name = bare.strip_suffix('.').unwrap_or(bare);
    Some(name.to_ascii_lowercase())
}

impl Rule {
    pub(crate) fn matches(&self, dest: &Destination<'_>) -> bool {
        (self.to.is_empty()
            || dest
                .ip
                .is_some_and(|ip| self.to.iter().any(|c| c.contains(ip))))
            && (self.names.is_empty()
                || dest
                    .name
                    .is_some_and(|n| self.names.iter().any(|s| s.matches(n))))
            && self.port_matches(dest.port)
    }

    /// Whether the rule's port condition (if any) holds for `port`.
    pub(crate) fn port_matches(&self, port: u16) -> bool {
        self.ports.is_empty()
            || self
                .ports
                .iter()
                .any(|r| (r.first..=r.last).contains(&port))
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
        })
    }
}

impl fmt::Display for PortRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.first == self.last {
            write!(f, "{}", self.first)
        } else {
            write!(f, "{}-{}", self.first, self.last)
        }
    }
}

impl fmt::Display for NameSuffix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The rule in the file syntax, so that it parses back to itself.
impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn list<T: fmt::Display>(items: &[T]) -> String {
            items
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        }
        write!(f, "{}", self.action)?;
        if self.to.is_empty() && self.names.is_empty() && self.ports.is_empty() {
            return f.write_str(" all");
        }
        if !self.to.is_empty() {
            write!(f, " to {}", list(&self.to))?;
        }
        if !self.names.is_empty() {
            write!(f, " name {}", list(&self.names))?;
        }
        if !self.ports.is_empty() {
            write!(f, " port {}", list(&self.ports))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_suffixes_match_on_label_boundaries() {
        let suffix = NameSuffix::parse(".Cluster.Local.").unwrap();
        assert_eq!(suffix.to_string(), "cluster.local");
        assert!(suffix.matches("cluster.local"));
        assert!(suffix.matches("kube-dns.kube-system.svc.cluster.local"));
        assert!(!suffix.matches("evilcluster.local"));
        assert!(!suffix.matches("cluster.local.evil"));
        for bad in ["", ".", "a..b", "*.example.com", "a b", &"a".repeat(64)] {
            assert!(NameSuffix::parse(bad).is_err(), "{bad:?}");
        }
    }
}
