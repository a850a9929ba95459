//! The routing file changes while a large transfer runs (issue 27): a tenant added with its
//! own socket and agent, a tenant's bytes/s changed under a live transfer, a malformed file
//! refused, every change made as Kubernetes updates a mounted ConfigMap (a new `..2026_N`
//! directory, the `..data` symlink swapped), and a tenant removed while one of its
//! connections is open. The transfer stays byte-exact throughout.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::http::metric_value;
use tether_testkit::process::{
    Frontend, Process, ServerProcess, agent_args, free_port, spawn_server,
};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{STEP, bin, until};

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
const LIMIT: u64 = 4 << 20;

/// A mounted ConfigMap: `dir/..2026_N/routing.yaml`, `dir/..data -> ..2026_N` and
/// `dir/routing.yaml -> ..data/routing.yaml`, updated as the kubelet does.
struct ConfigMap {
    dir: PathBuf,
    version: u32,
}

impl ConfigMap {
    fn new(dir: PathBuf, text: &str) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let mut map = Self { dir, version: 0 };
        map.update(text);
        std::os::unix::fs::symlink("..data/routing.yaml", map.path()).unwrap();
        map
    }

    fn path(&self) -> PathBuf {
        self.dir.join("routing.yaml")
    }

    /// Writes `text` into a new timestamped directory and swaps `..data` to it atomically.
    fn update(&mut self, text: &str) {
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

fn routing(uid: u32, limit: Option<u64>, b_socket: Option<&Path>) -> String {
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

/// Echoes `total` bytes through `client` to `echo`, checking every byte; `received` counts
/// what came back.
async fn transfer(
    client: GrpcClient,
    echo: String,
    total: u64,
    received: Arc<AtomicU64>,
) -> Result<(), String> {
    let tunnel = client.dial(&echo).await.map_err(|e| e.to_string())?;
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

async fn metric(server: &ServerProcess, sample: &str) -> Option<f64> {
    metric_value(&server.process.metrics().await.ok()?, sample)
}

/// The received byte rate of the transfer over `window`.
async fn rate(received: &AtomicU64, window: Duration) -> f64 {
    let (t0, r0) = (Instant::now(), received.load(Ordering::Relaxed));
    until("the measuring window", || async { t0.elapsed() >= window }).await;
    let (t1, r1) = (Instant::now(), received.load(Ordering::Relaxed));
    (r1 - r0) as f64 / (t1 - t0).as_secs_f64()
}

fn agent_b_args(pki: &Pki, server: &ServerProcess, health: u16) -> Vec<String> {
    let dir = pki.dir();
    agent_args(pki, server.agent_addr, health, free_port())
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
        .collect()
}

/// A server on the gRPC socket `main` that watches `map`'s routing file, cuts retired
/// streams after 1 s and logs to `log`.
async fn spawn_reloading_server(
    pki: &Pki,
    main: &Path,
    map: &ConfigMap,
    log: &Path,
) -> ServerProcess {
    let routing_flag = format!("--routing-config={}", map.path().display());
    let log_flag = format!("--log-file={}", log.display());
    spawn_server(
        bin(),
        pki,
        Frontend::GrpcUds(main.to_owned()),
        &[
            &routing_flag,
            "--graceful-shutdown-timeout=1s",
            "--logtostderr=false",
            &log_flag,
        ],
    )
    .await
    .unwrap()
}

async fn echo_once(socket: &Path, echo: &str) -> Result<(), String> {
    let client = GrpcClient::connect(&Transport::Unix(socket.to_owned()))
        .await
        .map_err(|e| e.to_string())?;
    let mut tunnel = client.dial(echo).await.map_err(|e| e.to_string())?;
    tunnel.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut back = [0u8; 4];
    tunnel
        .read_exact(&mut back)
        .await
        .map_err(|e| e.to_string())?;
    if &back != b"ping" {
        return Err(format!("echoed {back:?}"));
    }
    Ok(())
}

#[tokio::test]
async fn the_routing_file_reloads_under_a_live_transfer() {
    let (pki, issued) = Pki::generate_with_clients(&[tether_tls::pki::ClientSpec {
        common_name: "agent.b",
        sans: &[],
    }])
    .unwrap();
    std::fs::write(pki.dir().join("agent.b.crt"), &issued[0].cert_pem).unwrap();
    std::fs::write(pki.dir().join("agent.b.key"), &issued[0].key_pem).unwrap();
    // Files this process creates are its uid's: the frontend sees that uid.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(pki.dir()).unwrap());
    let main_socket = pki.dir().join("main.sock");
    let b_socket = pki.dir().join("b.sock");
    let mut map = ConfigMap::new(pki.dir().join("config"), &routing(uid, None, None));
    let log = pki.dir().join("server.log");
    let server = spawn_reloading_server(&pki, &main_socket, &map, &log).await;
    let file = map.path().display().to_string();
    let generation = format!("tether_server_config_generation{{file=\"{file}\"}}");
    let refused =
        format!("tether_server_config_reloads_total{{file=\"{file}\",result=\"refused\"}}");
    let applied =
        format!("tether_server_config_reloads_total{{file=\"{file}\",result=\"applied\"}}");
    let _agent_a = tether_testkit::process::spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    server.process.wait_ready().await.unwrap();
    assert_eq!(metric(&server, &generation).await, Some(1.0));
    assert_eq!(metric(&server, &refused).await, Some(0.0));
    let echo = EchoServer::start().await.unwrap();
    let echo_addr = echo.addr.to_string();

    // Tenant A's large transfer through the main frontend.
    let total = transfer_bytes();
    let received = Arc::new(AtomicU64::new(0));
    let client = GrpcClient::connect(&Transport::Unix(main_socket.clone()))
        .await
        .unwrap();
    let started = Instant::now();
    let running = tokio::spawn(transfer(client, echo_addr.clone(), total, received.clone()));
    until("tenant A's transfer flows", || async {
        received.load(Ordering::Relaxed) >= 8 << 20
    })
    .await;

    // Agent B is refused (its identity is no tenant's) and keeps trying.
    let b_health = free_port();
    let b_health_addr = std::net::SocketAddr::from(([127, 0, 0, 1], b_health));
    let _agent_b = Process::spawn(bin(), agent_b_args(&pki, &server, b_health), b_health_addr)
        .await
        .unwrap();

    // 1. Tenant B, with its own socket and agent, added through a ConfigMap swap.
    let written = Instant::now();
    map.update(&routing(uid, None, Some(&b_socket)));
    let bound = until("tenant B's socket", || async { b_socket.exists() }).await;
    assert!(
        bound < Duration::from_secs(2),
        "the new tenant's socket took {bound:?} (the file is read every 500 ms)"
    );
    assert_eq!(metric(&server, &generation).await, Some(2.0));
    until("a dial through tenant B's socket", || async {
        echo_once(&b_socket, &echo_addr).await.is_ok()
    })
    .await;
    eprintln!(
        "tenant B: socket {bound:?} and a first dial through it {:?} after the write (agent B reconnects with backoff, cap 1 s)",
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
    until("generation 3", || async {
        metric(&server, &generation).await == Some(3.0)
    })
    .await;
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
    until("generation 4", || async {
        metric(&server, &generation).await == Some(4.0)
    })
    .await;
    let _ = rate(&received, Duration::from_millis(200)).await;
    let lifted = rate(&received, Duration::from_secs(1)).await;
    assert!(
        lifted > 2.0 * LIMIT as f64,
        "A's rate did not follow the lifted limit: {:.1} MiB/s",
        mib(lifted)
    );
    eprintln!(
        "tenant A's echo: {:.1} MiB/s free, {:.1} MiB/s under {} MiB/s, {:.1} MiB/s lifted",
        mib(free),
        mib(limited),
        LIMIT >> 20,
        mib(lifted)
    );

    // 3. A malformed file: refused, counted, logged with the file and line; nothing changes.
    map.update("tenants:\n  - name: a\n    agentz: [\"cert:proxy-agent\"]\n");
    until("the refusal is counted", || async {
        metric(&server, &refused).await == Some(1.0)
    })
    .await;
    assert_eq!(metric(&server, &generation).await, Some(4.0));
    assert_eq!(metric(&server, &applied).await, Some(3.0));
    // The log is written in the background: poll it.
    until("the refusal is logged", || async {
        std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("configuration reload refused")
    })
    .await;
    let logged = std::fs::read_to_string(&log).unwrap();
    let line = logged
        .lines()
        .find(|l| l.contains("configuration reload refused"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{logged}"));
    assert!(
        line.contains(&file) && line.contains("agentz") && line.contains("line 3"),
        "{line}"
    );
    let (status, view) = tether_testkit::http::get(server.admin_addr, "/debug/config")
        .await
        .unwrap();
    assert_eq!(status, 200, "{view}");
    let view: tether_observe::introspect::ConfigFileView = serde_json::from_str(&view).unwrap();
    assert_eq!(
        (view.name.as_str(), view.path.as_str(), view.generation),
        ("routing-config", file.as_str(), 4)
    );
    let refusal = view.last_refusal.expect("the refusal is shown");
    assert!(refusal.message.contains("line 3"), "{}", refusal.message);
    assert!(b_socket.exists(), "a refused file changes nothing");
    echo_once(&b_socket, &echo_addr).await.unwrap();

    // 4. Tenant B removed while one of its connections is open.
    let client = GrpcClient::connect(&Transport::Unix(b_socket.clone()))
        .await
        .unwrap();
    let mut open = client.dial(&echo_addr).await.unwrap();
    open.write_all(b"before").await.unwrap();
    let mut back = [0u8; 6];
    open.read_exact(&mut back).await.unwrap();
    map.update(&routing(uid, None, None));
    until("tenant B's socket is gone", || async { !b_socket.exists() }).await;
    assert_eq!(metric(&server, &generation).await, Some(5.0));
    let ended = tokio::time::timeout(STEP, open.read(&mut back))
        .await
        .expect("the removed tenant's connection ends");
    let error = ended.expect_err("an error, not EOF").to_string();
    assert!(
        error.contains("tenant b was removed from the routing file (generation 5)"),
        "{error}"
    );
    assert!(
        GrpcClient::connect(&Transport::Unix(b_socket.clone()))
            .await
            .is_err()
    );

    // A's transfer, through all of it, byte-exact.
    let result = tokio::time::timeout(Duration::from_secs(600), running)
        .await
        .expect("the transfer ends")
        .unwrap();
    result.unwrap();
    eprintln!(
        "tenant A echoed {} MiB byte-exact in {:?} while the routing file changed 5 times",
        total >> 20,
        started.elapsed()
    );
}

/// An agent identity moved from tenant B to tenant A: B's stream of that agent takes no new
/// dial, its open connection ends after the grace with the move named, and the agent comes
/// back under tenant A.
#[tokio::test]
async fn an_agent_identity_moved_to_another_tenant_reconnects_under_it() {
    let (pki, issued) = Pki::generate_with_clients(&[tether_tls::pki::ClientSpec {
        common_name: "agent.b",
        sans: &[],
    }])
    .unwrap();
    std::fs::write(pki.dir().join("agent.b.crt"), &issued[0].cert_pem).unwrap();
    std::fs::write(pki.dir().join("agent.b.key"), &issued[0].key_pem).unwrap();
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(pki.dir()).unwrap());
    let main_socket = pki.dir().join("main.sock");
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
    let log = pki.dir().join("server.log");
    let server = spawn_reloading_server(&pki, &main_socket, &map, &log).await;
    let health = free_port();
    let _agent_b = Process::spawn(
        bin(),
        agent_b_args(&pki, &server, health),
        std::net::SocketAddr::from(([127, 0, 0, 1], health)),
    )
    .await
    .unwrap();
    let echo = EchoServer::start().await.unwrap();
    let echo_addr = echo.addr.to_string();
    until("agent B serves tenant B", || async {
        b_socket.exists() && echo_once(&b_socket, &echo_addr).await.is_ok()
    })
    .await;
    let client = GrpcClient::connect(&Transport::Unix(b_socket.clone()))
        .await
        .unwrap();
    let mut open = client.dial(&echo_addr).await.unwrap();
    open.write_all(b"before").await.unwrap();
    let mut back = [0u8; 6];
    open.read_exact(&mut back).await.unwrap();

    // agent.b is tenant A's now; B keeps an identity nobody has.
    map.update(&routing(
        "\"cert:nobody\"",
        "\"cert:proxy-agent\", \"cert:agent.b\"",
    ));
    server.process.signal("HUP").await.unwrap();
    let ended = tokio::time::timeout(STEP, open.read(&mut back))
        .await
        .expect("the moved agent's connection ends");
    let error = ended.expect_err("an error, not EOF").to_string();
    assert!(
        error.contains("moved from tenant b to tenant a in the routing file (generation 2)"),
        "{error}"
    );
    // Back under tenant A: tenant A's client reaches the echo server through it.
    until("agent B serves tenant A", || async {
        echo_once(&main_socket, &echo_addr).await.is_ok()
    })
    .await;
    // The log is written in the background: poll it.
    until("the log tells the move and the return", || async {
        let logged = std::fs::read_to_string(&log).unwrap_or_default();
        logged.contains("agent stream retired by a reload")
            && logged.lines().any(|l| {
                l.contains("agent connected") && l.contains("agent-b") && l.contains("tenant=\"a\"")
            })
    })
    .await;
}
