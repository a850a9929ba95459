//! The `agentidentifiers` metadata: a URL query such as `host=n1&ipv4=10.0.0.1&default-route=true`.

/// Keys an agent may advertise. The agent refuses others at start-up; the server ignores them.
pub const KNOWN_KEYS: [&str; 5] = ["host", "ipv4", "ipv6", "cidr", "default-route"];

/// Parsed agent identifiers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Identifiers {
    pub hosts: Vec<String>,
    pub ipv4: Vec<String>,
    pub ipv6: Vec<String>,
    pub cidrs: Vec<String>,
    pub default_route: bool,
}

impl Identifiers {
    /// Parses strictly, as the agent does for `--agent-identifiers`: unknown keys are errors,
    /// and so are values no server could route by (an address that does not parse, or a
    /// value holding `,` or `=`, the sign of identifiers joined with the wrong separator),
    /// which upstream accepts and then never matches.
    pub fn parse_strict(query: &str) -> Result<Self, String> {
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let key = unescape(pair.split_once('=').map_or(pair, |(k, _)| k))?;
            if !KNOWN_KEYS.contains(&key.as_str()) {
                return Err(format!(
                    "unknown agent identifier {key:?} (expected one of {})",
                    KNOWN_KEYS.join(", ")
                ));
            }
        }
        let ids = Self::parse(query)?;
        let values = [
            ("host", &ids.hosts),
            ("ipv4", &ids.ipv4),
            ("ipv6", &ids.ipv6),
            ("cidr", &ids.cidrs),
        ];
        for (key, values) in values {
            for value in values {
                check_value(key, value)?;
            }
        }
        Ok(ids)
    }

    /// Parses the query. A malformed escape is an error; an unknown key is not.
    pub fn parse(query: &str) -> Result<Self, String> {
        let mut ids = Self::default();
        let mut default_route_seen = false;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let key = unescape(key)?;
            let value = unescape(value)?;
            match key.as_str() {
                "host" => ids.hosts.push(value),
                "ipv4" => ids.ipv4.push(value),
                "ipv6" => ids.ipv6.push(value),
                "cidr" => ids.cidrs.push(value),
                // Only the first value counts, as upstream.
                "default-route" if !default_route_seen => {
                    default_route_seen = true;
                    ids.default_route = value.eq_ignore_ascii_case("true") || value == "1";
                }
                _ => {}
            }
        }
        Ok(ids)
    }
}

/// Refuses a value that cannot identify anything under `key`.
fn check_value(key: &str, value: &str) -> Result<(), String> {
    if value.contains([',', '=']) {
        return Err(format!(
            "{key}={value:?} holds ',' or '=': separate identifiers with '&', as in \
             host=node1&ipv4=10.0.0.1"
        ));
    }
    let parses = match key {
        "ipv4" => value.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => value.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => value.split_once('/').is_some_and(|(ip, bits)| {
            let bits = bits.parse::<u8>();
            match ip.parse::<std::net::IpAddr>() {
                Ok(std::net::IpAddr::V4(_)) => bits.is_ok_and(|b| b <= 32),
                Ok(std::net::IpAddr::V6(_)) => bits.is_ok_and(|b| b <= 128),
                Err(_) => false,
            }
        }),
        _ => !value.is_empty() && !value.contains(char::is_whitespace),
    };
    if parses {
        Ok(())
    } else {
        let expected = match key {
            "ipv4" => "an IPv4 address",
            "ipv6" => "an IPv6 address",
            "cidr" => "a CIDR such as 10.0.0.0/8 (escape '/' as %2F)",
            _ => "a host name without spaces",
        };
        Err(format!("{key}={value:?} is not {expected}"))
    }
}

/// `application/x-www-form-urlencoded` unescaping.
fn unescape(s: &str) -> Result<String, String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = bytes
                    .get(i + 1..i + 3)
                    .and_then(|h| std::str::from_utf8(h).ok())
                    .and_then(|h| u8::from_str_radix(h, 16).ok())
                    .ok_or_else(|| format!("invalid escape in agent identifiers: {s:?}"))?;
                out.push(hex);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| format!("agent identifiers are not UTF-8: {s:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_upstream_examples() {
        let ids =
            Identifiers::parse("host=node1&ipv4=1.2.3.4&ipv6=fd00%3A%3A1&default-route=true&x=y")
                .unwrap();
        assert_eq!(ids.hosts, ["node1"]);
        assert_eq!(ids.ipv4, ["1.2.3.4"]);
        assert_eq!(ids.ipv6, ["fd00::1"]);
        assert!(ids.default_route);
        assert_eq!(Identifiers::parse("").unwrap(), Identifiers::default());
        assert!(Identifiers::parse("host=%zz").is_err());
        assert!(
            !Identifiers::parse("default-route=false&default-route=true")
                .unwrap()
                .default_route
        );
        assert!(Identifiers::parse_strict("host=a&zone=b").is_err());
        assert!(Identifiers::parse_strict("host=a&cidr=10.0.0.0%2F8").is_ok());
        assert!(Identifiers::parse_strict("host=a&cidr=10.0.0.0/8&ipv6=fd00::1").is_ok());
    }

    #[test]
    fn strict_parsing_refuses_values_that_never_match() {
        for (query, says) in [
            ("host=node1,ipv4=10.0.0.1", "separate identifiers with '&'"),
            ("host=node1=x", "holds ',' or '='"),
            ("ipv4=10.0.0.300", "is not an IPv4 address"),
            ("ipv4=fd00::1", "is not an IPv4 address"),
            ("ipv6=10.0.0.1", "is not an IPv6 address"),
            ("cidr=10.0.0.0", "is not a CIDR"),
            ("cidr=10.0.0.0/33", "is not a CIDR"),
            ("host=", "is not a host name"),
            ("host=a+b", "is not a host name"),
        ] {
            let error = Identifiers::parse_strict(query).unwrap_err();
            assert!(error.contains(says), "{query}: {error}");
        }
        // The server's lenient parse keeps accepting what upstream's agents send.
        assert_eq!(
            Identifiers::parse("host=node1,ipv4=10.0.0.1")
                .unwrap()
                .hosts,
            ["node1,ipv4=10.0.0.1"]
        );
    }
}
