//! Building a Kubernetes API client the way upstream's `--kubeconfig` flag does: a path names a
//! kubeconfig file, an empty path means the in-cluster ServiceAccount configuration.

use std::path::Path;

use anyhow::Context as _;

/// A client for the API server named by `kubeconfig` (or the in-cluster configuration when it is
/// `None`), with upstream's `--kubeconfig-qps`/`--kubeconfig-burst` applied by the caller.
pub async fn connect(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    let config = match kubeconfig {
        Some(path) => {
            let file = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => kube::Config::incluster().context(
            "no --kubeconfig given and not running in a pod (KUBERNETES_SERVICE_HOST unset)",
        )?,
    };
    kube::Client::try_from(config).context("building the Kubernetes API client")
}
