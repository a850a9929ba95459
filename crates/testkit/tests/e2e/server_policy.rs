//! The server's destination policy per frontend client, end to end: clients told apart by
//! their certificates or Unix uid get their own rules, and a refused request is answered
//! before any agent is chosen, so the agent never sees a DIAL_REQ for it.

use std::os::unix::fs::MetadataExt as _;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use tether_client::{DialError, Transport as ClientTransport};
use tether_observe::audit::AuditTarget;
use tether_server::{Mode, RoutingConfig};
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport};
use tokio::net::TcpListener;

use crate::support::{agent_dials, client_certs, echo_exact};

/// DIAL_REQs the agent received: zero means a refused request never reached it.
const AGENT_DIAL_REQUESTS: &str = "konnectivity_network_proxy_agent_stream_packets_total{packet_type=\"DIAL_REQ\",segment=\"to_agent\"}";

fn metric(text: &str, sample: &str) -> f64 {
    metric_value(text, sample).unwrap_or(0.0)
}

/// Fails if anything connects to `listener` within a short while.
async fn assert_never_connected(listener: &TcpListener) {
    let accepted = tokio::time::timeout(Duration::from_millis(300), listener.accept()).await;
    assert!(accepted.is_err(), "a denied destination was connected to");
}

fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The body of a refused HTTP CONNECT: a 403 whose body is the reason.
async fn refused(client: &ClientTransport, target: &str) -> String {
    match tether_client::dial_http_connect(client, target).await {
        Err(DialError::Rejected { status: 403, body }) => body.trim_end().to_owned(),
        Ok(_) => panic!("{target} was allowed"),
        Err(other) => panic!("{target}: expected a 403, got {other}"),
    }
}

fn tls_client(pki: &Pki, server: &TestServer, cert: (&Path, &Path)) -> ClientTransport {
    ClientTransport::Tls {
        addr: server.frontend_tcp.unwrap().to_string(),
        server_name: "127.0.0.1".into(),
        tls: tether_tls::client_config(
            &pki.files.ca_cert,
            Some(cert),
            Vec::new(),
            &Default::default(),
        )
        .unwrap(),
    }
}

