//! Agents that share one source address (nodes behind a NAT gateway, a load balancer's SNAT)
//! against the real server with its default caps: every authenticated agent is admitted,
//! while connections that never authenticate stay capped per address, and both ends say
//! which flag refused what.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use tether_grpc::client::Channel;
use tether_grpc::{H2Settings, PacketReceiver, PacketSender};
use tether_testkit::Pki;
use tether_testkit::http::{get, metric_value};
use tether_testkit::process::{Frontend, LoggedChild, agent_args, free_port, server_flags};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::process::Command;

use crate::{STEP, bin};

/// More agents than the per-address cap (100) lets connect at once.
const AGENTS: usize = 300;
const READY: &str = "konnectivity_network_proxy_server_ready_backend_connections";
/// The default `--max-agent-connections-per-address`.
const UNADMITTED_PER_ADDRESS: usize = 100;

/// One agent stream as a tether agent opens it, with the PKI's agent certificate.
struct AgentStream {
    _sender: PacketSender,
    _receiver: PacketReceiver,
    _channel: Channel,
}

/// The TLS configuration of the PKI's agent certificate, as a tether agent presents it.
fn agent_tls(pki: &Pki) -> std::sync::Arc<rustls::ClientConfig> {
    let f = &pki.files;
    tether_tls::client_config(
        &f.ca_cert,
        Some((&f.agent_cert, &f.agent_key)),
        vec![b"h2".to_vec()],
        &Default::default(),
    )
    .unwrap()
}

async fn connect_agent(
    tls: std::sync::Arc<rustls::ClientConfig>,
    addr: SocketAddr,
    agent_id: String,
) -> AgentStream {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from(addr.ip().to_string()).unwrap();
    let tls = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap_or_else(|e| panic!("{agent_id}: TLS handshake: {e}"));
    let (channel, driver) = Channel::handshake(
        tls,
        &H2Settings::agent_stream(),
        &addr.ip().to_string(),
        true,
    )
    .await
    .unwrap();
    tokio::spawn(driver.run());
    let (sender, mut receiver) = channel
        .call(
            tether_proto::path::CONNECT,
            &[("agentid", agent_id.clone())],
        )
        .await
        .unwrap();
    if let Err(e) = receiver.response_headers().await {
        panic!("{agent_id}: the server refused the agent stream: {e}");
    }
    AgentStream {
        _sender: sender,
        _receiver: receiver,
        _channel: channel,
    }
}

async fn server_metric(admin: SocketAddr, sample: &str) -> f64 {
    let (_, text) = get(admin, "/metrics").await.unwrap();
    metric_value(&text, sample).unwrap_or(0.0)
}

/// Whether the server closed `conn` (EOF or reset) within `wait`; a held connection times out.
async fn closed_within(conn: &mut TcpStream, wait: Duration) -> bool {
    let mut byte = [0u8; 1];
    matches!(
        tokio::time::timeout(wait, conn.read(&mut byte)).await,
        Ok(Ok(0) | Err(_))
    )
}

fn log_path(pki: &Pki, name: &str) -> PathBuf {
    pki.dir().join(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_agents_share_one_address_and_strangers_stay_capped_with_default_flags() {
    let pki = Pki::generate().unwrap();
    let ports = [free_port(), free_port(), free_port()];
    let agent_addr = SocketAddr::from(([127, 0, 0, 1], ports[0]));
    let admin = SocketAddr::from(([127, 0, 0, 1], ports[2]));
    let mut args = vec!["server".to_owned()];
    // No cap flag: the defaults are what is tested.
    args.extend(server_flags(
        &pki,
        &Frontend::GrpcUds(pki.dir().join("frontend.sock")),
        None,
        ports,
    ));
    let server =
        LoggedChild::spawn(Command::new(bin()).args(args), log_path(&pki, "server.log")).unwrap();
    tether_testkit::http::wait_for_200(
        SocketAddr::from(([127, 0, 0, 1], ports[1])),
        "/healthz",
        STEP,
    )
    .await
    .unwrap();

    // 300 agents from 127.0.0.1, 100 at a time: the per-address cap counts only the
    // connections still in TLS or admission, never the admitted ones before them.
    let tls = agent_tls(&pki);
    let mut agents = Vec::with_capacity(AGENTS);
    for batch in 0..AGENTS / UNADMITTED_PER_ADDRESS {
        let mut connecting = tokio::task::JoinSet::new();
        for i in 0..UNADMITTED_PER_ADDRESS {
            let id = format!("node-{}", batch * UNADMITTED_PER_ADDRESS + i);
            connecting.spawn(tokio::time::timeout(
                STEP,
                connect_agent(tls.clone(), agent_addr, id),
            ));
        }
        while let Some(done) = connecting.join_next().await {
            agents.push(done.unwrap().expect("the agent connects in time"));
        }
    }
    assert_eq!(server_metric(admin, READY).await, AGENTS as f64);
    let address_hits = "tether_server_limit_hits_total{limit=\"address_connections\"}";
    assert_eq!(server_metric(admin, address_hits).await, 0.0);

    // A flood from the same address that never authenticates (TCP only, no TLS byte): the
    // first 100 are held, every further one is closed at accept.
    let flood = UNADMITTED_PER_ADDRESS + 50;
    let mut strangers = Vec::with_capacity(flood);
    for _ in 0..flood {
        strangers.push(TcpStream::connect(agent_addr).await.unwrap());
    }
    let mut closed = 0;
    for (i, conn) in strangers.iter_mut().enumerate() {
        let wait = if i < UNADMITTED_PER_ADDRESS {
            Duration::from_millis(5)
        } else {
            Duration::from_secs(2)
        };
        if closed_within(conn, wait).await {
            closed += 1;
        }
    }
    assert_eq!(closed, flood - UNADMITTED_PER_ADDRESS);
    assert_eq!(
        server_metric(admin, address_hits).await,
        (flood - UNADMITTED_PER_ADDRESS) as f64
    );
    server
        .wait_for_log("raise --max-agent-connections-per-address (connections from one address with no agent stream admitted yet", STEP)
        .await
        .unwrap();

    // A real agent arriving while the strangers hold the address's slots is refused before
    // TLS and says so; once they are gone it connects.
    let health = free_port();
    let mut late_args = agent_args(&pki, agent_addr, health, free_port());
    late_args.push("--agent-id=late-node".into());
    let late = LoggedChild::spawn(
        Command::new(bin()).args(late_args),
        log_path(&pki, "agent.log"),
    )
    .unwrap();
    late.wait_for_log(
        "the server closed the connection before the TLS handshake (a connection limit? see --max-agent-connections-per-address",
        STEP,
    )
    .await
    .unwrap();
    drop(strangers);
    tether_testkit::http::wait_for_200(SocketAddr::from(([127, 0, 0, 1], health)), "/readyz", STEP)
        .await
        .unwrap_or_else(|e| panic!("the agent never connected: {e}\n{}", late.log()));
    // The 300 are still there, and the late agent beside them.
    let deadline = tokio::time::Instant::now() + STEP;
    while server_metric(admin, READY).await != (AGENTS + 1) as f64 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the server counts {} agents",
            server_metric(admin, READY).await
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(agents);
}
