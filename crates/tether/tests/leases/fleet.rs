//! A fleet of proxy servers (tether's or upstream's) behind one loopback balancer, agents
//! dialing the balancer, and the Leases they share in a real kube-apiserver.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

use tether_testkit::Pki;
use tether_testkit::balancer::LoadBalancer;
use tether_testkit::control_plane::{ControlPlane, ControlPlaneOptions};
use tether_testkit::http::metric_value;
use tether_testkit::process::{Frontend, Process, free_port, server_flags};

/// Bound for any single step: catches hangs without asserting speed.
pub(crate) const STEP: Duration = Duration::from_secs(90);

/// Short Lease timings for tether servers, so that a killed one expires within seconds.
pub(crate) const FAST_LEASES: &[&str] = &["--lease-duration=4s", "--lease-renew-interval=1s"];

/// Which implementation a process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Tether,
    Upstream,
}

fn tether() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tether"))
}

/// A server or agent process; killed when dropped.
#[derive(Debug)]
pub(crate) struct Member {
    pub(crate) kind: Kind,
    process: Process,
    /// The agent port (servers only).
    pub(crate) agent_addr: Option<SocketAddr>,
}

impl Member {
    async fn spawn(
        kind: Kind,
        bin: &Path,
        args: Vec<String>,
        health: SocketAddr,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            kind,
            process: Process::spawn(bin, args, health).await?,
            agent_addr: None,
        })
    }

    pub(crate) fn health(&self) -> SocketAddr {
        self.process.health
    }

    pub(crate) async fn signal(&self, name: &str) -> anyhow::Result<()> {
        self.process.signal(name).await
    }

    pub(crate) async fn wait(&mut self) -> anyhow::Result<Option<i32>> {
        self.process.wait(STEP).await
    }

    pub(crate) async fn metric(&self, sample: &str) -> Option<f64> {
        metric_value(&self.process.metrics().await.ok()?, sample)
    }
}

/// The control plane, the servers' PKI and the balancer in front of the servers.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(crate) plane: ControlPlane,
    pki: Pki,
    pub(crate) lb: LoadBalancer,
    /// Servers by ID, in the balancer while present.
    pub(crate) servers: Vec<(String, Member)>,
    dir: tempfile::TempDir,
}

