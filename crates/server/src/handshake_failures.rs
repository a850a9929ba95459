//! Refused TLS handshakes on the agent port, which were silent at the default verbosity
//! although "agents do not connect" is the most common ticket: each is logged with the
//! peer, what to check and the flag involved, and counted by reason in
//! `tether_server_agent_handshake_failures_total{reason}`.
//!
//! The log is rate-limited per reason (one line per second, then the count of those held
//! back), so a misconfigured fleet of thousands of agents cannot flood it; the counter
//! counts every one. A peer that closes before finishing the handshake (a load balancer's
//! TCP probe) is neither logged nor counted: it refused nothing.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use rustls::AlertDescription;
use tether_observe::metrics::{CounterVec, Registry};
use tether_tls::HandshakeFailure;

use crate::warn_limit::WarnLimit;

/// The `reason` label: a small fixed set, so the counter's cardinality stays bounded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Reason {
    UnknownIssuer,
    NoClientCertificate,
    V1Certificate,
    CertificateOutsideValidity,
    BadClientCertificate,
    ServerCertificateRefused,
    Incompatible,
    NotTls,
    Timeout,
    Other,
}

impl Reason {
    const ALL: [Self; 10] = [
        Self::UnknownIssuer,
        Self::NoClientCertificate,
        Self::V1Certificate,
        Self::CertificateOutsideValidity,
        Self::BadClientCertificate,
        Self::ServerCertificateRefused,
        Self::Incompatible,
        Self::NotTls,
        Self::Timeout,
        Self::Other,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::UnknownIssuer => "unknown_issuer",
            Self::NoClientCertificate => "no_client_certificate",
            Self::V1Certificate => "v1_certificate",
            Self::CertificateOutsideValidity => "certificate_outside_validity",
            Self::BadClientCertificate => "bad_client_certificate",
            Self::ServerCertificateRefused => "server_certificate_refused",
            Self::Incompatible => "incompatible",
            Self::NotTls => "not_tls",
            Self::Timeout => "timeout",
            Self::Other => "other",
        }
    }

    fn index(self) -> usize {
        Self::ALL
            .iter()
            .position(|r| *r == self)
            .expect("every reason is in ALL")
    }
}

/// A refused handshake: its counter label and the log line's explanation.
#[derive(Debug, PartialEq, Eq)]
struct Refusal {
    reason: Reason,
    explanation: String,
}

/// What a failed handshake on the agent port means, and what to check; `None` for a peer
/// that only closed the connection.
fn refusal(error: &io::Error) -> Option<Refusal> {
    let (reason, explanation) = match HandshakeFailure::find(error) {
        Some(failure) => explain(failure, error),
        None => match error.kind() {
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => return None,
            io::ErrorKind::TimedOut => (
                Reason::Timeout,
                "the TLS handshake did not finish within --connection-setup-timeout (a slow or \
                 stalled peer)"
                    .to_owned(),
            ),
            _ => (Reason::Other, error.to_string()),
        },
    };
    Some(Refusal {
        reason,
        explanation,
    })
}

fn explain(failure: HandshakeFailure, error: &io::Error) -> (Reason, String) {
    match failure {
        HandshakeFailure::UnknownIssuer => (
            Reason::UnknownIssuer,
            "the agent's client certificate is not signed by --cluster-ca-cert: check the \
             agent's --agent-cert, or add its CA to --cluster-ca-cert"
                .to_owned(),
        ),
        HandshakeFailure::NoCertificate => (
            Reason::NoClientCertificate,
            "the agent sent no client certificate, and --cluster-ca-cert requires one: give \
             the agent --agent-cert and --agent-key"
                .to_owned(),
        ),
        HandshakeFailure::V1Certificate => (
            Reason::V1Certificate,
            "the agent's client certificate (--agent-cert) is an X.509 v1 certificate (v3 \
             required; Go accepts v1, tether does not): issue it again with an extension, \
             see Certificates in the book's Install guide (docs/src/guide/install.md)"
                .to_owned(),
        ),
        HandshakeFailure::OutsideValidity => (
            Reason::CertificateOutsideValidity,
            "the agent's client certificate (--agent-cert) has expired or is not valid yet \
             (check its dates, and both clocks)"
                .to_owned(),
        ),
        HandshakeFailure::WrongName | HandshakeFailure::BadCertificate => (
            Reason::BadClientCertificate,
            format!(
                "the agent's client certificate (--agent-cert) was refused by the check \
                 against --cluster-ca-cert: {error}"
            ),
        ),
        HandshakeFailure::PeerAlert(alert) => agent_alert(alert),
        HandshakeFailure::Incompatible => (
            Reason::Incompatible,
            format!(
                "the agent and this server share no TLS version, cipher suite or ALPN \
                 protocol (check this server's --tls-min-version and --cipher-suites, and the \
                 agent's --alpn-proto): {error}"
            ),
        ),
        HandshakeFailure::NotTls => (
            Reason::NotTls,
            "the peer does not speak TLS (not an agent, or an agent dialing the wrong port)"
                .to_owned(),
        ),
        HandshakeFailure::Other => (Reason::Other, error.to_string()),
    }
}

