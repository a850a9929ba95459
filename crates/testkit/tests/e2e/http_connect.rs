//! The HTTP CONNECT frontend, spoken raw as kube-apiserver does.

use tether_testkit::targets::refused_addr;
use tether_testkit::{AgentOptions, ServerOptions, Stack};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::STEP;
use crate::support::{echo_exact, http_connect_uds, read_head};

#[tokio::test]
async fn echo_through_http_connect_over_uds() {
    // Kept whole: the agent must stay, and the PKI's directory holds the socket.
    let stack = Stack::start(ServerOptions::http_connect(), AgentOptions::default())
        .await
        .unwrap();
    let (uds, echo) = (stack.server.uds.as_ref().unwrap(), &stack.echo);

    let (stream, head) = http_connect_uds(uds, &echo.addr.to_string()).await;
    assert_eq!(
        head, "HTTP/1.1 200 Connection Established\r\n\r\n",
        "exactly upstream's bytes"
    );
    echo_exact(stream, 1, 8 << 20).await;

    // A refused destination: 502 with Go's dial error text.
    let refused = refused_addr();
    let (mut stream, head) = http_connect_uds(uds, &refused.to_string()).await;
    assert_eq!(
        head,
        "HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n"
    );
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    assert_eq!(
        body,
        format!("dial tcp {refused}: connect: connection refused")
    );
}

#[tokio::test]
async fn bytes_behind_the_head_reach_the_destination_first() {
    // A client may write before the 200: in the head's own segment, or while the dial is
    // under way. Both reach the destination, in order, ahead of what comes after the 200.
    let stack = Stack::start(ServerOptions::http_connect(), AgentOptions::default())
        .await
        .unwrap();
    let (uds, echo) = (stack.server.uds.as_ref().unwrap(), &stack.echo);
    let mut stream = UnixStream::connect(uds).await.unwrap();
    let head = format!(
        "CONNECT {0} HTTP/1.1\r\nHost: {0}\r\n\r\nin-the-head,",
        echo.addr
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(b"during-the-dial,").await.unwrap();
    assert_eq!(
        read_head(&mut stream).await,
        "HTTP/1.1 200 Connection Established\r\n\r\n"
    );
    stream.write_all(b"after").await.unwrap();
    let expected = b"in-the-head,during-the-dial,after";
    let mut echoed = vec![0u8; expected.len()];
    tokio::time::timeout(STEP, stream.read_exact(&mut echoed))
        .await
        .expect("the echo in time")
        .unwrap();
    assert_eq!(echoed, expected);
}
