//! The routing file changes while the server runs (issue 27), through the real binaries.
//!
//! While a large transfer of tenant A runs through the main frontend, in each frontend mode
//! (gRPC and HTTP CONNECT): a tenant added with its own socket and agent, A's bytes/s changed
//! under the live transfer, a malformed file refused, every change made as Kubernetes updates
//! a mounted ConfigMap (a new `..2026_N` directory, the `..data` symlink swapped), and a
//! tenant removed while one of its connections is open. The transfer stays byte-exact
//! throughout. An agent identity moved to another tenant reconnects under it.
//!
//! Every connection these tests open is checked in the audit log at the end: one opening and
//! one end record, paired by dial id, with the generation in force when it was dialed, and
//! on the end record the generation whose reload cut it, when one did. The helpers here
//! serve the other reload tests too (`reload_frontends`, `policy_reload`).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use serde_json::Value;
use tether_client::{ClientError, DialError, GrpcClient, Transport};
use tether_observe::introspect::{AgentsReport, ConnectionsReport, StreamView};
use tether_testkit::Pki;
use tether_testkit::process::{
    Frontend, Process, ServerProcess, agent_args, free_port, spawn_agent, spawn_server,
};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::audit::{of_dial, read_records};
use crate::{STEP, bin, metric, until};

/// How many bytes tenant A's transfer echoes (each way). 1 GiB by default;
/// `TETHER_RELOAD_TRANSFER_MIB` sets another size.
fn transfer_bytes() -> u64 {
    std::env::var("TETHER_RELOAD_TRANSFER_MIB")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(1024)
        << 20
}

/// Tenant A's bytes/s while the test watches its rate follow (both directions count).
pub(crate) const LIMIT: u64 = 4 << 20;

/// A mounted ConfigMap: `dir/..2026_N/routing.yaml`, `dir/..data -> ..2026_N` and
/// `dir/routing.yaml -> ..data/routing.yaml`, updated as the kubelet does.
pub(crate) struct ConfigMap {
    dir: PathBuf,
    version: u32,
}

impl ConfigMap {
    pub(crate) fn new(dir: PathBuf, text: &str) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let mut map = Self { dir, version: 0 };
        map.update(text);
        std::os::unix::fs::symlink("..data/routing.yaml", map.path()).unwrap();
        map
    }

    pub(crate) fn path(&self) -> PathBuf {
        self.dir.join("routing.yaml")
    }

    /// Writes `text` into a new timestamped directory and swaps `..data` to it atomically.
    pub(crate) fn update(&mut self, text: &str) {
        self.version += 1;
        let name = format!("..2026_{:02}", self.version);
        let data = self.dir.join(&name);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("routing.yaml"), text).unwrap();
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&name, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
    }
}

/// Tenant A (this process's uid, the default agent certificate), with `limit` bytes/s, and
/// tenant B (agent `agent.b`) with its own frontend on `b_socket`, when given.
pub(crate) fn routing(uid: u32, limit: Option<u64>, b_socket: Option<&Path>) -> String {
    let limits = limit.map_or(String::new(), |l| {
        format!("    limits: {{bytes_per_second: {l}}}\n")
    });
    let mut text = format!(
        "tenants:\n  - name: a\n    clients: [\"uid:{uid}\"]\n    agents: [\"cert:proxy-agent\"]\n{limits}"
    );
    if let Some(socket) = b_socket {
        text.push_str(&format!(
            "  - name: b\n    agents: [\"cert:agent.b\"]\n    frontend: {{unix: {}}}\n",
            socket.display()
        ));
    }
    text
}

/// The uid a frontend's Unix socket sees for this process's clients: the owner of the files
/// it creates.
pub(crate) fn own_uid(pki: &Pki) -> u32 {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(pki.dir()).unwrap())
}

/// A PKI that also issues `agent.b`: a second agent's certificate, whose tenant the routing
/// file decides.
pub(crate) fn pki_with_agent_b() -> Pki {
    let (pki, issued) = Pki::generate_with_clients(&[tether_tls::pki::ClientSpec {
        common_name: "agent.b",
        sans: &[],
    }])
    .unwrap();
    std::fs::write(pki.dir().join("agent.b.crt"), &issued[0].cert_pem).unwrap();
    std::fs::write(pki.dir().join("agent.b.key"), &issued[0].key_pem).unwrap();
    pki
}

