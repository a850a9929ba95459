//! Typed errors for everything this crate can fail at.
//!
//! Every message is self-contained: it names the offending file (or flag) and what was wrong
//! with it, so that a caller can log it with `%err` alone and an operator can fix the
//! manifest without reading code. For the same reason the variants carry the underlying error
//! as a plain field rather than as a `source()`, which would print the same text twice in a
//! `{:#}` chain.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::time::SystemTime;

use crate::validity::{CertTime, OutsideValidity};

/// Where a PEM document came from: a file named by a flag, or a string held in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PemOrigin {
    /// Read from this file.
    File(PathBuf),
    /// Passed in as a string (quickstart, tests).
    Inline,
}

impl fmt::Display for PemOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => path.display().fmt(f),
            Self::Inline => f.write_str("<in-memory PEM>"),
        }
    }
}

/// What was wrong with a PEM document.
#[derive(Debug, thiserror::Error)]
pub enum PemProblem {
    /// The file could not be opened or read.
    #[error("{0}")]
    Io(io::Error),
    /// The document holds no `CERTIFICATE` section (empty file, wrong file, or plain garbage,
    /// which the PEM reader skips over).
    #[error("no certificate found")]
    NoCertificate,
    /// The document holds no private key section of a kind rustls understands.
    #[error("no private key found (expected a PKCS#8, PKCS#1 or SEC1 PEM section)")]
    NoPrivateKey,
    /// A PEM section is syntactically broken (bad base64, missing END line, ...).
    #[error("malformed PEM: {0}")]
    Malformed(rustls_pki_types::pem::Error),
    /// A certificate in a CA bundle could not be used as a trust anchor.
    #[error("unusable CA certificate: {0}")]
    BadCaCertificate(rustls::Error),
}

/// Errors from parsing TLS flags, loading PEM material, building rustls configs or generating
/// the throwaway PKI.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A certificate, key or CA bundle could not be loaded.
    #[error("reading {what} {origin}: {problem}")]
    Pem {
        /// The role of the document, e.g. "certificate chain" or "client CA bundle".
        what: &'static str,
        /// The file (or in-memory string) it came from.
        origin: PemOrigin,
        /// What was wrong with it.
        problem: PemProblem,
    },
    /// `--tls-min-version` is not one of Go's `VersionTLS1x` names.
    #[error(
        "--tls-min-version {value:?}: unknown TLS version; expected one of \
         VersionTLS10, VersionTLS11, VersionTLS12, VersionTLS13 (or empty for TLS 1.2)"
    )]
    UnknownTlsVersion {
        /// The value as given.
        value: String,
    },
    /// `--cipher-suites` names a suite that is unknown or that rustls does not implement
    /// (CBC, RSA key exchange, 3DES, RC4: all deliberately absent from rustls).
    #[error(
        "--cipher-suites: {name:?} is unknown or not supported by rustls; supported: {supported}"
    )]
    UnsupportedCipherSuite {
        /// The offending name.
        name: String,
        /// Comma-separated list of the names that are accepted.
        supported: String,
    },
    /// The certificate chain and private key do not form a usable pair (mismatched key,
    /// unsupported key type, ...).
    #[error("certificate {cert} with private key {key}: {error}")]
    CertifiedKey {
        /// Where the certificate chain came from.
        cert: PemOrigin,
        /// Where the private key came from.
        key: PemOrigin,
        /// What rustls said.
        error: rustls::Error,
    },
    /// A certificate of one's own chain is outside its validity period: every peer would
    /// refuse it, so it is not loaded (at start-up, an error; on reload, the previous
    /// certificate stays).
    #[error("certificate {cert}{}: {outside}; the time is now {now}", chain_position(*index))]
    OutsideValidity {
        /// Where the certificate chain came from.
        cert: PemOrigin,
        /// The certificate's position in the chain, 0 for the end entity.
        index: usize,
        /// Expired or not yet valid, and since or until when.
        outside: OutsideValidity,
        /// The time it was checked at.
        now: CertTime,
    },
    /// The client-certificate verifier could not be built from the CA bundle.
    #[error("client CA bundle {ca}: {error}")]
    ClientVerifier {
        /// Where the CA bundle came from.
        ca: PemOrigin,
        /// What rustls said.
        error: rustls::client::VerifierBuilderError,
    },
    /// Some other step of building a rustls config failed.
    #[error("{what}: {error}")]
    Rustls {
        /// The step that failed, e.g. "creating session ticketer".
        what: &'static str,
        /// What rustls said.
        error: rustls::Error,
    },
    /// rcgen could not generate a key or certificate.
    #[error("generating {what}: {error}")]
    Generate {
        /// What was being generated, e.g. "CA certificate".
        what: &'static str,
        /// What rcgen said.
        error: rcgen::Error,
    },
    /// A PKI file (or its directory) could not be written.
    #[error("writing {}: {error}", path.display())]
    Write {
        /// The file or directory that could not be written.
        path: PathBuf,
        /// The I/O error.
        error: io::Error,
    },
}

impl TlsError {
    /// When a certificate that is not valid yet becomes valid: a reload tries the same files
    /// again then.
    pub fn valid_from(&self) -> Option<SystemTime> {
        match self {
            Self::OutsideValidity {
                outside: OutsideValidity::NotYetValid { not_before },
                ..
            } => Some(not_before.to_system()),
            _ => None,
        }
    }

    /// Whether the error is a certificate outside its validity period (a file that needs a
    /// new certificate, not a half-written one).
    pub fn is_outside_validity(&self) -> bool {
        matches!(self, Self::OutsideValidity { .. })
    }
}

/// " (certificate N of its chain)" for a certificate after the end entity.
fn chain_position(index: usize) -> String {
    if index == 0 {
        String::new()
    } else {
        format!(" (certificate {} of its chain)", index + 1)
    }
}
