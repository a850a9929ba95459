//! Checking a destination as requested, before anything resolves it: the proxy server's
//! check, which sees the host as the client wrote it and never looks names up.

use std::fmt;
use std::net::IpAddr;

use crate::RuleSet;
use crate::embedded::{Judged, judged_as};
use crate::rule::{Action, Destination, dns_name};

/// What the denial says about a host that would resolve to an address no rule can see: an
/// IPv4 address in a legacy numeric form (`127.1`, `2130706433`, `0x7f000001`, which the
/// resolver turns into 127.0.0.1) or something that is not a DNS name at all.
const UNJUDGED_HOST: &str =
    "the host is neither a DNS name nor an IP address in standard form, so no rule can judge it";

/// A requested destination that a rule set refused, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestDenied {
    /// `host:port` as requested (IPv6 in brackets).
    pub destination: String,
    /// `line N: RULE`, the implicit deny, or why the host cannot be judged.
    pub rule: String,
}

impl fmt::Display for RequestDenied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "policy: {} denied by {}", self.destination, self.rule)
    }
}

impl std::error::Error for RequestDenied {}

impl RuleSet {
    /// Checks `host` (a name or an IP literal, brackets allowed) and `port` without
    /// resolving anything. An IP literal is matched by `to` blocks (IPv4-mapped IPv6 as the
    /// IPv4 address); a name by `name` suffixes, and never by `to`, since where it resolves is
    /// unknown here. The first matching rule decides; no match denies. An IPv6 literal that
    /// embeds an IPv4 address (NAT64, 6to4, ...) must be allowed as both. A host that is
    /// neither a DNS name nor a standard literal is denied before any rule: a numeric form
    /// such as `127.1` would otherwise pass as a name and resolve to a literal a `to` rule
    /// denies.
    pub fn check_requested(&self, host: &str, port: u16) -> Result<(), RequestDenied> {
        let deny = |rule: String| {
            Err(RequestDenied {
                destination: host_port(host, port),
                rule,
            })
        };
        let Some((name, ip)) = classify(host) else {
            return deny(UNJUDGED_HOST.to_owned());
        };
        // A name is judged once, with no address; a literal as itself and as every IPv4
        // address it embeds (NAT64, 6to4, ...), each of which must be allowed.
        let judged: Vec<Option<Judged>> = match ip {
            Some(ip) => judged_as(ip).map(Some).collect(),
            None => vec![None],
        };
        for form in judged {
            let dest = Destination {
                name: name.as_deref(),
                port,
                ip: form.map(|j| j.ip),
            };
            let explain = |rule: String| match form {
                Some(judged) => judged.explain(rule),
                None => rule,
            };
            match self.first_match(&dest) {
                Some((_, rule)) if rule.action == Action::Allow => {}
                Some((line, rule)) => return deny(explain(format!("line {line}: {rule}"))),
                None => return deny(explain("no rule allows it".to_owned())),
            }
        }
        Ok(())
    }
}

/// An IP literal as its address, a DNS name as its lower-case form; `None` for anything else.
fn classify(host: &str) -> Option<(Option<String>, Option<IpAddr>)> {
    let bare = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Some((None, Some(ip)));
    }
    let name = dns_name(host)?;
    let labels_ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    });
    // No top-level domain is numeric; a numeric last label is how every legacy IPv4 form
    // (`a`, `a.b`, `a.b.c`, `a.b.c.d` in decimal, octal or hex) ends.
    let last = name.rsplit('.').next().unwrap_or_default();
    let numeric = last.bytes().all(|b| b.is_ascii_digit())
        || last
            .strip_prefix("0x")
            .is_some_and(|hex| hex.bytes().all(|b| b.is_ascii_hexdigit()));
    (labels_ok && name.len() <= 253 && !numeric).then_some((Some(name), None))
}

fn host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(text: &str) -> RuleSet {
        RuleSet::parse(text).unwrap()
    }

    #[test]
    fn literals_match_blocks_names_match_suffixes_and_never_blocks() {
        let set = rules(
            "deny to 169.254.0.0/16,fe80::/10\n\
             allow to 10.0.0.0/8,fd00::/8 port 10250\n\
             allow name svc.cluster.local port 443\n\
             deny to 0.0.0.0/0\n\
             allow port 8080\n",
        );
        assert!(set.check_requested("10.1.2.3", 10250).is_ok());
        assert!(set.check_requested("[fd00::7]", 10250).is_ok());
        assert!(set.check_requested("fd00::7", 10250).is_ok());
        assert!(set.check_requested("API.svc.Cluster.Local.", 443).is_ok());
        let e = set.check_requested("169.254.169.254", 80).unwrap_err();
        assert_eq!(
            e.to_string(),
            "policy: 169.254.169.254:80 denied by line 1: deny to 169.254.0.0/16,fe80::/10"
        );
        // The IPv4-mapped spelling is the IPv4 address; IPv6 shows in brackets.
        let e = set
            .check_requested("[::ffff:169.254.169.254]", 80)
            .unwrap_err();
        assert_eq!(e.destination, "[::ffff:169.254.169.254]:80");
        assert!(e.rule.starts_with("line 1: "), "{e}");
        assert!(set.check_requested("::ffff:10.0.0.1", 10250).is_ok());
        let e = set.check_requested("fe80::1", 10250).unwrap_err();
        assert_eq!(e.destination, "[fe80::1]:10250");
        // Wrong port for the allow: falls through to the catch-all block deny.
        let e = set.check_requested("10.1.2.3", 2379).unwrap_err();
        assert!(e.rule.starts_with("line 4: "), "{e}");
        // A name is never in a block, so the block deny on line 4 does not see it.
        assert!(set.check_requested("etcd.example", 8080).is_ok());
        assert!(set.check_requested("evilsvc.cluster.local", 443).is_err());
        let e = set.check_requested("etcd.example", 2379).unwrap_err();
        assert_eq!(e.rule, "no rule allows it");
    }

    #[test]
    fn literals_embedding_a_denied_ipv4_address_are_denied() {
        let set = rules("deny to 169.254.169.254\nallow all\n");
        for host in [
            "[::169.254.169.254]",
            "[64:ff9b::a9fe:a9fe]",
            "[2002:a9fe:a9fe::1]",
            "64:ff9b:1::a9fe:a9fe",
            "[2001:0:4136:e378:8000:63bf:5601:5601]",
        ] {
            let e = set.check_requested(host, 80).unwrap_err();
            assert!(
                e.rule
                    .starts_with("line 1: deny to 169.254.169.254/32, as 169.254.169.254, "),
                "{host}: {e}"
            );
        }
        assert!(set.check_requested("[64:ff9b::a9fe:a9ff]", 80).is_ok());
        assert!(set.check_requested("[::1]", 80).is_ok());
    }

    #[test]
    fn hosts_no_rule_can_judge_are_denied_before_the_rules() {
        let set = rules("deny to 127.0.0.0/8\nallow all\n");
        for host in [
            "127.1",
            "2130706433",
            "0x7f000001",
            "0x7f.1",
            "0177.0.0.1",
            "127.0.0.1.",
            "a..b",
            "fe80::1%eth0",
            "",
        ] {
            let e = set.check_requested(host, 80).unwrap_err();
            assert_eq!(e.rule, UNJUDGED_HOST, "{host:?}");
        }
        for host in ["node-1", "1x.example", "0xnotes.example", "kube_dns.local"] {
            assert!(set.check_requested(host, 80).is_ok(), "{host}");
        }
        assert!(set.check_requested("127.0.0.1", 80).is_err());
    }
}
