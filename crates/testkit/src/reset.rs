//! Checking that a TCP client is reset, not closed cleanly. tether resets a client whose bytes
//! it could not deliver, so that the client cannot take the close for the far end's own.

use std::io::ErrorKind;
use std::time::Duration;

use tokio::io::AsyncReadExt as _;
use tokio::net::{TcpStream, ToSocketAddrs};

/// How long a reset may take to arrive.
const WITHIN: Duration = Duration::from_secs(10);

/// Reads from `stream` (having sent nothing: the close of a socket with unread bytes is a reset
/// anyway) and panics unless the connection is reset within 10 s.
pub async fn assert_reset(mut stream: TcpStream, what: &str) {
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(WITHIN, stream.read(&mut buf))
        .await
        .unwrap_or_else(|_| panic!("{what} is not closed within 10 s"));
    assert!(
        matches!(&read, Err(e) if e.kind() == ErrorKind::ConnectionReset),
        "{what} got {read:?}, not a reset"
    );
}

/// Connects to `addr` and panics unless the new connection is reset within 10 s. A listener
/// that resets at once may do so before the connect has seen its handshake complete, and then
/// the connect itself reports the reset: that counts too.
pub async fn assert_connect_reset(addr: impl ToSocketAddrs, what: &str) {
    match tokio::time::timeout(WITHIN, TcpStream::connect(addr)).await {
        Err(_) => panic!("{what}: the connect did not finish within 10 s"),
        Ok(Ok(stream)) => assert_reset(stream, what).await,
        Ok(Err(e)) => assert_eq!(e.kind(), ErrorKind::ConnectionReset, "{what}: {e}"),
    }
}
