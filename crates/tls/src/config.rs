//! Building rustls server and client configs from PEM files.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::server::{
    ProducesTickets, ServerSessionMemoryCache, StoresServerSessions, WebPkiClientVerifier,
};
use rustls::sign::{CertifiedKey, SingleCertAndKey};
use rustls::{ClientConfig, InconsistentKeys, RootCertStore, ServerConfig};
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::{PemOrigin, PemProblem};
use crate::validity::{CertTime, first_outside};
use crate::x509_version::{subject_public_key_info, x509_version};
use crate::{TlsError, TlsOptions, provider};

/// Entries in the server's stateful session cache. TLS 1.2 clients without ticket support and
/// TLS 1.3 clients resuming by session id land here; at a few hundred bytes each this bounds the
/// cache to well under a megabyte while covering a kube-apiserver that redials per request.
const SERVER_SESSION_CACHE_SIZE: usize = 4096;

/// Server config: certificate chain and private key from PEM files, with optional mutual TLS.
///
/// If `client_ca` is `Some`, every client must present a certificate that chains to one of the
/// CAs in that bundle (upstream's `--cluster-ca-cert` for agents, `--server-ca-cert` for
/// frontends); otherwise no client certificate is requested. `alpn` lists the protocols the
/// server accepts in preference order, e.g. `[b"h2"]` for gRPC or `[b"http/1.1"]` for HTTP
/// CONNECT.
///
/// Session resumption is on, both through a stateful in-memory cache and through stateless
/// tickets from aws-lc-rs' rotating [`Ticketer`](rustls::crypto::aws_lc_rs::Ticketer), so
/// that churny clients (kube-apiserver redials per request, agents reconnect on every server
/// restart) resume with one round trip and no certificate verification.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    alpn: &[&[u8]],
    opts: &TlsOptions,
) -> Result<Arc<ServerConfig>, TlsError> {
    opts.check_cipher_suites()?;
    let provider = provider(opts);
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(opts.protocol_versions())
        .map_err(|error| TlsError::Rustls {
            what: "selecting TLS protocol versions",
            error,
        })?;
    let builder = match client_ca {
        Some(ca) => builder.with_client_cert_verifier(client_verifier(ca, &provider)?),
        None => builder.with_no_client_auth(),
    };

    let cert_origin = PemOrigin::File(cert.to_owned());
    let key_origin = PemOrigin::File(key.to_owned());
    let chain = cert_chain(
        "certificate chain",
        &cert_origin,
        CertificateDer::pem_file_iter(cert),
    )?;
    let private_key = private_key(&key_origin, PrivateKeyDer::from_pem_file(key))?;
    let certified = certified_key(
        Identity {
            chain,
            key: private_key,
            cert_origin,
            key_origin,
        },
        &provider,
    )?;
    let mut config = builder.with_cert_resolver(Arc::new(SingleCertAndKey::from(certified)));

    config.alpn_protocols = alpn.iter().map(|proto| proto.to_vec()).collect();
    (config.session_storage, config.ticketer) = new_session_state()?;
    Ok(Arc::new(config))
}

/// A session cache and a ticket key, as a `ServerConfig` holds them.
pub(crate) type SessionState = (Arc<dyn StoresServerSessions>, Arc<dyn ProducesTickets>);

/// A listener's own TLS resumption state: a session cache and a ticket key. Each config
/// that must not resume another's sessions (after a CA change, or on a tenant's listener
/// with its own CA) gets a new one.
pub(crate) fn new_session_state() -> Result<SessionState, TlsError> {
    let ticketer =
        rustls::crypto::aws_lc_rs::Ticketer::new().map_err(|error| TlsError::Rustls {
            what: "creating TLS session ticketer",
            error,
        })?;
    Ok((
        ServerSessionMemoryCache::new(SERVER_SESSION_CACHE_SIZE),
        ticketer,
    ))
}

