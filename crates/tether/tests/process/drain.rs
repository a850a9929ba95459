//! `--drain-timeout`: an agent asked to stop (one SIGTERM) exits once its proxied connections
//! are gone, or at the bound; without it, as upstream, it waits for a second signal. Its log
//! says which, and that a second signal exits now.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::time::Instant;

use tether_testkit::Pki;
use tether_testkit::process::{Frontend, Process, ServerProcess, spawn_agent, spawn_server};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::{STEP, bin, tls_transport};

/// The line every draining agent logs, up to the count of open connections.
const DRAINING: &str = "draining: told every server, opening no new server connections; ";

struct Scene {
    pki: Pki,
    server: ServerProcess,
    agent: Process,
    log: PathBuf,
}

/// A server and a ready agent with `extra` flags, the agent logging to a file.
async fn scene(extra: &[&str]) -> Scene {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    let log = pki.dir().join("agent.log");
    let mut flags = vec![
        "--logtostderr=false".to_owned(),
        format!("--log-file={}", log.display()),
    ];
    flags.extend(extra.iter().map(|s| (*s).to_owned()));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &flags)
        .await
        .unwrap();
    agent.wait_ready().await.unwrap();
    Scene {
        pki,
        server,
        agent,
        log,
    }
}

fn log_of(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Waits until the agent's log says `text`; fails after [`STEP`].
async fn logged(path: &Path, text: &str) -> String {
    let started = Instant::now();
    loop {
        let log = log_of(path);
        if log.contains(text) {
            return log;
        }
        assert!(
            started.elapsed() < STEP,
            "the log never said {text:?}:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A connection through the agent to an echo server, checked to carry bytes.
async fn live_connection(scene: &Scene, echo: &EchoServer) -> tether_client::ProxySocket {
    let transport = tls_transport(&scene.pki, &scene.server);
    let mut live = tether_client::dial_http_connect(&transport, &echo.addr.to_string())
        .await
        .unwrap();
    live.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    tokio::time::timeout(STEP, live.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    live
}

#[tokio::test]
async fn an_idle_agent_exits_at_once_after_one_signal() {
    let mut s = scene(&["--drain-timeout=30s"]).await;
    s.agent.signal("TERM").await.unwrap();
    let signalled = Instant::now();
    assert_eq!(s.agent.wait(STEP).await.unwrap(), Some(0));
    let took = signalled.elapsed();
    assert!(took < Duration::from_secs(10), "exited promptly ({took:?})");
    let log = log_of(&s.log);
    assert!(
        log.contains(&format!(
            "{DRAINING}0 connections open; exiting when they close or after 30s \
             (--drain-timeout); send the signal again to exit now"
        )),
        "{log}"
    );
    assert!(
        log.contains("drained: no connections open; stopping"),
        "{log}"
    );
}

#[tokio::test]
async fn a_draining_agent_waits_for_its_open_connection() {
    let mut s = scene(&["--drain-timeout=1m"]).await;
    let echo = EchoServer::start().await.unwrap();
    let mut live = live_connection(&s, &echo).await;
    s.agent.signal("TERM").await.unwrap();
    logged(
        &s.log,
        &format!("{DRAINING}1 connection open; exiting when they close or after 1m0s"),
    )
    .await;
    // Still there, and still carrying the connection ...
    assert!(
        s.agent.wait(Duration::from_secs(1)).await.is_err(),
        "the agent must wait for its connection"
    );
    live.write_all(b"still").await.unwrap();
    let mut back = [0u8; 5];
    tokio::time::timeout(STEP, live.read_exact(&mut back))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&back, b"still");
    // ... until it closes.
    drop(live);
    assert_eq!(s.agent.wait(STEP).await.unwrap(), Some(0));
    assert!(log_of(&s.log).contains("drained: no connections open; stopping"));
}

#[tokio::test]
async fn a_draining_agent_exits_at_the_bound() {
    let mut s = scene(&["--drain-timeout=1s"]).await;
    let echo = EchoServer::start().await.unwrap();
    let mut live = live_connection(&s, &echo).await;
    s.agent.signal("TERM").await.unwrap();
    let signalled = Instant::now();
    assert_eq!(s.agent.wait(STEP).await.unwrap(), Some(0));
    let took = signalled.elapsed();
    assert!(
        took >= Duration::from_secs(1),
        "not before the bound ({took:?})"
    );
    let log = log_of(&s.log);
    assert!(
        log.contains("--drain-timeout 1s passed with connections still open; stopping"),
        "{log}"
    );
    // The connection it carried is cut, not left hanging.
    let mut buf = [0u8; 8];
    let end = tokio::time::timeout(STEP, live.read(&mut buf))
        .await
        .expect("the cut connection ends");
    assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
}

#[tokio::test]
async fn without_a_drain_timeout_an_idle_agent_waits_for_a_second_signal() {
    let mut s = scene(&[]).await;
    s.agent.signal("TERM").await.unwrap();
    logged(
        &s.log,
        &format!(
            "{DRAINING}0 connections open; running until a second signal \
             (--drain-timeout=0s, as upstream); send the signal again to exit now"
        ),
    )
    .await;
    assert!(
        s.agent.wait(Duration::from_secs(1)).await.is_err(),
        "as upstream: a draining agent keeps serving"
    );
    s.agent.signal("TERM").await.unwrap();
    assert_eq!(s.agent.wait(STEP).await.unwrap(), Some(0));
}
