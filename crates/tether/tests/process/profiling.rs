//! `--enable-profiling` on the real binary: a CPU profile taken under load that Go's own
//! `go tool pprof` reads, heap statistics, and nothing at all without the flag.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::http::get_bytes;
use tether_testkit::process::{Frontend, spawn_agent, spawn_server};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{STEP, bin};

/// Echoes 64 KiB chunks through the tunnel until `done` is set (or a bound passes), so the
/// profile has work to see however long the profiler takes to start.
async fn load(uds: std::path::PathBuf, target: String, done: Arc<AtomicBool>) -> u64 {
    let until = Instant::now() + STEP * 2;
    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();
    let mut stream = client.dial(&target).await.unwrap();
    let chunk = vec![7u8; 64 * 1024];
    let mut back = vec![0u8; chunk.len()];
    let mut moved = 0;
    while !done.load(Ordering::Acquire) && Instant::now() < until {
        stream.write_all(&chunk).await.unwrap();
        stream.read_exact(&mut back).await.unwrap();
        moved += chunk.len() as u64;
    }
    moved
}

/// `go tool pprof -top` on `profile`, written to `path`: its report, after checking it ran.
async fn pprof_top(path: &std::path::Path, profile: &[u8]) -> String {
    std::fs::write(path, profile).unwrap();
    let output = tokio::time::timeout(
        STEP * 2,
        tokio::process::Command::new("go")
            .args(["tool", "pprof", "-top", "-symbolize=none"])
            .arg(path)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("go tool pprof in time")
    .expect("go tool pprof runs (Go installed)");
    let top = String::from_utf8_lossy(&output.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "go tool pprof failed: {stderr}\n{top}"
    );
    top
}

#[tokio::test]
async fn cpu_profile_under_load_reads_in_go_tool_pprof() {
    let pki = Pki::generate().unwrap();
    let uds = pki.dir().join("frontend.sock");
    let server = spawn_server(
        bin(),
        &pki,
        Frontend::GrpcUds(uds.clone()),
        &["--enable-profiling"],
    )
    .await
    .expect("server");
    let _agent = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .expect("agent");
    server
        .process
        .wait_ready()
        .await
        .expect("server has the agent");
    let echo = EchoServer::start().await.unwrap();

    let done = Arc::new(AtomicBool::new(false));
    // Several connections at once: one alone leaves the server mostly waiting on its peers.
    let traffic: Vec<_> = (0..4)
        .map(|_| tokio::spawn(load(uds.clone(), echo.addr.to_string(), done.clone())))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Samples that land in the C library (the relay's syscalls) are dropped by the
    // profiler's unwinding-safety blocklist, so a lightly loaded second may hold only a few
    // samples of the server's own code, and on a loaded machine a profile may catch none;
    // up to six profiles are taken to see one.
    let mut named = Vec::new();
    for attempt in 0..6 {
        let (status, profile) = get_bytes(server.admin_addr, "/debug/pprof/profile?seconds=2")
            .await
            .expect("profile");
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&profile));
        let top = pprof_top(&pki.dir().join(format!("cpu-{attempt}.pb")), &profile).await;
        assert!(top.contains("flat%"), "a -top table: {top}");
        named.push(top);
        if named.last().is_some_and(|top| top.contains("tether_")) {
            break;
        }
    }
    done.store(true, Ordering::Release);
    for connection in traffic {
        let moved = tokio::time::timeout(STEP, connection)
            .await
            .unwrap()
            .unwrap();
        assert!(moved > 0);
    }
    assert!(
        named.last().is_some_and(|top| top.contains("tether_")),
        "the server's own functions are named: {named:#?}"
    );

    let (status, heap) = get_bytes(server.admin_addr, "/debug/pprof/heap")
        .await
        .unwrap();
    let heap = String::from_utf8_lossy(&heap);
    assert_eq!(status, 200);
    assert!(
        heap.contains("malloc_in_use_bytes") && heap.contains("process_vmrss"),
        "{heap}"
    );

    let (status, _) = get_bytes(server.admin_addr, "/debug/pprof/profile?seconds=0")
        .await
        .unwrap();
    assert_eq!(status, 400, "a zero-length profile is refused");
}

#[tokio::test]
async fn without_the_flag_the_profiling_paths_do_not_exist() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(
        bin(),
        &pki,
        Frontend::GrpcUds(pki.dir().join("frontend.sock")),
        &[],
    )
    .await
    .expect("server");
    tether_testkit::http::wait_for_200(server.admin_addr, "/metrics", STEP)
        .await
        .unwrap();
    for path in [
        "/debug/pprof/",
        "/debug/pprof/profile?seconds=1",
        "/debug/pprof/heap",
    ] {
        let (status, _) = get_bytes(server.admin_addr, path).await.unwrap();
        assert_eq!(status, 404, "{path}");
    }
}
