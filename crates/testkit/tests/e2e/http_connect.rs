//! The HTTP CONNECT frontend, spoken raw as kube-apiserver does.

use tether_testkit::targets::refused_addr;
use tether_testkit::{AgentOptions, ServerOptions, Stack};
use tokio::io::AsyncReadExt;

use crate::support::{echo_exact, http_connect_uds};

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
