//! `GrpcClient` and `TunnelStream` against the stand-in gRPC frontend.

use std::io::ErrorKind;
use std::time::Duration;

use tether_client::{ClientError, DialError, GrpcClient, Transport, TunnelStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fake_grpc::{DEAF_FOR, Event, FLOOD_BYTES, FakeGrpcProxy, REFUSED};
use crate::support::{Listener, pattern, within};

async fn connected(dir: &tempfile::TempDir) -> (FakeGrpcProxy, GrpcClient) {
    let proxy = FakeGrpcProxy::unix(dir);
    let client = GrpcClient::connect(&proxy.transport)
        .await
        .expect("connect");
    (proxy, client)
}

/// Writes `data` and reads the echo concurrently, then closes and expects EOF.
async fn echo_and_close(stream: TunnelStream, data: &[u8]) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let write = async {
        writer.write_all(data).await.expect("write");
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
    assert!(
        echoed == data,
        "echo differs: {} bytes back for {}",
        echoed.len(),
        data.len()
    );
}

#[tokio::test]
async fn echoes_megabytes_exactly_over_unix_and_tls() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        for (listener, transport) in [Listener::unix(&dir), Listener::tls(&dir, b"h2").await] {
            let mut proxy = FakeGrpcProxy::start(listener, transport);
            let client = GrpcClient::connect(&proxy.transport)
                .await
                .expect("connect");
            let stream = client.dial("echo.example:443").await.expect("dial");
            assert_eq!(stream.connect_id().0, 7);
            echo_and_close(stream, &pattern(1, 4 << 20)).await;
            match proxy.events.recv().await {
                Some(Event::Dial { address, random }) => {
                    assert_eq!(address, "echo.example:443");
                    assert!(random.0 >= 0, "dial IDs are non-negative");
                }
                other => panic!("expected the dial, got {other:?}"),
            }
            assert_eq!(proxy.next_non_dial_event().await, Some(Event::CloseRequest));
        }
    })
    .await;
}

#[tokio::test]
async fn dial_answers_become_typed_errors() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_proxy, client) = connected(&dir).await;
        match client.dial("refuse").await {
            Err(DialError::Endpoint { message }) => assert_eq!(message, REFUSED),
            other => panic!("expected an endpoint error, got {other:?}"),
        }
        assert!(matches!(
            client.dial("no-agent").await,
            Err(DialError::NoAgent)
        ));
        assert!(matches!(
            client.dial("dial-closed").await,
            Err(DialError::DialClosed)
        ));
        // A failed dial costs its call only.
        let stream = client.dial("echo").await.expect("dial after failures");
        echo_and_close(stream, b"still fine").await;
    })
    .await;
}

#[tokio::test]
async fn abandoned_dials_are_cancelled_with_dial_cls() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (mut proxy, client) = connected(&dir).await;
        let timed_out = client
            .dial_with_timeout("silent", Duration::from_millis(200))
            .await;
        assert!(
            matches!(timed_out, Err(DialError::Timeout)),
            "{timed_out:?}"
        );
        let Some(Event::Dial { random, .. }) = proxy.events.recv().await else {
            panic!("expected the dial");
        };
        assert_eq!(proxy.events.recv().await, Some(Event::DialClose(random)));

        // Dropping the dial future is giving up too.
        let dropped = tokio::time::timeout(Duration::from_millis(200), client.dial("silent")).await;
        assert!(dropped.is_err());
        let Some(Event::Dial { random, .. }) = proxy.events.recv().await else {
            panic!("expected the dial");
        };
        assert_eq!(proxy.events.recv().await, Some(Event::DialClose(random)));
    })
    .await;
}

#[tokio::test]
async fn normal_close_by_the_remote_end_reads_as_eof() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_proxy, client) = connected(&dir).await;
        let mut stream = client.dial("hello-bye").await.expect("dial");
        let mut received = Vec::new();
        stream
            .read_to_end(&mut received)
            .await
            .expect("EOF, not an error");
        assert_eq!(received, b"hello");
        let error = stream
            .write_all(b"late")
            .await
            .expect_err("writing after the close");
        assert_eq!(error.kind(), ErrorKind::BrokenPipe);
    })
    .await;
}

async fn read_error(client: &GrpcClient, address: &str) -> std::io::Error {
    let mut stream = client.dial(address).await.expect("dial");
    // Some stand-ins end the tunnel without waiting for data; then the write fails too.
    let _ = stream.write_all(b"ping").await;
    let mut sink = Vec::new();
    stream
        .read_to_end(&mut sink)
        .await
        .expect_err("an abnormal close must not read as EOF")
}

#[tokio::test]
async fn abnormal_closes_read_as_errors() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_proxy, client) = connected(&dir).await;

        let error = read_error(&client, "fail-after-data").await;
        assert_eq!(error.kind(), ErrorKind::ConnectionReset);
        assert!(error.to_string().contains("agent lost"), "{error}");

        let error = read_error(&client, "unavailable").await;
        assert_eq!(error.kind(), ErrorKind::ConnectionReset);
        assert!(
            error.to_string().contains("server shutting down"),
            "{error}"
        );

        let error = read_error(&client, "reset").await;
        assert_eq!(error.kind(), ErrorKind::ConnectionReset, "{error}");

        let error = read_error(&client, "vanish").await;
        assert_eq!(error.kind(), ErrorKind::ConnectionAborted, "{error}");
        assert!(error.to_string().contains("without CLOSE_RSP"), "{error}");

        assert!(
            !client.is_closed(),
            "stream failures leave the connection up"
        );
    })
    .await;
}

