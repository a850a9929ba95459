//! Servers and agents as separate processes of the real `tether` binary, for tests that
//! kill, stop or signal them.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tokio::process::{Child, Command};

use crate::Pki;

/// Ports [`free_port`] picks from: below Linux's default ephemeral range (32768–60999), so the
/// kernel never hands one to an outgoing connection between the pick and the bind.
const PICKED_PORTS: std::ops::Range<u16> = 20_000..32_768;

/// A free loopback port: a random one from [`PICKED_PORTS`] that binds, released for the caller
/// to bind, and never one this process was handed before (two picks for one process, such as
/// its health and admin ports, would otherwise collide now and then). Only another process's
/// picker can take it in between, and random picks make that rare; start-ups that still lose
/// it retry (see `control_plane`). Kernel-chosen ports would avoid the race but need parsing
/// logs for the port.
pub fn free_port() -> u16 {
    use std::hash::{BuildHasher as _, Hasher as _};
    static HANDED_OUT: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let span = u64::from(PICKED_PORTS.end - PICKED_PORTS.start);
    for _ in 0..1_000 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(u64::from(std::process::id()));
        let port = PICKED_PORTS.start + (hasher.finish() % span) as u16;
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if !handed_out.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            handed_out.insert(port);
            return port;
        }
    }
    panic!("no free loopback port in {PICKED_PORTS:?} after 1,000 picks")
}

/// A running `tether` process; killed when dropped.
#[derive(Debug)]
pub struct Process {
    child: Child,
    pub pid: u32,
    pub health: SocketAddr,
}

impl Process {
    /// Starts `bin` with `args`; `health` is where it will serve `/healthz` and `/metrics`.
    pub async fn spawn(bin: &Path, args: Vec<String>, health: SocketAddr) -> anyhow::Result<Self> {
        let child = Command::new(bin)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(if std::env::var_os("RUST_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .kill_on_drop(true)
            .spawn()?;
        let pid = child
            .id()
            .ok_or_else(|| anyhow::anyhow!("process exited at once"))?;
        Ok(Self { child, pid, health })
    }

    /// Sends a signal by name (`TERM`, `KILL`, `STOP`, `CONT`, `INT`).
    pub async fn signal(&self, name: &str) -> anyhow::Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.pid.to_string())
            .status()
            .await?;
        anyhow::ensure!(status.success(), "kill -{name} {} failed", self.pid);
        Ok(())
    }

    /// Waits for the process to exit, at most `timeout`; returns its exit code.
    pub async fn wait(&mut self, timeout: Duration) -> anyhow::Result<Option<i32>> {
        let status = tokio::time::timeout(timeout, self.child.wait()).await??;
        Ok(status.code())
    }

    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(crate::http::get(self.health, "/metrics").await?.1)
    }

    pub async fn wait_ready(&self) -> anyhow::Result<()> {
        crate::http::wait_for_200(self.health, "/readyz", Duration::from_secs(30)).await
    }
}

/// Which frontend a server process offers.
#[derive(Clone, Debug)]
pub enum Frontend {
    /// HTTP CONNECT over mutual TLS on a free loopback port.
    HttpConnectTls,
    /// gRPC on this Unix socket.
    GrpcUds(PathBuf),
}

/// Addresses of a server process.
#[derive(Debug)]
pub struct ServerProcess {
    pub process: Process,
    pub agent_addr: SocketAddr,
    /// Set for [`Frontend::HttpConnectTls`].
    pub frontend_tcp: Option<SocketAddr>,
    /// The admin port (`/metrics`, `/debug/...`), on loopback.
    pub admin_addr: SocketAddr,
}

/// Starts `tether server` on free ports with the given frontend, plus `extra` flags.
pub async fn spawn_server(
    bin: &Path,
    pki: &Pki,
    frontend: Frontend,
    extra: &[&str],
) -> anyhow::Result<ServerProcess> {
    let (agent, health, admin) = (free_port(), free_port(), free_port());
    let frontend_tcp = match &frontend {
        Frontend::HttpConnectTls => Some(SocketAddr::from(([127, 0, 0, 1], free_port()))),
        Frontend::GrpcUds(_) => None,
    };
    let mut args: Vec<String> = vec!["server".into()];
    args.extend(server_flags(
        pki,
        &frontend,
        frontend_tcp,
        [agent, health, admin],
    ));
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    let health_addr = SocketAddr::from(([127, 0, 0, 1], health));
    Ok(ServerProcess {
        process: Process::spawn(bin, args, health_addr).await?,
        agent_addr: SocketAddr::from(([127, 0, 0, 1], agent)),
        frontend_tcp,
        admin_addr: SocketAddr::from(([127, 0, 0, 1], admin)),
    })
}

