//! Where a listener's TLS config comes from, asked at each handshake: rotated certificates
//! and tenants' own client CAs change it without binding the listener again.

use std::path::Path;
use std::sync::{Arc, Mutex};

/// The TLS config of a listener: fixed, reloaded from its files (see `tls_reload`), or a
/// tenant's own CA over the main frontend's (see `tenant_frontend`).
#[derive(Clone)]
pub(crate) enum TlsSource {
    Fixed(Arc<rustls::ServerConfig>),
    Reloading(Arc<tether_tls::Reloading<rustls::ServerConfig>>),
    TenantCa(Arc<TenantTls>),
}

impl TlsSource {
    pub(crate) fn new(
        config: Arc<rustls::ServerConfig>,
        reloading: Option<Arc<tether_tls::Reloading<rustls::ServerConfig>>>,
    ) -> Self {
        match reloading {
            Some(r) => Self::Reloading(r),
            None => Self::Fixed(config),
        }
    }

    /// The config for a new handshake: the newest.
    pub(crate) fn config(&self) -> Arc<rustls::ServerConfig> {
        match self {
            Self::Fixed(config) => config.clone(),
            Self::Reloading(reloading) => reloading.current(),
            Self::TenantCa(tenant) => tenant.config(),
        }
    }
}

/// A tenant's TCP listener with its own client CA: the main frontend's TLS config, followed
/// through its reloads (a rotated certificate), with the tenant's CA verifying clients.
pub(crate) struct TenantTls {
    main: TlsSource,
    client_ca: tether_tls::ClientCa,
    /// The main config last seen and the config derived from it.
    derived: Mutex<(Arc<rustls::ServerConfig>, Arc<rustls::ServerConfig>)>,
}

impl TenantTls {
    pub(crate) fn new(main: TlsSource, client_ca: &Path) -> Result<Self, tether_tls::TlsError> {
        let base = main.config();
        let client_ca = tether_tls::ClientCa::load(client_ca, base.crypto_provider())?;
        let derived = client_ca.apply(&base)?;
        Ok(Self {
            main,
            client_ca,
            derived: Mutex::new((base, derived)),
        })
    }

    /// The config for a new handshake, derived again when the main one was reloaded.
    pub(crate) fn config(&self) -> Arc<rustls::ServerConfig> {
        let base = self.main.config();
        let mut derived = self.derived.lock().unwrap_or_else(|e| e.into_inner());
        if !Arc::ptr_eq(&derived.0, &base) {
            match self.client_ca.apply(&base) {
                Ok(config) => *derived = (base, config),
                // Not expected: the base was built the same way. The previous config stays.
                Err(e) => {
                    tracing::warn!(error = %e, "a tenant frontend keeps its previous TLS config")
                }
            }
        }
        derived.1.clone()
    }
}

impl std::fmt::Debug for TenantTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TenantTls").finish_non_exhaustive()
    }
}
