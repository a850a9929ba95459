//! Server peering (issue 29): three servers on 127.0.0.2–.4, linked to each other on their
//! peer ports. An agent holds a stream to one of them only; a client of any server reaches
//! it, through the server that holds it.

use std::time::{Duration, Instant};

use tether_client::{GrpcClient, Transport};
use tether_testkit::fleet::Fleet;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bounds that only catch a hang.
const STEP: Duration = Duration::from_secs(30);

async fn client_of(server: &TestServer) -> GrpcClient {
    GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
        .await
        .unwrap()
}

/// One echo through `server`'s frontend; the dial's error if it fails.
async fn echo_through(server: &TestServer, echo: &EchoServer) -> Result<(), String> {
    let client = client_of(server).await;
    let mut tunnel = tokio::time::timeout(STEP, client.dial(&echo.addr.to_string()))
        .await
        .map_err(|_| "dial hung".to_owned())?
        .map_err(|e| e.to_string())?;
    tunnel.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut back = [0u8; 4];
    tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
        .await
        .map_err(|_| "echo hung".to_owned())?
        .map_err(|e| e.to_string())?;
    assert_eq!(&back, b"ping");
    Ok(())
}

/// Polls every 20 ms until an echo through `server` succeeds; panics after `within`.
async fn reachable(server: &TestServer, echo: &EchoServer, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        match echo_through(server, echo).await {
            Ok(()) => return started.elapsed(),
            Err(e) => assert!(
                started.elapsed() < within,
                "not reachable within {within:?}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An agent holding one stream, to member `host` only (TLS verifies `localhost`).
async fn held_by(fleet: &Fleet, host: u8) -> TestAgent {
    TestAgent::start(
        &fleet.pki,
        fleet.address(host),
        AgentOptions {
            discovery: tether_agent::Discovery::List([fleet.address(host)].into()),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_any_server_reaches_an_agent_one_server_holds() {
    tether_testkit::init_logging();
    let fleet = Fleet::start_peered(3).await.unwrap();
    // The agent holds one stream, to the third server only.
    let agent = held_by(&fleet, 4).await;
    let echo = EchoServer::start().await.unwrap();
    for server in &fleet.servers {
        reachable(server, &echo, Duration::from_secs(5)).await;
    }
    agent.stop().await;
}
