//! The HTTP CONNECT frontend, spoken raw as kube-apiserver does.

use tether_server::Mode;
use tether_testkit::targets::{EchoServer, pattern, refused_addr};
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::STEP;

async fn connect(server: &TestServer, target: &str) -> (UnixStream, Vec<u8>) {
    let mut stream = UnixStream::connect(server.uds.as_ref().unwrap())
        .await
        .unwrap();
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if stream.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    (stream, head)
}

#[tokio::test]
async fn echo_through_http_connect_over_uds() {
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
    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    tokio::time::timeout(STEP, server.wait_ready())
        .await
        .unwrap()
        .unwrap();
    agent.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();

    let (stream, head) = connect(&server, &echo.addr.to_string()).await;
    assert_eq!(head, b"HTTP/1.1 200 Connection Established\r\n\r\n");
    let data = pattern(1, 8 << 20);
    let (mut rd, mut wr) = stream.into_split();
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        wr.write_all(&sent).await.unwrap();
        wr
    });
    let mut got = vec![0u8; data.len()];
    tokio::time::timeout(STEP, rd.read_exact(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert!(got == data, "echoed bytes differ");
    drop(writer.await.unwrap());

    // A refused destination: 502 with Go's dial error text.
    let refused = refused_addr();
    let (_s, head) = connect(&server, &refused.to_string()).await;
    let text = String::from_utf8_lossy(&head);
    assert!(text.starts_with("HTTP/1.1 502 Bad Gateway\r\n"), "{text}");
    let mut body = String::new();
    _s.into_split().0.read_to_string(&mut body).await.unwrap();
    assert_eq!(
        body,
        format!("dial tcp {refused}: connect: connection refused")
    );

    agent.stop().await;
    server.stop().await;
}
