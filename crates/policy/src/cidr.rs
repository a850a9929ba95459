//! Address blocks (`10.0.0.0/8`, `fe80::/10`) and the one way addresses are compared.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// An IPv4 or IPv6 block. IPv4-mapped IPv6 blocks (`::ffff:0:0/96` and longer) are stored as
/// the IPv4 block they map, because addresses are matched in [`canonical`] form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parses `ADDR` (a single address) or `ADDR/PREFIX`. Host bits must be zero, so that a
    /// typo such as `10.0.0.1/8` is an error rather than a silently wider block.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (text, None),
        };
        let network: IpAddr = addr
            .parse()
            .map_err(|_| format!("{addr:?} is not an IPv4 or IPv6 address"))?;
        let max = max_prefix(network);
        let prefix = match prefix {
            None => max,
            // Digits only: `u8::from_str` would also take `+8`.
            Some(p) => Some(p)
                .filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|p| p.parse::<u8>().ok())
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("prefix length {p:?} in {text:?} is not 0 to {max}"))?,
        };
        if mask(network, prefix) != network {
            let fixed = Self {
                network: mask(network, prefix),
                prefix,
            };
            return Err(format!(
                "{text:?} has host bits set (did you mean {fixed}?)"
            ));
        }
        Ok(Self { network, prefix }.mapped_to_v4())
    }

    /// The prefix length: longer is more specific (longest-prefix matching).
    pub fn prefix_len(&self) -> u8 {
        self.prefix
    }

    /// Whether `ip` (any form) lies in this block.
    pub fn contains(&self, ip: IpAddr) -> bool {
        self.contains_canonical(canonical(ip))
    }

    fn contains_canonical(&self, ip: IpAddr) -> bool {
        match (self.network, ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) => {
                mask(ip, self.prefix) == self.network
            }
            _ => false,
        }
    }

    fn mapped_to_v4(self) -> Self {
        match self.network {
            IpAddr::V6(v6) if self.prefix >= 96 => match v6.to_ipv4_mapped() {
                Some(v4) => Self {
                    network: IpAddr::V4(v4),
                    prefix: self.prefix - 96,
                },
                None => self,
            },
            _ => self,
        }
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

/// The form addresses are compared in: IPv4-mapped IPv6 (`::ffff:169.254.169.254`) becomes
/// the IPv4 address it reaches, so a mapped spelling cannot slip past an IPv4 rule.
fn canonical(ip: IpAddr) -> IpAddr {
    ip.to_canonical()
}

fn max_prefix(ip: IpAddr) -> u8 {
    match ip {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

/// `ip` with every bit past `prefix` cleared.
fn mask(ip: IpAddr, prefix: u8) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let keep = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(bits & keep))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let keep = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(bits & keep))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn blocks_contain_their_addresses_in_every_spelling() {
        let link_local = Cidr::parse("169.254.0.0/16").unwrap();
        assert!(link_local.contains(ip("169.254.169.254")));
        assert!(link_local.contains(ip("::ffff:169.254.169.254")));
        assert!(!link_local.contains(ip("169.255.0.1")));
        assert!(!link_local.contains(ip("fe80::1")));
        let v6 = Cidr::parse("fe80::/10").unwrap();
        assert!(v6.contains(ip("fe80::1")) && v6.contains(ip("febf::1")));
        assert!(!v6.contains(ip("fec0::1")));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("1.2.3.4")) && !all.contains(ip("::1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("::1")));
        let single = Cidr::parse("fd00:ec2::254").unwrap();
        assert_eq!(single.to_string(), "fd00:ec2::254/128");
        // A mapped block is the IPv4 block it maps.
        let mapped = Cidr::parse("::ffff:127.0.0.0/104").unwrap();
        assert_eq!(mapped.to_string(), "127.0.0.0/8");
        assert!(mapped.contains(ip("127.0.0.1")));
    }

    #[test]
    fn malformed_blocks_say_what_is_wrong() {
        let e = Cidr::parse("10.0.0.1/8").unwrap_err();
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("10.0.0.0/+8").is_err());
        assert!(Cidr::parse("10.0.0.0/").is_err());
        assert!(Cidr::parse("::/129").is_err());
        assert!(Cidr::parse("example.com").is_err());
    }
}
