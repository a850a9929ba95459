//! A listener that serves another listener's certificate but verifies its clients against
//! a CA of its own: a tenant's own TCP frontend with `client_ca` (tether-server's routing
//! file), next to the main frontend whose CA every other client chains to.
//!
//! The derived config has its own session cache and ticket key. A resumed session skips
//! client certificate verification, so a ticket the main frontend issued for a client of the
//! main CA must not resume here (rustls warns against sharing resumption storage between
//! configs that verify clients differently).

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::danger::ClientCertVerifier;
use rustls::server::{ProducesTickets, StoresServerSessions};
use rustls::{ServerConfig, SupportedProtocolVersion};

use crate::TlsError;
use crate::config::{client_verifier, new_session_state};

/// A client CA bundle, with the resumption state of the one listener it verifies for.
pub struct ClientCa {
    verifier: Arc<dyn ClientCertVerifier>,
    session_storage: Arc<dyn StoresServerSessions>,
    ticketer: Arc<dyn ProducesTickets>,
}

impl std::fmt::Debug for ClientCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientCa").finish_non_exhaustive()
    }
}

impl ClientCa {
    /// Reads the CA bundle at `ca`; `provider` is the crypto provider of the configs it will
    /// be applied to.
    pub fn load(ca: &Path, provider: &Arc<CryptoProvider>) -> Result<Self, TlsError> {
        let verifier = client_verifier(ca, provider)?;
        let (session_storage, ticketer) = new_session_state()?;
        Ok(Self {
            verifier,
            session_storage,
            ticketer,
        })
    }

    /// `base` (a config from [`crate::server_config`]) with this CA verifying client
    /// certificates instead of its own: the same certificate, protocol versions, suites and
    /// ALPN, and this listener's own session cache and ticket key.
    pub fn apply(&self, base: &ServerConfig) -> Result<Arc<ServerConfig>, TlsError> {
        let provider = base.crypto_provider();
        let mut config = ServerConfig::builder_with_provider(Arc::clone(provider))
            .with_protocol_versions(&versions(provider))
            .map_err(|error| TlsError::Rustls {
                what: "selecting TLS protocol versions",
                error,
            })?
            .with_client_cert_verifier(Arc::clone(&self.verifier))
            .with_cert_resolver(Arc::clone(&base.cert_resolver));
        config.alpn_protocols.clone_from(&base.alpn_protocols);
        config.ignore_client_order = base.ignore_client_order;
        config.max_fragment_size = base.max_fragment_size;
        config.session_storage = Arc::clone(&self.session_storage);
        config.ticketer = Arc::clone(&self.ticketer);
        Ok(Arc::new(config))
    }
}

/// The versions `provider` has suites for: [`crate::provider`] keeps none of TLS 1.2 when
/// the minimum is TLS 1.3, so these are the base config's versions.
fn versions(provider: &CryptoProvider) -> Vec<&'static SupportedProtocolVersion> {
    [&rustls::version::TLS12, &rustls::version::TLS13]
        .into_iter()
        .filter(|version| {
            provider
                .cipher_suites
                .iter()
                .any(|suite| suite.version().version == version.version)
        })
        .collect()
}

#[cfg(test)]
mod tests;
