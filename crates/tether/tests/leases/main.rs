//! Lease-based server counting against a real kube-apiserver: servers publish Leases, agents
//! count them and follow the fleet as it grows and shrinks, with tether and upstream
//! binaries mixed.

mod fleet;

use std::time::Duration;

use fleet::{FAST_LEASES, Fleet, KNOWN, Kind, OPEN, converge, until};
use tether_testkit::targets::EchoServer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex;

/// One control plane at a time: each test starts its own, and two at once would starve a
/// small machine.
static SERIAL: Mutex<()> = Mutex::const_new(());

/// A fleet of tether servers srv-1, srv-2 and srv-3, each with its Lease.
async fn three_tether_servers() -> anyhow::Result<Fleet> {
    let mut fleet = Fleet::start().await?;
    for id in ["srv-1", "srv-2", "srv-3"] {
        fleet.add_server(Kind::Tether, id, FAST_LEASES).await?;
    }
    until("three Leases", || async {
        fleet.lease_holders().await.len() == 3
    })
    .await;
    Ok(fleet)
}

async fn ready(agent: &fleet::Member) -> u16 {
    tether_testkit::http::get(agent.health(), "/readyz")
        .await
        .map_or(0, |(status, _)| status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tether_agents_follow_a_tether_fleet_from_three_to_four_to_two() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = three_tether_servers().await?;

    // What a Lease looks like to upstream's agents and garbage collector.
    let leases = fleet.leases().await?;
    let lease = leases
        .iter()
        .find(|l| l["spec"]["holderIdentity"] == "srv-1")
        .expect("srv-1's Lease");
    assert_eq!(lease["metadata"]["name"], "konnectivity-proxy-server-srv-1");
    assert_eq!(
        lease["metadata"]["labels"]["k8s-app"],
        "konnectivity-server"
    );
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 4);
    assert!(lease["spec"]["renewTime"].is_string(), "{lease}");

    let a = fleet.agent(Kind::Tether, &[]).await?;
    let b = fleet.agent(Kind::Tether, &[]).await?;
    converge(&[&a, &b], 3, "start").await;
    assert_eq!(ready(&a).await, 200);

    fleet.add_server(Kind::Tether, "srv-4", FAST_LEASES).await?;
    converge(&[&a, &b], 4, "a fourth server joined").await;

    // A graceful stop deletes the Lease at once.
    let mut stopped = fleet.remove_server("srv-4");
    stopped.signal("TERM").await?;
    assert_eq!(stopped.wait().await?, Some(0));
    assert!(
        !fleet.lease_holders().await.contains(&"srv-4".to_owned()),
        "srv-4 deleted its Lease on the way out"
    );
    converge(&[&a, &b], 3, "srv-4 stopped (Lease deleted)").await;

    // A killed server's Lease expires (4s) and the survivors' garbage collector deletes it.
    let killed = fleet.remove_server("srv-3");
    killed.signal("KILL").await?;
    converge(&[&a, &b], 2, "srv-3 killed (Lease expired)").await;
    assert_eq!(ready(&a).await, 200);
    let culled = until("srv-3's expired Lease is deleted", || async {
        fleet.lease_holders().await == ["srv-1", "srv-2"]
    })
    .await;
    eprintln!("srv-3's Lease culled {culled:.1?} after the agents converged");
    let mut culled_total = 0.0;
    for (_, server) in &fleet.servers {
        culled_total += server
            .metric("konnectivity_network_proxy_server_culled_leases_count")
            .await
            .unwrap_or(0.0);
    }
    assert!(culled_total >= 1.0, "a survivor counts the culled Lease");
    drop(killed);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_that_discover_servers_by_lease_need_no_balancer_luck() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = three_tether_servers().await?;
    let leases = fleet.leases().await?;
    let srv1 = fleet.server("srv-1").agent_addr.unwrap().to_string();
    assert!(
        leases
            .iter()
            .any(|l| l["metadata"]["annotations"]["tether.dev/agent-address"] == srv1.as_str()),
        "srv-1 publishes {srv1}: {leases:?}"
    );
    // The worst luck: the balancer sends every connection to srv-1.
    fleet.balance(&["srv-1"]);
    let balancer = fleet.agent(Kind::Tether, &[]).await?;
    // TLS verifies the name the servers' certificate holds, not their addresses.
    let discovering = fleet
        .agent(
            Kind::Tether,
            &["--server-discovery=leases", "--proxy-server-host=localhost"],
        )
        .await?;
    let took = converge(
        &[&discovering],
        3,
        "discovery by Lease, balancer stuck on srv-1",
    )
    .await;
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(ready(&discovering).await, 200);
    assert_eq!(
        balancer.metric(OPEN).await,
        Some(1.0),
        "the balancer's agent is stuck at one"
    );

    // A server joins: its Lease is listed within the poll interval (500 ms here).
    fleet.add_server(Kind::Tether, "srv-4", FAST_LEASES).await?;
    converge(&[&discovering], 4, "srv-4 joined, outside the balancer").await;
    // A killed server's Lease expires (4 s): the agent lets go of its address.
    let killed = fleet.remove_server("srv-2");
    killed.signal("KILL").await?;
    converge(&[&discovering], 3, "srv-2 killed (Lease expired)").await;
    // Its stream, suspended when the kill cut it, ends with the Lease rather than waiting
    // out the resume window.
    until("the suspended stream to srv-2 ends", || async {
        discovering
            .metric("tether_agent_resume_failures_total{reason=\"unknown_session\"}")
            .await
            == Some(1.0)
    })
    .await;
    drop(killed);
    Ok(())
}

