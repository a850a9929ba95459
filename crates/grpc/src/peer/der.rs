//! Just enough DER to read a certificate's subject CN and subjectAltName entries.
//!
//! The certificate has already been verified by rustls when this runs, so the reader only
//! needs to walk the structure; it still checks every length, and anything it does not
//! understand is an error rather than a guess.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::CertificateNames;

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

pub(super) fn names(der: &[u8]) -> Result<CertificateNames, CertificateError> {
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
