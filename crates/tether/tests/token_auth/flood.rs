//! N5: floods of bad tokens. What can be told without the API server is refused without a
//! TokenReview; each source address has its own review limit, so junk from one address does
//! not lock out agents from another; and a cached admission past its TTL is used only when
//! the API server fails, never because reviews were throttled by a flood.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use base64::Engine as _;
use tether_grpc::Code;
use tether_kube::KubeApi;
use tether_kube::token_review::{
    AddressLimit, AgentServiceAccount, CacheLimits, TokenReviewAuthenticator,
};
use tether_observe::metrics::Registry;
use tether_server::AgentTokenAuth;
use tether_testkit::http::metric_value;
use tether_testkit::{Pki, ServerOptions, TestServer};

use crate::{
    AGENT_SA, AUDIENCE, Cluster, NAMESPACE, STEP, connect_agent, connect_agent_from,
    default_limits, eventually,
};

const FLOODER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 1);
const OTHER_HOST: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// A JWT of the agents' shape, audience and lifetime that no key signed: it passes every
/// local check, and only a TokenReview can refuse it.
fn forged_token(i: usize) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = tether_observe::time::wall_clock()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims = format!(
        r#"{{"aud":["{AUDIENCE}"],"exp":{},"iat":{now},"iss":"https://kubernetes.default.svc.cluster.local","sub":"system:serviceaccount:{NAMESPACE}:{AGENT_SA}","jti":"forged-{i}"}}"#,
        now + 3600
    );
    format!(
        "{}.{}.{}",
        b64.encode(r#"{"alg":"RS256","kid":"forged"}"#),
        b64.encode(claims),
        b64.encode(format!("not a signature {i}"))
    )
}

fn unsigned(claims: &str) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64.encode(r#"{"alg":"RS256"}"#),
        b64.encode(claims)
    )
}

fn metric(registry: &Registry, name: &str) -> f64 {
    metric_value(&registry.render(), name).unwrap_or(0.0)
}

