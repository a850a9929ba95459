//! Token authentication with upstream's peers: upstream's proxy-agent
//! (`--service-account-token-path`) against a `tether server` process, and a tether agent
//! against upstream's proxy-server with token authentication.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use tether_testkit::process::free_port;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, TestAgent};
use tokio::process::{Child, Command};

use crate::{AGENT_SA, AUDIENCE, Cluster, NAMESPACE, echo_through, eventually};

fn spawn(bin: &Path, args: Vec<String>) -> anyhow::Result<Child> {
    Ok(Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(if std::env::var_os("RUST_LOG").is_some() {
            Stdio::inherit()
        } else {
            Stdio::null()
        })
        .kill_on_drop(true)
        .spawn()?)
}

/// A proxy server's flags, the same for tether and upstream: the kubernetes.io task's token
/// authentication, an HTTP CONNECT frontend on a Unix socket, loopback ports.
struct ServerFlags {
    socket: PathBuf,
    agent_port: u16,
    health_port: u16,
    args: Vec<String>,
}

fn server_flags(pki: &Pki, kubeconfig: &Path) -> ServerFlags {
    let f = &pki.files;
    let socket = pki.dir().join(format!("proxy-{}.sock", free_port()));
    let (agent_port, health_port) = (free_port(), free_port());
    let args = vec![
        "--mode=http-connect".to_owned(),
        format!("--uds-name={}", socket.display()),
        "--server-port=0".into(),
        format!("--agent-port={agent_port}"),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--cluster-cert={}", f.server_cert.display()),
        format!("--cluster-key={}", f.server_key.display()),
        format!("--health-port={health_port}"),
        "--health-bind-address=127.0.0.1".into(),
        format!("--admin-port={}", free_port()),
        "--admin-bind-address=127.0.0.1".into(),
        format!("--agent-namespace={NAMESPACE}"),
        format!("--agent-service-account={AGENT_SA}"),
        format!("--authentication-audience={AUDIENCE}"),
        format!("--kubeconfig={}", kubeconfig.display()),
    ];
    ServerFlags {
        socket,
        agent_port,
        health_port,
        args,
    }
}

fn upstream_agent(
    pki: &Pki,
    agent_port: u16,
    token_file: &Path,
    agent_id: &str,
) -> anyhow::Result<Child> {
    spawn(
        &tether_testkit::process::upstream_bin("proxy-agent"),
        vec![
            "--proxy-server-host=127.0.0.1".into(),
            format!("--proxy-server-port={agent_port}"),
            format!("--ca-cert={}", pki.files.ca_cert.display()),
            format!("--service-account-token-path={}", token_file.display()),
            format!("--agent-id={agent_id}"),
            "--agent-identifiers=host=node-1".into(),
            "--health-server-host=127.0.0.1".into(),
            format!("--health-server-port={}", free_port()),
            format!("--admin-server-port={}", free_port()),
            "--sync-interval=100ms".into(),
            "--sync-interval-cap=1s".into(),
        ],
    )
}

async fn ready(health_port: u16) -> bool {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], health_port));
    matches!(
        tether_testkit::http::get(addr, "/readyz").await,
        Ok((200, _))
    )
}

async fn metrics(health_port: u16) -> String {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], health_port));
    tether_testkit::http::get(addr, "/metrics")
        .await
        .map(|(_, body)| body)
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_auth_works_with_upstreams_agent_and_server() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let pki = Pki::generate()?;
    let echo = EchoServer::start().await?;
    let dir = tempfile::tempdir()?;
    let token = cluster.agent_token(Some("node-1")).await?;
    let token_file = dir.path().join("token");
    // Upstream's agent sends the file's bytes as they are: no trailing newline.
    std::fs::write(&token_file, &token)?;
    let wrong_file = dir.path().join("wrong-token");
    std::fs::write(
        &wrong_file,
        cluster
            .plane
            .create_token("default", AGENT_SA, AUDIENCE, None)
            .await?,
    )?;

    // Upstream's agent, with its token, against a tether server process.
    let tether = server_flags(&pki, &cluster.server_kubeconfig);
    let mut args = vec!["server".to_owned()];
    args.extend(tether.args.iter().cloned());
    let _tether_server = spawn(crate::tether_bin(), args)?;
    let _agent = upstream_agent(&pki, tether.agent_port, &token_file, "upstream-node-1")?;
    eventually("tether server ready with upstream's agent", || {
        ready(tether.health_port)
    })
    .await?;
    echo_through(&tether.socket, echo.addr).await?;
    // An upstream agent with a token of the wrong namespace is refused (it logs only
    // "expected one server ID"; the server counts it).
    let _refused = upstream_agent(&pki, tether.agent_port, &wrong_file, "upstream-wrong")?;
    eventually("the refusal counted", || async {
        tether_testkit::http::metric_value(
            &metrics(tether.health_port).await,
            "tether_server_limit_hits_total{limit=\"agent_token\"}",
        )
        .is_some_and(|hits| hits >= 1.0)
    })
    .await?;
    assert_eq!(
        tether_testkit::http::metric_value(
            &metrics(tether.health_port).await,
            "konnectivity_network_proxy_server_ready_backends{proxy_strategy=\"default\"}"
        ),
        Some(1.0),
        "only the agent with the right token is a backend"
    );

    // A tether agent, with its token, against upstream's server.
    let upstream = server_flags(&pki, &cluster.server_kubeconfig);
    let _upstream_server = spawn(
        &tether_testkit::process::upstream_bin("proxy-server"),
        upstream.args.clone(),
    )?;
    eventually("upstream's server listening", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", upstream.agent_port))
            .await
            .is_ok()
    })
    .await?;
    let agent = TestAgent::start(
        &pki,
        std::net::SocketAddr::from(([127, 0, 0, 1], upstream.agent_port)),
        AgentOptions {
            agent_id: "tether-node-1".into(),
            identifiers: "host=node-1".into(),
            token_path: Some(token_file.clone()),
            // Upstream's server speaks gRPC only.
            link: AgentOptions::default().link.reaching_grpc(),
            ..Default::default()
        },
    )
    .await?;
    eventually("upstream's server ready with tether's agent", || {
        ready(upstream.health_port)
    })
    .await?;
    agent.wait_ready().await?;
    echo_through(&upstream.socket, echo.addr).await?;
    agent.stop().await;
    Ok(())
}
