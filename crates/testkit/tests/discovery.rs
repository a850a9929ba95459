//! Reaching every server without a balancer's luck (issue 29): three servers, each on its
//! own loopback address and the same port. An agent given the servers' addresses holds a
//! stream to each within seconds, even where a balancer in front of them would send every
//! new connection to the same server; one that dials that balancer stays at one, as
//! upstream's. A server that goes away and comes back is held again.

use std::time::Duration;
use tokio::time::Instant;

use tether_client::{GrpcClient, Transport};
use tether_testkit::balancer::LoadBalancer;
use tether_testkit::cut_relay::CuttingRelay;
use tether_testkit::fleet::Fleet;
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, ServerOptions, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const OPEN_SERVER_STREAMS: &str = "konnectivity_network_proxy_agent_open_server_connections";
const READY_AGENTS: &str = "konnectivity_network_proxy_server_ready_backend_connections";
/// Bounds that only catch a hang.
const STEP: Duration = Duration::from_secs(30);

/// An agent holding one stream to each of `addresses`; TLS verifies `localhost`.
async fn discovering_agent(
    fleet: &Fleet,
    addresses: std::collections::BTreeSet<std::net::SocketAddr>,
) -> TestAgent {
    TestAgent::start(
        &fleet.pki,
        fleet.address(2),
        AgentOptions {
            discovery: tether_agent::Discovery::List(addresses),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// `sample` from a metrics page; 0 when absent.
fn metric(metrics: anyhow::Result<String>, sample: &str) -> f64 {
    metric_value(&metrics.unwrap(), sample).unwrap_or(0.0)
}

/// Polls every 20 ms until `check` holds; panics after `within`.
async fn eventually<F, Fut>(what: &str, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < within, "not within {within:?}: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// One echo through `server`'s frontend: the agent's stream to it carries dials.
async fn echo_through(server: &TestServer, echo: &EchoServer) {
    let client = GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
        .await
        .unwrap();
    let mut tunnel = tokio::time::timeout(STEP, client.dial(&echo.addr.to_string()))
        .await
        .unwrap()
        .unwrap();
    tunnel.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"ping");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_given_every_address_holds_every_server_where_the_balancer_always_picks_one() {
    tether_testkit::init_logging();
    let fleet = Fleet::start(3).await.unwrap();
    // The worst luck: a balancer that sends every connection to the first server.
    let sticky = LoadBalancer::start(vec![fleet.address(2)]).await.unwrap();
    let through_balancer = TestAgent::start(&fleet.pki, sticky.addr, AgentOptions::default())
        .await
        .unwrap();
    let discovering = discovering_agent(&fleet, fleet.addresses()).await;
    let took = eventually(
        "the discovering agent holds all three servers",
        Duration::from_secs(5),
        || async { metric(discovering.metrics().await, OPEN_SERVER_STREAMS) == 3.0 },
    )
    .await;
    eprintln!("all three servers held after {took:?}");
    let echo = EchoServer::start().await.unwrap();
    for server in &fleet.servers {
        echo_through(server, &echo).await;
    }
    // `/debug/agents` (`tether agents`) names the address each stream was opened to.
    let (status, body) = tether_testkit::http::get(discovering.admin_addr, "/debug/agents")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let mut held: Vec<(String, String)> = report["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["server_id"].as_str().unwrap().to_owned(),
                s["server_address"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    held.sort();
    let want: Vec<(String, String)> = (2..=4u8)
        .map(|h| (format!("server-{h}"), fleet.address(h).to_string()))
        .collect();
    assert_eq!(held, want);
    // Through the balancer, upstream's way: one server, however long it tries (a dozen
    // sync intervals here).
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(
        metric(through_balancer.metrics().await, OPEN_SERVER_STREAMS),
        1.0
    );
    assert_eq!(metric(fleet.servers[0].metrics().await, READY_AGENTS), 2.0);
    for server in &fleet.servers[1..] {
        assert_eq!(metric(server.metrics().await, READY_AGENTS), 1.0);
    }
    // It counts one server per discovered address.
    let text = discovering.metrics().await.unwrap();
    assert_eq!(
        metric_value(&text, "konnectivity_network_proxy_agent_known_server_count"),
        Some(3.0),
        "{text}"
    );
    through_balancer.stop().await;
    discovering.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_comes_back_at_its_address_is_held_again() {
    tether_testkit::init_logging();
    let mut fleet = Fleet::start(3).await.unwrap();
    let agent = discovering_agent(&fleet, fleet.addresses()).await;
    eventually("all three servers held", Duration::from_secs(5), || async {
        metric(agent.metrics().await, OPEN_SERVER_STREAMS) == 3.0
    })
    .await;
    // The third server stops; the others keep their streams, and readiness says one is
    // missing.
    fleet.servers.pop().unwrap().stop().await;
    eventually("the agent lets go of the stopped server", STEP, || async {
        metric(agent.metrics().await, OPEN_SERVER_STREAMS) == 2.0
    })
    .await;
    // It comes back at its address under a new ID (a replaced pod).
    let back = TestServer::start(
        &fleet.pki,
        ServerOptions {
            server_id: "server-4-replaced".into(),
            ..fleet.member(4)
        },
    )
    .await
    .unwrap();
    let took = eventually(
        "the agent holds the replaced server",
        Duration::from_secs(5),
        || async { metric(back.metrics().await, READY_AGENTS) == 1.0 },
    )
    .await;
    eprintln!("the replaced server held after {took:?}");
    // The server counts the stream when it accepts it, the agent a moment later.
    eventually("the agent counts three streams", STEP, || async {
        metric(agent.metrics().await, OPEN_SERVER_STREAMS) == 3.0
    })
    .await;
    let echo = EchoServer::start().await.unwrap();
    echo_through(&back, &echo).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_on_the_way_to_its_address_resumes_there() {
    tether_testkit::init_logging();
    let fleet = Fleet::start(3).await.unwrap();
    // The first server's address is a relay that can be cut (a middlebox on that path).
    let relay = CuttingRelay::start(fleet.address(2)).await.unwrap();
    let mut addresses = fleet.addresses();
    addresses.remove(&fleet.address(2));
    addresses.insert(relay.addr);
    let agent = discovering_agent(&fleet, addresses).await;
    eventually("all three servers held", Duration::from_secs(5), || async {
        metric(agent.metrics().await, OPEN_SERVER_STREAMS) == 3.0
    })
    .await;
    let echo = EchoServer::start().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(fleet.servers[0].uds.clone().unwrap()))
        .await
        .unwrap();
    let mut tunnel = client.dial(&echo.addr.to_string()).await.unwrap();
    for round in 0..3u8 {
        relay.cut().await;
        tunnel.write_all(&[round; 64]).await.unwrap();
        let mut back = [0u8; 64];
        tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
            .await
            .expect("the echo comes back after the cut")
            .unwrap();
        assert_eq!(back, [round; 64]);
    }
    eventually("three resumes", STEP, || async {
        metric(agent.metrics().await, "tether_agent_resumes_total") == 3.0
    })
    .await;
    assert_eq!(metric(agent.metrics().await, OPEN_SERVER_STREAMS), 3.0);
    agent.stop().await;
}

/// The address the agent's stream was opened to, from its `/debug/agents`.
async fn stream_address(agent: &TestAgent) -> std::net::SocketAddr {
    let (status, body) = tether_testkit::http::get(agent.admin_addr, "/debug/agents")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let report: serde_json::Value = serde_json::from_str(&body).unwrap();
    let streams = report["streams"].as_array().unwrap();
    assert_eq!(streams.len(), 1, "{body}");
    streams[0]["server_address"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_address_of_a_suspended_server_leaves_its_stream_to_resume() {
    tether_testkit::init_logging();
    // One server with two addresses (as IPv4 and IPv6 of one pod): two relays to it.
    let fleet = Fleet::start(1).await.unwrap();
    let relays = [
        CuttingRelay::start(fleet.address(2)).await.unwrap(),
        CuttingRelay::start(fleet.address(2)).await.unwrap(),
    ];
    let agent = discovering_agent(&fleet, relays.iter().map(|r| r.addr).collect()).await;
    eventually(
        "the server held, its second address an alias",
        STEP,
        || async {
            metric(agent.metrics().await, OPEN_SERVER_STREAMS) == 1.0
                && relays.iter().all(|r| r.forwarded() >= 1)
        },
    )
    .await;
    let primary = stream_address(&agent).await;
    let (held, alias) = match relays.iter().position(|r| r.addr == primary) {
        Some(0) => (&relays[0], &relays[1]),
        Some(_) => (&relays[1], &relays[0]),
        None => panic!("the stream's address {primary} is neither relay"),
    };
    let echo = EchoServer::start().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(fleet.servers[0].uds.clone().unwrap()))
        .await
        .unwrap();
    let mut tunnel = client.dial(&echo.addr.to_string()).await.unwrap();
    // The stream's own address is down for a while; the alias still answers.
    held.set_refusing(true);
    held.cut().await;
    let through_alias = alias.forwarded();
    eventually("the stream suspended", STEP, || async {
        metric(agent.metrics().await, OPEN_SERVER_STREAMS) == 0.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        alias.forwarded(),
        through_alias,
        "the alias opened a fresh stream to the suspended server, which would end it"
    );
    held.set_refusing(false);
    tunnel.write_all(b"after").await.unwrap();
    let mut back = [0u8; 5];
    tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
        .await
        .expect("the echo comes back once the stream resumed")
        .unwrap();
    assert_eq!(&back, b"after");
    assert_eq!(
        metric(agent.metrics().await, "tether_agent_resumes_total"),
        1.0
    );
    agent.stop().await;
}
