//! What a running fleet says about its releases: `tether_build_info` on both ends, and the
//! server's count of tether and upstream agents (`--version` is in tests/cli.rs).

use tether_testkit::Pki;
use tether_testkit::process::{Frontend, spawn_agent, spawn_server};

use crate::{STEP, bin, metric, until};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The value of `tether_build_info` in a page of metrics, with its labels.
fn build_info(page: &str) -> Option<&str> {
    page.lines().find(|l| l.starts_with("tether_build_info{"))
}

#[tokio::test]
async fn build_info_on_both_ends_and_agents_counted_by_implementation() {
    let pki = Pki::generate().unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    let tether_agents = "tether_server_connected_agents{implementation=\"tether\"}";
    let upstream_agents = "tether_server_connected_agents{implementation=\"upstream\"}";
    until("the server serves its metrics", || async {
        metric(&server.process, tether_agents).await.is_some()
    })
    .await;
    assert_eq!(metric(&server.process, tether_agents).await, Some(0.0));
    assert_eq!(metric(&server.process, upstream_agents).await, Some(0.0));

    let mut agent = spawn_agent(bin(), &pki, server.agent_addr, &[])
        .await
        .unwrap();
    agent.wait_ready().await.unwrap();
    until("the tether agent counted", || async {
        metric(&server.process, tether_agents).await == Some(1.0)
    })
    .await;
    assert_eq!(metric(&server.process, upstream_agents).await, Some(0.0));

    for page in [
        server.process.metrics().await.unwrap(),
        agent.metrics().await.unwrap(),
    ] {
        let line = build_info(&page).unwrap_or_else(|| panic!("no tether_build_info:\n{page}"));
        assert!(line.starts_with("tether_build_info{commit=\""), "{line}");
        assert!(line.contains(",rustc=\"1."), "{line}");
        assert!(
            line.ends_with(&format!(",version=\"{VERSION}\"}} 1")),
            "{line}"
        );
        assert!(!line.contains("commit=\"\""), "{line}");
    }

    agent.signal("KILL").await.unwrap();
    agent.wait(STEP).await.unwrap();
    until("the agent gone from the count", || async {
        metric(&server.process, tether_agents).await == Some(0.0)
    })
    .await;
}
