//! The audit log of a mixed run, on the servers and their agents: both frontends, a normal
//! connection, one the destination ends, a failed dial, a policy refusal at the agent, a
//! refused address and a dial with no agent, each as one JSON line on each side that saw it,
//! and each connection as two: its opening, in the file while the connection runs, and its
//! end.

use std::path::Path;

use serde_json::Value;
use tether_observe::audit::AuditTarget;
use tether_server::Mode;
use tether_testkit::targets::{EchoServer, refused_addr};
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::STEP;
use crate::support::{echo_exact, http_connect_uds};

pub(crate) fn records(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// Every connection in `records` has exactly one opening and one end, the opening first,
/// with the same dial id and connection id (and on a server's, generation 1: no reload).
/// Returns how many connections.
pub(crate) fn assert_paired(records: &[Value]) -> usize {
    let connections: Vec<(usize, &Value)> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r["event"] == "connection")
        .collect();
    let openings: Vec<(usize, &Value)> = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r["event"] == "connection_opened")
        .collect();
    assert_eq!(connections.len(), openings.len(), "{records:#?}");
    for (at, close) in &connections {
        let opens: Vec<&(usize, &Value)> = openings
            .iter()
            .filter(|(_, open)| open["dial_id"] == close["dial_id"])
            .collect();
        assert_eq!(opens.len(), 1, "one opening for {close}");
        let (open_at, open) = opens[0];
        assert!(open_at < at, "the opening first: {open} {close}");
        assert_eq!(open["connection_id"], close["connection_id"]);
        assert_eq!(open["requested"], close["requested"]);
        assert_eq!(open["outcome"], "ok");
        if close["side"] == "server" {
            assert_eq!(open["generation"], 1, "{open}");
            assert_eq!(close["generation"], 1, "{close}");
        } else {
            assert!(close.get("generation").is_none(), "{close}");
        }
    }
    connections.len()
}

/// Polls `path` until it holds a record of `event` for `requested`, and returns it.
async fn wait_for(path: &Path, event: &str, requested: &str) -> Value {
    let started = tokio::time::Instant::now();
    loop {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|r| r["event"] == event && r["requested"] == requested);
        if let Some(record) = found {
            return record;
        }
        assert!(
            started.elapsed() < STEP,
            "no {event} record for {requested} in {}: {text}",
            path.display()
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

pub(crate) fn find<'a>(records: &'a [Value], event: &str, requested: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["event"] == event && r["requested"] == requested)
        .unwrap_or_else(|| panic!("no {event} record for {requested} in {records:#?}"))
}