/// Starts the agent `agent-b` with the `agent.b` certificate. It does not wait for the agent
/// to be admitted: while no tenant has its identity, the server refuses it and it retries.
pub(crate) async fn spawn_agent_b(pki: &Pki, server: &ServerProcess) -> Process {
    let dir = pki.dir();
    let health = free_port();
    let args = agent_args(pki, server.agent_addr, health, free_port())
        .into_iter()
        .map(|arg| {
            if arg.starts_with("--agent-cert=") {
                format!("--agent-cert={}", dir.join("agent.b.crt").display())
            } else if arg.starts_with("--agent-key=") {
                format!("--agent-key={}", dir.join("agent.b.key").display())
            } else {
                arg
            }
        })
        .chain(["--agent-id=agent-b".to_owned()])
        .collect();
    Process::spawn(bin(), args, SocketAddr::from(([127, 0, 0, 1], health)))
        .await
        .unwrap()
}

/// The server's frontend mode. Both are served on Unix sockets here: the main frontend and
/// the tenants' own, which speak the server's mode too.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mode {
    Grpc,
    HttpConnect,
}

/// A tunnel through either frontend.
pub(crate) trait Tunnel: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Tunnel for T {}

impl Mode {
    fn flag(self) -> &'static str {
        match self {
            Self::Grpc => "--mode=grpc",
            Self::HttpConnect => "--mode=http-connect",
        }
    }

    /// The audit records' `frontend`.
    fn audit_name(self) -> &'static str {
        match self {
            Self::Grpc => "grpc",
            Self::HttpConnect => "http-connect",
        }
    }

    /// Dials `target` through the frontend on `socket` (over gRPC, on a client connection of
    /// its own, which lives as long as the tunnel).
    pub(crate) async fn dial(
        self,
        socket: &Path,
        target: &str,
    ) -> Result<Box<dyn Tunnel>, DialError> {
        let transport = Transport::Unix(socket.to_owned());
        let tunnel: Box<dyn Tunnel> = match self {
            Self::Grpc => Box::new(GrpcClient::connect(&transport).await?.dial(target).await?),
            Self::HttpConnect => {
                Box::new(tether_client::dial_http_connect(&transport, target).await?)
            }
        };
        Ok(tunnel)
    }
}

/// Echoes `text` through `tunnel`, which must answer it within `STEP`.
pub(crate) async fn echo<T: AsyncRead + AsyncWrite + Unpin + ?Sized>(tunnel: &mut T, text: &[u8]) {
    tunnel.write_all(text).await.unwrap();
    let mut back = vec![0u8; text.len()];
    tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
        .await
        .expect("the echo answers")
        .unwrap();
    assert_eq!(back, text);
}

/// One connection through `socket` that echoes and is closed. `Err` when the dial fails (no
/// connection then); a connection that does not echo fails the test, so every `Ok` is one
/// connection in the audit log.
pub(crate) async fn echo_once(mode: Mode, socket: &Path, target: &str) -> Result<(), DialError> {
    let mut tunnel = mode.dial(socket, target).await?;
    echo(&mut tunnel, b"ping").await;
    tunnel.shutdown().await.unwrap();
    Ok(())
}

/// Reads `tunnel`, whose connection a reload cut, until it ends, at most `STEP`. Over gRPC the
/// CLOSE_RSP carries `why` and the read fails with it; HTTP CONNECT has no channel for text
/// once the tunnel is up, so its socket just ends: with a reset over TCP, with EOF on a Unix
/// socket, which has no abortive close.
pub(crate) async fn until_cut(mode: Mode, tunnel: &mut Box<dyn Tunnel>, why: &str) {
    let mut buf = [0u8; 64];
    let ended = tokio::time::timeout(STEP, tunnel.read(&mut buf))
        .await
        .expect("the cut connection ends");
    match (mode, ended) {
        (Mode::Grpc, Err(error)) => assert!(error.to_string().contains(why), "{error}"),
        (Mode::HttpConnect, Ok(0)) => eprintln!("the cut HTTP CONNECT connection read EOF"),
        (Mode::HttpConnect, Err(error)) => {
            assert_eq!(error.kind(), io::ErrorKind::ConnectionReset, "{error}");
            eprintln!("the cut HTTP CONNECT connection was reset");
        }
        (_, other) => panic!("{mode:?}: not how a cut connection ends: {other:?}"),
    }
}

