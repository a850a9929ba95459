//! One `GET` to an admin endpoint: HTTP/1.1, `Connection: close`, with deadlines and a cap.

use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Connecting, and then the whole exchange, must finish within this.
const TIMEOUT: Duration = Duration::from_secs(10);
/// A report larger than this is refused rather than buffered.
const MAX_RESPONSE: u64 = 64 << 20;

/// The body of `GET path` from `address`; an error for anything but `200`.
pub(crate) async fn get(address: &str, path: &str) -> anyhow::Result<Vec<u8>> {
    tokio::time::timeout(TIMEOUT, exchange(address, path))
        .await
        .with_context(|| format!("{address}: no answer within {TIMEOUT:?}"))?
}

async fn exchange(address: &str, path: &str) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(address)
        .await
        .with_context(|| format!("connecting to the admin endpoint {address}"))?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    (&mut stream)
        .take(MAX_RESPONSE + 1)
        .read_to_end(&mut response)
        .await
        .with_context(|| format!("reading from {address}"))?;
    if response.len() as u64 > MAX_RESPONSE {
        bail!("{address}: response larger than {MAX_RESPONSE} bytes");
    }
    let (status, body) =
        split_response(&response).with_context(|| format!("{address}: not an HTTP response"))?;
    match status {
        200 => Ok(body.to_vec()),
        404 => bail!("{address}{path}: 404 (is this a tether server's or agent's admin port?)"),
        _ => bail!(
            "{address}{path}: status {status}: {}",
            String::from_utf8_lossy(body).trim()
        ),
    }
}

/// The status code and body of a `Connection: close` response.
fn split_response(response: &[u8]) -> Option<(u16, &[u8])> {
    let end = response.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&response[..end]).ok()?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, &response[end + 4..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_status_and_body() {
        let (status, body) =
            split_response(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}").unwrap();
        assert_eq!((status, body), (200, &b"{}"[..]));
        assert!(split_response(b"garbage").is_none());
    }
}