#[tokio::test]
async fn two_records_per_connection_and_one_per_refused_dial_on_both_frontends() {
    let pki = Pki::generate().unwrap();
    let grpc_log = pki.dir().join("grpc-audit.log");
    let connect_log = pki.dir().join("connect-audit.log");
    let grpc = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::Grpc,
            transport: Transport::Tls,
            server_id: "audit-grpc".into(),
            audit_log: Some(AuditTarget::File(grpc_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let connect = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            server_id: "audit-connect".into(),
            audit_log: Some(AuditTarget::File(connect_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let uds = connect.uds.clone().unwrap();
    let echo = EchoServer::start().await.unwrap();
    let echo_addr = echo.addr.to_string();

    // No agent yet: refused before anything is dialed.
    let (_, head) = http_connect_uds(&uds, &echo_addr).await;
    assert!(
        head.starts_with("HTTP/1.1 500"),
        "upstream answers 500: {head}"
    );

    let agent_log = pki.dir().join("agent-audit.log");
    let connect_agent_log = pki.dir().join("connect-agent-audit.log");
    let agent_options = |log: &Path| AgentOptions {
        agent_id: "audit-agent".into(),
        audit_log: Some(AuditTarget::File(log.to_owned())),
        ..Default::default()
    };
    let agents = [
        TestAgent::start(&pki, grpc.agent_addr, agent_options(&agent_log))
            .await
            .unwrap(),
        TestAgent::start(&pki, connect.agent_addr, agent_options(&connect_agent_log))
            .await
            .unwrap(),
    ];
    grpc.wait_ready().await.unwrap();
    connect.wait_ready().await.unwrap();

    // gRPC over mTLS: a normal connection the client closes.
    let f = &pki.files;
    let transport = tether_client::Transport::Tls {
        addr: grpc.frontend_tcp.unwrap().to_string(),
        server_name: "127.0.0.1".into(),
        tls: tether_tls::client_config(
            &f.ca_cert,
            Some((f.client_cert.as_path(), f.client_key.as_path())),
            Vec::new(),
            &Default::default(),
        )
        .unwrap(),
    };
    let client = tether_client::GrpcClient::connect(&transport)
        .await
        .unwrap();
    let stream = client.dial(&echo_addr).await.unwrap();
    let mut stream = echo_exact(stream, 7, 1000).await;
    // While it runs, its opening is in both logs, its end in neither.
    let opened = wait_for(&grpc_log, "connection_opened", &echo_addr).await;
    let agent_opened = wait_for(&agent_log, "connection_opened", &echo_addr).await;
    assert!(
        !records(&grpc_log)
            .iter()
            .chain(&records(&agent_log))
            .any(|r| r["event"] == "connection"),
        "no end record while the connection runs"
    );
    stream.shutdown().await.unwrap();
    drop(stream);
    // A destination that refuses, and an address no agent is ever asked about.
    let refused = refused_addr().to_string();
    assert!(client.dial(&refused).await.is_err());
    assert!(client.dial("no-port-here").await.is_err());
    // The agent's own admin port: refused by its destination policy.
    let own = agents[0].admin_addr.to_string();
    assert!(client.dial(&own).await.is_err());

    // HTTP CONNECT over the Unix socket: the destination says goodbye and closes.
    let goodbye = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let goodbye_addr = goodbye.local_addr().unwrap().to_string();
    let destination = tokio::spawn(async move {
        let (mut socket, _) = goodbye.accept().await.unwrap();
        socket.write_all(b"bye").await.unwrap();
    });
    let (mut stream, head) = http_connect_uds(&uds, &goodbye_addr).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let mut got = Vec::new();
    tokio::time::timeout(STEP, stream.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got, b"bye");
    destination.await.unwrap();

    // Stopping flushes the writers; every record is then on disk.
    for agent in agents {
        agent.stop().await;
    }
    grpc.stop().await;
    connect.stop().await;

    let grpc_records = records(&grpc_log);
    let normal = find(&grpc_records, "connection", &echo_addr);
    assert_eq!(normal["side"], "server");
    assert_eq!(normal["server_id"], "audit-grpc");
    assert_eq!(normal["agent_id"], "audit-agent");
    assert_eq!(normal["frontend"], "grpc");
    assert_eq!(normal["transport"], "tls");
    assert!(
        normal["client"].as_str().unwrap().contains("proxy-client"),
        "the client certificate's names: {normal}"
    );
    assert_eq!(normal["bytes_to_destination"], 1000);
    assert_eq!(normal["bytes_from_destination"], 1000);
    assert_eq!(normal["closed_by"], "client");
    assert_eq!(normal["outcome"], "ok");
    assert!(normal["dial_latency_ms"].as_f64().unwrap() >= 0.0);
    assert!(normal["duration_ms"].as_f64().unwrap() >= 0.0);
    assert!(normal["time"].as_str().unwrap().ends_with('Z'));
    assert!(normal.get("reason").is_none());

    let failed = find(&grpc_records, "dial_failed", &refused);
    assert_eq!(failed["agent_id"], "audit-agent");
    assert!(
        failed["reason"].as_str().unwrap().contains("refused"),
        "{failed}"
    );
    let invalid = find(&grpc_records, "dial_refused", "no-port-here");
    assert!(
        invalid.get("agent_id").is_none(),
        "no agent was asked: {invalid}"
    );
    assert!(
        invalid["reason"]
            .as_str()
            .unwrap()
            .contains("invalid dial address"),
        "{invalid}"
    );
    let denied = find(&grpc_records, "dial_failed", &own);
    assert!(
        denied["reason"].as_str().unwrap().contains("policy"),
        "{denied}"
    );
    // The opening: who, what, through which agent, under which configuration; not how it
    // ended.
    assert_eq!(opened["dial_id"], normal["dial_id"]);
    assert_eq!(opened["connection_id"], normal["connection_id"]);
    assert_eq!(opened["generation"], 1);
    assert_eq!(normal["generation"], 1);
    for field in ["agent_id", "frontend", "transport", "client", "server_id"] {
        assert_eq!(opened[field], normal[field], "{field}");
    }
    for field in ["closed_by", "duration_ms", "bytes_to_destination", "reason"] {
        assert!(opened.get(field).is_none(), "{field}: {opened}");
    }
    assert_eq!(assert_paired(&grpc_records), 1);
    assert_eq!(grpc_records.len(), 5, "{grpc_records:#?}");

    // The agent's side of the same run: the address it actually connected to, and the same
    // dial ids as the server's records.
    let agent_records = records(&agent_log);
    let dialed = find(&agent_records, "connection", &echo_addr);
    assert_eq!(dialed["side"], "agent");
    assert_eq!(dialed["dialed"], echo_addr);
    assert_eq!(dialed["dial_id"], normal["dial_id"]);
    assert_eq!(dialed["connection_id"], normal["connection_id"]);
    assert_eq!(dialed["server_id"], "audit-grpc");
    assert_eq!(dialed["bytes_to_destination"], 1000);
    assert_eq!(dialed["bytes_from_destination"], 1000);
    assert_eq!(dialed["closed_by"], "server");
    let agent_failed = find(&agent_records, "dial_failed", &refused);
    assert_eq!(agent_failed["dial_id"], failed["dial_id"]);
    let agent_denied = find(&agent_records, "dial_refused", &own);
    assert!(agent_denied.get("dialed").is_none(), "{agent_denied}");
    assert_eq!(agent_opened["dial_id"], normal["dial_id"]);
    assert_eq!(agent_opened["dialed"], echo_addr);
    assert_eq!(assert_paired(&agent_records), 1);
    assert_eq!(agent_records.len(), 4, "{agent_records:#?}");
    let goodbye_side = records(&connect_agent_log);
    assert_eq!(assert_paired(&goodbye_side), 1);
    assert_eq!(
        find(&goodbye_side, "connection", &goodbye_addr)["closed_by"],
        "destination"
    );

    let connect_records = records(&connect_log);
    let none = find(&connect_records, "dial_refused", &echo_addr);
    assert_eq!(none["reason"], "No agent available");
    assert_eq!(none["frontend"], "http-connect");
    assert_eq!(none["transport"], "uds");
    assert!(
        none["client"] == format!("unix uid {}", current_uid()),
        "the Unix peer's uid: {none}"
    );
    assert!(none["client_pid"].as_i64().unwrap() > 0);
    let ended = find(&connect_records, "connection", &goodbye_addr);
    assert_eq!(ended["closed_by"], "agent");
    assert_eq!(ended["bytes_from_destination"], 3);
    assert_eq!(assert_paired(&connect_records), 1);
    assert_eq!(connect_records.len(), 3, "{connect_records:#?}");

    // Nothing secret: no key material, no certificate bodies.
    for text in [&grpc_log, &connect_log, &agent_log, &connect_agent_log]
        .map(|p| std::fs::read_to_string(p).unwrap())
    {
        assert!(
            !text.contains("PRIVATE KEY") && !text.contains("BEGIN"),
            "{text}"
        );
    }
}

/// This process's uid as the Unix peer credentials report it.
fn current_uid() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(1).unwrap().to_owned()
}

#[tokio::test]
async fn an_audit_log_that_cannot_be_opened_is_a_start_up_error() {
    let pki = Pki::generate().unwrap();
    let path = pki.dir().join("missing-dir/audit.log");
    let err = TestServer::start(
        &pki,
        ServerOptions {
            audit_log: Some(AuditTarget::File(path)),
            ..Default::default()
        },
    )
    .await
    .unwrap_err();
    let text = format!("{err:#}");
    assert!(
        text.contains("opening the audit log") && text.contains("missing-dir"),
        "{text}"
    );
}

/// Every line of `path`, each checked to be one record within the record bound.
fn bounded_records(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    for line in text.lines() {
        assert!(
            line.len() <= tether_observe::audit::MAX_RECORD_BYTES,
            "a record of {} bytes",
            line.len()
        );
    }
    records(path)
}

/// N3: a refused dial used to record the whole requested address (4 MiB over gRPC, about
/// 1 MiB over CONNECT). The record now keeps a bounded prefix, marked as cut.
#[tokio::test]
async fn a_refused_dial_of_a_megabyte_address_writes_a_bounded_record() {
    let pki = Pki::generate().unwrap();
    let grpc_log = pki.dir().join("grpc-audit.log");
    let connect_log = pki.dir().join("connect-audit.log");
    let grpc = TestServer::start(
        &pki,
        ServerOptions {
            server_id: "bounded-grpc".into(),
            audit_log: Some(AuditTarget::File(grpc_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let connect = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            server_id: "bounded-connect".into(),
            audit_log: Some(AuditTarget::File(connect_log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let huge = format!("{}:443", "a".repeat(1 << 20));

    let client = tether_client::GrpcClient::connect(&tether_client::Transport::Unix(
        grpc.uds.clone().unwrap(),
    ))
    .await
    .unwrap();
    for _ in 0..3 {
        let refused = tokio::time::timeout(STEP, client.dial(&huge))
            .await
            .unwrap();
        assert!(refused.is_err());
    }
    let (_, head) = http_connect_uds(connect.uds.as_ref().unwrap(), &huge).await;
    assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    grpc.stop().await;
    connect.stop().await;

    for (path, count) in [(&grpc_log, 3), (&connect_log, 1)] {
        let records = bounded_records(path);
        assert_eq!(records.len(), count, "{records:#?}");
        for record in &records {
            assert_eq!(record["event"], "dial_refused");
            let requested = record["requested"].as_str().unwrap();
            assert!(
                requested.starts_with("aaaa") && requested.ends_with("…(1048580 bytes)"),
                "{}",
                &requested[requested.len() - 40..]
            );
            assert!(requested.len() <= tether_observe::audit::MAX_FIELD_BYTES);
            assert_eq!(record["truncated"], serde_json::json!(["requested"]));
        }
        let size = std::fs::metadata(path).unwrap().len();
        assert!(size < 64 * 1024, "{} bytes of audit log", size);
    }
}

/// N3: the HTTP CONNECT head parser's refusals (431, 400, 405) and a head that never
/// completes are audited as `request_refused`, with the client that sent them.
#[tokio::test]
async fn the_head_parsers_refusals_are_audited() {
    let pki = Pki::generate().unwrap();
    let log = pki.dir().join("audit.log");
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            audit_log: Some(AuditTarget::File(log.clone())),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let uds = server.uds.clone().unwrap();
    let too_large = format!(
        "CONNECT 127.0.0.1:1 HTTP/1.1\r\nX-Pad: {}\r\n\r\n",
        "p".repeat((1 << 20) + 8192)
    );
    for (request, status) in [
        ("GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_owned(), "405"),
        ("\x01\x02 not http\r\n\r\n".to_owned(), "400"),
        (too_large, "431"),
    ] {
        let mut stream = tokio::net::UnixStream::connect(&uds).await.unwrap();
        // The server may answer 431 and close before it read everything.
        let _ = stream.write_all(request.as_bytes()).await;
        let mut reply = Vec::new();
        let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut reply))
            .await
            .unwrap();
        let reply = String::from_utf8_lossy(&reply);
        assert!(reply.starts_with(&format!("HTTP/1.1 {status}")), "{reply}");
    }
    // A client that leaves mid-head was refused nothing.
    let mut left = tokio::net::UnixStream::connect(&uds).await.unwrap();
    left.write_all(b"CONNECT 127.0.0.1:1 HTTP/1.1\r\n")
        .await
        .unwrap();
    drop(left);
    server.stop().await;

    let records = bounded_records(&log);
    let reasons: Vec<&str> = records
        .iter()
        .map(|r| {
            assert_eq!(r["event"], "request_refused", "{r}");
            assert_eq!(r["frontend"], "http-connect");
            assert_eq!(r["transport"], "uds");
            assert_eq!(r["client"], format!("unix uid {}", current_uid()));
            assert!(r.get("dial_id").is_none(), "{r}");
            r["reason"].as_str().unwrap()
        })
        .collect();
    assert_eq!(
        reasons,
        [
            "405 Method Not Allowed: only CONNECT is served",
            "400 Bad Request",
            "431 Request Header Fields Too Large"
        ]
    );
}