impl Fleet {
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
        Ok(Self {
            plane,
            pki: Pki::generate()?,
            lb: LoadBalancer::start(Vec::new()).await?,
            servers: Vec::new(),
            dir: tempfile::tempdir()?,
        })
    }

    fn kubeconfig(&self) -> String {
        format!("--kubeconfig={}", self.plane.kubeconfig.display())
    }

    /// Starts a server with the Lease controller, waits until it is healthy, and adds it to
    /// the balancer. A tether server publishes its agent address in its Lease, which
    /// upstream's agents ignore.
    pub(crate) async fn add_server(
        &mut self,
        kind: Kind,
        id: &str,
        extra: &[&str],
    ) -> anyhow::Result<()> {
        let (agent, health, admin) = (free_port(), free_port(), free_port());
        let socket = self.dir.path().join(format!("{id}.sock"));
        let mut args = server_flags(
            &self.pki,
            &Frontend::GrpcUds(socket),
            None,
            [agent, health, admin],
        );
        args.extend([
            format!("--server-id={id}"),
            "--enable-lease-controller".into(),
            self.kubeconfig(),
        ]);
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let bin = match kind {
            Kind::Tether => {
                args.insert(0, "server".into());
                if !extra.contains(&"--enable-lease-controller=false") {
                    args.push(format!("--lease-agent-address=127.0.0.1:{agent}"));
                }
                tether()
            }
            Kind::Upstream => tether_testkit::process::upstream_bin("proxy-server"),
        };
        let health = SocketAddr::from(([127, 0, 0, 1], health));
        let mut member = Member::spawn(kind, &bin, args, health).await?;
        member.agent_addr = Some(SocketAddr::from(([127, 0, 0, 1], agent)));
        tether_testkit::http::wait_for_200(health, "/healthz", STEP).await?;
        self.servers.push((id.to_owned(), member));
        self.update_balancer();
        Ok(())
    }

    /// The flags of a tether server that peers by Lease: the PKI's peer certificate, a
    /// peer port of its own on 127.0.0.1, published in its Lease.
    pub(crate) fn peer_flags(&self) -> Vec<String> {
        let f = &self.pki.files;
        let port = free_port();
        vec![
            format!("--peer-port={port}"),
            "--peer-bind-address=127.0.0.1".into(),
            format!("--peer-cert-file={}", f.peer_cert.display()),
            format!("--peer-key-file={}", f.peer_key.display()),
            format!("--peer-ca-cert={}", f.ca_cert.display()),
            format!("--lease-peer-address=127.0.0.1:{port}"),
        ]
    }

    /// Server `id`'s frontend socket.
    pub(crate) fn socket(&self, id: &str) -> PathBuf {
        self.dir.path().join(format!("{id}.sock"))
    }

    /// Takes a server out of the balancer and returns it (to stop or kill).
    pub(crate) fn remove_server(&mut self, id: &str) -> Member {
        let i = self
            .servers
            .iter()
            .position(|(s, _)| s == id)
            .expect("server in the fleet");
        let (_, member) = self.servers.remove(i);
        self.update_balancer();
        member
    }

    fn update_balancer(&self) {
        let ids: Vec<&str> = self.servers.iter().map(|(id, _)| id.as_str()).collect();
        self.balance(&ids);
    }

    /// Puts only these servers in the balancer.
    pub(crate) fn balance(&self, ids: &[&str]) {
        self.lb.set_backends(
            self.servers
                .iter()
                .filter(|(id, _)| ids.contains(&id.as_str()))
                .filter_map(|(_, m)| m.agent_addr)
                .collect(),
        );
    }

    pub(crate) fn server(&self, id: &str) -> &Member {
        &self
            .servers
            .iter()
            .find(|(s, _)| s == id)
            .expect("server in the fleet")
            .1
    }

    /// Starts an agent dialing the balancer and counting server Leases.
    pub(crate) async fn agent(&self, kind: Kind, extra: &[&str]) -> anyhow::Result<Member> {
        let f = &self.pki.files;
        let (health, admin) = (free_port(), free_port());
        let mut args = vec![
            format!("--proxy-server-host={}", self.lb.addr.ip()),
            format!("--proxy-server-port={}", self.lb.addr.port()),
            format!("--ca-cert={}", f.ca_cert.display()),
            format!("--agent-cert={}", f.agent_cert.display()),
            format!("--agent-key={}", f.agent_key.display()),
            "--health-server-host=127.0.0.1".into(),
            format!("--health-server-port={health}"),
            format!("--admin-server-port={admin}"),
            "--sync-interval=100ms".into(),
            "--sync-interval-cap=1s".into(),
            "--count-server-leases".into(),
            self.kubeconfig(),
        ];
        args.extend(extra.iter().map(|s| (*s).to_owned()));
        let bin = match kind {
            Kind::Tether => {
                args.insert(0, "agent".into());
                args.push("--lease-poll-interval=500ms".into());
                tether()
            }
            Kind::Upstream => tether_testkit::process::upstream_bin("proxy-agent"),
        };
        let health = SocketAddr::from(([127, 0, 0, 1], health));
        let member = Member::spawn(kind, &bin, args, health).await?;
        tether_testkit::http::wait_for_200(health, "/healthz", STEP).await?;
        Ok(member)
    }

    /// The server Leases, as JSON objects.
    pub(crate) async fn leases(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        let out = self
            .plane
            .kubectl(
                &[
                    "get",
                    "leases",
                    "-n",
                    "kube-system",
                    "-l",
                    "k8s-app=konnectivity-server",
                    "-o",
                    "json",
                ],
                None,
            )
            .await?;
        let list: serde_json::Value = serde_json::from_str(&out)?;
        Ok(list["items"].as_array().cloned().unwrap_or_default())
    }

    pub(crate) async fn lease_holders(&self) -> Vec<String> {
        let mut holders: Vec<String> = self
            .leases()
            .await
            .unwrap_or_default()
            .iter()
            .filter_map(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
            .collect();
        holders.sort();
        holders
    }
}

pub(crate) const OPEN: &str = "konnectivity_network_proxy_agent_open_server_connections";
pub(crate) const KNOWN: &str = "konnectivity_network_proxy_agent_known_server_count";

/// Waits until every agent holds `n` server streams and counts `n` servers; returns how
/// long that took.
pub(crate) async fn converge(agents: &[&Member], n: usize, what: &str) -> Duration {
    let started = Instant::now();
    loop {
        let mut all = true;
        let mut seen = Vec::new();
        for agent in agents {
            let open = agent.metric(OPEN).await;
            let known = agent.metric(KNOWN).await;
            seen.push((agent.kind, open, known));
            all &= open == Some(n as f64) && known == Some(n as f64);
        }
        if all {
            let took = started.elapsed();
            eprintln!("converged to {n} servers ({what}) in {took:.1?}");
            return took;
        }
        assert!(
            started.elapsed() < STEP,
            "{what}: agents did not converge to {n}: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` until true, within [`STEP`]; returns how long it took.
pub(crate) async fn until<F: Future<Output = bool>>(
    what: &str,
    mut check: impl FnMut() -> F,
) -> Duration {
    let started = Instant::now();
    while !check().await {
        assert!(started.elapsed() < STEP, "{what}: not within {STEP:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}
