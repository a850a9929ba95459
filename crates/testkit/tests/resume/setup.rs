//! What the resume tests share: a server, an agent reaching it through a cutting relay, an
//! echo target and a client, plus the checks they make.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use tether_client::{GrpcClient, Transport};
use tether_testkit::cut_relay::CuttingRelay;
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Mutex;

pub(crate) static SERIAL: Mutex<()> = Mutex::const_new(());

/// Bounds that only catch a hang.
pub(crate) const STEP: Duration = Duration::from_secs(30);
pub(crate) const GIB: u64 = 1 << 30;

/// Polls `check` every 20 ms until it holds or `STEP` passes.
pub(crate) async fn eventually<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    eventually_by(what, Instant::now() + STEP, check).await;
}

/// Polls `check` every 20 ms until it holds or `deadline` passes: for progress that moves
/// with the machine's speed, such as a transfer, bounded by the whole transfer's deadline.
pub(crate) async fn eventually_by<F, Fut>(what: &str, deadline: Instant, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A server, an agent that reaches it through a cutting relay, an echo target and a gRPC
/// client on the server's Unix socket (kube-apiserver's usual frontend).
pub(crate) struct Setup {
    pub(crate) pki: Pki,
    pub(crate) server: TestServer,
    pub(crate) relay: CuttingRelay,
    pub(crate) agent: TestAgent,
    pub(crate) echo: EchoServer,
    pub(crate) client: GrpcClient,
}

impl Setup {
    pub(crate) async fn start(window: Duration) -> Self {
        Self::start_with(
            ServerOptions {
                resume_window: window,
                ..Default::default()
            },
            AgentOptions {
                resume_window: window,
                ..Default::default()
            },
        )
        .await
    }

    pub(crate) async fn start_with(server: ServerOptions, agent: AgentOptions) -> Self {
        tether_testkit::init_logging();
        let agent = AgentOptions {
            agent_id: AGENT_ID.into(),
            ..agent
        };
        let pki = Pki::generate().unwrap();
        let server = TestServer::start(&pki, server).await.unwrap();
        let relay = CuttingRelay::start(server.agent_addr).await.unwrap();
        let agent = TestAgent::start(&pki, relay.addr, agent).await.unwrap();
        server.wait_ready().await.unwrap();
        agent.wait_ready().await.unwrap();
        let echo = EchoServer::start().await.unwrap();
        let client = GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
            .await
            .unwrap();
        Self {
            pki,
            server,
            relay,
            agent,
            echo,
            client,
        }
    }

    pub(crate) async fn agent_metric(&self, sample: &str) -> f64 {
        metric_value(&self.agent.metrics().await.unwrap(), sample).unwrap_or(0.0)
    }

    pub(crate) async fn server_metric(&self, sample: &str) -> f64 {
        metric_value(&self.server.metrics().await.unwrap(), sample).unwrap_or(0.0)
    }

    /// A tunnel to the echo target, proven by one echo (`seed` picks the bytes).
    pub(crate) async fn echoed_tunnel(&self, seed: u64) -> tether_client::TunnelStream {
        let tunnel = self.client.dial(&self.echo.addr.to_string()).await.unwrap();
        echo_once(tunnel, seed).await
    }

    /// Cuts the agent's stream and keeps the agent from reconnecting, until the server
    /// holds its one connection suspended.
    pub(crate) async fn cut_and_hold_off(&self) {
        self.relay.set_refusing(true);
        self.relay.cut().await;
        eventually("the server suspended the agent's stream", || async {
            self.server_metric("tether_server_suspended_connections")
                .await
                == 1.0
        })
        .await;
    }

    /// Waits until the agent's stream is live again after a cut (no resume in progress).
    pub(crate) async fn cut_settled(&self) {
        self.wait_ready_backends(1, "the agent's stream is live again")
            .await;
    }

    /// Waits until the server counts `n` live agent streams.
    pub(crate) async fn wait_ready_backends(&self, n: u32, what: &str) {
        eventually(what, || async {
            self.server_metric("konnectivity_network_proxy_server_ready_backend_connections")
                .await
                == f64::from(n)
        })
        .await;
    }

    /// Cuts the agent's stream and waits until both ends resumed it.
    pub(crate) async fn cut_and_wait(&self) {
        let before = self.agent_metric(RESUMES_AGENT).await;
        self.relay.cut().await;
        eventually("both ends resumed the stream", || async {
            self.agent_metric(RESUMES_AGENT).await > before
                && self.server_metric(RESUMES_SERVER).await > before
        })
        .await;
    }
}

pub(crate) const AGENT_ID: &str = "resume-agent";
pub(crate) const RESUMES_AGENT: &str = "tether_agent_resumes_total";
pub(crate) const RESUMES_SERVER: &str = "tether_server_resumes_total";

/// Whether a process's metrics count no suspended stream that ended without resuming.
pub(crate) fn no_resume_failure(metrics: &str) -> bool {
    !metrics.contains("resume_failures_total{")
}

/// Reads `tunnel` until it ends, which must be with an error, not a clean close.
pub(crate) async fn ends_with_error<S: AsyncRead + Unpin>(tunnel: &mut S) {
    let mut buf = [0u8; 1];
    let read = tokio::time::timeout(STEP, tunnel.read(&mut buf))
        .await
        .expect("the connection ends");
    assert!(
        read.is_err(),
        "the connection ended without an error: {read:?}"
    );
}

/// The byte at `offset` of the stream: any loss, duplicate or reordering shows.
pub(crate) fn byte_at(offset: u64) -> u8 {
    let x = offset.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (offset >> 20) as u8
}

pub(crate) fn fill(buf: &mut [u8], offset: u64) {
    for (i, b) in buf.iter_mut().enumerate() {
        *b = byte_at(offset + i as u64);
    }
}

/// Sends `total` bytes of the pattern and checks the echo, while `progress` counts what
/// came back.
pub(crate) async fn echo_pattern<S>(stream: S, total: u64, progress: Arc<AtomicU64>)
where
    S: AsyncRead + AsyncWrite + Send + 'static,
{
    let (mut rd, mut wr) = tokio::io::split(stream);
    let writer = tokio::spawn(async move {
        let mut buf = vec![0u8; 256 * 1024];
        let mut sent = 0;
        while sent < total {
            let n = (total - sent).min(buf.len() as u64) as usize;
            fill(&mut buf[..n], sent);
            wr.write_all(&buf[..n])
                .await
                .expect("write through the tunnel");
            sent += n as u64;
        }
        wr.flush().await.expect("flush through the tunnel");
        wr
    });
    let mut buf = vec![0u8; 256 * 1024];
    let mut expected = vec![0u8; 256 * 1024];
    let mut got = 0;
    while got < total {
        let n = rd.read(&mut buf).await.expect("read through the tunnel");
        assert!(n > 0, "the tunnel ended after {got} of {total} bytes");
        fill(&mut expected[..n], got);
        assert!(
            buf[..n] == expected[..n],
            "bytes {got}..{} differ from what was sent",
            got + n as u64
        );
        got += n as u64;
        progress.store(got, Ordering::Relaxed);
    }
    writer.await.expect("writer");
}

pub(crate) async fn echo_once<S: AsyncRead + AsyncWrite + Unpin>(mut t: S, seed: u64) -> S {
    let data = tether_testkit::targets::pattern(seed, 512);
    t.write_all(&data).await.unwrap();
    let mut got = vec![0u8; data.len()];
    tokio::time::timeout(STEP, t.read_exact(&mut got))
        .await
        .expect("echo in time")
        .unwrap();
    assert!(got == data);
    t
}

/// A bare agent stream on `channel` as `agent_id`, offering resumes and, with
/// `resume_from`, asking to continue a stream: the server's answer and the stream's halves,
/// or its refusal.
pub(crate) async fn bare_stream(
    channel: &tether_grpc::client::Channel,
    agent_id: &str,
    resume_from: Option<&str>,
) -> Result<
    (
        http::HeaderMap,
        tether_grpc::PacketSender,
        tether_grpc::PacketReceiver,
    ),
    tether_grpc::GrpcError,
> {
    use tether_proto::metadata;
    let mut request = vec![
        (metadata::AGENT_ID, agent_id.to_owned()),
        tether_server::FlowConfig::default().announce(),
        (metadata::TETHER_RESUME, "1".to_owned()),
    ];
    request.extend(resume_from.map(|r| (metadata::TETHER_RESUME_FROM, r.to_owned())));
    let (tx, mut rx) = channel
        .call(tether_proto::path::CONNECT, &request)
        .await
        .unwrap();
    let headers = tokio::time::timeout(STEP, rx.response_headers())
        .await
        .unwrap()
        .cloned()?;
    Ok((headers, tx, rx))
}