#[tokio::test]
async fn a_dropped_connection_fails_tunnels_and_the_client() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_proxy, client) = connected(&dir).await;
        let error = read_error(&client, "kill-connection").await;
        assert!(
            matches!(
                error.kind(),
                ErrorKind::ConnectionAborted | ErrorKind::ConnectionReset
            ),
            "{error:?}"
        );
        while !client.is_closed() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let dial = client.dial("echo").await;
        assert!(
            matches!(dial, Err(DialError::Proxy(ClientError::Grpc(_)))),
            "{dial:?}"
        );
    })
    .await;
}

#[tokio::test]
async fn dropping_a_stream_closes_the_tunnel() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (mut proxy, client) = connected(&dir).await;
        let mut stream = client.dial("echo").await.expect("dial");
        stream.write_all(b"abc").await.expect("write");
        let mut echoed = [0; 3];
        stream.read_exact(&mut echoed).await.expect("read");
        drop(stream);
        assert_eq!(proxy.next_non_dial_event().await, Some(Event::CloseRequest));
    })
    .await;
}

#[tokio::test]
async fn a_hundred_concurrent_dials_share_one_connection() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_proxy, client) = connected(&dir).await;
        let tunnels: Vec<_> = (0..100u64)
            .map(|i| {
                let client = client.clone();
                tokio::spawn(async move {
                    let stream = client.dial(&format!("echo-{i}:80")).await.expect("dial");
                    echo_and_close(stream, &pattern(i, 64 * 1024)).await;
                })
            })
            .collect();
        for tunnel in tunnels {
            tunnel.await.expect("tunnel task");
        }
    })
    .await;
}

#[tokio::test]
async fn unreachable_or_untrusted_servers_are_client_errors() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let missing = Transport::Unix(dir.path().join("nobody-listens"));
        let error = GrpcClient::connect(&missing).await.expect_err("no socket");
        assert!(matches!(error, ClientError::Connect { .. }), "{error:?}");

        let (listener, transport) = Listener::tls(&dir, b"h2").await;
        let _proxy = FakeGrpcProxy::start(listener, transport.clone());
        let Transport::Tls { addr, tls, .. } = transport else {
            unreachable!("a TLS listener yields a TLS transport")
        };
        let wrong_name = Transport::Tls {
            addr,
            server_name: "not-the-proxy.example".into(),
            tls,
        };
        let error = GrpcClient::connect(&wrong_name)
            .await
            .expect_err("certificate mismatch");
        assert!(matches!(error, ClientError::Tls { .. }), "{error:?}");
    })
    .await;
}

#[tokio::test]
async fn a_reader_that_stalls_stalls_the_sender() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (mut proxy, client) = connected(&dir).await;
        let mut stream = client.dial("flood").await.expect("dial");
        // Not reading: the flood must stall after what the stream window, the inbound
        // channel and the decoder hold (about 3 MiB), not run on into memory.
        let stalled_at = match proxy.next_non_dial_event().await {
            Some(Event::Stalled(bytes)) => bytes,
            other => panic!("expected a stall, got {other:?}"),
        };
        assert!(
            stalled_at < 6 << 20,
            "{stalled_at} bytes buffered for a reader that stalled"
        );
        let mut received = Vec::new();
        stream
            .read_to_end(&mut received)
            .await
            .expect("EOF after the flood");
        assert_eq!(received.len(), FLOOD_BYTES);
    })
    .await;
}

#[tokio::test]
async fn no_task_outlives_its_call() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (mut proxy, client) = connected(&dir).await;
        let metrics = tokio::runtime::Handle::current().metrics();
        // The client's connection driver, the stand-in's accept loop and its connection.
        proxy
            .accepted
            .recv()
            .await
            .expect("the stand-in accepted the connection");
        let idle = metrics.num_alive_tasks();

        let stream = client.dial("echo").await.expect("dial");
        echo_and_close(stream, b"shut down").await;
        let mut stream = client.dial("echo").await.expect("dial");
        stream.write_all(b"dropped").await.expect("write");
        drop(stream);
        let mut stream = client.dial("hello-bye").await.expect("dial");
        stream.read_to_end(&mut Vec::new()).await.expect("EOF");
        drop(stream);
        let _ = read_error(&client, "fail-after-data").await;
        assert!(client.dial("refuse").await.is_err());
        let abandoned = client
            .dial_with_timeout("silent", Duration::from_millis(100))
            .await;
        assert!(matches!(abandoned, Err(DialError::Timeout)));
        while !matches!(proxy.events.recv().await, Some(Event::DialClose(_))) {}

        while metrics.num_alive_tasks() > idle {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(metrics.num_alive_tasks(), idle);
    })
    .await;
}

#[tokio::test]
async fn a_proxy_that_stops_reading_blocks_writes_and_cannot_keep_the_task_alive() {
    within(async {
        let dir = tempfile::tempdir().unwrap();
        let (_proxy, client) = connected(&dir).await;
        let metrics = tokio::runtime::Handle::current().metrics();
        let mut stream = client.dial("deaf").await.expect("dial");
        // The stand-in's call and this tunnel's relay are alive now.
        let with_tunnel = metrics.num_alive_tasks();

        let write = stream.write_all(&[0; 8 << 20]);
        let blocked = tokio::time::timeout(Duration::from_secs(1), write).await;
        assert!(
            blocked.is_err(),
            "8 MiB cannot fit in the windows and channels"
        );

        // Neither the rest of the data nor CLOSE_REQ can get out; the close deadline (10 s)
        // ends the relay anyway. The stand-in's call lives on, deaf.
        drop(stream);
        let started = tokio::time::Instant::now();
        while metrics.num_alive_tasks() >= with_tunnel {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(
            started.elapsed() < DEAF_FOR,
            "the relay outlived the close deadline"
        );
    })
    .await;
}
