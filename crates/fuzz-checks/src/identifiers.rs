//! The `agentidentifiers` query: [`tether_proto::Identifiers`].

use tether_proto::Identifiers;

/// Invariants: parsing never panics; strict parsing accepts a subset of what lenient parsing
/// accepts, with the same result; what parses re-encodes to a query that parses the same,
/// strictly too when the original passed the strict parse (which also checks the values).
pub fn check(data: &[u8]) {
    let Ok(query) = std::str::from_utf8(data) else {
        return;
    };
    let lenient = Identifiers::parse(query);
    let strict = Identifiers::parse_strict(query);
    if let Ok(strict) = &strict {
        assert_eq!(Ok(strict), lenient.as_ref(), "strict and lenient disagree");
    }
    let Ok(ids) = lenient else {
        return;
    };
    let encoded = encode(&ids);
    assert_eq!(
        Identifiers::parse(&encoded).as_ref(),
        Ok(&ids),
        "{encoded:?} does not parse back"
    );
    if strict.is_ok() {
        assert_eq!(
            Identifiers::parse_strict(&encoded).as_ref(),
            Ok(&ids),
            "{encoded:?} does not parse back strictly"
        );
    }
}

/// The query an agent would send for `ids`.
fn encode(ids: &Identifiers) -> String {
    let mut pairs = Vec::new();
    for (key, values) in [
        ("host", &ids.hosts),
        ("ipv4", &ids.ipv4),
        ("ipv6", &ids.ipv6),
        ("cidr", &ids.cidrs),
    ] {
        for value in values {
            pairs.push(format!("{key}={}", escape(value)));
        }
    }
    if ids.default_route {
        pairs.push("default-route=true".to_owned());
    }
    pairs.join("&")
}

/// Percent-encodes every byte that is not an ASCII letter or digit.
fn escape(value: &str) -> String {
    value
        .bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
