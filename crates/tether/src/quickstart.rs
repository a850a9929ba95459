//! `tether quickstart`: a whole tunnel on loopback in one process, and proof that it works.
//!
//! It generates a throwaway PKI, starts a demo HTTP backend standing in for the cluster
//! network, and two server/agent pairs: one with the gRPC frontend on a Unix socket (what
//! kube-apiserver's GRPC egress uses) and one with HTTP CONNECT over mutual TLS. It sends a
//! request through each, prints what happened and the commands to try it by hand.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tether_grpc::Keepalive;
use tether_observe::http::{Request, Response};
use tether_observe::metrics::Registry;
use tether_server::{FlowConfig, FrontendListen, Mode, Strategy};
use tether_tls::TlsOptions;
use tether_tls::pki::{Pki, PkiFiles};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::cli::quickstart::QuickstartArgs;
use crate::signals::Signals;

const BACKEND_REPLY: &str = "hello from the cluster network, through tether\n";
/// How long the demo waits for the agents to connect.
const READY_TIMEOUT: Duration = Duration::from_secs(20);

pub(crate) async fn run(args: QuickstartArgs) -> anyhow::Result<ExitCode> {
    tether_tls::install_default_provider();
    let temp = match &args.dir {
        Some(_) => None,
        None => Some(tempfile::tempdir().context("creating a temporary directory")?),
    };
    let dir = match (&args.dir, &temp) {
        (Some(dir), _) => dir.clone(),
        (None, Some(temp)) => temp.path().to_owned(),
        (None, None) => unreachable!("one of the two is set"),
    };
    let pki = Pki::generate()?.write_to(&dir)?;
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();

    let backend = TcpListener::bind("127.0.0.1:0").await?;
    let backend_addr = backend.local_addr()?;
    let handler: tether_observe::http::Handler =
        Arc::new(|_: &Request| Response::text(200, BACKEND_REPLY));
    tasks.spawn(tether_observe::http::serve(
        backend,
        handler,
        Default::default(),
        stop.clone().cancelled_owned(),
    ));

    let grpc = start_pair(&pki, Mode::Grpc, Some(dir.join("grpc.sock")), &tasks, &stop).await?;
    let connect = start_pair(&pki, Mode::HttpConnect, None, &tasks, &stop).await?;

    println!("tether quickstart: everything runs on loopback");
    println!("  certificates        {}", dir.display());
    println!("  demo backend        http://{backend_addr}/");
    println!(
        "  gRPC frontend       unix:{}  (agent port {})",
        grpc.frontend, grpc.agent_port
    );
    println!(
        "  HTTP CONNECT (mTLS) https://{}  (agent port {})",
        connect.frontend, connect.agent_port
    );
    println!();

    let target = backend_addr.to_string();
    let grpc_transport = tether_client::Transport::Unix(PathBuf::from(&grpc.frontend));
    let tls_transport = tether_client::Transport::Tls {
        addr: connect.frontend.clone(),
        server_name: "127.0.0.1".into(),
        tls: tether_tls::client_config(
            &pki.ca_cert,
            Some((&pki.client_cert, &pki.client_key)),
            Vec::new(),
            &TlsOptions::default(),
        )?,
    };
    let mut ok = true;
    let via_grpc = async {
        let client = wait_for_agent(&grpc_transport).await?;
        let stream = client.dial(&target).await?;
        http_get(stream).await
    };
    ok &= report("gRPC over a Unix socket", via_grpc.await);
    let via_connect = async {
        let socket = tether_client::dial_http_connect(&tls_transport, &target).await?;
        http_get(socket).await
    };
    ok &= report("HTTP CONNECT over mutual TLS", via_connect.await);

    // With --once everything is gone when this returns, and commands into it would fail.
    if !args.once {
        print_try_it(&pki, &target, &grpc, &connect);
    }

    if !args.once {
        println!();
        println!("Serving until Ctrl-C.");
        let signals = Signals::install()?;
        signals.first.cancelled().await;
    }
    stop.cancel();
    tasks.close();
    let _ = tokio::time::timeout(Duration::from_secs(10), tasks.wait()).await;
    drop(temp);
    Ok(if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Commands to try while the quickstart serves, for each pair by its frontend.
fn print_try_it(pki: &PkiFiles, target: &str, grpc: &Pair, connect: &Pair) {
    let me = std::env::current_exe().map_or_else(|_| "tether".into(), |p| p.display().to_string());
    println!();
    println!("Try it yourself:");
    println!(
        "  curl -p --proxy https://{} --proxy-cacert {} --proxy-cert {} --proxy-key {} http://{target}/",
        connect.frontend,
        pki.ca_cert.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    );
    println!(
        "  printf 'GET / HTTP/1.0\\r\\n\\r\\n' | {me} dial --uds {} {target}",
        grpc.frontend
    );
    println!(
        "  printf 'GET / HTTP/1.0\\r\\n\\r\\n' | {me} dial --mode http-connect --proxy-server {} --ca-cert {} --cert {} --key {} {target}",
        connect.frontend,
        pki.ca_cert.display(),
        pki.client_cert.display(),
        pki.client_key.display()
    );
    for (name, pair) in [("gRPC pair", grpc), ("HTTP CONNECT pair", connect)] {
        println!(
            "  curl http://{}/metrics   ({name}: server metrics; agent: http://{}/metrics)",
            pair.health, pair.agent_health
        );
        println!(
            "  {me} connections --admin-address {}   ({name}: or agents, top; agent: --admin-address {})",
            pair.admin, pair.agent_admin
        );
    }
}

/// Addresses of one running server and its agent.
struct Pair {
    frontend: String,
    agent_port: u16,
    /// The server's and the agent's metrics (`/metrics` on their health ports).
    health: SocketAddr,
    agent_health: SocketAddr,
    /// The server's and the agent's admin ports (`tether connections`, `tether agents`).
    admin: SocketAddr,
    agent_admin: SocketAddr,
}

async fn start_pair(
    pki: &PkiFiles,
    mode: Mode,
    uds: Option<PathBuf>,
    tasks: &TaskTracker,
    stop: &CancellationToken,
) -> anyhow::Result<Pair> {
    let loopback: SocketAddr = "127.0.0.1:0".parse()?;
    let tls = TlsOptions::default();
    let frontend = match uds {
        Some(path) => FrontendListen::Unix {
            path,
            delete_existing: true,
        },
        None => FrontendListen::Tls {
            addr: loopback,
            tls: tether_tls::server_config(
                &pki.server_cert,
                &pki.server_key,
                Some(&pki.ca_cert),
                &[b"http/1.1"],
                &tls,
            )?,
        },
    };
    let name = match mode {
        Mode::Grpc => "grpc",
        Mode::HttpConnect => "http-connect",
    };
    let ping = Some(Keepalive {
        interval: Duration::from_secs(5),
        timeout: Duration::from_secs(10),
    });
    let server = tether_server::Server::bind(
        tether_server::Config {
            mode,
            frontend,
            agent_addr: loopback,
            agent_tls: tether_tls::server_config(
                &pki.server_cert,
                &pki.server_key,
                Some(&pki.ca_cert),
                &tether_server::AGENT_ALPN,
                &tls,
            )?,
            health_addr: loopback,
            admin_addr: loopback,
            server_id: format!("quickstart-{name}"),
            server_count: 1,
            strategies: vec![Strategy::Default],
            routing: Default::default(),
            routing_reload: None,
            dial_timeout: Duration::from_secs(30),
            graceful_shutdown_timeout: Duration::ZERO,
            flow: FlowConfig::default(),
            agent_keepalive: ping,
            frontend_keepalive: None,
            limits: Default::default(),
            agent_identity_binding: Default::default(),
            audit_log: None,
            tls_reload: None,
            agent_token_auth: None,
            control_plane: None,
            resume_window: tether_server::DEFAULT_RESUME_WINDOW,
            dead_agent_timeout: Some(tether_server::DEFAULT_DEAD_AGENT_TIMEOUT),
            peering: None,
        },
        Registry::new(),
    )
    .await?;
    let agent_addr = server.agent_addr().context("agent listener address")?;
    let pair = Pair {
        frontend: server.frontend_addr(),
        agent_port: agent_addr.port(),
        health: server.health_addr().context("health listener address")?,
        admin: server.admin_addr().context("admin listener address")?,
        agent_health: loopback,
        agent_admin: loopback,
    };
    tasks.spawn(server.run(stop.clone()));

    let agent = tether_agent::Agent::bind(
        tether_agent::Config {
            server_host: agent_addr.ip().to_string(),
            server_port: agent_addr.port(),
            discovery: tether_agent::Discovery::Balancer,
            server_connections: None,
            websocket_path: None,
            egress: tether_agent::egress_proxy::Egress::Direct,
            tls: tether_tls::client_config(
                &pki.ca_cert,
                Some((&pki.agent_cert, &pki.agent_key)),
                vec![b"h2".to_vec()],
                &tls,
            )?,
            agent_id: format!("quickstart-agent-{name}"),
            identifiers: String::new(),
            labels: Default::default(),
            health_addr: loopback,
            admin_addr: loopback,
            sync_interval: Duration::from_millis(200),
            sync_interval_cap: Duration::from_secs(2),
            sync_forever: false,
            keepalive: ping,
            legacy_keepalive: None,
            dial_timeout: Duration::from_secs(5),
            destinations: tether_agent::DestinationConfig::default(),
            flow: FlowConfig::default(),
            token_path: None,
            lease_counting: None,
            audit_log: None,
            tls_reload: None,
            control_plane: None,
            resume_window: tether_server::DEFAULT_RESUME_WINDOW,
            drain_timeout: None,
        },
        Registry::new(),
    )
    .await?;
    let pair = Pair {
        agent_health: agent
            .health_addr()
            .context("agent health listener address")?,
        agent_admin: agent.admin_addr().context("agent admin listener address")?,
        ..pair
    };
    let (drain, agent_stop) = (stop.child_token(), stop.child_token());
    tasks.spawn(agent.run(drain, agent_stop));
    Ok(pair)
}

/// Connects to the gRPC frontend and waits until a dial no longer fails for want of an agent.
async fn wait_for_agent(
    transport: &tether_client::Transport,
) -> anyhow::Result<tether_client::GrpcClient> {
    let until = tokio::time::Instant::now() + READY_TIMEOUT;
    loop {
        let client = tether_client::GrpcClient::connect(transport).await?;
        match client.dial("127.0.0.1:1").await {
            Err(tether_client::DialError::NoAgent) if tokio::time::Instant::now() < until => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(tether_client::DialError::NoAgent) => {
                anyhow::bail!("no agent connected within {READY_TIMEOUT:?}")
            }
            _ => return Ok(client),
        }
    }
}

/// Sends a GET over an established tunnel and returns the status line and body.
async fn http_get<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> anyhow::Result<String> {
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: demo\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response))
        .await
        .context("timed out reading the response")??;
    let text = String::from_utf8_lossy(&response);
    let status = text.lines().next().unwrap_or_default().to_owned();
    let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    anyhow::ensure!(body == BACKEND_REPLY, "unexpected response: {text:?}");
    Ok(format!("{status}, body {:?}", body.trim_end()))
}

fn report(what: &str, result: anyhow::Result<String>) -> bool {
    match result {
        Ok(summary) => {
            println!("  ok    {what}: {summary}");
            true
        }
        Err(e) => {
            println!("  FAIL  {what}: {e:#}");
            false
        }
    }
}
