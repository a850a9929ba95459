//! `tether validate`: the files tether and kube-apiserver read, checked before a rollout.

use std::path::PathBuf;

use clap::{ArgGroup, Args};

#[derive(Args, Debug)]
#[group(skip)]
#[command(group(
    ArgGroup::new("files")
        .required(true)
        .multiple(true)
        .args(["egress_selector_config_file", "routing_config", "destination_policy"])
))]
pub(crate) struct ValidateArgs {
    /// kube-apiserver's EgressSelectorConfiguration (its --egress-selector-config-file):
    /// checked as kube-apiserver checks it, then as tether's client would use it (TLS files
    /// loaded, the proxy's socket looked for). Nothing is dialed.
    #[arg(long, value_name = "FILE")]
    pub(crate) egress_selector_config_file: Option<PathBuf>,

    /// A server's routing file (its --routing-config). The file alone: flags it depends on
    /// (token authentication for `sa:` agents) are checked when the server starts.
    #[arg(long, value_name = "FILE")]
    pub(crate) routing_config: Option<PathBuf>,

    /// An agent's destination policy (its --destination-policy).
    #[arg(long, value_name = "FILE")]
    pub(crate) destination_policy: Option<PathBuf>,
}
