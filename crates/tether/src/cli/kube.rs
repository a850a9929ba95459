//! The Kubernetes client flags both binaries share: `--kubeconfig` and
//! `--kube-api-content-type`. A client is built only when a feature needs one.

use std::path::PathBuf;

use anyhow::bail;
use clap::Args;

use super::common::{DEFAULT_KUBE_API_CONTENT_TYPE, non_default};

const JSON: &str = "application/json";

#[derive(Args, Clone, Debug)]
pub(crate) struct KubeconfigArgs {
    /// Kubeconfig of the Kubernetes API client (token authentication, Leases); empty means
    /// the in-cluster ServiceAccount configuration.
    #[arg(
        long,
        help_heading = "Kubernetes API",
        value_name = "PATH",
        default_value = ""
    )]
    pub(crate) kubeconfig: String,

    /// Content type of requests to the Kubernetes API: application/vnd.kubernetes.protobuf
    /// or application/json. tether always sends JSON (its client has no protobuf codec);
    /// both are accepted so upstream manifests run unchanged.
    #[arg(long, help_heading = "Kubernetes API", value_name = "TYPE", default_value = DEFAULT_KUBE_API_CONTENT_TYPE)]
    pub(crate) kube_api_content_type: String,
}

impl KubeconfigArgs {
    /// The kubeconfig path (`None`: in-cluster), after upstream's check that a given file
    /// exists, and the content type's check.
    pub(crate) fn kubeconfig(&self) -> anyhow::Result<Option<PathBuf>> {
        if ![DEFAULT_KUBE_API_CONTENT_TYPE, JSON].contains(&self.kube_api_content_type.as_str()) {
            bail!(
                "--kube-api-content-type must be {DEFAULT_KUBE_API_CONTENT_TYPE} or {JSON}, got {:?}",
                self.kube_api_content_type
            );
        }
        if self.kubeconfig.is_empty() {
            return Ok(None);
        }
        let path = PathBuf::from(&self.kubeconfig);
        if let Err(e) = std::fs::metadata(&path)
            && e.kind() == std::io::ErrorKind::NotFound
        {
            bail!("checking KubeconfigPath {:?}, got {e}", self.kubeconfig);
        }
        Ok(Some(path))
    }

    /// Adds the changed flags to the start-up warning's list, for a command that builds no
    /// client.
    pub(crate) fn ignored(&self, ignored: &mut Vec<String>) {
        non_default(ignored, "--kubeconfig", self.kubeconfig.as_str(), "");
        non_default(
            ignored,
            "--kube-api-content-type",
            self.kube_api_content_type.as_str(),
            DEFAULT_KUBE_API_CONTENT_TYPE,
        );
    }
}
