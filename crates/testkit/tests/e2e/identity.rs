//! Node identity (issue 25, H2' and N2), with the review's probes: with default flags one
//! node's certificate cannot claim another node's address, a resumed stream keeps its place
//! before a rogue one, the agent ID goes to the certificate that proves it (the squatter is
//! ended, even suspended), and agent IDs and the agent cap are per tenant.

use std::path::PathBuf;
use std::time::Duration;

use tether_grpc::client::Channel;
use tether_grpc::{Code, GrpcError, PacketReceiver, PacketSender, Status};
use tether_server::{IdentityBinding, Mode, RoutingConfig, Strategy};
use tether_testkit::cut_relay::CuttingRelay;
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};
use tether_tls::pki::{ClientSpec, IssuedClient};
use tokio::io::AsyncReadExt as _;

use crate::STEP;
use crate::support::{agent_dials, echo_exact, eventually, http_connect_uds};

/// node-1's address: where the dial targets listen, so dials by address go to its agent.
const NODE_1_IP: &str = "127.0.0.1";

/// A PKI with per-node agent certificates (CN and DNS SAN the node's name, an IP SAN its
/// address), written to files for agents, plus `extra` names without SANs.
struct Nodes {
    pki: Pki,
    issued: Vec<IssuedClient>,
    files: Vec<(PathBuf, PathBuf)>,
}

