//! X.509 v1 certificates made by the real `openssl` CLI with the kubernetes.io task's recipe
//! (`openssl x509 -req` without extensions), against real OpenSSL peers (`s_server`,
//! `s_client`) that, like Go, accept them.
//!
//! - tether loads a v1 certificate of its own (a client certificate, a serving certificate)
//!   and still refuses one that does not match its key;
//! - a v1 CA is a trust anchor;
//! - a *peer's* v1 certificate is refused by webpki during the handshake (where Go accepts
//!   it): recorded here, so that a change in webpki shows.

use std::net::TcpListener as StdListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tempfile::TempDir;
use tether_tls::{TlsOptions, client_config, server_config, x509_version};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::{TlsAcceptor, TlsConnector};

const DEADLINE: Duration = Duration::from_secs(20);

/// `openssl ARGS` in `dir`; panics with its stderr on failure.
fn openssl(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("openssl (install the openssl package)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A CA (v3, `openssl req -x509`; P-256 keys where the recipe does not say RSA, which is
/// slow to generate), and from it, with the kubernetes.io task's commands:
/// `konnectivity.crt` (v1, `CN=system:konnectivity-server`) and `konnectivity.key`; plus a v3
/// serving certificate `server.crt` for 127.0.0.1 (with `-extfile`, as a v3 one is made).
struct Recipe {
    dir: TempDir,
}

impl Recipe {
    fn make() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-subj",
                "/CN=test-ca",
                "-days",
                "2",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-subj",
                "/CN=system:konnectivity-server",
                "-new",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-out",
                "konnectivity.csr",
                "-keyout",
                "konnectivity.key",
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "konnectivity.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "konnectivity.crt",
                "-days",
                "375",
                "-sha256",
            ],
        );
        std::fs::write(d.join("server.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        openssl(
            d,
            &[
                "req",
                "-subj",
                "/CN=server",
                "-new",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-out",
                "server.csr",
                "-keyout",
                "server.key",
            ],
        );
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-sha256",
                "-extfile",
                "server.ext",
            ],
        );
        Self { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn version(&self, name: &str) -> Option<u8> {
        let der = CertificateDer::from_pem_file(self.path(name)).unwrap();
        x509_version(&der)
    }
}