/// An alert the agent sent: it refused this server's certificate, or something else.
fn agent_alert(alert: AlertDescription) -> (Reason, String) {
    let why = match alert {
        AlertDescription::UnknownCA => {
            "is not signed by a CA the agent trusts: check the agent's --ca-cert"
        }
        AlertDescription::CertificateExpired => {
            "has expired or is not valid yet for the agent (check its dates, and both clocks)"
        }
        AlertDescription::BadCertificate => {
            "was refused: is the name the agent dials (--proxy-server-host) in it, and (a Go \
             agent) is it signed by the agent's --ca-cert?"
        }
        AlertDescription::CertificateUnknown | AlertDescription::UnsupportedCertificate => {
            "was refused; a tether agent refuses an X.509 v1 certificate (v3 required, see \
             Certificates in the book's Install guide, docs/src/guide/install.md)"
        }
        AlertDescription::CertificateRevoked => "is revoked, says the agent",
        _ => {
            return (
                Reason::Other,
                format!("the agent ended the handshake with alert {alert:?}"),
            );
        }
    };
    (
        Reason::ServerCertificateRefused,
        format!(
            "the agent does not accept this server's certificate (--cluster-cert; it sent \
             alert {alert:?}): it {why}"
        ),
    )
}

/// The counter and the per-reason log limits; one per server.
#[derive(Debug)]
pub(crate) struct HandshakeFailures {
    failures: Arc<CounterVec>,
    logged: [WarnLimit; Reason::ALL.len()],
}

impl HandshakeFailures {
    pub(crate) fn register(registry: &Registry) -> Self {
        let failures = registry.counter_vec(
            "tether_server_agent_handshake_failures_total",
            "TLS handshakes refused on the agent port, by reason",
            &["reason"],
        );
        // Present from the start, so that alerts on them need no absent() special case.
        for reason in Reason::ALL {
            failures.with(&[reason.label()]);
        }
        Self {
            failures,
            logged: std::array::from_fn(|_| WarnLimit::new(Duration::from_secs(1))),
        }
    }

    /// Counts and logs the failed handshake of `peer` (its address).
    pub(crate) fn record(&self, peer: &str, error: &io::Error) {
        let Some(Refusal {
            reason,
            explanation,
        }) = refusal(error)
        else {
            tracing::debug!(%peer, %error, "agent connection closed during the TLS handshake");
            return;
        };
        self.failures.with(&[reason.label()]).inc();
        if let Some(suppressed) = self.logged[reason.index()].allow() {
            tracing::warn!(
                %peer,
                reason = %reason.label(),
                suppressed,
                "refused an agent's TLS handshake: {explanation}"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use rustls::CertificateError;

    use super::*;

    fn tls(error: rustls::Error) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, error)
    }

    fn reason(error: &io::Error) -> Option<Reason> {
        refusal(error).map(|r| r.reason)
    }

    #[test]
    fn each_failure_has_its_reason_and_names_a_flag() {
        let cases = [
            (
                tls(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                Reason::UnknownIssuer,
                "--cluster-ca-cert",
            ),
            (
                tls(rustls::Error::NoCertificatesPresented),
                Reason::NoClientCertificate,
                "--agent-cert",
            ),
            (
                tls(rustls::Error::InvalidCertificate(CertificateError::Expired)),
                Reason::CertificateOutsideValidity,
                "--agent-cert",
            ),
            (
                tls(rustls::Error::AlertReceived(AlertDescription::UnknownCA)),
                Reason::ServerCertificateRefused,
                "--ca-cert",
            ),
            (
                tls(rustls::Error::AlertReceived(
                    AlertDescription::CertificateUnknown,
                )),
                Reason::ServerCertificateRefused,
                "X.509 v1",
            ),
            (
                tls(rustls::Error::NoApplicationProtocol),
                Reason::Incompatible,
                "--alpn-proto",
            ),
            (
                io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"),
                Reason::Timeout,
                "--connection-setup-timeout",
            ),
        ];
        for (error, expected, flag) in cases {
            let refusal = refusal(&error).expect("a refusal");
            assert_eq!(refusal.reason, expected, "{error}");
            assert!(
                refusal.explanation.contains(flag),
                "{}",
                refusal.explanation
            );
        }
    }

    #[test]
    fn a_peer_that_only_closed_refused_nothing() {
        for kind in [io::ErrorKind::UnexpectedEof, io::ErrorKind::ConnectionReset] {
            assert_eq!(reason(&io::Error::from(kind)), None);
        }
    }

    #[test]
    fn every_reason_is_counted_from_zero() {
        let registry = Registry::new();
        let failures = HandshakeFailures::register(&registry);
        failures.record("127.0.0.1:1", &tls(rustls::Error::NoCertificatesPresented));
        failures.record("127.0.0.1:2", &tls(rustls::Error::NoCertificatesPresented));
        let text = registry.render();
        assert!(
            text.contains(
                "tether_server_agent_handshake_failures_total{reason=\"no_client_certificate\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("tether_server_agent_handshake_failures_total{reason=\"timeout\"} 0"),
            "{text}"
        );
    }
}
