//! Why a TLS handshake failed, read from the rustls error one side got, so that the server's
//! log and counter and the agent's message can say what to check instead of printing
//! rustls' variant names (`UnknownIssuer`, `received fatal alert: UnknownCA`).
//!
//! Each side words the advice itself ([`HandshakeFailure`] says what happened, not which of
//! its flags to check): the server and the agent name different flags for the same failure.

use std::error::Error as StdError;

use rustls::{AlertDescription, CertificateError};

/// What went wrong in a TLS handshake, as the side holding the error saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeFailure {
    /// The peer's certificate is not signed by a CA this side trusts.
    UnknownIssuer,
    /// The peer (a client) sent no certificate.
    NoCertificate,
    /// The peer's certificate is X.509 v1, which webpki refuses (it verifies v3 only).
    V1Certificate,
    /// The peer's certificate has expired or is not valid yet.
    OutsideValidity,
    /// The peer's certificate does not name the host that was dialed.
    WrongName,
    /// The peer's certificate was refused for another reason (key usage, signature,
    /// encoding, revocation).
    BadCertificate,
    /// The peer refused this side's certificate or handshake, with this alert.
    PeerAlert(AlertDescription),
    /// The two sides share no TLS version, cipher suite or ALPN protocol.
    Incompatible,
    /// The peer does not speak TLS (plain HTTP, a port scanner).
    NotTls,
    /// Any other rustls error.
    Other,
}

impl HandshakeFailure {
    /// The failure a rustls error stands for.
    pub fn of(error: &rustls::Error) -> Self {
        match error {
            rustls::Error::NoCertificatesPresented => Self::NoCertificate,
            rustls::Error::InvalidCertificate(certificate) => Self::of_certificate(certificate),
            rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol)
            | rustls::Error::NoApplicationProtocol
            | rustls::Error::PeerIncompatible(_) => Self::Incompatible,
            rustls::Error::AlertReceived(alert) => Self::PeerAlert(*alert),
            rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. } => {
                Self::NotTls
            }
            _ => Self::Other,
        }
    }

    fn of_certificate(error: &CertificateError) -> Self {
        match error {
            CertificateError::UnknownIssuer => Self::UnknownIssuer,
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => Self::OutsideValidity,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                Self::WrongName
            }
            // webpki's error is opaque to rustls (and not a dependency of tether): its
            // variant name is the one thing that tells a v1 certificate apart.
            CertificateError::Other(other)
                if format!("{other:?}").contains("UnsupportedCertVersion") =>
            {
                Self::V1Certificate
            }
            _ => Self::BadCertificate,
        }
    }

    /// The failure behind an error from a TLS stream (an `io::Error` holding the rustls
    /// error), or any error whose `source()` chain leads to one; `None` when no rustls error
    /// is found. h2 errors have no `source()`: open them with `h2::Error::get_io` first.
    pub fn find(error: &(dyn StdError + 'static)) -> Option<Self> {
        rustls_error(error).map(Self::of)
    }
}

/// The rustls error in `error`'s chain (see [`HandshakeFailure::find`]). tokio-rustls wraps
/// it in an `io::Error`, whose `source()` skips it, so io errors are opened by hand.
pub fn rustls_error<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a rustls::Error> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(rustls) = error.downcast_ref::<rustls::Error>() {
            return Some(rustls);
        }
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
            && let Some(found) = rustls_error(inner)
        {
            return Some(found);
        }
        next = error.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::OtherError;

    use super::*;

    /// The error tokio-rustls returns from a failed handshake.
    fn io(error: rustls::Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, error)
    }

    #[derive(Debug)]
    struct UnsupportedCertVersion;

    impl std::fmt::Display for UnsupportedCertVersion {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("UnsupportedCertVersion")
        }
    }

    impl StdError for UnsupportedCertVersion {}

    #[test]
    fn certificate_errors_name_what_was_wrong() {
        let cases = [
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                HandshakeFailure::UnknownIssuer,
            ),
            (
                rustls::Error::NoCertificatesPresented,
                HandshakeFailure::NoCertificate,
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                    UnsupportedCertVersion,
                )))),
                HandshakeFailure::V1Certificate,
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Expired),
                HandshakeFailure::OutsideValidity,
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
                HandshakeFailure::WrongName,
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::BadSignature),
                HandshakeFailure::BadCertificate,
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::UnknownCA),
                HandshakeFailure::PeerAlert(AlertDescription::UnknownCA),
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol),
                HandshakeFailure::Incompatible,
            ),
            (
                rustls::Error::General("other".into()),
                HandshakeFailure::Other,
            ),
        ];
        for (error, failure) in cases {
            assert_eq!(HandshakeFailure::of(&error), failure, "{error}");
            assert_eq!(HandshakeFailure::find(&io(error)), Some(failure));
        }
    }

    #[test]
    fn found_inside_wrappers_and_not_elsewhere() {
        #[derive(Debug, thiserror::Error)]
        #[error("outer")]
        struct Outer(#[source] std::io::Error);

        let outer = Outer(io(rustls::Error::NoCertificatesPresented));
        assert_eq!(
            HandshakeFailure::find(&outer),
            Some(HandshakeFailure::NoCertificate)
        );
        let plain = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(HandshakeFailure::find(&plain), None);
    }
}
