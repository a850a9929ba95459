//! Real TLS handshakes over loopback TCP between configs built by this crate, plus the error
//! messages for broken PEM files.

use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::ServerName;
use rustls::{
    CipherSuite, ClientConfig, HandshakeKind, NamedGroup, RootCertStore, ServerConfig,
    SupportedProtocolVersion,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tempfile::TempDir;
use tether_tls::pki::{Pki, PkiFiles};
use tether_tls::{
    PemOrigin, PemProblem, TlsError, TlsOptions, client_config, client_config_from_pem, provider,
    server_config,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const H2: &[u8] = b"h2";
/// Guards every exchange so that a handshake bug fails the test instead of hanging it.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// A generated PKI written to a temporary directory (removed on drop).
struct Fixture {
    _dir: TempDir,
    pki: Pki,
    files: PkiFiles,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let pki = Pki::generate().expect("generate PKI");
    let files = pki.write_to(dir.path()).expect("write PKI");
    Fixture {
        _dir: dir,
        pki,
        files,
    }
}

/// What the server saw of a successful exchange.
#[derive(Debug)]
struct ServerSide {
    alpn: Option<Vec<u8>>,
    peer_certificates: usize,
    group: Option<NamedGroup>,
}

/// What the client saw of a successful exchange.
#[derive(Debug)]
struct ClientSide {
    alpn: Option<Vec<u8>>,
    suite: Option<CipherSuite>,
    kind: Option<HandshakeKind>,
    group: Option<NamedGroup>,
}

/// Runs one TLS connection over 127.0.0.1: handshake, then "ping" from the client and "pong"
/// from the server, so that failures the TLS 1.3 client only learns after its handshake (a
/// refused client certificate) surface as errors too.
async fn exchange(
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
    server_name: &str,
) -> (io::Result<ServerSide>, io::Result<ClientSide>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let server_name = ServerName::try_from(server_name.to_owned()).expect("server name");

    let serve = async {
        let (tcp, _) = listener.accept().await?;
        let mut tls = TlsAcceptor::from(server).accept(tcp).await?;
        let mut buf = [0; 4];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"ping");
        tls.write_all(b"pong").await?;
        tls.flush().await?;
        let conn = tls.get_ref().1;
        Ok(ServerSide {
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            peer_certificates: conn.peer_certificates().map_or(0, <[_]>::len),
            group: conn
                .negotiated_key_exchange_group()
                .map(|group| group.name()),
        })
    };
    let dial = async {
        let tcp = TcpStream::connect(addr).await?;
        let mut tls = TlsConnector::from(client).connect(server_name, tcp).await?;
        tls.write_all(b"ping").await?;
        tls.flush().await?;
        let mut buf = [0; 4];
        tls.read_exact(&mut buf).await?;
        assert_eq!(&buf, b"pong");
        let conn = tls.get_ref().1;
        Ok(ClientSide {
            alpn: conn.alpn_protocol().map(<[u8]>::to_vec),
            suite: conn.negotiated_cipher_suite().map(|suite| suite.suite()),
            kind: conn.handshake_kind(),
            group: conn
                .negotiated_key_exchange_group()
                .map(|group| group.name()),
        })
    };
    tokio::time::timeout(EXCHANGE_TIMEOUT, async { tokio::join!(serve, dial) })
        .await
        .expect("exchange timed out")
}

fn mtls_server(f: &Fixture, alpn: &[&[u8]], opts: &TlsOptions) -> Arc<ServerConfig> {
    server_config(
        &f.files.server_cert,
        &f.files.server_key,
        Some(&f.files.ca_cert),
        alpn,
        opts,
    )
    .expect("server config")
}

/// A listener with the fixture's server certificate that asks for no client certificate.
fn plain_server(f: &Fixture, opts: &TlsOptions) -> Arc<ServerConfig> {
    server_config(&f.files.server_cert, &f.files.server_key, None, &[], opts)
        .expect("server config")
}

fn agent_client(f: &Fixture, alpn: Vec<Vec<u8>>) -> Arc<ClientConfig> {
    client_config(
        &f.files.ca_cert,
        Some((&f.files.agent_cert, &f.files.agent_key)),
        alpn,
        &TlsOptions::default(),
    )
    .expect("client config")
}

/// A client that speaks only TLS 1.2, built from this crate's provider.
fn tls12_only_client(f: &Fixture) -> Arc<ClientConfig> {
    other_client(
        f,
        provider(&TlsOptions::default()),
        &[&rustls::version::TLS12],
    )
}

/// A client without a certificate that trusts the fixture's CA, from `provider`, speaking
/// `versions`: a peer configured unlike tether's own dialers.
fn other_client(
    f: &Fixture,
    provider: Arc<CryptoProvider>,
    versions: &[&'static SupportedProtocolVersion],
) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&f.files.ca_cert).expect("open CA") {
        roots.add(cert.expect("CA PEM")).expect("CA cert");
    }
    let config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    Arc::new(config)
}

