//! A fleet of tether servers peered with each other on loopback (server peering), with no
//! agent of their own: the fleet workload connects fake agents to them, the soak real ones.
//! Server `n` (1, 2, 3…) listens for agents and peers on 127.0.0.`n+1` and serves its
//! clients (gRPC or HTTP CONNECT) on a Unix socket of its own; every server lists every peer
//! address, its own among them. A member can be killed, frozen and started again on the
//! same ports.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use tether_client::{GrpcClient, Transport};
use tether_tls::pki::PkiFiles;

use super::dialer::Dialer;
use super::env::Env;
use super::konnectivity::{client_tls, flag, server_flags};
use super::loopback::{free_port, http_get, wait_http_ok};
use super::running::{GRPC_STREAMS, READY_BACKENDS, metric_sum};
use super::system::{Frontend, Impl, System};
use crate::procs::Proc;

/// Peer links each way, by direction (`in`: the peer offers its agents; `out`: this server
/// offers its own).
const PEER_LINKS: &str = "tether_server_peer_links";
/// A server's dials waiting for an answer, and its connections open end to end.
const PENDING_DIALS: &str = "konnectivity_network_proxy_server_pending_backend_dials";
const ESTABLISHED: &str = "konnectivity_network_proxy_server_established_connections";
/// Agents the peers hold and announced to this server.
const PEER_AGENTS: &str = "tether_server_peer_agents";

/// One server of the fleet.
#[derive(Debug)]
pub struct Member {
    /// `None` between a kill and its restart.
    pub proc: Option<Proc>,
    /// Its health port on 127.0.0.1 (metrics).
    pub health: u16,
    /// Its admin port on 127.0.0.1 (pprof, with --enable-profiling).
    pub admin: u16,
    /// Where agents connect.
    pub agents: SocketAddr,
    /// Upstream's proxy-server, not tether's.
    pub upstream: bool,
    /// Its frontend, and how its clients reach it.
    pub frontend: Frontend,
    transport: Transport,
    /// Its command line, to start it again.
    program: PathBuf,
    args: Vec<OsString>,
    role: String,
    log: PathBuf,
}

/// How the fleet's servers are started, beyond what every one has.
#[derive(Clone, Debug)]
pub struct Setup {
    /// Each server's frontend, in order; their number is the fleet's size. A TCP one listens
    /// on 127.0.0.1 with mutual TLS.
    pub frontends: Vec<Frontend>,
    /// Flags every server gets besides the fleet's own (a routing file, a reload interval).
    pub extra_flags: Vec<OsString>,
    /// The certificates the servers present and trust.
    pub pki: PkiFiles,
    /// How many of the servers, the last ones, are upstream's proxy-server in place of
    /// tether's: not peered (agents must reach them themselves), without tether's own flags
    /// (`extra_flags` among them).
    pub upstream: usize,
}

impl Setup {
    /// `size` gRPC servers with the run's certificates and nothing else: the fleet
    /// workload's.
    pub fn grpc(env: &Env, size: usize) -> Setup {
        Setup {
            frontends: vec![Frontend::GrpcUds; size],
            extra_flags: Vec::new(),
            pki: env.pki.clone(),
            upstream: 0,
        }
    }
}

/// What one server counts.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    /// Agent streams it holds (`grpc_connections{service_method="Connect"}`, every link).
    pub streams: f64,
    /// Distinct agents it holds itself (`ready_backend_connections`).
    pub agents: f64,
    /// Agents its peers announced to it (`tether_server_peer_agents`).
    pub remote: f64,
    pub links_in: f64,
    pub links_out: f64,
    /// Dials waiting for an agent's answer, and connections open end to end.
    pub pending_dials: f64,
    pub established: f64,
}

