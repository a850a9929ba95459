//! Dead agents fail fast and cuts are still survived, with the default flags (no
//! `--resume-window`, `--dead-agent-timeout` or ping flag): a `kill -9` of the agent and the
//! loss of its node end its tunnels and pending dials with an error within 5 s on both
//! frontends; a short partition and a middlebox reset lose nothing.
//!
//! The node-loss and partition tests run in a network namespace of their own (the test's
//! thread and every process it starts), where nftables drops the agent link's packets: no
//! packet comes back, as when a node is gone, and nothing outside the namespace is touched.

use std::process::Command;
use std::time::Duration;
use tokio::time::Instant;

use tether_client::{DialError, GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::cut_relay::CuttingRelay;
use tether_testkit::process::{Frontend, Process, ServerProcess, free_port, spawn_server};
use tether_testkit::targets::{Blackhole, EchoServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{STEP, bin, metric, tls_transport, until};

/// What the issue asks: the client hears of a dead agent within this.
const FAIL_FAST: Duration = Duration::from_secs(5);
const PENDING_DIALS: &str = "konnectivity_network_proxy_server_pending_backend_dials";
const ESTABLISHED: &str = "konnectivity_network_proxy_server_established_connections";
const RESUMES: &str = "tether_server_resumes_total";

/// `tether agent` with its default flags (the testkit's spawn_agent shortens the reconnect
/// interval), connecting to `server_port` on 127.0.0.1.
async fn spawn_default_agent(pki: &Pki, server_port: u16) -> Process {
    let f = &pki.files;
    let health = free_port();
    let args = vec![
        "agent".to_owned(),
        "--proxy-server-host=127.0.0.1".into(),
        format!("--proxy-server-port={server_port}"),
        format!("--ca-cert={}", f.ca_cert.display()),
        format!("--agent-cert={}", f.agent_cert.display()),
        format!("--agent-key={}", f.agent_key.display()),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={health}"),
        format!("--admin-server-port={}", free_port()),
    ];
    let agent = Process::spawn(bin(), args, ([127, 0, 0, 1], health).into())
        .await
        .unwrap();
    tether_testkit::http::wait_for_200(agent.health, "/readyz", STEP)
        .await
        .expect("the agent connects");
    agent
}

/// A tunnel through either frontend.
trait Tunnel: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Tunnel for T {}
type TunnelStream = Box<dyn Tunnel>;

/// One way into a server's frontend: the two the issue names.
enum Client {
    Grpc(GrpcClient),
    HttpConnect(Transport),
}

impl Client {
    async fn new(pki: &Pki, server: &ServerProcess, frontend: &Frontend) -> Self {
        match frontend {
            Frontend::GrpcUds(path) => Self::Grpc(
                GrpcClient::connect(&Transport::Unix(path.clone()))
                    .await
                    .unwrap(),
            ),
            Frontend::HttpConnectTls => Self::HttpConnect(tls_transport(pki, server)),
        }
    }

    async fn dial(&self, target: &str) -> Result<TunnelStream, DialError> {
        match self {
            Self::Grpc(client) => Ok(Box::new(client.dial(target).await?)),
            Self::HttpConnect(transport) => Ok(Box::new(
                tether_client::dial_http_connect(transport, target).await?,
            )),
        }
    }
}

/// A server (default flags but the frontend), one agent (default flags), an echoing tunnel
/// and a dial the agent is still making (to a destination that never answers).
struct Scene {
    pki: Pki,
    server: ServerProcess,
    agent: Process,
    tunnel: TunnelStream,
    pending: tokio::task::JoinHandle<Result<TunnelStream, DialError>>,
    _echo: EchoServer,
    _blackhole: Blackhole,
}

impl Scene {
    async fn start(frontend: Frontend) -> Self {
        let pki = Pki::generate().unwrap();
        let frontend = match frontend {
            Frontend::GrpcUds(_) => Frontend::GrpcUds(pki.dir().join("frontend.sock")),
            other => other,
        };
        let server = spawn_server(bin(), &pki, frontend.clone(), &[])
            .await
            .unwrap();
        let agent = spawn_default_agent(&pki, server.agent_addr.port()).await;
        server.process.wait_ready().await.unwrap();
        let echo = EchoServer::start().await.unwrap();
        let client = Client::new(&pki, &server, &frontend).await;
        let mut tunnel = client.dial(&echo.addr.to_string()).await.unwrap();
        echo_round(&mut tunnel, b"before").await;
        let blackhole = Blackhole::start().await.unwrap();
        let target = blackhole.addr.to_string();
        let pending = tokio::spawn(async move { client.dial(&target).await });
        until("the dial is pending", || async {
            metric(&server.process, PENDING_DIALS).await == Some(1.0)
        })
        .await;
        Self {
            pki,
            server,
            agent,
            tunnel,
            pending,
            _echo: echo,
            _blackhole: blackhole,
        }
    }

    /// Both the tunnel and the pending dial end with an error; returns how long each took
    /// from `since` and the dial's error.
    async fn both_fail(self, since: Instant) -> (Duration, Duration, String) {
        let Self {
            mut tunnel,
            pending,
            ..
        } = self;
        let tunnel_error = tokio::spawn(async move {
            let mut buf = [0u8; 1024];
            let outcome = loop {
                match tunnel.read(&mut buf).await {
                    Ok(0) => break Ok(()),
                    Ok(_) => {}
                    Err(e) => break Err(e),
                }
            };
            (since.elapsed(), outcome)
        });
        let (dial_after, dial) = tokio::time::timeout(STEP, async {
            let dial = pending.await.unwrap();
            (since.elapsed(), dial)
        })
        .await
        .expect("the pending dial ends");
        let (tunnel_after, tunnel) = tokio::time::timeout(STEP, tunnel_error)
            .await
            .expect("the tunnel ends")
            .unwrap();
        let error = tunnel.expect_err("a lost agent is an error, not a clean end of the tunnel");
        let dial_error = match dial {
            Ok(_) => panic!("the dial through a dead agent succeeded"),
            Err(e) => e.to_string(),
        };
        eprintln!(
            "tunnel failed after {tunnel_after:?} ({error}); the pending dial after {dial_after:?} ({dial_error})"
        );
        (tunnel_after, dial_after, dial_error)
    }
}

async fn echo_round(tunnel: &mut TunnelStream, data: &[u8]) {
    tunnel.write_all(data).await.unwrap();
    let mut back = vec![0u8; data.len()];
    tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
        .await
        .expect("the echo comes back")
        .unwrap();
    assert_eq!(back, data);
}

fn frontends() -> [Frontend; 2] {
    [
        Frontend::GrpcUds(std::path::PathBuf::new()),
        Frontend::HttpConnectTls,
    ]
}

#[tokio::test]
async fn a_killed_agent_fails_tunnels_and_pending_dials_within_5s_on_both_frontends() {
    for frontend in frontends() {
        let scene = Scene::start(frontend).await;
        scene.agent.signal("KILL").await.unwrap();
        let killed = Instant::now();
        let (tunnel, dial, error) = scene.both_fail(killed).await;
        assert!(
            tunnel < FAIL_FAST && dial < FAIL_FAST,
            "{tunnel:?}, {dial:?}"
        );
        assert!(
            error.contains("--resume-window"),
            "the dial's error says why: {error}"
        );
    }
}

/// Moves the test's thread, and every process it starts from now on, into a network
/// namespace of its own with `lo` up (see `destinations.rs`); nftables is then free to drop
/// packets there.
fn private_network() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .expect("unshare(CLONE_NEWNET) needs root (CAP_SYS_ADMIN), as CI has");
    run("ip", &["link", "set", "lo", "up"]);
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .status()
        .unwrap_or_else(|e| panic!("{program} runs: {e}"));
    assert!(status.success(), "{program} {args:?}: {status}");
}

/// Drops every packet to and from `port` (the server's agent port), both ways: the agent's
/// link carries nothing, not even TCP's acknowledgements or resets.
fn cut_link(port: u16) {
    run("nft", &["add", "table", "inet", "cut"]);
    run(
        "nft",
        &[
            "add",
            "chain",
            "inet",
            "cut",
            "out",
            "{ type filter hook output priority 0; }",
        ],
    );
    for direction in ["dport", "sport"] {
        run(
            "nft",
            &[
                "add",
                "rule",
                "inet",
                "cut",
                "out",
                "tcp",
                direction,
                &port.to_string(),
                "drop",
            ],
        );
    }
}

fn heal_link() {
    run("nft", &["delete", "table", "inet", "cut"]);
}

#[tokio::test]
async fn a_lost_node_fails_tunnels_and_pending_dials_within_5s_on_both_frontends() {
    private_network();
    for frontend in frontends() {
        let scene = Scene::start(frontend).await;
        // The node is gone: its agent runs no more and no packet comes back from it.
        scene.agent.signal("STOP").await.unwrap();
        cut_link(scene.server.agent_addr.port());
        let lost = Instant::now();
        let server_log_hint = scene.server.admin_addr;
        let (tunnel, dial, error) = scene.both_fail(lost).await;
        heal_link();
        assert!(
            tunnel < FAIL_FAST && dial < FAIL_FAST,
            "{tunnel:?}, {dial:?} (server admin {server_log_hint})"
        );
        assert!(
            error.contains("--dead-agent-timeout"),
            "the dial's error says why: {error}"
        );
    }
}

/// Shorter than `--dead-agent-timeout` (4 s) with room for TCP's retransmission backoff,
/// which resends the first segment only about 3 s after a cut (200, 400, 800, 1600 ms).
const SHORT_PARTITION: Duration = Duration::from_millis(1500);

#[tokio::test]
async fn a_short_partition_loses_nothing() {
    private_network();
    let mut scene = Scene::start(Frontend::HttpConnectTls).await;
    scene.pending.abort();
    cut_link(scene.server.agent_addr.port());
    let written = tether_testkit::targets::pattern(7, 64 * 1024);
    scene.tunnel.write_all(&written).await.unwrap();
    tokio::time::sleep(SHORT_PARTITION).await;
    heal_link();
    let mut back = vec![0u8; written.len()];
    tokio::time::timeout(STEP, scene.tunnel.read_exact(&mut back))
        .await
        .expect("the bytes written during the partition come back")
        .unwrap();
    assert!(back == written, "byte-exact across the partition");
    echo_round(&mut scene.tunnel, b"after").await;
    assert_eq!(metric(&scene.server.process, ESTABLISHED).await, Some(1.0));
    drop(scene.pki);
}

#[tokio::test]
async fn a_middlebox_reset_is_resumed_without_loss() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    let relay = CuttingRelay::start(server.agent_addr).await.unwrap();
    let agent = spawn_default_agent(&pki, relay.addr.port()).await;
    server.process.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let client = Client::new(&pki, &server, &Frontend::HttpConnectTls).await;
    let mut tunnel = client.dial(&echo.addr.to_string()).await.unwrap();
    for round in 0..5u64 {
        let data = tether_testkit::targets::pattern(round, 16 * 1024);
        tunnel.write_all(&data).await.unwrap();
        relay.cut().await;
        let mut back = vec![0u8; data.len()];
        let cut = Instant::now();
        tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
            .await
            .expect("the echo comes back after the cut")
            .unwrap();
        assert!(back == data, "round {round}: byte-exact across the reset");
        eprintln!(
            "reset {round}: the echo came back {:?} after it",
            cut.elapsed()
        );
        until("the resume is counted", || async {
            metric(&server.process, RESUMES).await == Some(round as f64 + 1.0)
        })
        .await;
    }
    assert_eq!(
        metric(&agent, "tether_agent_resumes_total").await,
        Some(5.0)
    );
}
