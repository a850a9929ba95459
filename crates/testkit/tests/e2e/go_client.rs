//! The real Go konnectivity-client (built by interop/build.sh) against tether.

use std::path::PathBuf;
use std::process::Stdio;

use tether_testkit::targets::{EchoServer, refused_addr};
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};

use crate::STEP;

fn dial_tool() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../interop/bin/konnectivity-dial")
}

async fn run(args: &[&str]) -> (bool, String) {
    let out = tokio::time::timeout(
        STEP * 2,
        tokio::process::Command::new(dial_tool())
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("konnectivity-dial finishes")
    .expect("interop/bin/konnectivity-dial exists: run interop/build.sh");
    let report = format!(
        "{}\n--- stderr ---\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), report)
}

#[tokio::test]
async fn go_client_echo_and_dial_errors() {
    tether_testkit::init_logging();
    let pki = Pki::generate().unwrap();
    let server = TestServer::start(&pki, ServerOptions::default())
        .await
        .unwrap();
    let uds = server.frontend.clone();

    // No agent yet: the Go client sees "No agent available".
    let refused = refused_addr().to_string();
    let (ok, out) = run(&[
        "--uds",
        &uds,
        "--address",
        &refused,
        "--mode",
        "expect-dial-error",
        "--timeout",
        "10s",
    ])
    .await;
    assert!(ok && out.contains("No agent available"), "{out}");

    let _agent = TestAgent::start(&pki, server.agent_addr, AgentOptions::default())
        .await
        .unwrap();
    server.wait_ready().await.unwrap();
    let echo = EchoServer::start().await.unwrap();
    let (ok, out) = run(&[
        "--uds",
        &uds,
        "--address",
        &echo.addr.to_string(),
        "--mode",
        "echo",
        "--bytes",
        "67108864",
    ])
    .await;
    assert!(ok, "{out}");
    let (ok, out) = run(&[
        "--uds",
        &uds,
        "--address",
        &refused,
        "--mode",
        "expect-dial-error",
        "--expect-reason",
        "endpoint",
    ])
    .await;
    assert!(ok && out.contains("connection refused"), "{out}");
}