/// One echo through server `id`'s frontend; the dial's error if it fails.
async fn echo_through(fleet: &Fleet, id: &str, echo: &EchoServer) -> Result<(), String> {
    let transport = tether_client::Transport::Unix(fleet.socket(id));
    let client = tether_client::GrpcClient::connect(&transport)
        .await
        .map_err(|e| e.to_string())?;
    let mut tunnel = client
        .dial(&echo.addr.to_string())
        .await
        .map_err(|e| e.to_string())?;
    tunnel.write_all(b"ping").await.map_err(|e| e.to_string())?;
    let mut back = [0u8; 4];
    tunnel
        .read_exact(&mut back)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_that_peer_by_lease_reach_an_agent_only_one_of_them_holds() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start().await?;
    for id in ["srv-1", "srv-2", "srv-3"] {
        let mut flags: Vec<String> = FAST_LEASES.iter().map(|s| (*s).to_owned()).collect();
        flags.extend(fleet.peer_flags());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        fleet.add_server(Kind::Tether, id, &flags).await?;
    }
    let leases = fleet.leases().await?;
    assert_eq!(
        leases
            .iter()
            .filter(|l| l["metadata"]["annotations"]["tether.dev/peer-address"].is_string())
            .count(),
        3,
        "each server publishes its peer address: {leases:?}"
    );
    // One stream, through the balancer, to whichever server it picks.
    let agent = fleet
        .agent(Kind::Tether, &["--agent-server-connections=1"])
        .await?;
    let echo = EchoServer::start().await?;
    for id in ["srv-1", "srv-2", "srv-3"] {
        until(&format!("{id} reaches the agent"), || async {
            echo_through(&fleet, id, &echo).await.is_ok()
        })
        .await;
    }
    assert_eq!(agent.metric(OPEN).await, Some(1.0), "K=1: one stream");
    // A server that joins finds its peers in the Leases, and they find it.
    let mut flags: Vec<String> = FAST_LEASES.iter().map(|s| (*s).to_owned()).collect();
    flags.extend(fleet.peer_flags());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    fleet.add_server(Kind::Tether, "srv-4", &flags).await?;
    let took = until("srv-4 reaches the agent", || async {
        echo_through(&fleet, "srv-4", &echo).await.is_ok()
    })
    .await;
    eprintln!("a joining server reached the agent through its peers {took:.1?} after it started");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peered_fleet_with_an_upstream_server_and_agent_keeps_working() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start().await?;
    let routing = [
        "--proxy-strategies=destHost,default",
        "--agent-identity-binding=off",
    ];
    for id in ["srv-1", "srv-2"] {
        let mut flags: Vec<String> = FAST_LEASES.iter().map(|s| (*s).to_owned()).collect();
        flags.extend(routing.iter().map(|s| (*s).to_owned()));
        flags.extend(fleet.peer_flags());
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        fleet.add_server(Kind::Tether, id, &flags).await?;
    }
    fleet.add_server(Kind::Upstream, "upstream-1", &[]).await?;
    until("three Leases", || async {
        fleet.lease_holders().await.len() == 3
    })
    .await;
    // Upstream's agent holds every server, through the balancer, as always; tether's holds
    // one of the two tether servers, found in their Leases, and advertises an address of
    // its own (destHost).
    let echo = EchoServer::start_at(([127, 0, 1, 9], 0).into()).await?;
    let upstream_agent = fleet.agent(Kind::Upstream, &[]).await?;
    let tether_agent = fleet
        .agent(
            Kind::Tether,
            &[
                "--server-discovery=leases",
                "--proxy-server-host=localhost",
                "--agent-server-connections=1",
                "--agent-identifiers=ipv4=127.0.1.9",
            ],
        )
        .await?;
    converge(&[&upstream_agent], 3, "the upstream agent holds all three").await;
    until("the tether agent holds one server", || async {
        tether_agent.metric(OPEN).await == Some(1.0)
    })
    .await;
    // Both tether servers reach the tether agent by its address, one of them through its
    // peer; the upstream server carries dials as before (to the upstream agent it holds).
    for id in ["srv-1", "srv-2", "upstream-1"] {
        until(&format!("{id} carries a dial"), || async {
            echo_through(&fleet, id, &echo).await.is_ok()
        })
        .await;
    }
    assert_eq!(ready(&tether_agent).await, 200);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_fleet_agrees_on_the_count() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start().await?;
    fleet.add_server(Kind::Tether, "srv-1", FAST_LEASES).await?;
    fleet.add_server(Kind::Tether, "srv-2", FAST_LEASES).await?;
    // Upstream's Lease timings are constants (30s duration, 15s renewal).
    fleet.add_server(Kind::Upstream, "upstream-1", &[]).await?;
    until("three Leases", || async {
        fleet.lease_holders().await.len() == 3
    })
    .await;

    let ours = fleet.agent(Kind::Tether, &[]).await?;
    let theirs = fleet.agent(Kind::Upstream, &[]).await?;
    converge(&[&ours, &theirs], 3, "mixed start").await;

    fleet.add_server(Kind::Tether, "srv-3", FAST_LEASES).await?;
    // Upstream's agent stops syncing once it reached its count, and looks again every
    // sync interval (capped at 1s here).
    converge(&[&ours, &theirs], 4, "a tether server joined a mixed fleet").await;

    // The upstream server's graceful stop deletes its Lease, as tether's does.
    let mut stopped = fleet.remove_server("upstream-1");
    stopped.signal("TERM").await?;
    stopped.wait().await?;
    until("upstream-1's Lease is gone", || async {
        !fleet
            .lease_holders()
            .await
            .contains(&"upstream-1".to_owned())
    })
    .await;
    converge(&[&ours, &theirs], 3, "the upstream server stopped").await;

    let killed = fleet.remove_server("srv-3");
    killed.signal("KILL").await?;
    converge(
        &[&ours, &theirs],
        2,
        "a tether server killed (Lease expired)",
    )
    .await;
    assert_eq!(ready(&ours).await, 200);
    drop(killed);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_lets_go_of_a_server_without_a_lease() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start().await?;
    fleet.add_server(Kind::Tether, "srv-1", FAST_LEASES).await?;
    // A live server that publishes no Lease, e.g. one whose renewals fail.
    fleet
        .add_server(
            Kind::Tether,
            "unleased",
            &["--enable-lease-controller=false"],
        )
        .await?;
    until("srv-1's Lease", || async {
        fleet.lease_holders().await == ["srv-1"]
    })
    .await;

    // Only the unleased server is reachable: one stream, but not to the counted server,
    // which readiness that asks for every counted server shows.
    fleet.balance(&["unleased"]);
    let agent = fleet
        .agent(Kind::Tether, &["--readiness-requires-all-servers"])
        .await?;
    until(
        "the agent holds a stream to the unleased server",
        || async { agent.metric(OPEN).await == Some(1.0) },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (status, body) = tether_testkit::http::get(agent.health(), "/readyz?verbose").await?;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("not connected to every counted server"),
        "{body}"
    );

    // The counted server becomes reachable: the agent connects to it, and lets go of the
    // other once that went without a Lease for the grace (15s).
    fleet.balance(&["srv-1", "unleased"]);
    let took = until("the agent holds only srv-1's stream", || async {
        agent.metric(OPEN).await == Some(1.0)
            && fleet.server("unleased").metric(CONNECTED).await == Some(0.0)
            && fleet.server("srv-1").metric(CONNECTED).await == Some(1.0)
    })
    .await;
    eprintln!("let go of the unleased server {took:.1?} after srv-1 became reachable");
    assert_eq!(ready(&agent).await, 200);
    Ok(())
}

