//! The audit log with the real binary.
//!
//! N3: an audit sink that stalls (a FIFO nobody reads, like a stuck stdout pipe) must stop
//! neither dials nor `/metrics`, even with one runtime worker. The writer used to block a
//! runtime worker on the pipe; pinned to one worker, the whole server stopped. Now it writes
//! from its own thread, and what does not fit in its queue is dropped and counted.
//!
//! Issue 27: a connection is in the log from its first byte. Its opening record is on disk
//! while it runs, so a server killed in the middle of an exec leaves it behind; and on
//! standard output the records are JSON lines, apart from the logs on standard error.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::time::Instant;

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::http::{get, metric_value};
use tether_testkit::process::{Frontend, free_port, server_flags, spawn_agent, spawn_server};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{STEP, bin, until};

/// Refused dials sent while the sink is stalled: each writes a record of about 4.5 KiB (its
/// address is cut to 4 KiB), so these pass the pipe's 64 KiB and the queue's 4 MiB.
const REFUSED_DIALS: usize = 1_200;

/// A FIFO at `path` with a reader that never reads: writes block once its buffer is full.
fn stalled_fifo(path: &Path) -> std::fs::File {
    let status = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .expect("mkfifo");
    assert!(status.success());
    // Read and write: opening never blocks, and the pipe always has a reader.
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .expect("open the FIFO")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_audit_sink_stops_neither_dials_nor_metrics() {
    let pki = Pki::generate().unwrap();
    let fifo = pki.dir().join("audit.fifo");
    let _reader = stalled_fifo(&fifo);
    let uds = pki.dir().join("frontend.sock");
    let (agent_port, health, admin) = (free_port(), free_port(), free_port());
    let mut args = vec!["server".to_owned()];
    args.extend(server_flags(
        &pki,
        &Frontend::GrpcUds(uds.clone()),
        None,
        [agent_port, health, admin],
    ));
    args.push(format!("--audit-log-path={}", fifo.display()));
    let mut server = tokio::process::Command::new(bin())
        .args(&args)
        // One runtime worker, as on a node with one CPU.
        .env("TOKIO_WORKER_THREADS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let health = SocketAddr::from(([127, 0, 0, 1], health));
    let agent_addr = SocketAddr::from(([127, 0, 0, 1], agent_port));
    let agent = spawn_agent(bin(), &pki, agent_addr, &[]).await.unwrap();
    tether_testkit::http::wait_for_200(health, "/readyz", STEP)
        .await
        .unwrap();
    let echo = EchoServer::start().await.unwrap();

    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();
    let invalid = format!("{}:1", "x".repeat(6 * 1024));
    let started = Instant::now();
    for n in 0..REFUSED_DIALS {
        let refused = tokio::time::timeout(Duration::from_secs(10), client.dial(&invalid))
            .await
            .unwrap_or_else(|_| panic!("refused dial {n} got no answer in 10 s"));
        assert!(refused.is_err());
    }
    let refusing = started.elapsed();

    // The server still answers: /metrics, and a real dial through the agent.
    let (status, metrics) = tokio::time::timeout(Duration::from_secs(10), get(health, "/metrics"))
        .await
        .expect("/metrics in 10 s")
        .unwrap();
    assert_eq!(status, 200);
    let dropped = metric_value(&metrics, "tether_audit_records_dropped_total").unwrap_or(0.0);
    assert!(
        dropped > 0.0,
        "the records past the queue's bytes are dropped and counted: {dropped}"
    );
    let mut stream =
        tokio::time::timeout(Duration::from_secs(10), client.dial(&echo.addr.to_string()))
            .await
            .expect("a dial answered in 10 s")
            .unwrap();
    stream.write_all(b"still serving").await.unwrap();
    let mut back = [0u8; 13];
    tokio::time::timeout(STEP, stream.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"still serving");
    drop(stream);

    // The server's memory stays bounded: the queue holds at most 4 MiB of records.
    let rss_kib = rss_kib(server.id().unwrap());
    assert!(
        rss_kib < 128 * 1024,
        "server RSS {rss_kib} KiB after {REFUSED_DIALS} records"
    );

    // Shutdown does not wait for the stalled sink beyond its deadline.
    let stopping = Instant::now();
    tokio::process::Command::new("kill")
        .args(["-TERM", &server.id().unwrap().to_string()])
        .status()
        .await
        .unwrap();
    let code = tokio::time::timeout(STEP, server.wait())
        .await
        .expect("the server exits with its audit sink stalled")
        .unwrap();
    assert!(code.success(), "{code:?}");
    eprintln!(
        "{REFUSED_DIALS} refused dials in {refusing:?}, {dropped} records dropped, stopped in {:?}",
        stopping.elapsed()
    );
    drop(agent);
}

/// A process's resident set, from /proc.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// The records in `text`, each line one JSON object.
fn parse_records(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect()
}

/// The records in an audit log file so far (none when it does not exist yet).
pub(crate) fn read_records(path: &Path) -> Vec<serde_json::Value> {
    parse_records(&std::fs::read_to_string(path).unwrap_or_default())
}

/// The records of `event` for dial `dial_id`.
pub(crate) fn of_dial<'a>(
    records: &'a [serde_json::Value],
    event: &str,
    dial_id: &serde_json::Value,
) -> Vec<&'a serde_json::Value> {
    records
        .iter()
        .filter(|r| r["event"] == event && &r["dial_id"] == dial_id)
        .collect()
}

