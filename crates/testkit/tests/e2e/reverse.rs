//! The agent's control-plane listener (reverse dials) with an in-process server whose only
//! control-plane endpoint is a loopback echo server.

use std::time::Duration;

use tether_agent::{ControlPlaneConfig, ControlPlaneProtocol, ListenAddr};
use tether_server::ControlPlaneEndpoints;
use tether_testkit::http::metric_value;
use tether_testkit::reset::{assert_connect_reset, assert_reset};
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::{echo_exact, eventually};

async fn over_limit(agent: &TestAgent) -> f64 {
    let text = agent.metrics().await.expect("agent metrics");
    metric_value(
        &text,
        "tether_agent_control_plane_dials_total{result=\"over_limit\"}",
    )
    .unwrap_or(0.0)
}

/// An in-process server whose only control-plane endpoint is `endpoint`, and a ready agent
/// whose control-plane listener speaks `protocol` and carries at most `max_connections`.
async fn start(
    pki: &Pki,
    endpoint: &EchoServer,
    protocol: ControlPlaneProtocol,
    max_connections: usize,
) -> (TestServer, TestAgent) {
    let endpoints = ControlPlaneEndpoints::new(vec![endpoint.addr.to_string()]);
    start_with(pki, endpoints, protocol, max_connections).await
}

/// The same with the server's `endpoints` (none: it takes no reverse dial).
async fn start_with(
    pki: &Pki,
    endpoints: Option<ControlPlaneEndpoints>,
    protocol: ControlPlaneProtocol,
    max_connections: usize,
) -> (TestServer, TestAgent) {
    let server = TestServer::start(
        pki,
        ServerOptions {
            control_plane: endpoints,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let agent = TestAgent::start(
        pki,
        server.agent_addr,
        AgentOptions {
            control_plane: Some(ControlPlaneConfig {
                listen: ListenAddr::Tcp("127.0.0.1:0".parse().unwrap()),
                endpoint: String::new(),
                max_connections,
                protocol,
            }),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    agent.wait_ready().await.unwrap();
    (server, agent)
}

/// Found by the soak: a reverse dial that could not be made was closed like a connection
/// the endpoint ended, so a client could not tell it lost the bytes it had sent.
#[tokio::test]
async fn a_reverse_dial_that_fails_resets_the_tcp_client() {
    let pki = Pki::generate().unwrap();
    // A server that takes no reverse dial: the agent has no stream to dial through.
    let (_server, agent) = start_with(&pki, None, ControlPlaneProtocol::Tcp, 8).await;
    let listen = agent.control_plane_addr.clone().unwrap();
    assert_connect_reset(&listen, "no server").await;

    // A server whose endpoint refuses the connection: the dial fails.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = closed.local_addr().unwrap().to_string();
    drop(closed);
    let endpoints = ControlPlaneEndpoints::new(vec![endpoint]);
    let (_server, agent) = start_with(&pki, endpoints, ControlPlaneProtocol::Tcp, 8).await;
    let listen = agent.control_plane_addr.clone().unwrap();
    assert_connect_reset(&listen, "a refused endpoint").await;
}

/// An agent that stops with a node's connection open resets it: the client must not take the
/// cut for the endpoint's own close. (Only a killed agent's connections end cleanly: its
/// kernel closes them, and only the client's own TLS can tell.)
#[tokio::test]
async fn a_control_plane_connection_open_when_the_agent_stops_is_reset() {
    let pki = Pki::generate().unwrap();
    let echo = EchoServer::start().await.unwrap();
    let (_server, agent) = start(&pki, &echo, ControlPlaneProtocol::Tcp, 8).await;
    let listen = agent.control_plane_addr.clone().unwrap();
    let carried = echo_exact(TcpStream::connect(&listen).await.unwrap(), 1, 4096).await;
    agent.stop().await;
    assert_reset(carried, "the carried connection").await;
}

#[tokio::test]
async fn the_control_plane_listener_carries_at_most_its_limit_of_connections() {
    let pki = Pki::generate().unwrap();
    let echo = EchoServer::start().await.unwrap();
    let (_server, agent) = start(&pki, &echo, ControlPlaneProtocol::Tcp, 2).await;
    let listen = agent.control_plane_addr.clone().unwrap();
    // Two connections are carried to the echo server and stay open.
    let first = echo_exact(TcpStream::connect(&listen).await.unwrap(), 1, 4096).await;
    let second = echo_exact(TcpStream::connect(&listen).await.unwrap(), 2, 4096).await;
    // A third is reset at once, before anything is dialed.
    assert_connect_reset(&listen, "the third connection").await;
    assert_eq!(over_limit(&agent).await, 1.0);
    // Once one ends, its slot is free again.
    drop(first);
    eventually("a freed slot carries a new connection", || async {
        let Ok(stream) = TcpStream::connect(&listen).await else {
            return false;
        };
        let mut stream = stream;
        // Refused connections read EOF at once; a carried one echoes.
        if stream.write_all(b"x").await.is_err() {
            return false;
        }
        let mut got = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), stream.read(&mut got)).await,
            Ok(Ok(1))
        )
    })
    .await;
    drop(second);
}

#[tokio::test]
async fn the_http_connect_listener_carries_each_connect_to_the_endpoint_it_names() {
    let pki = Pki::generate().unwrap();
    let echo = EchoServer::start().await.unwrap();
    // Allowed by the server, but never named: a CONNECT to it must be refused.
    let other = EchoServer::start().await.unwrap();
    let (_server, agent) = start(&pki, &echo, ControlPlaneProtocol::HttpConnect, 10).await;
    let listen = agent.control_plane_addr.clone().unwrap();
    // CONNECT with early bytes right behind the head: 200, then the echo of every byte.
    let mut stream = TcpStream::connect(&listen).await.unwrap();
    let request = format!("CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\nearly", echo.addr);
    stream.write_all(request.as_bytes()).await.unwrap();
    let established = b"HTTP/1.1 200 Connection established\r\n\r\nearly";
    let mut got = vec![0u8; established.len()];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut got))
        .await
        .expect("answer in time")
        .unwrap();
    assert_eq!(got, established, "{}", String::from_utf8_lossy(&got));
    drop(echo_exact(stream, 3, 64 * 1024).await);
    // Not in the server's allowlist: 403 with the server's reason, and nothing dialed.
    let reply = exchange(&listen, &format!("CONNECT {} HTTP/1.1\r\n\r\n", other.addr)).await;
    assert!(reply.starts_with("HTTP/1.1 403 "), "{reply}");
    assert!(
        reply.contains(&format!(
            "{} is not an allowed control-plane endpoint",
            other.addr
        )),
        "{reply}"
    );
    // Anything but CONNECT: 405; garbage: 400.
    let reply = exchange(&listen, "GET / HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 405 "), "{reply}");
    let reply = exchange(&listen, "\x01\x02 not http\r\n\r\n").await;
    assert!(reply.starts_with("HTTP/1.1 400 "), "{reply}");
}

/// Sends `request` to the listener and reads its answer to the end.
async fn exchange(listen: &str, request: &str) -> String {
    let mut stream = TcpStream::connect(listen).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .expect("answer in time")
        .unwrap();
    String::from_utf8_lossy(&reply).into_owned()
}