const CONNECTED: &str = "konnectivity_network_proxy_server_ready_backend_connections";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_outage_costs_no_stream() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start().await?;
    for id in ["srv-1", "srv-2"] {
        fleet.add_server(Kind::Tether, id, FAST_LEASES).await?;
    }
    let agent = fleet.agent(Kind::Tether, &[]).await?;
    converge(&[&agent], 2, "start").await;

    // Lists fail: the agent keeps its last count, though every Lease is past its 4s now.
    fleet.plane.stop_apiserver().await?;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(agent.metric(OPEN).await, Some(2.0));
    assert_eq!(agent.metric(KNOWN).await, Some(2.0));
    assert_eq!(ready(&agent).await, 200);

    // Back: the first lists may see expired (or garbage-collected) Leases until both
    // servers renewed; no stream is let go meanwhile.
    fleet.plane.start_apiserver().await?;
    until("both Leases renewed", || async {
        fleet.lease_holders().await == ["srv-1", "srv-2"]
    })
    .await;
    let watched = tokio::time::Instant::now();
    while watched.elapsed() < Duration::from_secs(5) {
        assert_eq!(agent.metric(OPEN).await, Some(2.0), "a stream was let go");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    converge(&[&agent], 2, "after the API server came back").await;
    Ok(())
}

