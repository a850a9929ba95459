//! The agent's own listeners through the real binaries (N8): bound to all interfaces, as the
//! agent's health port is by default, they are refused on every address of the host, not only
//! on loopback.

use std::net::{IpAddr, SocketAddr};
use std::process::Command;

use tether_client::DialError;
use tether_testkit::Pki;
use tether_testkit::http::metric_value;
use tether_testkit::process::{Frontend, spawn_agent, spawn_server};

use crate::{bin, tls_transport};

const POLICY_FAILURES: &str =
    "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"policy\"}";

/// The address this test gives its private host, from the benchmarking range (RFC 2544).
const NODE_ADDRESS: &str = "198.18.0.2";

/// Moves the calling thread, and every process it starts from now on, into a network
/// namespace of its own: `lo` up, holding 127.0.0.1 and [`NODE_ADDRESS`], which stands in for
/// the node's IP. The test runs on a current-thread runtime, so its sockets are in the
/// namespace too: nothing it dials can reach the host's network. The namespace goes away with
/// the thread and the processes.
fn private_host() -> IpAddr {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .expect("unshare(CLONE_NEWNET) needs root (CAP_SYS_ADMIN), as CI has");
    for args in [
        &["link", "set", "lo", "up"][..],
        &["addr", "add", &format!("{NODE_ADDRESS}/32"), "dev", "lo"][..],
    ] {
        let status = Command::new("ip")
            .args(args)
            .status()
            .expect("ip (iproute2) runs");
        assert!(status.success(), "ip {args:?}: {status}");
    }
    NODE_ADDRESS.parse().unwrap()
}

#[tokio::test]
async fn the_agents_health_port_is_refused_on_every_address_of_the_host() {
    let node = private_host();
    let host: Vec<IpAddr> = if_addrs::get_if_addrs()
        .unwrap()
        .iter()
        .map(if_addrs::Interface::ip)
        .filter(|ip| !ip.is_loopback())
        .collect();
    assert_eq!(
        host,
        [node],
        "the private host's only address besides loopback"
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