/// Echoes `text` through `stream`.
async fn echo(stream: &mut tether_client::TunnelStream, text: &[u8]) {
    stream.write_all(text).await.unwrap();
    let mut back = vec![0u8; text.len()];
    tokio::time::timeout(STEP, stream.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(back, text);
}

/// A connection's opening is on disk while it runs: the server killed mid-connection (a
/// crash, an OOM kill) leaves it, with the dial id, the agent and the generation, and a
/// connection that ended before has its opening and its end, paired by dial id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_server_leaves_the_opening_of_a_live_connection_on_disk() {
    let pki = Pki::generate().unwrap();
    let log = pki.dir().join("audit.log");
    let uds = pki.dir().join("frontend.sock");
    let audit_flag = format!("--audit-log-path={}", log.display());
    let mut server = spawn_server(bin(), &pki, Frontend::GrpcUds(uds.clone()), &[&audit_flag])
        .await
        .unwrap();
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &["--agent-id=audit-agent"])
        .await
        .unwrap();
    server.process.wait_ready().await.unwrap();
    let echo_server = EchoServer::start().await.unwrap();
    let target = echo_server.addr.to_string();
    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();

    // One connection that ends while the server runs.
    let mut ended = client.dial(&target).await.unwrap();
    echo(&mut ended, b"short").await;
    ended.shutdown().await.unwrap();
    drop(ended);
    until("the ended connection's close record", || async {
        read_records(&log)
            .iter()
            .any(|r| r["event"] == "connection")
    })
    .await;

    // One that stays open: its opening is in the file while it runs, its end never.
    let mut live = client.dial(&target).await.unwrap();
    echo(&mut live, b"exec session").await;
    let took = until("the live connection's open record", || async {
        read_records(&log)
            .iter()
            .filter(|r| r["event"] == "connection_opened")
            .count()
            == 2
    })
    .await;
    eprintln!("the open record was in the file {took:?} after the client's first echo");
    server.process.signal("KILL").await.unwrap();
    server.process.wait(STEP).await.unwrap();
    drop(live);

    let records = read_records(&log);
    let opened: Vec<&serde_json::Value> = records
        .iter()
        .filter(|r| r["event"] == "connection_opened")
        .collect();
    assert_eq!(opened.len(), 2, "{records:#?}");
    for open in &opened {
        assert_eq!(open["side"], "server");
        assert_eq!(open["requested"], target.as_str());
        assert_eq!(open["agent_id"], "audit-agent");
        assert_eq!(open["generation"], 1);
        assert_eq!(open["frontend"], "grpc");
        assert_eq!(open["transport"], "uds");
        assert_eq!(open["outcome"], "ok");
        assert!(open["connection_id"].as_i64() > Some(0), "{open}");
        assert!(open.get("closed_by").is_none(), "{open}");
    }
    // The first pairs with its end; the second, cut by the kill, has none.
    let first = &opened[0]["dial_id"];
    let close = of_dial(&records, "connection", first);
    assert_eq!(close.len(), 1, "{records:#?}");
    assert_eq!(close[0]["generation"], 1);
    assert_eq!(close[0]["connection_id"], opened[0]["connection_id"]);
    assert_eq!(close[0]["closed_by"], "client");
    let open_at = records.iter().position(|r| r == opened[0]).unwrap();
    let close_at = records.iter().position(|r| r == close[0]).unwrap();
    assert!(open_at < close_at, "the opening comes first: {records:#?}");
    let second = &opened[1]["dial_id"];
    assert_ne!(first, second);
    assert!(
        of_dial(&records, "connection", second).is_empty(),
        "{records:#?}"
    );
    assert_eq!(records.len(), 3, "{records:#?}");
    drop(agent);
}

