use std::sync::Arc;

use rustls::{ClientConfig, ClientConnection, HandshakeKind, ServerConnection};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::*;
use crate::pki::{Pki, PkiFiles};
use crate::{TlsOptions, client_config, server_config};

/// The main frontend's PKI and a tenant's own, each written to its own directory.
struct Two {
    main: PkiFiles,
    tenant: PkiFiles,
    _dirs: [tempfile::TempDir; 2],
}

fn two_pkis() -> Two {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let main = Pki::generate().unwrap().write_to(dirs[0].path()).unwrap();
    let tenant = Pki::generate().unwrap().write_to(dirs[1].path()).unwrap();
    Two {
        main,
        tenant,
        _dirs: dirs,
    }
}

fn base(pki: &PkiFiles, opts: &TlsOptions) -> Arc<ServerConfig> {
    server_config(
        &pki.server_cert,
        &pki.server_key,
        Some(&pki.ca_cert),
        &[b"h2"],
        opts,
    )
    .unwrap()
}

/// A client that trusts the main frontend's certificate and presents `identity`'s.
fn client(server: &PkiFiles, identity: &PkiFiles) -> Arc<ClientConfig> {
    let cert = Some((
        identity.client_cert.as_path(),
        identity.client_key.as_path(),
    ));
    client_config(
        &server.ca_cert,
        cert,
        vec![b"h2".to_vec()],
        &TlsOptions::default(),
    )
    .unwrap()
}

/// Runs a handshake in memory; `Ok(true)` when it resumed a session.
fn handshake(
    client: &Arc<ClientConfig>,
    server: &Arc<ServerConfig>,
) -> Result<bool, rustls::Error> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut c = ClientConnection::new(Arc::clone(client), name).unwrap();
    let mut s = ServerConnection::new(Arc::clone(server)).unwrap();
    for _ in 0..16 {
        let mut flight = Vec::new();
        while c.wants_write() {
            c.write_tls(&mut flight).unwrap();
        }
        let mut rest = &flight[..];
        while !rest.is_empty() {
            s.read_tls(&mut rest).unwrap();
            s.process_new_packets()?;
        }
        let mut flight = Vec::new();
        while s.wants_write() {
            s.write_tls(&mut flight).unwrap();
        }
        let mut rest = &flight[..];
        while !rest.is_empty() {
            c.read_tls(&mut rest).unwrap();
            c.process_new_packets()?;
        }
        if !c.is_handshaking() && !s.is_handshaking() && !c.wants_write() && !s.wants_write() {
            return Ok(s.handshake_kind() == Some(HandshakeKind::Resumed));
        }
    }
    panic!("the handshake did not finish in 16 flights");
}

#[test]
fn only_clients_of_the_tenant_ca_pass_the_derived_config() {
    let p = two_pkis();
    let base = base(&p.main, &TlsOptions::default());
    let derived = ClientCa::load(&p.tenant.ca_cert, base.crypto_provider())
        .unwrap()
        .apply(&base)
        .unwrap();
    assert_eq!(derived.alpn_protocols, base.alpn_protocols);
    let (tenants, mains) = (client(&p.main, &p.tenant), client(&p.main, &p.main));
    assert_eq!(handshake(&tenants, &derived), Ok(false));
    assert_eq!(handshake(&mains, &base), Ok(false));
    assert!(matches!(
        handshake(&mains, &derived),
        Err(rustls::Error::InvalidCertificate(_))
    ));
    assert!(handshake(&tenants, &base).is_err(), "the base keeps its CA");
}

#[test]
fn a_session_of_the_base_listener_does_not_resume_on_the_derived_one() {
    let p = two_pkis();
    let base = base(&p.main, &TlsOptions::default());
    let derived = ClientCa::load(&p.tenant.ca_cert, base.crypto_provider())
        .unwrap()
        .apply(&base)
        .unwrap();
    let mains = client(&p.main, &p.main);
    assert_eq!(handshake(&mains, &base), Ok(false));
    assert_eq!(
        handshake(&mains, &base),
        Ok(true),
        "the client holds a ticket"
    );
    // Resuming would skip verification: the main CA's client would pass the tenant's CA.
    assert!(handshake(&mains, &derived).is_err());
}

#[test]
fn the_derived_config_keeps_the_base_versions() {
    let p = two_pkis();
    let (tls13, _) = TlsOptions::from_go_flags("VersionTLS13", "").unwrap();
    let tls12_client = || {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_file(&p.main.ca_cert).unwrap())
            .unwrap();
        let chain = vec![CertificateDer::from_pem_file(&p.tenant.client_cert).unwrap()];
        let key = PrivateKeyDer::from_pem_file(&p.tenant.client_key).unwrap();
        let provider = crate::provider(&TlsOptions::default());
        Arc::new(
            ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS12])
                .unwrap()
                .with_root_certificates(roots)
                .with_client_auth_cert(chain, key)
                .unwrap(),
        )
    };
    for (opts, tls12_passes) in [(TlsOptions::default(), true), (tls13, false)] {
        let base = base(&p.main, &opts);
        let derived = ClientCa::load(&p.tenant.ca_cert, base.crypto_provider())
            .unwrap()
            .apply(&base)
            .unwrap();
        assert_eq!(
            handshake(&tls12_client(), &derived).is_ok(),
            tls12_passes,
            "{opts:?}"
        );
    }
}
