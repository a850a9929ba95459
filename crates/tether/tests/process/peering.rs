//! Server peering with real processes (issue 29): three `tether server`s on 127.0.0.2–.4,
//! linked on their peer ports, and three `tether agent`s that each hold one server
//! (`--agent-server-connections=1`) and advertise an address of their own (`destHost`). A
//! gRPC client of the first server reaches every agent, through the server that holds it;
//! a gibibyte crosses a peer hop byte for byte; killing a holder fails its forwarded
//! connections with an error, and its agent is reached again once it re-homed.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use tokio::time::Instant;

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Frontend, Process, agent_args, free_port, server_flags};
use tether_testkit::targets::{EchoServer, pattern};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{STEP, bin};

const OPEN_AT_AGENT: &str = "konnectivity_network_proxy_agent_open_endpoint_connections";
/// Agents a server holds itself, and those its peers announced to it.
const LOCAL_AGENTS: &str = "konnectivity_network_proxy_server_ready_backend_connections";
const PEER_AGENTS: &str = "tether_server_peer_agents";

struct Member {
    process: Process,
    uds: PathBuf,
}

/// `tether server` on 127.0.0.`host`, its agent and peer ports shared by the fleet.
async fn server(pki: &Pki, host: u8, agent_port: u16, peer_port: u16, peers: &str) -> Member {
    let uds = pki.dir().join(format!("server-{host}.sock"));
    let (health, admin) = (free_port(), free_port());
    let mut args = vec!["server".to_owned()];
    args.extend(
        server_flags(
            pki,
            &Frontend::GrpcUds(uds.clone()),
            None,
            [agent_port, health, admin],
        )
        .into_iter()
        .map(|flag| match flag.as_str() {
            "--agent-bind-address=127.0.0.1" => format!("--agent-bind-address=127.0.0.{host}"),
            _ => flag,
        }),
    );
    let f = &pki.files;
    args.extend([
        format!("--server-id=server-{host}"),
        "--server-count=3".into(),
        "--proxy-strategies=destHost,default".into(),
        // The test PKI's one agent certificate proves no node's address.
        "--agent-identity-binding=off".into(),
        format!("--peer-port={peer_port}"),
        format!("--peer-bind-address=127.0.0.{host}"),
        format!("--peer-cert-file={}", f.peer_cert.display()),
        format!("--peer-key-file={}", f.peer_key.display()),
        format!("--peer-ca-cert={}", f.ca_cert.display()),
        format!("--peer-addresses={peers}"),
    ]);
    let process = Process::spawn(bin(), args, ([127, 0, 0, 1], health).into())
        .await
        .unwrap();
    Member { process, uds }
}

/// `tether agent` `node-<n>` holding one of `servers`, advertising `ipv4=<own>`; with its
/// admin address.
async fn agent(
    pki: &Pki,
    n: u8,
    servers: &str,
    agent_port: u16,
    own: SocketAddr,
) -> (Process, SocketAddr) {
    let (health, admin) = (free_port(), free_port());
    let mut args = agent_args(
        pki,
        SocketAddr::from(([127, 0, 0, 2], agent_port)),
        health,
        admin,
    );
    args.retain(|flag| !flag.starts_with("--proxy-server-host="));
    args.extend([
        "--proxy-server-host=localhost".to_owned(),
        format!("--proxy-server-addresses={servers}"),
        "--agent-server-connections=1".into(),
        format!("--agent-id=node-{n}"),
        format!("--agent-identifiers=ipv4={}", own.ip()),
    ]);
    let process = Process::spawn(bin(), args, ([127, 0, 0, 1], health).into())
        .await
        .unwrap();
    (process, ([127, 0, 0, 1], admin).into())
}

/// The server address an agent's one stream runs to, from its `/debug/agents`.
async fn holder(admin: SocketAddr) -> Option<SocketAddr> {
    let (_, body) = tether_testkit::http::get(admin, "/debug/agents")
        .await
        .ok()?;
    let report: serde_json::Value = serde_json::from_str(&body).ok()?;
    let streams = report["streams"].as_array()?;
    match streams.as_slice() {
        [one] => one["server_address"].as_str()?.parse().ok(),
        _ => None,
    }
}

async fn open_at(agent: &Process) -> f64 {
    metric_value(&agent.metrics().await.unwrap_or_default(), OPEN_AT_AGENT).unwrap_or(0.0)
}