/// Client config: trust roots from the `ca` PEM bundle, an optional client certificate and key
/// (for mutual TLS, upstream's `--agent-cert`/`--agent-key`), and the ALPN ids to offer in
/// preference order.
///
/// Resumption uses rustls' default in-memory cache, so reconnecting to the same server skips
/// the full handshake.
pub fn client_config(
    ca: &Path,
    client_cert: Option<(&Path, &Path)>,
    alpn: Vec<Vec<u8>>,
    opts: &TlsOptions,
) -> Result<Arc<ClientConfig>, TlsError> {
    opts.check_cipher_suites()?;
    let roots = root_store(
        "CA bundle",
        &PemOrigin::File(ca.to_owned()),
        CertificateDer::pem_file_iter(ca),
    )?;
    let identity = client_cert
        .map(|(cert, key)| {
            let cert_origin = PemOrigin::File(cert.to_owned());
            let key_origin = PemOrigin::File(key.to_owned());
            let chain = cert_chain(
                "client certificate",
                &cert_origin,
                CertificateDer::pem_file_iter(cert),
            )?;
            let key = private_key(&key_origin, PrivateKeyDer::from_pem_file(key))?;
            Ok::<_, TlsError>(Identity {
                chain,
                key,
                cert_origin,
                key_origin,
            })
        })
        .transpose()?;
    build_client(provider(opts), opts, roots, identity, alpn)
}

/// Same as [`client_config`], from in-memory PEM strings and with default [`TlsOptions`]; the
/// quickstart and tests use it with a freshly generated [`Pki`](crate::pki::Pki) so that they
/// need no files. `client` is `(certificate PEM, private key PEM)`.
pub fn client_config_from_pem(
    ca_pem: &str,
    client: Option<(&str, &str)>,
    alpn: Vec<Vec<u8>>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let opts = TlsOptions::default();
    let roots = root_store(
        "CA bundle",
        &PemOrigin::Inline,
        Ok(CertificateDer::pem_slice_iter(ca_pem.as_bytes())),
    )?;
    let identity = client
        .map(|(cert, key)| {
            let chain = cert_chain(
                "client certificate",
                &PemOrigin::Inline,
                Ok(CertificateDer::pem_slice_iter(cert.as_bytes())),
            )?;
            let key = private_key(
                &PemOrigin::Inline,
                PrivateKeyDer::from_pem_slice(key.as_bytes()),
            )?;
            Ok::<_, TlsError>(Identity {
                chain,
                key,
                cert_origin: PemOrigin::Inline,
                key_origin: PemOrigin::Inline,
            })
        })
        .transpose()?;
    build_client(provider(&opts), &opts, roots, identity, alpn)
}

/// A client certificate chain and key, with where they came from for error messages.
struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    cert_origin: PemOrigin,
    key_origin: PemOrigin,
}

