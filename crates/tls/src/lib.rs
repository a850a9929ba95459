//! TLS for tether: rustls configs for every listener and dialer, built the way upstream
//! Konnectivity's flags describe them.
//!
//! - [`TlsOptions::from_go_flags`] accepts upstream's `--tls-min-version` and `--cipher-suites`
//!   values unchanged, so existing manifests keep working.
//! - [`server_config`] and [`client_config`] load certificates and keys from the PEM files named
//!   by `--server-cert`/`--server-key`, `--cluster-cert`/`--cluster-key`, `--server-ca-cert`,
//!   `--cluster-ca-cert`, `--ca-cert` and `--agent-cert`/`--agent-key`, with mutual TLS and ALPN
//!   (`h2` for gRPC, plus the agent's `--alpn-proto` ids).
//! - [`ClientCa`] derives a listener's config from another's with a client CA of its own
//!   (a tenant's own frontend), with its own session cache and ticket key.
//! - tether's own certificate chain must be valid now: an expired or not yet valid one is an
//!   error at start-up and is not loaded on reload ([`TlsError::OutsideValidity`]).
//! - tether's own certificates may be X.509 v1, as the kubernetes.io task's openssl recipe
//!   makes them and Go accepts them; rustls alone refuses those ([`x509_version`]).
//! - [`accept`] runs a server's TLS on a TCP socket as a [`ServerTlsStream`], which holds no
//!   buffer while the connection idles.
//! - [`HandshakeFailure`] reads what went wrong from a failed handshake's rustls error, for
//!   messages that say what to check; [`Watched`] keeps that error when h2 would reduce it
//!   to text.
//! - [`pki::Pki`] generates a throwaway CA and certificates for the quickstart, tests and
//!   benchmarks.
//!
//! Only rustls' `aws-lc-rs` provider is used, with the post-quantum hybrid X25519MLKEM768
//! preferred and the classical groups still accepted (`key_exchange.rs`). Every config is built
//! with an explicit provider, so nothing depends on a process-wide default;
//! [`install_default_provider`] installs the same provider for code that builds rustls configs
//! elsewhere (the Kubernetes API client).
//!
//! Errors are [`TlsError`]s whose messages name the file and what was wrong with it; callers add
//! the flag name (e.g. `--server-cert`) as context.

#![forbid(unsafe_code)]

mod client_ca;
mod config;
mod error;
mod handshake_failure;
mod key_exchange;
mod options;
pub mod pki;
mod reload;
mod stream;
mod validity;
mod watched;
mod x509_version;

pub use client_ca::ClientCa;
pub use config::{client_config, client_config_from_pem, server_config};
pub use error::{PemOrigin, PemProblem, TlsError};
pub use handshake_failure::{HandshakeFailure, rustls_error};
pub use options::{TlsOptions, TlsVersion, provider};
pub use reload::{ReloadOutcome, Reloading};
pub use stream::{ServerTlsStream, accept};
pub use validity::{CertTime, OutsideValidity};
pub use watched::Watched;
pub use x509_version::x509_version;

/// Installs this crate's [`provider`] (default options) as the process default, for callers
/// that build rustls configs with `ServerConfig::builder()`/`ClientConfig::builder()` rather
/// than through this crate, such as kube-rs' client: they then offer the same key exchange
/// groups, the post-quantum hybrid first, and do not panic should rustls be unable to infer a
/// default from its crate features.
///
/// Idempotent: calling it again, or after another provider was installed, leaves the existing
/// default in place.
pub fn install_default_provider() {
    // An `Err` only means a default is already installed, which is the state we want.
    let provider = rustls::crypto::CryptoProvider::clone(&provider(&TlsOptions::default()));
    let _already_installed = provider.install_default();
}
