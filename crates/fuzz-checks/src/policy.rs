//! The destination policy file parser and matcher: [`tether_policy`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use tether_policy::{Builtins, Policy, RuleSet};

/// Invariants: parsing never panics; an error names a line that exists; a parsed file prints
/// to text that parses to the same rules; checking never panics, treats an IPv4 address and
/// its IPv4-mapped IPv6 form alike, and denies a set of addresses exactly when it denies one
/// of them; checking before resolution denies legacy numeric IPv4 spellings.
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

    // Before resolution (the server's check): a literal and its IPv4-mapped form are judged
    // alike, and a legacy numeric spelling no rule can see is always denied.
    for ip in [v4_of(data), Ipv4Addr::new(10, 0, 0, 1)] {
        let mapped = format!("[{}]", ip.to_ipv6_mapped());
        assert_eq!(
            rules.check_requested(&ip.to_string(), 80).is_ok(),
            rules.check_requested(&mapped, 80).is_ok(),
            "{ip} and {mapped} judged differently before resolution"
        );
    }
    assert!(rules.check_requested("127.1", 443).is_err());
    for host in ["a.svc.cluster.local", "Example.COM.", "[::1]"] {
        let _ = rules.check_requested(host, 443);
    }

    let policy = Policy::new(&Builtins::default(), Some(rules));
    let seed = input_seed(data);
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

/// A value derived from the input, so every input checks its own addresses and port.
fn input_seed(data: &[u8]) -> u32 {
    data.iter()
        .fold(0u32, |h, b| h.rotate_left(5) ^ u32::from(*b))
}

fn v4_of(data: &[u8]) -> Ipv4Addr {
    Ipv4Addr::from(input_seed(data))
}
