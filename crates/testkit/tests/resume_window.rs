//! A cut that outlasts the resume window ends every connection with an error and leaves
//! nothing behind. Its own test binary, so that nothing else in the process opens or closes
//! descriptors while it compares them with the baseline (as `churn.rs`).

#[path = "resume/setup.rs"]
#[allow(dead_code)] // each binary uses part of the shared setup
mod setup;

use std::time::Duration;
use tokio::time::Instant;

use setup::*;
use tether_observe::metrics::open_fds;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_longer_than_the_window_ends_every_connection_and_leaks_nothing() {
    let window = Duration::from_secs(1);
    let s = Setup::start(window).await;
    let fds = open_fds().unwrap();
    let mut tunnels = Vec::new();
    for i in 0..20 {
        tunnels.push(s.echoed_tunnel(i).await);
    }
    // An outage: the stream is cut and the agent cannot reach the server for 3 windows.
    s.relay.set_refusing(true);
    s.relay.cut().await;
    let cut_at = Instant::now();
    for t in &mut tunnels {
        ends_with_error(t).await;
    }
    let ended_after = cut_at.elapsed();
    assert!(
        ended_after >= window,
        "the connections ended after {ended_after:?}, before the window"
    );
    drop(tunnels);
    eventually("both ends counted the expired window", || async {
        let expired = |side: &str| {
            format!("tether_{side}_resume_failures_total{{reason=\"window_expired\"}}")
        };
        s.agent_metric(&expired("agent")).await == 1.0
            && s.server_metric(&expired("server")).await == 1.0
    })
    .await;
    tokio::time::sleep(window * 2).await;
    s.relay.set_refusing(false);
    eventually("the agent is back, and every count is zero", || async {
        s.server_metric("konnectivity_network_proxy_server_ready_backend_connections")
            .await
            == 1.0
            && s.server_metric("konnectivity_network_proxy_server_established_connections")
                .await
                == 0.0
            && s.server_metric("tether_server_suspended_connections").await == 0.0
            && s.agent_metric("tether_agent_suspended_connections").await == 0.0
            && s.agent_metric("konnectivity_network_proxy_agent_open_endpoint_connections")
                .await
                == 0.0
            && s.server_metric(&format!(
                "tether_server_agent_pending_dials{{agent_id=\"{AGENT_ID}\"}}"
            ))
            .await
                == 0.0
            && s.server_metric("tether_server_suspended_replay_bytes")
                .await
                == 0.0
    })
    .await;
    let settled = Instant::now() + STEP;
    while open_fds().unwrap() > fds {
        if Instant::now() > settled {
            let list: Vec<String> = std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .map(|p| p.display().to_string())
                .collect();
            panic!(
                "descriptors {} > baseline {fds}: {list:?}",
                open_fds().unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The new stream carries connections again.
    s.echoed_tunnel(99).await;
}
