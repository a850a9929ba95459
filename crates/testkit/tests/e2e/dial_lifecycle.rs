//! Dials that hang: cancelled by the client, failed when their agent goes, bounded by deadlines.

use std::time::Duration;
use tokio::time::Instant;

use tether_client::{DialError, GrpcClient, Transport};
use tether_testkit::http::metric_value;
use tether_testkit::targets::Blackhole;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};

use crate::support::eventually;

/// A server and an agent whose own dial deadline is far away, a destination whose connects
/// hang, and a gRPC client.
struct Hanging {
    _pki: Pki,
    server: TestServer,
    agent: TestAgent,
    hole: Blackhole,
    client: GrpcClient,
}

impl Hanging {
    async fn start(server: ServerOptions) -> Self {
        let pki = Pki::generate().unwrap();
        let server = TestServer::start(&pki, server).await.unwrap();
        let agent_options = AgentOptions {
            dial_timeout: Duration::from_secs(60),
            ..Default::default()
        };
        let agent = TestAgent::start(&pki, server.agent_addr, agent_options)
            .await
            .unwrap();
        server.wait_ready().await.unwrap();
        let hole = Blackhole::start().await.unwrap();
        let transport = Transport::Unix(server.uds.clone().unwrap());
        let client = GrpcClient::connect(&transport).await.unwrap();
        Self {
            _pki: pki,
            server,
            agent,
            hole,
            client,
        }
    }
}

async fn metric(text: String, sample: &str) -> f64 {
    metric_value(&text, sample).unwrap_or(-1.0)
}

#[tokio::test]
async fn a_hanging_dial_is_cancelled_at_the_agent_when_the_client_gives_up() {
    let Hanging {
        _pki,
        server,
        agent,
        hole,
        client,
    } = Hanging::start(ServerOptions::default()).await;

    let result = client
        .dial_with_timeout(&hole.addr.to_string(), Duration::from_millis(300))
        .await;
    assert!(
        matches!(result, Err(DialError::Timeout)),
        "{:?}",
        result.err()
    );
    // DIAL_CLS reached the agent, which abandoned its dial instead of waiting it out.
    eventually("the agent cancelled its dial", || async {
        metric(
            agent.metrics().await.unwrap(),
            "tether_agent_dials_cancelled_total",
        )
        .await
            == 1.0
    })
    .await;
    eventually("the server forgot the dial", || async {
        metric(
            server.metrics().await.unwrap(),
            "konnectivity_network_proxy_server_pending_backend_dials",
        )
        .await
            == 0.0
    })
    .await;
}

#[tokio::test]
async fn pending_dials_fail_at_once_when_their_agent_goes() {
    let Hanging {
        _pki,
        server,
        agent,
        hole,
        client,
    } = Hanging::start(ServerOptions::default()).await;

    let target = hole.addr.to_string();
    let dial = tokio::spawn(async move { client.dial(&target).await.map(|_| ()) });
    eventually("the dial is pending", || async {
        metric(
            server.metrics().await.unwrap(),
            "konnectivity_network_proxy_server_pending_backend_dials",
        )
        .await
            == 1.0
    })
    .await;
    let stopped = Instant::now();
    agent.stop().await;
    let outcome = tokio::time::timeout(Duration::from_secs(5), dial)
        .await
        .expect("the dial fails promptly")
        .unwrap();
    assert!(outcome.is_err(), "the dial must fail");
    eprintln!(
        "pending dial failed {:?} after its agent left: {:?}",
        stopped.elapsed(),
        outcome.err()
    );
}

#[tokio::test]
async fn the_server_bounds_every_dial_with_a_deadline() {
    let Hanging {
        _pki,
        server,
        agent: _agent,
        hole,
        client,
    } = Hanging::start(ServerOptions {
        dial_timeout: Duration::from_millis(500),
        ..Default::default()
    })
    .await;
    match client.dial(&hole.addr.to_string()).await {
        Err(DialError::Endpoint { message }) => assert!(message.contains("timed out"), "{message}"),
        other => panic!("expected the server's dial deadline, got {:?}", other.err()),
    }
    let text = server.metrics().await.unwrap();
    assert_eq!(
        metric_value(
            &text,
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"backend_dial_timeout\"}"
        ),
        Some(1.0)
    );
}
