//! tether's agent on the WebSocket link (`--transport=websocket`) through real L7 reverse
//! proxies that end its TLS in front of the server's agent port, beside a direct WebSocket
//! connection to the same server: HAProxy (ALPN `http/1.1` to the server) and nginx (no ALPN:
//! the server tells the upgrade by its first bytes). A path the proxy does not route reaches
//! the agent's log as the proxy's own answer, naming `--websocket-path`.

use std::time::Duration;

use tether_observe::introspect::AgentsReport;
use tether_testkit::Pki;
use tether_testkit::process::ServerProcess;

use crate::reverse_proxies::{Kind, ROUTED_PATH, ReverseProxy};
use crate::{AgentProcess, STEP, echo_through, have, server, tether_bin};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_agents_through_haproxy_and_directly() -> anyhow::Result<()> {
    through(Kind::Haproxy).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_agents_through_nginx_and_directly() -> anyhow::Result<()> {
    through(Kind::Nginx).await
}

async fn through(kind: Kind) -> anyhow::Result<()> {
    if !have(kind.binary()) {
        return Ok(());
    }
    let pki = Pki::generate()?;
    let server = server(&pki).await?;
    let agent_port = server.agent_addr.port();
    let proxy = ReverseProxy::start(kind, &pki, agent_port).await?;

    // Directly to the agent port, which chooses http/1.1 by ALPN.
    let direct = websocket_agent(&pki, &server, "ws-direct", agent_port, "/")?;
    direct.wait_ready().await?;
    echo_through(&pki, &server).await?;
    assert_connected_by_websocket(&server, "ws-direct").await?;
    drop(direct);

    // Through the proxy, on the path it routes.
    let proxied = websocket_agent(&pki, &server, "ws-proxied", proxy.port, ROUTED_PATH)?;
    proxied.wait_ready().await?;
    echo_through(&pki, &server).await?;
    assert_connected_by_websocket(&server, "ws-proxied").await?;
    drop(proxied);
    // Proxies log a tunnelled request once it ends.
    let logged = format!("GET {ROUTED_PATH} HTTP/1.1");
    let requests = eventually_logged(&proxy, &logged).await;
    assert!(
        requests
            .lines()
            .any(|l| l.contains(&logged) && l.contains(" 101 ")),
        "{kind:?} did not log the upgrade: {requests}"
    );

    // On a path the proxy does not route: its own 404 reaches the agent's log.
    let lost = websocket_agent(&pki, &server, "ws-lost", proxy.port, "/elsewhere")?;
    let log = lost.wait_for_log("answered HTTP 404").await?;
    assert!(
        log.lines()
            .any(|l| l.contains("answered HTTP 404") && l.contains("--websocket-path")),
        "{log}"
    );
    Ok(())
}

fn websocket_agent(
    pki: &Pki,
    server: &ServerProcess,
    id: &str,
    port: u16,
    path: &str,
) -> anyhow::Result<AgentProcess> {
    let args = [
        format!("--agent-id={id}"),
        "--transport=websocket".to_owned(),
        format!("--websocket-path={path}"),
        // After the common flags: this one wins.
        format!("--proxy-server-port={port}"),
    ];
    AgentProcess::spawn(tether_bin(), Some("agent"), pki, server, &args, &[])
}

/// The server lists the agent's stream as on the WebSocket link.
async fn assert_connected_by_websocket(server: &ServerProcess, id: &str) -> anyhow::Result<()> {
    let (status, body) = tether_testkit::http::get(server.admin_addr, "/debug/agents").await?;
    anyhow::ensure!(status == 200, "/debug/agents: {status} {body}");
    let report: AgentsReport = serde_json::from_str(&body)?;
    let links: Vec<&str> = report
        .streams
        .iter()
        .filter(|s| s.agent_id == id)
        .map(|s| s.transport.as_str())
        .collect();
    anyhow::ensure!(links == ["websocket"], "{id}'s streams' links: {links:?}");
    Ok(())
}

/// The proxy's request log once it holds `text`, or as it is after [`STEP`].
async fn eventually_logged(proxy: &ReverseProxy, text: &str) -> String {
    let started = tokio::time::Instant::now();
    loop {
        let requests = proxy.requests();
        if requests.contains(text) || started.elapsed() > STEP {
            return requests;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
