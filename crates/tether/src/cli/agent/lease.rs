//! The agent's Lease flags: upstream's `--count-server-leases`, `--lease-namespace`,
//! `--lease-label-selector` (with its older spelling `--lease-label`) and
//! `--server-count-source`, plus tether's `--lease-poll-interval`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::{ArgAction, Args};
use tether_agent::CountSource;

use crate::cli::common::{
    DEFAULT_LEASE_LABEL, DEFAULT_LEASE_NAMESPACE, go_bool, go_duration, non_default,
};
use crate::cli::kube::KubeconfigArgs;

const HEADING: &str = "Server count";

#[derive(Args, Clone, Debug)]
pub(crate) struct LeaseArgs {
    /// Count servers by their valid Leases (published by servers with
    /// --enable-lease-controller) instead of the count they announce; the count follows
    /// servers joining and leaving without restarts.
    #[arg(long, help_heading = HEADING, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    count_server_leases: bool,

    /// Namespace of the proxy server Leases.
    #[arg(long, help_heading = HEADING, value_name = "NAMESPACE", default_value = DEFAULT_LEASE_NAMESPACE)]
    lease_namespace: String,

    /// Label selector of the Leases to count [default: k8s-app=konnectivity-server].
    #[arg(long, help_heading = HEADING, value_name = "SELECTOR")]
    lease_label_selector: Option<String>,

    /// Older spelling of --lease-label-selector (upstream v0.36.0 and before).
    #[arg(long, hide = true, value_name = "SELECTOR")]
    lease_label: Option<String>,

    /// How the Lease count and the count servers announce combine: 'default' (the Lease
    /// count alone, with --count-server-leases) or 'max' (the larger).
    #[arg(long, help_heading = HEADING, value_name = "SOURCE", default_value = "default")]
    server_count_source: String,

    /// How often the Leases are listed (from the API server's cache). Upstream's informer
    /// resyncs every 10s.
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "10s", value_parser = go_duration)]
    lease_poll_interval: Duration,
}

/// Counting servers by Lease, validated.
#[derive(Clone, Debug)]
pub(crate) struct AgentLeases {
    /// `--kubeconfig`; `None` means the in-cluster configuration.
    pub(crate) kubeconfig: Option<PathBuf>,
    pub(crate) namespace: String,
    pub(crate) selector: String,
    pub(crate) source: CountSource,
    pub(crate) poll_interval: Duration,
}

impl LeaseArgs {
    /// The selector from either spelling; both set to different values is an error rather
    /// than a guess at which one wins.
    fn selector(&self) -> anyhow::Result<&str> {
        match (&self.lease_label_selector, &self.lease_label) {
            (Some(a), Some(b)) if a != b => bail!(
                "--lease-label is the older spelling of --lease-label-selector; set one of them \
                 (got {a:?} and {b:?})"
            ),
            (Some(s), _) | (None, Some(s)) => Ok(s),
            (None, None) => Ok(DEFAULT_LEASE_LABEL),
        }
    }

    /// Validates the flags (as upstream does, whether or not Leases are counted) and returns
    /// the Lease settings when --count-server-leases is on.
    pub(crate) fn settings(
        &self,
        kubeconfig: Option<PathBuf>,
    ) -> anyhow::Result<Option<AgentLeases>> {
        let source = match self.server_count_source.as_str() {
            "" | "default" => CountSource::Default,
            "max" => CountSource::Max,
            other => bail!("--server-count-source must be 'default' or 'max', got {other:?}"),
        };
        let selector = self.selector()?;
        if !self.count_server_leases {
            return Ok(None);
        }
        tether_kube::lease::labels::check_selector(selector)
            .map_err(|e| anyhow::anyhow!("--lease-label-selector {e}"))?;
        if self.lease_namespace.is_empty() {
            bail!("--lease-namespace must not be empty with --count-server-leases");
        }
        if self.lease_poll_interval.is_zero() {
            bail!("--lease-poll-interval must be greater than 0");
        }
        Ok(Some(AgentLeases {
            kubeconfig,
            namespace: self.lease_namespace.clone(),
            selector: selector.to_owned(),
            source,
            poll_interval: self.lease_poll_interval,
        }))
    }

    /// Flags changed from their defaults that do nothing without --count-server-leases.
    /// `kube` is the Kubernetes client's flags, which only Lease counting uses on the agent.
    pub(crate) fn ignored(&self, kube: &KubeconfigArgs, ignored: &mut Vec<String>) {
        if self.count_server_leases {
            return;
        }
        kube.ignored(ignored);
        non_default(
            ignored,
            "--lease-namespace",
            self.lease_namespace.as_str(),
            DEFAULT_LEASE_NAMESPACE,
        );
        let selector = self.selector().unwrap_or(DEFAULT_LEASE_LABEL);
        non_default(
            ignored,
            "--lease-label-selector",
            selector,
            DEFAULT_LEASE_LABEL,
        );
        non_default(
            ignored,
            "--server-count-source",
            self.server_count_source.as_str(),
            "default",
        );
    }
}
