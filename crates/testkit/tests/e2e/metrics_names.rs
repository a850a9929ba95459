//! Metric names are part of the contract: upstream's dashboards, alerts and tests read them.

use std::collections::BTreeSet;

use tether_server::Mode;
use tether_testkit::targets::{EchoServer, refused_addr};
use tether_testkit::{AgentOptions, Pki, ServerOptions, Stack, TestAgent, TestServer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::STEP;
use crate::support::{echo_exact, http_connect_uds};

/// Every server metric upstream defines (konnectivity-upstream.md §3.3).
const UPSTREAM_SERVER: &[&str] = &[
    "dial_duration_seconds",
    "frontend_write_duration_seconds",
    "connection_duration_seconds",
    "connection_close_total",
    "grpc_connections",
    "http_connections",
    "ready_backend_connections",
    "ready_backends",
    "pending_backend_dials",
    "established_connections",
    "full_receive_channels",
    "dial_failure_count",
    "stream_packets_total",
    "stream_errors_total",
    "culled_leases_count",
    "lease_delete_latency_seconds",
    "lease_delete_total",
    "lease_list_latency_seconds",
    "lease_list_total",
];

/// Server metrics that must be present once a dial succeeded and one failed.
const SERVER_AFTER_TRAFFIC: &[&str] = &[
    "dial_duration_seconds",
    "frontend_write_duration_seconds",
    "connection_duration_seconds",
    "connection_close_total",
    "grpc_connections",
    "http_connections",
    "ready_backend_connections",
    "ready_backends",
    "pending_backend_dials",
    "established_connections",
    "dial_failure_count",
    "stream_packets_total",
    "culled_leases_count",
];

/// Every agent metric upstream defines (§4.5).
const UPSTREAM_AGENT: &[&str] = &[
    "dial_duration_seconds",
    "server_connection_failure_count",
    "endpoint_dial_failure_total",
    "open_server_connections",
    "known_server_count",
    "open_endpoint_connections",
    "endpoint_connection_duration_seconds",
    "endpoint_connection_close_total",
    "stream_packets_total",
    "stream_errors_total",
    "lease_lists_total",
    "lease_watches_total",
    "lease_list_latency_seconds",
];

const AGENT_AFTER_TRAFFIC: &[&str] = &[
    "dial_duration_seconds",
    "endpoint_dial_failure_total",
    "open_server_connections",
    "known_server_count",
    "open_endpoint_connections",
    "endpoint_connection_duration_seconds",
    "endpoint_connection_close_total",
    "stream_packets_total",
];

/// `# HELP` lines that upstream's test helpers (`pkg/testing/metrics`, used by its integration
/// suite against an external agent) and `promtest.ScrapeAndCompare` users compare byte for byte.
const UPSTREAM_HELP: &[&str] = &[
    "# HELP konnectivity_network_proxy_server_dial_failure_count Number of dial failures observed. Multiple failures can occur for a single dial request.",
    "# HELP konnectivity_network_proxy_server_pending_backend_dials Current number of pending backend dial requests",
    "# HELP konnectivity_network_proxy_server_ready_backend_connections Number of konnectivity agent connected to the proxy server. DEPRECATED, please use ready_backends",
    "# HELP konnectivity_network_proxy_server_ready_backends Number of konnectivity agent connected to the proxy server",
    "# HELP konnectivity_network_proxy_server_established_connections Current number of established end-to-end connections (post-dial).",
    "# HELP konnectivity_network_proxy_agent_endpoint_dial_failure_total Number of failures dialing the remote endpoint, by reason (example: timeout).",
    "# HELP konnectivity_network_proxy_agent_open_endpoint_connections Current number of open endpoint connections.",
    "# HELP konnectivity_network_proxy_agent_open_server_connections Current number of open server connections.",
    // ANP#908 (open upstream): pkg/testing/metrics compares these two.
    "# HELP konnectivity_network_proxy_server_connection_close_total Number of established end-to-end connections (post-dial) that were closed, by reason for the close.",
    "# HELP konnectivity_network_proxy_agent_endpoint_connection_close_total Number of established endpoint connections (post-dial) that were closed, by reason for the close.",
    // ANP#899 (merged 2026-08-19).
    "# HELP konnectivity_network_proxy_server_connection_duration_seconds Duration in seconds a proxied end-to-end connection was established (post-dial) before being closed.",
];

fn check_help(text: &str, prefix: &str) {
    for want in UPSTREAM_HELP.iter().filter(|l| l.contains(prefix)) {
        assert!(
            text.lines().any(|l| l == *want),
            "HELP differs from upstream's, want {want:?}\n{text}"
        );
    }
}

/// Names declared with `# TYPE` under `prefix`, without the prefix.
fn declared(text: &str, prefix: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .filter_map(|name| name.strip_prefix(prefix))
        .map(str::to_owned)
        .collect()
}

fn check(text: &str, prefix: &str, upstream: &[&str], required: &[&str]) {
    let names = declared(text, prefix);
    let unknown: Vec<_> = names
        .iter()
        .filter(|n| !upstream.contains(&n.as_str()))
        .collect();
    assert!(
        unknown.is_empty(),
        "metrics under {prefix} that upstream does not have: {unknown:?}"
    );
    let missing: Vec<_> = required.iter().filter(|n| !names.contains(**n)).collect();
    assert!(
        missing.is_empty(),
        "upstream metrics missing under {prefix}: {missing:?}\n{text}"
    );
}

#[tokio::test]
async fn server_and_agent_expose_upstream_metric_names() {
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
    drop(echo_exact(stream, 1, 1000).await);
    let (_s, head) =
        http_connect_uds(server.uds.as_ref().unwrap(), &refused_addr().to_string()).await;
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");

    let text = server.metrics().await.unwrap();
    check(
        &text,
        "konnectivity_network_proxy_server_",
        UPSTREAM_SERVER,
        SERVER_AFTER_TRAFFIC,
    );
    check_help(&text, "konnectivity_network_proxy_server_");
    assert!(
        text.contains(
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"error_response\"} 1"
        ),
        "{text}"
    );
    // The client closed its tunnel: upstream's close exchange, `frontend_close` (ANP#908).
    assert!(
        text.contains(
            "konnectivity_network_proxy_server_connection_close_total{reason=\"frontend_close\"} 1"
        ),
        "{text}"
    );
    // The admin port serves the same registry.
    let (status, admin) = tether_testkit::http::get(server.admin_addr, "/metrics")
        .await
        .unwrap();
    assert_eq!(status, 200);
    assert!(admin.contains("konnectivity_network_proxy_server_established_connections"));

    let text = agent.metrics().await.unwrap();
    check(
        &text,
        "konnectivity_network_proxy_agent_",
        UPSTREAM_AGENT,
        AGENT_AFTER_TRAFFIC,
    );
    check_help(&text, "konnectivity_network_proxy_agent_");
    assert!(
        text.contains(
            "konnectivity_network_proxy_agent_endpoint_connection_close_total{reason=\"server_close\"} 1"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"unknown\"} 1"
        ),
        "{text}"
    );
    // The agent's admin port redirects /metrics to the health port, as upstream, but to
    // the health listener's own address: never to the Host the client sent (N10).
    let mut admin = tokio::net::TcpStream::connect(agent.admin_addr)
        .await
        .unwrap();
    admin
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: evil.example:18284\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tokio::time::timeout(STEP, admin.read_to_string(&mut answer))
        .await
        .unwrap()
        .unwrap();
    assert!(answer.starts_with("HTTP/1.1 301 "), "{answer}");
    let location = format!("\r\nLocation: http://{}/metrics\r\n", agent.health_addr);
    assert!(answer.contains(&location), "{location:?} in {answer}");
    assert!(!answer.contains("evil"), "{answer}");
}

#[tokio::test]
async fn tether_metrics_show_closes_queues_and_pending_dials_per_agent() {
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
    let agent = TestAgent::start(
        &pki,
        server.agent_addr,
        AgentOptions {
            agent_id: "node-a".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let (stream, head) =
        http_connect_uds(server.uds.as_ref().unwrap(), &echo.addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(echo_exact(stream, 1, 100_000).await);

    let sample = |s: &'static str| {
        let server = &server;
        async move { tether_testkit::http::metric_value(&server.metrics().await.unwrap(), s) }
    };
    crate::support::eventually("the client's close is counted", || async {
        sample("tether_server_connection_closes_total{initiator=\"client\",outcome=\"normal\"}")
            .await
            == Some(1.0)
    })
    .await;
    assert_eq!(
        sample("tether_server_agent_queued_bytes{agent_id=\"node-a\"}").await,
        Some(0.0)
    );
    assert_eq!(
        sample("tether_server_agent_pending_dials{agent_id=\"node-a\"}").await,
        Some(0.0)
    );

    // An agent that leaves takes its series with it.
    agent.stop().await;
    crate::support::eventually("the agent's series are dropped", || async {
        sample("tether_server_agent_pending_dials{agent_id=\"node-a\"}")
            .await
            .is_none()
    })
    .await;
}
