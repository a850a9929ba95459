//! What to check when the TLS connection to a proxy server fails, from the agent's side.
//!
//! rustls says `invalid peer certificate: UnknownIssuer` or, when the server refuses this
//! agent's certificate after a TLS 1.3 handshake already finished on this side, `received
//! fatal alert: UnknownCA` out of the HTTP/2 connection, which reads like an HTTP/2 problem.
//! [`describe`] puts the flags to check first; [`tether_tls::Watched`] keeps the rustls
//! error that h2 would reduce to text.

use std::error::Error as StdError;

use rustls::AlertDescription;
use tether_tls::HandshakeFailure;

/// `error`'s text, preceded by what to check when it is a TLS failure the agent can explain.
pub(crate) fn describe(error: &(dyn StdError + 'static)) -> String {
    let explained = tether_tls::rustls_error(error)
        .and_then(|tls| Some((advice(HandshakeFailure::of(tls))?, tls)));
    match explained {
        Some((advice, tls)) => format!("{advice} (TLS: {tls})"),
        None => error.to_string(),
    }
}

/// What to check for `failure`; `None` when there is nothing to add to rustls' text.
fn advice(failure: HandshakeFailure) -> Option<&'static str> {
    Some(match failure {
        HandshakeFailure::UnknownIssuer => {
            "the server's certificate is not signed by --ca-cert: check --ca-cert, and the \
             server's --cluster-cert"
        }
        HandshakeFailure::V1Certificate => {
            "the server's certificate (its --cluster-cert) is an X.509 v1 certificate, which \
             tether agents refuse (v3 required; Go accepts v1): issue it again with an \
             extension, see Certificates in the book's Install guide (docs/src/guide/install.md)"
        }
        HandshakeFailure::OutsideValidity => {
            "the server's certificate (its --cluster-cert) has expired or is not valid yet \
             (check its dates, and both clocks)"
        }
        HandshakeFailure::WrongName => {
            "the server's certificate does not name --proxy-server-host: use a name or \
             address its subjectAltName holds, or issue it again with this one"
        }
        HandshakeFailure::BadCertificate => {
            "the server's certificate (its --cluster-cert) was refused by the check against \
             --ca-cert"
        }
        HandshakeFailure::PeerAlert(alert) => server_alert(alert)?,
        HandshakeFailure::Incompatible => {
            "the server and this agent share no TLS version, cipher suite or ALPN protocol: \
             is --proxy-server-port the server's agent port (--agent-port), and does \
             --alpn-proto include h2?"
        }
        HandshakeFailure::NotTls => {
            "the server did not answer in TLS: is --proxy-server-port the server's agent \
             port (--agent-port)?"
        }
        // A server always sends a certificate; rustls' text says the rest.
        HandshakeFailure::NoCertificate | HandshakeFailure::Other => return None,
    })
}

/// An alert the server sent, almost always about this agent's client certificate.
fn server_alert(alert: AlertDescription) -> Option<&'static str> {
    Some(match alert {
        // rustls servers say unknown_ca, Go servers bad_certificate.
        AlertDescription::UnknownCA | AlertDescription::BadCertificate => {
            "the server rejected this agent's client certificate: is --agent-cert signed by \
             the server's --cluster-ca-cert?"
        }
        AlertDescription::CertificateRequired => {
            "the server requires a client certificate and this agent sent none: give \
             --agent-cert and --agent-key, signed by the server's --cluster-ca-cert"
        }
        // What a tether server sends for an X.509 v1 client certificate.
        AlertDescription::CertificateUnknown | AlertDescription::UnsupportedCertificate => {
            "the server rejected this agent's client certificate without saying why: is \
             --agent-cert an X.509 v1 certificate? tether servers require v3 (see \
             Certificates in the book's Install guide, docs/src/guide/install.md)"
        }
        AlertDescription::CertificateExpired => {
            "the server finds this agent's client certificate (--agent-cert) expired or not \
             valid yet (check its dates, and both clocks)"
        }
        AlertDescription::CertificateRevoked => {
            "the server says this agent's client certificate (--agent-cert) is revoked"
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rustls::{CertificateError, OtherError};

    use super::*;

    /// The error tokio-rustls returns from a failed handshake.
    fn tls(error: rustls::Error) -> std::io::Error {
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

    /// Every failure the operator trial met, with the words its message must hold.
    #[test]
    fn each_failure_says_what_to_check() {
        let cases = [
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                "not signed by --ca-cert",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(
                    UnsupportedCertVersion,
                )))),
                "X.509 v1",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::Expired),
                "expired",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
                "--proxy-server-host",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::UnknownCA),
                "is --agent-cert signed by the server's --cluster-ca-cert?",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::BadCertificate),
                "is --agent-cert signed by the server's --cluster-ca-cert?",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
                "sent none: give --agent-cert and --agent-key",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateUnknown),
                "X.509 v1",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateExpired),
                "expired",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol),
                "--alpn-proto",
            ),
        ];
        for (error, words) in cases {
            let rustls_text = error.to_string();
            let text = describe(&tls(error));
            assert!(text.contains(words), "{text}");
            assert_eq!(text.matches(&rustls_text).count(), 1, "{text}");
        }
    }

    #[test]
    fn other_errors_keep_their_own_text() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(describe(&refused), refused.to_string());
        let general = tls(rustls::Error::General("no".into()));
        assert_eq!(describe(&general), general.to_string());
    }
}
