//! Logs of the real binaries: by default every line in klog's format, and with
//! `--log-format=json` a JSON object with the fixed keys; events inside a connection's span
//! carry that span's fields.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::http::get;
use tether_testkit::process::{Frontend, Process, spawn_agent, spawn_server};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::{STEP, bin, tls_transport};

/// Parses every line of `path`, checking the keys every line has.
fn json_lines(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).expect("log file");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(!lines.is_empty(), "{} is empty", path.display());
    for line in &lines {
        for key in ["timestamp", "level", "target", "message"] {
            assert!(line[key].is_string(), "no {key}: {line}");
        }
    }
    lines
}

/// Whether some line happened inside a span carrying `field`.
fn some_span_has(lines: &[serde_json::Value], field: &str) -> bool {
    lines.iter().any(|line| {
        line["spans"]
            .as_array()
            .is_some_and(|spans| spans.iter().any(|s| !s[field].is_null()))
    })
}

fn as_str(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Sends SIGTERM `times` times (an agent drains on the first and stops on the second).
async fn stop(mut process: Process, times: usize) {
    for _ in 0..times {
        process.signal("TERM").await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let code = process.wait(STEP).await.unwrap();
    assert_eq!(code, Some(0));
}

/// Runs a server and an agent that log to files (with `flags` too) until the agent has
/// stopped, then the server; returns the PKI (whose directory holds the logs) and the two
/// logs' paths.
async fn logs_of_a_pair(flags: &[&str]) -> (Pki, PathBuf, PathBuf) {
    let pki = Pki::generate().unwrap();
    let server_log = pki.dir().join("server.log");
    let agent_log = pki.dir().join("agent.log");
    let with_file = |log: &Path| {
        let mut all: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
        all.push("--logtostderr=false".to_owned());
        all.push(format!("--log-file={}", log.display()));
        all
    };
    let server_flags = with_file(&server_log);
    let agent_flags = with_file(&agent_log);
    let uds = pki.dir().join("frontend.sock");
    let server = spawn_server(bin(), &pki, Frontend::GrpcUds(uds), &as_str(&server_flags))
        .await
        .expect("server");
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &as_str(&agent_flags))
        .await
        .expect("agent");
    server
        .process
        .wait_ready()
        .await
        .expect("server has the agent");
    stop(agent, 2).await;
    // The server notices the agent leaving; give it a moment to log it.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop(server.process, 1).await;
    (pki, server_log, agent_log)
}

#[tokio::test]
async fn json_logs_of_server_and_agent() {
    let (_pki, server_log, agent_log) = logs_of_a_pair(&["--log-format=json"]).await;

    let server_lines = json_lines(&server_log);
    assert!(
        some_span_has(&server_lines, "agent.id"),
        "{server_lines:#?}"
    );
    // An agent that was asked to stop is no failure on the server's side.
    let disconnected = server_lines
        .iter()
        .find(|l| l["message"] == "agent disconnected")
        .expect("the server logs the agent leaving");
    let reason = disconnected["reason"].as_str().unwrap();
    assert!(
        !reason.contains("fail") && !reason.contains("error"),
        "a stopped agent is worded as a failure: {reason}"
    );
    let agent_lines = json_lines(&agent_log);
    assert!(some_span_has(&agent_lines, "server.id"), "{agent_lines:#?}");
}

/// Checks that every line of `path` has klog's header, and returns the lines' bodies (after
/// `] `).
fn klog_bodies(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).expect("log file");
    let pid_and_file = |header: &str| {
        let mut parts = header.split_whitespace();
        let date = parts.next()?;
        let time = parts.next()?;
        let pid = parts.next()?;
        let file = parts.next()?;
        let severity_ok = matches!(date.chars().next(), Some('I' | 'W' | 'E'))
            && date.len() == 5
            && date[1..].bytes().all(|b| b.is_ascii_digit());
        let time_ok = time.len() == 15 && time.as_bytes()[8] == b'.';
        let file_ok = file.contains(':') && !file.contains('/');
        (severity_ok && time_ok && pid.parse::<u32>().is_ok() && file_ok && parts.next().is_none())
            .then_some(())
    };
    let bodies: Vec<String> = text
        .lines()
        .map(|line| {
            let (header, body) = line
                .split_once("] ")
                .unwrap_or_else(|| panic!("no klog header: {line}"));
            pid_and_file(header).unwrap_or_else(|| panic!("not klog's header: {line}"));
            assert!(
                body.starts_with('"'),
                "the message comes quoted first: {line}"
            );
            body.to_owned()
        })
        .collect();
    assert!(!bodies.is_empty(), "{} is empty", path.display());
    bodies
}

