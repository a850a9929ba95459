//! The TokenReview storm upstream suffers at scale (k/k #102784): 1,000 agents connecting at
//! once with one token.

use std::time::Duration;

use tether_testkit::{Pki, ServerOptions, TestServer};

use crate::{Cluster, STEP, connect_agent, default_limits};

const AGENTS: usize = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_agents_with_one_token_cost_a_handful_of_reviews() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let pki = Pki::generate()?;
    let (auth, token_metrics) = cluster.token_auth(default_limits()).await?;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            agent_token_auth: Some(auth),
            limits: tether_server::Limits {
                // All agents come from 127.0.0.1.
                max_agent_connections_per_address: 0,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await?;
    let token = cluster.agent_token(Some("node-1")).await?;
    // The authenticator's start-up probe has reached the API server.
    crate::eventually("the start-up probe", || async {
        tether_testkit::http::metric_value(
            &token_metrics.render(),
            "tether_server_token_reviews_total{outcome=\"refused\"}",
        ) == Some(1.0)
    })
    .await?;
    let before = cluster.token_reviews().await?;

    let started = tokio::time::Instant::now();
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(AGENTS));
    let mut agents = tokio::task::JoinSet::new();
    for i in 0..AGENTS {
        let (addr, ca, token, barrier) = (
            server.agent_addr,
            pki.files.ca_cert.clone(),
            token.clone(),
            barrier.clone(),
        );
        agents.spawn(async move {
            barrier.wait().await;
            connect_agent(addr, &ca, &format!("storm-{i}"), "", Some(&token)).await
        });
    }
    let mut streams = Vec::with_capacity(AGENTS);
    let all = async {
        while let Some(joined) = agents.join_next().await {
            streams.push(joined?.map_err(|s| anyhow::anyhow!("an agent was refused: {s}"))?);
        }
        anyhow::Ok(())
    };
    tokio::time::timeout(STEP * 3, all).await??;
    let elapsed = started.elapsed();
    assert_eq!(streams.len(), AGENTS);
    assert!(streams.iter().all(|s| s.server_id == "server-1"));

    let reviews = cluster.token_reviews().await? - before;
    let render = token_metrics.render();
    let sample = |name: &str| tether_testkit::http::metric_value(&render, name).unwrap_or(0.0);
    let (cache, shared) = (
        sample("tether_server_token_answers_total{source=\"cache\"}"),
        sample("tether_server_token_answers_total{source=\"shared\"}"),
    );
    eprintln!(
        "storm: {AGENTS} agents with one token connected in {elapsed:?}; kube-apiserver \
         counted {reviews} TokenReviews; answered from the cache {cache}, by a shared \
         review {shared}"
    );
    assert!(reviews <= 3.0, "{reviews} TokenReviews for one token");
    assert_eq!(cache + shared + reviews, AGENTS as f64);
    drop(streams);
    tokio::time::timeout(Duration::from_secs(30), server.stop()).await?;

    // Distinct tokens cannot share a review; --kubeconfig-qps spaces their reviews out
    // instead of sending them all at once.
    let (auth, _metrics) = cluster.token_auth_limited(default_limits(), 1.0, 1).await?;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            agent_token_auth: Some(auth),
            ..Default::default()
        },
    )
    .await?;
    let mut tokens = Vec::new();
    for _ in 0..4 {
        tokens.push(cluster.agent_token(None).await?);
    }
    let started = tokio::time::Instant::now();
    let mut agents = tokio::task::JoinSet::new();
    for (i, token) in tokens.into_iter().enumerate() {
        let (addr, ca) = (server.agent_addr, pki.files.ca_cert.clone());
        agents.spawn(async move {
            connect_agent(addr, &ca, &format!("limited-{i}"), "", Some(&token)).await
        });
    }
    let mut streams = Vec::new();
    while let Some(joined) = agents.join_next().await {
        streams.push(joined?.map_err(|s| anyhow::anyhow!("a rate-limited agent: {s}"))?);
    }
    // Four reviews at 1 QPS with a burst of 1: the last starts at least 3 s after the first.
    assert!(
        started.elapsed() >= Duration::from_millis(2_900),
        "{:?}",
        started.elapsed()
    );
    drop(streams);
    tokio::time::timeout(Duration::from_secs(30), server.stop()).await?;
    Ok(())
}
