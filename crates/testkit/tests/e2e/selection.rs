//! tether's agent selection with a real fleet: six agents in three zones on one server,
//! each zone's destinations on their own loopback block (127.0.1.0/24, 127.0.2.0/24, ...).

use std::time::Duration;

use tether_agent::{DestinationConfig, Labels};
use tether_server::{Mode, RoutingConfig, Strategy};
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};

use crate::support::{agent_dials, echo_exact, eventually, http_connect_uds};

/// Zones and their regions, as the agents declare them and the routing file maps them.
const ZONES: [(&str, &str); 3] = [("a", "r1"), ("b", "r1"), ("c", "r2")];

fn zoned_routing() -> RoutingConfig {
    RoutingConfig::from_yaml(
        "zones:\n  - {zone: a, region: r1, cidrs: [127.0.1.0/24]}\n  - {zone: b, region: r1, cidrs: [127.0.2.0/24]}\n  - {zone: c, region: r2, cidrs: [127.0.3.0/24]}\n",
    )
    .unwrap()
}

async fn server(pki: &Pki, strategies: Vec<Strategy>, routing: RoutingConfig) -> TestServer {
    TestServer::start(
        pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            strategies,
            routing,
            // The PKI's one agent certificate proves no identifier: routing by what the
            // agents declare is the conscious choice of `off`.
            agent_identity_binding: tether_server::IdentityBinding::Off,
            ..Default::default()
        },
    )
    .await
    .unwrap()
}

