//! Churn: thousands of dials ending in every way leave nothing behind.
//!
//! Its own test binary, so that nothing else in the process opens or closes descriptors
//! while it compares them with the baseline.

use std::sync::Arc;
use std::time::Duration;

use tether_client::{DialError, GrpcClient, Transport};
use tether_observe::metrics::{open_fds, resident_memory_bytes};
use tether_server::Mode;
use tether_testkit::http::metric_value;
use tether_testkit::targets::{EchoServer, HttpTarget, SourceServer, refused_addr};
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

/// Polls `check` every 20 ms until it holds or 30 s pass.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let until = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < until,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

const CONCURRENCY: usize = 64;

struct Targets {
    echo: EchoServer,
    source: SourceServer,
    http: HttpTarget,
    refused: String,
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

#[derive(Clone)]
enum Frontend {
    Grpc(GrpcClient),
    HttpConnect(Transport),
}

impl Frontend {
    async fn dial(&self, target: &str, timeout: Duration) -> Result<Box<dyn Stream>, DialError> {
        match self {
            Self::Grpc(client) => Ok(Box::new(client.dial_with_timeout(target, timeout).await?)),
            Self::HttpConnect(transport) => match tokio::time::timeout(
                timeout,
                tether_client::dial_http_connect(transport, target),
            )
            .await
            {
                Ok(socket) => Ok(Box::new(socket?)),
                Err(_) => Err(DialError::Timeout),
            },
        }
    }
}

/// One dial ending in the way `kind` picks. Panics on anything but the expected outcome.
async fn one(frontend: &Frontend, targets: &Targets, kind: u64) {
    let long = Duration::from_secs(30);
    match kind % 5 {
        // Success, a short exchange, a normal close.
        0 => {
            let mut s = frontend
                .dial(&targets.echo.addr.to_string(), long)
                .await
                .unwrap();
            s.write_all(&[7u8; 1024]).await.unwrap();
            let mut back = [0u8; 1024];
            s.read_exact(&mut back).await.unwrap();
            s.shutdown().await.unwrap();
        }
        // A refused destination.
        1 => match frontend.dial(&targets.refused, long).await {
            Err(DialError::Endpoint { .. } | DialError::Rejected { status: 502, .. }) => {}
            other => panic!("expected a refused dial, got {:?}", other.map(|_| ())),
        },
        // The client gives up mid-dial (at varying moments).
        2 => {
            let timeout = Duration::from_micros(50 + (kind * 7919) % 1500);
            match frontend.dial(&targets.echo.addr.to_string(), timeout).await {
                Ok(_) | Err(DialError::Timeout) => {}
                Err(e) => panic!("cancelled dial failed oddly: {e}"),
            }
        }
        // The client drops the connection in the middle of a download.
        3 => {
            let mut s = frontend
                .dial(&targets.source.addr.to_string(), long)
                .await
                .unwrap();
            s.write_u64(u64::MAX).await.unwrap();
            let mut buf = vec![0u8; 64 * 1024];
            s.read_exact(&mut buf).await.unwrap();
        }
        // The destination closes first.
        _ => {
            let mut s = frontend
                .dial(&targets.http.addr.to_string(), long)
                .await
                .unwrap();
            s.write_all(b"GET /bytes/3000 HTTP/1.1\r\nHost: t\r\n\r\n")
                .await
                .unwrap();
            let mut response = Vec::new();
            s.read_to_end(&mut response).await.unwrap();
            assert!(response.len() > 3000);
        }
    }
}

async fn churn(mode: Mode, dials: u64) {
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let targets = Arc::new(Targets {
        echo: EchoServer::start().await.unwrap(),
        source: SourceServer::start().await.unwrap(),
        http: HttpTarget::start().await.unwrap(),
        refused: refused_addr().to_string(),
    });
    let transport = Transport::Unix(server.uds.clone().unwrap());
    let frontend = match mode {
        Mode::Grpc => Frontend::Grpc(GrpcClient::connect(&transport).await.unwrap()),
        Mode::HttpConnect => Frontend::HttpConnect(transport),
    };
    // Warm up every path once, then take the baseline.
    for kind in 0..5 {
        one(&frontend, &targets, kind).await;
    }
    let settled = || async {
        let s = server.metrics().await.unwrap();
        let a = agent.metrics().await.unwrap();
        metric_value(
            &s,
            "konnectivity_network_proxy_server_pending_backend_dials",
        ) == Some(0.0)
            && metric_value(
                &s,
                "konnectivity_network_proxy_server_established_connections",
            ) == Some(0.0)
            && metric_value(
                &a,
                "konnectivity_network_proxy_agent_open_endpoint_connections",
            ) == Some(0.0)
    };
    eventually("warm-up settled", settled).await;
    let fds_before = open_fds().unwrap();
    let rss_before = resident_memory_bytes().unwrap();

    // Two halves: the first reaches the working set's peak (windows full of unread data on
    // the dropped downloads; freed memory stays with the allocator), the second must not
    // add to it. A leak grows with the number of dials; a bounded design does not.
    let mut rss_half = 0;
    let limit = Arc::new(Semaphore::new(CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    for kind in 0..dials {
        if kind == dials / 2 {
            rss_half = resident_memory_bytes().unwrap();
        }
        let permit = limit.clone().acquire_owned().await.unwrap();
        let (frontend, targets) = (frontend.clone(), targets.clone());
        tasks.spawn(async move {
            tokio::time::timeout(Duration::from_secs(60), one(&frontend, &targets, kind))
                .await
                .unwrap_or_else(|_| panic!("dial {kind} hung"));
            drop(permit);
        });
        while let Some(done) = tasks.try_join_next() {
            done.unwrap();
        }
    }
    while let Some(done) = tasks.join_next().await {
        done.unwrap();
    }

    eventually("zero pending and established connections", settled).await;
    eventually("file descriptors back to baseline", || async {
        open_fds().unwrap() <= fds_before
    })
    .await;
    let rss_after = resident_memory_bytes().unwrap();
    eprintln!(
        "{dials} dials ({mode:?}): fds {fds_before} -> {}, RSS {} -> {} (half way) -> {} MiB",
        open_fds().unwrap(),
        rss_before >> 20,
        rss_half >> 20,
        rss_after >> 20
    );
    assert!(
        rss_after < rss_half + (32 << 20),
        "RSS kept growing: {} MiB half way, {} MiB at the end",
        rss_half >> 20,
        rss_after >> 20
    );
}

/// 20,000 dials in all: one test, so the two frontends never overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_leaves_nothing_behind() {
    churn(Mode::Grpc, 12_000).await;
    churn(Mode::HttpConnect, 8_000).await;
}
