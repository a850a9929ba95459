//! The systems under test: how each is started as real processes on loopback, how a
//! workload dials through it, and which processes to sample.

mod konnectivity;
mod rathole;
mod relay;
mod ssh;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tether_client::{GrpcClient, Transport};
use tether_tls::pki::PkiFiles;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::procs::Proc;
use crate::target::{self, BoxStream};

use konnectivity::AgentLink;
pub use konnectivity::{Frontend, Impl};
pub use rathole::{INSTALL as RATHOLE_INSTALL, VERSION as RATHOLE_VERSION};

/// One system under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum System {
    /// Straight TCP to the target: the limit of one socket.
    Direct,
    /// Two `tether-bench relay` processes in series, the limit of a two-hop proxy chain;
    /// with `tls`, the leg between them is mutual TLS like tether's agent link.
    RelayLimit { tls: bool },
    /// A Konnectivity implementation (server + one agent) with one frontend shape.
    Konn(Impl, Frontend),
    /// `ssh -L`: the client listens, sshd dials the target.
    SshL,
    /// `ssh -R`: sshd listens, the client dials the target (a reverse tunnel, like an agent).
    SshR,
    /// rathole server + client with Noise: another reverse tunnel.
    Rathole,
}

impl System {
    /// Every system, in report order.
    pub fn all() -> Vec<System> {
        let mut v = vec![
            System::Direct,
            System::RelayLimit { tls: false },
            System::RelayLimit { tls: true },
        ];
        for imp in [Impl::Tether, Impl::TetherBefore, Impl::Upstream] {
            for f in Frontend::ALL {
                v.push(System::Konn(imp, f));
            }
        }
        v.push(System::SshL);
        v.push(System::SshR);
        v.push(System::Rathole);
        v
    }

    pub fn name(&self) -> String {
        match self {
            System::Direct => "direct".into(),
            System::RelayLimit { tls: false } => "relay-limit".into(),
            System::RelayLimit { tls: true } => "relay-limit-tls".into(),
            System::Konn(i, f) => format!("{} {}", i.name(), f.name()),
            System::SshL => "ssh -L".into(),
            System::SshR => "ssh -R".into(),
            System::Rathole => "rathole".into(),
        }
    }

    /// A short file-name-safe id.
    pub fn id(&self) -> String {
        self.name().replace(" -", "-").replace([' ', '/'], "-")
    }

    /// The same shape on upstream, for tether's ratios.
    pub fn upstream_peer(&self) -> Option<System> {
        match self {
            System::Konn(Impl::Tether | Impl::TetherBefore, f) => {
                Some(System::Konn(Impl::Upstream, *f))
            }
            _ => None,
        }
    }

    /// The same shape on the earlier tether build, for before/after ratios.
    pub fn before_peer(&self) -> Option<System> {
        match self {
            System::Konn(Impl::Tether, f) => Some(System::Konn(Impl::TetherBefore, *f)),
            _ => None,
        }
    }

    /// The relay anchors a system is compared with: both for every proxy, the plain one for
    /// the TLS relay (what TLS on one leg costs), none for direct and the plain relay.
    pub fn relay_anchors(&self) -> [Option<System>; 2] {
        let (plain, tls) = (
            System::RelayLimit { tls: false },
            System::RelayLimit { tls: true },
        );
        match self {
            System::Direct | System::RelayLimit { tls: false } => [None, None],
            System::RelayLimit { tls: true } => [Some(plain), None],
            _ => [Some(plain), Some(tls)],
        }
    }

    pub fn is_tether(&self) -> bool {
        matches!(self, System::Konn(Impl::Tether, _))
    }

    pub fn has_processes(&self) -> bool {
        !matches!(self, System::Direct)
    }

    /// Parses a name as printed by [`System::name`] or [`System::id`].
    pub fn parse(s: &str) -> Option<System> {
        System::all()
            .into_iter()
            .find(|sys| sys.name() == s || sys.id() == s)
    }
}

/// Binaries the systems run.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub tether: PathBuf,
    /// The earlier tether build of the `tether-before` systems, when given.
    pub tether_before: Option<PathBuf>,
    /// Whether that build has tether's connection caps (so the bench lifts them as for tether).
    pub before_has_caps: bool,
    pub upstream_server: PathBuf,
    pub upstream_agent: PathBuf,
    pub sshd: PathBuf,
    pub ssh: PathBuf,
    pub ssh_keygen: PathBuf,
    pub rathole: PathBuf,
}

