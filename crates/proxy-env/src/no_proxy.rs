//! `NO_PROXY` matching as grpc-go's default proxy mapper does it: grpc-go asks Go's
//! `http.ProxyFromEnvironment`, which is `golang.org/x/net/http/httpproxy`'s `useProxy` over
//! the entries parsed by its `config.init` (Go 1.26's vendored copy, mirrored rule by rule).

use std::net::IpAddr;

/// The parsed `NO_PROXY` list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct NoProxy {
    /// `*`: no destination uses the proxy.
    all: bool,
    /// IP and CIDR entries, checked only for IP destinations.
    ips: Vec<IpEntry>,
    /// Name entries, checked only for name destinations.
    domains: Vec<DomainEntry>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum IpEntry {
    /// `10.0.0.0/8`, `fd00::/8` (any port).
    Cidr { network: IpAddr, prefix: u8 },
    /// `10.1.2.3`, `10.1.2.3:443`, `[::1]:443`; an empty port matches every port.
    Ip { ip: IpAddr, port: String },
}

/// `example.com` (the name and its subdomains), `.example.com` and `*.example.com` (only
/// subdomains), each optionally with `:port`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct DomainEntry {
    /// Always with a leading dot.
    suffix: String,
    port: String,
    /// The entry had no leading dot: the name itself matches too.
    match_host: bool,
}

impl NoProxy {
    /// Parses a `NO_PROXY` value as httpproxy's `config.init`: comma-separated entries,
    /// trimmed and lower-cased; empty and malformed entries are skipped, as in Go.
    pub(crate) fn parse(value: &str) -> Self {
        let mut parsed = Self::default();
        for entry in value.split(',') {
            let entry = entry.trim().to_lowercase();
            if entry.is_empty() {
                continue;
            }
            if entry == "*" {
                return Self {
                    all: true,
                    ..Self::default()
                };
            }
            if let Some(cidr) = parse_cidr(&entry) {
                parsed.ips.push(cidr);
                continue;
            }
            let (host, port) = match split_host_port(&entry) {
                Some(("", _)) => continue,
                Some((host, port)) => (
                    host.strip_prefix('[')
                        .and_then(|h| h.strip_suffix(']'))
                        .unwrap_or(host),
                    port,
                ),
                None => (entry.as_str(), ""),
            };
            if let Ok(ip) = host.parse::<IpAddr>() {
                parsed.ips.push(IpEntry::Ip {
                    ip: ip.to_canonical(),
                    port: port.to_owned(),
                });
                continue;
            }
            if host.is_empty() {
                continue;
            }
            let host = host
                .strip_prefix('*')
                .filter(|h| h.starts_with('.'))
                .unwrap_or(host);
            let (suffix, match_host) = match host.starts_with('.') {
                true => (host.to_owned(), false),
                false => (format!(".{host}"), true),
            };
            parsed.domains.push(DomainEntry {
                suffix,
                port: port.to_owned(),
                match_host,
            });
        }
        parsed
    }

    /// Whether connections to `host:port` go through the proxy (httpproxy's `useProxy`).
    ///
    /// `localhost` and loopback IPs never do, whatever `NO_PROXY` says: httpproxy refuses to
    /// proxy them. It compares the name with `localhost` before lower-casing it, so
    /// `LOCALHOST` is proxied (as by grpc-go). A name is matched only against name entries and
    /// an IP only against IP and CIDR entries (a name is never resolved to compare it).
    pub(crate) fn use_proxy(&self, host: &str, port: u16) -> bool {
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host == "localhost" {
            return false;
        }
        let ip = host.parse::<IpAddr>().ok().map(|ip| ip.to_canonical());
        if ip.is_some_and(|ip| ip.is_loopback()) {
            return false;
        }
        if self.all {
            return false;
        }
        let port = port.to_string();
        let host = host.trim().to_lowercase();
        let excluded = match ip {
            Some(ip) => self.ips.iter().any(|entry| entry.matches(ip, &port)),
            None => self.domains.iter().any(|entry| entry.matches(&host, &port)),
        };
        !excluded
    }
}

impl IpEntry {
    fn matches(&self, ip: IpAddr, port: &str) -> bool {
        match self {
            Self::Cidr { network, prefix } => in_network(ip, *network, *prefix),
            Self::Ip {
                ip: entry,
                port: entry_port,
            } => *entry == ip && (entry_port.is_empty() || entry_port == port),
        }
    }
}

impl DomainEntry {
    fn matches(&self, host: &str, port: &str) -> bool {
        let name = host.ends_with(&self.suffix) || (self.match_host && host == &self.suffix[1..]);
        name && (self.port.is_empty() || self.port == port)
    }
}

/// `ip/prefix` as Go's `net.ParseCIDR` accepts it (host bits may be set; they are masked).
fn parse_cidr(entry: &str) -> Option<IpEntry> {
    let (ip, prefix) = entry.split_once('/')?;
    let ip = ip.parse::<IpAddr>().ok()?;
    if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let prefix = prefix.parse::<u8>().ok()?;
    let bits = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= bits).then_some(IpEntry::Cidr {
        network: ip,
        prefix,
    })
}

/// Whether `ip` is in `network/prefix`. An IPv4-mapped IPv6 address counts as its IPv4
/// address (Go's `IPNet.Contains` does `To4` first); IPv4 and IPv6 never match each other.
fn in_network(ip: IpAddr, network: IpAddr, prefix: u8) -> bool {
    match (ip, network) {
        (IpAddr::V4(ip), IpAddr::V4(network)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(network) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(network)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(network) & mask
        }
        _ => false,
    }
}

