//! The client against the real tether server, where no agent is needed: with none
//! connected, both frontends must answer "No agent available", which the client reports as
//! [`DialError::NoAgent`].

use std::net::SocketAddr;
use std::time::Duration;

use tether_client::{DialError, GrpcClient, Transport, dial_http_connect};
use tether_server::{Config, FlowConfig, FrontendListen, Mode, Server, Strategy};
use tokio_util::sync::CancellationToken;

use crate::support::within;

/// Runs a server with no agents, its frontend on a Unix socket in `dir`; stops it when the
/// returned token is cancelled.
async fn start_server(dir: &tempfile::TempDir, mode: Mode) -> (Transport, CancellationToken) {
    let files = tether_tls::pki::Pki::generate()
        .expect("generate PKI")
        .write_to(&dir.path().join("pki"))
        .expect("write PKI");
    let agent_tls = tether_tls::server_config(
        &files.server_cert,
        &files.server_key,
        Some(&files.ca_cert),
        &[b"h2"],
        &tether_tls::TlsOptions::default(),
    )
    .expect("agent TLS config");
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let path = dir.path().join("frontend.sock");
    let config = Config {
        mode,
        frontend: FrontendListen::Unix {
            path: path.clone(),
            delete_existing: true,
        },
        agent_addr: loopback,
        agent_tls,
        health_addr: loopback,
        admin_addr: loopback,
        server_id: "client-test".into(),
        server_count: 1,
        strategies: vec![Strategy::Default],
        routing: Default::default(),
        routing_reload: None,
        dial_timeout: Duration::from_secs(5),
        graceful_shutdown_timeout: Duration::ZERO,
        flow: FlowConfig::default(),
        agent_keepalive: None,
        frontend_keepalive: None,
        limits: Default::default(),
        agent_identity_binding: Default::default(),
        tls_reload: None,
        agent_token_auth: None,
        audit_log: None,
        control_plane: None,
        resume_window: Duration::from_secs(30),
        dead_agent_timeout: None,
        peering: None,
    };
    let server = Server::bind(config, tether_observe::metrics::Registry::new())
        .await
        .expect("bind server");
    let shutdown = CancellationToken::new();
    tokio::spawn(server.run(shutdown.clone()));
    (Transport::Unix(path), shutdown)
}

#[tokio::test]
async fn grpc_frontend_without_agents_answers_no_agent() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (transport, shutdown) = start_server(&dir, Mode::Grpc).await;
        let client = GrpcClient::connect(&transport).await.expect("connect");
        for _ in 0..2 {
            let dial = client.dial("127.0.0.1:1").await;
            assert!(matches!(dial, Err(DialError::NoAgent)), "{dial:?}");
        }
        assert!(!client.is_closed());
        shutdown.cancel();
    })
    .await;
}

#[tokio::test]
async fn http_connect_frontend_without_agents_answers_no_agent() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (transport, shutdown) = start_server(&dir, Mode::HttpConnect).await;
        let dial = dial_http_connect(&transport, "127.0.0.1:1").await;
        assert!(matches!(dial, Err(DialError::NoAgent)), "{dial:?}");
        shutdown.cancel();
    })
    .await;
}