/// Checks that nothing listens on `socket` any more: its file is gone, and a dial through it
/// finds no file to connect to.
pub(crate) async fn assert_gone(mode: Mode, socket: &Path) {
    assert!(!socket.exists(), "{} is still there", socket.display());
    let error = mode
        .dial(socket, "127.0.0.1:1")
        .await
        .err()
        .expect("no dial through a closed frontend");
    assert!(
        matches!(&error, DialError::Proxy(ClientError::Connect { error, .. })
            if error.kind() == io::ErrorKind::NotFound),
        "{error}"
    );
}

/// A connection as the audit log must tell it: the tenant it was dialed for, the routing
/// file's generation in force at the dial, and the generation whose reload cut it, if one
/// did.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Audited {
    tenant: String,
    generation: u64,
    cut_by: Option<u64>,
}

/// A connection of `tenant` dialed under `generation`, ended by its client or destination.
pub(crate) fn dialed(tenant: &str, generation: u64) -> Audited {
    Audited {
        tenant: tenant.to_owned(),
        generation,
        cut_by: None,
    }
}

impl Audited {
    /// The same connection, cut by the reload that applied `generation`.
    pub(crate) fn cut_by(self, generation: u64) -> Self {
        Self {
            cut_by: Some(generation),
            ..self
        }
    }
}

/// The `reason` of connection `of`'s end record, among what [`ReloadingServer::audited`]
/// returned.
pub(crate) fn end_reason<'a>(ends: &'a [(Audited, Value)], of: &Audited) -> &'a str {
    let (_, end) = ends
        .iter()
        .find(|(audited, _)| audited == of)
        .unwrap_or_else(|| panic!("no connection {of:?}"));
    end["reason"].as_str().unwrap_or_default()
}

/// A server whose routing file is `map`'s, with its main frontend in `mode` on the socket
/// `main`; it cuts retired streams after 1 s, logs to a file and writes the audit log to
/// another, both in the PKI's directory.
pub(crate) struct ReloadingServer {
    pub(crate) server: ServerProcess,
    pub(crate) mode: Mode,
    pub(crate) main: PathBuf,
    /// The routing file's path, as metrics and `/debug/config` name it.
    pub(crate) file: String,
    log: PathBuf,
    audit: PathBuf,
}

impl ReloadingServer {
    /// A server whose retired streams keep their connections for 1 s.
    pub(crate) async fn spawn(pki: &Pki, mode: Mode, map: &ConfigMap) -> Self {
        Self::spawn_with_grace(pki, mode, map, "1s").await
    }

    /// A server with `--graceful-shutdown-timeout=grace`.
    pub(crate) async fn spawn_with_grace(
        pki: &Pki,
        mode: Mode,
        map: &ConfigMap,
        grace: &str,
    ) -> Self {
        let dir = pki.dir();
        let (main, log, audit) = (
            dir.join("main.sock"),
            dir.join("server.log"),
            dir.join("audit.log"),
        );
        let flags = [
            format!("--routing-config={}", map.path().display()),
            // After testkit's flags for a gRPC frontend on `main`: the last --mode wins.
            mode.flag().to_owned(),
            format!("--graceful-shutdown-timeout={grace}"),
            "--logtostderr=false".to_owned(),
            format!("--log-file={}", log.display()),
            format!("--audit-log-path={}", audit.display()),
        ];
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let server = spawn_server(bin(), pki, Frontend::GrpcUds(main.clone()), &flags)
            .await
            .unwrap();
        Self {
            server,
            mode,
            main,
            file: map.path().display().to_string(),
            log,
            audit,
        }
    }

