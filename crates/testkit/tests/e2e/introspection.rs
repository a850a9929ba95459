//! `/debug/connections` and `/debug/agents` on the admin ports of a real server and agent,
//! with connections open through both frontends.

use std::net::SocketAddr;
use std::time::Duration;

use tether_client::{GrpcClient, Transport as ClientTransport};
use tether_observe::introspect::{AgentsReport, ConnectionView, ConnectionsReport};
use tether_server::Mode;
use tether_testkit::http::get;
use tether_testkit::targets::{Blackhole, EchoServer};
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::STEP;
use crate::support::echo_exact;

async fn connections(admin: SocketAddr, query: &str) -> Vec<ConnectionView> {
    let path = format!("/debug/connections{query}");
    let (status, body) = get(admin, &path).await.expect("admin endpoint");
    assert_eq!(status, 200, "{path}: {body}");
    let report: ConnectionsReport = serde_json::from_str(&body).expect("report JSON");
    report.connections
}

async fn agents(admin: SocketAddr) -> AgentsReport {
    let (status, body) = get(admin, "/debug/agents").await.expect("admin endpoint");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).expect("report JSON")
}

/// Polls `admin` until `done` holds for its connections, or fails after [`STEP`].
async fn wait_until(admin: SocketAddr, what: &str, done: impl Fn(&[ConnectionView]) -> bool) {
    let until = tokio::time::Instant::now() + STEP;
    loop {
        let now = connections(admin, "").await;
        if done(&now) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < until,
            "{what}: still {now:#?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Stream for T {}

/// What one frontend's connection must show as its client.
struct Case {
    mode: Mode,
    transport: Transport,
    frontend: &'static str,
    client: String,
}

async fn open(pki: &Pki, server: &TestServer, mode: Mode, target: &str) -> Box<dyn Stream> {
    let transport = match &server.uds {
        Some(path) => ClientTransport::Unix(path.clone()),
        None => {
            let f = &pki.files;
            ClientTransport::Tls {
                addr: server.frontend_tcp.unwrap().to_string(),
                server_name: "127.0.0.1".into(),
                tls: tether_tls::client_config(
                    &f.ca_cert,
                    Some((f.client_cert.as_path(), f.client_key.as_path())),
                    Vec::new(),
                    &Default::default(),
                )
                .unwrap(),
            }
        }
    };
    match mode {
        Mode::Grpc => Box::new(
            GrpcClient::connect(&transport)
                .await
                .unwrap()
                .dial(target)
                .await
                .unwrap(),
        ),
        Mode::HttpConnect => Box::new(
            tether_client::dial_http_connect(&transport, target)
                .await
                .unwrap(),
        ),
    }
}

async fn connections_and_agents_through(case: Case) {
    let pki = Pki::generate().unwrap();
    let server_id = format!("server-{}", case.frontend);
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: case.mode,
            transport: case.transport,
            server_id: server_id.clone(),
            server_count: 2,
            // The PKI's one agent certificate proves no identifier: routing by what the
            // agent declares is the conscious choice of `off`.
            agent_identity_binding: tether_server::IdentityBinding::Off,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let agent_id = format!("node-{}", case.frontend);
    let agent = TestAgent::start(
        &pki,
        server.agent_addr,
        AgentOptions {
            agent_id: agent_id.clone(),
            identifiers: "host=node-a&ipv4=10.1.2.3".into(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    // The server announces a count of 2 (shown in the reports), so the agent, which is ready
    // only with a stream to every counted server, never is: the server's readiness (it has
    // the agent) is what the test needs.
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();

    assert!(connections(server.admin_addr, "").await.is_empty());

    let stream = open(&pki, &server, case.mode, &target).await;
    let stream = echo_exact(stream, 1, 10_000).await;

    // The server's view: one open connection with its client, agent and byte counts.
    let listed = connections(server.admin_addr, "").await;
    assert_eq!(listed.len(), 1, "{listed:#?}");
    let c = &listed[0];
    assert_eq!(c.state, "open");
    assert_eq!(c.frontend.as_deref(), Some(case.frontend));
    assert_eq!(c.client.as_deref(), Some(case.client.as_str()), "{c:#?}");
    assert_eq!(c.destination, target);
    assert_eq!(c.agent_id, agent_id);
    assert_eq!(c.server_id, server_id);
    let connect_id = c.connect_id.expect("an open connection has its ID");
    assert!(c.dial_id != 0);
    assert!(c.age_seconds >= 0.0 && c.age_seconds < STEP.as_secs_f64());
    assert!(
        c.bytes_sent >= 10_000 && c.bytes_received >= 10_000,
        "{c:#?}"
    );
    assert!(c.credit > 0 && c.queue_limit > 0, "{c:#?}");

    // The agent's view of the same connection: same IDs, its server named.
    let on_agent = connections(agent.admin_addr, "").await;
    assert_eq!(on_agent.len(), 1, "{on_agent:#?}");
    let a = &on_agent[0];
    assert_eq!(
        (a.connect_id, a.dial_id, a.state.as_str()),
        (Some(connect_id), c.dial_id, "open")
    );
    assert_eq!(
        (a.server_id.as_str(), a.agent_id.as_str()),
        (server_id.as_str(), agent_id.as_str())
    );
    assert_eq!(a.destination, target);
    assert!(a.frontend.is_none() && a.client.is_none(), "{a:#?}");

    // More traffic: the counters move.
    let before = c.bytes_sent;
    let stream = echo_exact(stream, 2, 50_000).await;
    let after = &connections(server.admin_addr, "").await[0];
    assert!(after.bytes_sent >= before + 50_000, "{after:#?}");
    assert!(after.bytes_received >= c.bytes_received + 50_000);

    // Filters select.
    let host = echo.addr.ip().to_string();
    for (query, expected) in [
        (format!("?agent={agent_id}"), 1),
        ("?agent=someone-else".to_owned(), 0),
        (format!("?destination={target}"), 1),
        (format!("?destination={host}"), 1),
        ("?destination=127.0.0.1:1".to_owned(), 0),
        ("?state=open".to_owned(), 1),
        ("?state=pending".to_owned(), 0),
        ("?client=nobody".to_owned(), 0),
    ] {
        let n = connections(server.admin_addr, &query).await.len();
        assert_eq!(n, expected, "{query}");
    }
    let first_word = case.client.split(' ').next().unwrap().to_owned();
    assert_eq!(
        connections(server.admin_addr, &format!("?client={first_word}"))
            .await
            .len(),
        1
    );
    let (status, body) = get(server.admin_addr, "/debug/connections?agnet=x")
        .await
        .unwrap();
    assert_eq!(status, 400, "a misspelt filter is refused: {body}");

    // Agents and membership.
    let report = agents(server.admin_addr).await;
    assert_eq!(
        (report.role.as_str(), report.server_id.as_str()),
        ("server", server_id.as_str())
    );
    assert_eq!(report.server_count, 2);
    assert_eq!(report.streams.len(), 1, "{report:#?}");
    let s = &report.streams[0];
    assert_eq!(s.agent_id, agent_id);
    assert_eq!(s.identifiers, "host=node-a&ipv4=10.1.2.3");
    assert_eq!((s.connections, s.pending_dials), (1, 0));
    assert!(s.credit_flow && !s.draining);
    // Both ends name the link the suite runs on: the native one unless
    // TETHER_TEST_AGENT_LINK=grpc.
    let link = tether_testkit::AgentLink::from_env().name();
    assert_eq!(s.transport, link);
    let own = agents(agent.admin_addr).await;
    assert_eq!(own.streams[0].transport, link);
    assert_eq!(
        (own.role.as_str(), own.agent_id.as_str()),
        ("agent", agent_id.as_str())
    );
    assert_eq!(own.server_count, 2, "the count the server announced");
    assert_eq!(own.streams.len(), 1);
    assert_eq!(own.streams[0].server_id, server_id);
    assert_eq!(own.streams[0].connections, 1);

    // Closed: the entry leaves both tables.
    drop(stream);
    wait_until(
        server.admin_addr,
        "server forgets the closed connection",
        |c| c.is_empty(),
    )
    .await;
    wait_until(
        agent.admin_addr,
        "agent forgets the closed connection",
        |c| c.is_empty(),
    )
    .await;

    // A dial the destination never answers is listed as pending, on both ends.
    let blackhole = Blackhole::start().await.unwrap();
    let hole = blackhole.addr.to_string();
    let pki2 = &pki;
    let server2 = &server;
    let dialing = async move {
        let _ = tokio::time::timeout(STEP, open(pki2, server2, case.mode, &hole)).await;
    };
    let watch = async {
        wait_until(server.admin_addr, "pending dial on the server", |c| {
            c.len() == 1
                && c[0].state == "pending"
                && c[0].destination == blackhole.addr.to_string()
        })
        .await;
        let pending = &connections(server.admin_addr, "?state=pending").await[0];
        assert_eq!(pending.client.as_deref(), Some(case.client.as_str()));
        assert!(pending.connect_id.is_none());
        wait_until(agent.admin_addr, "pending dial on the agent", |c| {
            c.len() == 1 && c[0].state == "pending" && c[0].dial_id == pending.dial_id
        })
        .await;
        assert_eq!(agents(server.admin_addr).await.streams[0].pending_dials, 1);
    };
    tokio::select! {
        () = dialing => panic!("the blackholed dial ended before it was seen pending"),
        () = watch => {}
    }
    agent.stop().await;
    server.stop().await;
}

#[tokio::test]
async fn connections_through_the_grpc_frontend_on_a_unix_socket() {
    let uid = std::fs::metadata("/proc/self").map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    connections_and_agents_through(Case {
        mode: Mode::Grpc,
        transport: Transport::Uds,
        frontend: "grpc",
        client: format!("unix uid {}", uid.unwrap()),
    })
    .await;
}

#[tokio::test]
async fn connections_through_http_connect_over_mutual_tls() {
    connections_and_agents_through(Case {
        mode: Mode::HttpConnect,
        transport: Transport::Tls,
        frontend: "http-connect",
        client: "certificate CN=proxy-client".into(),
    })
    .await;
}
