//! Certificates outside their validity period with the real binaries (N9): a rotation to an
//! expired certificate keeps the previous one on both of the server's listeners and on the
//! agent, counted and logged as an error naming the file and its notAfter.

use std::path::Path;
use std::time::Duration;

use tether_testkit::Pki;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Frontend, spawn_agent, spawn_server};
use tether_testkit::targets::EchoServer;
use tether_tls::pki::{IssuedClient, Leaf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::{STEP, bin, tls_transport, until};

const DAY: Duration = Duration::from_secs(86_400);

/// The server listens to `--server-cert` and `--cluster-cert`, both the PKI's server files.
fn reloads(text: &str, listener: &str, outcome: &str) -> f64 {
    metric_value(
        text,
        &format!(
            "tether_server_tls_reloads_total{{listener=\"{listener}\",outcome=\"{outcome}\"}}"
        ),
    )
    .unwrap_or(0.0)
}

/// A certificate of the PKI's CA for the server's names that expired yesterday.
fn expired(pki: &Pki) -> IssuedClient {
    let now = tether_observe::time::wall_clock();
    pki.pem
        .reissue(Leaf::Server, now - 2 * DAY, now - DAY)
        .unwrap()
}

/// Whether a new TLS handshake with the agent listener succeeds for a client that trusts
/// the PKI's CA and checks the certificate's validity, as every agent does.
async fn agent_port_handshakes(pki: &Pki, addr: std::net::SocketAddr) -> Result<(), String> {
    let f = &pki.files;
    let config = tether_tls::client_config(
        &f.ca_cert,
        Some((&f.agent_cert, &f.agent_key)),
        vec![b"h2".to_vec()],
        &Default::default(),
    )
    .unwrap();
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    tokio::time::timeout(
        STEP,
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| "handshake timed out".to_owned())?
    .map(drop)
    .map_err(|e| e.to_string())
}

/// Lines of a JSON log at ERROR whose `error` field contains `text`.
fn errors_mentioning(log: &Path, text: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|line| {
            line["level"] == "ERROR" && line["error"].as_str().is_some_and(|e| e.contains(text))
        })
        .collect()
}

#[tokio::test]
async fn a_server_keeps_its_certificate_when_the_rotation_brings_an_expired_one() {
    let pki = Pki::generate().unwrap();
    let log = pki.dir().join("server.log");
    let log_flag = format!("--log-file={}", log.display());
    let server = spawn_server(
        bin(),
        &pki,
        Frontend::HttpConnectTls,
        &[
            "--tls-reload-interval=100ms",
            "--log-format=json",
            "--logtostderr=false",
            &log_flag,
        ],
    )
    .await
    .unwrap();
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    server.process.wait_ready().await.unwrap();
    agent_port_handshakes(&pki, server.agent_addr)
        .await
        .unwrap();

    // The rotation writes a certificate of the same CA that expired yesterday, with its key.
    let files = &pki.files;
    let stale = expired(&pki);
    std::fs::write(&files.server_cert, &stale.cert_pem).unwrap();
    std::fs::write(&files.server_key, &stale.key_pem).unwrap();
    until("both listeners count the failed reload", || async {
        let text = server.process.metrics().await.unwrap_or_default();
        reloads(&text, "agent", "failed") >= 1.0 && reloads(&text, "frontend", "failed") >= 1.0
    })
    .await;
    let text = server.process.metrics().await.unwrap();
    assert_eq!(reloads(&text, "agent", "reloaded"), 0.0, "{text}");
    assert_eq!(reloads(&text, "frontend", "reloaded"), 0.0, "{text}");

    // New handshakes on both listeners still get the previous, valid certificate.
    agent_port_handshakes(&pki, server.agent_addr)
        .await
        .expect("the agent port serves the expired certificate");
    let echo = EchoServer::start().await.unwrap();
    let mut stream =
        tether_client::dial_http_connect(&tls_transport(&pki, &server), &echo.addr.to_string())
            .await
            .expect("the frontend serves the expired certificate");
    stream.write_all(b"ping").await.unwrap();
    let mut pong = [0u8; 4];
    tokio::time::timeout(STEP, stream.read_exact(&mut pong))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&pong, b"ping");

    // The error names the file and when it expired.
    let path = files.server_cert.display().to_string();
    until("the expired certificate is logged as an error", || async {
        !errors_mentioning(&log, &format!("certificate {path}: expired at ")).is_empty()
    })
    .await;
    let lines = errors_mentioning(&log, &path);
    assert!(
        lines.iter().all(|l| l["error"]
            .as_str()
            .unwrap()
            .contains("(notAfter); the time is now ")),
        "{lines:#?}"
    );

    // A valid certificate after it is loaded as usual.
    let now = tether_observe::time::wall_clock();
    let fresh = pki.pem.reissue(Leaf::Server, now - DAY, now + DAY).unwrap();
    std::fs::write(&files.server_cert, &fresh.cert_pem).unwrap();
    std::fs::write(&files.server_key, &fresh.key_pem).unwrap();
    until("the valid certificate is loaded", || async {
        let text = server.process.metrics().await.unwrap_or_default();
        reloads(&text, "agent", "reloaded") == 1.0 && reloads(&text, "frontend", "reloaded") == 1.0
    })
    .await;
    agent_port_handshakes(&pki, server.agent_addr)
        .await
        .unwrap();
    drop(agent);
}

#[tokio::test]
async fn an_agent_keeps_its_certificate_when_the_rotation_brings_an_expired_one() {
    let pki = Pki::generate().unwrap();
    let log = pki.dir().join("agent.log");
    let log_flag = format!("--log-file={}", log.display());
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    let agent = spawn_agent(
        bin(),
        &pki,
        server.agent_addr,
        &[
            "--tls-reload",
            "--log-format=json",
            "--logtostderr=false",
            &log_flag,
        ],
    )
    .await
    .unwrap();
    server.process.wait_ready().await.unwrap();

    // The agent's certificate is rotated to an expired one; then the server restarts, so the
    // agent's next connection reads its files again.
    let files = &pki.files;
    let now = tether_observe::time::wall_clock();
    let stale = pki
        .pem
        .reissue(Leaf::Agent, now - 2 * DAY, now - DAY)
        .unwrap();
    std::fs::write(&files.agent_cert, &stale.cert_pem).unwrap();
    std::fs::write(&files.agent_key, &stale.key_pem).unwrap();
    let agent_port = format!("--agent-port={}", server.agent_addr.port());
    let mut old = server.process;
    old.signal("KILL").await.unwrap();
    old.wait(STEP).await.unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[&agent_port])
        .await
        .unwrap();

    // The agent connects with the certificate it had: the server admits it.
    server
        .process
        .wait_ready()
        .await
        .expect("the agent did not come back with its previous certificate");
    let path = files.agent_cert.display().to_string();
    until("the expired certificate is logged as an error", || async {
        !errors_mentioning(&log, &format!("certificate {path}: expired at ")).is_empty()
    })
    .await;
    drop(agent);
}
