//! The names in a verified client certificate, and just enough DER to read its subject CN
//! and subjectAltName entries.
//!
//! The certificate has already been verified by rustls when this runs, so the reader only
//! needs to walk the structure; it still checks every length, and anything it does not
//! understand is an error rather than a guess.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The names in a verified client certificate's leaf: its subject CN and its SAN entries.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CertificateNames {
    /// The subject's commonName, when present and text.
    pub common_name: Option<String>,
    pub dns: Vec<String>,
    pub ips: Vec<IpAddr>,
    pub uris: Vec<String>,
}

impl CertificateNames {
    /// Reads the names from a DER-encoded X.509 certificate.
    pub fn from_der(der: &[u8]) -> Result<Self, CertificateError> {
        names(der)
    }

    /// True when `name` is the CN, a DNS SAN or a URI SAN (exact, case-insensitive for DNS).
    pub fn has_name(&self, name: &str) -> bool {
        self.common_name.as_deref() == Some(name)
            || self.dns.iter().any(|d| d.eq_ignore_ascii_case(name))
            || self.uris.iter().any(|u| u == name)
    }

    /// True when `ip` is an IP SAN.
    pub fn has_ip(&self, ip: IpAddr) -> bool {
        self.ips.contains(&ip)
    }
}

/// Why the names could not be read.
#[derive(Debug, thiserror::Error)]
#[error("malformed certificate: {0}")]
pub struct CertificateError(&'static str);

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
const OCTET_STRING: u8 = 0x04;
const BOOLEAN: u8 = 0x01;
/// `[3] EXPLICIT` around the extensions.
const EXTENSIONS: u8 = 0xa3;
/// `[0] EXPLICIT` around the version.
const VERSION: u8 = 0xa0;
/// 2.5.4.3
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// 2.5.29.17
const OID_SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];
const SAN_DNS: u8 = 0x82;
const SAN_URI: u8 = 0x86;
const SAN_IP: u8 = 0x87;

/// One TLV: its tag, its value, and what follows it.
fn tlv(input: &[u8]) -> Result<(u8, &[u8], &[u8]), CertificateError> {
    let err = CertificateError;
    let (&tag, rest) = input.split_first().ok_or(err("truncated"))?;
    if tag & 0x1f == 0x1f {
        return Err(err("multi-byte tag"));
    }
    let (&first, rest) = rest.split_first().ok_or(err("truncated length"))?;
    let (len, rest) = match first {
        n if n < 0x80 => (usize::from(n), rest),
        0x81..=0x84 => {
            let n = usize::from(first & 0x7f);
            if rest.len() < n {
                return Err(err("truncated length"));
            }
            let len = rest[..n]
                .iter()
                .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
            (len, &rest[n..])
        }
        _ => return Err(err("unsupported length form")),
    };
    if rest.len() < len {
        return Err(err("value longer than its container"));
    }
    Ok((tag, &rest[..len], &rest[len..]))
}

/// The value of a TLV that must carry `tag`.
fn expect(input: &[u8], tag: u8) -> Result<(&[u8], &[u8]), CertificateError> {
    let (found, value, rest) = tlv(input)?;
    if found != tag {
        return Err(CertificateError("unexpected element"));
    }
    Ok((value, rest))
}

fn names(der: &[u8]) -> Result<CertificateNames, CertificateError> {
    let (certificate, _) = expect(der, SEQUENCE)?;
    let (tbs, _) = expect(certificate, SEQUENCE)?;
    let mut rest = tbs;
    if tbs.first() == Some(&VERSION) {
        rest = tlv(rest)?.2;
    }
    // serialNumber, signature, issuer, validity: skipped.
    for _ in 0..4 {
        rest = tlv(rest)?.2;
    }
    let (subject, mut rest) = expect(rest, SEQUENCE)?;
    let mut names = CertificateNames {
        common_name: common_name(subject)?,
        ..CertificateNames::default()
    };
    rest = tlv(rest)?.2; // subjectPublicKeyInfo
    while !rest.is_empty() {
        let (tag, value, next) = tlv(rest)?;
        rest = next;
        if tag == EXTENSIONS {
            let (extensions, _) = expect(value, SEQUENCE)?;
            read_extensions(extensions, &mut names)?;
        }
    }
    Ok(names)
}

