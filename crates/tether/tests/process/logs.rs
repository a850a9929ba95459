//! `--log-format=json` on the real binaries: every line a JSON object with the fixed keys,
//! and events inside a connection's span carry that span's fields.

use std::path::Path;
use std::time::Duration;

use tether_testkit::Pki;
use tether_testkit::process::{Frontend, Process, spawn_agent, spawn_server};

use crate::{STEP, bin};

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

#[tokio::test]
async fn json_logs_of_server_and_agent() {
    let pki = Pki::generate().unwrap();
    let server_log = pki.dir().join("server.log");
    let agent_log = pki.dir().join("agent.log");
    let flags = |log: &Path| {
        vec![
            "--log-format=json".to_owned(),
            "--logtostderr=false".to_owned(),
            format!("--log-file={}", log.display()),
        ]
    };
    let server_flags = flags(&server_log);
    let agent_flags = flags(&agent_log);
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

    let server_lines = json_lines(&server_log);
    assert!(
        some_span_has(&server_lines, "agent.id"),
        "{server_lines:#?}"
    );
    let agent_lines = json_lines(&agent_log);
    assert!(some_span_has(&agent_lines, "server.id"), "{agent_lines:#?}");
}
