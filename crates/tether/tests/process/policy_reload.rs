//! The agent's destination policy reloaded while it runs, through the real binaries: the file
//! laid out as Kubernetes mounts a ConfigMap (`dir/..2026_x/policy`, `dir/..data -> ..2026_x`,
//! `dir/policy -> ..data/policy`), changed by swapping `..data`, written in place, broken.
//! New dials follow the generation in force; an open connection the new generation denies is
//! closed with the policy's error; a refused content changes nothing.
//!
//! The server's destination policies (the routing file's `destinations:`) are the decided
//! counterpart: checked at dial, as an admission decision, so a tightened one refuses new
//! dials and keeps the open connections.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use tether_client::{DialError, GrpcClient, Transport};
use tether_observe::introspect::{AgentsReport, ConfigFileView};
use tether_testkit::Pki;
use tether_testkit::http::{get, metric_value, wait_for_200};
use tether_testkit::process::{Frontend, ServerProcess, agent_args, free_port, spawn_server};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::audit::read_records;
use crate::reload::{ConfigMap, Mode, ReloadingServer, dialed, echo, own_uid};
use crate::{STEP, bin, until};

/// A ConfigMap volume holding one key, `policy`, as the kubelet lays it out.
struct ConfigMapVolume {
    dir: PathBuf,
    /// Numbers the timestamped directories.
    version: u32,
}

impl ConfigMapVolume {
    fn new(dir: PathBuf, policy: &str) -> Self {
        std::fs::create_dir_all(&dir).unwrap();
        let mut volume = Self { dir, version: 0 };
        volume.swap(policy);
        std::os::unix::fs::symlink("..data/policy", volume.path()).unwrap();
        volume
    }

    /// The path the agent is given.
    fn path(&self) -> PathBuf {
        self.dir.join("policy")
    }

    /// An update as the kubelet makes it: the new content in a new directory, `..data`
    /// pointed at it by renaming a new symlink over it, then the old directory removed.
    fn swap(&mut self, policy: &str) {
        let old = self.data_dir();
        self.version += 1;
        let new = format!("..2026_01_01_00_00_{:02}.{}", self.version, self.version);
        std::fs::create_dir(self.dir.join(&new)).unwrap();
        std::fs::write(self.dir.join(&new).join("policy"), policy).unwrap();
        let tmp = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&new, &tmp).unwrap();
        std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        if let Some(old) = old {
            std::fs::remove_dir_all(self.dir.join(old)).unwrap();
        }
    }

    fn data_dir(&self) -> Option<PathBuf> {
        std::fs::read_link(self.dir.join("..data")).ok()
    }
}

/// `tether agent` with its admin port known and its log in a file; killed when dropped.
struct Agent {
    child: Child,
    health: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
}