/// The part of client config building shared by the file and in-memory variants.
fn build_client(
    provider: Arc<CryptoProvider>,
    opts: &TlsOptions,
    roots: RootCertStore,
    identity: Option<Identity>,
    alpn: Vec<Vec<u8>>,
) -> Result<Arc<ClientConfig>, TlsError> {
    let builder = ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_protocol_versions(opts.protocol_versions())
        .map_err(|error| TlsError::Rustls {
            what: "selecting TLS protocol versions",
            error,
        })?
        .with_root_certificates(roots);
    let mut config = match identity {
        Some(id) => builder.with_client_cert_resolver(Arc::new(SingleCertAndKey::from(
            certified_key(id, &provider)?,
        ))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = alpn;
    Ok(Arc::new(config))
}

/// Pairs a certificate chain with its private key, checking that they match, as rustls'
/// `with_single_cert` does, but for X.509 v1 certificates too (see [`crate::x509_version`]):
/// Go accepts a v1 certificate of one's own, and so does tether.
///
/// Every certificate of the chain must be valid now ([`crate::validity`]): one that expired or
/// is not valid yet would fail every handshake.
fn certified_key(id: Identity, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
    let now = tether_observe::time::wall_clock();
    if let Some((index, outside)) = first_outside(&id.chain, now) {
        return Err(TlsError::OutsideValidity {
            cert: id.cert_origin,
            index,
            outside,
            now: CertTime::from_system(now),
        });
    }
    let fail = |error| TlsError::CertifiedKey {
        cert: id.cert_origin.clone(),
        key: id.key_origin.clone(),
        error,
    };
    let key = provider
        .key_provider
        .load_private_key(id.key)
        .map_err(fail)?;
    let certified = CertifiedKey::new(id.chain, key);
    let end_entity = certified.end_entity_cert().map_err(fail)?;
    let matched = match x509_version(end_entity) {
        Some(1 | 2) => match (
            certified.key.public_key(),
            subject_public_key_info(end_entity),
        ) {
            (Some(key), Some(cert)) if key.as_ref() == cert => Ok(()),
            (Some(_), _) => Err(InconsistentKeys::KeyMismatch.into()),
            (None, _) => Ok(()),
        },
        // v3, or not X.509 at all: rustls' own check says what is wrong.
        _ => certified.keys_match(),
    };
    match matched {
        // As rustls: a key that cannot tell its public half is not an error.
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
        Err(error) => Err(fail(error)),
    }
}

/// Collects every certificate of a PEM document; an empty result is an error, since an empty
/// chain or bundle is always a misconfiguration (wrong file, truncated write).
///
/// `certs` is the outcome of opening the document, so file and in-memory sources share this.
fn cert_chain<I>(
    what: &'static str,
    origin: &PemOrigin,
    certs: Result<I, pem::Error>,
) -> Result<Vec<CertificateDer<'static>>, TlsError>
where
    I: Iterator<Item = Result<CertificateDer<'static>, pem::Error>>,
{
    let fail = |problem| TlsError::Pem {
        what,
        origin: origin.clone(),
        problem,
    };
    let chain = certs
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| fail(pem_problem(e, PemProblem::NoCertificate)))?;
    if chain.is_empty() {
        return Err(fail(PemProblem::NoCertificate));
    }
    Ok(chain)
}

/// A verifier of client certificates against the CA bundle at `ca`.
pub(crate) fn client_verifier(
    ca: &Path,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let origin = PemOrigin::File(ca.to_owned());
    let roots = root_store(
        "client CA bundle",
        &origin,
        CertificateDer::pem_file_iter(ca),
    )?;
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(provider))
        .build()
        .map_err(|error| TlsError::ClientVerifier { ca: origin, error })
}

/// A trust store holding every certificate of a CA bundle. Unlike rustls'
/// `add_parsable_certificates`, a certificate that cannot be used is an error: silently
/// dropping a CA would only show up later as unexplained handshake failures.
pub(crate) fn root_store<I>(
    what: &'static str,
    origin: &PemOrigin,
    certs: Result<I, pem::Error>,
) -> Result<RootCertStore, TlsError>
where
    I: Iterator<Item = Result<CertificateDer<'static>, pem::Error>>,
{
    let mut roots = RootCertStore::empty();
    for cert in cert_chain(what, origin, certs)? {
        roots.add(cert).map_err(|error| TlsError::Pem {
            what,
            origin: origin.clone(),
            problem: PemProblem::BadCaCertificate(error),
        })?;
    }
    Ok(roots)
}

/// Maps the outcome of reading the first private key of a PEM document.
fn private_key(
    origin: &PemOrigin,
    key: Result<PrivateKeyDer<'static>, pem::Error>,
) -> Result<PrivateKeyDer<'static>, TlsError> {
    key.map_err(|e| TlsError::Pem {
        what: "private key",
        origin: origin.clone(),
        problem: pem_problem(e, PemProblem::NoPrivateKey),
    })
}

/// Classifies a PEM reader error; `missing` is the problem to report when the document simply
/// holds no section of the wanted kind.
fn pem_problem(error: pem::Error, missing: PemProblem) -> PemProblem {
    match error {
        pem::Error::Io(io) => PemProblem::Io(io),
        pem::Error::NoItemsFound => missing,
        other => PemProblem::Malformed(other),
    }
}
