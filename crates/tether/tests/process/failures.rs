//! Dead, frozen and departing peers.

use std::time::Duration;
use tokio::time::Instant;

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Frontend, Process, ServerProcess, spawn_agent, spawn_server};
use tether_testkit::targets::{EchoServer, SourceServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{STEP, bin, metric, tls_transport, until};

const AGENTS: &str = "konnectivity_network_proxy_server_ready_backend_connections";
const OPEN_ENDPOINTS: &str = "konnectivity_network_proxy_agent_open_endpoint_connections";

/// Reads a tunnel whose agent was just killed: it must fail, not end cleanly, within 5 s.
/// A killed agent cannot say it is gone: the server holds its connections for the agent to
/// resume them, for the default `--resume-window` (4 s), which these tests keep.
async fn read_until_error<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> std::io::Error {
    let mut buf = vec![0u8; 64 * 1024];
    let outcome = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) => return Err(e),
            }
        }
    })
    .await
    .expect("the client learns of the loss within 5 s");
    outcome.expect_err("a lost agent is an error, not a clean end of stream")
}

/// Two agents; returns them ordered so that the first carries the next connection made.
async fn pick_carrier(server: &ServerProcess, agents: [Process; 2]) -> (Process, Process) {
    let [a, b] = agents;
    if metric(&a, OPEN_ENDPOINTS)
        .await
        .is_some_and(|open| open >= 1.0)
    {
        (a, b)
    } else {
        assert_eq!(
            metric(&b, OPEN_ENDPOINTS).await,
            Some(1.0),
            "one agent carries the connection"
        );
        let _ = server;
        (b, a)
    }
}

#[tokio::test]
async fn killed_agent_resets_http_connect_and_new_dials_use_the_survivor() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    let a = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    let b = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    a.wait_ready().await.unwrap();
    b.wait_ready().await.unwrap();
    until("both agents registered", || async {
        metric(&server.process, AGENTS).await == Some(2.0)
    })
    .await;
    let source = SourceServer::start().await.unwrap();
    let transport = tls_transport(&pki, &server);

    let mut stream = tether_client::dial_http_connect(&transport, &source.addr.to_string())
        .await
        .unwrap();
    stream.write_u64(u64::MAX).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    stream.read_exact(&mut buf).await.unwrap();
    let (carrier, survivor) = pick_carrier(&server, [a, b]).await;

    carrier.signal("KILL").await.unwrap();
    let killed = Instant::now();
    let error = read_until_error(&mut stream).await;
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    eprintln!(
        "HTTP CONNECT client saw {error} {:?} after kill -9",
        killed.elapsed()
    );

    let echo = EchoServer::start().await.unwrap();
    let mut stream = tether_client::dial_http_connect(&transport, &echo.addr.to_string())
        .await
        .unwrap();
    stream.write_all(b"still here").await.unwrap();
    let mut back = [0u8; 10];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"still here");
    assert_eq!(metric(&survivor, OPEN_ENDPOINTS).await, Some(1.0));
}

#[tokio::test]
async fn killed_agent_fails_grpc_streams_with_an_error() {
    let pki = Pki::generate().unwrap();
    let uds = pki.dir().join("grpc.sock");
    let server = spawn_server(bin(), &pki, Frontend::GrpcUds(uds.clone()), &[])
        .await
        .unwrap();
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    agent.wait_ready().await.unwrap();
    server.process.wait_ready().await.unwrap();
    let source = SourceServer::start().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();
    let mut stream = client.dial(&source.addr.to_string()).await.unwrap();
    stream.write_u64(u64::MAX).await.unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    stream.read_exact(&mut buf).await.unwrap();

    agent.signal("KILL").await.unwrap();
    let killed = Instant::now();
    let error = read_until_error(&mut stream).await;
    eprintln!(
        "gRPC client saw {error} {:?} after kill -9",
        killed.elapsed()
    );
}

#[tokio::test]
async fn frozen_agent_is_detected_and_removed() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(
        bin(),
        &pki,
        Frontend::HttpConnectTls,
        &["--agent-ping-interval=1s", "--agent-ping-timeout=2s"],
    )
    .await
    .unwrap();
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    agent.wait_ready().await.unwrap();
    until("agent registered", || async {
        metric(&server.process, AGENTS).await == Some(1.0)
    })
    .await;

    agent.signal("STOP").await.unwrap();
    let detected = until("frozen agent removed", || async {
        metric(&server.process, AGENTS).await == Some(0.0)
    })
    .await;
    eprintln!("frozen agent removed after {detected:?} (ping every 1s, timeout 2s)");
    assert!(
        detected < Duration::from_secs(10),
        "detected in {detected:?}"
    );
    agent.signal("CONT").await.unwrap();
    // Thawed, it notices its stream is gone and comes back by itself.
    until("agent back", || async {
        metric(&server.process, AGENTS).await == Some(1.0)
    })
    .await;
}