/// Lease calls obey the server's client-side rate limit (`--kubeconfig-qps`), which its
/// TokenReviews share. Renewing every 100 ms and garbage-collecting as often would make
/// about 20 requests a second; limited to 1 a second (burst 1), the server makes about one,
/// as counted by the API server itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_calls_obey_the_kubeconfig_rate_limit() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let mut fleet = Fleet::start().await?;
    fleet
        .add_server(
            Kind::Tether,
            "limited",
            &[
                "--lease-duration=10s",
                "--lease-renew-interval=100ms",
                "--kubeconfig-qps=1",
                "--kubeconfig-burst=1",
            ],
        )
        .await?;
    until("the limited server's Lease", || async {
        fleet.lease_holders().await == ["limited"]
    })
    .await;
    // Nothing else asks about Leases meanwhile but kube-apiserver itself (its identity Lease,
    // renewed every 10 s).
    let before = lease_requests(&fleet.plane).await?;
    let window = Duration::from_secs(6);
    tokio::time::sleep(window).await;
    let made = lease_requests(&fleet.plane).await? - before;
    eprintln!("{made} Lease requests in {window:?} at --kubeconfig-qps=1");
    assert!(
        made <= 12.0,
        "{made} Lease requests in {window:?}: the rate limit was not applied"
    );
    assert!(
        made >= 3.0,
        "{made} Lease requests: the server stopped renewing"
    );
    assert_eq!(
        fleet.lease_holders().await,
        ["limited"],
        "the Lease stayed valid"
    );
    Ok(())
}

/// Requests for Leases the API server has handled, from its own metrics.
async fn lease_requests(
    plane: &tether_testkit::control_plane::ControlPlane,
) -> anyhow::Result<f64> {
    let metrics = plane.metrics().await?;
    Ok(metrics
        .lines()
        .filter(|l| l.starts_with("apiserver_request_total{") && l.contains("resource=\"leases\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}
