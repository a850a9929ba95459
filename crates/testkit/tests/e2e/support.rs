//! Helpers shared by the end-to-end tests.

use std::path::{Path, PathBuf};

use tether_client::{DialError, GrpcClient, Transport as ClientTransport};
use tether_server::Mode;
use tether_testkit::http::metric_value;
use tether_testkit::{Pki, TestAgent};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::UnixStream;

use crate::STEP;

/// Sends `CONNECT target` as kube-apiserver does and reads the response head byte by byte
/// (so nothing after it is consumed).
pub(crate) async fn http_connect_uds(uds: &Path, target: &str) -> (UnixStream, String) {
    let stream = UnixStream::connect(uds)
        .await
        .expect("connect to frontend socket");
    http_connect_on(stream, target).await
}

/// The same over a stream already connected to the frontend (TLS, shaped sockets).
pub(crate) async fn http_connect_on<S>(mut stream: S, target: &str) -> (S, String)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .await
        .expect("write CONNECT");
    stream.flush().await.expect("write CONNECT");
    let head = read_head(&mut stream).await;
    (stream, head)
}

pub(crate) async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match tokio::time::timeout(STEP, stream.read(&mut byte))
            .await
            .expect("response head in time")
        {
            Ok(0) | Err(_) => break,
            Ok(_) => head.push(byte[0]),
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Writes `len` pattern bytes and reads them back through an echo target, concurrently.
pub(crate) async fn echo_exact<S>(stream: S, seed: u64, len: usize) -> S
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let data = tether_testkit::targets::pattern(seed, len);
    let (mut rd, mut wr) = tokio::io::split(stream);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        wr.write_all(&sent).await.expect("write through tunnel");
        // A TLS stream can accept the last bytes into its buffer while its socket is full:
        // only a flush makes sure they leave.
        wr.flush().await.expect("flush through tunnel");
        wr
    });
    let mut got = vec![0u8; len];
    tokio::time::timeout(STEP * 4, rd.read_exact(&mut got))
        .await
        .expect("echo in time")
        .expect("read through tunnel");
    assert!(
        got == data,
        "echoed bytes differ (seed {seed}, {len} bytes)"
    );
    let wr = writer.await.expect("writer task");
    rd.unsplit(wr)
}

/// How many destinations this agent dialed successfully.
pub(crate) async fn agent_dials(agent: &TestAgent) -> f64 {
    let text = agent.metrics().await.expect("agent metrics");
    metric_value(
        &text,
        "konnectivity_network_proxy_agent_dial_duration_seconds_count",
    )
    .unwrap_or(0.0)
}

/// Polls `check` every 20 ms until it holds or `STEP` passes.
pub(crate) async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + STEP;
    while !check().await {
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// Writes extra client certificates for `names`; returns their (cert, key) paths.
pub(crate) fn client_certs(names: &[&str]) -> (Pki, Vec<(PathBuf, PathBuf)>) {
    Pki::generate_with_client_files(names).unwrap()
}

/// Dials through whichever frontend the server has.
pub(crate) async fn dial(
    mode: Mode,
    transport: &ClientTransport,
    target: &str,
) -> Result<Box<dyn Stream>, DialError> {
    Ok(match mode {
        Mode::Grpc => Box::new(GrpcClient::connect(transport).await?.dial(target).await?),
        Mode::HttpConnect => Box::new(tether_client::dial_http_connect(transport, target).await?),
    })
}

pub(crate) trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}