async fn started(cluster: &Cluster, registry: &Registry) -> anyhow::Result<()> {
    eventually("the start-up probe", || async {
        metric(
            registry,
            "tether_server_token_reviews_total{outcome=\"refused\"}",
        ) >= 1.0
    })
    .await?;
    // The probe's review is counted by the API server before the test counts its own.
    let _ = cluster.token_reviews().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn junk_is_refused_without_reviews_and_a_flood_does_not_lock_out_another_address()
-> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let pki = Pki::generate()?;
    let (auth, registry) = cluster.token_auth(default_limits()).await?;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            agent_token_auth: Some(auth),
            limits: tether_server::Limits {
                max_agent_connections_per_address: 0,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await?;
    let (addr, ca) = (server.agent_addr, pki.files.ca_cert.clone());
    started(&cluster, &registry).await?;

    // Not a JWT, the wrong audience, expired: refused at once, and the API never asked.
    let reviews = cluster.token_reviews().await?;
    let now = tether_observe::time::wall_clock()
        .duration_since(UNIX_EPOCH)?
        .as_secs();
    let junk = [
        ("garbage".to_owned(), "not a JWT"),
        ("a.b.c".to_owned(), "not a JWT"),
        (
            unsigned(r#"{"aud":["https://kubernetes.default.svc"],"exp":9999999999}"#),
            "audience",
        ),
        (
            unsigned(&format!(r#"{{"aud":"{AUDIENCE}","exp":{}}}"#, now - 600)),
            "expired",
        ),
    ];
    for round in 0..25 {
        for (token, reason) in &junk {
            let refused = connect_agent(addr, &ca, &format!("junk-{round}"), "", Some(token))
                .await
                .err()
                .unwrap_or_else(|| panic!("{token} admitted"));
            assert_eq!(refused.code, Code::UNAUTHENTICATED, "{refused}");
            assert!(refused.message.contains(reason), "{refused}");
        }
    }
    assert_eq!(
        cluster.token_reviews().await?,
        reviews,
        "locally refused tokens cost no TokenReview"
    );
    assert_eq!(
        metric(
            &registry,
            "tether_server_token_answers_total{source=\"local\"}"
        ),
        100.0
    );

    // 160 forged tokens at once from one address, which only a review can refuse (the
    // review's probe: the API reviewed 60, and a real agent was then refused or waited 10 s).
    let mut flood = tokio::task::JoinSet::new();
    for i in 0..160 {
        let ca = ca.clone();
        flood.spawn(async move {
            connect_agent_from(
                Some(FLOODER),
                addr,
                &ca,
                "flood",
                "",
                Some(&forged_token(i)),
            )
            .await
            .err()
            .map(|status| status.code)
        });
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Meanwhile, a real agent on another host connects at once.
    let token = cluster.agent_token(Some("node-1")).await?;
    let asked = tokio::time::Instant::now();
    let real = tokio::time::timeout(
        STEP,
        connect_agent_from(Some(OTHER_HOST), addr, &ca, "node-1", "", Some(&token)),
    )
    .await?
    .map_err(|s| anyhow::anyhow!("the real agent was refused during the flood: {s}"))?;
    let waited = asked.elapsed();
    let mut codes = Vec::new();
    tokio::time::timeout(STEP, async {
        while let Some(joined) = flood.join_next().await {
            codes.push(joined.expect("flood task"));
        }
    })
    .await?;
    assert!(
        codes.iter().all(|code| code.is_some()),
        "a forged token was admitted: {codes:?}"
    );
    let throttled = metric(
        &registry,
        "tether_server_token_reviews_total{outcome=\"address_throttled\"}",
    );
    eprintln!(
        "flood of 160 forged tokens: the real agent from {OTHER_HOST} was admitted after \
         {waited:?}; {throttled} reviews refused by the flooding address's own limit"
    );
    assert!(
        waited < Duration::from_secs(5),
        "the real agent waited {waited:?} behind the flood"
    );
    assert!(throttled >= 100.0, "{throttled}");
    drop(real);
    tokio::time::timeout(Duration::from_secs(30), server.stop()).await?;
    Ok(())
}

/// Agents behind one NAT address that connect together, as after a server restart: a token
/// that admits an agent costs its address nothing, so the address's own limit (2 a second,
/// 5 at once by default) refuses none of them; only the shared limit paces them. Before,
/// 30 agents from one address took 12.5 s of that limit and the last ones were refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_behind_one_address_is_not_held_back_by_the_address_limit() -> anyhow::Result<()> {
    const FLEET: usize = 30;
    let cluster = Cluster::start().await?;
    let pki = Pki::generate()?;
    let (auth, registry) = cluster.token_auth(default_limits()).await?;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            agent_token_auth: Some(auth),
            limits: tether_server::Limits {
                max_agent_connections_per_address: 0,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await?;
    let (addr, ca) = (server.agent_addr, pki.files.ca_cert.clone());
    started(&cluster, &registry).await?;
    let mut tokens = Vec::with_capacity(FLEET);
    for _ in 0..FLEET {
        tokens.push(cluster.agent_token(None).await?);
    }
    let started_at = tokio::time::Instant::now();
    let mut fleet = tokio::task::JoinSet::new();
    for (i, token) in tokens.into_iter().enumerate() {
        let ca = ca.clone();
        fleet.spawn(async move {
            let id = format!("nat-{i}");
            connect_agent_from(Some(FLOODER), addr, &ca, &id, "", Some(&token)).await
        });
    }
    let mut held = Vec::with_capacity(FLEET);
    tokio::time::timeout(STEP, async {
        while let Some(joined) = fleet.join_next().await {
            held.push(joined.expect("agent task"));
        }
    })
    .await?;
    let refused: Vec<String> = held
        .iter()
        .filter_map(|r| r.as_ref().err().map(ToString::to_string))
        .collect();
    eprintln!(
        "{FLEET} agents from one address admitted in {:?}",
        started_at.elapsed()
    );
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert_eq!(
        metric(
            &registry,
            "tether_server_token_reviews_total{outcome=\"address_throttled\"}"
        ),
        0.0
    );
    assert_eq!(
        metric(
            &registry,
            "tether_server_token_reviews_total{outcome=\"admitted\"}"
        ),
        FLEET as f64
    );
    drop(held);
    tokio::time::timeout(Duration::from_secs(30), server.stop()).await?;
    Ok(())
}

/// The review's second probe: with a 2 s cache TTL, a token revoked at the API server was
/// admitted from the stale cache while junk tokens kept the rate limit busy. Here the flood
/// comes from many addresses at once (the per-address limit is off), so that reviews really
/// are throttled: the revoked token is then refused, never admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_not_admitted_from_the_stale_cache_under_a_flood() -> anyhow::Result<()>
{
    let cluster = Cluster::start().await?;
    let pki = Pki::generate()?;
    let api = KubeApi::connect(&tether_kube::KubeApiOptions {
        kubeconfig: Some(cluster.server_kubeconfig.clone()),
        qps: 1.0,
        burst: 1,
    })
    .await?;
    let registry = Registry::new();
    let authenticator = TokenReviewAuthenticator::new(
        api,
        AgentServiceAccount {
            namespace: NAMESPACE.into(),
            name: AGENT_SA.into(),
            audience: AUDIENCE.into(),
        },
        CacheLimits {
            ttl: Duration::from_secs(2),
            ..default_limits()
        },
        &registry,
    )
    .with_address_limit(AddressLimit {
        qps: -1.0,
        burst: 0,
    });
    let server = TestServer::start(
        &pki,
        ServerOptions {
            agent_token_auth: Some(AgentTokenAuth {
                authenticator: Arc::new(authenticator),
                nodes: None,
            }),
            limits: tether_server::Limits {
                max_agent_connections_per_address: 0,
                ..Default::default()
            },
            ..Default::default()
        },
    )
    .await?;
    let (addr, ca) = (server.agent_addr, pki.files.ca_cert.clone());
    started(&cluster, &registry).await?;

    // A token bound to a pod is admitted and cached; then the pod goes, which revokes it.
    cluster
        .plane
        .apply(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: doomed, namespace: kube-system}\n\
             spec:\n  nodeName: node-1\n  serviceAccountName: konnectivity-agent\n  \
             containers: [{name: agent, image: registry.invalid/agent}]\n",
        )
        .await?;
    let token = cluster
        .plane
        .create_token(NAMESPACE, AGENT_SA, AUDIENCE, Some("doomed"))
        .await?;
    drop(
        connect_agent(addr, &ca, "doomed", "", Some(&token))
            .await
            .map_err(|s| anyhow::anyhow!("the token before revocation: {s}"))?,
    );
    cluster
        .plane
        .kubectl(
            &[
                "delete",
                "pod",
                "-n",
                NAMESPACE,
                "doomed",
                "--grace-period=0",
                "--force",
            ],
            None,
        )
        .await?;
    // Past the TTL the entry is stale: only a review (or an API outage) can decide.
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    // Forged tokens from 40 clients at once keep the shared limit (1 per second) booked
    // beyond the 10 s a review may wait, while the revoked token asks again and again: each
    // time it is refused, never admitted unreviewed.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut flood = tokio::task::JoinSet::new();
    for worker in 0..40 {
        let (ca, stop) = (ca.clone(), stop.clone());
        flood.spawn(async move {
            for i in 0..50 {
                if stop.is_cancelled() {
                    break;
                }
                let forged = forged_token(worker * 1000 + i);
                let _ = connect_agent(addr, &ca, "flood", "", Some(&forged)).await;
            }
        });
    }
    let throttled = || {
        metric(
            &registry,
            "tether_server_token_reviews_total{outcome=\"throttled\"}",
        )
    };
    eventually("the flood throttles reviews", || async {
        throttled() >= 1.0
    })
    .await?;
    let mut answers = Vec::new();
    for _ in 0..6 {
        let answer = connect_agent(addr, &ca, "doomed", "", Some(&token)).await;
        answers.push(answer.err().map(|status| status.code));
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    stop.cancel();
    tokio::time::timeout(STEP * 2, async {
        while flood.join_next().await.is_some() {}
    })
    .await?;
    let stale = metric(
        &registry,
        "tether_server_token_answers_total{source=\"stale\"}",
    );
    eprintln!(
        "revoked token under a flood: {answers:?}; {} reviews throttled, {stale} stale answers",
        throttled()
    );
    assert!(
        answers.iter().all(|code| code.is_some()),
        "the revoked token was admitted: {answers:?}"
    );
    assert_eq!(stale, 0.0, "no stale admission without an API outage");
    tokio::time::timeout(Duration::from_secs(30), server.stop()).await?;
    Ok(())
}