/// Two agents per zone, labelled; returns them in zone order (a1, a2, b1, ...).
async fn fleet(pki: &Pki, server: &TestServer) -> Vec<TestAgent> {
    let mut agents = Vec::new();
    for (zone, region) in ZONES {
        for n in 1..=2 {
            let agent = TestAgent::start(
                pki,
                server.agent_addr,
                AgentOptions {
                    agent_id: format!("{zone}{n}"),
                    labels: Labels::parse_strict(&format!("zone={zone},region={region}")).unwrap(),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
            agents.push(agent);
        }
    }
    wait_for_agents(server, agents.len()).await;
    agents
}

async fn wait_for_agents(server: &TestServer, n: usize) {
    eventually("the server sees every agent", || async {
        server_metric(
            server,
            "konnectivity_network_proxy_server_ready_backend_connections",
        )
        .await
            == n as f64
    })
    .await;
}

async fn server_metric(server: &TestServer, sample: &str) -> f64 {
    metric_value(&server.metrics().await.unwrap(), sample).unwrap_or(0.0)
}

async fn dial_once(server: &TestServer, target: &str) {
    let (stream, head) = http_connect_uds(server.uds.as_ref().unwrap(), target).await;
    assert!(head.starts_with("HTTP/1.1 200"), "{target}: {head}");
    echo_exact(stream, 7, 64).await;
}

async fn dials(agents: &[TestAgent]) -> Vec<f64> {
    let mut out = Vec::new();
    for agent in agents {
        out.push(agent_dials(agent).await);
    }
    out
}

fn delta(after: &[f64], before: &[f64]) -> Vec<f64> {
    after.iter().zip(before).map(|(a, b)| a - b).collect()
}

#[tokio::test]
async fn dials_stay_in_the_destination_zone_while_it_has_a_healthy_agent() {
    let pki = Pki::generate().unwrap();
    let server = server(
        &pki,
        vec![Strategy::Topology, Strategy::LeastLoaded],
        zoned_routing(),
    )
    .await;
    let mut agents = fleet(&pki, &server).await;
    let mut echoes = Vec::new();
    for zone in 1..=3 {
        echoes.push(
            EchoServer::start_at(format!("127.0.{zone}.1:0").parse().unwrap())
                .await
                .unwrap(),
        );
    }

    for (z, echo) in echoes.iter().enumerate() {
        let before = dials(&agents).await;
        for _ in 0..30 {
            dial_once(&server, &echo.addr.to_string()).await;
        }
        let got = delta(&dials(&agents).await, &before);
        let in_zone = got[2 * z] + got[2 * z + 1];
        assert_eq!(in_zone, 30.0, "zone {}: {got:?}", ZONES[z].0);
        assert!(
            got[2 * z] > 0.0 && got[2 * z + 1] > 0.0,
            "both zone agents share: {got:?}"
        );
    }
    let selections = "tether_server_agent_selections_total{proxy_strategy=\"topology\"}";
    assert_eq!(server_metric(&server, selections).await, 90.0);

    // One agent of zone a left: the other takes every zone-a dial.
    let a2 = agents.remove(1);
    a2.stop().await;
    wait_for_agents(&server, 5).await;
    let before = dials(&agents).await;
    for _ in 0..20 {
        dial_once(&server, &echoes[0].addr.to_string()).await;
    }
    assert_eq!(delta(&dials(&agents).await, &before)[0], 20.0);

    // Zone a is empty: its dials go to region r1 (zone b), still served.
    let a1 = agents.remove(0);
    a1.stop().await;
    wait_for_agents(&server, 4).await;
    let before = dials(&agents).await;
    for _ in 0..20 {
        dial_once(&server, &echoes[0].addr.to_string()).await;
    }
    let got = delta(&dials(&agents).await, &before);
    assert_eq!(got[0] + got[1], 20.0, "region fallback to zone b: {got:?}");
}

#[tokio::test]
async fn least_loaded_spreads_a_thousand_dials_evenly() {
    let pki = Pki::generate().unwrap();
    let server = server(&pki, vec![Strategy::LeastLoaded], RoutingConfig::default()).await;
    let agents = fleet(&pki, &server).await;
    let echo = EchoServer::start().await.unwrap();
    let target = echo.addr.to_string();
    let uds = server.uds.clone().unwrap();
    let before = dials(&agents).await;
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (uds, target) = (uds.clone(), target.clone());
        workers.spawn(async move {
            for _ in 0..125 {
                let (stream, head) = http_connect_uds(&uds, &target).await;
                assert!(head.starts_with("HTTP/1.1 200"), "{head}");
                echo_exact(stream, 1, 64).await;
            }
        });
    }
    while let Some(done) = workers.join_next().await {
        done.unwrap();
    }
    let got = delta(&dials(&agents).await, &before);
    assert_eq!(got.iter().sum::<f64>(), 1000.0, "{got:?}");
    let fair = 1000.0 / 6.0;
    for n in &got {
        assert!((n - fair).abs() <= fair * 0.15, "{got:?}");
    }
    let candidates = "tether_server_agent_selection_candidates_sum";
    assert_eq!(
        server_metric(&server, candidates).await,
        6000.0,
        "every dial saw 6 agents"
    );
}

#[tokio::test]
async fn an_agent_whose_dials_fail_is_ejected_and_later_recovers() {
    let pki = Pki::generate().unwrap();
    let routing = RoutingConfig::from_yaml(
        "ejection: {consecutive_failures: 3, base_seconds: 3, max_seconds: 30}\n",
    )
    .unwrap();
    let server = server(&pki, vec![Strategy::LeastLoaded], routing).await;
    let refused_by_one = EchoServer::start().await.unwrap();
    let fine = EchoServer::start().await.unwrap();
    let policy = pki.dir().join("broken.policy");
    std::fs::write(
        &policy,
        format!(
            "deny to 127.0.0.1 port {}\nallow all\n",
            refused_by_one.addr.port()
        ),
    )
    .unwrap();
    let mut agents = Vec::new();
    for n in 0..3 {
        let destinations = DestinationConfig {
            policy_file: (n == 0).then(|| policy.clone()),
            ..DestinationConfig::default()
        };
        agents.push(
            TestAgent::start(
                &pki,
                server.agent_addr,
                AgentOptions {
                    destinations,
                    ..Default::default()
                },
            )
            .await
            .unwrap(),
        );
    }
    wait_for_agents(&server, 3).await;
    let uds = server.uds.clone().unwrap();
    let policy_failures =
        "konnectivity_network_proxy_agent_endpoint_dial_failure_total{reason=\"policy\"}";
    let broken_failures = || async {
        metric_value(&agents[0].metrics().await.unwrap(), policy_failures).unwrap_or(0.0)
    };

    // Until it is ejected, the broken agent fails about a third of the dials.
    let mut refused = 0;
    for _ in 0..100 {
        let (stream, head) = http_connect_uds(&uds, &refused_by_one.addr.to_string()).await;
        if head.starts_with("HTTP/1.1 200") {
            echo_exact(stream, 2, 64).await;
        } else {
            refused += 1;
        }
        if server_metric(&server, "tether_server_agent_ejections_total").await == 1.0 {
            break;
        }
    }
    assert_eq!(refused, 3, "three consecutive failures eject");
    assert_eq!(broken_failures().await, 3.0);
    // Ejected: the next dials all go to the healthy agents.
    for _ in 0..20 {
        dial_once(&server, &refused_by_one.addr.to_string()).await;
    }
    assert_eq!(
        broken_failures().await,
        3.0,
        "no dial reached the ejected agent"
    );

    // After the ejection it is tried again; dials it can serve bring it back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let before = agent_dials(&agents[0]).await;
    eventually("the ejected agent serves dials again", || async {
        dial_once(&server, &fine.addr.to_string()).await;
        agent_dials(&agents[0]).await > before
    })
    .await;
    assert_eq!(
        server_metric(&server, "tether_server_agent_recoveries_total").await,
        1.0
    );
    agents.clear();
}

#[tokio::test]
async fn cidr_and_ipv6_identifiers_route() {
    let pki = Pki::generate().unwrap();
    let server = server(
        &pki,
        vec![Strategy::DestCidr, Strategy::Default],
        RoutingConfig::default(),
    )
    .await;
    let mut agents = Vec::new();
    for identifiers in ["cidr=127.0.2.0%2F24", "ipv6=0%3A0%3A%3A1", ""] {
        agents.push(
            TestAgent::start(
                &pki,
                server.agent_addr,
                AgentOptions {
                    identifiers: identifiers.into(),
                    ..Default::default()
                },
            )
            .await
            .unwrap(),
        );
    }
    wait_for_agents(&server, 3).await;
    let own: Vec<u16> = agents
        .iter()
        .flat_map(|a| [a.health_addr.port(), a.admin_addr.port()])
        .collect();
    let v4 = EchoServer::start_apart_from("127.0.2.1:0".parse().unwrap(), &own)
        .await
        .unwrap();
    let v6 = EchoServer::start_apart_from("[::1]:0".parse().unwrap(), &own)
        .await
        .unwrap();
    for _ in 0..10 {
        dial_once(&server, &v4.addr.to_string()).await;
        // `[::1]:port`: the identifier was spelled 0:0::1, which an exact match would miss.
        dial_once(&server, &v6.addr.to_string()).await;
    }
    assert_eq!(dials(&agents).await, [10.0, 10.0, 0.0]);
}
