//! Refused TLS handshakes on the agent port and on the TCP frontends, which were silent at
//! the default verbosity although "agents do not connect" is the most common ticket (and a
//! refused kube-apiserver fails every `logs`, `exec` and webhook): each is logged with the
//! peer, what to check and the flag involved, and counted by reason in
//! `tether_server_agent_handshake_failures_total{reason}` or
//! `tether_server_frontend_handshake_failures_total{reason}`.
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

/// Which listener refused: the words and flags of its explanations differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Listener {
    Agent,
    /// A TCP frontend for kube-apiserver: the main one (`--server-port`), or a tenant's own
    /// (its `frontend.client_ca` in the routing file).
    Frontend {
        tenant: Option<String>,
    },
}

/// What a failed handshake means, and what to check; `None` for a peer that only closed
/// the connection.
fn refusal(listener: &Listener, error: &io::Error) -> Option<Refusal> {
    let (reason, explanation) = match HandshakeFailure::find(error) {
        Some(failure) => match listener {
            Listener::Agent => explain(failure, error),
            Listener::Frontend { tenant } => explain_frontend(failure, error, tenant.as_deref()),
        },
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

/// What a failed handshake on a TCP frontend means; `tenant` names a tenant's own frontend,
/// whose client CA is its `frontend.client_ca`.
fn explain_frontend(
    failure: HandshakeFailure,
    error: &io::Error,
    tenant: Option<&str>,
) -> (Reason, String) {
    let ca = match tenant {
        Some(tenant) => format!("tenant {tenant:?}'s frontend.client_ca (--routing-config)"),
        None => "--server-ca-cert".to_owned(),
    };
    let certificate = "the client's certificate (kube-apiserver: the EgressSelectorConfiguration's \
                       tlsConfig.clientCert)";
    match failure {
        HandshakeFailure::UnknownIssuer => (
            Reason::UnknownIssuer,
            format!(
                "{certificate} is not signed by {ca}: check the one, or add its CA to the other"
            ),
        ),
        HandshakeFailure::NoCertificate => (
            Reason::NoClientCertificate,
            format!(
                "the client sent no certificate, and {ca} requires one: give kube-apiserver \
                 tlsConfig.clientCert and tlsConfig.clientKey"
            ),
        ),
        HandshakeFailure::V1Certificate => (
            Reason::V1Certificate,
            format!(
                "{certificate} is an X.509 v1 certificate (v3 required; Go accepts v1, tether \
                 does not): issue it again with an extension, see Certificates in the book's \
                 Install guide (docs/src/guide/install.md)"
            ),
        ),
        HandshakeFailure::OutsideValidity => (
            Reason::CertificateOutsideValidity,
            format!(
                "{certificate} has expired or is not valid yet (check its dates, and both clocks)"
            ),
        ),
        HandshakeFailure::WrongName | HandshakeFailure::BadCertificate => (
            Reason::BadClientCertificate,
            format!("{certificate} was refused by the check against {ca}: {error}"),
        ),
        HandshakeFailure::PeerAlert(alert) => {
            let why = match alert {
                AlertDescription::UnknownCA => {
                    "is not signed by a CA it trusts (tlsConfig.caBundle)"
                }
                AlertDescription::CertificateExpired => {
                    "has expired or is not valid yet for it (check the dates, and both clocks)"
                }
                // What Go clients send for any verification failure.
                AlertDescription::BadCertificate => {
                    "was refused: is the host of its url (or tlsConfig.tlsServerName) in it, and \
                     is it signed by tlsConfig.caBundle?"
                }
                AlertDescription::CertificateUnknown | AlertDescription::UnsupportedCertificate => {
                    "was refused; tether clients refuse an X.509 v1 certificate"
                }
                _ => {
                    return (
                        Reason::Other,
                        format!("the client ended the handshake with alert {alert:?}"),
                    );
                }
            };
            (
                Reason::ServerCertificateRefused,
                format!(
                    "the client does not accept this server's certificate (--server-cert; it \
                     sent alert {alert:?}): it {why}"
                ),
            )
        }
        HandshakeFailure::Incompatible => (
            Reason::Incompatible,
            format!(
                "the client and this server share no TLS version, cipher suite or ALPN \
                 protocol (check --tls-min-version and --cipher-suites, and that the client \
                 speaks this server's --mode): {error}"
            ),
        ),
        HandshakeFailure::NotTls => (
            Reason::NotTls,
            "the peer does not speak TLS (a plaintext client, or one dialing the wrong port)"
                .to_owned(),
        ),
        HandshakeFailure::Other => (Reason::Other, error.to_string()),
    }
}

/// The counter and the per-reason log limits; one per listener kind and server.
#[derive(Debug)]
pub(crate) struct HandshakeFailures {
    failures: Arc<CounterVec>,
    logged: [WarnLimit; Reason::ALL.len()],
}

impl HandshakeFailures {
    /// Counts the agent port's refusals.
    pub(crate) fn agents(registry: &Registry) -> Self {
        Self::register(
            registry,
            "tether_server_agent_handshake_failures_total",
            "TLS handshakes refused on the agent port, by reason",
        )
    }

    /// Counts the TCP frontends' refusals (the main one and tenants' own).
    pub(crate) fn frontends(registry: &Registry) -> Self {
        Self::register(
            registry,
            "tether_server_frontend_handshake_failures_total",
            "TLS handshakes refused on the TCP frontends (--server-port, tenants' own), by reason",
        )
    }

    fn register(registry: &Registry, name: &str, help: &str) -> Self {
        let failures = registry.counter_vec(name, help, &["reason"]);
        // Present from the start, so that alerts on them need no absent() special case.
        for reason in Reason::ALL {
            failures.with(&[reason.label()]);
        }
        Self {
            failures,
            logged: std::array::from_fn(|_| WarnLimit::new(Duration::from_secs(1))),
        }
    }

    /// Counts and logs the failed handshake of `peer` (its address) on `listener`.
    pub(crate) fn record(&self, listener: &Listener, peer: &str, error: &io::Error) {
        let Some(Refusal {
            reason,
            explanation,
        }) = refusal(listener, error)
        else {
            tracing::debug!(%peer, %error, "connection closed during the TLS handshake");
            return;
        };
        self.failures.with(&[reason.label()]).inc();
        let Some(suppressed) = self.logged[reason.index()].allow() else {
            return;
        };
        match listener {
            Listener::Agent => tracing::warn!(
                %peer,
                reason = %reason.label(),
                suppressed,
                "refused an agent's TLS handshake: {explanation}"
            ),
            Listener::Frontend { tenant } => tracing::warn!(
                %peer,
                tenant = tenant.as_deref(),
                reason = %reason.label(),
                suppressed,
                "refused a frontend client's TLS handshake: {explanation}"
            ),
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
        refusal(&Listener::Agent, error).map(|r| r.reason)
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
            let refusal = refusal(&Listener::Agent, &error).expect("a refusal");
            assert_eq!(refusal.reason, expected, "{error}");
            assert!(
                refusal.explanation.contains(flag),
                "{}",
                refusal.explanation
            );
        }
    }

    #[test]
    fn a_frontend_refusal_names_the_frontend_flags_and_kube_apiserver_settings() {
        let main = Listener::Frontend { tenant: None };
        let tenant = Listener::Frontend {
            tenant: Some("blue".into()),
        };
        let cases = [
            (
                &main,
                tls(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                Reason::UnknownIssuer,
                ["--server-ca-cert", "tlsConfig.clientCert"],
            ),
            (
                &tenant,
                tls(rustls::Error::InvalidCertificate(
                    CertificateError::UnknownIssuer,
                )),
                Reason::UnknownIssuer,
                [
                    "tenant \"blue\"'s frontend.client_ca",
                    "tlsConfig.clientCert",
                ],
            ),
            (
                &main,
                tls(rustls::Error::NoCertificatesPresented),
                Reason::NoClientCertificate,
                ["--server-ca-cert", "tlsConfig.clientKey"],
            ),
            (
                &main,
                tls(rustls::Error::AlertReceived(
                    AlertDescription::BadCertificate,
                )),
                Reason::ServerCertificateRefused,
                ["--server-cert", "tlsConfig.caBundle"],
            ),
            (
                &main,
                tls(rustls::Error::NoApplicationProtocol),
                Reason::Incompatible,
                ["--mode", "--tls-min-version"],
            ),
        ];
        for (listener, error, expected, words) in cases {
            let refusal = refusal(listener, &error).expect("a refusal");
            assert_eq!(refusal.reason, expected, "{error}");
            for word in words {
                assert!(
                    refusal.explanation.contains(word),
                    "{word}: {}",
                    refusal.explanation
                );
            }
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
        let failures = HandshakeFailures::agents(&registry);
        let agent = Listener::Agent;
        failures.record(
            &agent,
            "127.0.0.1:1",
            &tls(rustls::Error::NoCertificatesPresented),
        );
        failures.record(
            &agent,
            "127.0.0.1:2",
            &tls(rustls::Error::NoCertificatesPresented),
        );
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
