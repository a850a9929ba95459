//! Dialing host names that fail to resolve, for real, without a packet leaving loopback.
//!
//! The machine's `/etc/resolv.conf` may name resolvers off the box, so the test never lets
//! the system resolver read it. As root, it runs itself again under `unshare --mount --net`:
//! a network namespace whose only interface is loopback (no route leads anywhere else, which
//! the inner run checks), and a mount namespace where `/etc/resolv.conf` is bind-mounted to
//! `nameserver 127.0.0.1` and `/etc/nsswitch.conf` to `hosts: files dns`. There a small DNS
//! server on 127.0.0.1:53 answers NXDOMAIN for names under `.invalid` (RFC 6761) and
//! SERVFAIL for the rest, and the agent's real resolver (getaddrinfo) asks it. Without root
//! the test says so and skips.

use std::sync::{Arc, Mutex};

use tether_observe::audit::AuditTarget;
use tether_server::Mode;
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tokio::io::AsyncReadExt;
use tokio::net::UdpSocket;

use crate::STEP;
use crate::audit::{find, records};
use crate::support::{echo_exact, http_connect_uds};

/// Set in the inner run, inside the namespaces.
const INSIDE: &str = "TETHER_TEST_DNS_NAMESPACES";
const THIS_TEST: &str =
    "dns_names::names_that_fail_to_resolve_get_a_clear_error_and_the_agent_keeps_serving";
/// NXDOMAIN from the test's DNS server.
const NO_SUCH_NAME: &str = "nothing.tether.invalid";
/// SERVFAIL from the test's DNS server.
const BROKEN_NAME: &str = "servfail.tether.test";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_that_fail_to_resolve_get_a_clear_error_and_the_agent_keeps_serving() {
    if std::env::var_os(INSIDE).is_some() {
        inside().await;
    } else {
        run_inside_namespaces();
    }
}

/// Runs this test again in its own network and mount namespaces, and requires it to pass.
fn run_inside_namespaces() {
    if !is_root() {
        eprintln!(
            "SKIPPED {THIS_TEST}: needs root for unshare --mount --net (a private resolver \
             configuration and a loopback-only network)"
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let resolv = dir.path().join("resolv.conf");
    std::fs::write(
        &resolv,
        "nameserver 127.0.0.1\noptions timeout:2 attempts:1\n",
    )
    .unwrap();
    let nsswitch = dir.path().join("nsswitch.conf");
    std::fs::write(
        &nsswitch,
        "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n",
    )
    .unwrap();
    let script = "ip link set lo up && mount --bind \"$1\" /etc/resolv.conf && \
                  mount --bind \"$2\" /etc/nsswitch.conf && shift 2 && exec \"$@\"";
    let output = std::process::Command::new("unshare")
        .args(["--mount", "--net", "sh", "-c", script, "sh"])
        .arg(&resolv)
        .arg(&nsswitch)
        .arg(std::env::current_exe().unwrap())
        .args([THIS_TEST, "--exact", "--nocapture", "--test-threads=1"])
        .env(INSIDE, "1")
        .output()
        .expect("run unshare");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "inner run failed ({}):\n{stdout}\n{stderr}",
        output.status
    );
}

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .and_then(|l| l.split_whitespace().nth(2))
        == Some("0")
}

