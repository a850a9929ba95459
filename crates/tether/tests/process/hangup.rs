//! SIGHUP never ends a server or an agent, with or without a configuration file to reload:
//! an operator who sends it out of habit (as to nginx) must not drop every tunnel. Without a
//! watched file, each SIGHUP is logged as having nothing to reload.

use std::path::Path;
use std::time::Duration;

use tether_client::{GrpcClient, Transport};
use tether_testkit::Pki;
use tether_testkit::process::{Frontend, Process, spawn_agent, spawn_server};
use tether_testkit::targets::EchoServer;

use crate::reload::echo;
use crate::{bin, until};

/// Flags that send a process's log to `path`.
fn log_to(path: &Path) -> Vec<String> {
    vec![
        "--logtostderr=false".to_owned(),
        format!("--log-file={}", path.display()),
    ]
}

/// Sends SIGHUP twice (each once the previous one is logged: signals pending together
/// count once), then checks that `process` is still running.
async fn hang_up(process: &mut Process, log: &Path, flag: &str) {
    for sent in 1..=2 {
        process.signal("HUP").await.unwrap();
        until("the SIGHUP is logged", || async {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            text.matches("SIGHUP: nothing to reload").count() >= sent
        })
        .await;
    }
    let text = std::fs::read_to_string(log).unwrap();
    assert!(text.contains(&format!("({flag} is not set)")), "{text}");
    assert!(
        process.wait(Duration::from_millis(300)).await.is_err(),
        "the process ended after SIGHUP"
    );
}

#[tokio::test]
async fn sighup_without_a_configuration_file_is_logged_and_ends_nothing() {
    let pki = Pki::generate().unwrap();
    let echo_server = EchoServer::start().await.unwrap();
    let (server_log, agent_log) = (pki.dir().join("server.log"), pki.dir().join("agent.log"));
    let uds = pki.dir().join("frontend.sock");
    let server_flags = log_to(&server_log);
    let flags: Vec<&str> = server_flags.iter().map(String::as_str).collect();
    let mut server = spawn_server(bin(), &pki, Frontend::GrpcUds(uds.clone()), &flags)
        .await
        .unwrap();
    let agent_flags = log_to(&agent_log);
    let flags: Vec<&str> = agent_flags.iter().map(String::as_str).collect();
    let mut agent = spawn_agent(bin(), &pki, server.agent_addr, &flags)
        .await
        .unwrap();
    server.process.wait_ready().await.unwrap();
    let client = GrpcClient::connect(&Transport::Unix(uds)).await.unwrap();
    let mut stream = client.dial(&echo_server.addr.to_string()).await.unwrap();
    echo(&mut stream, b"before\n").await;

    hang_up(&mut server.process, &server_log, "--routing-config").await;
    hang_up(&mut agent, &agent_log, "--destination-policy").await;

    // The connection opened before carries on, and new ones are dialed.
    echo(&mut stream, b"after\n").await;
    let mut fresh = client.dial(&echo_server.addr.to_string()).await.unwrap();
    echo(&mut fresh, b"fresh\n").await;
}