/// The flags of a proxy server (tether's or upstream's: they are the same) on loopback with
/// the PKI's certificates: `frontend` (on `frontend_tcp` for HTTP CONNECT over TLS) and the
/// agent, health and admin `ports`.
pub fn server_flags(
    pki: &Pki,
    frontend: &Frontend,
    frontend_tcp: Option<SocketAddr>,
    [agent, health, admin]: [u16; 3],
) -> Vec<String> {
    let f = &pki.files;
    let mut args = Vec::new();
    match frontend {
        Frontend::HttpConnectTls => {
            let port = frontend_tcp.map_or(0, |a| a.port());
            args.extend([
                "--mode=http-connect".to_owned(),
                format!("--server-port={port}"),
                "--server-bind-address=127.0.0.1".into(),
                format!("--server-cert={}", f.server_cert.display()),
                format!("--server-key={}", f.server_key.display()),
                format!("--server-ca-cert={}", f.ca_cert.display()),
            ]);
        }
        Frontend::GrpcUds(path) => {
            args.extend([
                "--mode=grpc".to_owned(),
                format!("--uds-name={}", path.display()),
                "--server-port=0".into(),
            ]);
        }
    }
    args.extend([
        format!("--agent-port={agent}"),
        "--agent-bind-address=127.0.0.1".into(),
        format!("--cluster-cert={}", f.server_cert.display()),
        format!("--cluster-key={}", f.server_key.display()),
        format!("--cluster-ca-cert={}", f.ca_cert.display()),
        format!("--health-port={health}"),
        "--health-bind-address=127.0.0.1".into(),
        format!("--admin-port={admin}"),
    ]);
    args
}

/// Starts `tether agent` against `server_agent_addr`, plus `extra` flags, and waits until
/// it answers `/healthz` (retrying on other ports, as [`spawn_server`] does).
pub async fn spawn_agent(
    bin: &Path,
    pki: &Pki,
    server_agent_addr: SocketAddr,
    extra: &[&str],
) -> anyhow::Result<Process> {
    let mut last_error = None;
    for _ in 0..3 {
        let mut agent = spawn_agent_once(bin, pki, server_agent_addr, extra).await?;
        match crate::http::wait_for_200(agent.health, "/healthz", Duration::from_secs(10)).await {
            Ok(()) => return Ok(agent),
            Err(e) => {
                let _ = agent.signal("KILL").await;
                let _ = agent.wait(Duration::from_secs(5)).await;
                last_error = Some(e);
            }
        }
    }
    Err(last_error.unwrap_or_else(|| anyhow::anyhow!("agent did not start")))
}

async fn spawn_agent_once(
    bin: &Path,
    pki: &Pki,
    server_agent_addr: SocketAddr,
    extra: &[&str],
) -> anyhow::Result<Process> {
    let health = free_port();
    let mut args = agent_args(pki, server_agent_addr, health, free_port());
    args.extend(extra.iter().map(|s| (*s).to_owned()));
    Process::spawn(bin, args, SocketAddr::from(([127, 0, 0, 1], health))).await
}

/// `tether agent` with the PKI's agent certificate against `server_agent_addr`, its health
/// and admin ports on loopback, reconnecting quickly (`--sync-interval` 100 ms, cap 1 s).
pub fn agent_args(
    pki: &Pki,
    server_agent_addr: SocketAddr,
    health: u16,
    admin: u16,
) -> Vec<String> {
    let f = &pki.files;
    vec![
        "agent".into(),
        format!("--proxy-server-host={}", server_agent_addr.ip()),
        format!("--proxy-server-port={}", server_agent_addr.port()),
        format!("--ca-cert={}", f.ca_cert.display()),
        format!("--agent-cert={}", f.agent_cert.display()),
        format!("--agent-key={}", f.agent_key.display()),
        "--health-server-host=127.0.0.1".into(),
        format!("--health-server-port={health}"),
        format!("--admin-server-port={admin}"),
        "--sync-interval=100ms".into(),
        "--sync-interval-cap=1s".into(),
    ]
}

/// A process whose stdout and stderr go to a file, for tests that wait for a log line; killed
/// when dropped.
#[derive(Debug)]
pub struct LoggedChild {
    _child: Child,
    log: PathBuf,
}

impl LoggedChild {
    /// Starts `command` with its output appended to `log`.
    pub fn spawn(command: &mut Command, log: PathBuf) -> anyhow::Result<Self> {
        let out = std::fs::File::create(&log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()?;
        Ok(Self { _child: child, log })
    }

    /// What the process has written so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `text`, at most `within`; returns the log.
    pub async fn wait_for_log(&self, text: &str, within: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let log = self.log();
            if log.contains(text) {
                return Ok(log);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the log never said {text:?}; it says:\n{log}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Upstream's `proxy-server` or `proxy-agent`, as `interop/build.sh` builds it into
/// `interop/bin`.
pub fn upstream_bin(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../interop/bin")
        .join(name);
    assert!(
        path.exists(),
        "{} missing: run interop/build.sh",
        path.display()
    );
    path
}
