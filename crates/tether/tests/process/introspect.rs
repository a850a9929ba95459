//! `tether connections`, `tether agents` and `tether top` against a real server and agent:
//! the tables, `--watch --count`, JSON output and filter errors.

use std::process::Output;

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::process::{Frontend, spawn_agent, spawn_server};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{STEP, bin};

/// The release every crate of the workspace shares, as the binary reports it.
const VERSION: &str = env!("CARGO_PKG_VERSION");

async fn tether(args: &[&str]) -> Output {
    tokio::time::timeout(
        STEP,
        tokio::process::Command::new(bin())
            .args(args)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the command ends by itself")
    .expect("runs")
}

fn stdout(output: &Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn the_cli_renders_a_live_server() {
    let pki = Pki::generate().unwrap();
    let uds = pki.dir().join("frontend.sock");
    let server = spawn_server(
        bin(),
        &pki,
        Frontend::GrpcUds(uds.clone()),
        &["--server-id=cli-server"],
    )
    .await
    .expect("server");
    let _agent = spawn_agent(bin(), &pki, server.agent_addr, &["--agent-id=cli-agent"])
        .await
        .expect("agent");
    server
        .process
        .wait_ready()
        .await
        .expect("server has the agent");
    let echo = EchoServer::start().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();
    let mut stream = client.dial(&echo.addr.to_string()).await.unwrap();
    stream.write_all(&[1u8; 3000]).await.unwrap();
    let mut back = vec![0u8; 3000];
    stream.read_exact(&mut back).await.unwrap();
    let admin = server.admin_addr.to_string();

    let table = stdout(&tether(&["connections", "--admin-address", &admin]).await);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(
        lines[0], "1 connection (0 of them pending) on this server",
        "{table}"
    );
    assert!(lines[1].starts_with("STATE  CONN  DIAL"), "{table}");
    let row: Vec<&str> = lines[2].split_whitespace().collect();
    assert_eq!(row[0], "open", "{table}");
    assert_eq!(row[3], "grpc");
    assert!(lines[2].contains(&echo.addr.to_string()) && lines[2].contains("cli-agent"));
    assert!(lines[2].contains("2.9KiB"), "3000 bytes each way: {table}");

    // --watch --count 2: two frames, each starting by clearing the screen.
    let watched = stdout(
        &tether(&[
            "connections",
            "--admin-address",
            &admin,
            "--watch",
            "--count",
            "2",
            "--interval",
            "100ms",
        ])
        .await,
    );
    assert_eq!(watched.matches("\x1b[H\x1b[2J").count(), 2, "{watched:?}");
    assert_eq!(watched.matches("1 connection (").count(), 2);

    let filtered = stdout(
        &tether(&[
            "connections",
            "--admin-address",
            &admin,
            "--agent",
            "someone-else",
        ])
        .await,
    );
    assert!(filtered.starts_with("0 connections"), "{filtered}");

    let json =
        stdout(&tether(&["connections", "--admin-address", &admin, "--output", "json"]).await);
    let report: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(report["connections"][0]["agent_id"], "cli-agent");

    let agents = stdout(&tether(&["agents", "--admin-address", &admin]).await);
    assert!(
        agents.starts_with(&format!(
            "server cli-server (tether {VERSION}, server count 1), 1 agent stream\n"
        )),
        "{agents}"
    );
    let row: Vec<&str> = agents.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(
        row[..4],
        ["cli-agent", "cli-server", "1", VERSION],
        "the agent's release in AGENT-VERSION: {agents}"
    );

    let top = stdout(&tether(&["top", "--admin-address", &admin, "--interval", "200ms"]).await);
    let lines: Vec<&str> = top.lines().collect();
    assert!(
        lines[0].starts_with(&format!("{admin} at 20")) && lines[0].ends_with("(--interval 200ms)"),
        "a header with the time and the interval: {top}"
    );
    assert!(lines[1].starts_with("1 connection, busiest first"), "{top}");

    let refused = tether(&["connections", "--admin-address", &admin, "--state", "bogus"]).await;
    assert_eq!(
        refused.status.code(),
        Some(2),
        "clap refuses an unknown state"
    );
    let unreachable = tether(&["agents", "--admin-address", "127.0.0.1:1"]).await;
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&unreachable.stderr).contains("127.0.0.1:1"));
    drop(stream);
}

#[tokio::test]
async fn an_agent_lists_its_servers_release() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(
        bin(),
        &pki,
        Frontend::HttpConnectTls,
        &["--server-id=versioned"],
    )
    .await
    .expect("server");
    let admin = tether_testkit::process::free_port();
    let health = tether_testkit::process::free_port();
    let mut args = tether_testkit::process::agent_args(&pki, server.agent_addr, health, admin);
    args.push("--agent-id=node-v".into());
    let agent = tether_testkit::process::Process::spawn(
        bin(),
        args,
        std::net::SocketAddr::from(([127, 0, 0, 1], health)),
    )
    .await
    .expect("agent");
    agent.wait_ready().await.expect("agent connected");
    let table =
        stdout(&tether(&["agents", "--admin-address", &format!("127.0.0.1:{admin}")]).await);
    assert!(
        table.starts_with(&format!(
            "agent node-v (tether {VERSION}), connected to 1 of 1 servers\n"
        )),
        "{table}"
    );
    assert!(
        table.lines().nth(1).unwrap().contains(" SERVER-VERSION "),
        "{table}"
    );
    let row: Vec<&str> = table.lines().nth(2).unwrap().split_whitespace().collect();
    assert_eq!(row[..4], ["node-v", "versioned", "0", VERSION], "{table}");
}

/// `--watch` on an endpoint that does not answer keeps going, one "disconnected, retrying"
/// frame per refresh; `--count` still ends it, with the last fetch's error.
#[tokio::test]
async fn watch_survives_an_unreachable_endpoint() {
    for command in ["agents", "connections", "top"] {
        let output = tether(&[
            command,
            "--admin-address",
            "127.0.0.1:1",
            "--watch",
            "--count",
            "3",
            "--interval",
            "50ms",
        ])
        .await;
        let out = String::from_utf8_lossy(&output.stdout);
        assert_eq!(
            out.matches("127.0.0.1:1 at ").count(),
            2,
            "{command}: two frames retried, the third ends it: {out}"
        );
        assert!(
            out.contains("disconnected, retrying every 50ms"),
            "{command}: {out}"
        );
        assert_eq!(output.status.code(), Some(1), "{command}");
        let err = String::from_utf8_lossy(&output.stderr);
        assert!(err.contains("127.0.0.1:1"), "{command}: {err}");
    }
}