/// This crate's provider with only X25519 left, as a Go peer with
/// `CurvePreferences: []tls.CurveID{tls.X25519}` has it.
fn x25519_only() -> Arc<CryptoProvider> {
    let mut provider = CryptoProvider::clone(&provider(&TlsOptions::default()));
    provider
        .kx_groups
        .retain(|group| group.name() == NamedGroup::X25519);
    assert_eq!(provider.kx_groups.len(), 1, "the provider has X25519");
    Arc::new(provider)
}

#[tokio::test]
async fn mtls_with_client_certificate_succeeds() {
    let f = fixture();
    let (server, client) = exchange(
        mtls_server(&f, &[H2], &TlsOptions::default()),
        agent_client(&f, vec![H2.to_vec()]),
        "localhost",
    )
    .await;
    let server = server.expect("server side");
    let client = client.expect("client side");
    assert_eq!(server.peer_certificates, 1);
    assert_eq!(server.alpn.as_deref(), Some(H2));
    assert_eq!(client.alpn.as_deref(), Some(H2));
    assert_eq!(client.kind, Some(HandshakeKind::Full));
}

#[tokio::test]
async fn frontend_client_certificate_and_ip_san_work() {
    let f = fixture();
    let client = client_config(
        &f.files.ca_cert,
        Some((&f.files.client_cert, &f.files.client_key)),
        vec![],
        &TlsOptions::default(),
    )
    .expect("client config");
    for name in ["127.0.0.1", "kubernetes"] {
        let (server, client) = exchange(
            mtls_server(&f, &[], &TlsOptions::default()),
            Arc::clone(&client),
            name,
        )
        .await;
        assert_eq!(server.expect(name).peer_certificates, 1);
        assert_eq!(client.expect(name).alpn, None);
    }
}

#[tokio::test]
async fn client_without_certificate_is_refused_when_client_ca_is_set() {
    let f = fixture();
    let client = client_config(&f.files.ca_cert, None, vec![], &TlsOptions::default())
        .expect("client config");
    let (server, client) = exchange(
        mtls_server(&f, &[], &TlsOptions::default()),
        client,
        "localhost",
    )
    .await;
    let err = server.expect_err("server must refuse");
    assert!(err.to_string().contains("certificate"), "{err}");
    client.expect_err("client must see the refusal");
}

#[tokio::test]
async fn client_without_certificate_is_accepted_without_client_ca() {
    let f = fixture();
    let server = plain_server(&f, &TlsOptions::default());
    let client = client_config_from_pem(&f.pki.ca_cert_pem, None, vec![]).expect("client config");
    let (server, client) = exchange(server, client, "localhost").await;
    assert_eq!(server.expect("server side").peer_certificates, 0);
    client.expect("client side");
}

#[tokio::test]
async fn client_trusting_a_different_ca_is_refused() {
    let f = fixture();
    let other = Pki::generate().expect("second PKI");
    let client = client_config_from_pem(
        &other.ca_cert_pem,
        Some((&other.agent_cert_pem, &other.agent_key_pem)),
        vec![],
    )
    .expect("client config");
    let (server, client) = exchange(
        mtls_server(&f, &[], &TlsOptions::default()),
        client,
        "localhost",
    )
    .await;
    let err = client.expect_err("client must not trust the server");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    server.expect_err("server must see the aborted handshake");
}

#[tokio::test]
async fn agent_certificate_from_a_different_ca_is_refused() {
    let f = fixture();
    let other = Pki::generate().expect("second PKI");
    let client = client_config_from_pem(
        &f.pki.ca_cert_pem,
        Some((&other.agent_cert_pem, &other.agent_key_pem)),
        vec![],
    )
    .expect("client config");
    let (server, client) = exchange(
        mtls_server(&f, &[], &TlsOptions::default()),
        client,
        "localhost",
    )
    .await;
    let err = server.expect_err("server must refuse a foreign client certificate");
    assert!(err.to_string().contains("UnknownIssuer"), "{err}");
    client.expect_err("client must see the refusal");
}

