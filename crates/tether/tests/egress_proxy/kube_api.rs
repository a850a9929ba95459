//! The agent's Kubernetes client (Lease counting) behind a proxy, by client-go's rules, which
//! upstream's agent follows: `HTTPS_PROXY` unless `NO_PROXY` (or loopback) excludes the API
//! server. `--https-proxy` is the agent's server connections' alone, so `none` sends those
//! directly while the API client still takes the environment's proxy.

use tether_testkit::Pki;
use tether_testkit::control_plane::ControlPlane;

use crate::proxies::{Tinyproxy, TinyproxyOptions};
use crate::{AgentProcess, SERVER_HOST, STEP, have, server, tether_bin};

/// Lease lists the agent made that the API server answered with 200, from its metrics.
async fn listed(agent: &AgentProcess) -> f64 {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], agent.health));
    let Ok((_, metrics)) = tether_testkit::http::get(addr, "/metrics").await else {
        return 0.0;
    };
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("konnectivity_network_proxy_agent_lease_lists_total{")
                && l.contains("http_response_code=\"200\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn lists_leases(agent: &AgentProcess) -> anyhow::Result<()> {
    let deadline = tokio::time::Instant::now() + STEP;
    while listed(agent).await < 1.0 {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no Lease list answered within {STEP:?}; the agent's log:\n{}",
            agent.log()
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_lease_client_takes_https_proxy_and_no_proxy() -> anyhow::Result<()> {
    if !have("tinyproxy") {
        return Ok(());
    }
    let plane = ControlPlane::start(Default::default()).await?;
    // The API server by a name the loopback rule does not exempt (see the module comment of
    // main.rs); its certificate's `localhost` matches it.
    let kubeconfig = plane.pki.dir().join("agent.kubeconfig");
    let admin = std::fs::read_to_string(&plane.kubeconfig)?;
    std::fs::write(
        &kubeconfig,
        admin.replace(&plane.url, &format!("https://{SERVER_HOST}:{}", plane.port)),
    )?;
    let pki = Pki::generate()?;
    let server = server(&pki).await?;
    let proxy = Tinyproxy::start(TinyproxyOptions {
        connect_port: plane.port,
        basic_auth: Some(("kube", "pw-1")),
    })
    .await?;
    let proxy_url = format!("http://kube:pw-1@127.0.0.1:{}", proxy.port);
    let args = [
        "--https-proxy=none".to_owned(),
        "--count-server-leases=true".into(),
        "--lease-namespace=default".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
    ];
    let agent = |env: &[(&str, &str)]| {
        AgentProcess::spawn(tether_bin(), Some("agent"), &pki, &server, &args, env)
    };

    let proxied = agent(&[("HTTPS_PROXY", &proxy_url)])?;
    proxied.wait_ready().await?;
    lists_leases(&proxied).await?;
    let connects = proxy.connects();
    assert!(
        !connects.is_empty()
            && connects
                .iter()
                .all(|c| *c == format!("{SERVER_HOST}:{} HTTP/1.1", plane.port)),
        "only the API server's connections go through the proxy: {connects:?}"
    );
    let log = proxied.log();
    assert!(
        log.contains("Kubernetes API client through a proxy") && !log.contains("pw-1"),
        "{log}"
    );
    drop(proxied);

    let before = proxy.connects().len();
    let direct = agent(&[("HTTPS_PROXY", &proxy_url), ("NO_PROXY", "localhost")])?;
    direct.wait_ready().await?;
    lists_leases(&direct).await?;
    assert_eq!(
        proxy.connects().len(),
        before,
        "NO_PROXY named the API server, yet the proxy was used"
    );
    Ok(())
}
