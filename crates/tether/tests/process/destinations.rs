//! The agent's own listeners through the real binaries (N8): bound to all interfaces, as the
//! agent's health port is by default, they are refused on every address of the host, not only
//! on loopback.

use std::net::{IpAddr, SocketAddr};

use tether_client::DialError;
use tether_testkit::Pki;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Frontend, spawn_agent, spawn_server};

use crate::{bin, tls_transport};

const POLICY_FAILURES: &str =
    "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"policy\"}";

/// The review's probe: the agent's `/metrics` read through the agent via the node's address.
/// The addresses dialed are this host's own, so a connection to them (before the fix) never
/// leaves the host; with the fix nothing connects at all.
#[tokio::test]
async fn the_agents_health_port_is_refused_on_every_address_of_the_host() {
    let host: Vec<IpAddr> = if_addrs::get_if_addrs()
        .unwrap()
        .iter()
        .map(if_addrs::Interface::ip)
        .filter(|ip| {
            !ip.is_loopback() && !matches!(ip, IpAddr::V6(v6) if v6.is_unicast_link_local())
        })
        .collect();
    assert!(
        !host.is_empty(),
        "this test needs an address other than loopback on some interface (a node IP)"
    );
    let pki = Pki::generate().unwrap();
    let server = spawn_server(bin(), &pki, Frontend::HttpConnectTls, &[])
        .await
        .unwrap();
    // `--health-server-host` empty: all interfaces, the agent's default.
    let agent = spawn_agent(bin(), &pki, server.agent_addr, &["--health-server-host="])
        .await
        .unwrap();
    server.process.wait_ready().await.unwrap();
    let transport = tls_transport(&pki, &server);
    let port = agent.health.port();

    let mut refused = 0.0;
    for ip in host.iter().copied().chain(["127.0.0.1".parse().unwrap()]) {
        let target = SocketAddr::new(ip, port).to_string();
        match tether_client::dial_http_connect(&transport, &target).await {
            Err(DialError::Rejected { status: 502, body }) => {
                assert!(
                    body.starts_with(&format!("policy: {target} denied by built-in rule: "))
                        && body.contains("every address of this host (the agent's own listener)"),
                    "{target}: {body}"
                );
                refused += 1.0;
            }
            Err(other) => panic!("{target}: not the policy's refusal: {other}"),
            Ok(_) => panic!("{target}: the agent's own health port was reached through it"),
        }
    }
    let metrics = agent.metrics().await.unwrap();
    assert_eq!(
        metric_value(&metrics, POLICY_FAILURES),
        Some(refused),
        "{metrics}"
    );
}
