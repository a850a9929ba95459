//! Server peering (issue 29): servers on 127.0.0.2, .3, …, linked to each other on their
//! peer ports. An agent holds a stream to one of them only; a client of any server reaches
//! it, through the server that holds it, which checks the client again, records the hop,
//! and keeps each forwarded connection's flow its own. The holder's death ends its
//! forwarded connections with an error.

use std::time::Duration;
use tokio::time::Instant;

use tether_client::{GrpcClient, Transport};
use tether_observe::audit::AuditTarget;
use tether_testkit::fleet::Fleet;
use tether_testkit::targets::{EchoServer, SourceServer, pattern};
use tether_testkit::{AgentOptions, Pki, TestAgent, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Bounds that only catch a hang.
const STEP: Duration = Duration::from_secs(30);

async fn client_of(server: &TestServer) -> GrpcClient {
    GrpcClient::connect(&Transport::Unix(server.uds.clone().unwrap()))
        .await
        .unwrap()
}

/// One echo through `server`'s frontend; the dial's error if it fails.
async fn echo_through(server: &TestServer, echo: &EchoServer) -> Result<(), String> {
    let client = client_of(server).await;
    let mut tunnel = tokio::time::timeout(STEP, client.dial(&echo.addr.to_string()))
        .await
        .map_err(|_| "dial hung".to_owned())?
        .map_err(|e| e.to_string())?;
    tunnel.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut back = [0u8; 4];
    tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
        .await
        .map_err(|_| "echo hung".to_owned())?
        .map_err(|e| e.to_string())?;
    assert_eq!(&back, b"ping");
    Ok(())
}

/// Polls every 20 ms until an echo through `server` succeeds; panics after `within`.
async fn reachable(server: &TestServer, echo: &EchoServer, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        match echo_through(server, echo).await {
            Ok(()) => return started.elapsed(),
            Err(e) => assert!(
                started.elapsed() < within,
                "not reachable within {within:?}: {e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// An agent holding one stream, to member `host` only (TLS verifies `localhost`).
async fn held_by(fleet: &Fleet, host: u8) -> TestAgent {
    TestAgent::start(
        &fleet.pki,
        fleet.address(host),
        AgentOptions {
            agent_id: format!("held-by-{host}"),
            discovery: tether_agent::Discovery::List([fleet.address(host)].into()),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_of_any_server_reaches_an_agent_one_server_holds() {
    tether_testkit::init_logging();
    let fleet = Fleet::start_peered(3).await.unwrap();
    // The agent holds one stream, to the third server only.
    let agent = held_by(&fleet, 4).await;
    let echo = EchoServer::start().await.unwrap();
    for server in &fleet.servers {
        reachable(server, &echo, Duration::from_secs(5)).await;
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_s_death_fails_its_forwarded_connections_and_a_new_holder_takes_over() {
    tether_testkit::init_logging();
    let mut fleet = Fleet::start_peered(3).await.unwrap();
    let agent = held_by(&fleet, 4).await;
    let echo = EchoServer::start().await.unwrap();
    reachable(&fleet.servers[0], &echo, Duration::from_secs(5)).await;
    let client = client_of(&fleet.servers[0]).await;
    let mut open = client.dial(&echo.addr.to_string()).await.unwrap();
    open.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    open.read_exact(&mut back).await.unwrap();
    // The holder goes away: the forwarded connection ends with an error, not a clean end.
    fleet.servers.pop().unwrap().stop().await;
    agent.stop().await;
    let mut rest = Vec::new();
    let read = tokio::time::timeout(STEP, open.read_to_end(&mut rest))
        .await
        .expect("the connection ends");
    assert!(
        read.is_err(),
        "a clean end ({rest:?}) where the holder died"
    );
    // No server holds the agent now: "no agent", as without peering.
    let front = &fleet.servers[0];
    let error = echo_through(front, &echo).await.unwrap_err();
    assert!(error.contains("No agent available"), "{error}");
    // Held again by another server, it is reached again.
    let agent = held_by(&fleet, 3).await;
    reachable(front, &echo, Duration::from_secs(5)).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_checks_its_own_destination_policy_again() {
    tether_testkit::init_logging();
    let echo = EchoServer::start().await.unwrap();
    // The holder refuses every destination; the server the client is connected to has no
    // policy.
    let pki = Pki::generate().unwrap();
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(pki.dir()).unwrap());
    let fleet = Fleet::start_with(pki, 2, true, |host, options| {
        if host == 3 {
            let routing = format!(
                "destinations:\n  - name: nothing\n    clients: [\"uid:{uid}\"]\n    rules:\n      - deny all\n"
            );
            options.routing = tether_server::RoutingConfig::from_yaml(&routing).unwrap();
        }
    })
    .await
    .unwrap();
    let agent = held_by(&fleet, 3).await;
    let started = Instant::now();
    let error = loop {
        let error = echo_through(&fleet.servers[0], &echo).await.unwrap_err();
        if !error.contains("No agent available") || started.elapsed() > Duration::from_secs(5) {
            break error;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(error.contains("policy"), "{error}");
    // The holder's refusals are its own: more of them than ejection takes (5 in a row)
    // do not eject the agent on the client's server.
    for _ in 0..6 {
        let error = echo_through(&fleet.servers[0], &echo).await.unwrap_err();
        assert!(error.contains("refused by the agent's server"), "{error}");
    }
    let ejections = metric(&fleet.servers[0], "tether_server_agent_ejections_total").await;
    assert_eq!(
        ejections, 0.0,
        "a holder's refusal counted against its agent"
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_reached_at_two_addresses_keeps_one_steady_link() {
    tether_testkit::init_logging();
    let mut fleet = Fleet::start_peered(2).await.unwrap();
    let (peer_port, list) = fleet.peers.take().unwrap();
    // The second server also answers at a relay's address (a second address of its pod).
    let second = std::net::SocketAddr::from(([127, 0, 0, 3], peer_port));
    let relay = tether_testkit::cut_relay::CuttingRelay::start(second)
        .await
        .unwrap();
    list.send_modify(|peers| {
        peers.insert(relay.addr);
    });
    let agent = held_by(&fleet, 3).await;
    let echo = EchoServer::start().await.unwrap();
    reachable(&fleet.servers[0], &echo, Duration::from_secs(5)).await;
    // A forwarded connection stays up while the two addresses' keepers try for seconds.
    let client = client_of(&fleet.servers[0]).await;
    let mut open = client.dial(&echo.addr.to_string()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    open.write_all(b"still").await.unwrap();
    let mut back = [0u8; 5];
    tokio::time::timeout(STEP, open.read_exact(&mut back))
        .await
        .expect("the connection outlived the second address's attempts")
        .unwrap();
    assert_eq!(&back, b"still");
    let links = metric(
        &fleet.servers[1],
        "tether_server_peer_links{direction=\"in\"}",
    )
    .await;
    assert_eq!(links, 1.0, "one link from the first server, not two");
    assert!(relay.forwarded() >= 1, "the second address was tried");
    drop(open);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_servers_audit_a_forwarded_connection_and_name_the_hop() {
    tether_testkit::init_logging();
    let pki = Pki::generate().unwrap();
    let dir = pki.dir().to_owned();
    let log = |host: u8| dir.join(format!("audit-{host}.log"));
    let fleet = Fleet::start_with(pki, 2, true, |host, options| {
        options.audit_log = Some(AuditTarget::File(log(host)));
    })
    .await
    .unwrap();
    let agent = held_by(&fleet, 3).await;
    let echo = EchoServer::start().await.unwrap();
    reachable(&fleet.servers[0], &echo, Duration::from_secs(5)).await;
    let ended = |host: u8| {
        let started = Instant::now();
        loop {
            let found = std::fs::read_to_string(log(host))
                .unwrap_or_default()
                .lines()
                .map(|line| serde_json::from_str::<serde_json::Value>(line).unwrap())
                .find(|r| r["event"] == "connection" && r["outcome"] == "ok");
            match found {
                Some(record) => return record,
                None => assert!(
                    started.elapsed() < STEP,
                    "no connection record on server-{host}: {}",
                    std::fs::read_to_string(log(host)).unwrap_or_default()
                ),
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let (front, holder) = (ended(2), ended(3));
    assert_eq!(front["via_server"], "server-3", "{front}");
    assert_eq!(holder["from_server"], "server-2", "{holder}");
    // The holder names the client as the first server's listener proved it.
    assert_eq!(holder["client"], front["client"], "{holder}");
    assert_eq!(holder["transport"], "uds", "{holder}");
    assert_eq!(holder["requested"], echo.addr.to_string());
    assert_eq!(front["agent_id"], holder["agent_id"]);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_reader_on_a_forwarded_connection_holds_back_no_other() {
    tether_testkit::init_logging();
    const LEN: usize = 16 * 1024 * 1024;
    let fleet = Fleet::start_peered(2).await.unwrap();
    let agent = held_by(&fleet, 3).await;
    let echo = EchoServer::start().await.unwrap();
    let source = SourceServer::start().await.unwrap();
    let front = &fleet.servers[0];
    reachable(front, &echo, Duration::from_secs(5)).await;
    let client = client_of(front).await;
    // One forwarded connection's reader never reads what its source keeps sending.
    let mut stalled = client.dial(&source.addr.to_string()).await.unwrap();
    stalled.write_all(&u64::MAX.to_be_bytes()).await.unwrap();
    // Another one carries megabytes both ways, byte for byte.
    let mut flowing = client.dial(&echo.addr.to_string()).await.unwrap();
    let sent = pattern(3, LEN);
    let (mut rd, mut wr) = tokio::io::split(&mut flowing);
    let mut got = vec![0u8; LEN];
    let (written, read) = tokio::time::timeout(STEP, async {
        tokio::join!(wr.write_all(&sent), rd.read_exact(&mut got))
    })
    .await
    .expect("the flowing connection is not held back");
    written.unwrap();
    read.unwrap();
    assert!(got == sent, "the echo differs");
    drop(stalled);
    drop(flowing);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_s_client_reaches_only_its_tenant_s_agents_through_a_peer() {
    tether_testkit::init_logging();
    let (pki, certs) = Pki::generate_with_client_files(&["agent.acme", "agent.globex"]).unwrap();
    let dir = pki.dir().display().to_string();
    let fleet = Fleet::start_with(pki, 2, true, |host, options| {
        let routing = format!(
            "tenants:
  - name: acme
    frontend: {{unix: \"{dir}/acme-{host}.sock\"}}
    agents: [\"cert:agent.acme\"]
  - name: globex
    frontend: {{unix: \"{dir}/globex-{host}.sock\"}}
    agents: [\"cert:agent.globex\"]
"
        );
        options.routing = tether_server::RoutingConfig::from_yaml(&routing).unwrap();
    })
    .await
    .unwrap();
    // Only globex has an agent, held by the second server.
    let agent = TestAgent::start(
        &fleet.pki,
        fleet.address(3),
        AgentOptions {
            discovery: tether_agent::Discovery::List([fleet.address(3)].into()),
            client_cert: Some(certs[1].clone()),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let echo = EchoServer::start().await.unwrap();
    let own = |tenant: &str| {
        let (_, path) = fleet.servers[0]
            .tenant_frontends
            .iter()
            .find(|(name, _)| name == tenant)
            .unwrap();
        Transport::Unix(path.into())
    };
    let started = Instant::now();
    loop {
        let client = GrpcClient::connect(&own("globex")).await.unwrap();
        if client.dial(&echo.addr.to_string()).await.is_ok() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "globex never reached its agent"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let acme = GrpcClient::connect(&own("acme")).await.unwrap();
    let error = acme.dial(&echo.addr.to_string()).await.unwrap_err();
    assert!(error.to_string().contains("No agent available"), "{error}");
    agent.stop().await;
}

/// An agent that knows every member and holds `k` of them, as rendezvous ranks them.
async fn holding_k(fleet: &Fleet, id: &str, k: usize) -> TestAgent {
    TestAgent::start(
        &fleet.pki,
        fleet.address(2),
        AgentOptions {
            agent_id: id.to_owned(),
            discovery: tether_agent::Discovery::List(fleet.addresses()),
            server_connections: std::num::NonZeroUsize::new(k),
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// `sample` on `server`'s metrics page; 0 when absent.
async fn metric(server: &TestServer, sample: &str) -> f64 {
    tether_testkit::http::metric_value(&server.metrics().await.unwrap(), sample).unwrap_or(0.0)
}

const READY_AGENTS: &str = "konnectivity_network_proxy_server_ready_backend_connections";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_holding_one_server_each_are_reached_from_all_and_re_home_when_it_dies() {
    tether_testkit::init_logging();
    let mut fleet = Fleet::start_peered(3).await.unwrap();
    let mut agents = Vec::new();
    for n in 0..6 {
        agents.push(holding_k(&fleet, &format!("node-{n}"), 1).await);
    }
    // Each agent holds one stream: six in all over the three servers.
    let started = Instant::now();
    loop {
        let mut held = 0.0;
        for server in &fleet.servers {
            held += metric(server, READY_AGENTS).await;
        }
        if held == 6.0 {
            break;
        }
        assert!(started.elapsed() < STEP, "{held} of 6 agents held");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let echo = EchoServer::start().await.unwrap();
    for server in &fleet.servers {
        reachable(server, &echo, Duration::from_secs(5)).await;
    }
    // The server holding the most agents dies; they move to the others, and every agent
    // is reached again from a surviving server.
    let mut most = (0, 0.0);
    for (i, server) in fleet.servers.iter().enumerate() {
        let held = metric(server, READY_AGENTS).await;
        if held > most.1 {
            most = (i, held);
        }
    }
    fleet.servers.remove(most.0).stop().await;
    let started = Instant::now();
    loop {
        let mut held = 0.0;
        for server in &fleet.servers {
            held += metric(server, READY_AGENTS).await;
        }
        if held == 6.0 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{held} of 6 agents re-homed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!("every agent re-homed after {:?}", started.elapsed());
    for server in &fleet.servers {
        reachable(server, &echo, Duration::from_secs(5)).await;
    }
    for agent in agents {
        agent.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_shows_peer_links_remote_agents_and_each_connection_s_hop() {
    tether_testkit::init_logging();
    let fleet = Fleet::start_peered(2).await.unwrap();
    let agent = held_by(&fleet, 3).await;
    let echo = EchoServer::start().await.unwrap();
    let (front, holder) = (&fleet.servers[0], &fleet.servers[1]);
    reachable(front, &echo, Duration::from_secs(5)).await;
    let client = client_of(front).await;
    let mut open = client.dial(&echo.addr.to_string()).await.unwrap();
    open.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    open.read_exact(&mut back).await.unwrap();

    let json = |server: &TestServer, path: &'static str| {
        let admin = server.admin_addr;
        async move {
            let (status, body) = tether_testkit::http::get(admin, path).await.unwrap();
            assert_eq!(status, 200, "{body}");
            serde_json::from_str::<serde_json::Value>(&body).unwrap()
        }
    };
    // The links come up in both directions (a server that started before its peer links
    // to it on a retry).
    let started = Instant::now();
    let agents = loop {
        let agents = json(front, "/debug/agents").await;
        if agents["peers"].as_array().is_some_and(|p| p.len() == 2) {
            break agents;
        }
        assert!(started.elapsed() < STEP, "not two peer links: {agents}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let remote: Vec<&serde_json::Value> = agents["streams"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["via_server"] == "server-3")
        .collect();
    assert_eq!(remote.len(), 1, "{agents}");
    assert_eq!(remote[0]["agent_id"], "held-by-3");
    assert_eq!(remote[0]["connections"], 1, "{agents}");
    let directions: Vec<&str> = agents["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["direction"].as_str().unwrap())
        .collect();
    assert_eq!(directions, ["in", "out"], "{agents}");
    let inbound = &agents["peers"][0];
    assert_eq!(inbound["peer_server_id"], "server-3");
    assert_eq!(inbound["agents"], 1);
    assert_eq!(inbound["connections"], 1);

    let at_front = json(front, "/debug/connections").await;
    let forwarded = &at_front["connections"][0];
    assert_eq!(forwarded["via_server"], "server-3", "{at_front}");
    assert_eq!(forwarded["agent_id"], "held-by-3");
    let at_holder = json(holder, "/debug/connections").await;
    let carried = &at_holder["connections"][0];
    assert_eq!(carried["from_server"], "server-2", "{at_holder}");
    assert_eq!(carried["client"], forwarded["client"]);

    let text = front.metrics().await.unwrap();
    for (sample, want) in [
        ("tether_server_peer_links{direction=\"in\"}", 1.0),
        ("tether_server_peer_links{direction=\"out\"}", 1.0),
        ("tether_server_peer_agents", 1.0),
        (
            "konnectivity_network_proxy_server_ready_backend_connections",
            0.0,
        ),
    ] {
        assert_eq!(
            tether_testkit::http::metric_value(&text, sample).unwrap_or(0.0),
            want,
            "{sample}"
        );
    }
    drop(open);
    agent.stop().await;
}

const PEER_AGENTS: &str = "tether_server_peer_agents";

/// A dial a server sends through a peer for an agent the peer has just lost, before the
/// peer's announcement that it left arrives (announcements gather for 50 ms), goes to
/// another agent instead of failing with the peer's "No agent available": the refusal
/// withdraws that route and the dial takes the next. Found by the soak (session 26).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dial_the_holder_refuses_for_an_agent_it_lost_goes_to_another_agent() {
    tether_testkit::init_logging();
    let fleet = Fleet::start_peered(2).await.unwrap();
    let (front, holder) = (&fleet.servers[0], &fleet.servers[1]);
    let own = held_by(&fleet, 2).await;
    let lost = held_by(&fleet, 3).await;
    let echo = EchoServer::start().await.unwrap();
    let started = Instant::now();
    while metric(front, PEER_AGENTS).await != 1.0 || metric(front, READY_AGENTS).await != 1.0 {
        assert!(started.elapsed() < STEP, "the front never knew both agents");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The agent goes away abruptly; its server drops it at once, and tells its peer later.
    drop(lost);
    while metric(holder, READY_AGENTS).await != 0.0 {
        assert!(started.elapsed() < STEP, "the holder kept the lost agent");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let client = client_of(front).await;
    let mut dials = 0;
    let window = Instant::now();
    while window.elapsed() < Duration::from_millis(300) {
        let mut tunnel = tokio::time::timeout(STEP, client.dial(&echo.addr.to_string()))
            .await
            .expect("the dial ends")
            .unwrap_or_else(|e| panic!("dial {dials} failed: {e}"));
        tunnel.write_all(b"ping").await.unwrap();
        let mut back = [0u8; 4];
        tokio::time::timeout(STEP, tunnel.read_exact(&mut back))
            .await
            .expect("the echo comes back")
            .unwrap();
        dials += 1;
    }
    assert!(dials >= 10, "only {dials} dials");
    assert_eq!(
        metric(front, PEER_AGENTS).await,
        0.0,
        "the peer's announcement came"
    );
    own.stop().await;
}