/// The first commonName of a Name, when it is a text string.
fn common_name(mut name: &[u8]) -> Result<Option<String>, CertificateError> {
    while !name.is_empty() {
        let (mut rdn, next) = expect(name, SET)?;
        name = next;
        while !rdn.is_empty() {
            let (attribute, next) = expect(rdn, SEQUENCE)?;
            rdn = next;
            let (oid, value) = expect(attribute, OID)?;
            if oid == OID_COMMON_NAME {
                let (tag, text, _) = tlv(value)?;
                // UTF8String, PrintableString, TeletexString (as Latin-1 ASCII), IA5String.
                if matches!(tag, 0x0c | 0x13 | 0x14 | 0x16) {
                    return Ok(std::str::from_utf8(text).ok().map(str::to_owned));
                }
            }
        }
    }
    Ok(None)
}

fn read_extensions(
    mut extensions: &[u8],
    names: &mut CertificateNames,
) -> Result<(), CertificateError> {
    while !extensions.is_empty() {
        let (extension, next) = expect(extensions, SEQUENCE)?;
        extensions = next;
        let (oid, mut rest) = expect(extension, OID)?;
        if rest.first() == Some(&BOOLEAN) {
            rest = tlv(rest)?.2;
        }
        let (value, _) = expect(rest, OCTET_STRING)?;
        if oid == OID_SUBJECT_ALT_NAME {
            let (mut general_names, _) = expect(value, SEQUENCE)?;
            while !general_names.is_empty() {
                let (tag, value, next) = tlv(general_names)?;
                general_names = next;
                let text = || std::str::from_utf8(value).ok().map(str::to_owned);
                match tag {
                    SAN_DNS => names.dns.extend(text()),
                    SAN_URI => names.uris.extend(text()),
                    SAN_IP => match value.len() {
                        4 => names.ips.push(IpAddr::V4(Ipv4Addr::from(
                            <[u8; 4]>::try_from(value).map_err(|_| CertificateError("ip"))?,
                        ))),
                        16 => names.ips.push(IpAddr::V6(Ipv6Addr::from(
                            <[u8; 16]>::try_from(value).map_err(|_| CertificateError("ip"))?,
                        ))),
                        _ => return Err(CertificateError("IP SAN of odd length")),
                    },
                    _ => {}
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rustls_pki_types::CertificateDer;
    use rustls_pki_types::pem::PemObject;
    use tether_tls::pki::{ClientSpec, Pki};

    use super::*;

    fn names_of(pem: &str) -> CertificateNames {
        let der = CertificateDer::from_pem_slice(pem.as_bytes()).unwrap();
        CertificateNames::from_der(&der).unwrap()
    }

    #[test]
    fn reads_cn_and_sans_of_generated_certificates() {
        let (pki, issued) = Pki::generate_with_clients(&[ClientSpec {
            common_name: "node-a",
            sans: &["node-a.example", "10.1.2.3", "fd00::7"],
        }])
        .unwrap();
        let node = names_of(&issued[0].cert_pem);
        assert_eq!(node.common_name.as_deref(), Some("node-a"));
        assert_eq!(node.dns, ["node-a.example"]);
        assert_eq!(
            node.ips,
            [
                "10.1.2.3".parse::<IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
        assert!(node.has_name("node-a") && node.has_name("NODE-A.example"));
        assert!(!node.has_name("node-b"));

        let server = names_of(&pki.server_cert_pem);
        assert_eq!(server.common_name.as_deref(), Some("proxy-frontend"));
        assert!(server.dns.contains(&"localhost".to_owned()));
        let agent = names_of(&pki.agent_cert_pem);
        assert_eq!(agent.common_name.as_deref(), Some("proxy-agent"));
        assert!(agent.dns.is_empty() && agent.ips.is_empty());
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        let (pki, _) = Pki::generate_with_clients(&[]).unwrap();
        let der = CertificateDer::from_pem_slice(pki.agent_cert_pem.as_bytes()).unwrap();
        for cut in 0..der.len() {
            let _ = CertificateNames::from_der(&der[..cut]);
        }
        assert!(CertificateNames::from_der(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert!(CertificateNames::from_der(&[]).is_err());
    }
}