impl Agent {
    async fn spawn(pki: &Pki, server: &ServerProcess, extra: &[String]) -> Self {
        let (health, admin) = (free_port(), free_port());
        let mut args = agent_args(pki, server.agent_addr, health, admin);
        args.extend(extra.iter().cloned());
        let log = pki.dir().join(format!("agent-{health}.log"));
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin())
            .args(&args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let agent = Self {
            child,
            health: SocketAddr::from(([127, 0, 0, 1], health)),
            admin: SocketAddr::from(([127, 0, 0, 1], admin)),
            log,
        };
        wait_for_200(agent.health, "/readyz", STEP)
            .await
            .unwrap_or_else(|e| panic!("the agent is not ready: {e}\n{}", agent.log()));
        agent
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    async fn signal(&self, name: &str) {
        let pid = self.child.id().expect("running");
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .await
            .unwrap();
        assert!(status.success());
    }

    async fn metric(&self, sample: &str) -> Option<f64> {
        let (_, text) = get(self.health, "/metrics").await.ok()?;
        metric_value(&text, sample)
    }

    /// The destination policy as `/debug/agents` reports it.
    async fn policy_view(&self) -> ConfigFileView {
        let (status, body) = get(self.admin, "/debug/agents").await.unwrap();
        assert_eq!(status, 200, "{body}");
        let report: AgentsReport = serde_json::from_str(&body).unwrap();
        assert_eq!(report.config_files.len(), 1, "{body}");
        report.config_files.into_iter().next().unwrap()
    }
}

/// A server with a gRPC frontend on a Unix socket, and the client's way to it.
async fn server(pki: &Pki) -> (ServerProcess, Transport) {
    let uds = pki.dir().join("frontend.sock");
    let server = spawn_server(bin(), pki, Frontend::GrpcUds(uds.clone()), &[])
        .await
        .unwrap();
    (server, Transport::Unix(uds))
}

/// Dials `target` and checks that bytes come back.
async fn echoes(client: &GrpcClient, target: SocketAddr) -> tether_client::TunnelStream {
    let mut stream = client.dial(&target.to_string()).await.unwrap();
    echo_once(&mut stream).await;
    stream
}

async fn echo_once(stream: &mut tether_client::TunnelStream) {
    stream.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(STEP, stream.read_exact(&mut back))
        .await
        .expect("the echo answers")
        .unwrap();
    assert_eq!(&back, b"ping");
}

/// The agent's error for a dial the policy refuses.
async fn refused(client: &GrpcClient, target: SocketAddr) -> String {
    match client.dial(&target.to_string()).await {
        Err(DialError::Endpoint { message }) => message,
        Err(other) => panic!("{target}: not the policy's refusal: {other}"),
        Ok(_) => panic!("{target}: dialed"),
    }
}

fn allow(ports: &[u16]) -> String {
    let mut policy = String::new();
    for port in ports {
        policy.push_str(&format!("allow to 127.0.0.1 port {port}\n"));
    }
    policy + "deny all\n"
}

fn sha256sum(path: &Path) -> String {
    let out = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_owned()
}

#[tokio::test]
async fn a_configmap_swap_applies_to_new_dials_and_closes_the_open_connections_it_denies() {
    let pki = Pki::generate().unwrap();
    let (a, b, c) = (
        EchoServer::start().await.unwrap(),
        EchoServer::start().await.unwrap(),
        EchoServer::start().await.unwrap(),
    );
    let (pa, pb, pc) = (a.addr.port(), b.addr.port(), c.addr.port());
    let mut volume = ConfigMapVolume::new(pki.dir().join("policy-volume"), &allow(&[pa, pc]));
    let (server, transport) = server(&pki).await;
    let flag = format!("--destination-policy={}", volume.path().display());
    let audit_log = pki.dir().join("agent-audit.log");
    let audit_flag = format!("--audit-log-path={}", audit_log.display());
    let agent = Agent::spawn(&pki, &server, &[flag, audit_flag]).await;
    server.process.wait_ready().await.unwrap();
    let client = GrpcClient::connect(&transport).await.unwrap();

    let mut to_a = echoes(&client, a.addr).await;
    let mut to_c = echoes(&client, c.addr).await;
    assert_eq!(
        refused(&client, b.addr).await,
        format!("policy: {} denied by line 3: deny all", b.addr)
    );
    let first = agent.policy_view().await;
    assert_eq!(first.generation, 1);
    assert_eq!(first.path, volume.path().display().to_string());
    assert_eq!(first.sha256, sha256sum(&volume.path()));

    // A allowed no more, B allowed now, C still allowed.
    volume.swap(&allow(&[pb, pc]));
    until("a dial to B goes through after the swap", || async {
        match client.dial(&b.addr.to_string()).await {
            Ok(mut stream) => {
                echo_once(&mut stream).await;
                true
            }
            Err(DialError::Endpoint { message }) if message.starts_with("policy: ") => false,
            Err(other) => panic!("{other}"),
        }
    })
    .await;
    assert_eq!(
        refused(&client, a.addr).await,
        format!("policy: {} denied by line 3: deny all", a.addr)
    );

    // The open connection to A ends with the policy's error, naming the generation.
    let mut buf = [0u8; 16];
    let error = tokio::time::timeout(STEP, to_a.read(&mut buf))
        .await
        .expect("the connection to A ends")
        .expect_err("ended with an error");
    assert_eq!(error.kind(), std::io::ErrorKind::ConnectionReset, "{error}");
    let text = error.to_string();
    assert!(
        text.contains(&format!(
            "policy: {} denied by line 3: deny all (destination policy generation 2, \
             applied to the open connection)",
            a.addr
        )),
        "{text}"
    );
    // The one to C, which generation 2 allows, carries on.
    echo_once(&mut to_c).await;

    let cut = "tether_agent_destination_policy_connections_closed_total";
    assert_eq!(agent.metric(cut).await, Some(1.0));
    let file = volume.path().display().to_string();
    let generation = format!("tether_agent_config_generation{{file=\"{file}\"}}");
    assert_eq!(agent.metric(&generation).await, Some(2.0));
    let applied =
        format!("tether_agent_config_reloads_total{{file=\"{file}\",result=\"applied\"}}");
    assert_eq!(agent.metric(&applied).await, Some(1.0));
    let second = agent.policy_view().await;
    assert_eq!(second.generation, 2);
    assert_eq!(second.sha256, sha256sum(&volume.path()));
    assert!(second.last_refusal.is_none());
    let log = agent.log();
    let cut_line = log
        .lines()
        .find(|l| l.contains("the reloaded destination policy denies it"))
        .unwrap_or_else(|| panic!("the cut is not logged:\n{log}"));
    assert!(
        cut_line.contains("generation=2") && cut_line.contains(&a.addr.to_string()),
        "{cut_line}"
    );
    // The agent's end record of the connection to A names the generation that cut it.
    let ended_a = |records: &[serde_json::Value]| {
        records
            .iter()
            .find(|r| r["event"] == "connection" && r["requested"] == a.addr.to_string())
            .cloned()
    };
    until("the end of the connection to A is audited", || async {
        ended_a(&read_records(&audit_log)).is_some()
    })
    .await;
    let record = ended_a(&read_records(&audit_log)).unwrap();
    assert_eq!(record["cut_by_generation"], 2, "{record}");
    assert_eq!(record["outcome"], "error", "{record}");
}

#[tokio::test]
async fn a_broken_policy_is_refused_and_counted_and_sighup_applies_a_change() {
    let pki = Pki::generate().unwrap();
    let (a, b) = (
        EchoServer::start().await.unwrap(),
        EchoServer::start().await.unwrap(),
    );
    let volume = ConfigMapVolume::new(pki.dir().join("policy-volume"), &allow(&[a.addr.port()]));
    let (server, transport) = server(&pki).await;
    // Read only at start and at SIGHUP: whatever applies here, SIGHUP applied it.
    let agent = Agent::spawn(
        &pki,
        &server,
        &[
            format!("--destination-policy={}", volume.path().display()),
            "--destination-policy-reload-interval=1h".into(),
        ],
    )
    .await;
    server.process.wait_ready().await.unwrap();
    let client = GrpcClient::connect(&transport).await.unwrap();
    let file = volume.path().display().to_string();
    let refusals =
        format!("tether_agent_config_reloads_total{{file=\"{file}\",result=\"refused\"}}");
    assert_eq!(agent.metric(&refusals).await, Some(0.0));

    // Broken, written in place (through the symlinks): refused, and nothing changes.
    std::fs::write(
        volume.path(),
        format!(
            "allow to 127.0.0.1 port {}\nallow to 127.0.0.1/33\n",
            b.addr.port()
        ),
    )
    .unwrap();
    hangup_until(&agent, "the broken policy is refused", || async {
        agent.metric(&refusals).await == Some(1.0)
    })
    .await;
    let view = agent.policy_view().await;
    assert_eq!(view.generation, 1);
    let refusal = view.last_refusal.expect("the refusal is reported");
    assert!(
        refusal
            .message
            .starts_with(&format!("destination policy {file}: line 2: ")),
        "{}",
        refusal.message
    );
    assert!(
        refusal.message.contains("127.0.0.1/33"),
        "{}",
        refusal.message
    );
    let log = agent.log();
    assert!(
        log.lines().any(|l| l.contains("refused")
            && l.contains(&format!("destination policy {file}: line 2: "))),
        "the refusal is not logged with the file and line:\n{log}"
    );
    echoes(&client, a.addr).await;
    assert!(
        refused(&client, b.addr)
            .await
            .ends_with("denied by line 2: deny all")
    );

    // Allow everything, in place: SIGHUP applies it. The built-in rules still hold.
    std::fs::write(volume.path(), "allow all\n").unwrap();
    hangup_until(&agent, "the new policy applies", || async {
        agent.policy_view().await.generation == 2
    })
    .await;
    echoes(&client, b.addr).await;
    let view = agent.policy_view().await;
    assert!(view.last_refusal.is_none());
    assert_eq!(view.sha256, sha256sum(&volume.path()));
    let own = refused(&client, agent.health).await;
    assert!(
        own.contains("built-in rule") && own.contains("own listener"),
        "{own}"
    );
    assert_eq!(agent.metric(&refusals).await, Some(1.0));
}

/// Sends SIGHUP until `check` holds, waiting a while after each: the agent handles SIGHUP
/// from start-up, but a signal that arrives before its watcher listens wakes nothing.
async fn hangup_until<F, Fut>(agent: &Agent, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = tokio::time::Instant::now();
    loop {
        agent.signal("HUP").await;
        let sent = tokio::time::Instant::now();
        while sent.elapsed() < Duration::from_secs(2) {
            if check().await {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(
            started.elapsed() < STEP,
            "timed out waiting for: {what}\n{}",
            agent.log()
        );
    }
}

#[tokio::test]
async fn a_tightened_server_policy_keeps_the_open_connection_grpc() {
    a_tightened_server_policy_keeps_the_open_connection(Mode::Grpc).await;
}

#[tokio::test]
async fn a_tightened_server_policy_keeps_the_open_connection_http_connect() {
    a_tightened_server_policy_keeps_the_open_connection(Mode::HttpConnect).await;
}

/// The routing file's policy for this process's uid allows the echo server, then (generation
/// 2) denies everything: the connection opened under generation 1 keeps echoing byte-exact,
/// and a new dial to the same destination is refused with the policy's error, naming the
/// rule's line (9) in the routing file.
async fn a_tightened_server_policy_keeps_the_open_connection(mode: Mode) {
    let pki = Pki::generate().unwrap();
    let uid = own_uid(&pki);
    let echo_server = EchoServer::start().await.unwrap();
    let target = echo_server.addr.to_string();
    let routing = |rules: &[&str]| {
        let mut text = format!(
            "tenants:\n  - name: a\n    clients: [\"uid:{uid}\"]\n    agents: [\"cert:proxy-agent\"]\n\
             destinations:\n  - name: local\n    clients: [\"uid:{uid}\"]\n    rules:\n"
        );
        for rule in rules {
            text.push_str(&format!("      - {rule}\n"));
        }
        text
    };
    let allowing = format!("allow to 127.0.0.1 port {}", echo_server.addr.port());
    let mut map = ConfigMap::new(pki.dir().join("config"), &routing(&[&allowing, "deny all"]));
    let reloading = ReloadingServer::spawn(&pki, mode, &map).await;
    let _agent = reloading.spawn_agent_a(&pki).await;
    let mut open = mode.dial(&reloading.main, &target).await.unwrap();
    echo(&mut open, b"allowed").await;

    map.update(&routing(&["deny all"]));
    reloading.until_generation(2).await;
    reloading
        .logged("the policy change is logged", |l| {
            l.contains("destination policies changed") && l.contains("generation=2")
        })
        .await;
    echo(
        &mut open,
        b"kept by generation 2, which denies its destination",
    )
    .await;
    let error = mode
        .dial(&reloading.main, &target)
        .await
        .err()
        .expect("a new dial is refused");
    assert_eq!(
        server_refusal(mode, error),
        format!("policy: {target} denied by server policy \"local\" (line 9: deny all)")
    );
    echo(&mut open, b"and still after the refusal").await;
    let refusals =
        "tether_server_destination_policy_refusals_total{policy=\"local\",reason=\"rule\"}";
    assert_eq!(
        crate::metric(&reloading.server.process, refusals).await,
        Some(1.0)
    );

    open.shutdown().await.unwrap();
    drop(open);
    reloading.audited(&[dialed("a", 1)]).await;
}

/// The text of a dial the server's destination policy refused: gRPC's DIAL_RSP error, or
/// HTTP CONNECT's `403 Forbidden` body.
fn server_refusal(mode: Mode, error: DialError) -> String {
    match (mode, error) {
        (Mode::Grpc, DialError::Endpoint { message }) => message,
        (Mode::HttpConnect, DialError::Rejected { status: 403, body }) => {
            body.trim_end().to_owned()
        }
        (_, other) => panic!("{mode:?}: not a policy refusal: {other}"),
    }
}
