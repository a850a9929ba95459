//! A tether server reviewing agent tokens with a real kube-apiserver.

use std::time::Duration;

use tether_grpc::Code;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer};

use crate::{
    AUDIENCE, Cluster, NAMESPACE, STEP, connect_agent, default_limits, echo_through, eventually,
    native_answer,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_reviewed_cached_bound_to_nodes_and_survive_an_api_outage() -> anyhow::Result<()>
{
    let mut cluster = Cluster::start().await?;
    let pki = Pki::generate()?;
    let (auth, token_metrics) = cluster.token_auth(default_limits()).await?;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: tether_server::Mode::HttpConnect,
            agent_token_auth: Some(auth),
            ..Default::default()
        },
    )
    .await?;
    let ca = &pki.files.ca_cert;
    let metric = |name: &str| {
        tether_testkit::http::metric_value(&token_metrics.render(), name).unwrap_or(-1.0)
    };

    // A tether agent with a projected token bound to its node's pod connects, and traffic
    // flows through it.
    let node1 = cluster.agent_token(Some("node-1")).await?;
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    // A trailing newline, as files written by hand have: the tether agent trims it.
    std::fs::write(&token_file, format!("{node1}\n"))?;
    let agent = TestAgent::start(
        &pki,
        server.agent_addr,
        AgentOptions {
            agent_id: "node-1".into(),
            identifiers: "host=node-1".into(),
            token_path: Some(token_file),
            ..Default::default()
        },
    )
    .await?;
    server.wait_ready().await?;
    agent.wait_ready().await?;
    let echo = EchoServer::start().await?;
    echo_through(server.uds.as_ref().unwrap(), echo.addr).await?;
    assert_eq!(
        metric("tether_server_token_reviews_total{outcome=\"admitted\"}"),
        1.0
    );

    // Refusals: UNAUTHENTICATED, with upstream's reason (or, for what is refused without a
    // review, the local check's).
    let other_audience = cluster
        .plane
        .create_token(
            NAMESPACE,
            crate::AGENT_SA,
            "https://example.invalid/other",
            None,
        )
        .await?;
    let other_namespace = cluster
        .plane
        .create_token("default", crate::AGENT_SA, AUDIENCE, None)
        .await?;
    let other_account = cluster
        .plane
        .create_token(NAMESPACE, "other-agent", AUDIENCE, None)
        .await?;
    for (what, token, reason) in [
        (
            "wrong audience",
            Some(other_audience.as_str()),
            "not issued for the audience \"system:konnectivity-server\"",
        ),
        (
            "wrong namespace",
            Some(other_namespace.as_str()),
            "\"default\" namespace. Expected \"kube-system\"",
        ),
        (
            "wrong service account",
            Some(other_account.as_str()),
            "\"other-agent\" service account. Expected \"konnectivity-agent\"",
        ),
        ("garbage", Some("not-a-token"), "the token is not a JWT"),
        ("no token", None, "no authorization metadata"),
    ] {
        let refused = connect_agent(server.agent_addr, ca, "intruder", "", token)
            .await
            .err()
            .unwrap_or_else(|| panic!("{what}: admitted"));
        assert_eq!(refused.code, Code::UNAUTHENTICATED, "{what}: {refused}");
        assert!(refused.message.contains(reason), "{what}: {refused}");
        // The native link refuses alike, with the same code and reason in its CLOSE.
        let native = native_answer(server.agent_addr, ca, "intruder", "", token)
            .await?
            .err()
            .unwrap_or_else(|| panic!("{what}: admitted on the native link"));
        assert_eq!(native, refused, "{what}");
    }
    let log = refused_agent_log(&server, &pki, &other_namespace).await?;
    assert!(
        log.contains(r#"agent token refused: incoming request from \"default\" namespace"#),
        "{log}"
    );

    // The node binding: host= must name the token's node.
    let refused = connect_agent(server.agent_addr, ca, "node-2", "host=node-2", Some(&node1))
        .await
        .err()
        .expect("a node-1 token claiming node-2 was admitted");
    assert_eq!(refused.code, Code::PERMISSION_DENIED, "{refused}");
    assert!(
        refused
            .message
            .contains("host=node-2 is not proven by the agent's token, bound to node node-1"),
        "{refused}"
    );
    let native = native_answer(server.agent_addr, ca, "node-2", "host=node-2", Some(&node1))
        .await?
        .expect_err("a node-1 token claiming node-2 was admitted on the native link");
    assert_eq!(native, refused);
    let unbound = cluster.agent_token(None).await?;
    let refused = connect_agent(server.agent_addr, ca, "x", "host=node-1", Some(&unbound))
        .await
        .err()
        .expect("a token bound to no node claimed a host");
    assert_eq!(refused.code, Code::PERMISSION_DENIED, "{refused}");
    let node2 = cluster.agent_token(Some("node-2")).await?;
    let second = connect_agent(server.agent_addr, ca, "node-2", "host=node-2", Some(&node2))
        .await
        .map_err(|s| anyhow::anyhow!("node-2's own token: {s}"))?;
    // The node-1 agent's ID cannot be taken over with node-2's token.
    let refused = connect_agent(server.agent_addr, ca, "node-1", "", Some(&node2))
        .await
        .err()
        .expect("node-2 took node-1's agent ID");
    assert_eq!(refused.code, Code::ALREADY_EXISTS, "{refused}");
    drop(second);

    // Reconnects with a known token are answered from the cache.
    let reviews = cluster.token_reviews().await?;
    for _ in 0..20 {
        drop(
            connect_agent(server.agent_addr, ca, "node-1", "host=node-1", Some(&node1))
                .await
                .map_err(|s| anyhow::anyhow!("{s}"))?,
        );
    }
    assert_eq!(
        cluster.token_reviews().await?,
        reviews,
        "cached tokens cost no review"
    );
    assert!(metric("tether_server_token_answers_total{source=\"cache\"}") >= 20.0);

    // The API server goes away: the connected agent keeps its tunnel, cached tokens keep
    // connecting, unknown ones are told to retry, and /readyz and the metric say why.
    let fresh = cluster.agent_token(Some("node-2")).await?;
    cluster.plane.stop_apiserver().await?;
    let refused = connect_agent(server.agent_addr, ca, "late", "", Some(&fresh))
        .await
        .err()
        .expect("an unreviewable token was admitted");
    assert_eq!(refused.code, Code::UNAVAILABLE, "{refused}");
    assert!(
        refused.message.contains("could not be checked"),
        "{refused}"
    );
    // Still ready (the connected agent carries traffic), and it says why new agents wait.
    let (status, body) = tether_testkit::http::get(server.health_addr, "/readyz").await?;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("kubernetes API server unavailable"), "{body}");
    assert_eq!(metric("tether_server_kube_api_available"), 0.0);
    connect_agent(server.agent_addr, ca, "node-1", "host=node-1", Some(&node1))
        .await
        .map_err(|s| anyhow::anyhow!("a cached token during the outage: {s}"))?;
    // Dials go to the real agent once the bare streams above (which never answer a dial)
    // have been unregistered.
    eventually("only the tether agent's stream is left", || async {
        server.metrics().await.ok().and_then(|text| {
            tether_testkit::http::metric_value(
                &text,
                "konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"}",
            )
        }) == Some(1.0)
    })
    .await?;
    echo_through(server.uds.as_ref().unwrap(), echo.addr).await?;

    // And /readyz is plain again by itself once the API server is back.
    cluster.plane.start_apiserver().await?;
    eventually("/readyz after the API server came back", || async {
        matches!(
            tether_testkit::http::get(server.health_addr, "/readyz").await,
            Ok((200, body)) if body == "ok"
        )
    })
    .await?;
    assert_eq!(metric("tether_server_kube_api_available"), 1.0);
    tokio::time::timeout(STEP, agent.stop()).await?;
    tokio::time::timeout(Duration::from_secs(30), server.stop()).await?;
    Ok(())
}

