//! Node → API server through the agent's tunnel (tether's reverse dials), with the real
//! kube-apiserver and kubectl: `kubectl --server https://127.0.0.1:<agent's listener>` runs
//! `get`, a large `get` and a `watch` that stays open across several events, through
//! agent → server → API server. The agent reaches the server through a relay that the test
//! cuts mid-watch: the watch goes on over the resumed stream, on the same connection. A reverse dial to an address outside the server's
//! `--control-plane-endpoints` is refused, counted and audited; against upstream's
//! proxy-server the agent says the feature is off and forward traffic still works. Reverse
//! dials are off by default, `--control-plane-endpoints=kubeconfig` allows the kubeconfig's
//! API server, and one agent stream holds at most its cap of reverse connections.
//!
//! kwok is not wired into the Rust harness, so there is no node for `kubectl logs`/`exec`;
//! the long-lived watch and the multi-megabyte `get` stand in for a stream.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use tether_testkit::Pki;
use tether_testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use tether_testkit::cut_relay::CuttingRelay;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Frontend, Process, free_port, spawn_agent, spawn_server};
use tether_testkit::reset::assert_connect_reset;
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::{Child, Command};

/// Bound for any single step: catches hangs without asserting speed.
const STEP: Duration = Duration::from_secs(60);

fn tether_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tether"))
}