/// What every system shares in one benchmark run.
#[derive(Debug)]
pub struct Env {
    /// Scratch directory (sockets, configs, logs).
    pub dir: PathBuf,
    pub pki: PkiFiles,
    pub bins: Binaries,
    /// The target process's address.
    pub target: SocketAddr,
    /// Instances started so far, to give each its own directory.
    pub started: std::sync::atomic::AtomicUsize,
}

impl Env {
    pub fn instance_dir(&self, system: &System) -> anyhow::Result<PathBuf> {
        let n = self
            .started
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.dir.join(format!("{n:03}-{}", system.id()));
        std::fs::create_dir_all(&dir)?;
        Ok(dir)
    }
}

/// How a workload opens a connection to the target through a system.
#[derive(Clone, Debug)]
pub enum Dialer {
    /// Plain TCP to an address: the target itself, or an SSH forward.
    Tcp(SocketAddr),
    HttpConnect(Transport, String),
    Grpc(GrpcClient, String),
}

impl Dialer {
    pub async fn dial(&self) -> anyhow::Result<BoxStream> {
        Ok(match self {
            Dialer::Tcp(addr) => {
                let s = TcpStream::connect(addr).await?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
            Dialer::HttpConnect(transport, addr) => {
                Box::new(tether_client::dial_http_connect(transport, addr).await?)
            }
            Dialer::Grpc(client, addr) => Box::new(client.dial(addr).await?),
        })
    }

    /// The same way through the system, to another target. A TCP dialer's address is the
    /// system's entry (an SSH forward, a relay), which fixes the target itself.
    pub fn aimed_at(&self, target: SocketAddr) -> anyhow::Result<Dialer> {
        Ok(match self {
            Dialer::Tcp(_) => bail!("a plain TCP entry cannot be aimed at another target"),
            Dialer::HttpConnect(transport, _) => {
                Dialer::HttpConnect(transport.clone(), target.to_string())
            }
            Dialer::Grpc(client, _) => Dialer::Grpc(client.clone(), target.to_string()),
        })
    }

    /// Dial with a deadline.
    pub async fn dial_timeout(&self, timeout: Duration) -> anyhow::Result<BoxStream> {
        match tokio::time::timeout(timeout, self.dial()).await {
            Ok(r) => r,
            Err(_) => bail!("dial timed out after {timeout:?}"),
        }
    }
}

/// A started system.
#[derive(Debug)]
pub struct Running {
    pub system: System,
    pub dialer: Dialer,
    /// The proxy server (or sshd, or relay A); `None` for direct.
    pub server: Option<Proc>,
    /// The agents (or the ssh client, or relay B): one, except none for direct and for a lone
    /// server, and several in the scale workload.
    pub agents: Vec<Proc>,
    /// Health port of a Konnectivity server, for its metrics.
    pub server_health: Option<u16>,
    /// Agent port of a Konnectivity server (fake agents connect there).
    pub agent_port: Option<u16>,
    /// The relay between agent and server that [`cut`](Self::cut) cuts (resume workload).
    pub cut_relay: Option<Proc>,
}

impl Running {
    /// Starts `system` with one agent (or its SSH forward).
    pub async fn start(env: &Env, system: System) -> anyhow::Result<Running> {
        let running = match system {
            System::Direct => Running {
                system,
                dialer: Dialer::Tcp(env.target),
                server: None,
                agents: Vec::new(),
                server_health: None,
                agent_port: None,
                cut_relay: None,
            },
            System::RelayLimit { tls } => relay::start(env, system, tls).await?,
            System::Konn(i, f) => {
                konnectivity::start(env, i, f, AgentLink::Direct(1), None).await?
            }
            System::SshL | System::SshR => ssh::start(env, system).await?,
            System::Rathole => rathole::start(env, system).await?,
        };
        running.check_end_to_end().await?;
        Ok(running)
    }

    /// Starts a Konnectivity system with `agents` agents, each with its own ID, and waits
    /// until the server counts all of them (scale).
    pub async fn start_scaled(env: &Env, system: System, agents: usize) -> anyhow::Result<Running> {
        let System::Konn(imp, frontend) = system else {
            bail!("{} has no agents to scale", system.name());
        };
        let running =
            konnectivity::start(env, imp, frontend, AgentLink::Direct(agents), None).await?;
        running
            .wait_for_agents(
                |counted| counted >= agents,
                &format!("{agents} agents"),
                Duration::from_secs(30),
            )
            .await?;
        running.check_end_to_end().await?;
        Ok(running)
    }