    /// Starts an agent with the PKI's default certificate (tenant A's in these tests) and
    /// waits until the server is ready with it.
    pub(crate) async fn spawn_agent_a(&self, pki: &Pki) -> Process {
        let agent = spawn_agent(bin(), pki, self.server.agent_addr, &[])
            .await
            .unwrap();
        self.server.process.wait_ready().await.unwrap();
        agent
    }

    /// The generation of the routing file in force.
    pub(crate) async fn generation(&self) -> Option<f64> {
        let sample = format!("tether_server_config_generation{{file=\"{}\"}}", self.file);
        metric(&self.server.process, &sample).await
    }

    /// How many reloads had `result` (`applied` or `refused`).
    pub(crate) async fn reloads(&self, result: &str) -> Option<f64> {
        let sample = format!(
            "tether_server_config_reloads_total{{file=\"{}\",result=\"{result}\"}}",
            self.file
        );
        metric(&self.server.process, &sample).await
    }

    /// Waits until generation `n` is in force.
    pub(crate) async fn until_generation(&self, n: u32) {
        until(&format!("generation {n}"), || async {
            self.generation().await == Some(f64::from(n))
        })
        .await;
    }

    /// Waits until the server's log has a line that `matches` (the log is written in the
    /// background), and returns it.
    pub(crate) async fn logged(&self, what: &str, matches: impl Fn(&str) -> bool) -> String {
        let line = || {
            std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .find(|l| matches(l))
                .map(str::to_owned)
        };
        until(what, || async { line().is_some() }).await;
        line().unwrap()
    }

    /// Waits until the audit log holds the end of every connection opened (its writer runs
    /// in the background), then checks every connection in it: exactly one opening and one
    /// end record with its dial id, the opening first, both from the `mode` frontend with
    /// the same tenant and generation, `cut_by_generation` on the end record only; and that
    /// the connections are the `expected` ones, in any order. Returns each one's end record.
    pub(crate) async fn audited(&self, expected: &[Audited]) -> Vec<(Audited, Value)> {
        let ends = |records: &[Value]| {
            records
                .iter()
                .filter(|r| r["event"] == "connection")
                .count()
        };
        let opened = |records: &[Value]| -> Vec<(usize, Value)> {
            records
                .iter()
                .enumerate()
                .filter(|(_, r)| r["event"] == "connection_opened")
                .map(|(at, r)| (at, r.clone()))
                .collect()
        };
        until("every connection's end in the audit log", || async {
            let records = read_records(&self.audit);
            ends(&records) >= expected.len()
                && opened(&records)
                    .iter()
                    .all(|(_, open)| !of_dial(&records, "connection", &open["dial_id"]).is_empty())
        })
        .await;
        let records = read_records(&self.audit);
        let mut seen = Vec::new();
        for (at, open) in opened(&records) {
            let id = &open["dial_id"];
            let (opens, closes) = (
                of_dial(&records, "connection_opened", id),
                of_dial(&records, "connection", id),
            );
            assert_eq!(
                (opens.len(), closes.len()),
                (1, 1),
                "dial {id}: {records:#?}"
            );
            let end = closes[0];
            let end_at = records.iter().position(|r| std::ptr::eq(r, end)).unwrap();
            assert!(
                at < end_at,
                "dial {id} ended before it opened: {records:#?}"
            );
            for record in [&open, end] {
                assert_eq!(record["frontend"], self.mode.audit_name(), "{record}");
            }
            assert_eq!(
                (&end["tenant"], &end["generation"]),
                (&open["tenant"], &open["generation"]),
                "dial {id}: {open}\n{end}"
            );
            assert!(open["cut_by_generation"].is_null(), "{open}");
            let cut_by = match &end["cut_by_generation"] {
                Value::Null => None,
                n => Some(n.as_u64().unwrap_or_else(|| panic!("{end}"))),
            };
            let connection = Audited {
                tenant: open["tenant"].as_str().unwrap_or_default().to_owned(),
                generation: open["generation"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{open}")),
                cut_by,
            };
            seen.push((connection, end.clone()));
        }
        assert_eq!(
            ends(&records),
            seen.len(),
            "an end record without its opening: {records:#?}"
        );
        let mut got: Vec<&Audited> = seen.iter().map(|(audited, _)| audited).collect();
        let mut want: Vec<&Audited> = expected.iter().collect();
        got.sort();
        want.sort();
        assert_eq!(got, want, "{records:#?}");
        seen
    }
}

/// A stream of pseudo-random bytes, the same for the writer and the checker, in pieces of
/// any length.
struct Pattern {
    x: u64,
    word: [u8; 8],
    used: usize,
}

impl Pattern {
    fn new() -> Self {
        Self {
            x: 0x9E37_79B9_7F4A_7C15,
            word: [0; 8],
            used: 8,
        }
    }