/// Polls `check` every 200 ms until it returns true, for at most `STEP`.
async fn eventually<F, Fut>(what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + STEP;
    while tokio::time::Instant::now() < deadline {
        if check().await {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("{what}: not within {STEP:?}")
}

async fn metric(process: &Process, sample: &str) -> f64 {
    let text = process.metrics().await.unwrap_or_default();
    metric_value(&text, sample).unwrap_or(0.0)
}

/// `kubectl --server=https://LISTENER` with the admin kubeconfig's CA and token.
async fn kubectl_via(
    plane: &ControlPlane,
    listener: SocketAddr,
    args: &[&str],
) -> anyhow::Result<String> {
    let server = format!("--server=https://{listener}");
    let mut all = vec![server.as_str(), "--request-timeout=30s"];
    all.extend_from_slice(args);
    plane.kubectl(&all, None).await
}

/// An agent process with its log written to `log`, so a test can read what it said.
fn spawn_logged_agent(
    pki: &Pki,
    server: SocketAddr,
    extra: &[String],
    log: &Path,
) -> anyhow::Result<Child> {
    let f = &pki.files;
    let mut args = vec![
        "agent".to_owned(),
        format!("--proxy-server-host={}", server.ip()),
        format!("--proxy-server-port={}", server.port()),
        format!("--ca-cert={}", f.ca_cert.display()),
        format!("--agent-cert={}", f.agent_cert.display()),
        format!("--agent-key={}", f.agent_key.display()),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={}", free_port()),
        format!("--admin-server-port={}", free_port()),
        "--sync-interval=100ms".into(),
        "--sync-interval-cap=1s".into(),
    ];
    args.extend(extra.iter().cloned());
    Ok(Command::new(tether_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true)
        .spawn()?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_reaches_the_api_server_through_the_agents_tunnel() -> anyhow::Result<()> {
    tether_tls::install_default_provider();
    let plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
    let pki = Pki::generate()?;
    let audit = pki.dir().join("server-audit.jsonl");
    let socket = pki.dir().join("proxy.sock");
    let api = format!("127.0.0.1:{}", plane.port);
    let endpoints = format!("--control-plane-endpoints={api}");
    let audit_flag = format!("--audit-log-path={}", audit.display());
    let server = spawn_server(
        tether_bin(),
        &pki,
        Frontend::GrpcUds(socket),
        &[&endpoints, &audit_flag],
    )
    .await?;
    let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let listen_flag = format!("--control-plane-listen={listener}");
    let relay = CuttingRelay::start(server.agent_addr).await?;
    let agent = spawn_agent(tether_bin(), &pki, relay.addr, &[&listen_flag]).await?;
    eventually("the agent's stream accepted for reverse dials", || async {
        metric(
            &server.process,
            "konnectivity_network_proxy_server_ready_backend_connections",
        )
        .await
            >= 1.0
    })
    .await?;

    // get
    let namespaces = kubectl_via(&plane, listener, &["get", "namespaces", "-o", "name"]).await?;
    assert!(
        namespaces.contains("namespace/default") && namespaces.contains("namespace/kube-system"),
        "kubectl get through the tunnel: {namespaces}"
    );

    // A large get: the OpenAPI document, several MB, byte-identical to a direct read.
    let direct = plane.kubectl(&["get", "--raw=/openapi/v2"], None).await?;
    let tunneled = kubectl_via(&plane, listener, &["get", "--raw=/openapi/v2"]).await?;
    assert!(
        direct.len() > 1_000_000,
        "the document is large: {} bytes",
        direct.len()
    );
    assert!(
        tunneled == direct,
        "the tunneled document differs ({} vs {} bytes)",
        tunneled.len(),
        direct.len()
    );

    // A watch that stays open across several events, on one tunneled connection.
    let mut watch = Command::new(plane.kubectl_path())
        .arg(format!("--kubeconfig={}", plane.kubeconfig.display()))
        .arg(format!("--server=https://{listener}"))
        .args([
            "get",
            "configmaps",
            "-n",
            "default",
            "--watch",
            "-o",
            "name",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut lines = BufReader::new(watch.stdout.take().expect("piped")).lines();
    // No controller runs, so the namespace starts without configmaps: each one created
    // shows up once, from the initial list or (all after the first) as a watch event.
    let connected = "tether_server_control_plane_dials_total{result=\"connected\"}";
    let (mut open_before, mut dials) = (0.0, 0.0);
    for i in 0..5 {
        let name = format!("reverse-watch-{i}");
        plane
            .kubectl(&["create", "configmap", &name, "-n", "default"], None)
            .await?;
        let seen = tokio::time::timeout(STEP, lines.next_line()).await??;
        assert_eq!(
            seen,
            Some(format!("configmap/{name}")),
            "event {i} through the watch"
        );
        if i == 0 {
            open_before = metric(&server.process, "tether_server_control_plane_connections").await;
            assert!(open_before >= 1.0, "the watch holds a reverse connection");
            dials = metric(&server.process, connected).await;
        }
        if i == 2 {
            // Mid-watch, the agent's stream is cut: the watch pauses, then goes on.
            relay.cut().await;
            eventually("the agent resumed its stream", || async {
                metric(&agent, "tether_agent_resumes_total").await >= 1.0
            })
            .await?;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        metric(&server.process, "tether_server_resumes_total").await,
        1.0
    );
    assert!(watch.try_wait()?.is_none(), "the watch is still running");
    assert_eq!(
        metric(&server.process, connected).await,
        dials,
        "the later events came over the watch's own connection, no new dial"
    );
    watch.kill().await?;
    eventually("the watch's connection closed at the server", || async {
        metric(&server.process, "tether_server_control_plane_connections").await < open_before
    })
    .await?;
    assert!(
        metric(
            &agent,
            "tether_agent_control_plane_dials_total{result=\"connected\"}"
        )
        .await
            >= 3.0,
        "the agent counted its reverse dials"
    );

    // An agent asking for an address outside the allowlist: refused, never dialed.
    let decoy = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let decoy_addr = decoy.local_addr()?;
    let other_listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let other_listen = format!("--control-plane-listen={other_listener}");
    let decoy_endpoint = format!("--control-plane-endpoint={decoy_addr}");
    let intruder = spawn_agent(
        tether_bin(),
        &pki,
        server.agent_addr,
        &[&other_listen, &decoy_endpoint],
    )
    .await?;
    eventually("the second agent connected", || async {
        metric(
            &server.process,
            "konnectivity_network_proxy_server_ready_backend_connections",
        )
        .await
            >= 2.0
    })
    .await?;
    let refused_before = metric(
        &server.process,
        "tether_server_control_plane_dials_total{result=\"refused\"}",
    )
    .await;
    let mut client = tokio::net::TcpStream::connect(other_listener).await?;
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await?;
    let mut got = Vec::new();
    // EOF or a reset: the agent closes the connection once the server refused the dial.
    let _ = tokio::time::timeout(STEP, client.read_to_end(&mut got)).await?;
    assert!(got.is_empty(), "nothing came back from a refused dial");
    eventually("the refusal counted at the server", || async {
        metric(
            &server.process,
            "tether_server_control_plane_dials_total{result=\"refused\"}",
        )
        .await
            > refused_before
    })
    .await?;
    assert!(
        metric(
            &intruder,
            "tether_agent_control_plane_dials_total{result=\"refused\"}"
        )
        .await
            >= 1.0,
        "and at the agent"
    );
    let never = tokio::time::timeout(Duration::from_millis(500), decoy.accept()).await;
    assert!(
        never.is_err(),
        "the server never dialed the refused address"
    );

    // The audit log has the refusal and the connections, marked as reverse.
    let requested = decoy_addr.to_string();
    eventually("the audit records written", || async {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        text.lines()
            .any(|l| l.contains("\"dial_refused\"") && l.contains(&requested))
            && text
                .lines()
                .any(|l| l.contains("\"connection\"") && l.contains("\"reverse\""))
    })
    .await?;
    let text = std::fs::read_to_string(&audit)?;
    for line in text.lines().filter(|l| l.contains("\"reverse\"")) {
        let record: serde_json::Value = serde_json::from_str(line)?;
        assert_eq!(record["side"], "server");
        assert_eq!(record["direction"], "reverse");
        match record["event"].as_str() {
            Some("connection") => {
                assert_eq!(record["dialed"], api.as_str(), "{line}");
                assert!(
                    record["bytes_from_destination"].as_u64() > Some(0),
                    "{line}"
                );
            }
            Some("connection_opened") => {
                assert_eq!(record["dialed"], api.as_str(), "{line}");
                assert!(record.get("closed_by").is_none(), "{line}");
            }
            Some("dial_refused") => {
                assert_eq!(record["requested"], requested.as_str());
                assert!(
                    record["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("not an allowed control-plane endpoint")),
                    "{line}"
                );
            }
            other => panic!("unexpected reverse record {other:?}: {line}"),
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_upstreams_server_the_listener_is_off_and_forward_traffic_works()
-> anyhow::Result<()> {
    tether_tls::install_default_provider();
    let pki = Pki::generate()?;
    let echo = EchoServer::start().await?;
    let f = &pki.files;
    let socket = pki.dir().join("upstream.sock");
    let (agent_port, health_port) = (free_port(), free_port());
    let _upstream = Process::spawn(
        &tether_testkit::process::upstream_bin("proxy-server"),
        vec![
            "--mode=http-connect".to_owned(),
            format!("--uds-name={}", socket.display()),
            "--server-port=0".into(),
            format!("--agent-port={agent_port}"),
            "--agent-bind-address=127.0.0.1".into(),
            format!("--cluster-cert={}", f.server_cert.display()),
            format!("--cluster-key={}", f.server_key.display()),
            format!("--cluster-ca-cert={}", f.ca_cert.display()),
            format!("--health-port={health_port}"),
            "--health-bind-address=127.0.0.1".into(),
            format!("--admin-port={}", free_port()),
            "--admin-bind-address=127.0.0.1".into(),
        ],
        SocketAddr::from(([127, 0, 0, 1], health_port)),
    )
    .await?;
    let log = pki.dir().join("agent.log");
    let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _agent = spawn_logged_agent(
        &pki,
        SocketAddr::from(([127, 0, 0, 1], agent_port)),
        &[format!("--control-plane-listen={listener}")],
        &log,
    )?;
    eventually(
        "the agent says the feature is off through upstream's server",
        || async {
            std::fs::read_to_string(&log)
                .unwrap_or_default()
                .contains("does not accept control-plane connections")
        },
    )
    .await?;

    // Forward traffic through upstream's server and the tether agent still works.
    let mut stream = tokio::net::UnixStream::connect(&socket).await?;
    let target = echo.addr;
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0];
        anyhow::ensure!(
            stream.read(&mut byte).await? == 1,
            "closed in the response head"
        );
        head.push(byte[0]);
        anyhow::ensure!(head.len() < 4096, "response head too long");
    }
    let head = String::from_utf8_lossy(&head);
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "CONNECT refused: {head}");
    stream.write_all(b"forward still works").await?;
    let mut back = [0; 19];
    tokio::time::timeout(STEP, stream.read_exact(&mut back)).await??;
    assert_eq!(&back, b"forward still works");

    // A local client of the listener is reset at once: nothing carries it.
    assert_connect_reset(listener, "a client of the agent's listener").await;
    Ok(())
}

/// A kubeconfig whose API server is `api` (a stand-in: nothing in these tests calls it).
fn stand_in_kubeconfig(dir: &Path, api: SocketAddr) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join("stand-in.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://{api}\n    insecure-skip-tls-verify: true\ncontexts:\n- name: x\n  context: {{cluster: c, user: u}}\ncurrent-context: x\nusers:\n- name: u\n  user: {{token: t}}\n"
        ),
    )?;
    Ok(path)
}

/// Sends a CONNECT for `target` to an agent's HTTP CONNECT listener; the stream and the
/// response head.
async fn connect_via(
    listener: SocketAddr,
    target: &str,
) -> anyhow::Result<(tokio::net::TcpStream, String)> {
    let mut stream = tokio::net::TcpStream::connect(listener).await?;
    stream
        .write_all(format!("CONNECT {target} HTTP/1.1\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0];
        let read = tokio::time::timeout(STEP, stream.read(&mut byte)).await??;
        anyhow::ensure!(read == 1, "closed in the response head: {head:?}");
        head.push(byte[0]);
        anyhow::ensure!(head.len() < 64 * 1024, "response head too long");
    }
    Ok((stream, String::from_utf8_lossy(&head).into_owned()))
}

/// Writes `text` and expects it back.
async fn echoes(stream: &mut tokio::net::TcpStream, text: &[u8]) -> anyhow::Result<()> {
    stream.write_all(text).await?;
    let mut back = vec![0; text.len()];
    tokio::time::timeout(STEP, stream.read_exact(&mut back)).await??;
    anyhow::ensure!(back == text, "echo differs");
    Ok(())
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, Iterator::count)
}

/// N4: a drop-in opens no new network path. A server with a Kubernetes client (here for
/// Leases; token authentication builds one too) used to let agents reach the kubeconfig's
/// API server by default; now reverse dials are off unless `--control-plane-endpoints`
/// allows them, and `kubeconfig` is the way to allow that API server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_dials_are_off_by_default_even_with_a_kubernetes_client() -> anyhow::Result<()> {
    tether_tls::install_default_provider();
    let pki = Pki::generate()?;
    let api = EchoServer::start().await?;
    let kubeconfig = stand_in_kubeconfig(pki.dir(), api.addr)?;
    let kubeconfig_flag = format!("--kubeconfig={}", kubeconfig.display());
    let server = spawn_server(
        tether_bin(),
        &pki,
        Frontend::GrpcUds(pki.dir().join("proxy.sock")),
        &["--enable-lease-controller", &kubeconfig_flag],
    )
    .await?;
    let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log = pki.dir().join("agent.log");
    let _agent = spawn_logged_agent(
        &pki,
        server.agent_addr,
        &[format!("--control-plane-listen={listener}")],
        &log,
    )?;
    eventually("the agent says the server declined", || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("does not accept control-plane connections")
    })
    .await?;
    // A client of the agent's listener is reset at once: nothing reached the API server.
    assert_connect_reset(listener, "a client of the agent's listener").await;
    assert_eq!(
        metric(
            &server.process,
            "tether_server_control_plane_dials_total{result=\"connected\"}"
        )
        .await,
        0.0
    );

    // Asked for: `kubeconfig` names the API server of --kubeconfig.
    let allowing = spawn_server(
        tether_bin(),
        &pki,
        Frontend::GrpcUds(pki.dir().join("allowing.sock")),
        &["--control-plane-endpoints=kubeconfig", &kubeconfig_flag],
    )
    .await?;
    let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let listen_flag = format!("--control-plane-listen={listener}");
    let _agent = spawn_agent(tether_bin(), &pki, allowing.agent_addr, &[&listen_flag]).await?;
    allowing.process.wait_ready().await?;
    // The agent may bind its listener before its stream negotiated reverse dials.
    for _ in 0..50 {
        if let Ok(mut client) = tokio::net::TcpStream::connect(listener).await
            && echoes(&mut client, b"through the tunnel").await.is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    anyhow::bail!("the kubeconfig's API server was not reached through the agent")
}

/// N4 and N3: one agent stream holds at most `--control-plane-max-connections-per-stream`
/// reverse connections (the next is refused with an error naming the flag, counted, audited)
/// and the server's file descriptors return to where they were once they close. A refused
/// dial for a megabyte-long address leaves a bounded log line and audit record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reverse_connections_per_stream_are_capped_and_refusals_bounded() -> anyhow::Result<()> {
    const CAP: usize = 4;
    tether_tls::install_default_provider();
    let pki = Pki::generate()?;
    let api = EchoServer::start().await?;
    let audit = pki.dir().join("server-audit.jsonl");
    let server_log = pki.dir().join("server.log");
    let flags = [
        format!("--control-plane-endpoints={}", api.addr),
        format!("--control-plane-max-connections-per-stream={CAP}"),
        format!("--audit-log-path={}", audit.display()),
        "--logtostderr=false".to_owned(),
        format!("--log-file={}", server_log.display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let server = spawn_server(
        tether_bin(),
        &pki,
        Frontend::GrpcUds(pki.dir().join("proxy.sock")),
        &flags,
    )
    .await?;
    let listener = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let _agent = spawn_agent(
        tether_bin(),
        &pki,
        server.agent_addr,
        &[
            &format!("--control-plane-listen={listener}"),
            "--control-plane-protocol=http-connect",
        ],
    )
    .await?;
    server.process.wait_ready().await?;
    let pid = server.process.pid;
    let target = api.addr.to_string();
    // One connection opened and closed first, so that lazily made state is in the baseline.
    // The server is ready once the agent's stream is registered there, which can be a moment
    // before the agent has taken the server's answer (its 503 says so): ask again until then.
    let mut first = None;
    for _ in 0..50 {
        let (stream, head) = connect_via(listener, &target).await?;
        if head.starts_with("HTTP/1.1 200") {
            first = Some(stream);
            break;
        }
        assert!(head.starts_with("HTTP/1.1 503"), "{head}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut first = first.expect("the listener carries a connection within 5 s");
    echoes(&mut first, b"warm").await?;
    drop(first);
    let gauge = "tether_server_control_plane_connections";
    eventually("the first connection closed", || async {
        metric(&server.process, gauge).await == 0.0
    })
    .await?;
    let baseline = open_fds(pid);

    let mut held = Vec::new();
    for n in 0..CAP {
        let (mut stream, head) = connect_via(listener, &target).await?;
        assert!(head.starts_with("HTTP/1.1 200"), "connection {n}: {head}");
        echoes(&mut stream, format!("held {n}").as_bytes()).await?;
        held.push(stream);
    }
    assert_eq!(metric(&server.process, gauge).await, CAP as f64);
    let (_, head) = connect_via(listener, &target).await?;
    assert!(
        !head.starts_with("HTTP/1.1 200"),
        "connection {} was carried: {head}",
        CAP + 1
    );
    assert_eq!(
        metric(
            &server.process,
            "tether_server_control_plane_dials_total{result=\"over_limit\"}"
        )
        .await,
        1.0
    );
    drop(held);
    eventually("the server's descriptors back to the baseline", || async {
        metric(&server.process, gauge).await == 0.0 && open_fds(pid) <= baseline
    })
    .await?;
    // Room again.
    let (mut again, head) = connect_via(listener, &target).await?;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echoes(&mut again, b"again").await?;
    drop(again);

    // A megabyte-long endpoint: refused with a bounded echo of it.
    let huge = format!("{}:443", "h".repeat(1 << 20));
    let (mut refused, head) = connect_via(listener, &huge).await?;
    assert!(
        head.starts_with("HTTP/1.1 403"),
        "{}",
        &head[..head.len().min(200)]
    );
    let mut body = Vec::new();
    let _ = tokio::time::timeout(STEP, refused.read_to_end(&mut body)).await?;
    assert!(body.len() < 1024, "a {} byte refusal", body.len());

    eventually("the refusals audited", || async {
        let text = std::fs::read_to_string(&audit).unwrap_or_default();
        text.lines()
            .filter(|l| l.contains("\"dial_refused\""))
            .count()
            >= 2
    })
    .await?;
    let text = std::fs::read_to_string(&audit)?;
    let mut over_limit = 0;
    let mut cut = 0;
    for line in text.lines() {
        assert!(
            line.len() <= 64 * 1024,
            "an audit record of {} bytes",
            line.len()
        );
        let record: serde_json::Value = serde_json::from_str(line)?;
        if record["event"] != "dial_refused" {
            continue;
        }
        let reason = record["reason"].as_str().unwrap_or_default();
        if reason.contains("--control-plane-max-connections-per-stream") {
            over_limit += 1;
        } else {
            assert!(
                record["requested"]
                    .as_str()
                    .is_some_and(|r| r.ends_with("…(1048580 bytes)")),
                "{}",
                &line[..line.len().min(300)]
            );
            assert_eq!(record["truncated"], serde_json::json!(["requested"]));
            cut += 1;
        }
    }
    assert_eq!((over_limit, cut), (1, 1), "{text}");
    let log = std::fs::read_to_string(&server_log)?;
    let longest = log.lines().map(str::len).max().unwrap_or(0);
    assert!(longest < 2048, "a server log line of {longest} bytes");
    assert!(log.contains("refusing a reverse dial"), "{log}");
    Ok(())
}
