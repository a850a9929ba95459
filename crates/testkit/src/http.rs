//! Minimal HTTP/1.1 GET against health and admin endpoints.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Status and body of `GET path`, with a deadline.
pub async fn get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    tokio::time::timeout(Duration::from_secs(10), async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let text = String::from_utf8_lossy(&response).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no status line in {text:?}"))?;
        let body = text
            .split_once("\r\n\r\n")
            .map_or("", |(_, b)| b)
            .to_owned();
        Ok((status, body))
    })
    .await?
}

/// Status and raw body of `GET path` (binary bodies such as profiles), with a deadline.
pub async fn get_bytes(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
    tokio::time::timeout(Duration::from_secs(60), async {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        let end = response
            .windows(4)
            .position(|w| w == b"\r\n\r\n")
            .ok_or_else(|| anyhow::anyhow!("no response head"))?;
        let head = String::from_utf8_lossy(&response[..end]);
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("no status line in {head:?}"))?;
        Ok((status, response[end + 4..].to_vec()))
    })
    .await?
}

/// Polls `path` until it answers 200, or fails after `deadline`.
pub async fn wait_for_200(addr: SocketAddr, path: &str, deadline: Duration) -> anyhow::Result<()> {
    let until = tokio::time::Instant::now() + deadline;
    loop {
        if let Ok((200, _)) = get(addr, path).await {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < until,
            "{addr}{path} not 200 within {deadline:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The value of one sample in Prometheus text, e.g. `name{label="x"}`; `None` if absent.
pub fn metric_value(text: &str, sample: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            l.strip_prefix(sample)
                .and_then(|rest| rest.strip_prefix(' '))
        })
        .and_then(|v| v.trim().parse().ok())
}
