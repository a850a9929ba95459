//! Agents and servers coming and going: reconnects, HA server counts, agent loss.

use std::time::Duration;

use tether_server::Mode;
use tether_testkit::balancer::LoadBalancer;
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, Stack, TestAgent, TestServer};
use tokio::io::AsyncReadExt;

use crate::support::{echo_exact, eventually, http_connect_uds};

async fn server_metric(server: &TestServer, sample: &str) -> Option<f64> {
    metric_value(&server.metrics().await.ok()?, sample)
}

#[tokio::test]
async fn agent_restart_and_server_restart_reconnect_by_themselves() {
    let pki = Pki::generate().unwrap();
    let opts = ServerOptions {
        mode: Mode::HttpConnect,
        ..Default::default()
    };
    let server = TestServer::start(&pki, opts.clone()).await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();

    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    agent.stop().await;
    eventually("server notices the agent left", || async {
        server_metric(
            &server,
            "konnectivity_network_proxy_server_ready_backend_connections",
        )
        .await
            == Some(0.0)
    })
    .await;
    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let (stream, head) = http_connect_uds(server.uds.as_ref().unwrap(), &target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_exact(stream, 1, 65536).await;

    // Restart the server on the same agent port: the agent finds it again by itself.
    let agent_addr = server.agent_addr;
    server.stop().await;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            agent_addr: Some(agent_addr),
            ..opts
        },
    )
    .await
    .unwrap();
    tokio::time::timeout(Duration::from_secs(30), server.wait_ready())
        .await
        .unwrap()
        .unwrap();
    agent.wait_ready().await.unwrap();
    let (stream, head) = http_connect_uds(server.uds.as_ref().unwrap(), &target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_exact(stream, 2, 65536).await;
}

#[tokio::test]
async fn agent_holds_a_stream_to_each_of_two_servers_behind_one_address() {
    let pki = Pki::generate().unwrap();
    let a = TestServer::start(
        &pki,
        ServerOptions {
            server_id: "a".into(),
            server_count: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let b = TestServer::start(
        &pki,
        ServerOptions {
            server_id: "b".into(),
            server_count: 2,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let lb = LoadBalancer::start(vec![a.agent_addr, b.agent_addr])
        .await
        .unwrap();
    let agent = TestAgent::start(&pki, lb.addr, AgentOptions::default())
        .await
        .unwrap();
    a.wait_ready().await.unwrap();
    b.wait_ready().await.unwrap();
    eventually("agent connected to both servers", || async {
        let text = agent.metrics().await.unwrap();
        metric_value(
            &text,
            "konnectivity_network_proxy_agent_open_server_connections",
        ) == Some(2.0)
            && metric_value(&text, "konnectivity_network_proxy_agent_known_server_count")
                == Some(2.0)
    })
    .await;
    // It stays at two: duplicates are closed, not kept.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = agent.metrics().await.unwrap();
    assert_eq!(
        metric_value(
            &text,
            "konnectivity_network_proxy_agent_open_server_connections"
        ),
        Some(2.0)
    );
    assert_eq!(
        server_metric(
            &a,
            "konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"}"
        )
        .await,
        Some(1.0)
    );
}

#[tokio::test]
async fn losing_the_agent_fails_pending_dials_at_once_and_resets_connections() {
    let Stack {
        pki: _pki,
        server,
        agent,
        echo,
    } = Stack::start(ServerOptions::http_connect(), AgentOptions::default())
        .await
        .unwrap();
    let (stream, head) =
        http_connect_uds(server.uds.as_ref().unwrap(), &echo.addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut stream = echo_exact(stream, 3, 1024).await;

    agent.stop().await;
    // The established connection ends (UDS has no RST; the read ends promptly) ...
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "connection should end when its agent goes: {read:?}"
    );
    // ... and the server holds nothing for it any more.
    eventually("no established or pending connections", || async {
        server_metric(
            &server,
            "konnectivity_network_proxy_server_established_connections",
        )
        .await
            == Some(0.0)
            && server_metric(
                &server,
                "konnectivity_network_proxy_server_pending_backend_dials",
            )
            .await
                == Some(0.0)
    })
    .await;
}

/// The agent's task tracker owns every session, connection and HTTP/2 connection driver, and
/// `Agent::run` waits for all of them. Stopping with a live tunneled connection must still be
/// prompt: each of those tasks ends by itself, none is left for the 5 s stop deadline to cut.
#[tokio::test]
async fn a_stopping_agent_waits_for_its_tasks_and_they_end_promptly() {
    let pki = Pki::generate().unwrap();
    let opts = ServerOptions {
        mode: Mode::HttpConnect,
        ..Default::default()
    };
    let server = TestServer::start(&pki, opts).await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let (mut stream, head) =
        http_connect_uds(server.uds.as_ref().unwrap(), &echo.addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    let started = tokio::time::Instant::now();
    agent.stop().await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "the agent took {took:?} to stop: some task outlived its owner until the deadline"
    );
    // The tunneled connection ended with the agent.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the client's connection was not closed");
}
