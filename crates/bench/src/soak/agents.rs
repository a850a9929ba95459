//! The soak's agents: real `tether agent` processes, each reaching every server of the fleet
//! through relays of its own (one per server), so that a fault on one agent touches no
//! other; or upstream's `proxy-agent`, which takes one address, through one relay that
//! hands its connections to the servers in turn. Each can be killed and started again,
//! frozen and thawed, drained, and cut off.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use rustix::process::Signal;
use tether_tls::pki::PkiFiles;

use super::relay::Relay;
use crate::procs::{self, Proc};
use crate::systems::{Env, Fleet, agent_flags, flag, free_port, wait_http_ok};

/// The agent links tether's agents use, in turn: the native link (`auto`, which tether's
/// servers answer with it), gRPC and WebSocket, so that every link takes every fault.
const LINKS: [&str; 3] = ["auto", "grpc", "websocket"];

/// How long an agent may take to be ready (every server held).
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a drained agent keeps its proxied connections before it exits
/// (`--drain-timeout`).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(3);

/// One agent of the soak.
#[derive(Debug)]
pub struct Agent {
    pub id: String,
    /// Upstream's proxy-agent, not tether's.
    pub upstream: bool,
    /// Counts kills (kill -9) twice, before the signal and once reaped: odd while one is
    /// under way, so that a client can tell a kill's effects.
    pub kills: Arc<AtomicU64>,
    /// `None` between a kill and its restart.
    pub proc: Option<Proc>,
    pub health: u16,
    /// Its admin port on 127.0.0.1 (pprof, with --enable-profiling).
    pub admin: u16,
    /// Its control-plane listener on 127.0.0.1, whose connections are reverse dials (none on
    /// upstream's agent).
    pub control_plane: Option<u16>,
    relays: Vec<Relay>,
    program: PathBuf,
    args: Vec<OsString>,
    log: PathBuf,
}

impl Agent {
    /// Starts agent `n` (upstream's, if `upstream`) with the credentials of `pki`, its relays
    /// in front of the servers of `fleet`, and waits until it is ready. A tether agent also
    /// gets `extra_flags`.
    pub async fn start(
        env: &Env,
        pki: &PkiFiles,
        fleet: &Fleet,
        (n, upstream, extra_flags): (usize, bool, &[OsString]),
        dir: &Path,
    ) -> anyhow::Result<Agent> {
        let servers: Vec<_> = fleet.members.iter().map(|m| m.agents).collect();
        let (health, admin) = (free_port()?, free_port()?);
        let id = format!("soak-agent-{}", n + 1);
        let mut relays = Vec::with_capacity(servers.len());
        let (program, mut args, control_plane): (PathBuf, Vec<OsString>, _) = if upstream {
            relays.push(Relay::start(servers).await?);
            let args = vec![
                "--proxy-server-host=127.0.0.1".into(),
                flag("proxy-server-port", relays[0].addr.port().to_string()),
            ];
            (env.bins.upstream_agent.clone(), args, None)
        } else {
            for server in servers {
                relays.push(Relay::start(vec![server]).await?);
            }
            let addresses = relays
                .iter()
                .map(|r| r.addr.to_string())
                .collect::<Vec<_>>()
                .join(",");
            let control_plane = free_port()?;
            // Upstream's servers take gRPC only: no WebSocket link where one is in the fleet.
            let links = match fleet.members.iter().any(|m| m.upstream) {
                true => &LINKS[..2],
                false => &LINKS[..],
            };
            let mut args = vec![
                "agent".into(),
                "--proxy-server-host=127.0.0.1".into(),
                flag("proxy-server-addresses", &addresses),
                flag("drain-timeout", format!("{}s", DRAIN_TIMEOUT.as_secs())),
                flag("control-plane-listen", format!("127.0.0.1:{control_plane}")),
                flag("transport", links[n % links.len()]),
            ];
            args.extend(extra_flags.iter().cloned());
            (env.bins.tether.clone(), args, Some(control_plane))
        };
        args.extend(agent_flags(pki, health, admin, &id));
        let mut agent = Agent {
            log: dir.join(format!("{id}.log")),
            id,
            upstream,
            kills: Arc::default(),
            proc: None,
            health,
            admin,
            control_plane,
            relays,
            program,
            args,
        };
        agent.launch().await?;
        Ok(agent)
    }

    /// Starts the process (again) and waits until it holds every server.
    pub async fn launch(&mut self) -> anyhow::Result<()> {
        let mut cmd = tokio::process::Command::new(&self.program);
        cmd.args(&self.args);
        let mut proc = Proc::spawn(&self.id, cmd, &self.log)?;
        wait_http_ok(&mut proc, self.health, "/readyz", READY_TIMEOUT)
            .await
            .with_context(|| format!("{} not ready", self.id))?;
        self.proc = Some(proc);
        Ok(())
    }

    /// kill -9 (the process and anything it started), reaped.
    pub async fn kill(&mut self) {
        if let Some(proc) = self.proc.take() {
            self.stop_counted(proc).await;
        }
    }

    /// kill -9 `proc`, reaped, counted in `kills` before the signal and once reaped.
    async fn stop_counted(&self, proc: Proc) {
        self.kills.fetch_add(1, Ordering::Relaxed);
        proc.stop().await;
        self.kills.fetch_add(1, Ordering::Relaxed);
    }

    /// SIGSTOP (`true`) or SIGCONT (`false`).
    pub fn freeze(&self, frozen: bool) {
        if let Some(proc) = &self.proc {
            proc.signal(if frozen { Signal::STOP } else { Signal::CONT });
        }
    }

    /// SIGTERM: the agent drains and exits within [`DRAIN_TIMEOUT`].
    pub fn drain(&self) {
        if let Some(proc) = &self.proc {
            proc.signal(Signal::TERM);
        }
    }

    /// Waits for a drained agent to exit by itself: whether it did within `within` (one that
    /// did not is killed).
    pub async fn drained_within(&mut self, within: Duration) -> bool {
        let Some(mut proc) = self.proc.take() else {
            return true;
        };
        let exited = proc.exited_within(within).await;
        if !exited {
            self.stop_counted(proc).await;
        }
        exited
    }

    /// Resets every link to the servers now, and every new one for `hold`.
    pub fn cut(&self, hold: Duration) {
        for relay in &self.relays {
            relay.cut(hold);
        }
    }

    /// Where its output goes.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Open file descriptors of the process now.
    pub fn fds(&self) -> Option<usize> {
        self.proc.as_ref().and_then(|p| procs::fd_count(p.pid))
    }
}
