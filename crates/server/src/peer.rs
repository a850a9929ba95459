//! Server peering (`--peer-port`): the servers of one fleet link to each other, so that a
//! dial reaches an agent whichever server the client is connected to, while each agent
//! holds streams to only a few of them (the agent's `--agent-server-connections`).
//!
//! - `outbound`: this server keeps a link to every peer it knows; over it, it announces
//!   the agents it holds (`announce`) and answers the dials the peer forwards to them
//!   (`forward`), checking each again as its own client's (`origin`).
//! - `inbound`: it accepts the same links from its peers; their agents join its
//!   registries as remote routes, which selection weighs with its own agents, and which
//!   are dialed over the link.
//!
//! Links are tether's native link over mutual TLS on a port of their own, where each end
//! shows a certificate of the fleet's peer CA naming `--peer-name`. A link carries dials
//! one way: the peer that connected holds the agents. Two servers thus share two links.

pub(crate) mod announce;
pub(crate) mod forward;
pub(crate) mod inbound;
pub(crate) mod origin;
pub(crate) mod outbound;

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::watch;

/// The ALPN protocol id of a peer link, the only one the peer port accepts.
pub const PEER_ALPN: &[u8] = b"tether-peer/1";

/// How a server refuses a link from itself (its own address among its peers').
const ITSELF: &str = "this is the server itself";

/// Server peering's settings.
#[derive(Clone, Debug)]
pub struct PeerConfig {
    /// `--peer-bind-address`, `--peer-port`: where peers' links are accepted.
    pub listen: SocketAddr,
    /// The peer port's TLS: this server's peer certificate, peers' certificates required
    /// and verified against `--peer-ca-cert`, ALPN [`PEER_ALPN`].
    pub server_tls: Arc<rustls::ServerConfig>,
    /// Links to peers: `--peer-ca-cert` as roots, the peer certificate as client
    /// certificate, ALPN [`PEER_ALPN`].
    pub client_tls: Arc<rustls::ClientConfig>,
    /// `--peer-name`: the name every peer's certificate carries, verified both ways.
    pub name: String,
    /// The peers' link addresses (this server's own among them is skipped): a fixed list,
    /// or what the fleet's Leases publish.
    pub addresses: watch::Receiver<BTreeSet<SocketAddr>>,
}
