//! The agent's destination policy, end to end: a real server and agent, HTTP CONNECT over
//! the Unix socket, and listeners that must never see a connection.

use std::path::Path;
use std::time::Duration;

use tether_agent::DestinationConfig;
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;

use crate::STEP;
use crate::support::{echo_exact, eventually, http_connect_uds};

/// A server and an agent whose destinations follow `config`.
async fn start(pki: &Pki, config: DestinationConfig) -> anyhow::Result<(TestServer, TestAgent)> {
    let server = TestServer::start(pki, ServerOptions::http_connect()).await?;
    let agent = TestAgent::start(
        pki,
        server.agent_addr,
        AgentOptions {
            destinations: config,
            ..AgentOptions::default()
        },
    )
    .await?;
    server.wait_ready().await?;
    agent.wait_ready().await?;
    Ok((server, agent))
}

/// The policy error the client sees for `target`: a 502 whose body is the agent's text.
async fn refused(uds: &Path, target: &str) -> String {
    let (stream, head) = http_connect_uds(uds, target).await;
    assert!(head.starts_with("HTTP/1.1 502 "), "{target}: {head}");
    let body = read_body(stream).await;
    assert!(body.starts_with("policy: "), "{target}: {body}");
    body
}

/// The rest of a refused CONNECT response: the server closes after the body.
async fn read_body(mut stream: tokio::net::UnixStream) -> String {
    let mut body = String::new();
    tokio::time::timeout(STEP, stream.read_to_string(&mut body))
        .await
        .expect("the body of a refused CONNECT ends")
        .unwrap();
    body
}

async fn agent_metric(agent: &TestAgent, sample: &str) -> f64 {
    metric_value(&agent.metrics().await.unwrap(), sample).unwrap_or(0.0)
}

/// Fails if anything connects to `listener` within a short while.
async fn assert_never_connected(listener: &TcpListener) {
    let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "a denied destination was connected to");
}

