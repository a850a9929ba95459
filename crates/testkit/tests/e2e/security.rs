//! Hardening of the listeners and admission: identity binding, dial address checks,
//! connection setup deadline, header limits over TLS.

use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use tether_client::{DialError, GrpcClient, Transport};
use tether_grpc::client::Channel;
use tether_grpc::{Code, GrpcError};
use tether_server::{Mode, Strategy};
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport as Tx};
use tether_tls::pki::{ClientSpec, IssuedClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::STEP;
use crate::support::{echo_exact, eventually, read_head};

/// An agent-port connection authenticated with `cert` (a certificate from the test CA).
async fn channel_as(pki: &Pki, server: &TestServer, cert: &IssuedClient) -> Channel {
    let tls = tether_tls::client_config_from_pem(
        &pki.pem.ca_cert_pem,
        Some((&cert.cert_pem, &cert.key_pem)),
        vec![b"h2".to_vec()],
    )
    .unwrap();
    server.agent_channel_with(tls).await.unwrap()
}

/// Opens `AgentService.Connect` with `metadata` and returns the refusal status, if refused.
async fn connect_refusal(channel: &Channel, metadata: &[(&'static str, String)]) -> Option<Code> {
    let (_tx, mut rx) = channel
        .call(tether_proto::path::CONNECT, metadata)
        .await
        .unwrap();
    match tokio::time::timeout(STEP, rx.response_headers())
        .await
        .unwrap()
    {
        Ok(_) => None,
        Err(GrpcError::Status(status)) => Some(status.code),
        Err(other) => panic!("unexpected answer: {other}"),
    }
}

async fn limit_hits(server: &TestServer, limit: &str) -> f64 {
    let text = server.metrics().await.unwrap();
    metric_value(
        &text,
        &format!("tether_server_limit_hits_total{{limit=\"{limit}\"}}"),
    )
    .unwrap_or(0.0)
}

async fn proves_dials_reach_the_real_agent(server: &TestServer, echo: &EchoServer) {
    let client = GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
        .await
        .unwrap();
    for seed in 0..3 {
        let stream = client.dial(&echo.addr.to_string()).await.unwrap();
        echo_exact(stream, seed, 1024).await;
    }
}

#[tokio::test]
async fn a_live_agent_id_cannot_be_taken_over_by_another_certificate() {
    let (pki, issued) = Pki::generate_with_clients(&[ClientSpec {
        common_name: "node-b",
        sans: &["node-b"],
    }])
    .unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let real = AgentOptions {
        agent_id: "node-a".into(),
        ..AgentOptions::default()
    };
    let _agent = TestAgent::start(&pki, server.agent_addr, real)
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();

    // Another node's certificate claims the live ID: refused, counted.
    let hijacker = channel_as(&pki, &server, &issued[0]).await;
    let refused = connect_refusal(&hijacker, &[("agentid", "node-a".to_owned())]).await;
    assert_eq!(refused, Some(Code::ALREADY_EXISTS));
    assert_eq!(limit_hits(&server, "duplicate_agent_id").await, 1.0);
    // Its own ID is fine.
    assert_eq!(
        connect_refusal(&hijacker, &[("agentid", "node-b".to_owned())]).await,
        None
    );
    drop(hijacker);
    eventually("node-b gone", || async {
        let text = server.metrics().await.unwrap();
        metric_value(
            &text,
            "konnectivity_network_proxy_server_ready_backend_connections",
        ) == Some(1.0)
    })
    .await;
    proves_dials_reach_the_real_agent(&server, &echo).await;
}

#[tokio::test]
async fn host_identifiers_must_be_names_of_the_certificate_when_required() {
    let (pki, issued) = Pki::generate_with_clients(&[
        ClientSpec {
            common_name: "node-a",
            sans: &["node-a", "127.0.0.1"],
        },
        ClientSpec {
            common_name: "node-b",
            sans: &["node-b"],
        },
    ])
    .unwrap();
    let options = ServerOptions {
        strategies: vec![Strategy::DestHost],
        agent_identity_binding: tether_server::IdentityBinding::All,
        ..ServerOptions::default()
    };
    let server = TestServer::start(&pki, options).await.unwrap();
    let node_a = channel_as(&pki, &server, &issued[0]).await;
    assert_eq!(
        connect_refusal(
            &node_a,
            &[
                ("agentid", "node-a".to_owned()),
                ("agentidentifiers", "host=node-a&ipv4=127.0.0.1".to_owned()),
            ]
        )
        .await,
        None
    );

    // node-b claims node-a's address and then node-a's name: both refused.
    let node_b = channel_as(&pki, &server, &issued[1]).await;
    for (id, identifiers) in [
        ("node-b", "host=127.0.0.1"),
        ("node-b", "ipv4=127.0.0.1"),
        ("node-b", "host=node-a"),
        ("node-a", ""),
    ] {
        let refused = connect_refusal(
            &node_b,
            &[
                ("agentid", id.to_owned()),
                ("agentidentifiers", identifiers.to_owned()),
            ],
        )
        .await;
        assert_eq!(refused, Some(Code::PERMISSION_DENIED), "{id} {identifiers}");
    }
    assert_eq!(limit_hits(&server, "agent_identity").await, 4.0);
}

#[tokio::test]
async fn a_huge_dial_address_is_refused_and_other_tunnels_keep_flowing() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
        .await
        .unwrap();
    let live = client.dial(&echo.addr.to_string()).await.unwrap();
    let live = echo_exact(live, 1, 4096).await;

    let huge = format!("{}:80", "a".repeat(4 * 1024 * 1024 - 64));
    match client.dial(&huge).await {
        Err(DialError::Endpoint { message }) => {
            assert!(
                message.starts_with("invalid dial address"),
                "{}",
                &message[..100]
            );
            assert!(message.len() < 1024, "the error echoes a bounded prefix");
        }
        Err(other) => panic!("expected the frontend's refusal, got {other}"),
        Ok(_) => panic!("a 4 MiB address was dialed"),
    }
    for bad in ["127.0.0.1:0", "127.0.0.1:99999", "no-port"] {
        assert!(
            matches!(client.dial(bad).await, Err(DialError::Endpoint { message }) if message.starts_with("invalid dial address")),
            "{bad}"
        );
    }
    // The agent never saw them, and the tunnel that was open still flows.
    assert_eq!(crate::support::agent_dials(&agent).await, 1.0);
    echo_exact(live, 2, 64 * 1024).await;
    assert_eq!(limit_hits(&server, "bad_dial_address").await, 4.0);
}

/// Open descriptors of this process.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

#[tokio::test]
async fn silent_connections_are_closed_at_the_setup_deadline() {
    let pki = Pki::generate().unwrap();
    let mut options = ServerOptions::default();
    options.limits.setup_timeout = Duration::from_secs(2);
    let server = TestServer::start(&pki, options).await.unwrap();
    let baseline = open_fds();
    let f = &pki.files;
    let tls = tether_tls::client_config(
        &f.ca_cert,
        Some((&f.agent_cert, &f.agent_key)),
        vec![b"h2".to_vec()],
        &Default::default(),
    )
    .unwrap();
    let started = Instant::now();
    let mut silent = Vec::new();
    for _ in 0..100 {
        let tcp = TcpStream::connect(server.agent_addr).await.unwrap();
        let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
        // TLS completes; then nothing: no HTTP/2 preface, no SETTINGS.
        let stream = tokio_rustls::TlsConnector::from(tls.clone())
            .connect(name, tcp)
            .await
            .unwrap();
        silent.push(stream);
    }
    for stream in &mut silent {
        let mut sink = Vec::new();
        let closed = tokio::time::timeout(STEP, stream.read_to_end(&mut sink)).await;
        assert!(closed.is_ok(), "a silent connection outlived the deadline");
    }
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "closed after {took:?}");
    drop(silent);
    eventually("descriptors back to baseline", || async {
        open_fds() <= baseline + 2
    })
    .await;
    assert!(limit_hits(&server, "setup_timeout").await >= 100.0);
}

#[tokio::test]
async fn the_header_limit_holds_over_tls_too() {
    let pki = Pki::generate().unwrap();
    let options = ServerOptions {
        mode: Mode::HttpConnect,
        transport: Tx::Tls,
        ..ServerOptions::default()
    };
    let server = TestServer::start(&pki, options).await.unwrap();
    let f = &pki.files;
    let tls = tether_tls::client_config(
        &f.ca_cert,
        Some((&f.client_cert, &f.client_key)),
        vec![b"http/1.1".to_vec()],
        &Default::default(),
    )
    .unwrap();
    let tcp = TcpStream::connect(server.frontend_tcp.unwrap())
        .await
        .unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap();
    // A CONNECT line of 1.1 MB: the head completes in the read that crosses the limit.
    let request = format!(
        "CONNECT {}:80 HTTP/1.1\r\nHost: x\r\n\r\n",
        "a".repeat(1_100_000)
    );
    let (mut rd, mut wr) = tokio::io::split(&mut stream);
    let (_, head) = tokio::join!(wr.write_all(request.as_bytes()), read_head(&mut rd));
    assert!(head.starts_with("HTTP/1.1 431"), "{head}");
}

/// Writes `pki`'s server certificate, key and CA over `files` (the way a Secret volume or
/// cert-manager rotates them: new contents at the same paths).
fn install(pki: &tether_tls::pki::Pki, files: &tether_tls::pki::PkiFiles) {
    std::fs::write(&files.server_cert, &pki.server_cert_pem).unwrap();
    std::fs::write(&files.server_key, &pki.server_key_pem).unwrap();
    std::fs::write(&files.ca_cert, &pki.ca_cert_pem).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotated_certificates_and_ca_are_used_without_dropping_connections() {
    let old = Pki::generate().unwrap();
    let new = Pki::generate().unwrap();
    // The server's own files, in a directory of their own, start as the old PKI's.
    let live_dir = tempfile::tempdir().unwrap();
    let live = old.pem.write_to(live_dir.path()).unwrap();
    let agent_tls = Arc::new(
        tether_tls::Reloading::new(
            vec![
                live.server_cert.clone(),
                live.server_key.clone(),
                live.ca_cert.clone(),
            ],
            {
                let live = live.clone();
                move || {
                    tether_tls::server_config(
                        &live.server_cert,
                        &live.server_key,
                        Some(&live.ca_cert),
                        &tether_server::AGENT_ALPN,
                        &Default::default(),
                    )
                }
            },
        )
        .unwrap(),
    );
    let options = ServerOptions {
        tls_reload: Some(tether_server::TlsReload {
            interval: Duration::from_millis(200),
            agent: agent_tls,
            frontend: None,
        }),
        ..ServerOptions::default()
    };
    let server = TestServer::start(&old, options).await.unwrap();
    let old_agent = TestAgent::start(&old, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
        .await
        .unwrap();
    let tunnel = client.dial(&echo.addr.to_string()).await.unwrap();
    let tunnel = echo_exact(tunnel, 1, 4096).await;

    // A broken rotation (a key that does not match) keeps the old config and is counted.
    std::fs::write(&live.server_key, &new.pem.server_key_pem).unwrap();
    let reloads = |outcome: &'static str| {
        let server = &server;
        async move {
            let text = server.metrics().await.unwrap();
            metric_value(
                &text,
                &format!(
                    "tether_server_tls_reloads_total{{listener=\"agent\",outcome=\"{outcome}\"}}"
                ),
            )
            .unwrap_or(0.0)
        }
    };
    eventually("failed reload counted", || async {
        reloads("failed").await == 1.0
    })
    .await;

    // The real rotation: new CA and new server certificate.
    install(&new.pem, &live);
    eventually("reload counted", || async {
        reloads("reloaded").await == 1.0
    })
    .await;
    // An agent of the new PKI is admitted (its certificate chains to the new CA and it
    // trusts the new server certificate); the old agent's live stream and tunnel stay.
    let new_agent = TestAgent::start(&new, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    new_agent.wait_ready().await.unwrap();
    echo_exact(tunnel, 2, 64 * 1024).await;
    eventually("both agents connected", || async {
        let text = server.metrics().await.unwrap();
        metric_value(
            &text,
            "konnectivity_network_proxy_server_ready_backend_connections",
        ) == Some(2.0)
    })
    .await;
    // New handshakes from the old PKI are refused now: the old CA is no longer trusted.
    let f = &old.files;
    let old_tls = tether_tls::client_config(
        &f.ca_cert,
        Some((&f.agent_cert, &f.agent_key)),
        vec![b"h2".to_vec()],
        &Default::default(),
    )
    .unwrap();
    let tcp = TcpStream::connect(server.agent_addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let refused = tokio_rustls::TlsConnector::from(old_tls)
        .connect(name, tcp)
        .await;
    assert!(
        refused.is_err(),
        "the old PKI still handshakes after rotation"
    );
    drop(old_agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_picks_up_rotated_certificates_on_its_next_connection() {
    let pki = Pki::generate().unwrap();
    let new = tether_tls::pki::Pki::generate().unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let agent_addr = server.agent_addr;
    let options = AgentOptions {
        tls_reload: true,
        ..AgentOptions::default()
    };
    let agent = TestAgent::start(&pki, agent_addr, options).await.unwrap();
    server.wait_ready().await.unwrap();
    server.stop().await;

    // Rotate every file the agent reads, then bring up a server of the new PKI on the same
    // port: only an agent that re-read its files can handshake with it.
    let f = &pki.files;
    std::fs::write(&f.ca_cert, &new.ca_cert_pem).unwrap();
    std::fs::write(&f.agent_cert, &new.agent_cert_pem).unwrap();
    std::fs::write(&f.agent_key, &new.agent_key_pem).unwrap();
    std::fs::write(&f.server_cert, &new.server_cert_pem).unwrap();
    std::fs::write(&f.server_key, &new.server_key_pem).unwrap();
    let options = ServerOptions {
        agent_addr: Some(agent_addr),
        ..ServerOptions::default()
    };
    let server = TestServer::start(&pki, options).await.unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    proves_dials_reach_the_real_agent(&server, &echo).await;
    drop(agent);
}

#[tokio::test]
async fn connections_beyond_the_listener_cap_are_closed_and_idle_ones_expire() {
    let pki = Pki::generate().unwrap();
    let mut options = ServerOptions::default();
    options.limits.max_frontend_connections = 2;
    options.limits.idle_connection_timeout = Some(Duration::from_secs(1));
    let server = TestServer::start(&pki, options).await.unwrap();
    let uds = server.uds.clone().unwrap();

    // Two HTTP/2 connections without a stream: served, then closed once idle for 1 s.
    let mut idle = Vec::new();
    for _ in 0..2 {
        let io = tokio::net::UnixStream::connect(&uds).await.unwrap();
        let (client, conn) = h2::client::handshake(io).await.unwrap();
        idle.push((client, tokio::spawn(conn)));
    }
    // A third is over the cap: closed before any byte is read.
    let mut third = tokio::net::UnixStream::connect(&uds).await.unwrap();
    let mut sink = Vec::new();
    let read = tokio::time::timeout(STEP, third.read_to_end(&mut sink)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert_eq!(limit_hits(&server, "listener_connections").await, 1.0);

    let started = Instant::now();
    for (_client, conn) in idle {
        tokio::time::timeout(STEP, conn)
            .await
            .expect("an idle connection was not closed")
            .unwrap()
            .ok();
    }
    assert!(started.elapsed() < Duration::from_secs(15));
    // Their slots came back: a new connection is served (the server answers with SETTINGS).
    let mut io = tokio::net::UnixStream::connect(&uds).await.unwrap();
    io.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
        .await
        .unwrap();
    let mut frame_header = [0u8; 9];
    tokio::time::timeout(STEP, io.read_exact(&mut frame_header))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(frame_header[3], 0x4, "the server's first frame is SETTINGS");
}