/// Go's `net.SplitHostPort`: `host:port` or `[host]:port` (brackets removed); `None` where Go
/// returns an error (no port, too many colons, misplaced brackets). The port may be empty.
fn split_host_port(s: &str) -> Option<(&str, &str)> {
    let colon = s.rfind(':')?;
    let (host, after_host) = if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')? + 1;
        if end + 1 != colon {
            return None;
        }
        (&s[1..end], end + 1)
    } else {
        let host = &s[..colon];
        if host.contains(':') {
            return None;
        }
        (host, 0)
    };
    let leading = if after_host == 0 { 0 } else { 1 };
    if s[leading..].contains('[') || s[after_host..].contains(']') {
        return None;
    }
    Some((host, &s[colon + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// httpproxy's `TestUseProxy`-style cases and grpc-go's: (NO_PROXY, host, port, proxied).
    #[test]
    fn matches_like_httpproxy() {
        let cases: &[(&str, &str, u16, bool)] = &[
            // Loopback and localhost never go through the proxy, even with no NO_PROXY.
            ("", "localhost", 443, false),
            ("", "127.0.0.1", 443, false),
            ("", "127.5.6.7", 443, false),
            ("", "::1", 443, false),
            ("", "[::1]", 443, false),
            ("", "::ffff:127.0.0.1", 443, false),
            // ... but only the exact lower-case name: httpproxy compares before lower-casing.
            ("", "LOCALHOST", 443, true),
            ("", "localhost.localdomain", 443, true),
            ("", "example.com", 443, true),
            ("", "10.0.0.1", 443, true),
            // `*` turns the proxy off for everything.
            ("*", "example.com", 443, false),
            ("*", "10.0.0.1", 443, false),
            ("foo, *", "example.com", 443, false),
            // Name without a dot: the name and its subdomains.
            ("example.com", "example.com", 443, false),
            ("example.com", "EXAMPLE.COM", 443, false),
            ("example.com", "www.example.com", 443, false),
            ("example.com", "notexample.com", 443, true),
            ("example.com", "example.com.evil", 443, true),
            // Leading dot or `*.`: subdomains only.
            (".example.com", "example.com", 443, true),
            (".example.com", "www.example.com", 443, false),
            ("*.example.com", "example.com", 443, true),
            ("*.example.com", "a.b.example.com", 443, false),
            // Ports: only that port.
            ("example.com:443", "example.com", 443, false),
            ("example.com:443", "example.com", 8091, true),
            (".example.com:8091", "www.example.com", 8091, false),
            // A port written with leading zeros is compared as text, as in Go.
            ("example.com:0443", "example.com", 443, true),
            // IPs and CIDRs match only IP destinations.
            ("10.0.0.1", "10.0.0.1", 443, false),
            ("10.0.0.1", "10.0.0.2", 443, true),
            ("10.0.0.1:8091", "10.0.0.1", 8091, false),
            ("10.0.0.1:8091", "10.0.0.1", 443, true),
            ("10.0.0.0/8", "10.200.3.4", 443, false),
            ("10.0.0.0/8", "11.0.0.1", 443, true),
            ("10.1.2.3/8", "10.9.9.9", 443, false),
            ("10.0.0.0/8", "::ffff:10.1.1.1", 443, false),
            ("fd00::/8", "fd12::1", 443, false),
            ("fd00::/8", "fe80::1", 443, true),
            ("fd00::1", "fd00::1", 443, false),
            ("[fd00::1]:8091", "fd00::1", 8091, false),
            ("[fd00::1]:8091", "fd00::1", 443, true),
            ("::ffff:10.0.0.1", "10.0.0.1", 443, false),
            ("0.0.0.0/0", "192.0.2.1", 443, false),
            ("0.0.0.0/0", "2001:db8::1", 443, true),
            // An IP entry never matches a name, nor a name entry an IP.
            ("10.0.0.1", "ten.example", 443, true),
            ("10.0.0.1", "10.0.0.1.example", 443, true),
            ("example.com", "10.0.0.1", 443, true),
            // Spaces and case in entries; empty and malformed entries are skipped.
            (" Example.COM ,, ", "www.example.com", 443, false),
            (":443", "example.com", 443, true),
            ("10.0.0.0/33", "10.0.0.1", 443, true),
            // Several entries.
            ("foo.com, .bar.com, 10.0.0.0/8", "x.bar.com", 443, false),
            ("foo.com, .bar.com, 10.0.0.0/8", "10.1.1.1", 443, false),
            ("foo.com, .bar.com, 10.0.0.0/8", "bar.com", 443, true),
        ];
        for &(no_proxy, host, port, proxied) in cases {
            assert_eq!(
                NoProxy::parse(no_proxy).use_proxy(host, port),
                proxied,
                "NO_PROXY={no_proxy:?} {host}:{port}"
            );
        }
    }

    #[test]
    fn go_split_host_port() {
        assert_eq!(split_host_port("a.com:80"), Some(("a.com", "80")));
        assert_eq!(split_host_port("a.com:"), Some(("a.com", "")));
        assert_eq!(split_host_port("[::1]:80"), Some(("::1", "80")));
        assert_eq!(split_host_port("a.com"), None);
        assert_eq!(split_host_port("::1"), None);
        assert_eq!(split_host_port("[::1]"), None);
        assert_eq!(split_host_port("[::1]x:80"), None);
        assert_eq!(split_host_port("a[b]:80"), None);
    }
}
