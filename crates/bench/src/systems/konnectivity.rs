//! tether and upstream Konnectivity: the same flags (tether is a drop-in), the same
//! certificates, server and agent as separate processes, server↔agent over mutual TLS.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use tether_client::{GrpcClient, Transport};
use tether_tls::TlsOptions;
use tether_tls::pki::PkiFiles;
use tokio::process::Command;

/// Where the bench's servers listen for agents, unless a fleet gives each its own address.
const LOOPBACK: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

use super::dialer::Dialer;
use super::env::{Binaries, Env};
use super::loopback::{free_port, wait_http_ok};
use super::running::{Holder, Running};
use super::system::{Frontend, Impl, System};
use crate::procs::Proc;

impl Impl {
    /// Whether this implementation's server has tether's connection caps, among them
    /// `--max-streams-per-frontend-connection` (upstream has none; grpc-go's default leaves
    /// the streams of a connection unlimited).
    pub fn has_caps(&self, bins: &Binaries) -> bool {
        match self {
            Impl::Tether | Impl::TetherH2 | Impl::TetherWs | Impl::TetherPeer => true,
            Impl::TetherBefore => bins.before_has_caps,
            Impl::Upstream => false,
        }
    }
}

impl Frontend {
    /// Its `--mode`.
    pub(super) fn mode(&self) -> &'static str {
        match self {
            Frontend::HttpConnectUds | Frontend::HttpConnectTls => "http-connect",
            Frontend::GrpcUds | Frontend::GrpcTls => "grpc",
        }
    }

    pub(super) fn is_uds(&self) -> bool {
        matches!(self, Frontend::HttpConnectUds | Frontend::GrpcUds)
    }
}

fn command(env: &Env, imp: Impl, role: &str) -> Command {
    match imp {
        Impl::Tether | Impl::TetherH2 | Impl::TetherWs | Impl::TetherPeer | Impl::TetherBefore => {
            let bin = match imp {
                Impl::TetherBefore => env.bins.tether_before.as_ref(),
                _ => None,
            };
            let mut c = Command::new(bin.unwrap_or(&env.bins.tether));
            c.arg(role);
            c
        }
        Impl::Upstream => Command::new(match role {
            "server" => &env.bins.upstream_server,
            _ => &env.bins.upstream_agent,
        }),
    }
}

/// A tether or upstream server's agent listener on `agent_ip`, its health and admin ports on
/// 127.0.0.1, and the run's cluster certificate: the flags every server the bench starts has.
pub fn server_flags(
    pki: &PkiFiles,
    agent_ip: std::net::IpAddr,
    agent_port: u16,
    health: u16,
    admin: u16,
) -> Vec<std::ffi::OsString> {
    vec![
        flag("agent-bind-address", agent_ip.to_string()),
        flag("agent-port", agent_port.to_string()),
        "--health-bind-address=127.0.0.1".into(),
        flag("health-port", health.to_string()),
        "--admin-bind-address=127.0.0.1".into(),
        flag("admin-port", admin.to_string()),
        flag("cluster-cert", &pki.server_cert),
        flag("cluster-key", &pki.server_key),
        flag("cluster-ca-cert", &pki.ca_cert),
    ]
}

/// An agent `id` with the run's agent certificate, its health and admin ports on
/// 127.0.0.1: every flag but where its servers are.
pub fn agent_flags(pki: &PkiFiles, health: u16, admin: u16, id: &str) -> Vec<std::ffi::OsString> {
    vec![
        flag("ca-cert", &pki.ca_cert),
        flag("agent-cert", &pki.agent_cert),
        flag("agent-key", &pki.agent_key),
        "--health-server-host=127.0.0.1".into(),
        flag("health-server-port", health.to_string()),
        "--admin-bind-address=127.0.0.1".into(),
        flag("admin-server-port", admin.to_string()),
        flag("agent-id", id),
        "-v=0".into(),
    ]
}

/// `--name=value`, for a command line.
pub fn flag(name: &str, value: impl AsRef<std::ffi::OsStr>) -> std::ffi::OsString {
    let mut s = std::ffi::OsString::from(format!("--{name}="));
    s.push(value);
    s
}

/// How the agent of a started system reaches its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum AgentLink {
    /// No agent: a lone server (fan-in).
    None,
    /// This many agents, each with its own ID, straight to the server.
    Direct(usize),
    /// Through a `tether-bench relay --cut-on-sigusr1`: a middlebox the workload can cut.
    CutRelay,
}

