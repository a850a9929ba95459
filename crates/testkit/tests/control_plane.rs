//! The loopback control plane itself: it starts, serves the API, issues ServiceAccount tokens
//! that it then accepts, and comes back after its API server is stopped.

use tether_testkit::control_plane::{API_AUDIENCE, ControlPlane, ControlPlaneOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_issues_tokens_and_restarts() -> anyhow::Result<()> {
    let mut plane = ControlPlane::start(ControlPlaneOptions::default()).await?;
    plane
        .apply("apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: probe\n  namespace: default\n")
        .await?;
    let token = plane
        .create_token("default", "probe", API_AUDIENCE, None)
        .await?;
    assert_eq!(token.split('.').count(), 3, "a JWT: {token}");

    // The token authenticates as the service account (and RBAC then denies it nodes).
    let kubeconfig = plane.write_token_kubeconfig("probe", &token)?;
    let kubeconfig = format!("--kubeconfig={}", kubeconfig.display());
    let out = tokio::process::Command::new(plane.kubectl_path())
        .args([kubeconfig.as_str(), "get", "nodes"])
        .output()
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("system:serviceaccount:default:probe"),
        "expected an RBAC denial naming the service account: {stderr}"
    );

    plane.stop_apiserver().await?;
    assert!(
        plane
            .kubectl(&["get", "--raw=/readyz"], None)
            .await
            .is_err()
    );
    plane.start_apiserver().await?;
    let accounts = plane
        .kubectl(&["get", "serviceaccounts", "-o", "name"], None)
        .await?;
    assert!(
        accounts.contains("serviceaccount/probe"),
        "etcd kept the data: {accounts}"
    );
    Ok(())
}
