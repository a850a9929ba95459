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

use crate::error::DialError;

/// What peer links take from the agent streams' settings.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LinkSettings {
    pub(crate) flow: tether_tunnel::FlowConfig,
    /// `--keepalive-time` and the PING flags: a silent peer is given up as an agent is.
    pub(crate) keepalive: Option<tether_conn::Keepalive>,
    /// `--backend-dial-timeout`: how long a forwarded dial may take, each way.
    pub(crate) dial_timeout: std::time::Duration,
}

/// The ALPN protocol id of a peer link, the only one the peer port accepts.
pub const PEER_ALPN: &[u8] = b"tether-peer/1";

/// How a server refuses a link from itself (its own address among its peers').
const ITSELF: &str = "this is the server itself";

/// How a server refuses a second link from a peer it is linked to (two addresses of one
/// peer): the link it holds stays, rather than the two replacing each other.
const ALREADY_LINKED: &str = "already linked to this peer server";

/// How a forwarded dial's answer begins when the agent's server refused it itself (the
/// client's tenant, destination policy or limits there, or an agent it no longer holds),
/// so that the dialing server does not hold it against the agent.
const REFUSED_BY_HOLDER: &str = "refused by the agent's server: ";

/// Whether a forwarded dial's answer says the holder no longer holds the agent: its
/// announcement that the agent left is on its way, and another route may serve the dial.
pub(crate) fn holder_lacks_agent(error: &DialError) -> bool {
    matches!(error, DialError::Endpoint(text)
        if text.strip_prefix(REFUSED_BY_HOLDER) == Some(DialError::NoAgent.to_string().as_str()))
}

/// A peer link's table bounds. Pending dials cover every agent of the peer, not one; the
/// packets for unknown connections that races leave (a late answer, data after a close)
/// add up over a link that lives for weeks and are no sign of attack from an authenticated
/// member of the fleet, so they are not counted against it. The other bounds are an agent
/// stream's.
fn link_limits() -> tether_tunnel::Limits {
    tether_tunnel::Limits {
        max_pending_dials: 65_536,
        max_unknown_packets: u64::MAX,
        ..tether_tunnel::Limits::default()
    }
}

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