/// Starts a server (and an agent, unless `agent` is `None`) and connects a client.
/// `frontend_streams` is tether's `--max-streams-per-frontend-connection` (upstream has no
/// such flag); `None` lifts the cap where a client is to multiplex (see below).
pub(super) async fn start(
    env: &Env,
    imp: Impl,
    frontend: Frontend,
    agent: AgentLink,
    frontend_streams: Option<u32>,
) -> anyhow::Result<Running> {
    let system = System::Konn(imp, frontend);
    let dir = env.instance_dir(&system)?;
    let pki = &env.pki;
    // With a peer hop: the peer ports of the client's server (A) and of the one holding the
    // agents (B).
    let peer_ports = match imp {
        Impl::TetherPeer => Some([free_port()?, free_port()?]),
        _ => None,
    };
    let agent_port = free_port()?;
    let health_port = free_port()?;
    let admin_port = free_port()?;
    let uds = dir.join("frontend.sock");

    let mut cmd = command(env, imp, "server");
    cmd.arg(flag("mode", frontend.mode()));
    let frontend_port = if frontend.is_uds() {
        cmd.arg(flag("uds-name", &uds)).arg("--server-port=0");
        None
    } else {
        let port = free_port()?;
        cmd.arg("--server-bind-address=127.0.0.1")
            .arg(flag("server-port", port.to_string()))
            .arg(flag("server-cert", &pki.server_cert))
            .arg(flag("server-key", &pki.server_key))
            .arg(flag("server-ca-cert", &pki.ca_cert));
        Some(port)
    };
    cmd.args(server_flags(
        pki,
        LOOPBACK,
        agent_port,
        health_port,
        admin_port,
    ))
    .arg("--server-count=1");
    let has_caps = imp.has_caps(&env.bins);
    match frontend_streams {
        Some(cap) if has_caps => {
            cmd.arg(flag("max-streams-per-frontend-connection", cap.to_string()));
        }
        // idle-conns is one client multiplexing thousands of tunnels on one gRPC connection:
        // lift the per-connection stream cap, which upstream does not have.
        None if has_caps && agent != AgentLink::None => {
            cmd.arg("--max-streams-per-frontend-connection=1000000");
        }
        _ => {}
    }
    if has_caps && imp == Impl::TetherBefore {
        // Builds before bf2cd21 counted admitted agents against the per-address cap, and the
        // fan-in's agents all come from 127.0.0.1. tether itself runs the fan-in (a lone
        // server) with its default flags.
        cmd.arg("--max-agent-connections-per-address=0");
    }
    if let Some(ports) = peer_ports {
        peer_flags(&mut cmd, env, "a", ports[0], ports);
    }
    cmd
        // The same verbosity for both: upstream's default (-v=4) logs lines per connection.
        .arg("-v=0");
    let mut server = Proc::spawn("server", cmd, &dir.join("server.log"))?;
    wait_http_ok(
        &mut server,
        health_port,
        "/healthz",
        Duration::from_secs(30),
    )
    .await?;
    // B after A, so that B's link to A, over which A learns B's agents, opens at its first
    // attempt rather than after a back-off.
    let mut holder = match peer_ports {
        Some(ports) => Some(start_holder(env, &dir, frontend, ports).await?),
        None => None,
    };
    // Where the agents connect: B behind a peer hop, else the server.
    let agents_to = holder.as_ref().map_or(agent_port, |(_, port)| *port);

    let cut_relay = if agent == AgentLink::CutRelay {
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.args([
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--cut-on-sigusr1",
            "--to",
        ])
        .arg(format!("127.0.0.1:{agents_to}"));
        Some(Proc::spawn_listening("cut relay", cmd, &dir.join("cut-relay.log")).await?)
    } else {
        None
    };
    let agent_count = match agent {
        AgentLink::None => 0,
        AgentLink::Direct(n) => n,
        AgentLink::CutRelay => 1,
    };
    let mut agents = Vec::with_capacity(agent_count);
    for i in 0..agent_count {
        let a_health = free_port()?;
        let a_admin = free_port()?;
        let server_port = cut_relay
            .as_ref()
            .map_or(agents_to, |(_, addr)| addr.port());
        let id = if agent_count == 1 {
            "bench-agent".to_owned()
        } else {
            format!("bench-agent-{i}")
        };
        let mut cmd = command(env, imp, "agent");
        cmd.arg("--proxy-server-host=127.0.0.1")
            .arg(flag("proxy-server-port", server_port.to_string()))
            .args(agent_flags(pki, a_health, a_admin, &id));
        match imp {
            Impl::TetherH2 => drop(cmd.arg("--transport=grpc")),
            Impl::TetherWs => drop(cmd.arg("--transport=websocket")),
            _ => {}
        }
        let mut agent = Proc::spawn("agent", cmd, &dir.join(format!("{id}.log")))?;
        wait_http_ok(&mut agent, a_health, "/readyz", Duration::from_secs(30)).await?;
        agents.push(agent);
    }
    if agent_count > 0 {
        // The server holding the agents is ready once it has one; behind a peer hop, A learns
        // of it over the peer link a moment later (waited for below).
        let (holding, port) = match &mut holder {
            Some((h, _)) => (&mut h.server, h.health),
            None => (&mut server, health_port),
        };
        wait_http_ok(holding, port, "/readyz", Duration::from_secs(30)).await?;
    }

    let transport = match frontend_port {
        None => Transport::Unix(uds),
        Some(port) => Transport::Tls {
            addr: format!("127.0.0.1:{port}"),
            server_name: "127.0.0.1".into(),
            tls: client_tls(&pki.ca_cert, &pki.client_cert, &pki.client_key, b"h2")?,
        },
    };
    let target = env.target.to_string();
    let dialer = match frontend {
        Frontend::HttpConnectUds | Frontend::HttpConnectTls => {
            Dialer::HttpConnect(transport, target)
        }
        Frontend::GrpcUds | Frontend::GrpcTls => {
            let client =
                tokio::time::timeout(Duration::from_secs(10), GrpcClient::connect(&transport))
                    .await
                    .context("gRPC frontend connect timed out")??;
            Dialer::Grpc(client, target)
        }
    };
    if holder.is_some() && agent_count > 0 {
        wait_for_peer_route(&dialer, &system).await?;
    }
    Ok(Running {
        system,
        dialer,
        server: Some(server),
        agents,
        server_health: Some(health_port),
        agent_port: Some(agents_to),
        cut_relay: cut_relay.map(|(relay, _)| relay),
        holder: holder.map(|(h, _)| h),
    })
}

