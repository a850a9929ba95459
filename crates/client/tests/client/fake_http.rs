//! A stand-in for a proxy server's HTTP CONNECT frontend, answering with upstream's bytes
//! (reference §2.3). The target's host picks the behaviour:
//!
//! | host | behaviour |
//! |---|---|
//! | `refuse` | 502 with the agent's dial error, then close |
//! | `no-agent` | 500 "currently no tunnels available: No agent available", then close |
//! | `chatty` | 200 followed at once by bytes nobody asked for |
//! | `lingering-405` | 405 with a Content-Length body, and the connection kept open |
//! | anything else | 200, then echo until the client closes |

use tether_client::Transport;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::support::{AbortOnDrop, Io, Listener};

pub(crate) const REFUSED: &str = "dial tcp 127.0.0.1:18999: connect: connection refused";

pub(crate) struct FakeHttpProxy {
    pub(crate) transport: Transport,
    /// Every request head received, byte for byte.
    pub(crate) requests: mpsc::UnboundedReceiver<Vec<u8>>,
    _accept: AbortOnDrop,
}

impl FakeHttpProxy {
    pub(crate) fn start(listener: Listener, transport: Transport) -> Self {
        let (requests_tx, requests) = mpsc::unbounded_channel();
        let accept = tokio::spawn(async move {
            while let Ok(accepted) = listener.accept().await {
                let Some(io) = accepted else { continue };
                tokio::spawn(handle(io, requests_tx.clone()));
            }
        });
        Self {
            transport,
            requests,
            _accept: AbortOnDrop(accept),
        }
    }
}

async fn handle(mut io: Box<dyn Io>, requests: mpsc::UnboundedSender<Vec<u8>>) {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        match io.read_u8().await {
            Ok(byte) => head.push(byte),
            Err(_) => return,
        }
    }
    let target = String::from_utf8_lossy(&head)
        .split(' ')
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    let _ = requests.send(head);
    let host = target.split(':').next().unwrap_or_default();
    let (response, then) = match host {
        "refuse" => (
            format!(
                "HTTP/1.1 502 Bad Gateway\r\nConnection: close\r\nContent-Type: text/plain; charset=utf-8\r\n\r\n{REFUSED}"
            ),
            Then::Close,
        ),
        "no-agent" => (
            "HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n\r\ncurrently no tunnels available: No agent available".to_owned(),
            Then::Close,
        ),
        "chatty" => ("HTTP/1.1 200 Connection Established\r\n\r\nsurprise".to_owned(), Then::Linger),
        "lingering-405" => (
            "HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 5\r\n\r\nnope\n".to_owned(),
            Then::Linger,
        ),
        _ => ("HTTP/1.1 200 Connection Established\r\n\r\n".to_owned(), Then::Echo),
    };
    if io.write_all(response.as_bytes()).await.is_err() {
        return;
    }
    match then {
        Then::Close => {
            let _ = io.shutdown().await;
        }
        Then::Linger => {
            let _ = io.flush().await;
            let mut sink = Vec::new();
            let _ = io.read_to_end(&mut sink).await;
        }
        Then::Echo => {
            let (mut reader, mut writer) = tokio::io::split(io);
            let _ = tokio::io::copy(&mut reader, &mut writer).await;
            let _ = writer.shutdown().await;
        }
    }
}

/// What the stand-in does after its response.
enum Then {
    Close,
    /// Keep the connection open until the client leaves.
    Linger,
    Echo,
}