/// The test proper, inside the namespaces.
async fn inside() {
    // Refuse to run anywhere a lookup could leave the box.
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap();
    assert_eq!(
        resolv
            .lines()
            .filter(|l| l.starts_with("nameserver"))
            .collect::<Vec<_>>(),
        ["nameserver 127.0.0.1"]
    );
    let routes = std::fs::read_to_string("/proc/net/route").unwrap();
    assert_eq!(
        routes.lines().count(),
        1,
        "only a header, no route: {routes}"
    );
    let links = std::fs::read_to_string("/proc/net/dev").unwrap();
    let links: Vec<_> = links.lines().skip(2).collect();
    assert!(
        links.len() == 1 && links[0].trim_start().starts_with("lo:"),
        "only the loopback interface: {links:?}"
    );

    let dns = TestDns::start().await;
    let pki = Pki::generate().unwrap();
    let server_log = pki.dir().join("server-audit.log");
    let agent_log = pki.dir().join("agent-audit.log");
    let connect = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            server_id: "dns-connect".into(),
            audit_log: Some(AuditTarget::File(server_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let grpc = TestServer::start(
        &pki,
        ServerOptions {
            server_id: "dns-grpc".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let agent = TestAgent::start(
        &pki,
        connect.agent_addr,
        AgentOptions {
            agent_id: "dns-agent".into(),
            audit_log: Some(AuditTarget::File(agent_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let grpc_agent = TestAgent::start(&pki, grpc.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    agent.wait_ready().await.unwrap();
    grpc_agent.wait_ready().await.unwrap();
    let uds = connect.uds.clone().unwrap();

    // HTTP CONNECT: a 502 whose body is the agent's lookup error, for each kind of failure.
    for name in [NO_SUCH_NAME, BROKEN_NAME] {
        let target = format!("{name}:80");
        let (mut stream, head) = http_connect_uds(&uds, &target).await;
        assert!(head.starts_with("HTTP/1.1 502"), "{target}: {head}");
        let mut body = String::new();
        tokio::time::timeout(STEP, stream.read_to_string(&mut body))
            .await
            .unwrap()
            .unwrap();
        assert!(
            body.starts_with(&format!("dial tcp: lookup {name}: ")) && body.len() > 30,
            "{target}: {body:?}"
        );
    }
    // gRPC: the DIAL_RSP carries the same error.
    let client = tether_client::GrpcClient::connect(&tether_client::Transport::Unix(
        grpc.uds.clone().unwrap(),
    ))
    .await
    .unwrap();
    match client.dial(&format!("{NO_SUCH_NAME}:443")).await {
        Err(tether_client::DialError::Endpoint { message }) => assert!(
            message.starts_with(&format!("dial tcp: lookup {NO_SUCH_NAME}: ")),
            "{message}"
        ),
        Err(other) => panic!("expected the agent's lookup error, got {other}"),
        Ok(_) => panic!("a name that does not resolve was dialed"),
    }
    // The resolver really asked the loopback server, for each name.
    let asked = dns.asked();
    for name in [NO_SUCH_NAME, BROKEN_NAME] {
        assert!(
            asked.iter().any(|q| q == name),
            "{name} not asked: {asked:?}"
        );
    }

    // The agent keeps serving: an IP literal, and a name from /etc/hosts.
    let echo = EchoServer::start().await.unwrap();
    for target in [
        echo.addr.to_string(),
        format!("localhost:{}", echo.addr.port()),
    ] {
        let (stream, head) = http_connect_uds(&uds, &target).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{target}: {head}");
        drop(echo_exact(stream, 3, 4096).await);
    }

    // Counted on both sides.
    let server_metrics = connect.metrics().await.unwrap();
    assert_eq!(
        metric_value(
            &server_metrics,
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"error_response\"}"
        ),
        Some(2.0),
        "{server_metrics}"
    );
    let agent_metrics = agent.metrics().await.unwrap();
    assert_eq!(
        metric_value(
            &agent_metrics,
            "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"unknown\"}"
        ),
        Some(2.0),
        "{agent_metrics}"
    );

    // Audited on both sides, with the same dial ids.
    agent.stop().await;
    grpc_agent.stop().await;
    connect.stop().await;
    grpc.stop().await;
    let (server_records, agent_records) = (records(&server_log), records(&agent_log));
    for name in [NO_SUCH_NAME, BROKEN_NAME] {
        let target = format!("{name}:80");
        let server = find(&server_records, "dial_failed", &target);
        assert_eq!(server["agent_id"], "dns-agent");
        assert!(
            server["reason"]
                .as_str()
                .unwrap()
                .starts_with(&format!("dial tcp: lookup {name}: ")),
            "{server}"
        );
        let agent = find(&agent_records, "dial_failed", &target);
        assert_eq!(agent["dial_id"], server["dial_id"]);
        assert!(agent.get("dialed").is_none(), "nothing was dialed: {agent}");
    }
}

/// A DNS server on 127.0.0.1:53 (UDP) that resolves nothing: NXDOMAIN under `.invalid`,
/// SERVFAIL for every other name. Records each question's name.
struct TestDns {
    asked: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestDns {
    async fn start() -> Self {
        let socket = UdpSocket::bind("127.0.0.1:53").await.unwrap();
        let asked = Arc::new(Mutex::new(Vec::new()));
        let seen = asked.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 512];
            // Bounded: a test asks a handful of questions.
            for _ in 0..1000 {
                let Ok((len, from)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let Some((name, reply)) = answer(&buf[..len]) else {
                    continue;
                };
                seen.lock().unwrap().push(name);
                let _ = socket.send_to(&reply, from).await;
            }
        });
        Self { asked, task }
    }

    fn asked(&self) -> Vec<String> {
        self.asked.lock().unwrap().clone()
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The question's name and the reply to a one-question query; `None` for anything else.
fn answer(query: &[u8]) -> Option<(String, Vec<u8>)> {
    let header = query.get(..12)?;
    if header[2] & 0x80 != 0 || u16::from_be_bytes([header[4], header[5]]) != 1 {
        return None;
    }
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = usize::from(*query.get(at)?);
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).to_ascii_lowercase());
        at += len;
    }
    let question = query.get(12..at + 4)?;
    let name = labels.join(".");
    let rcode = if labels.last().is_some_and(|l| l == "invalid") {
        3 // NXDOMAIN
    } else {
        2 // SERVFAIL
    };
    let mut reply = Vec::with_capacity(12 + question.len());
    reply.extend_from_slice(&header[..2]);
    // QR, the query's opcode and RD, RA, the rcode; one question, no records.
    reply.push(0x80 | (header[2] & 0x79));
    reply.push(0x80 | rcode);
    reply.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    reply.extend_from_slice(question);
    Some((name, reply))
}