#[tokio::test]
async fn alpn_picks_h2_when_the_agent_also_offers_a_custom_id() {
    let f = fixture();
    let client = client_config_from_pem(
        &f.pki.ca_cert_pem,
        Some((&f.pki.agent_cert_pem, &f.pki.agent_key_pem)),
        vec![b"konnectivity-custom".to_vec(), H2.to_vec()],
    )
    .expect("client config");
    let (server, client) = exchange(
        mtls_server(&f, &[H2], &TlsOptions::default()),
        client,
        "localhost",
    )
    .await;
    assert_eq!(server.expect("server side").alpn.as_deref(), Some(H2));
    assert_eq!(client.expect("client side").alpn.as_deref(), Some(H2));
}

#[tokio::test]
async fn sessions_resume_with_tls13_and_tls12() {
    let f = fixture();
    let server = mtls_server(&f, &[H2], &TlsOptions::default());
    let server12 = plain_server(&f, &TlsOptions::default());
    for (server, client) in [
        (server, agent_client(&f, vec![H2.to_vec()])),
        (server12, tls12_only_client(&f)),
    ] {
        let kinds = [
            exchange(Arc::clone(&server), Arc::clone(&client), "localhost").await,
            exchange(Arc::clone(&server), Arc::clone(&client), "localhost").await,
        ]
        .map(|(server, client)| {
            server.expect("server side");
            client.expect("client side").kind
        });
        assert_eq!(
            kinds,
            [Some(HandshakeKind::Full), Some(HandshakeKind::Resumed)]
        );
    }
}

/// Every tether listener and dialer is built by `server_config`/`client_config`: between two
/// of them, full and resumed handshakes both use the post-quantum hybrid (a TLS 1.3
/// resumption runs a fresh key exchange too).
#[tokio::test]
async fn tether_to_tether_negotiates_x25519mlkem768() {
    let f = fixture();
    let server = mtls_server(&f, &[H2], &TlsOptions::default());
    let client = agent_client(&f, vec![H2.to_vec()]);
    for kind in [HandshakeKind::Full, HandshakeKind::Resumed] {
        let (server, client) =
            exchange(Arc::clone(&server), Arc::clone(&client), "localhost").await;
        let (server, client) = (server.expect("server side"), client.expect("client side"));
        assert_eq!(client.kind, Some(kind));
        assert_eq!(client.group, Some(NamedGroup::X25519MLKEM768), "{kind:?}");
        assert_eq!(server.group, Some(NamedGroup::X25519MLKEM768), "{kind:?}");
    }
}

/// Peers without ML-KEM keep working: one restricted to X25519 gets X25519 from tether's
/// listener, tether's dialer gets X25519 from such a listener, and TLS 1.2 (which has no
/// hybrid group) gets a classical group.
#[tokio::test]
async fn classical_only_peers_still_connect() {
    let f = fixture();
    let server = plain_server(&f, &TlsOptions::default());
    let (served, client) = exchange(
        Arc::clone(&server),
        other_client(&f, x25519_only(), rustls::ALL_VERSIONS),
        "localhost",
    )
    .await;
    assert_eq!(served.expect("server side").group, Some(NamedGroup::X25519));
    assert_eq!(client.expect("client side").group, Some(NamedGroup::X25519));

    let certificate = CertificateDer::pem_file_iter(&f.files.server_cert)
        .expect("open certificate")
        .collect::<Result<Vec<_>, _>>()
        .expect("certificate PEM");
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&f.files.server_key).expect("key");
    let classical_server = ServerConfig::builder_with_provider(x25519_only())
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_no_client_auth()
        .with_single_cert(certificate, key)
        .expect("server certificate");
    let (served, client) = exchange(
        Arc::new(classical_server),
        agent_client(&f, Vec::new()),
        "localhost",
    )
    .await;
    assert_eq!(served.expect("server side").group, Some(NamedGroup::X25519));
    assert_eq!(client.expect("client side").group, Some(NamedGroup::X25519));

    let (served, client) = exchange(server, tls12_only_client(&f), "localhost").await;
    assert_eq!(served.expect("server side").group, Some(NamedGroup::X25519));
    assert_eq!(client.expect("client side").group, Some(NamedGroup::X25519));
}

