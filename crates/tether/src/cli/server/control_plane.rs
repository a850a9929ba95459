//! tether's `--control-plane-endpoints`: where agents' reverse dials may go, if anywhere.
//!
//! Reverse dials are opt-in: a drop-in replacement for upstream's proxy-server opens no new
//! network path. Empty (the default) and `none` turn them off; `kubeconfig` allows the API
//! server of `--kubeconfig` (or the in-cluster configuration); a list allows those endpoints.

use clap::Args;
use tether_server::{ControlPlaneEndpoints, DEFAULT_MAX_REVERSE_CONNECTIONS_PER_STREAM};

#[derive(Args, Clone, Debug)]
pub(crate) struct ControlPlaneArgs {
    /// Comma list of HOST:PORT that tether agents may reach from their nodes through the
    /// tunnel (their --control-plane-listen); the first is the default one. Nothing else is
    /// ever dialed for them. `kubeconfig`: the API server of --kubeconfig (or the in-cluster
    /// configuration). Empty or `none`: off. A tenant of --routing-config may name its own
    /// (control_plane_endpoints).
    #[arg(
        long,
        help_heading = "Control plane (tether)",
        value_name = "LIST",
        default_value = ""
    )]
    control_plane_endpoints: String,

    /// Reverse dials one agent stream may have under way or connected at once; more are
    /// refused with an error naming this flag. Must be > 0.
    #[arg(
        long,
        help_heading = "Control plane (tether)",
        value_name = "N",
        default_value_t = DEFAULT_MAX_REVERSE_CONNECTIONS_PER_STREAM
    )]
    control_plane_max_connections_per_stream: usize,
}

/// What the flag asks for.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ControlPlane {
    Off,
    /// The API server the Kubernetes client talks to.
    Kubeconfig,
    Listed(ControlPlaneEndpoints),
}

impl ControlPlaneArgs {
    pub(crate) fn endpoints(&self) -> anyhow::Result<ControlPlane> {
        match self.control_plane_endpoints.trim() {
            "" | "none" => return Ok(ControlPlane::Off),
            "kubeconfig" => return Ok(ControlPlane::Kubeconfig),
            _ => {}
        }
        let list = self
            .control_plane_endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty());
        if list.clone().any(|e| e == "kubeconfig" || e == "none") {
            anyhow::bail!(
                "--control-plane-endpoints: kubeconfig and none stand alone; list HOST:PORT endpoints otherwise"
            );
        }
        let endpoints = ControlPlaneEndpoints::parse(list)
            .map_err(|e| anyhow::anyhow!("--control-plane-endpoints: {e}"))?;
        Ok(endpoints.map_or(ControlPlane::Off, ControlPlane::Listed))
    }

    pub(crate) fn max_connections_per_stream(&self) -> anyhow::Result<usize> {
        match self.control_plane_max_connections_per_stream {
            0 => anyhow::bail!("--control-plane-max-connections-per-stream must be at least 1"),
            n => Ok(n),
        }
    }
}
