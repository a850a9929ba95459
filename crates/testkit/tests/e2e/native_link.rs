//! The native agent link on a real server's agent port: both links side by side, and what
//! the server makes of a hand-driven native client, well-behaved or not.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tether_proto::link::{self, Close, Frame};
use tether_proto::metadata;
use tether_server::Mode;
use tether_testkit::harness::{AgentLink, AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tether_testkit::http::metric_value;
use tether_testkit::native::{NativeClient, hello};
use tether_testkit::targets::EchoServer;

use crate::support::{agent_dials, echo_exact, eventually, http_connect_uds};

/// The links each agent of `/debug/agents` runs on, sorted.
async fn links(server: &TestServer) -> Vec<String> {
    let (_, body) = tether_testkit::http::get(server.admin_addr, "/debug/agents")
        .await
        .unwrap();
    let report: tether_observe::introspect::AgentsReport = serde_json::from_str(&body).unwrap();
    let mut links: Vec<String> = report.streams.into_iter().map(|s| s.transport).collect();
    links.sort();
    links
}

/// One server serves a native-link agent and a gRPC-link agent at once; each carries
/// connections, and each end names its link.
#[tokio::test]
async fn both_links_serve_side_by_side() {
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
    let echo = EchoServer::start().await.unwrap();
    let uds = server.uds.clone().unwrap();
    for link in [AgentLink::Native, AgentLink::Grpc] {
        let agent = start_agent(&pki, &server, link).await;
        eventually("the agent connected", || async {
            links(&server).await == [link.name()]
        })
        .await;
        let (stream, head) = http_connect_uds(&uds, &echo.addr.to_string()).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        echo_exact(stream, 7, 3 << 20).await;
        agent.stop().await;
        eventually("the agent left", || async {
            links(&server).await.is_empty()
        })
        .await;
    }
    let native = start_agent(&pki, &server, AgentLink::Native).await;
    let grpc = start_agent(&pki, &server, AgentLink::Grpc).await;
    eventually("both agents connected", || async {
        links(&server).await == ["grpc", "native"]
    })
    .await;
    // The server picks an agent at random: in 24 dials each gets some (all but 1 in 10^7).
    for seed in 0..24 {
        let (stream, head) = http_connect_uds(&uds, &echo.addr.to_string()).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        echo_exact(stream, seed, 64 << 10).await;
    }
    for agent in [&native, &grpc] {
        assert!(agent_dials(agent).await >= 1.0, "each link carried dials");
    }
    server.stop().await;
}

async fn start_agent(pki: &Pki, server: &TestServer, link: AgentLink) -> TestAgent {
    let options = AgentOptions {
        link,
        ..Default::default()
    };
    TestAgent::start(pki, server.agent_addr, options)
        .await
        .unwrap()
}

/// A hand-driven native client of `server`, as the PKI's agent.
async fn native_client(pki: &Pki, server: &TestServer) -> NativeClient {
    let f = &pki.files;
    NativeClient::connect(
        server.agent_addr,
        &f.ca_cert,
        Some((&f.agent_cert, &f.agent_key)),
    )
    .await
    .unwrap()
}

/// A well-formed HELLO is accepted at the server's version, an unknown capability is not
/// echoed, the stream's metadata is answered as gRPC headers would be, a PING is answered,
/// and a CLOSE ends the stream cleanly: the server forgets the agent.
#[tokio::test]
async fn a_hand_driven_agent_is_accepted_pinged_and_let_go() {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let mut client = native_client(&pki, &server).await;
    let flow = "tether-flow";
    client
        .send(&hello(
            9,
            &[(metadata::AGENT_ID, "hand-driven"), (flow, "262144")],
        ))
        .await
        .unwrap();
    let Some(Frame::Accept(accept)) = client.receive().await.unwrap() else {
        panic!("an ACCEPT");
    };
    assert_eq!(
        accept.version,
        link::VERSION,
        "the lower of the two versions"
    );
    assert!(accept.capabilities.is_empty(), "{:?}", accept.capabilities);
    assert_eq!(accept.metadata.get(metadata::SERVER_ID), Some("server-1"));
    assert_eq!(accept.metadata.get(metadata::SERVER_COUNT), Some("1"));
    assert!(accept.metadata.get(metadata::TETHER_FLOW).is_some());
    eventually("the server lists the agent", || async {
        links(&server).await == ["native"]
    })
    .await;
    client.send(&Frame::Ping(42)).await.unwrap();
    assert_eq!(client.receive().await.unwrap(), Some(Frame::Pong(42)));
    client
        .send(&Frame::Close(Close {
            code: 0,
            message: String::new(),
        }))
        .await
        .unwrap();
    eventually("the server forgets the agent", || async {
        links(&server).await.is_empty()
    })
    .await;
    server.stop().await;
}

/// Refusals come as CLOSE frames with gRPC's codes and the reason; garbage, an unknown frame
/// type and an oversized HELLO header close the connection at once; a client that says
/// nothing is closed at the setup deadline and counted. None of it troubles an agent that
/// connects afterwards.
#[tokio::test]
async fn bad_native_clients_are_refused_and_harm_no_one() {
    let pki = Pki::generate().unwrap();
    let mut opts = ServerOptions::default();
    opts.limits.setup_timeout = Duration::from_millis(500);
    let server = TestServer::start(&pki, opts).await.unwrap();

    // No agent ID: refused with the reason, as a gRPC call is.
    let mut client = native_client(&pki, &server).await;
    client.send(&hello(1, &[])).await.unwrap();
    match client.receive().await.unwrap() {
        Some(Frame::Close(close)) => {
            assert_eq!(close.code, 2, "UNKNOWN, as upstream refuses metadata");
            assert!(close.message.contains("agent ID"), "{}", close.message);
        }
        other => panic!("a CLOSE, not {other:?}"),
    }
    assert_eq!(client.receive().await.unwrap(), None, "then the end");

    // A frame type no version defines, a PACKET before HELLO, a HELLO header claiming a
    // megabyte: each connection is closed, without the server waiting for more.
    let mut unknown = BytesMut::new();
    unknown.put_u32(0);
    unknown.put_u8(0x7f);
    let mut early = BytesMut::new();
    link::encode_packet(&tether_proto::Packet::Drain, &mut early);
    let mut huge = BytesMut::new();
    huge.put_u32(1 << 20);
    huge.put_u8(0x01);
    for bytes in [unknown, early, huge] {
        let mut client = native_client(&pki, &server).await;
        client.send_raw(&bytes).await.unwrap();
        let started = tokio::time::Instant::now();
        assert_eq!(client.receive().await.unwrap(), None);
        assert!(
            started.elapsed() < Duration::from_millis(400),
            "closed at once"
        );
    }

    // Silence: closed at the setup deadline, and counted.
    let mut silent = native_client(&pki, &server).await;
    assert_eq!(silent.receive().await.unwrap(), None);
    let metrics = server.metrics().await.unwrap();
    let timeouts = metric_value(
        &metrics,
        "tether_server_limit_hits_total{limit=\"setup_timeout\"}",
    )
    .unwrap_or(0.0);
    assert!(timeouts >= 1.0, "{metrics}");

    // A real agent still gets in and carries a connection.
    let echo = EchoServer::start().await.unwrap();
    let agent = start_agent(&pki, &server, AgentLink::Native).await;
    server.wait_ready().await.unwrap();
    let uds = server.uds.clone().unwrap();
    let transport = tether_client::Transport::Unix(uds.clone());
    let stream = crate::support::dial(Mode::Grpc, &transport, &echo.addr.to_string())
        .await
        .unwrap();
    echo_exact(stream, 3, 1 << 20).await;
    agent.stop().await;
    server.stop().await;
}
