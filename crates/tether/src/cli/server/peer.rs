//! tether's server peering flags: `--peer-port`, the mutual TLS of peer links, and where
//! the peers are (`--peer-addresses`, or the fleet's Leases with `--lease-peer-address`).
//! Off by default: without `--peer-port` no port opens and no peer is dialed.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::bail;
use clap::Args;
use tether_server::PEER_ALPN;
use tether_tls::TlsOptions;
use tokio::sync::watch;

use crate::cli::common::{address_list, check_listen_port, listen_addr};

const HEADING: &str = "Server peering (tether)";

#[derive(Args, Clone, Debug)]
pub(crate) struct PeerArgs {
    /// The port the fleet's other servers link to (server peering): a client of any server
    /// then reaches every agent, which may hold streams to only some servers
    /// (--agent-server-connections on the agent). 0: off, and no port opens.
    #[arg(long, help_heading = HEADING, value_name = "PORT", default_value_t = 0)]
    peer_port: u16,

    /// The address the peer port listens on; empty: every address.
    #[arg(long, help_heading = HEADING, value_name = "IP", default_value = "")]
    peer_bind_address: String,

    /// This server's certificate (PEM) on peer links, shown on both sides of each: it
    /// must carry --peer-name as a DNS (or IP) subjectAltName and allow serverAuth and
    /// clientAuth.
    #[arg(long, help_heading = HEADING, value_name = "PATH", default_value = "")]
    peer_cert_file: String,

    /// The private key (PEM) of --peer-cert-file.
    #[arg(long, help_heading = HEADING, value_name = "PATH", default_value = "")]
    peer_key_file: String,

    /// The CA bundle that issued the fleet's peer certificates: a peer's certificate must
    /// chain to it and name --peer-name.
    #[arg(long, help_heading = HEADING, value_name = "PATH", default_value = "")]
    peer_ca_cert: String,

    /// The name every peer certificate carries as a DNS (or IP) subjectAltName: what makes
    /// a server a member of this fleet.
    #[arg(long, help_heading = HEADING, value_name = "NAME", default_value = "tether-peer")]
    peer_name: String,

    /// The peers' addresses, IP[:PORT] comma-separated (the port defaults to --peer-port);
    /// this server's own may be among them. Or let the Leases say (--lease-peer-address).
    #[arg(long, help_heading = HEADING, value_name = "ADDRESSES", default_value = "")]
    peer_addresses: String,
}

/// Server peering's settings, validated, with its TLS files loaded.
#[derive(Debug)]
pub(crate) struct Peering {
    pub(crate) config: tether_server::PeerConfig,
    /// Where the peers' addresses come from when the Leases tell them: the Lease tasks
    /// publish every listing here.
    pub(crate) from_leases: Option<Arc<watch::Sender<BTreeSet<SocketAddr>>>>,
}

impl PeerArgs {
    /// `None` without --peer-port. `lease_peer_address` is whether --lease-peer-address
    /// was given (validated with the Lease flags).
    pub(crate) fn peering(
        &self,
        tls: &TlsOptions,
        lease_peer_address: bool,
    ) -> anyhow::Result<Option<Peering>> {
        let files = [
            ("--peer-cert-file", &self.peer_cert_file),
            ("--peer-key-file", &self.peer_key_file),
            ("--peer-ca-cert", &self.peer_ca_cert),
        ];
        if self.peer_port == 0 {
            let given = files
                .iter()
                .map(|(flag, value)| (*flag, !value.is_empty()))
                .chain([
                    ("--peer-addresses", !self.peer_addresses.is_empty()),
                    ("--peer-bind-address", !self.peer_bind_address.is_empty()),
                ]);
            for (flag, set) in given {
                if set {
                    bail!("{flag} is a server peering setting: it needs --peer-port");
                }
            }
            return Ok(None);
        }
        check_listen_port("--peer-port", self.peer_port)?;
        for (flag, value) in files {
            if value.is_empty() {
                bail!(
                    "--peer-port needs {flag}: peer links are mutual TLS, each server showing a certificate of the fleet's peer CA that names --peer-name"
                );
            }
        }
        if rustls::pki_types::ServerName::try_from(self.peer_name.as_str()).is_err() {
            bail!(
                "--peer-name must be a DNS name or an IP address, got {:?}",
                self.peer_name
            );
        }
        let (addresses, from_leases) = match (self.peer_addresses.is_empty(), lease_peer_address) {
            (false, false) => {
                let list = address_list(
                    "--peer-addresses",
                    &self.peer_addresses,
                    self.peer_port,
                    "peers are listed by address",
                )?;
                (watch::channel(list).1, None)
            }
            (true, true) => {
                let (sender, receiver) = watch::channel(BTreeSet::new());
                (receiver, Some(Arc::new(sender)))
            }
            (false, true) => bail!(
                "--peer-addresses lists the peers, --lease-peer-address finds them in the Leases: give one of them"
            ),
            (true, false) => bail!(
                "--peer-port needs its peers: --peer-addresses=IP[:PORT],..., or --enable-lease-controller with --lease-peer-address=IP (in a pod: $(POD_IP))"
            ),
        };
        let cert = std::path::Path::new(&self.peer_cert_file);
        let key = std::path::Path::new(&self.peer_key_file);
        let ca = std::path::Path::new(&self.peer_ca_cert);
        let server_tls = tether_tls::server_config(cert, key, Some(ca), &[PEER_ALPN], tls)
            .map_err(|e| {
                anyhow::anyhow!("--peer-cert-file, --peer-key-file, --peer-ca-cert: {e}")
            })?;
        let client_tls =
            tether_tls::client_config(ca, Some((cert, key)), vec![PEER_ALPN.to_vec()], tls)
                .map_err(|e| {
                    anyhow::anyhow!("--peer-cert-file, --peer-key-file, --peer-ca-cert: {e}")
                })?;
        Ok(Some(Peering {
            config: tether_server::PeerConfig {
                listen: listen_addr(
                    "--peer-bind-address",
                    &self.peer_bind_address,
                    self.peer_port,
                )?,
                server_tls,
                client_tls,
                name: self.peer_name.clone(),
                addresses,
            },
            from_leases,
        }))
    }

    /// `--peer-port`, the default port of `--lease-peer-address`.
    pub(crate) fn port(&self) -> u16 {
        self.peer_port
    }
}