#[tokio::test]
async fn two_clients_with_their_own_rules_and_refusals_that_never_reach_the_agent() {
    let (pki, certs) = client_certs(&["api.kubelets", "api.stray"]);
    let echo = EchoServer::start().await.unwrap();
    let port = echo.addr.port();
    // A loopback listener no refused request may ever reach.
    let denied = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let denied_port = denied.local_addr().unwrap().port();
    // The kubelets client reaches loopback on the echo port only, never metadata or names
    // under `localhost`; proxy-client (the PKI's default client) reaches only `localhost`.
    let routing = format!(
        "destinations:
  - name: kubelets
    clients: [\"cert:api.kubelets\"]
    rules:
      - deny to 169.254.0.0/16,fd00:ec2::254
      - deny name localhost
      - allow to 127.0.0.0/8,::1 port {port}
      - deny all
  - name: names-only
    clients: [\"cert:proxy-client\"]
    rules:
      - allow name localhost port {port}
      - deny all
"
    );
    let server_log = pki.dir().join("server-audit.log");
    let agent_log = pki.dir().join("agent-audit.log");
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            transport: Transport::Tls,
            routing: RoutingConfig::from_yaml(&routing).unwrap(),
            audit_log: Some(AuditTarget::File(server_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let agent = TestAgent::start(
        &pki,
        server.agent_addr,
        AgentOptions {
            audit_log: Some(AuditTarget::File(agent_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    server.wait_ready().await.unwrap();
    agent.wait_ready().await.unwrap();
    let f = &pki.files;
    let kubelets = tls_client(&pki, &server, (&certs[0].0, &certs[0].1));
    let names_only = tls_client(&pki, &server, (&f.client_cert, &f.client_key));
    let stray = tls_client(&pki, &server, (&certs[1].0, &certs[1].1));

    // Allowed: each client reaches the echo target its own way.
    let stream = tether_client::dial_http_connect(&kubelets, &echo.addr.to_string())
        .await
        .unwrap();
    drop(echo_exact(stream, 1, 4096).await);
    let stream = tether_client::dial_http_connect(&names_only, &format!("localhost:{port}"))
        .await
        .unwrap();
    drop(echo_exact(stream, 2, 4096).await);
    let allowed = 2.0;

    // Refused, each with the policy and the routing file's line that decided.
    let line = |n: u32, rule: &str| format!("(line {n}: {rule})");
    let by_kubelets = [
        // By port: loopback is allowed on the echo port only.
        (format!("127.0.0.1:{denied_port}"), line(8, "deny all")),
        (format!("[::1]:{denied_port}"), line(8, "deny all")),
        // By block, in every spelling, IPv6 literals included.
        (
            format!("169.254.169.254:{port}"),
            line(5, "deny to 169.254.0.0/16,fd00:ec2::254/128"),
        ),
        (
            format!("[::ffff:169.254.169.254]:{port}"),
            line(5, "deny to 169.254.0.0/16,fd00:ec2::254/128"),
        ),
        (
            format!("[fd00:ec2::254]:{port}"),
            line(5, "deny to 169.254.0.0/16,fd00:ec2::254/128"),
        ),
        // By name suffix, before anything resolves it.
        (format!("LocalHost.:{port}"), line(6, "deny name localhost")),
    ];
    for (target, rule) in &by_kubelets {
        let body = refused(&kubelets, target).await;
        assert!(
            body.starts_with("policy: ")
                && body.ends_with(&format!("denied by server policy \"kubelets\" {rule}")),
            "{target}: {body}"
        );
    }
    assert_eq!(
        refused(&kubelets, &format!("LocalHost.:{port}")).await,
        format!(
            "policy: LocalHost.:{port} denied by server policy \"kubelets\" (line 6: deny name localhost)"
        )
    );
    // What one client may reach, the other may not.
    assert_eq!(
        refused(&names_only, &echo.addr.to_string()).await,
        format!(
            "policy: {} denied by server policy \"names-only\" (line 13: deny all)",
            echo.addr
        )
    );
    // A legacy numeric spelling of loopback cannot pass as a name.
    let body = refused(&names_only, &format!("127.1:{port}")).await;
    assert!(
        body.contains("neither a DNS name nor an IP address"),
        "{body}"
    );
    // A client no entry lists is refused outright.
    let body = refused(&stray, &echo.addr.to_string()).await;
    assert!(
        body.starts_with("policy: client identity certificate CN=api.stray")
            && body.ends_with("has no destination policy on this server"),
        "{body}"
    );
    assert_never_connected(&denied).await;
    let refusals = by_kubelets.len() + 4;

    // The agent saw exactly the allowed dials and nothing else.
    let agent_metrics = agent.metrics().await.unwrap();
    assert_eq!(metric(&agent_metrics, AGENT_DIAL_REQUESTS), allowed);
    assert_eq!(agent_dials(&agent).await, allowed);
    let server_metrics = server.metrics().await.unwrap();
    let counted = |policy: &str, reason: &str| {
        metric_value(
            &server_metrics,
            &format!("tether_server_destination_policy_refusals_total{{policy=\"{policy}\",reason=\"{reason}\"}}"),
        )
        .unwrap_or(0.0)
    };
    assert_eq!(counted("kubelets", "rule"), (by_kubelets.len() + 1) as f64);
    assert_eq!(counted("names-only", "rule"), 2.0);
    assert_eq!(counted("", "no_policy"), 1.0);
    assert_eq!(
        metric(
            &server_metrics,
            "konnectivity_network_proxy_server_dial_failure_count{reason=\"policy\"}"
        ),
        refusals as f64
    );

    // Audit: one dial_refused record per refusal with its reason, none on the agent.
    agent.stop().await;
    server.stop().await;
    let server_records = records(&server_log);
    let refused_records: Vec<&Value> = server_records
        .iter()
        .filter(|r| r["event"] == "dial_refused")
        .collect();
    assert_eq!(refused_records.len(), refusals, "{server_records:#?}");
    for record in &refused_records {
        assert_eq!(record["outcome"], "error");
        assert!(
            record["agent_id"].is_null(),
            "no agent was chosen: {record}"
        );
        assert!(
            record["reason"].as_str().unwrap().starts_with("policy: "),
            "{record}"
        );
    }
    let metadata = refused_records
        .iter()
        .find(|r| r["requested"] == format!("[fd00:ec2::254]:{port}"))
        .expect("the IPv6 literal's record");
    assert!(
        metadata["client"]
            .as_str()
            .unwrap()
            .contains("api.kubelets"),
        "{metadata}"
    );
    let agent_records = records(&agent_log);
    assert_eq!(
        crate::audit::assert_paired(&agent_records),
        2,
        "the agent records only the allowed connections: {agent_records:#?}"
    );
    assert_eq!(agent_records.len(), 4, "{agent_records:#?}");
}

#[tokio::test]
async fn a_grpc_client_on_the_unix_socket_gets_a_dial_response_error() {
    let pki = Pki::generate().unwrap();
    let uid = std::fs::metadata(pki.dir()).unwrap().uid();
    let echo = EchoServer::start().await.unwrap();
    let port = echo.addr.port();
    let routing = format!(
        "destinations:
  - name: local
    clients: [\"uid:{uid}\"]
    rules: [\"allow to 127.0.0.1 port {port}\", \"deny to ::/0\", \"deny all\"]
"
    );
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::Grpc,
            routing: RoutingConfig::from_yaml(&routing).unwrap(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    agent.wait_ready().await.unwrap();
    let client =
        tether_client::GrpcClient::connect(&ClientTransport::Unix(server.uds.clone().unwrap()))
            .await
            .unwrap();

    let stream = client.dial(&echo.addr.to_string()).await.unwrap();
    drop(echo_exact(stream, 3, 4096).await);
    for (target, rule) in [
        (format!("[::1]:{port}"), "(line 4: deny to ::/0)"),
        (format!("127.0.0.1:{}", port ^ 1), "(line 4: deny all)"),
    ] {
        match client.dial(&target).await {
            Err(DialError::Endpoint { message }) => assert_eq!(
                message,
                format!("policy: {target} denied by server policy \"local\" {rule}")
            ),
            Ok(_) => panic!("{target} was allowed"),
            Err(other) => panic!("{target}: expected a DIAL_RSP error, got {other}"),
        }
    }
    // The stream still serves allowed dials after refusals.
    let stream = client.dial(&echo.addr.to_string()).await.unwrap();
    drop(echo_exact(stream, 4, 4096).await);
    let agent_metrics = agent.metrics().await.unwrap();
    assert_eq!(metric(&agent_metrics, AGENT_DIAL_REQUESTS), 2.0);
    let server_metrics = server.metrics().await.unwrap();
    assert_eq!(
        metric(
            &server_metrics,
            "tether_server_destination_policy_refusals_total{policy=\"local\",reason=\"rule\"}"
        ),
        2.0
    );
}
