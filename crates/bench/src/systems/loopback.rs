//! Starting processes on loopback: a free port to give one, a bare HTTP GET, and waiting until
//! it answers or listens. Shared by every system's module and by `running`, which reads the
//! server's metrics.

use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::procs::Proc;

/// A free TCP port on 127.0.0.1 (bound and released; good enough on a quiet loopback).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A minimal HTTP/1.0 GET on 127.0.0.1: (status, body).
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let work = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("no HTTP status")?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .context("HTTP GET timed out")?
}

/// Waits until `GET path` answers 200, failing early if `proc` dies.
pub async fn wait_http_ok(
    proc: &mut Proc,
    port: u16,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        proc.check_alive()?;
        if let Ok((200, _)) = http_get(port, path).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} not ready: GET 127.0.0.1:{port}{path} did not answer 200 within {timeout:?}; log tail:\n{}",
                proc.role,
                crate::procs::log_tail(&proc.log)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until 127.0.0.1:`port` accepts TCP connections, failing early if `proc` dies.
pub async fn wait_port(proc: &mut Proc, port: u16) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        proc.check_alive()?;
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{} did not listen on {port}", proc.role);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