/// Server peering's flags for tether server `name` (`a` or `b`), whose own peer port is
/// `own`, both servers' in `ports` (its own among them, which it finds itself by its server
/// ID): on loopback, with the run's peer certificate, which names `tether-peer`.
fn peer_flags(cmd: &mut Command, env: &Env, name: &str, own: u16, ports: [u16; 2]) {
    let pki = &env.pki;
    cmd.arg(flag("server-id", format!("bench-server-{name}")))
        .arg("--peer-bind-address=127.0.0.1")
        .arg(flag("peer-port", own.to_string()))
        .arg(flag("peer-cert-file", &pki.peer_cert))
        .arg(flag("peer-key-file", &pki.peer_key))
        .arg(flag("peer-ca-cert", &pki.ca_cert))
        .arg(flag(
            "peer-addresses",
            format!("127.0.0.1:{},127.0.0.1:{}", ports[0], ports[1]),
        ));
}

/// The second tether server of a peer hop (B), peered with A, which its agents connect to:
/// the same flags as A but for its frontend (a Unix socket nobody dials, in A's mode) and
/// the connection caps (its dials come over the peer link). Returns it and its agent port.
async fn start_holder(
    env: &Env,
    dir: &Path,
    frontend: Frontend,
    ports: [u16; 2],
) -> anyhow::Result<(Holder, u16)> {
    let pki = &env.pki;
    let (agent_port, health, admin) = (free_port()?, free_port()?, free_port()?);
    let mut cmd = command(env, Impl::TetherPeer, "server");
    cmd.arg(flag("mode", frontend.mode()))
        .arg(flag("uds-name", dir.join("holder.sock")))
        .arg("--server-port=0")
        .args(server_flags(pki, LOOPBACK, agent_port, health, admin))
        .arg("--server-count=1");
    peer_flags(&mut cmd, env, "b", ports[1], ports);
    cmd.arg("-v=0");
    let mut server = Proc::spawn("holding server", cmd, &dir.join("holder.log"))?;
    wait_http_ok(&mut server, health, "/healthz", Duration::from_secs(30)).await?;
    Ok((Holder { server, health }, agent_port))
}

/// Waits until the client's server of a peer hop reaches an agent: it learns the agents the
/// other server holds over the peer link, about 100 ms after they connect, and answers "No
/// agent available" until then. One dial and echo every 20 ms, for at most 15 s.
async fn wait_for_peer_route(dialer: &Dialer, system: &System) -> anyhow::Result<()> {
    const BOUND: Duration = Duration::from_secs(15);
    let deadline = Instant::now() + BOUND;
    loop {
        let attempt = async {
            let mut s = dialer.dial_timeout(Duration::from_secs(5)).await?;
            crate::target::echo_start(&mut s, b"hop?").await
        };
        let error = match tokio::time::timeout(Duration::from_secs(5), attempt).await {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(e)) => format!("{e:#}"),
            Err(_) => "echo timed out".to_owned(),
        };
        if Instant::now() > deadline {
            bail!(
                "{}: the client's server reached no agent over the peer link within {BOUND:?}: {error}",
                system.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn client_tls(
    ca: &Path,
    cert: &Path,
    key: &Path,
    alpn: &[u8],
) -> anyhow::Result<Arc<rustls::ClientConfig>> {
    Ok(tether_tls::client_config(
        ca,
        Some((cert, key)),
        vec![alpn.to_vec()],
        &TlsOptions::default(),
    )?)
}
