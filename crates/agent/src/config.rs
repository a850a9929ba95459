//! The agent's validated configuration, as the binary's flags build it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tether_grpc::Keepalive;
use tether_proto::Labels;
use tether_tunnel::FlowConfig;

use crate::control_plane_config::ControlPlaneConfig;
use crate::destination::DestinationConfig;
use crate::egress_proxy;
use crate::server_count::LeaseCounting;

/// A validated agent configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// `--proxy-server-host`: dialed for every server connection (normally a load balancer),
    /// or, with discovery, the name TLS verifies (and DNS discovery looks up).
    pub server_host: String,
    pub server_port: u16,
    /// `--server-discovery` and `--proxy-server-addresses`: how the servers are found.
    pub discovery: crate::discovery::Discovery,
    /// `--agent-server-connections`: hold streams to this many servers only, chosen by
    /// rendezvous hashing (for fleets whose servers peer); `None` holds every server.
    pub server_connections: Option<std::num::NonZeroUsize>,
    /// `--transport=websocket`: the native link in WebSocket messages, upgraded at this
    /// request path (`--websocket-path`).
    pub websocket_path: Option<String>,
    /// `--https-proxy` or `HTTPS_PROXY`/`NO_PROXY`: directly, or through this proxy.
    pub egress: egress_proxy::Egress,
    /// TLS to the server; ALPN must include `h2`, or be `http/1.1` with `websocket_path`.
    pub tls: Arc<rustls::ClientConfig>,
    /// When set, replaces `tls`: rebuilt from its files (client certificate, key, CA)
    /// whenever they changed, checked before every new server connection.
    pub tls_reload: Option<Arc<tether_tls::Reloading<rustls::ClientConfig>>>,
    pub agent_id: String,
    /// `--agent-identifiers`, already validated; sent as is.
    pub identifiers: String,
    /// tether's `--agent-labels`: sent as `tether-labels`, which upstream servers ignore.
    pub labels: Labels,
    pub health_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub sync_interval: Duration,
    pub sync_interval_cap: Duration,
    /// Keep dialing for more servers even once the announced count is reached.
    pub sync_forever: bool,
    /// HTTP/2 PINGs to the server. Only used with tether servers: upstream servers punish
    /// pings more often than every 30 s.
    pub keepalive: Option<Keepalive>,
    /// PINGs to an upstream server (from `--keepalive-time`), if any.
    pub legacy_keepalive: Option<Keepalive>,
    /// Deadline for dialing a destination: waiting for a slot, lookup and connect.
    pub dial_timeout: Duration,
    /// The destination policy and the dial and lookup caps.
    pub destinations: DestinationConfig,
    pub flow: FlowConfig,
    /// `--service-account-token-path`: sent as `Bearer` token, re-read on every connect.
    pub token_path: Option<PathBuf>,
    /// `--count-server-leases`: the server count from Leases, kept current by whoever
    /// lists them (the binary runs tether-kube's counter).
    pub lease_counting: Option<LeaseCounting>,
    /// `--audit-log-path`: JSON lines, two per connection (opened, ended) and one per failed
    /// or refused dial.
    pub audit_log: Option<tether_observe::audit::AuditTarget>,
    /// `--control-plane-listen`: carry node-side connections to the control plane.
    pub control_plane: Option<ControlPlaneConfig>,
    /// `--resume-window`: how long a server stream whose transport broke keeps its
    /// connections while the agent reconnects to resume it (tether servers only); zero
    /// turns it off.
    pub resume_window: Duration,
    /// `--drain-timeout`: a draining agent stops once no connection is open, or after this
    /// long at most. `None` keeps upstream's behaviour: it drains and runs until `stop`.
    pub drain_timeout: Option<Duration>,
}
