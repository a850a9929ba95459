//! Node identity with tokens (issue 25, H2'): by default a token agent's `host=` is the
//! node its token is bound to and its `ipv4=`/`ipv6=` are that Node's addresses, read from
//! the real API server; the agent ID goes to the token that proves it; and a server that may
//! not read Nodes refuses address claims, naming the grant.

use tether_grpc::Code;
use tether_testkit::http::metric_value;
use tether_testkit::{Pki, ServerOptions, TestServer};

use crate::{
    AGENT_SA, AUDIENCE, Cluster, NAMESPACE, connect_agent, default_limits, eventually,
    token_auth_with,
};

/// The Nodes' InternalIPs in the cluster's objects.
const NODE_1_IP: &str = "10.250.0.11";
const NODE_2_IP: &str = "10.250.0.12";

/// A proxy server's ServiceAccount allowed TokenReviews but not Nodes.
const WITHOUT_NODES: &str = "\
apiVersion: v1
kind: ServiceAccount
metadata: {name: server-without-nodes, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: server-without-nodes-auth-delegator}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:auth-delegator}
subjects:
- {kind: ServiceAccount, name: server-without-nodes, namespace: kube-system}
";

async fn metric(server: &TestServer, sample: &str) -> f64 {
    metric_value(&server.metrics().await.unwrap_or_default(), sample).unwrap_or(0.0)
}

async fn agent_streams(server: &TestServer) -> f64 {
    metric(
        server,
        "konnectivity_network_proxy_server_grpc_connections{service_method=\"Connect\"}",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_proves_its_nodes_name_and_addresses_and_nothing_else() -> anyhow::Result<()> {
    let cluster = Cluster::start().await?;
    let pki = Pki::generate()?;
    let (auth, _) = cluster.token_auth(default_limits()).await?;
    let server = TestServer::start(
        &pki,
        ServerOptions {
            agent_token_auth: Some(auth),
            ..Default::default()
        },
    )
    .await?;
    let (addr, ca) = (server.agent_addr, &pki.files.ca_cert);
    let node1 = cluster.agent_token(Some("node-1")).await?;
    let node2 = cluster.agent_token(Some("node-2")).await?;
    let unbound = cluster.agent_token(None).await?;

    // node-1's own name and address, as the chart's agents claim them: admitted.
    let real = connect_agent(
        addr,
        ca,
        "node-1",
        &format!("host=node-1&ipv4={NODE_1_IP}"),
        Some(&node1),
    )
    .await
    .map_err(|s| anyhow::anyhow!("node-1's own name and address: {s}"))?;

    // node-2's token claims node-1's address or name (K9's claim): refused, saying what the
    // token proves and the flag. A token bound to no node proves no address.
    for (token, claimed, says) in [
        (
            &node2,
            format!("ipv4={NODE_1_IP}"),
            format!("bound to node node-2 with addresses {NODE_2_IP}"),
        ),
        (
            &node2,
            "host=node-1".to_owned(),
            "bound to node node-2".to_owned(),
        ),
        (
            &unbound,
            format!("ipv4={NODE_1_IP}"),
            "bound to no node".to_owned(),
        ),
    ] {
        let refused = connect_agent(addr, ca, "node-2", &claimed, Some(token))
            .await
            .err()
            .ok_or_else(|| anyhow::anyhow!("{claimed} was admitted with another token"))?;
        assert_eq!(refused.code, Code::PERMISSION_DENIED, "{refused}");
        for part in [
            claimed.as_str(),
            says.as_str(),
            "--agent-identity-binding=off",
        ] {
            assert!(refused.message.contains(part), "{part}: {refused}");
        }
    }
    assert_eq!(
        metric(
            &server,
            "tether_server_limit_hits_total{limit=\"agent_identity\"}"
        )
        .await,
        3.0
    );
    let own = connect_agent(
        addr,
        ca,
        "node-2",
        &format!("host=node-2&ipv4={NODE_2_IP}"),
        Some(&node2),
    )
    .await
    .map_err(|s| anyhow::anyhow!("node-2's own name and address: {s}"))?;
    drop(own);

    // node-1 leaves; node-2's token takes the free ID node-1 (no identifier of node-1's),
    // and node-1's token takes it back, ending the squatter's stream.
    drop(real);
    eventually("node-1 and node-2 left", || async {
        agent_streams(&server).await == 0.0
    })
    .await?;
    let squatter = connect_agent(addr, ca, "node-1", "", Some(&node2))
        .await
        .map_err(|s| anyhow::anyhow!("the free ID: {s}"))?;
    let back = connect_agent(addr, ca, "node-1", "host=node-1", Some(&node1))
        .await
        .map_err(|s| anyhow::anyhow!("node-1 was locked out of its ID: {s}"))?;
    eventually("the squatter's stream ended", || async {
        agent_streams(&server).await == 1.0
    })
    .await?;
    let refused = connect_agent(addr, ca, "node-1", "", Some(&node2))
        .await
        .err()
        .ok_or_else(|| anyhow::anyhow!("node-2 took node-1's ID again"))?;
    assert_eq!(refused.code, Code::ALREADY_EXISTS, "{refused}");
    drop((squatter, back));

    // A server that may not read Nodes refuses address claims as unavailable, naming the
    // grant and the flag; a host= claim needs no Node and is admitted.
    cluster.plane.apply(WITHOUT_NODES).await?;
    let token = cluster
        .plane
        .create_token(
            NAMESPACE,
            "server-without-nodes",
            tether_testkit::control_plane::API_AUDIENCE,
            None,
        )
        .await?;
    let kubeconfig = cluster
        .plane
        .write_token_kubeconfig("server-without-nodes", &token)?;
    let account = tether_kube::token_review::AgentServiceAccount {
        namespace: NAMESPACE.into(),
        name: AGENT_SA.into(),
        audience: AUDIENCE.into(),
    };
    let (auth, _) = token_auth_with(&kubeconfig, account, default_limits(), 0.0, 0).await?;
    let blind = TestServer::start(
        &pki,
        ServerOptions {
            agent_token_auth: Some(auth),
            ..Default::default()
        },
    )
    .await?;
    let refused = connect_agent(
        blind.agent_addr,
        ca,
        "node-1",
        &format!("ipv4={NODE_1_IP}"),
        Some(&node1),
    )
    .await
    .err()
    .ok_or_else(|| anyhow::anyhow!("an address was admitted without reading the Node"))?;
    assert_eq!(refused.code, Code::UNAVAILABLE, "{refused}");
    for part in ["`get` on nodes", "--agent-identity-binding=off"] {
        assert!(refused.message.contains(part), "{part}: {refused}");
    }
    connect_agent(blind.agent_addr, ca, "node-1", "host=node-1", Some(&node1))
        .await
        .map_err(|s| anyhow::anyhow!("host= without Node access: {s}"))?;
    Ok(())
}