    fn step(&mut self) {
        self.x ^= self.x << 13;
        self.x ^= self.x >> 7;
        self.x ^= self.x << 17;
        self.word = self.x.to_le_bytes();
    }

    fn fill(&mut self, mut buf: &mut [u8]) {
        while self.used < 8 && !buf.is_empty() {
            buf[0] = self.word[self.used];
            self.used += 1;
            buf = &mut buf[1..];
        }
        let mut words = buf.chunks_exact_mut(8);
        for word in &mut words {
            self.step();
            word.copy_from_slice(&self.word);
        }
        let rest = words.into_remainder();
        if !rest.is_empty() {
            self.step();
            rest.copy_from_slice(&self.word[..rest.len()]);
            self.used = rest.len();
        }
    }
}

/// Echoes `total` bytes through `tunnel`, checking every byte; `received` counts what came
/// back.
async fn transfer(
    tunnel: Box<dyn Tunnel>,
    total: u64,
    received: Arc<AtomicU64>,
) -> Result<(), String> {
    let (mut rd, mut wr) = tokio::io::split(tunnel);
    let writer = async {
        let mut pattern = Pattern::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut left = total;
        while left > 0 {
            let n = left.min(buf.len() as u64) as usize;
            pattern.fill(&mut buf[..n]);
            wr.write_all(&buf[..n]).await.map_err(|e| e.to_string())?;
            left -= n as u64;
        }
        Ok::<_, String>(wr)
    };
    let reader = async {
        let mut pattern = Pattern::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut expected = vec![0u8; 64 * 1024];
        let mut got = 0u64;
        while got < total {
            let n = rd.read(&mut buf).await.map_err(|e| e.to_string())?;
            if n == 0 {
                return Err(format!("EOF after {got} of {total} bytes"));
            }
            pattern.fill(&mut expected[..n]);
            if buf[..n] != expected[..n] {
                return Err(format!("bytes differ within {got}..{}", got + n as u64));
            }
            got += n as u64;
            received.store(got, Ordering::Relaxed);
        }
        Ok(())
    };
    let (wr, read) = tokio::join!(writer, reader);
    read?;
    let mut wr = wr?;
    let _ = wr.shutdown().await;
    Ok(())
}

/// The received byte rate of the transfer over `window`.
async fn rate(received: &AtomicU64, window: Duration) -> f64 {
    let (t0, r0) = (Instant::now(), received.load(Ordering::Relaxed));
    until("the measuring window", || async { t0.elapsed() >= window }).await;
    let (t1, r1) = (Instant::now(), received.load(Ordering::Relaxed));
    (r1 - r0) as f64 / (t1 - t0).as_secs_f64()
}

#[tokio::test]
async fn the_routing_file_reloads_under_a_live_transfer_grpc() {
    reloads_under_a_live_transfer(Mode::Grpc).await;
}

#[tokio::test]
async fn the_routing_file_reloads_under_a_live_transfer_http_connect() {
    reloads_under_a_live_transfer(Mode::HttpConnect).await;
}

/// The scenario through the `mode` frontend; see the module doc.
async fn reloads_under_a_live_transfer(mode: Mode) {
    let pki = pki_with_agent_b();
    let uid = own_uid(&pki);
    let b_socket = pki.dir().join("b.sock");
    let mut map = ConfigMap::new(pki.dir().join("config"), &routing(uid, None, None));
    let reloading = ReloadingServer::spawn(&pki, mode, &map).await;
    let server = &reloading.server;
    let _agent_a = reloading.spawn_agent_a(&pki).await;
    assert_eq!(reloading.generation().await, Some(1.0));
    assert_eq!(reloading.reloads("refused").await, Some(0.0));
    let echo_server = EchoServer::start().await.unwrap();
    let echo_addr = echo_server.addr.to_string();

    // Tenant A's large transfer through the main frontend.
    let total = transfer_bytes();
    let received = Arc::new(AtomicU64::new(0));
    let tunnel = mode.dial(&reloading.main, &echo_addr).await.unwrap();
    let started = Instant::now();
    let running = tokio::spawn(transfer(tunnel, total, received.clone()));
    until("tenant A's transfer flows", || async {
        received.load(Ordering::Relaxed) >= 8 << 20
    })
    .await;

    // Agent B is refused (its identity is no tenant's) and keeps trying.
    let _agent_b = spawn_agent_b(&pki, server).await;

    // 1. Tenant B, with its own socket and agent, added through a ConfigMap swap.
    let written = Instant::now();
    map.update(&routing(uid, None, Some(&b_socket)));
    let bound = until("tenant B's socket", || async { b_socket.exists() }).await;
    assert!(
        bound < Duration::from_secs(2),
        "the new tenant's socket took {bound:?} (the file is read every 500 ms)"
    );
    assert_eq!(reloading.generation().await, Some(2.0));
    until("a dial through tenant B's socket", || async {
        echo_once(mode, &b_socket, &echo_addr).await.is_ok()
    })
    .await;
    eprintln!(
        "{mode:?}: tenant B's socket {bound:?} and a first dial through it {:?} after the write (agent B reconnects with backoff, cap 1 s)",
        written.elapsed()
    );

    // 2. A's bytes/s lowered under the live transfer (SIGHUP: at once), then lifted. Every
    // byte that comes back was charged to A's bucket on its way down, so the echo cannot
    // return faster than the limit (plus the bucket's burst, 0.4 MiB); in steady state it
    // returns at half of it, both directions counting, but what was in flight when the limit
    // came (windows and socket buffers, charged once already) drains first.
    let free = rate(&received, Duration::from_millis(500)).await;
    map.update(&routing(uid, Some(LIMIT), Some(&b_socket)));
    server.process.signal("HUP").await.unwrap();
    reloading.until_generation(3).await;
    // What was in flight drains first.
    let _ = rate(&received, Duration::from_millis(500)).await;
    let limited = rate(&received, Duration::from_secs(2)).await;
    let mib = |rate: f64| rate / (1 << 20) as f64;
    assert!(
        limited > 0.0 && limited < LIMIT as f64 * 1.15,
        "A's echo came back at {:.1} MiB/s under a {} MiB/s limit (before it: {:.1} MiB/s)",
        mib(limited),
        LIMIT >> 20,
        mib(free)
    );
    map.update(&routing(uid, None, Some(&b_socket)));
    reloading.until_generation(4).await;
    let _ = rate(&received, Duration::from_millis(200)).await;
    let lifted = rate(&received, Duration::from_secs(1)).await;
    assert!(
        lifted > 2.0 * LIMIT as f64,
        "A's rate did not follow the lifted limit: {:.1} MiB/s",
        mib(lifted)
    );
    eprintln!(
        "{mode:?}: tenant A's echo: {:.1} MiB/s free, {:.1} MiB/s under {} MiB/s, {:.1} MiB/s lifted",
        mib(free),
        mib(limited),
        LIMIT >> 20,
        mib(lifted)
    );

    // 3. A malformed file: refused, counted, logged with the file and line; nothing changes.
    map.update("tenants:\n  - name: a\n    agentz: [\"cert:proxy-agent\"]\n");
    until("the refusal is counted", || async {
        reloading.reloads("refused").await == Some(1.0)
    })
    .await;
    assert_eq!(reloading.generation().await, Some(4.0));
    assert_eq!(reloading.reloads("applied").await, Some(3.0));
    let file = reloading.file.as_str();
    let line = reloading
        .logged("the refusal is logged", |l| {
            l.contains("configuration reload refused")
        })
        .await;
    assert!(
        line.contains(file) && line.contains("agentz") && line.contains("line 3"),
        "{line}"
    );
    let (status, view) = tether_testkit::http::get(server.admin_addr, "/debug/config")
        .await
        .unwrap();
    assert_eq!(status, 200, "{view}");
    let view: tether_observe::introspect::ConfigFileView = serde_json::from_str(&view).unwrap();
    assert_eq!(
        (view.name.as_str(), view.path.as_str(), view.generation),
        ("routing-config", file, 4)
    );
    let refusal = view.last_refusal.expect("the refusal is shown");
    assert!(refusal.message.contains("line 3"), "{}", refusal.message);
    assert!(b_socket.exists(), "a refused file changes nothing");
    echo_once(mode, &b_socket, &echo_addr).await.unwrap();

    // 4. Tenant B removed while one of its connections is open: the connection ends after
    // the grace (1 s), and B's socket is gone.
    let mut open = mode.dial(&b_socket, &echo_addr).await.unwrap();
    echo(&mut open, b"before").await;
    map.update(&routing(uid, None, None));
    let removing = Instant::now();
    until("tenant B's socket is gone", || async { !b_socket.exists() }).await;
    assert_eq!(reloading.generation().await, Some(5.0));
    let removed = "tenant b was removed from the routing file (generation 5)";
    until_cut(mode, &mut open, removed).await;
    eprintln!(
        "{mode:?}: tenant B's open connection ended {:?} after its removal was written (grace 1 s)",
        removing.elapsed()
    );
    assert_gone(mode, &b_socket).await;

    // A's transfer, through all of it, byte-exact.
    let result = tokio::time::timeout(Duration::from_secs(600), running)
        .await
        .expect("the transfer ends")
        .unwrap();
    result.unwrap();
    eprintln!(
        "{mode:?}: tenant A echoed {} MiB byte-exact in {:?} while the routing file changed 5 times",
        total >> 20,
        started.elapsed()
    );

    // A's transfer under generation 1; B's first dial under 2, the two after the refusal
    // under 4, the open one cut by 5's removal.
    drop(open);
    let cut = dialed("b", 4).cut_by(5);
    let ends = reloading
        .audited(&[dialed("a", 1), dialed("b", 2), dialed("b", 4), cut.clone()])
        .await;
    let reason = end_reason(&ends, &cut);
    assert!(reason.contains(removed), "{reason}");
}

/// Waits until agent B serves tenant B through `b_socket`, then opens a connection to
/// `echo_addr` through it and checks that it echoes.
async fn open_through_b(mode: Mode, b_socket: &Path, echo_addr: &str) -> Box<dyn Tunnel> {
    until("agent B serves tenant B", || async {
        b_socket.exists() && echo_once(mode, b_socket, echo_addr).await.is_ok()
    })
    .await;
    let mut open = mode.dial(b_socket, echo_addr).await.unwrap();
    echo(&mut open, b"before").await;
    open
}

/// An agent identity moved from tenant B to tenant A: B's stream of that agent takes no new
/// dial, its open connection ends after the grace with the move named, and the agent comes
/// back under tenant A.
#[tokio::test]
async fn an_agent_identity_moved_to_another_tenant_reconnects_under_it() {
    let mode = Mode::Grpc;
    let pki = pki_with_agent_b();
    let uid = own_uid(&pki);
    let b_socket = pki.dir().join("b.sock");
    let routing = |b_agents: &str, a_agents: &str| {
        format!(
            "tenants:\n  - name: a\n    clients: [\"uid:{uid}\"]\n    agents: [{a_agents}]\n  - name: b\n    agents: [{b_agents}]\n    frontend: {{unix: {}}}\n",
            b_socket.display()
        )
    };
    let mut map = ConfigMap::new(
        pki.dir().join("config"),
        &routing("\"cert:agent.b\"", "\"cert:proxy-agent\""),
    );
    let reloading = ReloadingServer::spawn(&pki, mode, &map).await;
    let _agent_b = spawn_agent_b(&pki, &reloading.server).await;
    let echo_server = EchoServer::start().await.unwrap();
    let echo_addr = echo_server.addr.to_string();
    let mut open = open_through_b(mode, &b_socket, &echo_addr).await;

    // agent.b is tenant A's now; B keeps an identity nobody has.
    map.update(&routing(
        "\"cert:nobody\"",
        "\"cert:proxy-agent\", \"cert:agent.b\"",
    ));
    reloading.server.process.signal("HUP").await.unwrap();
    let moved = "moved from tenant b to tenant a in the routing file (generation 2)";
    until_cut(mode, &mut open, moved).await;
    // Back under tenant A: tenant A's client reaches the echo server through it.
    until("agent B serves tenant A", || async {
        echo_once(mode, &reloading.main, &echo_addr).await.is_ok()
    })
    .await;
    reloading
        .logged("the log tells the move", |l| {
            l.contains("agent stream retired by a reload")
        })
        .await;
    reloading
        .logged("the log tells the return", |l| {
            l.contains("agent connected") && l.contains("agent-b") && l.contains("tenant=\"a\"")
        })
        .await;

    drop(open);
    let cut = dialed("b", 1).cut_by(2);
    let ends = reloading
        .audited(&[dialed("b", 1), cut.clone(), dialed("a", 2)])
        .await;
    let reason = end_reason(&ends, &cut);
    assert!(reason.contains(moved), "{reason}");
}

/// `agent-b`'s streams as `/debug/agents` lists them.
async fn streams_of_agent_b(server: &ServerProcess) -> Vec<StreamView> {
    let (status, body) = tether_testkit::http::get(server.admin_addr, "/debug/agents")
        .await
        .unwrap();
    assert_eq!(status, 200, "{body}");
    let report: AgentsReport = serde_json::from_str(&body).unwrap();
    report
        .streams
        .into_iter()
        .filter(|s| s.agent_id == "agent-b")
        .collect()
}

/// A removed tenant's agent stream stays listed by `/debug/agents`, as retiring with the
/// reason, and its connection by `/debug/connections`, while it waits out the grace period;
/// the connection still echoes then. Once the grace has passed, both are gone.
#[tokio::test]
async fn a_removed_tenants_stream_is_listed_as_retiring_until_the_grace_ends() {
    let mode = Mode::Grpc;
    let pki = pki_with_agent_b();
    let uid = own_uid(&pki);
    let b_socket = pki.dir().join("b.sock");
    let mut map = ConfigMap::new(
        pki.dir().join("config"),
        &routing(uid, None, Some(&b_socket)),
    );
    let reloading = ReloadingServer::spawn_with_grace(&pki, mode, &map, "5s").await;
    let server = &reloading.server;
    let _agent_b = spawn_agent_b(&pki, server).await;
    let echo_server = EchoServer::start().await.unwrap();
    let echo_addr = echo_server.addr.to_string();
    let mut open = open_through_b(mode, &b_socket, &echo_addr).await;
    let before = streams_of_agent_b(server).await;
    assert!(
        before.len() == 1 && before[0].retiring.is_none(),
        "{before:?}"
    );

    map.update(&routing(uid, None, None));
    let removed = "tenant b was removed from the routing file (generation 2)";
    until("agent B's stream is listed as retiring", || async {
        streams_of_agent_b(server)
            .await
            .iter()
            .any(|s| s.retiring.is_some())
    })
    .await;
    let retiring = streams_of_agent_b(server).await;
    assert_eq!(retiring.len(), 1, "{retiring:?}");
    assert_eq!(retiring[0].retiring.as_deref(), Some(removed));
    assert_eq!(retiring[0].connections, 1, "{retiring:?}");
    let (status, body) =
        tether_testkit::http::get(server.admin_addr, "/debug/connections?agent=agent-b")
            .await
            .unwrap();
    assert_eq!(status, 200, "{body}");
    let connections: ConnectionsReport = serde_json::from_str(&body).unwrap();
    assert_eq!(connections.connections.len(), 1, "{body}");
    echo(&mut open, b"during the grace").await;

    until_cut(mode, &mut open, removed).await;
    until("agent B's retired stream is no longer listed", || async {
        streams_of_agent_b(server)
            .await
            .iter()
            .all(|s| s.retiring.is_none())
    })
    .await;
    drop(open);
    let cut = dialed("b", 1).cut_by(2);
    reloading.audited(&[dialed("b", 1), cut]).await;
}
