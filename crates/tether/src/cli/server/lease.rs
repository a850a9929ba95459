//! The server's Lease flags: upstream's `--enable-lease-controller`, `--lease-namespace` and
//! `--lease-label`, plus tether's `--lease-duration` and `--lease-renew-interval` (constants
//! upstream: 30s and 15s; the garbage collector runs at the renew interval, as upstream's
//! 15s).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use anyhow::bail;
use clap::{ArgAction, Args};
use tether_kube::lease::labels::LeaseLabels;

use crate::cli::common::{
    DEFAULT_LEASE_LABEL, DEFAULT_LEASE_NAMESPACE, go_bool, go_duration, non_default,
};

const HEADING: &str = "Server Lease";

#[derive(Args, Clone, Debug)]
pub(crate) struct LeaseArgs {
    /// Publish this server's Lease (konnectivity-proxy-server-<server-id>) and delete
    /// expired ones, for agents that count servers by Lease (--count-server-leases).
    #[arg(long, help_heading = HEADING, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_lease_controller: bool,

    /// Namespace of the proxy server Leases.
    #[arg(long, help_heading = HEADING, value_name = "NAMESPACE", default_value = DEFAULT_LEASE_NAMESPACE)]
    lease_namespace: String,

    /// Labels of this server's Lease, comma-separated key=value pairs; the garbage
    /// collector deletes expired Leases that carry them all.
    #[arg(long, help_heading = HEADING, value_name = "LABELS", default_value = DEFAULT_LEASE_LABEL)]
    lease_label: String,

    /// How long the Lease stays valid after each renewal (whole seconds).
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "30s", value_parser = go_duration)]
    lease_duration: Duration,

    /// How often the Lease is renewed and expired Leases are collected; less than
    /// --lease-duration.
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "15s", value_parser = go_duration)]
    lease_renew_interval: Duration,

    /// tether: where agents reach this server's agent port, IP[:PORT] (the port defaults to
    /// --agent-port; in a pod: $(POD_IP)), published in its Lease as the annotation
    /// tether.dev/agent-address for agents with --server-discovery=leases; upstream's agents
    /// ignore it.
    #[arg(long, help_heading = HEADING, value_name = "IP[:PORT]", default_value = "")]
    lease_agent_address: String,

    /// tether: where the fleet's other servers reach this server's peer port, IP[:PORT]
    /// (the port defaults to --peer-port; in a pod: $(POD_IP)), published in its Lease as
    /// the annotation tether.dev/peer-address. With it, this server links to every peer
    /// whose valid Lease publishes one (server peering; needs --peer-port).
    #[arg(long, help_heading = HEADING, value_name = "IP[:PORT]", default_value = "")]
    lease_peer_address: String,
}

/// The Lease controller's settings, validated. They use the server's one Kubernetes client
/// (`--kubeconfig`, with its rate limit).
#[derive(Clone, Debug)]
pub(crate) struct ServerLeases {
    pub(crate) namespace: String,
    pub(crate) labels: LeaseLabels,
    pub(crate) duration: Duration,
    pub(crate) renew_interval: Duration,
    /// `--lease-agent-address`, validated.
    pub(crate) agent_address: Option<SocketAddr>,
    /// `--lease-peer-address`, validated.
    pub(crate) peer_address: Option<SocketAddr>,
    /// With `--lease-peer-address`: where the peer addresses of every listing go.
    pub(crate) peers: Option<std::sync::Arc<tokio::sync::watch::Sender<BTreeSet<SocketAddr>>>>,
}

impl LeaseArgs {
    /// Validates the flags and returns the settings when --enable-lease-controller is on.
    /// `agent_port` is `--agent-port`, the default port of `--lease-agent-address`, and
    /// `peer_port` `--peer-port`, that of `--lease-peer-address`.
    pub(crate) fn settings(
        &self,
        agent_port: u16,
        peer_port: u16,
    ) -> anyhow::Result<Option<ServerLeases>> {
        let address = |flag: &str, given: &str, port: u16| {
            match given {
            "" => Ok(None),
            given => crate::cli::common::ip_and_port(given, port)
                .map(Some)
                .ok_or_else(|| {
                    anyhow::anyhow!(
                        "{flag} must be IP[:PORT] (an IPv6 address with a port in brackets), got {given:?}"
                    )
                }),
        }
        };
        let agent_address = address(
            "--lease-agent-address",
            &self.lease_agent_address,
            agent_port,
        )?;
        let peer_address = address("--lease-peer-address", &self.lease_peer_address, peer_port)?;
        if peer_address.is_some() && peer_port == 0 {
            bail!(
                "--lease-peer-address publishes where peers reach this server's peer port: it needs --peer-port"
            );
        }
        if !self.enable_lease_controller {
            for (flag, given) in [
                ("--lease-agent-address", agent_address),
                ("--lease-peer-address", peer_address),
            ] {
                if given.is_some() {
                    bail!(
                        "{flag} is published in the server's Lease: it needs --enable-lease-controller"
                    );
                }
            }
            return Ok(None);
        }
        let labels: LeaseLabels = self
            .lease_label
            .parse()
            .map_err(|e| anyhow::anyhow!("--lease-label: {e}"))?;
        if self.lease_namespace.is_empty() {
            bail!("--lease-namespace must not be empty with --enable-lease-controller");
        }
        let d = self.lease_duration;
        if d < Duration::from_secs(1) || d.subsec_nanos() != 0 || d.as_secs() > i32::MAX as u64 {
            bail!(
                "--lease-duration must be a whole number of seconds, at least 1s (the Lease stores seconds)"
            );
        }
        if self.lease_renew_interval.is_zero() || self.lease_renew_interval >= d {
            bail!(
                "--lease-renew-interval must be greater than 0 and less than --lease-duration, or the Lease expires between renewals"
            );
        }
        Ok(Some(ServerLeases {
            namespace: self.lease_namespace.clone(),
            labels,
            duration: d,
            renew_interval: self.lease_renew_interval,
            agent_address,
            peer_address,
            peers: None,
        }))
    }

    pub(crate) fn enabled(&self) -> bool {
        self.enable_lease_controller
    }

    /// Flags changed from their defaults that do nothing without --enable-lease-controller.
    pub(crate) fn ignored(&self, ignored: &mut Vec<String>) {
        if self.enable_lease_controller {
            return;
        }
        non_default(
            ignored,
            "--lease-namespace",
            self.lease_namespace.as_str(),
            DEFAULT_LEASE_NAMESPACE,
        );
        non_default(
            ignored,
            "--lease-label",
            self.lease_label.as_str(),
            DEFAULT_LEASE_LABEL,
        );
    }
}
