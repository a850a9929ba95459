//! No head-of-line blocking: a connection whose reader stalls costs the others nothing.

use std::time::Duration;
use tokio::time::Instant;

use tether_server::Mode;
use tether_testkit::targets::SourceServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::support::http_connect_uds;

const BULK: u64 = 256 << 20;

async fn download(
    server: &TestServer,
    source: &SourceServer,
    bytes: u64,
) -> tokio::net::UnixStream {
    let (mut stream, head) =
        http_connect_uds(server.uds.as_ref().unwrap(), &source.addr.to_string()).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    stream.write_u64(bytes).await.unwrap();
    stream
}

/// Reads until EOF; returns the byte count.
async fn drain(mut stream: tokio::net::UnixStream) -> u64 {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        match stream.read(&mut buf).await.unwrap() {
            0 => return total,
            n => total += n as u64,
        }
    }
}

async fn stalled_neighbour_does_not_block(legacy_agent: bool) {
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
            legacy: legacy_agent,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    agent.wait_ready().await.unwrap();
    server.wait_ready().await.unwrap();
    let source = SourceServer::start().await.unwrap();

    // A: asks for endless data and never reads it.
    let stalled = download(&server, &source, u64::MAX).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    // B: 256 MiB through the same agent, same agent stream.
    let started = Instant::now();
    let b = download(&server, &source, BULK).await;
    let got = tokio::time::timeout(Duration::from_secs(120), drain(b))
        .await
        .expect("B is not blocked by A");
    assert_eq!(got, BULK);
    eprintln!(
        "B moved {} MiB in {:?} next to a stalled connection (legacy agent: {legacy_agent})",
        BULK >> 20,
        started.elapsed()
    );
    // With credit the stalled connection just waits. An upstream-style peer cannot be slowed
    // down per connection: the stream waits a bounded time for the stalled reader, then that
    // connection alone is closed.
    let overflows = || async {
        tether_testkit::http::metric_value(
            &server.metrics().await.unwrap(),
            "tether_server_connection_overflow_closes_total",
        )
    };
    if legacy_agent {
        crate::support::eventually("the stalled connection is closed", || async {
            overflows().await == Some(1.0)
        })
        .await;
    } else {
        assert_eq!(overflows().await, Some(0.0));
    }
    drop(stalled);
}

#[tokio::test]
async fn stalled_reader_with_credit_flow_control() {
    stalled_neighbour_does_not_block(false).await;
}

#[tokio::test]
async fn stalled_reader_with_an_upstream_style_agent() {
    stalled_neighbour_does_not_block(true).await;
}
