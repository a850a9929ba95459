//! IPv6 addresses that embed an IPv4 address and may lead to it, so that a rule about the
//! IPv4 address also holds for them.
//!
//! IPv4-mapped addresses (`::ffff:a.b.c.d`) *are* the IPv4 address on a dual-stack socket
//! and are compared as it (see [`crate::cidr`]). The forms here are distinct IPv6 addresses
//! that a translator or tunnel turns into the IPv4 address they carry: NAT64 (RFC 6052,
//! 8215), 6to4 (RFC 3056), Teredo (RFC 4380), SIIT's IPv4-translated addresses (RFC 2765)
//! and the deprecated IPv4-compatible ones (RFC 4291), which Linux's `sit0` still routes.
//! A destination in one of these forms is judged twice, as itself and as the IPv4 address
//! it embeds, and refused if either is denied: `deny to 169.254.169.254` refuses
//! `[64:ff9b::a9fe:a9fe]` as it does `169.254.169.254`, as Smokescreen's deny ranges list
//! the NAT64 and 6to4 prefixes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One address a destination is judged as: the address itself, or an IPv4 address it embeds
/// with the name of the form that embeds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Judged {
    pub(crate) ip: IpAddr,
    /// `None` for the address itself; the embedding's name otherwise.
    pub(crate) embedded_by: Option<&'static str>,
}

impl Judged {
    /// Explains a denial reached through this form, e.g. "... (as 169.254.169.254, the IPv4
    /// address it embeds by NAT64)"; the address itself needs no explanation.
    pub(crate) fn explain(&self, rule: String) -> String {
        match self.embedded_by {
            None => rule,
            Some(form) => format!(
                "{rule}, as {}, the IPv4 address it embeds by {form}",
                self.ip
            ),
        }
    }
}

/// The addresses `ip` is judged as: itself first, then every IPv4 address it embeds (at most
/// two: a Teredo address carries its server's and its client's).
pub(crate) fn judged_as(ip: IpAddr) -> impl Iterator<Item = Judged> {
    let itself = Judged {
        ip,
        embedded_by: None,
    };
    let embedded = match ip {
        IpAddr::V6(v6) => embedded_ipv4(v6),
        IpAddr::V4(_) => [None, None],
    };
    std::iter::once(itself).chain(embedded.into_iter().flatten().map(|(v4, form)| Judged {
        ip: IpAddr::V4(v4),
        embedded_by: Some(form),
    }))
}

/// The IPv4 addresses an IPv6 address embeds, by form. IPv4-mapped addresses are not listed:
/// they are compared as IPv4 already.
fn embedded_ipv4(ip: Ipv6Addr) -> [Option<(Ipv4Addr, &'static str)>; 2] {
    let bits = u128::from(ip);
    let low32 = Ipv4Addr::from(bits as u32);
    let prefix = |len: u32| bits >> (128 - len);
    let one = |form| [Some((low32, form)), None];
    if prefix(96) == 0 {
        // `::` and `::1` are IPv6's own unspecified and loopback addresses.
        return if bits > 1 {
            one("IPv4-compatible address")
        } else {
            [None, None]
        };
    }
    if prefix(96) == 0xffff_0000 {
        return one("SIIT (IPv4-translated address)");
    }
    if prefix(96) == 0x0064_ff9b_0000_0000_0000_0000 {
        return one("NAT64 (64:ff9b::/96)");
    }
    if prefix(48) == 0x0064_ff9b_0001 {
        // RFC 8215's local-use prefix, with the /96 layout nearly every NAT64 uses.
        return one("NAT64 (64:ff9b:1::/48)");
    }
    if prefix(16) == 0x2002 {
        let v4 = Ipv4Addr::from((bits >> 80) as u32);
        return [Some((v4, "6to4 (2002::/16)")), None];
    }
    if prefix(32) == 0x2001_0000 {
        let server = Ipv4Addr::from((bits >> 64) as u32);
        // The client's address is stored inverted ("obfuscated").
        let client = Ipv4Addr::from(!(bits as u32));
        return [
            Some((server, "Teredo (2001::/32, server)")),
            Some((client, "Teredo (2001::/32, client)")),
        ];
    }
    [None, None]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn embedded(text: &str) -> Vec<String> {
        judged_as(text.parse().unwrap())
            .skip(1)
            .map(|j| j.ip.to_string())
            .collect()
    }

    #[test]
    fn every_form_yields_the_ipv4_address_it_carries() {
        let metadata = ["169.254.169.254"];
        // The review's spellings of the metadata address (N8).
        assert_eq!(embedded("::169.254.169.254"), metadata);
        assert_eq!(embedded("::a9fe:a9fe"), metadata);
        assert_eq!(embedded("64:ff9b::a9fe:a9fe"), metadata);
        assert_eq!(embedded("64:ff9b::169.254.169.254"), metadata);
        assert_eq!(embedded("2002:a9fe:a9fe::1"), metadata);
        assert_eq!(embedded("2002:a9fe:a9fe:ffff:1:2:3:4"), metadata);
        assert_eq!(embedded("64:ff9b:1:2::a9fe:a9fe"), metadata);
        assert_eq!(embedded("::ffff:0:a9fe:a9fe"), metadata);
        // Teredo: server 65.54.227.120, client 169.254.169.254 inverted (56.1.56.1 hex).
        assert_eq!(
            embedded("2001:0:4136:e378:8000:63bf:5601:5601"),
            ["65.54.227.120", "169.254.169.254"]
        );
    }

    #[test]
    fn other_addresses_embed_nothing() {
        for ip in [
            "::",
            "::1",
            "::ffff:169.254.169.254",
            "fe80::1",
            "2001:db8::a9fe:a9fe",
            "2003:a9fe:a9fe::1",
            "64:ff9b:2::a9fe:a9fe",
            "169.254.169.254",
        ] {
            assert!(embedded(ip).is_empty(), "{ip}");
        }
    }

    #[test]
    fn the_address_itself_comes_first_and_needs_no_explanation() {
        let all: Vec<Judged> = judged_as("64:ff9b::a9fe:a9fe".parse().unwrap()).collect();
        assert_eq!(all[0].ip, "64:ff9b::a9fe:a9fe".parse::<IpAddr>().unwrap());
        assert_eq!(all[0].explain("r".into()), "r");
        assert_eq!(
            all[1].explain("r".into()),
            "r, as 169.254.169.254, the IPv4 address it embeds by NAT64 (64:ff9b::/96)"
        );
    }
}