#[tokio::test]
async fn klog_text_logs_of_server_and_agent_by_default() {
    let (_pki, server_log, agent_log) = logs_of_a_pair(&[]).await;

    let server_bodies = klog_bodies(&server_log);
    let agent_bodies = klog_bodies(&agent_log);
    for (role, bodies) in [("server", &server_bodies), ("agent", &agent_bodies)] {
        let first = &bodies[0];
        assert!(
            first.starts_with(r#""tether starting" version=""#)
                && first.contains(" commit=\"")
                && first.contains(&format!(r#"flags="{role} "#))
                && first.contains("--logtostderr=false"),
            "{role}: the first line says what runs and with which flags: {first}"
        );
        for body in bodies {
            assert!(
                !body.contains("Some(") && !body.contains("None"),
                "{role}: a field leaks Rust's Debug: {body}"
            );
        }
    }
    let listening = server_bodies
        .iter()
        .find(|b| b.starts_with(r#""proxy server listening""#))
        .expect("the server says where it listens");
    assert!(
        listening.contains(r#" mode="grpc""#) && listening.contains(r#" health="127.0.0.1:"#),
        "{listening}"
    );
}

/// A destination that resets every connection after its first byte.
async fn resetting_target() -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let mut byte = [0u8; 1];
            let _ = tokio::time::timeout(STEP, stream.read(&mut byte)).await;
            #[allow(deprecated)]
            let _ = stream.set_linger(Some(Duration::ZERO));
        }
    });
    (addr, task)
}

/// Lines of `lines` at `level` whose `field` equals `value`.
fn at_level<'a>(
    lines: &'a [serde_json::Value],
    level: &str,
    field: &str,
    value: &str,
) -> Vec<&'a serde_json::Value> {
    lines
        .iter()
        .filter(|l| l["level"] == level && l[field].as_str() == Some(value))
        .collect()
}

/// A connection through either frontend, as the tests see it.
trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

/// A client of the server's frontend.
enum Client {
    Grpc(GrpcClient),
    HttpConnect(Transport),
}

impl Client {
    async fn dial(&self, address: &str) -> Result<Box<dyn Stream>, tether_client::DialError> {
        let stream: Box<dyn Stream> = match self {
            Client::Grpc(client) => Box::new(client.dial(address).await?),
            Client::HttpConnect(transport) => {
                Box::new(tether_client::dial_http_connect(transport, address).await?)
            }
        };
        Ok(stream)
    }
}

/// Whether `line` carries `field`, as its own field or in one of its spans.
fn carries(line: &serde_json::Value, field: &str) -> bool {
    !line[field].is_null()
        || line["spans"]
            .as_array()
            .is_some_and(|spans| spans.iter().any(|s| !s[field].is_null()))
}

/// `field` of `line`, its own or from the innermost span that has it.
fn field_of(line: &serde_json::Value, field: &str) -> Option<String> {
    let own = line[field].as_str().map(str::to_owned);
    own.or_else(|| {
        line["spans"].as_array().and_then(|spans| {
            spans
                .iter()
                .rev()
                .find_map(|s| s[field].as_str().map(str::to_owned))
        })
    })
}

#[tokio::test]
async fn one_info_line_per_abnormal_connection_with_its_ids_on_both_sides_grpc() {
    ids_on_every_line_of_a_connection(Via::Grpc).await;
}

