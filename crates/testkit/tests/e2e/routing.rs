//! Agent selection: upstream's proxy strategies and their fallback order.

use tether_server::{Mode, Strategy};
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};

use crate::support::{agent_dials, echo_exact, eventually, http_connect_uds};

async fn dial_once(server: &TestServer, target: &str) {
    let (stream, head) = http_connect_uds(server.uds.as_ref().unwrap(), target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_exact(stream, 7, 1024).await;
}

#[tokio::test]
async fn dest_host_then_default_route_then_default() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            strategies: vec![
                Strategy::DestHost,
                Strategy::DefaultRoute,
                Strategy::Default,
            ],
            // The PKI's one agent certificate proves no identifier: routing by what the
            // agents declare is the conscious choice of `off`.
            agent_identity_binding: tether_server::IdentityBinding::Off,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let node = TestAgent::start(
        &pki,
        server.agent_addr,
        AgentOptions {
            identifiers: "host=localhost&ipv4=127.0.0.2".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let gateway = TestAgent::start(
        &pki,
        server.agent_addr,
        AgentOptions {
            identifiers: "default-route=true".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    node.wait_ready().await.unwrap();
    gateway.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let port = echo.addr.port();

    // 127.0.0.1 matches no identifier: defaultRoute picks the gateway, every time.
    for _ in 0..5 {
        dial_once(&server, &format!("127.0.0.1:{port}")).await;
    }
    assert_eq!(agent_dials(&gateway).await, 5.0);
    assert_eq!(agent_dials(&node).await, 0.0);
    // `localhost` is the node agent's host identifier: destHost picks it.
    for _ in 0..3 {
        dial_once(&server, &format!("localhost:{port}")).await;
    }
    assert_eq!(agent_dials(&node).await, 3.0);

    // Without the gateway, an unmatched host falls through to `default`.
    gateway.stop().await;
    eventually("gateway gone", || async {
        let text = server.metrics().await.unwrap();
        tether_testkit::http::metric_value(
            &text,
            "konnectivity_network_proxy_server_ready_backend_connections",
        ) == Some(1.0)
    })
    .await;
    dial_once(&server, &format!("127.0.0.1:{port}")).await;
    assert_eq!(agent_dials(&node).await, 4.0);
}

#[tokio::test]
async fn draining_agent_gets_no_new_dials_but_keeps_its_connections() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let first = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    first.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();

    // A live connection through the first agent.
    let (live, head) = http_connect_uds(server.uds.as_ref().unwrap(), &target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let live = echo_exact(live, 1, 4096).await;

    let second = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    second.wait_ready().await.unwrap();
    first.drain();
    eventually("drain reaches the server", || async {
        // Ten dials in a row all land on the second agent once the server knows.
        let before = agent_dials(&second).await;
        for _ in 0..10 {
            dial_once(&server, &target).await;
        }
        agent_dials(&second).await - before == 10.0
    })
    .await;
    // The draining agent still serves the connection it had.
    echo_exact(live, 2, 1 << 20).await;
    // With only the draining agent left, dials still work (upstream's fallback).
    second.stop().await;
    eventually("second agent gone", || async {
        let text = server.metrics().await.unwrap();
        tether_testkit::http::metric_value(
            &text,
            "konnectivity_network_proxy_server_ready_backend_connections",
        ) == Some(1.0)
    })
    .await;
    dial_once(&server, &target).await;
}
