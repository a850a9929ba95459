//! Dialing a destination on the server's behalf: name resolution, connect, deadline, and
//! errors worded like Go's (the server maps them to HTTP statuses by their text).

use std::time::Duration;

use tokio::net::TcpStream;

use crate::metrics::DialFailure;

/// Dials a TCP destination, trying each resolved address before the deadline. Errors are
/// worded like Go's, because the server maps them to HTTP statuses by their text.
pub(crate) async fn dial(
    protocol: &str,
    address: &str,
    timeout: Duration,
) -> Result<TcpStream, (DialFailure, String)> {
    if protocol != "tcp" {
        return Err((
            DialFailure::Unknown,
            format!("dial {protocol}: unknown network {protocol}"),
        ));
    }
    let attempt = async {
        let addrs = tokio::net::lookup_host(address).await.map_err(|e| {
            let host = address.rsplit_once(':').map_or(address, |(h, _)| h);
            (
                DialFailure::Unknown,
                format!("dial tcp: lookup {host}: {}", go_error_text(&e)),
            )
        })?;
        let mut last = None;
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(stream) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(stream);
                }
                Err(e) => last = Some(format!("dial tcp {addr}: connect: {}", go_error_text(&e))),
            }
        }
        Err((
            DialFailure::Unknown,
            last.unwrap_or_else(|| format!("dial tcp: lookup {address}: no such host")),
        ))
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(result) => result,
        Err(_) => Err((
            DialFailure::Timeout,
            format!("dial tcp {address}: i/o timeout"),
        )),
    }
}

/// An io::Error as Go would print it: "connection refused", not "Connection refused (os error 111)".
fn go_error_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    let text = text.split(" (os error").next().unwrap_or(&text);
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dial_errors_read_like_go() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        drop(listener);
        let (_, error) = dial("tcp", &addr.to_string(), Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(
            error,
            format!("dial tcp {addr}: connect: connection refused")
        );
        let (_, error) = dial("udp", "127.0.0.1:1", Duration::from_secs(5))
            .await
            .unwrap_err();
        assert_eq!(error, "dial udp: unknown network udp");
    }
}