#[tokio::test]
async fn one_info_line_per_abnormal_connection_with_its_ids_on_both_sides_http_connect() {
    ids_on_every_line_of_a_connection(Via::HttpConnect).await;
}

#[derive(Clone, Copy, Debug)]
enum Via {
    Grpc,
    HttpConnect,
}

/// A normal close, an abnormal one and a refused dial through `via`: one INFO line on each
/// side for the abnormal close, none for the normal one, and every DEBUG line of these
/// connections on the server carries their agent and server ids.
async fn ids_on_every_line_of_a_connection(via: Via) {
    let pki = Pki::generate().unwrap();
    let server_log = pki.dir().join("server.log");
    let agent_log = pki.dir().join("agent.log");
    let flags = |log: &Path, extra: &str| {
        vec![
            "-v=5".to_owned(),
            "--log-format=json".to_owned(),
            "--logtostderr=false".to_owned(),
            format!("--log-file={}", log.display()),
            extra.to_owned(),
        ]
    };
    let server_flags = flags(&server_log, "--server-id=server-logs");
    let agent_flags = flags(&agent_log, "--agent-id=agent-logs");
    let uds = pki.dir().join("frontend.sock");
    let frontend = match via {
        Via::Grpc => Frontend::GrpcUds(uds.clone()),
        Via::HttpConnect => Frontend::HttpConnectTls,
    };
    let server = spawn_server(bin(), &pki, frontend, &as_str(&server_flags))
        .await
        .expect("server");
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &as_str(&agent_flags))
        .await
        .expect("agent");
    server
        .process
        .wait_ready()
        .await
        .expect("server has the agent");
    let client = match via {
        Via::Grpc => Client::Grpc(GrpcClient::connect(&Transport::Unix(uds)).await.unwrap()),
        Via::HttpConnect => Client::HttpConnect(tls_transport(&pki, &server)),
    };
    let open_dial_ids = || async {
        let (status, body) = get(server.admin_addr, "/debug/connections").await.unwrap();
        assert_eq!(status, 200);
        let report: serde_json::Value = serde_json::from_str(&body).unwrap();
        report["connections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["dial_id"].as_i64().unwrap().to_string())
            .collect::<Vec<_>>()
    };
    let wait_closed = || async {
        let until = tokio::time::Instant::now() + STEP;
        while !open_dial_ids().await.is_empty() {
            assert!(
                tokio::time::Instant::now() < until,
                "connection still listed"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };

    // A normal close: the client ends a connection that echoed.
    let echo = EchoServer::start().await.unwrap();
    let mut normal = client.dial(&echo.addr.to_string()).await.unwrap();
    normal.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    normal.read_exact(&mut back).await.unwrap();
    let normal_dial = open_dial_ids().await.pop().expect("listed while open");
    drop(normal);
    wait_closed().await;

    // An abnormal close: the destination resets the connection.
    let (target, _reset) = resetting_target().await;
    let mut broken = client.dial(&target.to_string()).await.unwrap();
    let broken_dial = open_dial_ids().await.pop().expect("listed while open");
    broken.write_all(b"x").await.unwrap();
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(STEP, broken.read_to_end(&mut sink)).await;
    drop(broken);
    wait_closed().await;

    // A refused dial: nothing listens on the destination.
    let refused = free_port_address();
    assert!(client.dial(&refused).await.is_err(), "{refused} refuses");
    // The agent logs its side when it answers; give it a moment before stopping.
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop(agent, 2).await;
    stop(server.process, 1).await;

    let server_lines = json_lines(&server_log);
    let agent_lines = json_lines(&agent_log);
    for (side, lines) in [("server", &server_lines), ("agent", &agent_lines)] {
        assert!(
            at_level(lines, "INFO", "dial.id", &normal_dial).is_empty(),
            "{side}: a normal close is not logged at INFO: {lines:#?}"
        );
        let info = at_level(lines, "INFO", "dial.id", &broken_dial);
        assert_eq!(info.len(), 1, "{side}: one INFO line: {info:#?}");
        let line = info[0];
        assert_eq!(line["message"], "connection ended abnormally", "{line}");
        assert_eq!(line["agent.id"], "agent-logs", "{side}: {line}");
        assert_eq!(line["server.id"], "server-logs", "{side}: {line}");
        assert!(line["connect.id"].is_string(), "{side}: {line}");
        // -v=5 turns DEBUG on: the normal close is there, once, with the same IDs.
        let closed: Vec<_> = at_level(lines, "DEBUG", "dial.id", &normal_dial)
            .into_iter()
            .filter(|l| l["message"] == "connection closed")
            .collect();
        assert_eq!(closed.len(), 1, "{side}: {closed:#?}");
        assert_eq!(closed[0]["agent.id"], "agent-logs");
        assert_eq!(closed[0]["server.id"], "server-logs");
    }
    let connect_id = |lines: &[serde_json::Value]| {
        at_level(lines, "INFO", "dial.id", &broken_dial)[0]["connect.id"].clone()
    };
    assert_eq!(
        connect_id(&server_lines),
        connect_id(&agent_lines),
        "one connection ID on both sides"
    );

    // The refused dial: one INFO line on each side, with one dial ID.
    let failed_dial = |lines: &[serde_json::Value]| {
        let failed: Vec<_> = lines
            .iter()
            .filter(|l| l["level"] == "INFO" && l["message"] == "dial failed")
            .collect();
        assert_eq!(failed.len(), 1, "one failed dial: {failed:#?}");
        assert_eq!(failed[0]["agent.id"], "agent-logs", "{}", failed[0]);
        assert_eq!(failed[0]["server.id"], "server-logs", "{}", failed[0]);
        failed[0]["dial.id"].as_str().expect("dial.id").to_owned()
    };
    let refused_dial = failed_dial(&server_lines);
    // A client that hangs up on its refused dial ends the call normally.
    let worded_as_errors: Vec<_> = server_lines
        .iter()
        .filter(|l| l["message"] == "proxy stream ended with an error")
        .collect();
    assert!(worded_as_errors.is_empty(), "{worded_as_errors:#?}");
    let server_failed = server_lines
        .iter()
        .find(|l| l["message"] == "dial failed")
        .unwrap();
    assert_eq!(
        server_failed["address"], refused,
        "the server's line names the destination: {server_failed}"
    );
    assert_eq!(
        refused_dial,
        failed_dial(&agent_lines),
        "one dial ID on both sides"
    );

    // Every DEBUG line of the three on the server, the frontend's and the dial's included,
    // carries the agent's and the server's ids (its own or its connection span's), so one
    // grep for an id finds all of them. Lines written by the frontend belong to a
    // connection whatever they say, so they must name the dial too.
    let dials = [&normal_dial, &broken_dial, &refused_dial];
    let frontend_target = |l: &serde_json::Value| {
        l["target"].as_str().is_some_and(|t| {
            t.starts_with("tether_server::frontend") || t.starts_with("tether_server::dial")
        })
    };
    let of_connections: Vec<_> = server_lines
        .iter()
        .filter(|l| l["level"] == "DEBUG")
        .filter(|l| {
            frontend_target(l) || field_of(l, "dial.id").is_some_and(|id| dials.contains(&&id))
        })
        .collect();
    for line in &of_connections {
        let dial = field_of(line, "dial.id");
        assert!(
            dial.as_ref().is_some_and(|id| dials.contains(&id)),
            "a line of a connection names its dial: {line}"
        );
        assert_eq!(
            field_of(line, "agent.id").as_deref(),
            Some("agent-logs"),
            "{line}"
        );
        assert_eq!(
            field_of(line, "server.id").as_deref(),
            Some("server-logs"),
            "{line}"
        );
    }
    // The check above must have lines to look at: the frontend's own among them, and the
    // connection ID on those of established connections.
    let from_frontend = of_connections.iter().filter(|l| frontend_target(l)).count();
    assert!(from_frontend >= 3, "{via:?}: {of_connections:#?}");
    if let Via::HttpConnect = via {
        let abortive: Vec<_> = of_connections
            .iter()
            .filter(|l| l["message"] == "closing connection abortively")
            .collect();
        assert_eq!(abortive.len(), 1, "{of_connections:#?}");
        assert!(carries(abortive[0], "connect.id"), "{}", abortive[0]);
        assert_eq!(
            field_of(abortive[0], "dial.id").as_ref(),
            Some(&broken_dial)
        );
    }
}

/// `127.0.0.1:port` where nothing listens (a port just bound and released).
fn free_port_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

/// N7: a peer's text reaches the log escaped. A fake agent answers a dial, then closes the
/// connection with a CLOSE_RSP error holding a newline and a made-up log line; the server's
/// text log keeps it on the line of the close, where it used to start a line of its own.
#[tokio::test]
async fn a_forged_newline_in_a_close_error_stays_on_one_log_line() {
    use tether_proto::{ConnectId, Packet};

    let pki = Pki::generate().unwrap();
    let server_log = pki.dir().join("server.log");
    let uds = pki.dir().join("frontend.sock");
    let log_flag = format!("--log-file={}", server_log.display());
    let server = spawn_server(
        bin(),
        &pki,
        Frontend::GrpcUds(uds.clone()),
        &["--logtostderr=false", &log_flag],
    )
    .await
    .expect("server");
    tether_testkit::http::wait_for_200(server.process.health, "/healthz", STEP)
        .await
        .unwrap();

    // The fake agent: the PKI's agent certificate, speaking AgentService.Connect itself.
    let f = &pki.files;
    let tls = tether_tls::client_config(
        &f.ca_cert,
        Some((&f.agent_cert, &f.agent_key)),
        vec![b"h2".to_vec()],
        &Default::default(),
    )
    .unwrap();
    let tcp = tokio::net::TcpStream::connect(server.agent_addr)
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap();
    let (channel, driver) = tether_grpc::client::Channel::handshake(
        tls,
        &tether_grpc::H2Settings::agent_stream(),
        "127.0.0.1",
        true,
    )
    .await
    .unwrap();
    tokio::spawn(driver.run());
    let (mut tx, mut rx) = channel
        .call(
            tether_proto::path::CONNECT,
            &[("agentid", "forger".to_owned())],
        )
        .await
        .unwrap();
    rx.response_headers().await.unwrap();
    server.process.wait_ready().await.unwrap();

    let forged = "boom\nE1203 09:09:09.000000       1 listen.rs:1] \"FORGED LINE\"";
    let agent = tokio::spawn(async move {
        loop {
            let packet = tokio::time::timeout(STEP, rx.next())
                .await
                .expect("a DIAL_REQ")
                .expect("the stream is open")
                .expect("a packet");
            if let Packet::DialRequest { random, .. } = packet {
                let id = ConnectId(1);
                tx.send(&Packet::DialResponse {
                    random,
                    result: Ok(id),
                })
                .await
                .unwrap();
                tx.send(&Packet::CloseResponse {
                    connect_id: id,
                    error: Some(forged.to_owned()),
                })
                .await
                .unwrap();
                return (tx, rx);
            }
        }
    });
    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();
    let mut stream = tokio::time::timeout(STEP, client.dial("127.0.0.1:9"))
        .await
        .unwrap()
        .unwrap();
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(STEP, stream.read_to_end(&mut sink)).await;
    let _held = agent.await.unwrap();

    let mut text = String::new();
    for _ in 0..100 {
        text = std::fs::read_to_string(&server_log).unwrap_or_default();
        if text.contains("FORGED LINE") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("FORGED LINE")).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(
        lines[0].contains("connection ended abnormally")
            && lines[0].contains(r#"boom\\nE1203 09:09:09.000000"#),
        "the forged text stays on the close's own line, escaped: {}",
        lines[0]
    );
    assert!(
        !text.lines().any(|l| l.starts_with("E1203 09:09:09")),
        "{text}"
    );
    drop(client);
    let mut process = server.process;
    process.signal("TERM").await.unwrap();
    let _ = process.wait(STEP).await;
}
