//! The agent's readiness with fewer servers than counted (one control-plane node down): ready
//! with one, as upstream's agent, so that a DaemonSet rollout does not stall and
//! kube-apiserver's sidecar stays Ready; every counted server only when asked for.

use tether_testkit::Pki;
use tether_testkit::http::get;
use tether_testkit::process::{Frontend, spawn_agent, spawn_server};

use crate::{bin, metric, until};

const OPEN: &str = "konnectivity_network_proxy_agent_open_server_connections";
const KNOWN: &str = "konnectivity_network_proxy_agent_known_server_count";

#[tokio::test]
async fn an_agent_with_one_of_two_servers_is_ready_unless_every_server_is_required() {
    let pki = Pki::generate().unwrap();
    // One of the two servers the agents are told about.
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &["--server-count=2"])
        .await
        .unwrap();
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    agent.wait_ready().await.unwrap();
    assert_eq!(metric(&agent, KNOWN).await, Some(2.0));
    assert_eq!(metric(&agent, OPEN).await, Some(1.0));
    let (status, body) = get(agent.health, "/readyz?verbose").await.unwrap();
    assert_eq!(
        (status, body.as_str()),
        (200, "[+]ping ok\n[+]server-connected ok\ncheck passed\n")
    );

    let strict = spawn_agent(
        bin(),
        &pki,
        server.agent_addr,
        &["--readiness-requires-all-servers"],
    )
    .await
    .unwrap();
    until("the second agent connected", || async {
        metric(&strict, OPEN).await == Some(1.0)
    })
    .await;
    let (status, body) = get(strict.health, "/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("not connected to every counted server (1 connected, 2 counted; --readiness-requires-all-servers)"),
        "{body}"
    );
}
