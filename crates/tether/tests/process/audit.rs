//! N3 with the real binary: an audit sink that stalls (a FIFO nobody reads, like a stuck
//! stdout pipe) must stop neither dials nor `/metrics`, even with one runtime worker. The
//! writer used to block a runtime worker on the pipe; pinned to one worker, the whole server
//! stopped. Now it writes from its own thread, and what does not fit in its queue is dropped
//! and counted.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::http::{get, metric_value};
use tether_testkit::process::{Frontend, free_port, server_flags, spawn_agent};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{STEP, bin};

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