impl Counts {
    /// The counts in a server's metrics text.
    pub fn of(metrics: &str) -> Counts {
        let get = |name, label| metric_sum(metrics, name, label).unwrap_or(0.0);
        Counts {
            streams: get(GRPC_STREAMS, r#"service_method="Connect""#),
            agents: get(READY_BACKENDS, ""),
            remote: get(PEER_AGENTS, ""),
            links_in: get(PEER_LINKS, r#"direction="in""#),
            links_out: get(PEER_LINKS, r#"direction="out""#),
            pending_dials: get(PENDING_DIALS, ""),
            established: get(ESTABLISHED, ""),
        }
    }
}

/// The servers of a fleet, started and linked.
#[derive(Debug)]
pub struct Fleet {
    pub members: Vec<Member>,
    /// Its scratch directory (sockets, logs).
    pub dir: PathBuf,
}

/// The system the fleet's figures are filed under.
pub const FLEET_SYSTEM: System = System::Konn(Impl::TetherPeer, Frontend::GrpcUds);

/// The ID of server `n` (0-based): fleet-1, fleet-2, …
pub fn server_id(n: usize) -> String {
    format!("fleet-{}", n + 1)
}

/// The loopback address of server `n` (0-based): 127.0.0.2, .3, …
fn address(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + n as u8))
}

impl Fleet {
    /// Starts the servers of `setup`, tether's peered with each other, and waits until each
    /// has its links to every other, both ways (upstream's are not peered). Every server runs the
    /// `destHost,default` strategies (so that an agent advertising an address is dialed by
    /// it) and tether's `--agent-identity-binding=off` (the run's one agent certificate
    /// proves no address).
    pub async fn start(env: &Env, setup: &Setup) -> anyhow::Result<Fleet> {
        let size = setup.frontends.len();
        anyhow::ensure!((1..=250).contains(&size), "a fleet of 1 to 250 servers");
        let dir = env.instance_dir(&FLEET_SYSTEM)?;
        let pki = &setup.pki;
        let tethers = size - setup.upstream.min(size);
        let peer_ports = (0..size)
            .map(|_| free_port())
            .collect::<anyhow::Result<Vec<_>>>()?;
        let peers = peer_ports[..tethers]
            .iter()
            .enumerate()
            .map(|(n, port)| SocketAddr::new(address(n), *port).to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::with_capacity(size);
        for (n, (peer_port, frontend)) in peer_ports.iter().zip(&setup.frontends).enumerate() {
            let (agent_port, health, admin) = (free_port()?, free_port()?, free_port()?);
            let ip = address(n);
            let uds = dir.join(format!("server-{}.sock", n + 1));
            let upstream = n >= tethers;
            let (program, mut args): (PathBuf, Vec<OsString>) = if upstream {
                (env.bins.upstream_server.clone(), Vec::new())
            } else {
                (env.bins.tether.clone(), vec!["server".into()])
            };
            args.push(flag("mode", frontend.mode()));
            let transport = if frontend.is_uds() {
                args.extend([flag("uds-name", &uds), "--server-port=0".into()]);
                Transport::Unix(uds)
            } else {
                let port = free_port()?;
                args.extend([
                    "--server-bind-address=127.0.0.1".into(),
                    flag("server-port", port.to_string()),
                    flag("server-cert", &pki.server_cert),
                    flag("server-key", &pki.server_key),
                    flag("server-ca-cert", &pki.ca_cert),
                ]);
                Transport::Tls {
                    addr: format!("127.0.0.1:{port}"),
                    server_name: "127.0.0.1".into(),
                    tls: client_tls(&pki.ca_cert, &pki.client_cert, &pki.client_key, b"h2")?,
                }
            };
            args.extend(server_flags(pki, ip, agent_port, health, admin));
            args.extend([
                flag("server-count", size.to_string()),
                flag("server-id", server_id(n)),
                "--proxy-strategies=destHost,default".into(),
                "-v=0".into(),
            ]);
            if !upstream {
                args.extend([
                    "--agent-identity-binding=off".into(),
                    flag("peer-bind-address", ip.to_string()),
                    flag("peer-port", peer_port.to_string()),
                    flag("peer-cert-file", &pki.peer_cert),
                    flag("peer-key-file", &pki.peer_key),
                    flag("peer-ca-cert", &pki.ca_cert),
                    flag("peer-addresses", &peers),
                ]);
                args.extend(setup.extra_flags.iter().cloned());
            }
            let mut member = Member {
                proc: None,
                health,
                admin,
                agents: SocketAddr::new(ip, agent_port),
                upstream,
                frontend: *frontend,
                transport,
                program,
                args,
                role: format!("fleet server {}", n + 1),
                log: dir.join(format!("server-{}.log", n + 1)),
            };
            member.launch().await?;
            members.push(member);
        }
        let fleet = Fleet { members, dir };
        let others = tethers.saturating_sub(1) as f64;
        fleet
            .wait_until(
                Duration::from_secs(30),
                "every peer link, both ways",
                |n, c| n >= tethers || (c.links_in == others && c.links_out == others),
            )
            .await?;
        Ok(fleet)
    }

    /// What server `n` counts now.
    pub async fn counts(&self, n: usize) -> anyhow::Result<Counts> {
        Ok(Counts::of(&self.metrics(n).await?))
    }

    /// Server `n`'s metrics now (the Prometheus text).
    pub async fn metrics(&self, n: usize) -> anyhow::Result<String> {
        Ok(http_get(self.members[n].health, "/metrics").await?.1)
    }

    /// Every server's counts now, in order.
    pub async fn all_counts(&self) -> anyhow::Result<Vec<Counts>> {
        let mut all = Vec::with_capacity(self.members.len());
        for n in 0..self.members.len() {
            all.push(self.counts(n).await?);
        }
        Ok(all)
    }

    /// Polls every server's counts until `done(n, counts)` holds for each (`wanted` names it
    /// for the error), at most `timeout`.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        wanted: &str,
        done: impl Fn(usize, &Counts) -> bool,
    ) -> anyhow::Result<Vec<Counts>> {
        let deadline = Instant::now() + timeout;
        loop {
            let all = self.all_counts().await;
            if let Ok(all) = &all
                && all.iter().enumerate().all(|(n, c)| done(n, c))
            {
                return Ok(all.clone());
            }
            if Instant::now() > deadline {
                bail!("the fleet's servers did not reach {wanted} within {timeout:?}: {all:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// A client of server `n`'s frontend, dialing `target`: one gRPC connection, or a
    /// connection per dial for HTTP CONNECT.
    pub async fn dialer(&self, n: usize, target: &str) -> anyhow::Result<Dialer> {
        let member = &self.members[n];
        let transport = member.transport.clone();
        if !member.frontend.is_grpc() {
            return Ok(Dialer::HttpConnect(transport, target.to_owned()));
        }
        let client = tokio::time::timeout(Duration::from_secs(10), GrpcClient::connect(&transport))
            .await
            .context("gRPC frontend connect timed out")??;
        Ok(Dialer::Grpc(client, target.to_owned()))
    }

    /// Every server's RSS together.
    pub fn rss(&self) -> u64 {
        self.procs().map(Proc::rss).sum()
    }

    /// Every server's CPU seconds so far together.
    pub fn cpu_seconds(&self) -> f64 {
        self.procs().map(Proc::cpu_seconds).sum()
    }

    /// Fails if a server has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            if let Some(proc) = &mut m.proc {
                proc.check_alive()?;
            }
        }
        Ok(())
    }

    pub async fn stop(self) {
        for mut m in self.members {
            m.kill().await;
        }
    }

    fn procs(&self) -> impl Iterator<Item = &Proc> {
        self.members.iter().filter_map(|m| m.proc.as_ref())
    }
}

impl Member {
    /// Starts the server (again, on the same ports) and waits until it is healthy.
    pub async fn launch(&mut self) -> anyhow::Result<()> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args);
        let mut proc = Proc::spawn(&self.role, cmd, &self.log)?;
        wait_http_ok(&mut proc, self.health, "/healthz", Duration::from_secs(30)).await?;
        self.proc = Some(proc);
        Ok(())
    }

    /// kill -9, reaped.
    pub async fn kill(&mut self) {
        if let Some(proc) = self.proc.take() {
            proc.stop().await;
        }
    }

    /// Where its output goes.
    pub fn log(&self) -> &std::path::Path {
        &self.log
    }

    /// How a client reaches its frontend.
    pub fn transport(&self) -> &Transport {
        &self.transport
    }

    /// The process now, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().map(|p| p.pid)
    }
}
