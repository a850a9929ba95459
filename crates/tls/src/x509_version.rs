//! X.509 v1 certificates: what `openssl x509 -req` makes when no extensions are given, as in
//! the kubernetes.io task "Set up Konnectivity service".
//!
//! webpki parses only v3 certificates as end entities (v1 is fine as a trust anchor), so
//! rustls' own check that a certificate matches its private key fails on a v1 certificate with
//! `UnsupportedCertVersion`, where Go loads it. tether's own certificates are therefore
//! checked here: the version and the SubjectPublicKeyInfo are read from the DER directly.
//! Peers' certificates still go through webpki, which refuses v1 end entities.

/// The X.509 version (1, 2 or 3) of a DER certificate; `None` when it is not DER X.509.
pub fn x509_version(cert: &[u8]) -> Option<u8> {
    tbs_fields(cert).map(|fields| fields.version)
}

/// The DER `SubjectPublicKeyInfo` (the whole SEQUENCE) of a certificate.
pub(crate) fn subject_public_key_info(cert: &[u8]) -> Option<&[u8]> {
    tbs_fields(cert).map(|fields| fields.spki)
}

/// The contents of a certificate's `Validity` SEQUENCE: `notBefore` and `notAfter`.
pub(crate) fn validity(cert: &[u8]) -> Option<&[u8]> {
    tbs_fields(cert).map(|fields| fields.validity)
}

/// The fields of a `tbsCertificate` that tether reads.
struct TbsFields<'a> {
    version: u8,
    /// The contents of the `Validity` SEQUENCE.
    validity: &'a [u8],
    /// The whole `SubjectPublicKeyInfo` SEQUENCE.
    spki: &'a [u8],
}

const SEQUENCE: u8 = 0x30;
const INTEGER: u8 = 0x02;
/// `[0] EXPLICIT`: the optional version field, absent in v1 certificates.
const VERSION_TAG: u8 = 0xa0;

/// Walks `Certificate { tbsCertificate { [0] version?, serialNumber, signature, issuer,
/// validity, subject, subjectPublicKeyInfo, ... }, ... }`.
fn tbs_fields(cert: &[u8]) -> Option<TbsFields<'_>> {
    let certificate = Tlv::read(cert).filter(|t| t.tag == SEQUENCE)?;
    let tbs = Tlv::read(certificate.value).filter(|t| t.tag == SEQUENCE)?;
    let mut field = Tlv::read(tbs.value)?;
    let version = if field.tag == VERSION_TAG {
        let version = Tlv::read(field.value)?;
        field = Tlv::read(field.rest)?;
        match (version.tag, version.value, version.rest) {
            // v2 and v3 are encoded as 1 and 2.
            (INTEGER, [v @ 0..=2], []) => v + 1,
            _ => return None,
        }
    } else {
        1
    };
    let mut validity = None;
    // serialNumber, signature, issuer, validity, subject.
    for (index, expected) in [INTEGER, SEQUENCE, SEQUENCE, SEQUENCE, SEQUENCE]
        .into_iter()
        .enumerate()
    {
        if field.tag != expected {
            return None;
        }
        if index == 3 {
            validity = Some(field.value);
        }
        field = Tlv::read(field.rest)?;
    }
    (field.tag == SEQUENCE).then_some(TbsFields {
        version,
        validity: validity?,
        spki: field.whole,
    })
}

/// One DER tag-length-value.
pub(crate) struct Tlv<'a> {
    pub(crate) tag: u8,
    pub(crate) value: &'a [u8],
    /// Tag, length and value.
    whole: &'a [u8],
    /// What follows it.
    pub(crate) rest: &'a [u8],
}

impl<'a> Tlv<'a> {
    /// Only the definite lengths DER allows, up to 4 length bytes.
    pub(crate) fn read(input: &'a [u8]) -> Option<Self> {
        let (&tag, after_tag) = input.split_first()?;
        let (&first, after_len) = after_tag.split_first()?;
        let (len, header) = match first {
            0..=0x7f => (usize::from(first), 2),
            0x81..=0x84 => {
                let n = usize::from(first & 0x7f);
                let bytes = after_len.get(..n)?;
                let len = bytes
                    .iter()
                    .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
                (len, 2 + n)
            }
            _ => return None,
        };
        let end = header.checked_add(len)?;
        let whole = input.get(..end)?;
        Some(Self {
            tag,
            value: &whole[header..],
            whole,
            rest: &input[end..],
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rcgen_certificates_are_v3() {
        let pki = crate::pki::Pki::generate().unwrap();
        let der: rustls_pki_types::CertificateDer<'_> =
            rustls_pki_types::pem::PemObject::from_pem_slice(pki.ca_cert_pem.as_bytes()).unwrap();
        assert_eq!(x509_version(&der), Some(3));
        let spki = subject_public_key_info(&der).unwrap();
        assert_eq!(spki[0], SEQUENCE);
    }

    #[test]
    fn garbage_and_truncation_are_not_certificates() {
        assert_eq!(x509_version(b""), None);
        assert_eq!(x509_version(b"\x30\x82\xff"), None);
        assert_eq!(x509_version(b"\x30\x03\x30\x01\x00"), None);
        assert_eq!(x509_version(&[0x30, 0x85, 0, 0, 0, 0, 1]), None);
    }
}