/// Code that builds its rustls config from the process default (kube-rs' client, for the
/// connection to kube-apiserver) offers the hybrid first once tether installed its provider.
#[tokio::test]
async fn the_installed_default_provider_prefers_x25519mlkem768() {
    let f = fixture();
    tether_tls::install_default_provider();
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(&f.files.ca_cert).expect("open CA") {
        roots.add(cert.expect("CA PEM")).expect("CA cert");
    }
    let client = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let server = plain_server(&f, &TlsOptions::default());
    let (served, client) = exchange(server, Arc::new(client), "localhost").await;
    assert_eq!(
        served.expect("server side").group,
        Some(NamedGroup::X25519MLKEM768)
    );
    assert_eq!(
        client.expect("client side").group,
        Some(NamedGroup::X25519MLKEM768)
    );
}

#[tokio::test]
async fn tls13_minimum_refuses_a_tls12_client() {
    let f = fixture();
    let (opts, _) = TlsOptions::from_go_flags("VersionTLS13", "").expect("flags");
    let server = plain_server(&f, &opts);
    let (server, client) = exchange(server, tls12_only_client(&f), "localhost").await;
    server.expect_err("server must refuse TLS 1.2");
    client.expect_err("client must fail");
}

#[tokio::test]
async fn cipher_suite_flag_restricts_tls12() {
    let f = fixture();
    let (opts, _) =
        TlsOptions::from_go_flags("", "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384").expect("flags");
    let server = plain_server(&f, &opts);
    let (server, client) = exchange(server, tls12_only_client(&f), "localhost").await;
    server.expect("server side");
    assert_eq!(
        client.expect("client side").suite,
        Some(CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384)
    );
}

#[test]
fn unsupported_cipher_suite_set_directly_is_rejected_by_config_builders() {
    let f = fixture();
    let opts = TlsOptions {
        cipher_suites: vec!["TLS_RSA_WITH_RC4_128_SHA".to_owned()],
        ..TlsOptions::default()
    };
    let err = server_config(&f.files.server_cert, &f.files.server_key, None, &[], &opts)
        .expect_err("server config");
    assert!(
        matches!(err, TlsError::UnsupportedCipherSuite { .. }),
        "{err}"
    );
    let err = client_config(&f.files.ca_cert, None, vec![], &opts).expect_err("client config");
    assert!(
        matches!(err, TlsError::UnsupportedCipherSuite { .. }),
        "{err}"
    );
}

/// A certificate of one's own outside its validity period is not loaded, on either side,
/// and the error names the file and the time it ends or starts; one of the same CA valid now
/// is loaded and handshakes.
#[tokio::test]
async fn certificates_outside_their_validity_are_refused_naming_file_and_time() {
    let f = fixture();
    let now = tether_observe::time::wall_clock();
    let day = Duration::from_secs(86_400);
    let write = |name: &str, issued: &tether_tls::pki::IssuedClient| {
        let (cert, key) = (
            f.files.dir.join(format!("{name}.crt")),
            f.files.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert, &issued.cert_pem).expect("write");
        std::fs::write(&key, &issued.key_pem).expect("write");
        (cert, key)
    };
    let opts = TlsOptions::default();
    for (name, not_before, not_after, expected) in [
        ("expired", now - 2 * day, now - day, "expired at "),
        ("future", now + day, now + 2 * day, "not valid before "),
    ] {
        let issued = f
            .pki
            .reissue(tether_tls::pki::Leaf::Server, not_before, not_after)
            .expect("issue");
        let (cert, key) = write(name, &issued);
        let err = server_config(&cert, &key, Some(&f.files.ca_cert), &[H2], &opts)
            .expect_err("loaded a certificate outside its validity");
        assert!(
            matches!(err, TlsError::OutsideValidity { index: 0, .. }),
            "{err}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("certificate {}: {expected}", cert.display()))
                && text.contains("; the time is now "),
            "{text}"
        );
        assert_eq!(err.valid_from().is_some(), name == "future", "{text}");
        let err = client_config(&f.files.ca_cert, Some((&cert, &key)), Vec::new(), &opts)
            .expect_err("a client certificate outside its validity was loaded");
        assert!(err.to_string().contains(expected), "{err}");
    }
    // Issued by the same CA, valid now: the only difference was the period.
    let issued = f
        .pki
        .reissue(tether_tls::pki::Leaf::Server, now - day, now + day)
        .expect("issue");
    let (cert, key) = write("valid", &issued);
    let server = server_config(&cert, &key, Some(&f.files.ca_cert), &[H2], &opts).expect("valid");
    let (server, client) = exchange(server, agent_client(&f, vec![H2.to_vec()]), "localhost").await;
    server.expect("server side");
    client.expect("client side");
}

