//! Upstream's `--tls-min-version` and `--cipher-suites` flags, mapped onto rustls.

use std::sync::Arc;

use rustls::crypto::{CryptoProvider, aws_lc_rs};
use rustls::{CipherSuite, SupportedCipherSuite, SupportedProtocolVersion};

use crate::TlsError;
use crate::key_exchange;

/// Go's names (from `tls.CipherSuites()`, plus the legacy CHACHA20 aliases that Kubernetes'
/// `cliflag` still accepts) for the TLS 1.2 suites that rustls implements.
///
/// Everything else Go knows (CBC, static RSA key exchange, 3DES, RC4) is missing from rustls on
/// purpose, so those names are refused rather than silently ignored.
const TLS12_SUITES: &[(&str, CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Go's names for the TLS 1.3 suites. Go accepts them in `--cipher-suites` but TLS 1.3 suites
/// are not configurable there, so they are accepted here too and have no effect: all TLS 1.3
/// suites stay enabled.
const TLS13_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Lowest TLS version a listener or dialer accepts.
///
/// rustls implements only TLS 1.2 and 1.3, so Go's lower versions cannot be represented; see
/// [`TlsOptions::from_go_flags`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3 (upstream's default).
    #[default]
    Tls12,
    /// TLS 1.3 only.
    Tls13,
}

/// Go-flag-compatible TLS knobs shared by every listener/dialer.
///
/// Kept as plain data so that one value parsed from the command line can be handed to each
/// listener and dialer, the way upstream applies the same flags to the frontend and the agent
/// port.
#[derive(Clone, Debug, Default)]
pub struct TlsOptions {
    /// Lowest protocol version negotiated.
    pub min_version: TlsVersion,
    /// Go names of the TLS 1.2 suites to enable; empty means rustls' defaults. Names are
    /// checked by [`TlsOptions::from_go_flags`] and again when a config is built.
    pub cipher_suites: Vec<String>,
}

impl TlsOptions {
    /// Parses upstream's `--tls-min-version` and `--cipher-suites` flag values.
    ///
    /// `min_version`: `""` means TLS 1.2, as upstream; `"VersionTLS12"` and `"VersionTLS13"`
    /// map directly. `"VersionTLS10"` and `"VersionTLS11"` are accepted so that existing
    /// manifests keep working, but rustls cannot speak those versions: they map to TLS 1.2 and
    /// the second tuple element carries a warning for the caller to log (upstream also warns
    /// below 1.2).
    ///
    /// `cipher_suites`: comma-separated Go names such as
    /// `TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256`; surrounding spaces and empty items are ignored
    /// and an empty value keeps rustls' defaults. Like Go, the list only restricts TLS 1.2; TLS
    /// 1.3 suite names are accepted and ignored. An unknown or unsupported name is an error
    /// that lists the supported ones.
    pub fn from_go_flags(
        min_version: &str,
        cipher_suites: &str,
    ) -> Result<(Self, Option<String>), TlsError> {
        let (min_version, warning) = match min_version {
            "" | "VersionTLS12" => (TlsVersion::Tls12, None),
            "VersionTLS13" => (TlsVersion::Tls13, None),
            "VersionTLS10" | "VersionTLS11" => (
                TlsVersion::Tls12,
                Some(format!(
                    "--tls-min-version={min_version} is below TLS 1.2, which rustls does not \
                     implement; using VersionTLS12"
                )),
            ),
            other => {
                return Err(TlsError::UnknownTlsVersion {
                    value: other.to_owned(),
                });
            }
        };
        let opts = Self {
            min_version,
            cipher_suites: cipher_suites
                .split(',')
                .map(str::trim)
                .filter(|name| !name.is_empty())
                .map(str::to_owned)
                .collect(),
        };
        opts.check_cipher_suites()?;
        Ok((opts, warning))
    }

    /// The protocol versions to hand to a rustls config builder, for callers that build
    /// configs themselves from [`provider`].
    pub fn protocol_versions(&self) -> &'static [&'static SupportedProtocolVersion] {
        /// TLS 1.3 only (rustls has no constant for it).
        static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
        match self.min_version {
            TlsVersion::Tls12 => rustls::ALL_VERSIONS,
            TlsVersion::Tls13 => TLS13_ONLY,
        }
    }

    /// Fails on the first cipher suite name that is neither a supported TLS 1.2 suite nor a
    /// TLS 1.3 suite, since [`provider`] cannot report it.
    pub(crate) fn check_cipher_suites(&self) -> Result<(), TlsError> {
        match self
            .cipher_suites
            .iter()
            .find(|name| !TLS13_SUITES.contains(&name.as_str()) && tls12_suite(name).is_none())
        {
            None => Ok(()),
            Some(name) => Err(TlsError::UnsupportedCipherSuite {
                name: name.clone(),
                supported: TLS12_SUITES
                    .iter()
                    .map(|(go_name, _)| *go_name)
                    .chain(TLS13_SUITES.iter().copied())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

/// The rustls suite that a Go TLS 1.2 suite name stands for.
fn tls12_suite(go_name: &str) -> Option<CipherSuite> {
    TLS12_SUITES
        .iter()
        .find(|(name, _)| *name == go_name)
        .map(|(_, suite)| *suite)
}

/// rustls' aws-lc-rs crypto provider with tether's key exchange groups (the post-quantum hybrid
/// first), the TLS 1.2 suites restricted to `opts.cipher_suites`
/// (all TLS 1.3 suites are always kept, as in Go), and none at all when the minimum is TLS 1.3: the
/// provider then says which versions a config built from it can negotiate, which a config
/// derived from another one relies on ([`crate::ClientCa`]). rustls' preference order is
/// preserved.
///
/// Names that are not supported are skipped here; [`TlsOptions::from_go_flags`] and the
/// config builders in this crate reject them first.
pub fn provider(opts: &TlsOptions) -> Arc<CryptoProvider> {
    let mut provider = aws_lc_rs::default_provider();
    provider.kx_groups = key_exchange::GROUPS.to_vec();
    if opts.min_version == TlsVersion::Tls13 {
        provider
            .cipher_suites
            .retain(|suite| matches!(suite, SupportedCipherSuite::Tls13(_)));
    }
    if !opts.cipher_suites.is_empty() {
        let wanted: Vec<CipherSuite> = opts
            .cipher_suites
            .iter()
            .filter_map(|name| tls12_suite(name))
            .collect();
        provider.cipher_suites.retain(|suite| match suite {
            SupportedCipherSuite::Tls13(_) => true,
            SupportedCipherSuite::Tls12(_) => wanted.contains(&suite.suite()),
        });
    }
    Arc::new(provider)
}

#[cfg(test)]
mod tests;
