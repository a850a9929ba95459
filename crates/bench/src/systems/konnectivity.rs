//! tether and upstream Konnectivity: the same flags (tether is a drop-in), the same
//! certificates, server and agent as separate processes, server↔agent over mutual TLS.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tether_client::{GrpcClient, Transport};
use tether_tls::TlsOptions;
use tokio::process::Command;

use super::dialer::Dialer;
use super::env::{Binaries, Env};
use super::loopback::{free_port, wait_http_ok};
use super::running::Running;
use super::system::{Frontend, Impl, System};
use crate::procs::Proc;

impl Impl {
    /// Whether this implementation's server has tether's connection caps, among them
    /// `--max-streams-per-frontend-connection` (upstream has none; grpc-go's default leaves
    /// the streams of a connection unlimited).
    pub fn has_caps(&self, bins: &Binaries) -> bool {
        match self {
            Impl::Tether | Impl::TetherH2 | Impl::TetherWs => true,
            Impl::TetherBefore => bins.before_has_caps,
            Impl::Upstream => false,
        }
    }
}

impl Frontend {
    fn mode(&self) -> &'static str {
        match self {
            Frontend::HttpConnectUds | Frontend::HttpConnectTls => "http-connect",
            Frontend::GrpcUds | Frontend::GrpcTls => "grpc",
        }
    }

    fn is_uds(&self) -> bool {
        matches!(self, Frontend::HttpConnectUds | Frontend::GrpcUds)
    }
}

fn command(env: &Env, imp: Impl, role: &str) -> Command {
    match imp {
        Impl::Tether | Impl::TetherH2 | Impl::TetherWs | Impl::TetherBefore => {
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

fn flag(name: &str, value: impl AsRef<std::ffi::OsStr>) -> std::ffi::OsString {
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
    cmd.arg("--agent-bind-address=127.0.0.1")
        .arg(flag("agent-port", agent_port.to_string()))
        .arg("--health-bind-address=127.0.0.1")
        .arg(flag("health-port", health_port.to_string()))
        .arg("--admin-bind-address=127.0.0.1")
        .arg(flag("admin-port", admin_port.to_string()))
        .arg(flag("cluster-cert", &pki.server_cert))
        .arg(flag("cluster-key", &pki.server_key))
        .arg(flag("cluster-ca-cert", &pki.ca_cert))
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

    let cut_relay = if agent == AgentLink::CutRelay {
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.args([
            "relay",
            "--listen",
            "127.0.0.1:0",
            "--cut-on-sigusr1",
            "--to",
        ])
        .arg(format!("127.0.0.1:{agent_port}"));
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
            .map_or(agent_port, |(_, addr)| addr.port());
        let id = if agent_count == 1 {
            "bench-agent".to_owned()
        } else {
            format!("bench-agent-{i}")
        };
        let mut cmd = command(env, imp, "agent");
        cmd.arg("--proxy-server-host=127.0.0.1")
            .arg(flag("proxy-server-port", server_port.to_string()))
            .arg(flag("ca-cert", &pki.ca_cert))
            .arg(flag("agent-cert", &pki.agent_cert))
            .arg(flag("agent-key", &pki.agent_key))
            .arg("--health-server-host=127.0.0.1")
            .arg(flag("health-server-port", a_health.to_string()))
            .arg("--admin-bind-address=127.0.0.1")
            .arg(flag("admin-server-port", a_admin.to_string()))
            .arg(flag("agent-id", &id))
            .arg("-v=0");
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
        wait_http_ok(&mut server, health_port, "/readyz", Duration::from_secs(30)).await?;
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
    Ok(Running {
        system,
        dialer,
        server: Some(server),
        agents,
        server_health: Some(health_port),
        agent_port: Some(agent_port),
        cut_relay: cut_relay.map(|(relay, _)| relay),
    })
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