    /// Starts a Konnectivity system with one agent whose server allows `cap` concurrent
    /// streams per frontend connection (reusable tunnel). Upstream has no such flag and
    /// ignores it; [`Impl::has_caps`] says which servers take it.
    pub async fn start_with_stream_cap(
        env: &Env,
        system: System,
        cap: u32,
    ) -> anyhow::Result<Running> {
        let System::Konn(imp, frontend) = system else {
            bail!("{} has no frontend stream cap", system.name());
        };
        let running =
            konnectivity::start(env, imp, frontend, AgentLink::Direct(1), Some(cap)).await?;
        running.check_end_to_end().await?;
        Ok(running)
    }

    /// Starts a Konnectivity server with no agent (fan-in).
    pub async fn start_lone_server(env: &Env, imp: Impl) -> anyhow::Result<Running> {
        konnectivity::start(env, imp, Frontend::HttpConnectUds, AgentLink::None, None).await
    }

    /// Starts a Konnectivity system whose agent reaches the server through a relay the
    /// workload can cut (resume).
    pub async fn start_with_cut_relay(env: &Env, system: System) -> anyhow::Result<Running> {
        let System::Konn(imp, frontend) = system else {
            bail!("{} has no agent link to cut", system.name());
        };
        let running = konnectivity::start(env, imp, frontend, AgentLink::CutRelay, None).await?;
        running.check_end_to_end().await?;
        Ok(running)
    }

    /// Closes every connection through the agent's relay, as a middlebox dropping flows.
    pub fn cut(&self) -> anyhow::Result<()> {
        let relay = self.cut_relay.as_ref().context("no relay to cut")?;
        let pid = rustix::process::Pid::from_raw(relay.pid as i32).context("relay pid")?;
        rustix::process::kill_process(pid, rustix::process::Signal::USR1)
            .context("signalling the relay")?;
        Ok(())
    }

    /// One echo through the system, retried for a few seconds: an agent may be ready a
    /// moment after its health endpoint says so.
    async fn check_end_to_end(&self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let attempt = async {
                let mut s = self.dialer.dial_timeout(Duration::from_secs(5)).await?;
                target::echo_start(&mut s, b"ready?").await
            };
            match tokio::time::timeout(Duration::from_secs(5), attempt).await {
                Ok(Ok(())) => return Ok(()),
                Ok(Err(e)) if Instant::now() > deadline => {
                    return Err(e).context(format!("{} does not tunnel", self.system.name()));
                }
                Err(_) if Instant::now() > deadline => {
                    bail!("{} does not tunnel (echo timed out)", self.system.name())
                }
                _ => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Fails if a process of the system has died.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        if let Some(p) = &mut self.server {
            p.check_alive()?;
        }
        for p in &mut self.agents {
            p.check_alive()?;
        }
        Ok(())
    }

    pub fn server_rss(&self) -> Option<u64> {
        self.server.as_ref().map(Proc::rss)
    }

    pub fn server_rss_anon(&self) -> Option<u64> {
        self.server.as_ref().map(Proc::rss_anon)
    }

    /// Of every agent together.
    pub fn agent_rss_anon(&self) -> Option<u64> {
        (!self.agents.is_empty()).then(|| self.agents.iter().map(Proc::rss_anon).sum())
    }

    /// Of every agent together.
    pub fn agent_rss(&self) -> Option<u64> {
        (!self.agents.is_empty()).then(|| self.agents.iter().map(Proc::rss).sum())
    }

    /// CPU seconds of the server so far.
    pub fn server_cpu_seconds(&self) -> Option<f64> {
        self.server.as_ref().map(Proc::cpu_seconds)
    }

    /// CPU seconds of server + agents so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        if self.server.is_none() && self.agents.is_empty() {
            return None;
        }
        Some(
            self.server.as_ref().map_or(0.0, Proc::cpu_seconds)
                + self.agents.iter().map(Proc::cpu_seconds).sum::<f64>(),
        )
    }

    /// How many agents the Konnectivity server counts ready (its gauge), if it has metrics.
    pub async fn agents_counted(&self) -> Option<usize> {
        self.server_metric(READY_BACKENDS).await.map(|c| c as usize)
    }