impl Nodes {
    fn generate(extra: &[&'static str]) -> Self {
        let mut specs = vec![
            ClientSpec {
                common_name: "node-1",
                sans: &["node-1", NODE_1_IP],
            },
            ClientSpec {
                common_name: "node-2",
                sans: &["node-2", "127.0.0.2"],
            },
        ];
        specs.extend(extra.iter().map(|name| ClientSpec {
            common_name: name,
            sans: &[],
        }));
        let (pki, issued) = Pki::generate_with_clients(&specs).unwrap();
        let files = specs
            .iter()
            .zip(&issued)
            .map(|(spec, issued)| {
                let cert = pki.dir().join(format!("{}.crt", spec.common_name));
                let key = pki.dir().join(format!("{}.key", spec.common_name));
                std::fs::write(&cert, &issued.cert_pem).unwrap();
                std::fs::write(&key, &issued.key_pem).unwrap();
                (cert, key)
            })
            .collect();
        Self { pki, issued, files }
    }

    /// An agent-port connection with client certificate `index`.
    async fn channel(&self, server: &TestServer, index: usize) -> Channel {
        let cert = &self.issued[index];
        let tls = tether_tls::client_config_from_pem(
            &self.pki.pem.ca_cert_pem,
            Some((&cert.cert_pem, &cert.key_pem)),
            vec![b"h2".to_vec()],
        )
        .unwrap();
        server.agent_channel_with(tls).await.unwrap()
    }

    /// A tether agent with client certificate `index`, through `addr`.
    async fn agent(
        &self,
        addr: std::net::SocketAddr,
        index: usize,
        opts: AgentOptions,
    ) -> TestAgent {
        TestAgent::start(
            &self.pki,
            addr,
            AgentOptions {
                client_cert: Some(self.files[index].clone()),
                ..opts
            },
        )
        .await
        .unwrap()
    }
}

/// A bare agent stream, held open while the halves live.
type Held = (PacketSender, PacketReceiver);

/// Opens `AgentService.Connect` as `agent_id` claiming `identifiers`: the open stream, or
/// the server's refusal.
async fn claim(channel: &Channel, agent_id: &str, identifiers: &str) -> Result<Held, Status> {
    let metadata = [
        ("agentid", agent_id.to_owned()),
        ("agentidentifiers", identifiers.to_owned()),
    ];
    let (tx, mut rx) = channel
        .call(tether_proto::path::CONNECT, &metadata)
        .await
        .unwrap();
    match tokio::time::timeout(STEP, rx.response_headers()).await {
        Ok(Ok(_)) => Ok((tx, rx)),
        Ok(Err(GrpcError::Status(status))) => Err(status),
        Ok(Err(other)) => panic!("unexpected answer: {other}"),
        Err(_) => panic!("no answer within {STEP:?}"),
    }
}

async fn metric(server: &TestServer, sample: &str) -> f64 {
    metric_value(&server.metrics().await.unwrap(), sample).unwrap_or(0.0)
}

/// Dials `target` through the server's HTTP CONNECT socket and proves the tunnel by an echo.
async fn dial(server: &TestServer, target: &str) {
    let (stream, head) = http_connect_uds(server.uds.as_ref().unwrap(), target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    echo_exact(stream, 7, 256).await;
}

fn server_options(binding: IdentityBinding) -> ServerOptions {
    ServerOptions {
        mode: Mode::HttpConnect,
        strategies: vec![Strategy::DestHost, Strategy::Default],
        agent_identity_binding: binding,
        ..ServerOptions::default()
    }
}

#[tokio::test]
async fn by_default_a_certificate_claims_only_its_own_names_and_addresses() {
    let nodes = Nodes::generate(&[]);
    let server = TestServer::start(&nodes.pki, server_options(IdentityBinding::default()))
        .await
        .unwrap();
    // The real node-1, whose certificate names its host and address: admitted.
    let node1 = nodes
        .agent(
            server.agent_addr,
            0,
            AgentOptions {
                agent_id: "node-1".into(),
                identifiers: format!("host=node-1&ipv4={NODE_1_IP}"),
                ..AgentOptions::default()
            },
        )
        .await;
    node1.wait_ready().await.unwrap();

    // node-2's certificate claims node-1's address, then its name (the probe, under node-2's
    // own agent ID): refused, with what the certificate does prove and the flag.
    let node2 = nodes.channel(&server, 1).await;
    for (claimed, says) in [
        (format!("ipv4={NODE_1_IP}"), "IP 127.0.0.2"),
        ("host=node-1".to_owned(), "CN node-2, DNS node-2"),
    ] {
        let refused = claim(&node2, "node-2", &claimed)
            .await
            .err()
            .unwrap_or_else(|| panic!("node-2's certificate was admitted claiming {claimed}"));
        assert_eq!(refused.code, Code::PERMISSION_DENIED, "{refused}");
        for part in [claimed.as_str(), says, "--agent-identity-binding=off"] {
            assert!(refused.message.contains(part), "{part}: {refused}");
        }
    }
    // The PKI's one shared agent certificate proves no address either.
    let shared = server.agent_channel(&nodes.pki).await.unwrap();
    let refused = claim(&shared, "node-9", &format!("ipv4={NODE_1_IP}"))
        .await
        .expect_err("a shared certificate claimed an address");
    assert_eq!(refused.code, Code::PERMISSION_DENIED, "{refused}");
    assert_eq!(
        metric(
            &server,
            "tether_server_limit_hits_total{limit=\"agent_identity\"}"
        )
        .await,
        3.0
    );
    // node-2 under its own name and address is fine.
    let _own = claim(&node2, "node-2", "host=node-2&ipv4=127.0.0.2")
        .await
        .unwrap();

    // Every dial to node-1's address reaches node-1.
    let echo = EchoServer::start().await.unwrap();
    for _ in 0..3 {
        dial(&server, &echo.addr.to_string()).await;
    }
    assert_eq!(agent_dials(&node1).await, 3.0);
}

#[tokio::test]
async fn a_resumed_stream_keeps_its_place_before_a_later_claimant() {
    // `off` lets a rogue agent claim node-1's address (a shared certificate, a deliberate
    // choice): the order of the streams is then all that decides, and it is their age.
    let nodes = Nodes::generate(&[]);
    let server = TestServer::start(&nodes.pki, server_options(IdentityBinding::Off))
        .await
        .unwrap();
    let relay = CuttingRelay::start(server.agent_addr).await.unwrap();
    let identifiers = format!("ipv4={NODE_1_IP}");
    let node1 = nodes
        .agent(
            relay.addr,
            0,
            AgentOptions {
                agent_id: "node-1".into(),
                identifiers: identifiers.clone(),
                ..AgentOptions::default()
            },
        )
        .await;
    node1.wait_ready().await.unwrap();
    let rogue = nodes
        .agent(
            server.agent_addr,
            1,
            AgentOptions {
                agent_id: "node-2".into(),
                identifiers,
                ..AgentOptions::default()
            },
        )
        .await;
    rogue.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    for _ in 0..5 {
        dial(&server, &target).await;
    }
    assert_eq!(
        (agent_dials(&node1).await, agent_dials(&rogue).await),
        (5.0, 0.0)
    );
    // An exec session through node-1 is open across the blip.
    let (held, head) = http_connect_uds(server.uds.as_ref().unwrap(), &target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");

    // A 1 s blip of node-1's transport; the stream resumes.
    relay.set_refusing(true);
    relay.cut().await;
    eventually("node-1's stream is suspended", || async {
        metric(&server, "tether_server_suspended_connections").await == 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    relay.set_refusing(false);
    eventually("node-1's stream resumed", || async {
        metric(&server, "tether_server_resumes_total").await == 1.0
            && metric(&server, "tether_server_suspended_connections").await == 0.0
    })
    .await;
    echo_exact(held, 8, 256).await;

    // node-1 is the oldest stream for its address again: it keeps every dial.
    for _ in 0..5 {
        dial(&server, &target).await;
    }
    assert_eq!(
        (agent_dials(&node1).await, agent_dials(&rogue).await),
        (11.0, 0.0)
    );
}

/// A server whose resume window is short, so that node-1 can be away longer than it.
fn short_window() -> ServerOptions {
    ServerOptions {
        resume_window: Duration::from_secs(2),
        ..server_options(IdentityBinding::default())
    }
}

/// node-1's tether agent under its own certificate, ID, name and address.
async fn real_node1(nodes: &Nodes, server: &TestServer) -> TestAgent {
    let agent = nodes
        .agent(
            server.agent_addr,
            0,
            AgentOptions {
                agent_id: "node-1".into(),
                identifiers: format!("host=node-1&ipv4={NODE_1_IP}"),
                resume_window: Duration::from_secs(2),
                ..AgentOptions::default()
            },
        )
        .await;
    agent.wait_ready().await.unwrap();
    agent
}

async fn connect_streams(server: &TestServer) -> f64 {
    metric(
        server,
        "konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"}",
    )
    .await
}

#[tokio::test]
async fn the_real_node_takes_its_agent_id_back_from_a_squatter() {
    let nodes = Nodes::generate(&[]);
    let server = TestServer::start(&nodes.pki, short_window()).await.unwrap();
    let node1 = real_node1(&nodes, &server).await;

    // While node-1 is there, node-2's certificate cannot take its agent ID.
    let node2 = nodes.channel(&server, 1).await;
    let refused = claim(&node2, "node-1", "host=node-2").await.err().unwrap();
    assert_eq!(refused.code, Code::ALREADY_EXISTS, "{refused}");

    // node-1 is away longer than the resume window; node-2 takes the free ID.
    node1.stop().await;
    eventually("node-1's stream is gone", || async {
        connect_streams(&server).await == 0.0
    })
    .await;
    let squatter = claim(&node2, "node-1", "host=node-2").await.unwrap();

    // node-1 comes back: admitted, and the squatter's stream is ended.
    let node1 = real_node1(&nodes, &server).await;
    let (_tx, mut squatter_rx) = squatter;
    // The server ends it cleanly (the reason is in its log); reconnecting, the squatter is
    // told why it is refused.
    tokio::time::timeout(STEP, async {
        while let Some(Ok(_)) = squatter_rx.next().await {}
    })
    .await
    .expect("the squatter's stream ends");
    eventually("only node-1's stream is left", || async {
        connect_streams(&server).await == 1.0
    })
    .await;
    let echo = EchoServer::start().await.unwrap();
    dial(&server, &echo.addr.to_string()).await;
    assert_eq!(agent_dials(&node1).await, 1.0);
    // And the squatter cannot come back under the ID.
    let refused = claim(&node2, "node-1", "host=node-2").await.err().unwrap();
    assert_eq!(refused.code, Code::ALREADY_EXISTS, "{refused}");
    assert!(refused.message.contains("proves the agent ID"), "{refused}");
}

#[tokio::test]
async fn a_suspended_squatter_is_ended_when_the_real_node_returns() {
    let nodes = Nodes::generate(&[]);
    let server = TestServer::start(&nodes.pki, short_window()).await.unwrap();
    // node-2's tether agent holds the free ID node-1 through a relay, resumable.
    let relay = CuttingRelay::start(server.agent_addr).await.unwrap();
    let squatter = nodes
        .agent(
            relay.addr,
            1,
            AgentOptions {
                agent_id: "node-1".into(),
                identifiers: "host=node-2".into(),
                resume_window: Duration::from_secs(30),
                ..AgentOptions::default()
            },
        )
        .await;
    squatter.wait_ready().await.unwrap();
    // With node-1 away, a dial to node-1's address falls through to the default strategy
    // and the squatter carries it.
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let (mut held, head) = http_connect_uds(server.uds.as_ref().unwrap(), &target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert_eq!(agent_dials(&squatter).await, 1.0);
    // Its transport breaks: the server holds its stream suspended, the ID still taken.
    relay.set_refusing(true);
    relay.cut().await;
    eventually("the squatter's stream is suspended", || async {
        metric(&server, "tether_server_suspended_connections").await == 1.0
    })
    .await;

    // The real node-1 is admitted at once, and the suspended stream ends with its
    // connection.
    let node1 = real_node1(&nodes, &server).await;
    eventually("the suspended squatter ended", || async {
        metric(&server, "tether_server_suspended_connections").await == 0.0
    })
    .await;
    let mut byte = [0u8; 1];
    let read = tokio::time::timeout(STEP, held.read(&mut byte)).await;
    assert!(
        matches!(read, Ok(Ok(0) | Err(_))),
        "the squatter's connection is still open: {read:?}"
    );
    assert_eq!(
        metric(
            &server,
            "tether_server_resume_failures_total{reason=\"unknown_session\"}"
        )
        .await,
        1.0
    );
    // The squatter's attempts to resume or reconnect are refused; node-1 gets the dials.
    relay.set_refusing(false);
    eventually("the squatter was refused again", || async {
        metric(
            &server,
            "tether_server_limit_hits_total{limit=\"duplicate_agent_id\"}",
        )
        .await
            >= 1.0
    })
    .await;
    dial(&server, &target).await;
    assert_eq!(agent_dials(&node1).await, 1.0);
    assert_eq!(agent_dials(&squatter).await, 1.0);
}

#[tokio::test]
async fn one_tenant_can_neither_squat_nor_fill_another_tenants_agent_table() {
    let nodes = Nodes::generate(&["agent.a", "agent.b"]);
    let routing = "tenants:
  - name: a
    clients: [\"cert:api.a\"]
    agents: [\"cert:agent.a\"]
  - name: b
    clients: [\"cert:api.b\"]
    agents: [\"cert:agent.b\"]
";
    let server = TestServer::start(
        &nodes.pki,
        ServerOptions {
            routing: RoutingConfig::from_yaml(routing).unwrap(),
            limits: tether_server::Limits {
                max_agents: 2,
                ..Default::default()
            },
            ..ServerOptions::default()
        },
    )
    .await
    .unwrap();
    // One connection per stream, as agents do: an agent connection carries at most
    // `tether_grpc::AGENT_STREAMS` streams.
    let a = [
        nodes.channel(&server, 2).await,
        nodes.channel(&server, 2).await,
        nodes.channel(&server, 2).await,
    ];
    let b = [
        nodes.channel(&server, 3).await,
        nodes.channel(&server, 3).await,
    ];
    // Tenant a registers b's node name first (T7): b's node still gets it, in b.
    let _a_squat = claim(&a[0], "node-b2", "").await.unwrap();
    let _b_real = claim(&b[0], "node-b2", "")
        .await
        .map_err(|s| format!("tenant b's own agent ID: {s}"))
        .unwrap();
    // Tenant a fills its table (T8): its next agent is refused, b's is not.
    let _a_second = claim(&a[1], "node-a2", "").await.unwrap();
    let full = claim(&a[2], "node-a3", "").await.err().unwrap();
    assert_eq!(full.code, Code::RESOURCE_EXHAUSTED, "{full}");
    assert!(full.message.contains("--max-agents, per tenant"), "{full}");
    let _b_second = claim(&b[1], "node-b3", "")
        .await
        .map_err(|s| format!("tenant b's second agent: {s}"))
        .unwrap();
    assert_eq!(
        metric(
            &server,
            "tether_server_limit_hits_total{limit=\"duplicate_agent_id\"}"
        )
        .await,
        0.0
    );
}
