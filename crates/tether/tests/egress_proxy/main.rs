//! Agents behind an HTTP(S) proxy, with a real proxy from Debian's packages: tinyproxy (and
//! stunnel in front of it for an `https://` proxy), started on loopback with a generated
//! configuration that lets it reach nothing but loopback (`Bind 127.0.0.1`, a destination
//! filter that denies every other name, and `ConnectPort` limited to the server's agent port).
//!
//! The server's host is `LocalHost`: httpproxy (and so grpc-go and tether) never proxies
//! `localhost` or a loopback IP, but compares the name before lower-casing it, so `LocalHost`
//! is proxied while it still resolves to loopback, for the proxy and for a direct connection.
//! The server certificate's `localhost` matches it (names compare case-insensitively).
//!
//! And agents in front of whose server stands an L7 reverse proxy (HAProxy, nginx) that
//! passes only HTTP/1.1: the WebSocket link ([`websocket`]).

mod kube_api;
mod proxies;
mod reverse_proxies;
mod tether_agent;
mod upstream_agent;
mod websocket;

use std::path::Path;
use std::time::Duration;

use tether_client::Transport;
use tether_testkit::Pki;
use tether_testkit::process::{LoggedChild, ServerProcess, free_port};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::Command;

/// Bound for any single step: catches hangs without asserting speed.
pub(crate) const STEP: Duration = Duration::from_secs(30);

/// The name the agents dial the server by (see the module comment).
pub(crate) const SERVER_HOST: &str = "LocalHost";

pub(crate) fn tether_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_tether"))
}

/// The proxy variables, removed from every agent's environment before a test sets its own.
const PROXY_VARIABLES: [&str; 6] = [
    "HTTPS_PROXY",
    "https_proxy",
    "NO_PROXY",
    "no_proxy",
    "HTTP_PROXY",
    "http_proxy",
];

/// An agent process (tether's or upstream's) whose log goes to a file; killed when dropped.
pub(crate) struct AgentProcess {
    process: LoggedChild,
    pub(crate) health: u16,
}

impl AgentProcess {
    /// Starts `bin` (`args` after the common ones) with exactly `env` as its proxy variables.
    pub(crate) fn spawn(
        bin: &Path,
        subcommand: Option<&str>,
        pki: &Pki,
        server: &ServerProcess,
        args: &[String],
        env: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let health = free_port();
        let log = pki.dir().join(format!("agent-{health}.log"));
        let mut command = Command::new(bin);
        command.args(subcommand);
        command.args([
            format!("--proxy-server-host={SERVER_HOST}"),
            format!("--proxy-server-port={}", server.agent_addr.port()),
            format!("--ca-cert={}", pki.files.ca_cert.display()),
            format!("--agent-cert={}", pki.files.agent_cert.display()),
            format!("--agent-key={}", pki.files.agent_key.display()),
            "--health-server-host=127.0.0.1".into(),
            format!("--health-server-port={health}"),
            format!("--admin-server-port={}", free_port()),
            "--sync-interval=100ms".into(),
            "--sync-interval-cap=1s".into(),
        ]);
        command.args(args);
        for variable in PROXY_VARIABLES {
            command.env_remove(variable);
        }
        command.envs(env.iter().copied());
        Ok(Self {
            process: LoggedChild::spawn(&mut command, log)?,
            health,
        })
    }

    pub(crate) fn log(&self) -> String {
        self.process.log()
    }

    /// Waits until the agent is connected to a server (`/readyz` answers 200).
    pub(crate) async fn wait_ready(&self) -> anyhow::Result<()> {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], self.health));
        tether_testkit::http::wait_for_200(addr, "/readyz", STEP)
            .await
            .map_err(|e| anyhow::anyhow!("agent not ready: {e}; its log:\n{}", self.log()))
    }

    /// Waits until the agent's log contains `text`; returns the log.
    pub(crate) async fn wait_for_log(&self, text: &str) -> anyhow::Result<String> {
        self.process.wait_for_log(text, STEP).await
    }
}

/// A server whose HTTP CONNECT frontend (mutual TLS) the test dials through.
pub(crate) async fn server(pki: &Pki) -> anyhow::Result<ServerProcess> {
    tether_testkit::process::spawn_server(
        tether_bin(),
        pki,
        tether_testkit::process::Frontend::HttpConnectTls,
        &[],
    )
    .await
}

fn transport(pki: &Pki, server: &ServerProcess) -> anyhow::Result<Transport> {
    let f = &pki.files;
    Ok(Transport::Tls {
        addr: server.frontend_tcp.expect("TLS frontend").to_string(),
        server_name: "127.0.0.1".into(),
        tls: tether_tls::client_config(
            &f.ca_cert,
            Some((&f.client_cert, &f.client_key)),
            Vec::new(),
            &Default::default(),
        )?,
    })
}

/// Dials an echo server through `server` (and so through the agent's proxied stream), sends
/// 256 KiB of a pattern, and checks every byte comes back.
pub(crate) async fn echo_through(pki: &Pki, server: &ServerProcess) -> anyhow::Result<()> {
    let echo = tether_testkit::targets::EchoServer::start().await?;
    let transport = transport(pki, server)?;
    let stream = tokio::time::timeout(
        STEP,
        tether_client::dial_http_connect(&transport, &echo.addr.to_string()),
    )
    .await??;
    let payload = tether_testkit::targets::pattern(24, 256 * 1024);
    let (mut read, mut write) = tokio::io::split(stream);
    let sent = payload.clone();
    // Flushed: the TLS stream may hold the last bytes until then.
    let writer = tokio::spawn(async move {
        write.write_all(&sent).await?;
        write.flush().await
    });
    let mut back = vec![0; payload.len()];
    tokio::time::timeout(STEP, read.read_exact(&mut back)).await??;
    writer.await??;
    anyhow::ensure!(back == payload, "the echo differs from what was sent");
    Ok(())
}

/// Whether `name` is on `PATH`; a test that needs it says so and skips when it is not.
pub(crate) fn have(name: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()));
    if !found {
        eprintln!(
            "SKIPPED: {name} is not installed (apt-get install -y tinyproxy stunnel4 haproxy nginx-light; scripts/test-all.sh does)"
        );
    }
    found
}
