//! The destination policy file parser and matcher: [`tether_policy`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tether_policy::{Builtins, Policy, RuleSet};

/// Invariants: parsing never panics; an error names a line that exists; a parsed file prints
/// to text that parses to the same rules; checking never panics, treats an IPv4 address and
/// its IPv4-mapped IPv6 form alike, and denies a set of addresses exactly when it denies one
/// of them.
pub fn check(data: &[u8]) {
    let rules = match RuleSet::parse_bytes(data) {
        Ok(rules) => rules,
        Err(e) => {
            let lines = data.split(|b| *b == b'\n').count();
            assert!(
                (1..=lines).contains(&e.line),
                "error on line {} of {lines}: {e}",
                e.line
            );
            assert!(e.to_string().starts_with(&format!("line {}: ", e.line)));
            return;
        }
    };
    let printed = rules.to_string();
    let reparsed = RuleSet::parse(&printed).expect("printed rules parse");
    assert!(
        reparsed.rules().eq(rules.rules()),
        "printing changed the rules:\n{printed}"
    );

    let policy = Policy::new(&Builtins::default(), Some(rules));
    let seed = data
        .iter()
        .fold(0u32, |h, b| h.rotate_left(5) ^ u32::from(*b));
    let v4 = Ipv4Addr::from(seed);
    let addrs = [
        IpAddr::V4(v4),
        IpAddr::V4(Ipv4Addr::new(10, 0, 0, seed as u8)),
        IpAddr::V6(Ipv6Addr::from(u128::from(seed) << 64 | 1)),
    ];
    let port = (seed >> 16) as u16;
    for host in ["a.svc.cluster.local", "10.0.0.1", "[::1]", "Example.COM."] {
        let one_by_one: Vec<_> = addrs
            .iter()
            .map(|ip| policy.check(host, port, &[*ip]))
            .collect();
        let together = policy.check(host, port, &addrs);
        assert_eq!(
            together.is_err(),
            one_by_one.iter().any(Result::is_err),
            "{host}: a set is denied exactly when one address is"
        );
        let mapped = IpAddr::V6(v4.to_ipv6_mapped());
        assert_eq!(
            policy.check(host, port, &[IpAddr::V4(v4)]).is_ok(),
            policy.check(host, port, &[mapped]).is_ok(),
            "{host}: {v4} and {mapped} judged differently"
        );
    }
}