    /// Waits until the server's count of ready agents satisfies `done` (`wanted` names it
    /// for the error), polling its gauge.
    pub async fn wait_for_agents(
        &self,
        done: impl Fn(usize) -> bool,
        wanted: &str,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let counted = self.agents_counted().await.unwrap_or(0);
            if done(counted) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the server counts {counted} agents after {timeout:?}, waiting for {wanted}");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Reads one gauge or counter from the server's Prometheus metrics (every series of it
    /// added up).
    pub async fn server_metric(&self, name: &str) -> Option<f64> {
        self.server_metric_where(name, "").await
    }

    /// Reads one gauge or counter from the server's Prometheus metrics, adding up the series
    /// whose labels contain `label` (e.g. `service_method="Proxy"`).
    pub async fn server_metric_where(&self, name: &str, label: &str) -> Option<f64> {
        let port = self.server_health?;
        let body = http_get(port, "/metrics").await.ok()?.1;
        metric_sum(&body, name, label)
    }

    pub async fn stop(self) {
        for p in self.agents {
            p.stop().await;
        }
        if let Some(p) = self.cut_relay {
            p.stop().await;
        }
        if let Some(p) = self.server {
            p.stop().await;
        }
    }
}

/// The Konnectivity server's gauge of connected agents (upstream's name, which tether keeps).
const READY_BACKENDS: &str = "konnectivity_network_proxy_server_ready_backend_connections";

/// The Konnectivity server's gauge of open gRPC streams, by `service_method` (`Proxy` for
/// the frontend's; upstream's name, which tether keeps).
pub const GRPC_STREAMS: &str = "konnectivity_network_proxy_server_grpc_connections";

/// The sum of `name`'s series in a Prometheus text exposition whose labels contain `label`.
fn metric_sum(body: &str, name: &str, label: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            let (bare, labels) = key.split_once('{').unwrap_or((key, ""));
            (bare == name && labels.contains(label)).then(|| value.parse::<f64>().ok())?
        })
        .reduce(|a, b| a + b)
}

/// Client TLS config with the agent's certificate, for fake agents.
pub fn konnectivity_agent_tls(env: &Env) -> anyhow::Result<std::sync::Arc<rustls::ClientConfig>> {
    konnectivity::client_tls(&env.pki.ca_cert, &env.pki.agent_cert, &env.pki.agent_key)
}

/// A free TCP port on 127.0.0.1 (bound and released; good enough on a quiet loopback).
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// A minimal HTTP/1.0 GET on 127.0.0.1: (status, body).
pub async fn http_get(port: u16, path: &str) -> anyhow::Result<(u16, String)> {
    let work = async {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status = text
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("no HTTP status")?;
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_owned())
            .unwrap_or_default();
        anyhow::Ok((status, body))
    };
    tokio::time::timeout(Duration::from_secs(5), work)
        .await
        .context("HTTP GET timed out")?
}

/// Waits until `GET path` answers 200, failing early if `proc` dies.
pub async fn wait_http_ok(
    proc: &mut Proc,
    port: u16,
    path: &str,
    timeout: Duration,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        proc.check_alive()?;
        if let Ok((200, _)) = http_get(port, path).await {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "{} not ready: GET 127.0.0.1:{port}{path} did not answer 200 within {timeout:?}; log tail:\n{}",
                proc.role,
                crate::procs::log_tail(&proc.log)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until 127.0.0.1:`port` accepts TCP connections, failing early if `proc` dies.
pub async fn wait_port(proc: &mut Proc, port: u16) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        proc.check_alive()?;
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            bail!("{} did not listen on {port}", proc.role);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_summed_over_the_series_with_the_label() {
        let body = "# HELP konnectivity_network_proxy_server_grpc_connections streams\n\
            konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"} 1\n\
            konnectivity_network_proxy_server_grpc_connections{service_method=\"Proxy\"} 964\n\
            konnectivity_network_proxy_server_grpc_connections_other{service_method=\"Proxy\"} 7\n";
        let proxy = r#"service_method="Proxy""#;
        assert_eq!(metric_sum(body, GRPC_STREAMS, proxy), Some(964.0));
        assert_eq!(metric_sum(body, GRPC_STREAMS, ""), Some(965.0));
        assert_eq!(metric_sum(body, READY_BACKENDS, ""), None);
    }
}