/// Runs a `tether agent` process with `token` and returns its log once it reports the
/// server's refusal (upstream's agents log only "expected one server ID in the context").
async fn refused_agent_log(server: &TestServer, pki: &Pki, token: &str) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, token)?;
    let mut child = tokio::process::Command::new(crate::tether_bin())
        .args([
            "agent".to_owned(),
            format!("--proxy-server-host={}", server.agent_addr.ip()),
            format!("--proxy-server-port={}", server.agent_addr.port()),
            format!("--ca-cert={}", pki.files.ca_cert.display()),
            format!("--service-account-token-path={}", token_file.display()),
            "--health-server-host=127.0.0.1".into(),
            format!(
                "--health-server-port={}",
                tether_testkit::process::free_port()
            ),
            format!(
                "--admin-server-port={}",
                tether_testkit::process::free_port()
            ),
            "--sync-interval=100ms".into(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let mut stderr = child.stderr.take().expect("piped");
    let mut log = Vec::new();
    let read = async {
        use tokio::io::AsyncReadExt as _;
        let mut buf = [0; 4096];
        while !String::from_utf8_lossy(&log).contains("status Unauthenticated: agent token refused")
        {
            let n = stderr.read(&mut buf).await?;
            anyhow::ensure!(n > 0, "agent exited: {}", String::from_utf8_lossy(&log));
            log.extend_from_slice(&buf[..n]);
        }
        Ok(())
    };
    let finished = tokio::time::timeout(STEP, read).await;
    anyhow::ensure!(
        finished.is_ok(),
        "no refusal logged within {STEP:?}: {}",
        String::from_utf8_lossy(&log)
    );
    finished??;
    child.start_kill()?;
    Ok(String::from_utf8_lossy(&log).into_owned())
}