#[tokio::test]
async fn sigterm_drains_the_agent_and_a_second_one_stops_it() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    let mut a = spawn_agent(bin(), &pki, server.agent_addr, &["--agent-id=first"])
        .await
        .unwrap();
    a.wait_ready().await.unwrap();
    until("first agent registered", || async {
        metric(&server.process, AGENTS).await == Some(1.0)
    })
    .await;
    let echo = EchoServer::start().await.unwrap();
    let transport = tls_transport(&pki, &server);
    let mut live = tether_client::dial_http_connect(&transport, &echo.addr.to_string())
        .await
        .unwrap();

    let b = spawn_agent(bin(), &pki, server.agent_addr, &["--agent-id=second"])
        .await
        .unwrap();
    b.wait_ready().await.unwrap();
    until("second agent registered", || async {
        metric(&server.process, AGENTS).await == Some(2.0)
    })
    .await;
    a.signal("TERM").await.unwrap();
    // Wait until the server knows, then every new dial goes to the second agent.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..10 {
        let mut s = tether_client::dial_http_connect(&transport, &echo.addr.to_string())
            .await
            .unwrap();
        s.write_all(b"x").await.unwrap();
        s.read_exact(&mut [0u8; 1]).await.unwrap();
    }
    let dials = |p: &Process| {
        let p = p.health;
        async move {
            let text = tether_testkit::http::get(p, "/metrics").await.unwrap().1;
            metric_value(
                &text,
                "konnectivity_network_proxy_agent_dial_duration_seconds_count",
            )
            .unwrap_or(0.0)
        }
    };
    assert_eq!(dials(&a).await, 1.0, "the draining agent got no new dial");
    assert_eq!(dials(&b).await, 10.0);
    // The draining agent still serves its live connection.
    live.write_all(b"after drain").await.unwrap();
    let mut back = [0u8; 11];
    tokio::time::timeout(STEP, live.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"after drain");
    // A second signal stops it, with status 0 as upstream.
    a.signal("TERM").await.unwrap();
    assert_eq!(a.wait(STEP).await.unwrap(), Some(0));
}

#[tokio::test]
async fn graceful_shutdown_lets_live_connections_finish_then_cuts_them() {
    let pki = Pki::generate().unwrap();
    let mut server = spawn_server(
        bin(),
        &pki,
        Frontend::HttpConnectTls,
        &["--graceful-shutdown-timeout=3s"],
    )
    .await
    .unwrap();
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    agent.wait_ready().await.unwrap();
    server.process.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let transport = tls_transport(&pki, &server);
    let mut live = tether_client::dial_http_connect(&transport, &echo.addr.to_string())
        .await
        .unwrap();

    server.process.signal("TERM").await.unwrap();
    let signalled = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // No new connections ...
    assert!(
        tether_client::dial_http_connect(&transport, &echo.addr.to_string())
            .await
            .is_err()
    );
    // ... but the live one keeps working during the grace period ...
    live.write_all(b"in grace").await.unwrap();
    let mut back = [0u8; 8];
    live.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"in grace");
    // ... and is cut, as an error, when it ends.
    let mut buf = [0u8; 16];
    let cut = tokio::time::timeout(STEP, live.read(&mut buf))
        .await
        .unwrap();
    assert!(
        cut.is_err(),
        "cut at the deadline must be an error, got {cut:?}"
    );
    let after = signalled.elapsed();
    assert!(
        after >= Duration::from_secs(2),
        "cut only after the grace period ({after:?})"
    );
    assert_eq!(server.process.wait(STEP).await.unwrap(), Some(0));
}

#[tokio::test]
async fn frozen_server_is_detected_by_the_agent() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    let agent = spawn_agent(
        bin(),
        &pki,
        server.agent_addr,
        &["--server-ping-interval=1s", "--server-ping-timeout=2s"],
    )
    .await
    .unwrap();
    agent.wait_ready().await.unwrap();
    const SERVERS: &str = "konnectivity_network_proxy_agent_open_server_connections";
    assert_eq!(metric(&agent, SERVERS).await, Some(1.0));

    server.process.signal("STOP").await.unwrap();
    let detected = until("the agent drops the frozen server", || async {
        metric(&agent, SERVERS).await == Some(0.0)
    })
    .await;
    eprintln!("frozen server dropped by the agent after {detected:?} (ping every 1s, timeout 2s)");
    assert!(
        detected < Duration::from_secs(10),
        "detected in {detected:?}"
    );
    let (status, _) = tether_testkit::http::get(agent.health, "/readyz")
        .await
        .unwrap();
    assert_eq!(status, 503, "an agent without servers is not ready");
    server.process.signal("CONT").await.unwrap();
    until("the agent reconnects", || async {
        metric(&agent, SERVERS).await == Some(1.0)
    })
    .await;
}
