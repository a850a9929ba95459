//! tether's `--control-plane-endpoints`: where agents' reverse dials may go.

use clap::Args;
use tether_server::ControlPlaneEndpoints;

use crate::cli::common::check_host_port;

#[derive(Args, Clone, Debug)]
pub(crate) struct ControlPlaneArgs {
    /// Comma list of HOST:PORT that tether agents may reach from their nodes through the
    /// tunnel (their --control-plane-listen); the first is the default one. Nothing else is
    /// ever dialed for them. Empty: the API server of --kubeconfig when the server uses the
    /// Kubernetes API (token authentication, Leases), otherwise off. `none`: off.
    #[arg(
        long,
        help_heading = "Control plane (tether)",
        value_name = "LIST",
        default_value = ""
    )]
    control_plane_endpoints: String,
}

/// What the flag asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ControlPlane {
    /// The API server the Kubernetes client talks to, if there is a client.
    Default,
    Off,
    Listed(ControlPlaneEndpoints),
}

impl ControlPlaneArgs {
    pub(crate) fn endpoints(&self) -> anyhow::Result<ControlPlane> {
        match self.control_plane_endpoints.trim() {
            "" => return Ok(ControlPlane::Default),
            "none" => return Ok(ControlPlane::Off),
            _ => {}
        }
        let list: Vec<String> = self
            .control_plane_endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(str::to_owned)
            .collect();
        for endpoint in &list {
            check_host_port(endpoint)
                .map_err(|e| anyhow::anyhow!("--control-plane-endpoints: {e}"))?;
        }
        Ok(ControlPlaneEndpoints::new(list).map_or(ControlPlane::Off, ControlPlane::Listed))
    }
}