/// Asserts that `err` is a PEM error for `path` with the expected problem, and that its message
/// names the path.
fn assert_pem_error(err: &TlsError, path: &Path, expected: fn(&PemProblem) -> bool) {
    let TlsError::Pem {
        origin, problem, ..
    } = err
    else {
        panic!("expected a PEM error, got {err}");
    };
    assert_eq!(origin, &PemOrigin::File(path.to_owned()));
    assert!(expected(problem), "unexpected problem: {err}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "message must name the file: {err}"
    );
}

#[test]
fn missing_empty_or_garbage_pem_files_name_the_path() {
    let f = fixture();
    let dir = &f.files.dir;
    let missing = dir.join("missing.crt");
    let empty = dir.join("empty.crt");
    let garbage = dir.join("garbage.crt");
    let broken = dir.join("broken.crt");
    std::fs::write(&empty, "").expect("write");
    std::fs::write(&garbage, "this is not PEM\n\x00\x01\x02\n").expect("write");
    std::fs::write(
        &broken,
        "-----BEGIN CERTIFICATE-----\n!!!not base64!!!\n-----END CERTIFICATE-----\n",
    )
    .expect("write");
    let opts = TlsOptions::default();

    let server = |cert: &Path| server_config(cert, &f.files.server_key, None, &[], &opts);
    let err = server(&missing).expect_err("missing cert");
    assert_pem_error(
        &err,
        &missing,
        |p| matches!(p, PemProblem::Io(e) if e.kind() == io::ErrorKind::NotFound),
    );
    assert_pem_error(&server(&empty).expect_err("empty"), &empty, |p| {
        matches!(p, PemProblem::NoCertificate)
    });
    let err = server(&garbage).expect_err("garbage");
    assert_pem_error(&err, &garbage, |p| matches!(p, PemProblem::NoCertificate));
    assert_eq!(
        err.to_string(),
        format!(
            "reading certificate chain {}: no certificate found",
            garbage.display()
        )
    );
    assert_pem_error(&server(&broken).expect_err("broken"), &broken, |p| {
        matches!(p, PemProblem::Malformed(_))
    });

    // A certificate where the key should be.
    let err = server_config(&f.files.server_cert, &f.files.server_cert, None, &[], &opts)
        .expect_err("no key");
    assert_pem_error(&err, &f.files.server_cert, |p| {
        matches!(p, PemProblem::NoPrivateKey)
    });

    // Client CA bundle and client-side files.
    let err = server_config(
        &f.files.server_cert,
        &f.files.server_key,
        Some(&empty),
        &[],
        &opts,
    )
    .expect_err("empty client CA");
    assert_pem_error(&err, &empty, |p| matches!(p, PemProblem::NoCertificate));
    let err = client_config(&garbage, None, vec![], &opts).expect_err("garbage CA");
    assert_pem_error(&err, &garbage, |p| matches!(p, PemProblem::NoCertificate));
    let err = client_config(
        &f.files.ca_cert,
        Some((&f.files.agent_cert, &missing)),
        vec![],
        &opts,
    )
    .expect_err("missing client key");
    assert_pem_error(&err, &missing, |p| matches!(p, PemProblem::Io(_)));
}

#[test]
fn mismatched_certificate_and_key_name_both_files() {
    let f = fixture();
    let err = server_config(
        &f.files.server_cert,
        &f.files.agent_key,
        None,
        &[],
        &TlsOptions::default(),
    )
    .expect_err("mismatched key");
    assert!(matches!(err, TlsError::CertifiedKey { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains(&f.files.server_cert.display().to_string()),
        "{msg}"
    );
    assert!(
        msg.contains(&f.files.agent_key.display().to_string()),
        "{msg}"
    );
}

#[test]
fn in_memory_pem_errors_say_so() {
    let f = fixture();
    let err = client_config_from_pem("", None, vec![]).expect_err("empty CA");
    assert!(matches!(
        err,
        TlsError::Pem {
            origin: PemOrigin::Inline,
            problem: PemProblem::NoCertificate,
            ..
        }
    ));
    assert!(err.to_string().contains("in-memory"), "{err}");
    let err = client_config_from_pem(
        &f.pki.ca_cert_pem,
        Some((&f.pki.agent_cert_pem, "garbage")),
        vec![],
    )
    .expect_err("garbage key");
    assert!(matches!(
        err,
        TlsError::Pem {
            problem: PemProblem::NoPrivateKey,
            ..
        }
    ));
}
