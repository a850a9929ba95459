//! `dial_http_connect` against the stand-in HTTP CONNECT frontend.

use std::time::Duration;

use tether_client::{ClientError, DialError, dial_http_connect};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fake_http::{FakeHttpProxy, REFUSED};
use crate::support::{Listener, pattern, within};

fn unix_proxy(dir: &tempfile::TempDir) -> FakeHttpProxy {
    let (listener, transport) = Listener::unix(dir);
    FakeHttpProxy::start(listener, transport)
}

#[tokio::test]
async fn established_tunnels_carry_bytes_over_unix_and_tls() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        // The TLS stand-in accepts only http/1.1, while the client config offers h2.
        for (listener, transport) in [Listener::unix(&dir), Listener::tls(&dir, b"http/1.1").await]
        {
            let mut proxy = FakeHttpProxy::start(listener, transport);
            let socket = dial_http_connect(&proxy.transport, "echo.example:443")
                .await
                .expect("dial");
            assert_eq!(
                proxy.requests.recv().await.expect("request"),
                b"CONNECT echo.example:443 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            );
            let data = pattern(2, 1 << 20);
            let (mut reader, mut writer) = tokio::io::split(socket);
            let write = async {
                writer.write_all(&data).await.expect("write");
                writer.shutdown().await.expect("shutdown");
            };
            let read = async {
                let mut echoed = Vec::new();
                reader
                    .read_to_end(&mut echoed)
                    .await
                    .expect("read until EOF");
                echoed
            };
            let ((), echoed) = tokio::join!(write, read);
            assert!(echoed == data, "echo differs: {} bytes", echoed.len());
        }
    })
    .await;
}

#[tokio::test]
async fn error_statuses_become_typed_errors() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let proxy = unix_proxy(&dir);
        match dial_http_connect(&proxy.transport, "refuse:1").await {
            Err(DialError::Rejected { status, body }) => {
                assert_eq!(status, 502);
                assert_eq!(body, REFUSED);
            }
            other => panic!("expected a 502 rejection, got {other:?}"),
        }
        let no_agent = dial_http_connect(&proxy.transport, "no-agent:1").await;
        assert!(matches!(no_agent, Err(DialError::NoAgent)), "{no_agent:?}");
    })
    .await;
}

#[tokio::test]
async fn a_body_with_content_length_is_read_without_waiting_for_close() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let proxy = unix_proxy(&dir);
        let dial = dial_http_connect(&proxy.transport, "lingering-405:1");
        let rejected = tokio::time::timeout(Duration::from_secs(5), dial).await;
        match rejected.expect("the body is complete; no need to wait for EOF") {
            Err(DialError::Rejected { status, body }) => {
                assert_eq!((status, body.as_str()), (405, "nope\n"))
            }
            other => panic!("expected a 405 rejection, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn bytes_after_the_200_are_a_protocol_error() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let proxy = unix_proxy(&dir);
        match dial_http_connect(&proxy.transport, "chatty:1").await {
            Err(DialError::Proxy(ClientError::Protocol(message))) => {
                assert!(message.contains("unexpected 8 bytes"), "{message}");
            }
            other => panic!("expected a protocol error, got {other:?}"),
        }
    })
    .await;
}

#[tokio::test]
async fn addresses_that_would_break_the_request_are_refused() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let mut proxy = unix_proxy(&dir);
        for address in ["", "a b:1", "x:1\r\nX-Injected: 1"] {
            let dial = dial_http_connect(&proxy.transport, address).await;
            assert!(
                matches!(dial, Err(DialError::InvalidAddress(_))),
                "{dial:?}"
            );
        }
        assert!(proxy.requests.try_recv().is_err(), "nothing was sent");
    })
    .await;
}