/// Waits until `member` knows `agents` agents, its own and its peers' together: before the
/// announcements arrive, `default` would route a destHost dial to any agent it holds.
async fn wait_for_agents(member: &Member, agents: f64) {
    let started = Instant::now();
    loop {
        let text = member.process.metrics().await.unwrap_or_default();
        let known = metric_value(&text, LOCAL_AGENTS).unwrap_or(0.0)
            + metric_value(&text, PEER_AGENTS).unwrap_or(0.0);
        if known == agents {
            return;
        }
        assert!(
            started.elapsed() < STEP,
            "the first server knows {known} of {agents} agents"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A tunnel from `member` to `target`, retried until it opens (within the step bound).
async fn dial_until_open(member: &Member, target: SocketAddr) -> tether_client::TunnelStream {
    let started = Instant::now();
    loop {
        let dialed = match GrpcClient::connect(&Transport::Unix(member.uds.clone())).await {
            Ok(client) => client
                .dial(&target.to_string())
                .await
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match dialed {
            Ok(tunnel) => return tunnel,
            Err(e) => assert!(started.elapsed() < STEP, "{target} never reached: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sends `chunks` MiB of a pattern through `tunnel` (to an echo) and checks every byte that
/// comes back, without holding the whole of it.
async fn echo_exact(tunnel: tether_client::TunnelStream, chunks: u64) {
    const MIB: usize = 1024 * 1024;
    let (mut rd, mut wr) = tokio::io::split(tunnel);
    let send = async {
        for i in 0..chunks {
            wr.write_all(&pattern(i, MIB)).await.unwrap();
        }
    };
    let check = async {
        let mut got = vec![0u8; MIB];
        for i in 0..chunks {
            rd.read_exact(&mut got).await.unwrap();
            assert!(got == pattern(i, MIB), "MiB {i} differs");
        }
    };
    tokio::join!(send, check);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_one_server_reaches_every_agent_through_the_server_that_holds_it() {
    tether_testkit::init_logging();
    let pki = Pki::generate().unwrap();
    let (agent_port, peer_port) = (free_port(), free_port());
    let peers = "127.0.0.2,127.0.0.3,127.0.0.4";
    let mut members = Vec::new();
    for host in 2..=4 {
        members.push(server(&pki, host, agent_port, peer_port, peers).await);
    }
    let servers = format!("127.0.0.2:{agent_port},127.0.0.3:{agent_port},127.0.0.4:{agent_port}");
    // Each agent's destination: an echo server on a loopback address of its own.
    let mut echoes = Vec::new();
    let mut agents = Vec::new();
    for n in 1..=3u8 {
        let echo = EchoServer::start_at(([127, 0, 1, n], 0).into())
            .await
            .unwrap();
        agents.push(agent(&pki, n, &servers, agent_port, echo.addr).await);
        echoes.push(echo);
    }
    let front = &members[0];
    wait_for_agents(front, 3.0).await;
    // Every agent reached from the first server, by its own address (destHost): while the
    // connection is open, the agent that advertised it, and no other, carries it.
    for (n, echo) in echoes.iter().enumerate() {
        let mut tunnel = dial_until_open(front, echo.addr).await;
        tunnel.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        tunnel.read_exact(&mut back).await.unwrap();
        for (m, (other, _)) in agents.iter().enumerate() {
            let want = if m == n { 1.0 } else { 0.0 };
            assert_eq!(
                open_at(other).await,
                want,
                "node-{} carries node-{}'s",
                m + 1,
                n + 1
            );
        }
    }

    // An agent another server holds: a gibibyte each way through the peer hop.
    let front_address: SocketAddr = ([127, 0, 0, 2], agent_port).into();
    let mut remote = None;
    for (n, (_, admin)) in agents.iter().enumerate() {
        let started = Instant::now();
        let held = loop {
            if let Some(held) = holder(*admin).await {
                break held;
            }
            assert!(started.elapsed() < STEP, "node-{} reports no server", n + 1);
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        if held != front_address {
            remote = Some((n, held));
            break;
        }
    }
    let (n, held) = remote.expect("with three agents over three servers, one is elsewhere");
    let started = Instant::now();
    echo_exact(dial_until_open(front, echoes[n].addr).await, 1024).await;
    eprintln!(
        "1 GiB each way through the peer hop in {:?}",
        started.elapsed()
    );

    // Its holder is killed: the forwarded connection fails with an error; the agent
    // re-homes and is reached again.
    let mut open = dial_until_open(front, echoes[n].addr).await;
    let index = usize::from(match held.ip() {
        std::net::IpAddr::V4(ip) => ip.octets()[3],
        std::net::IpAddr::V6(_) => unreachable!(),
    }) - 2;
    members[index].process.signal("KILL").await.unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(STEP, open.read_to_end(&mut rest))
        .await
        .expect("the forwarded connection ends");
    assert!(
        read.is_err(),
        "a clean end ({} bytes) where the holder died",
        rest.len()
    );
    let started = Instant::now();
    let mut tunnel = dial_until_open(front, echoes[n].addr).await;
    eprintln!(
        "re-homed and reached again {:?} after its holder died",
        started.elapsed()
    );
    tunnel.write_all(b"again").await.unwrap();
    let mut back = [0u8; 5];
    tunnel.read_exact(&mut back).await.unwrap();
    assert_eq!(&back, b"again");
}