fn free_port() -> u16 {
    StdListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Connects to 127.0.0.1:`port` until something listens there (bounded).
async fn connect(port: u16) -> TcpStream {
    let deadline = tokio::time::Instant::now() + DEADLINE;
    loop {
        match TcpStream::connect(("127.0.0.1", port)).await {
            Ok(stream) => return stream,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("connect {port}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// Kills the child on drop, so that a failed assertion leaves no OpenSSL server behind.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn the_recipe_makes_a_v1_certificate() {
    let recipe = Recipe::make();
    assert_eq!(recipe.version("konnectivity.crt"), Some(1));
    assert_eq!(recipe.version("server.crt"), Some(3));
    assert_eq!(recipe.version("ca.crt"), Some(3));
    let text = openssl(
        recipe.dir.path(),
        &["x509", "-noout", "-text", "-in", "konnectivity.crt"],
    );
    assert!(text.contains("Version: 1 (0x0)"), "{text}");
}

/// The recipe's own use: a client certificate (the proxy server's kubeconfig identity towards
/// kube-apiserver). OpenSSL's server, like Go's, accepts it.
#[tokio::test]
async fn a_v1_client_certificate_is_presented() {
    let recipe = Recipe::make();
    let port = free_port();
    let _server = Killed(
        Command::new("openssl")
            .args([
                "s_server",
                "-accept",
                &format!("127.0.0.1:{port}"),
                "-www",
                "-Verify",
                "1",
            ])
            .args([
                "-verify_return_error",
                "-cert",
                "server.crt",
                "-key",
                "server.key",
            ])
            .args(["-CAfile", "ca.crt"])
            .current_dir(recipe.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let config = client_config(
        &recipe.path("ca.crt"),
        Some((
            &recipe.path("konnectivity.crt"),
            &recipe.path("konnectivity.key"),
        )),
        Vec::new(),
        &TlsOptions::default(),
    )
    .expect("a v1 client certificate loads");
    let page = tokio::time::timeout(DEADLINE, async {
        let tcp = connect(port).await;
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let mut tls = TlsConnector::from(config).connect(name, tcp).await?;
        tls.write_all(b"GET / HTTP/1.0\r\n\r\n").await?;
        let mut page = String::new();
        tls.read_to_string(&mut page).await.or_else(|e| {
            // s_server may close without close_notify after the page.
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                Ok(0)
            } else {
                Err(e)
            }
        })?;
        Ok::<_, std::io::Error>(page)
    })
    .await
    .expect("the exchange hangs")
    .expect("handshake with OpenSSL's server");
    assert!(
        page.contains("Client certificate") && page.contains("system:konnectivity-server"),
        "s_server did not see the v1 client certificate:\n{page}"
    );
}

/// A v1 serving certificate (for example a v1 `--cluster-cert`): tether serves it, and
/// OpenSSL's client (like Go's agents) verifies it.
#[tokio::test]
async fn a_v1_serving_certificate_is_served() {
    let recipe = Recipe::make();
    let config = server_config(
        &recipe.path("konnectivity.crt"),
        &recipe.path("konnectivity.key"),
        None,
        &[],
        &TlsOptions::default(),
    )
    .expect("a v1 serving certificate loads");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let acceptor = TlsAcceptor::from(config);
    let served = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let mut tls = acceptor.accept(tcp).await?;
        tls.write_all(b"hello from tether\n").await?;
        tls.shutdown().await
    });
    let dir = recipe.dir.path().to_owned();
    let client = tokio::task::spawn_blocking(move || {
        Command::new("openssl")
            .args([
                "s_client",
                "-connect",
                &format!("127.0.0.1:{port}"),
                "-CAfile",
                "ca.crt",
            ])
            // Read until tether closes: with stdin at EOF, s_client would otherwise quit as
            // soon as the handshake is done, sometimes before the server's line arrives.
            .args(["-verify_return_error", "-ign_eof"])
            .current_dir(dir)
            .stdin(Stdio::null())
            .output()
    });
    let out = tokio::time::timeout(DEADLINE, client)
        .await
        .expect("s_client hangs")
        .unwrap()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("Verify return code: 0 (ok)"),
        "s_client: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("hello from tether"), "{stdout}");
    tokio::time::timeout(DEADLINE, served)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// Loading a v1 certificate still checks that the key is its own.
#[test]
fn a_v1_certificate_with_another_key_is_refused() {
    let recipe = Recipe::make();
    let error = server_config(
        &recipe.path("konnectivity.crt"),
        &recipe.path("server.key"),
        None,
        &[],
        &TlsOptions::default(),
    )
    .expect_err("a mismatched key must be refused");
    let text = error.to_string();
    assert!(
        text.contains("konnectivity.crt") && text.contains("server.key"),
        "names the files: {text}"
    );
    assert!(
        matches!(
            error,
            tether_tls::TlsError::CertifiedKey {
                error: rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch),
                ..
            }
        ),
        "{error:?}"
    );
}

/// A self-signed v1 CA (`openssl x509 -req -signkey`) verifies a v3 leaf, in both directions.
#[tokio::test]
async fn a_v1_ca_is_a_trust_anchor() {
    let recipe = Recipe::make();
    let d = recipe.dir.path();
    openssl(
        d,
        &[
            "req",
            "-subj",
            "/CN=v1-ca",
            "-new",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-out",
            "v1ca.csr",
            "-keyout",
            "v1ca.key",
        ],
    );
    openssl(
        d,
        &[
            "x509", "-req", "-in", "v1ca.csr", "-signkey", "v1ca.key", "-out", "v1ca.crt", "-days",
            "2",
        ],
    );
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "v1ca.crt",
            "-CAkey",
            "v1ca.key",
            "-CAcreateserial",
            "-out",
            "leaf.crt",
            "-days",
            "2",
            "-extfile",
            "server.ext",
        ],
    );
    assert_eq!(recipe.version("v1ca.crt"), Some(1));
    let opts = TlsOptions::default();
    let server = server_config(
        &recipe.path("leaf.crt"),
        &recipe.path("server.key"),
        Some(&recipe.path("v1ca.crt")),
        &[],
        &opts,
    )
    .unwrap();
    let client = client_config(
        &recipe.path("v1ca.crt"),
        Some((&recipe.path("leaf.crt"), &recipe.path("server.key"))),
        Vec::new(),
        &opts,
    )
    .unwrap();
    handshake(server, client)
        .await
        .expect("a v1 CA verifies both sides");
}

/// A peer presenting a v1 certificate: webpki refuses it (Go would accept it).
#[tokio::test]
async fn a_peers_v1_certificate_is_refused_by_webpki() {
    let recipe = Recipe::make();
    let opts = TlsOptions::default();
    let server = server_config(
        &recipe.path("server.crt"),
        &recipe.path("server.key"),
        Some(&recipe.path("ca.crt")),
        &[],
        &opts,
    )
    .unwrap();
    let client = client_config(
        &recipe.path("ca.crt"),
        Some((
            &recipe.path("konnectivity.crt"),
            &recipe.path("konnectivity.key"),
        )),
        Vec::new(),
        &opts,
    )
    .unwrap();
    let error = handshake(server, client)
        .await
        .expect_err("webpki refuses v1 peers");
    assert!(error.contains("UnsupportedCertVersion"), "{error}");
}

/// One mutual-TLS handshake over loopback TCP; the server's error text on failure.
async fn handshake(
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
) -> Result<(), String> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await?;
        let mut tls = TlsAcceptor::from(server).accept(tcp).await?;
        tls.write_all(b"ok").await?;
        tls.shutdown().await
    });
    let connected = async {
        let tcp = connect(port).await;
        let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
        let mut tls = TlsConnector::from(client).connect(name, tcp).await?;
        let mut reply = [0; 2];
        tls.read_exact(&mut reply).await?;
        Ok::<_, std::io::Error>(())
    };
    let (accepted, connected) = tokio::time::timeout(DEADLINE, async {
        let connected = connected.await;
        (accepted.await.unwrap(), connected)
    })
    .await
    .expect("the handshake hangs");
    accepted.map_err(|e| e.to_string())?;
    connected.map_err(|e| format!("client: {e}"))
}