#[tokio::test]
async fn denied_destinations_are_refused_with_the_rule_and_reloads_apply() {
    let pki = Pki::generate().unwrap();
    let denied = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = denied.local_addr().unwrap().port();
    let echo = EchoServer::start().await.unwrap();
    let policy = pki.dir().join("destinations.policy");
    std::fs::write(
        &policy,
        format!("deny to 127.0.0.1 port {port}\nallow all\n"),
    )
    .unwrap();
    let (server, agent) = start(
        &pki,
        DestinationConfig {
            policy_file: Some(policy.clone()),
            reload_interval: Duration::from_millis(50),
            ..DestinationConfig::default()
        },
    )
    .await
    .unwrap();
    let uds = server.uds.clone().unwrap();

    assert_eq!(
        refused(&uds, &format!("127.0.0.1:{port}")).await,
        format!("policy: 127.0.0.1:{port} denied by line 1: deny to 127.0.0.1/32 port {port}")
    );
    assert_never_connected(&denied).await;
    for target in ["169.254.169.254:80", "[fd00:ec2::254]:80"] {
        let body = refused(&uds, target).await;
        assert!(
            body.contains("built-in rule") && body.contains("link-local"),
            "{body}"
        );
    }
    let failures =
        "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"policy\"}";
    assert_eq!(agent_metric(&agent, failures).await, 3.0);
    let (stream, head) = http_connect_uds(&uds, &echo.addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut held = echo_exact(stream, 3, 4096).await;

    // A new file applies without a restart.
    std::fs::write(&policy, "deny all\n").unwrap();
    let target = echo.addr.to_string();
    eventually("the reloaded policy denies the echo server", || async {
        let (stream, head) = http_connect_uds(&uds, &target).await;
        // Until the reload applies, the tunnel opens: close it without reading.
        if !head.starts_with("HTTP/1.1 502") {
            return false;
        }
        read_body(stream)
            .await
            .ends_with("denied by line 1: deny all")
    })
    .await;

    // The tunnel opened before it, which it denies, is closed. On a Unix socket an error close
    // is a plain close (no reset exists there); the gRPC client reads the policy's error (see
    // the process tests).
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(STEP, held.read(&mut buf))
        .await
        .expect("the denied tunnel is closed");
    assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    // At least this one: a probe above may have been open still when the reload applied.
    let closed = "tether_agent_destination_policy_connections_closed_total";
    assert!(agent_metric(&agent, closed).await >= 1.0);

    // A broken file is counted and the last good policy stays.
    std::fs::write(&policy, "allow all\nallow to 127.0.0.1/33\n").unwrap();
    let reload_failures = format!(
        "tether_agent_config_reloads_total{{file=\"{}\",result=\"refused\"}}",
        policy.display()
    );
    eventually("the broken reload is counted", || async {
        agent_metric(&agent, &reload_failures).await == 1.0
    })
    .await;
    assert!(
        refused(&uds, &target)
            .await
            .ends_with("denied by line 1: deny all")
    );
}

/// The review's probe (N8): the metadata address in IPv6 forms that embed it (IPv4-compatible,
/// NAT64, 6to4, Teredo) passed the policy and failed only when the connect found no route.
/// Now each is refused by the policy, before any connect, naming the address it embeds; a
/// file's deny of the IPv4 address refuses them too.
#[tokio::test]
async fn ipv6_forms_embedding_the_metadata_address_are_refused() {
    let pki = Pki::generate().unwrap();
    let spellings = [
        "[::169.254.169.254]:80",
        "[64:ff9b::a9fe:a9fe]:80",
        "[2002:a9fe:a9fe::1]:80",
        "[64:ff9b:1::a9fe:a9fe]:80",
        "[2001:0:4136:e378:8000:63bf:5601:5601]:80",
    ];
    let (server, _agent) = start(&pki, DestinationConfig::default()).await.unwrap();
    let uds = server.uds.clone().unwrap();
    for target in spellings {
        let body = refused(&uds, target).await;
        assert!(
            body.contains("built-in rule")
                && body.contains("link-local")
                && body.contains("as 169.254.169.254, the IPv4 address it embeds by"),
            "{target}: {body}"
        );
    }
    drop(server);

    let policy = pki.dir().join("metadata.policy");
    std::fs::write(&policy, "deny to 169.254.169.254\nallow all\n").unwrap();
    let (server, _agent) = start(
        &pki,
        DestinationConfig {
            policy_file: Some(policy),
            allow_link_local: true,
            ..DestinationConfig::default()
        },
    )
    .await
    .unwrap();
    let uds = server.uds.clone().unwrap();
    for target in spellings {
        let body = refused(&uds, target).await;
        assert!(
            body.contains("denied by line 1: deny to 169.254.169.254/32, as 169.254.169.254"),
            "{target}: {body}"
        );
    }
}

#[tokio::test]
async fn a_name_resolving_to_denied_loopback_is_refused() {
    let pki = Pki::generate().unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (server, _agent) = start(
        &pki,
        DestinationConfig {
            allow_loopback: false,
            ..DestinationConfig::default()
        },
    )
    .await
    .unwrap();
    let body = refused(server.uds.as_ref().unwrap(), &format!("localhost:{port}")).await;
    assert!(body.contains("--allow-loopback-destinations"), "{body}");
    assert_never_connected(&listener).await;
}

#[tokio::test]
async fn the_agents_own_endpoints_are_never_a_destination() {
    let pki = Pki::generate().unwrap();
    let (server, agent) = start(&pki, DestinationConfig::default()).await.unwrap();
    let uds = server.uds.clone().unwrap();
    for addr in [agent.health_addr, agent.admin_addr] {
        let body = refused(&uds, &addr.to_string()).await;
        assert!(body.contains("own listener"), "{body}");
    }
}

#[tokio::test]
async fn a_broken_policy_file_stops_the_agent_at_start_up() {
    let pki = Pki::generate().unwrap();
    let policy = pki.dir().join("broken.policy");
    std::fs::write(&policy, "# ok\nallow everything\n").unwrap();
    let server = TestServer::start(&pki, ServerOptions::http_connect())
        .await
        .unwrap();
    let options = AgentOptions {
        destinations: DestinationConfig {
            policy_file: Some(policy),
            ..DestinationConfig::default()
        },
        ..AgentOptions::default()
    };
    let error = TestAgent::start(&pki, server.agent_addr, options)
        .await
        .unwrap_err();
    let text = format!("{error:#}");
    assert!(text.contains("broken.policy: line 2: "), "{text}");
}
