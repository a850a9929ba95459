//! A fleet of tether servers peered with each other on loopback (server peering), with no
//! agent of their own: the fleet workload connects fake agents to them. Server `n` (1, 2,
//! 3…) listens for agents and peers on 127.0.0.`n+1` and serves gRPC clients on a Unix
//! socket of its own; every server lists every peer address, its own among them.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use tether_client::{GrpcClient, Transport};

use super::dialer::Dialer;
use super::env::Env;
use super::konnectivity::{flag, server_flags};
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
    pub proc: Proc,
    /// Its health port on 127.0.0.1 (metrics).
    pub health: u16,
    /// Where agents connect.
    pub agents: SocketAddr,
    /// Its gRPC frontend.
    pub uds: PathBuf,
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

/// The servers of a fleet, started and linked.
#[derive(Debug)]
pub struct Fleet {
    pub members: Vec<Member>,
    /// Its scratch directory (sockets, logs).
    pub dir: PathBuf,
}

/// The system the fleet's figures are filed under.
pub const FLEET_SYSTEM: System = System::Konn(Impl::TetherPeer, Frontend::GrpcUds);

/// The loopback address of server `n` (0-based): 127.0.0.2, .3, …
fn address(n: usize) -> IpAddr {
    IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2 + n as u8))
}

impl Fleet {
    /// Starts `size` tether servers peered with each other and waits until each has its
    /// links to every other, both ways. Every server runs the `destHost,default` strategies
    /// (so that an agent advertising an address is dialed by it) and
    /// `--agent-identity-binding=off` (the run's one agent certificate proves no address).
    pub async fn start(env: &Env, size: usize) -> anyhow::Result<Fleet> {
        anyhow::ensure!((1..=250).contains(&size), "a fleet of 1 to 250 servers");
        let dir = env.instance_dir(&FLEET_SYSTEM)?;
        let pki = &env.pki;
        let peer_ports = (0..size)
            .map(|_| free_port())
            .collect::<anyhow::Result<Vec<_>>>()?;
        let peers = peer_ports
            .iter()
            .enumerate()
            .map(|(n, port)| SocketAddr::new(address(n), *port).to_string())
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::with_capacity(size);
        for (n, peer_port) in peer_ports.iter().enumerate() {
            let (agent_port, health, admin) = (free_port()?, free_port()?, free_port()?);
            let ip = address(n);
            let uds = dir.join(format!("server-{}.sock", n + 1));
            let mut cmd = tokio::process::Command::new(&env.bins.tether);
            cmd.arg("server")
                .arg("--mode=grpc")
                .arg(flag("uds-name", &uds))
                .arg("--server-port=0")
                .args(server_flags(pki, ip, agent_port, health, admin))
                .arg(flag("server-count", size.to_string()))
                .arg(flag("server-id", format!("fleet-{}", n + 1)))
                .arg("--proxy-strategies=destHost,default")
                .arg("--agent-identity-binding=off")
                .arg(flag("peer-bind-address", ip.to_string()))
                .arg(flag("peer-port", peer_port.to_string()))
                .arg(flag("peer-cert-file", &pki.peer_cert))
                .arg(flag("peer-key-file", &pki.peer_key))
                .arg(flag("peer-ca-cert", &pki.ca_cert))
                .arg(flag("peer-addresses", &peers))
                .arg("-v=0");
            let role = format!("fleet server {}", n + 1);
            let log = dir.join(format!("server-{}.log", n + 1));
            let mut proc = Proc::spawn(&role, cmd, &log)?;
            wait_http_ok(&mut proc, health, "/healthz", Duration::from_secs(30)).await?;
            members.push(Member {
                proc,
                health,
                agents: SocketAddr::new(ip, agent_port),
                uds,
            });
        }
        let fleet = Fleet { members, dir };
        let others = (size - 1) as f64;
        fleet
            .wait_until(
                Duration::from_secs(30),
                "every peer link, both ways",
                |_, c| c.links_in == others && c.links_out == others,
            )
            .await?;
        Ok(fleet)
    }

    /// What server `n` counts now.
    pub async fn counts(&self, n: usize) -> anyhow::Result<Counts> {
        let body = http_get(self.members[n].health, "/metrics").await?.1;
        let get = |name, label| metric_sum(&body, name, label).unwrap_or(0.0);
        Ok(Counts {
            streams: get(GRPC_STREAMS, r#"service_method="Connect""#),
            agents: get(READY_BACKENDS, ""),
            remote: get(PEER_AGENTS, ""),
            links_in: get(PEER_LINKS, r#"direction="in""#),
            links_out: get(PEER_LINKS, r#"direction="out""#),
            pending_dials: get(PENDING_DIALS, ""),
            established: get(ESTABLISHED, ""),
        })
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

    /// A gRPC client of server `n`'s frontend, dialing `target`.
    pub async fn dialer(&self, n: usize, target: &str) -> anyhow::Result<Dialer> {
        let transport = Transport::Unix(self.members[n].uds.clone());
        let client = tokio::time::timeout(Duration::from_secs(10), GrpcClient::connect(&transport))
            .await
            .context("gRPC frontend connect timed out")??;
        Ok(Dialer::Grpc(client, target.to_owned()))
    }

    /// Every server's RSS together.
    pub fn rss(&self) -> u64 {
        self.members.iter().map(|m| m.proc.rss()).sum()
    }

    /// Every server's CPU seconds so far together.
    pub fn cpu_seconds(&self) -> f64 {
        self.members.iter().map(|m| m.proc.cpu_seconds()).sum()
    }

    /// Fails if a server has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        for m in &mut self.members {
            m.proc.check_alive()?;
        }
        Ok(())
    }

    pub async fn stop(self) {
        for m in self.members {
            m.proc.stop().await;
        }
    }
}
