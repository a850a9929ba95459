//! Upstream's Go agent through the same tinyproxy, against a tether server: grpc-go reads
//! `HTTPS_PROXY` (with Basic authentication from its user info) the way tether's agent does.

use tether_testkit::Pki;
use tether_testkit::process::upstream_bin;

use crate::proxies::{Tinyproxy, TinyproxyOptions};
use crate::{AgentProcess, SERVER_HOST, echo_through, have, server};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_agent_through_the_proxy_reaches_a_tether_server() -> anyhow::Result<()> {
    if !have("tinyproxy") {
        return Ok(());
    }
    let pki = Pki::generate()?;
    let server = server(&pki).await?;
    let port = server.agent_addr.port();
    let proxy = Tinyproxy::start(TinyproxyOptions {
        connect_port: port,
        basic_auth: Some(("alice", "pw-1.2_3")),
    })
    .await?;
    let url = format!("http://alice:pw%2D1%2E2_3@127.0.0.1:{}", proxy.port);
    let agent = AgentProcess::spawn(
        &upstream_bin("proxy-agent"),
        None,
        &pki,
        &server,
        &[],
        &[("HTTPS_PROXY", &url)],
    )?;
    agent.wait_ready().await?;
    echo_through(&pki, &server).await?;
    let connects = proxy.connects();
    assert!(
        !connects.is_empty()
            && connects
                .iter()
                .all(|c| c == &format!("{SERVER_HOST}:{port} HTTP/1.1")),
        "{connects:?}"
    );
    Ok(())
}
