//! Agents joining tenants by the ServiceAccount their token proves: two namespaces' agents
//! land in two tenants, each reached only by its own tenant's clients, and an agent whose
//! namespace (or ServiceAccount) maps to no tenant is refused with the reason.

use std::path::PathBuf;

use tether_client::Transport as ClientTransport;
use tether_grpc::Code;
use tether_kube::token_review::{ANY, AgentServiceAccount};
use tether_server::{Mode, RoutingConfig};
use tether_testkit::http::metric_value;
use tether_testkit::targets::EchoServer;
use tether_testkit::{AgentOptions, Pki, ServerOptions, TestAgent, TestServer, Transport};
use tether_tls::pki::ClientSpec;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::{AUDIENCE, Cluster, STEP, connect_agent, default_limits};

const NAMESPACES: &str = "\
apiVersion: v1
kind: Namespace
metadata: {name: tenant-alpha}
---
apiVersion: v1
kind: Namespace
metadata: {name: tenant-beta}
---
apiVersion: v1
kind: Namespace
metadata: {name: tenant-gamma}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent, namespace: tenant-alpha}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: other, namespace: tenant-alpha}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent, namespace: tenant-beta}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: agent, namespace: tenant-gamma}
";

/// alpha admits one ServiceAccount of its namespace, beta any of its namespace.
const ROUTING: &str = "tenants:
  - name: alpha
    clients: [\"cert:api.alpha\"]
    agents: [\"sa:tenant-alpha:agent\"]
  - name: beta
    clients: [\"cert:api.beta\"]
    agents: [\"sa:tenant-beta\"]
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_join_the_tenant_of_their_service_account_namespace() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    cluster.plane.apply(NAMESPACES).await?;
    let (pki, issued) = Pki::generate_with_clients(&[
        ClientSpec {
            common_name: "api.alpha",
            sans: &[],
        },
        ClientSpec {
            common_name: "api.beta",
            sans: &[],
        },
    ])?;
    let client_certs: Vec<(PathBuf, PathBuf)> = ["api.alpha", "api.beta"]
        .iter()
        .zip(&issued)
        .map(|(name, issued)| {
            let cert = pki.dir().join(format!("{name}.crt"));
            let key = pki.dir().join(format!("{name}.key"));
            std::fs::write(&cert, &issued.cert_pem)?;
            std::fs::write(&key, &issued.key_pem)?;
            Ok((cert, key))
        })
        .collect::<std::io::Result<_>>()?;
    // Any namespace and name: the tenant table decides (a start-up error without one).
    let account = AgentServiceAccount {
        namespace: ANY.into(),
        name: ANY.into(),
        audience: AUDIENCE.into(),
    };
    let (auth, _) = cluster
        .token_auth_for(account, default_limits(), 0.0, 0)
        .await?;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            mode: Mode::HttpConnect,
            transport: Transport::Tls,
            routing: RoutingConfig::from_yaml(ROUTING).map_err(anyhow::Error::msg)?,
            agent_token_auth: Some(auth),
            ..Default::default()
        },
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let token = |namespace: &'static str, account: &'static str| {
        let plane = &cluster.plane;
        async move { plane.create_token(namespace, account, AUDIENCE, None).await }
    };
    let agent = |name: &'static str, token: String| {
        let path = dir.path().join(name);
        let (pki, addr) = (&pki, server.agent_addr);
        async move {
            std::fs::write(&path, token)?;
            let agent = TestAgent::start(
                pki,
                addr,
                AgentOptions {
                    agent_id: name.into(),
                    token_path: Some(path),
                    ..Default::default()
                },
            )
            .await?;
            agent.wait_ready().await?;
            anyhow::Ok(agent)
        }
    };
    let alpha = agent("alpha-agent", token("tenant-alpha", "agent").await?).await?;
    let beta = agent("beta-agent", token("tenant-beta", "agent").await?).await?;

    // A namespace in no tenant, and an unlisted ServiceAccount of alpha's namespace, are
    // refused with the reason, although their tokens are valid.
    let ca = &pki.files.ca_cert;
    for (namespace, account) in [("tenant-gamma", "agent"), ("tenant-alpha", "other")] {
        let refused = connect_agent(
            server.agent_addr,
            ca,
            "stray",
            "",
            Some(&token(namespace, account).await?),
        )
        .await
        .err()
        .expect("an agent in no tenant is refused");
        assert_eq!(refused.code, Code::PERMISSION_DENIED, "{refused}");
        assert_eq!(
            refused.message,
            format!(
                "agent identity system:serviceaccount:{namespace}:{account} belongs to no tenant"
            )
        );
    }

    // Each tenant's client reaches only its own tenant's agent.
    let echo = EchoServer::start().await?;
    let client = |cert: &(PathBuf, PathBuf)| -> anyhow::Result<ClientTransport> {
        let f = &pki.files;
        Ok(ClientTransport::Tls {
            addr: server.frontend_tcp.expect("a TCP frontend").to_string(),
            server_name: "127.0.0.1".into(),
            tls: tether_tls::client_config(
                &f.ca_cert,
                Some((cert.0.as_path(), cert.1.as_path())),
                Vec::new(),
                &Default::default(),
            )?,
        })
    };
    let (to_alpha, to_beta) = (client(&client_certs[0])?, client(&client_certs[1])?);
    for _ in 0..3 {
        echo_through(&to_alpha, &echo.addr.to_string()).await?;
    }
    for _ in 0..5 {
        echo_through(&to_beta, &echo.addr.to_string()).await?;
    }
    assert_eq!(dials(&alpha).await?, 3.0);
    assert_eq!(dials(&beta).await?, 5.0);
    let metrics = server.metrics().await?;
    assert_eq!(
        metric_value(
            &metrics,
            "tether_server_tenant_unmapped_total{listener=\"shared\",side=\"agent\"}"
        ),
        Some(2.0)
    );
    Ok(())
}

/// One CONNECT through `client` to the echo server at `target`, checked byte for byte.
async fn echo_through(client: &ClientTransport, target: &str) -> anyhow::Result<()> {
    let mut stream =
        tokio::time::timeout(STEP, tether_client::dial_http_connect(client, target)).await??;
    let payload = b"to the tenant's own agent";
    stream.write_all(payload).await?;
    stream.flush().await?;
    let mut back = vec![0; payload.len()];
    tokio::time::timeout(STEP, stream.read_exact(&mut back)).await??;
    anyhow::ensure!(back == payload, "echo differs");
    Ok(())
}

/// Destinations the agent dialed.
async fn dials(agent: &TestAgent) -> anyhow::Result<f64> {
    let text = agent.metrics().await?;
    Ok(metric_value(
        &text,
        "konnectivity_network_proxy_agent_dial_duration_seconds_count",
    )
    .unwrap_or(0.0))
}