/// `--audit-log-path=-`: standard output holds the records and nothing else (the logs go to
/// standard error), as a log collector reading the container's stdout expects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_standard_output_the_records_are_json_lines_apart_from_the_logs() {
    let pki = Pki::generate().unwrap();
    let uds = pki.dir().join("frontend.sock");
    let (agent_port, health, admin) = (free_port(), free_port(), free_port());
    let mut args = vec!["server".to_owned(), "--audit-log-path=-".to_owned()];
    args.extend(server_flags(
        &pki,
        &Frontend::GrpcUds(uds.clone()),
        None,
        [agent_port, health, admin],
    ));
    let server = tokio::process::Command::new(bin())
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let health = SocketAddr::from(([127, 0, 0, 1], health));
    let agent = spawn_agent(
        bin(),
        &pki,
        SocketAddr::from(([127, 0, 0, 1], agent_port)),
        &[],
    )
    .await
    .unwrap();
    tether_testkit::http::wait_for_200(health, "/readyz", STEP)
        .await
        .unwrap();
    let echo_server = EchoServer::start().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();
    let mut stream = client.dial(&echo_server.addr.to_string()).await.unwrap();
    echo(&mut stream, b"to stdout").await;
    stream.shutdown().await.unwrap();
    drop(stream);
    assert!(client.dial("no-port-here").await.is_err());

    tokio::process::Command::new("kill")
        .args(["-TERM", &server.id().unwrap().to_string()])
        .status()
        .await
        .unwrap();
    let out = tokio::time::timeout(STEP, server.wait_with_output())
        .await
        .expect("the server exits")
        .unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    let stdout = String::from_utf8(out.stdout).unwrap();
    let records = parse_records(&stdout);
    // The refusal may come before the end: the client does not wait for the agent's close.
    let mut events: Vec<&str> = records
        .iter()
        .map(|r| r["event"].as_str().unwrap())
        .collect();
    assert_eq!(events[0], "connection_opened", "{stdout}");
    events.sort_unstable();
    assert_eq!(
        events,
        ["connection", "connection_opened", "dial_refused"],
        "{stdout}"
    );
    let opened = &records[0];
    let closed = records.iter().find(|r| r["event"] == "connection").unwrap();
    assert_eq!(opened["dial_id"], closed["dial_id"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains("connection_opened") && stderr.contains("--audit-log-path=-"),
        "the logs (the first names the flags), and only they, on standard error: {stderr}"
    );
    drop(agent);
}
