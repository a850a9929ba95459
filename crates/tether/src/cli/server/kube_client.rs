//! The server's Kubernetes API client flags: upstream's `--kubeconfig`,
//! `--kube-api-content-type`, `--kubeconfig-qps` and `--kubeconfig-burst`.

use anyhow::bail;
use clap::Args;
use tether_kube::KubeApiOptions;

use crate::cli::common::non_default;
use crate::cli::kube::KubeconfigArgs;

const HEADING: &str = "Kubernetes API";

#[derive(Args, Clone, Debug)]
pub(crate) struct KubeClientArgs {
    #[command(flatten)]
    kubeconfig: KubeconfigArgs,

    /// Requests per second to the Kubernetes API (TokenReviews), shared by every request of
    /// the client; 0 means client-go's default, 5; a negative value means no limit.
    #[arg(long, help_heading = HEADING, value_name = "QPS", default_value_t = 0.0, allow_negative_numbers = true)]
    kubeconfig_qps: f32,

    /// Requests to the Kubernetes API allowed at once above --kubeconfig-qps; 0 means
    /// client-go's default, 10.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 0, allow_negative_numbers = true)]
    kubeconfig_burst: i64,
}

impl KubeClientArgs {
    /// The client's options, for a server that needs one.
    pub(crate) fn options(&self) -> anyhow::Result<KubeApiOptions> {
        if !self.kubeconfig_qps.is_finite() {
            bail!(
                "--kubeconfig-qps must be a number, got {}",
                self.kubeconfig_qps
            );
        }
        let Ok(burst) = u32::try_from(self.kubeconfig_burst) else {
            bail!(
                "--kubeconfig-burst must be between 0 and {}, got {}",
                u32::MAX,
                self.kubeconfig_burst
            );
        };
        Ok(KubeApiOptions {
            kubeconfig: self.kubeconfig.kubeconfig()?,
            qps: self.kubeconfig_qps,
            burst,
        })
    }

    /// Adds the changed flags to the start-up warning's list, for a server that needs no
    /// client.
    pub(crate) fn ignored(&self, ignored: &mut Vec<String>) {
        self.kubeconfig.ignored(ignored);
        non_default(ignored, "--kubeconfig-qps", self.kubeconfig_qps, 0.0);
        non_default(ignored, "--kubeconfig-burst", self.kubeconfig_burst, 0);
    }
}
