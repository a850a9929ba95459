//! `tether agent`: upstream `proxy-agent`'s flags, mapped onto [`tether_agent::Config`].
//!
//! Every upstream flag is accepted with upstream's default, so that upstream's integration
//! test runner, which passes all of them as `--name=value`, can start tether in place of the
//! Go agent. Validation follows upstream's `GrpcProxyAgentOptions.Validate`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{ArgAction, Args, ValueEnum};
use tether_agent::egress_proxy::{
    self, Egress, EgressProxy, ProxyEnvironment, ProxyScheme, ProxySetting,
};
use tether_agent::{Config, DestinationConfig, Discovery};
use tether_grpc::Keepalive;
use tether_proto::Labels;
use tether_proto::identifiers::Identifiers;
use tether_tls::TlsOptions;

use super::common::{
    FlowArgs, GRPC_KEEPALIVE_TIMEOUT, NO_EFFECT, UpstreamOnlyArgs, check_pair, go_bool,
    go_duration, id_or_random, ignored_unless, listen_addr, non_default,
};
use super::klog::KlogArgs;
use super::kube::KubeconfigArgs;
pub(crate) use lease::AgentLeases;
use lease::LeaseArgs;

mod lease;

const DEFAULT_XFR_CHANNEL_SIZE: i64 = 150;
/// A node's clients of the API server keep a handful of long-lived connections each; this
/// leaves room for hundreds of them and still bounds the agent's descriptors.
const DEFAULT_CONTROL_PLANE_MAX_CONNECTIONS: u32 = 1000;

#[derive(Args, Clone, Debug)]
#[command(args_override_self = true)]
pub(crate) struct AgentArgs {
    /// Proxy server host (normally a load balancer in front of every server).
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "HOST",
        default_value = "127.0.0.1"
    )]
    proxy_server_host: String,

    /// Proxy server's agent port.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "PORT",
        default_value_t = 8091
    )]
    proxy_server_port: u16,

    /// CA bundle that verifies the proxy server; required.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "PATH",
        default_value = ""
    )]
    ca_cert: String,

    /// tether: reach the proxy servers through this HTTP(S) proxy, as
    /// http://[USER:PASSWORD@]HOST[:PORT] or https://...; it overrides HTTPS_PROXY and
    /// NO_PROXY, and `none` connects directly. Empty: HTTPS_PROXY/https_proxy unless
    /// NO_PROXY/no_proxy or loopback excludes the server, as upstream's agent (grpc-go) does.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "URL|none",
        default_value = ""
    )]
    https_proxy: String,

    /// tether: CA bundle that verifies an https:// proxy's certificate (required for one;
    /// system roots are not used).
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "PATH",
        default_value = ""
    )]
    https_proxy_ca_cert: String,

    /// Client certificate (PEM) for mutual TLS; needs --agent-key.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "PATH",
        default_value = ""
    )]
    agent_cert: String,

    /// Client private key (PEM) for mutual TLS; needs --agent-cert.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "PATH",
        default_value = ""
    )]
    agent_key: String,

    /// Extra ALPN protocols offered first, before tether/1 and h2 (comma list; '[]' means
    /// none), to tell proxy connections apart from others sharing the server's address.
    #[arg(long, help_heading = "Servers", value_name = "LIST", action = ArgAction::Append)]
    alpn_proto: Vec<String>,

    /// How to reach the servers. auto: offer tether's native link (ALPN tether/1) before
    /// gRPC, and each server chooses (tether servers the native link, upstream servers
    /// gRPC); grpc: gRPC over HTTP/2 only, as upstream's agent (for a TLS-terminating
    /// proxy in front of the servers that passes only h2); websocket: the native link in
    /// WebSocket messages after an HTTP/1.1 upgrade (ALPN http/1.1), for an L7 proxy or
    /// Ingress that passes only HTTP/1.1 (tether servers only).
    #[arg(long, help_heading = "Servers", value_enum, default_value_t = Transport::Auto)]
    transport: Transport,

    /// The request path of the WebSocket upgrade (--transport=websocket), for a proxy or
    /// Ingress that routes by path; tether servers accept any.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "PATH",
        default_value = "/"
    )]
    websocket_path: String,

    /// How to find the proxy servers. balancer: dial --proxy-server-host until every server
    /// is held, as upstream's agent (each stream that lands on a server already held is
    /// closed and retried); dns: hold one stream to each A and AAAA record of
    /// --proxy-server-host (a headless Service), looked up again every
    /// --server-discovery-interval; leases: hold one stream to each agent address the
    /// servers' valid Leases publish (needs --count-server-leases, and servers with
    /// --lease-agent-address). TLS verifies --proxy-server-host whichever way.
    #[arg(long, help_heading = "Servers", value_enum, default_value_t = ServerDiscovery::Balancer)]
    server_discovery: ServerDiscovery,

    /// The name --server-discovery=dns looks up (a headless Service of the server pods);
    /// empty: --proxy-server-host. TLS verifies --proxy-server-host either way.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "NAME",
        default_value = ""
    )]
    server_discovery_name: String,

    /// How often --server-discovery=dns looks up its name again.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "5s", value_parser = go_duration)]
    server_discovery_interval: Duration,

    /// The proxy servers' own addresses, IP[:PORT] comma-separated (the port defaults to
    /// --proxy-server-port): one stream is held to each, and TLS verifies
    /// --proxy-server-host. Replaces --server-discovery.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "ADDRESSES",
        default_value = ""
    )]
    proxy_server_addresses: String,

    /// Hold streams to this many servers only, chosen by rendezvous hashing of the agent ID
    /// with the discovered addresses (through a balancer: whichever it picks), so that the
    /// fleet's agents spread evenly over the servers. For fleets whose servers peer
    /// (tether servers with --peer-port): a client of any server then reaches every agent.
    /// 0: every server, as upstream.
    #[arg(long, help_heading = "Servers", value_name = "K", default_value_t = 0)]
    agent_server_connections: usize,

    /// This agent's ID. Default: $PROXY_AGENT_ID, else a random UUID.
    #[arg(
        long,
        help_heading = "Servers",
        env = "PROXY_AGENT_ID",
        value_name = "ID"
    )]
    agent_id: Option<String>,

    /// Identifiers servers may route by, URL-encoded, with the keys host, ipv4, ipv6, cidr
    /// and default-route (e.g. host=node1&ipv4=1.2.3.4&default-route=true); others are
    /// refused.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "QUERY",
        default_value = ""
    )]
    agent_identifiers: String,

    /// tether: the agent's place in the topology, e.g. zone=eu-1a,region=eu-1, for the
    /// server's topology strategy. Sent in a header of its own, which upstream servers ignore.
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "LABELS",
        default_value = ""
    )]
    agent_labels: String,

    /// File holding a ServiceAccount token, sent as a Bearer token (re-read on every
    /// connect).
    #[arg(
        long,
        help_heading = "Servers",
        value_name = "PATH",
        default_value = ""
    )]
    service_account_token_path: String,

    /// Write JSON lines to this file: one when a tunneled connection opens and one when it
    /// ends (with the address actually dialed), and one per failed or refused dial
    /// (appended; `-` is standard output). Empty: off.
    #[arg(
        long,
        help_heading = "Audit (tether)",
        value_name = "PATH",
        default_value = ""
    )]
    audit_log_path: String,

    /// Listen on the node for connections to the control plane and carry each through the
    /// tunnel to a tether server that accepts them (its --control-plane-endpoints):
    /// IP:PORT (for example 127.0.0.1:6443) or unix:/path. Empty: off. Upstream servers
    /// do not offer this; through them the listener carries nothing.
    #[arg(
        long,
        help_heading = "Control plane (tether)",
        value_name = "ADDR",
        default_value = ""
    )]
    control_plane_listen: String,

    /// The control-plane endpoint (HOST:PORT) to ask the server for; it must be in the
    /// server's --control-plane-endpoints. Empty: the server's first (default) endpoint.
    #[arg(
        long,
        help_heading = "Control plane (tether)",
        value_name = "HOST:PORT",
        default_value = ""
    )]
    control_plane_endpoint: String,

    /// Local control-plane connections carried at once; more are closed as they are
    /// accepted (tether_agent_control_plane_dials_total{result="over_limit"}).
    #[arg(
        long,
        help_heading = "Control plane (tether)",
        value_name = "N",
        default_value_t = DEFAULT_CONTROL_PLANE_MAX_CONNECTIONS,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    control_plane_max_connections: u32,

    /// What clients speak on --control-plane-listen: tcp (each connection goes to
    /// --control-plane-endpoint) or http-connect (an HTTPS_PROXY for node components: each
    /// CONNECT names an endpoint, which must be in the server's --control-plane-endpoints).
    #[arg(
        long,
        help_heading = "Control plane (tether)",
        value_name = "tcp|http-connect",
        default_value = "tcp",
        value_parser = ["tcp", "http-connect"]
    )]
    control_plane_protocol: String,

    /// Re-read --ca-cert, --agent-cert and --agent-key before each new server connection
    /// when they changed (certificate rotation without a restart); a file that does not load
    /// keeps the previous ones.
    #[arg(long, help_heading = "TLS (tether)", value_name = "BOOL", default_value = "true", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    tls_reload: bool,

    /// Initial interval between checks that every server is connected; backs off up to
    /// --sync-interval-cap while the server cannot be reached.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "1s", value_parser = go_duration)]
    sync_interval: Duration,

    /// Longest interval between checks that every server is connected.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "10s", value_parser = go_duration)]
    sync_interval_cap: Duration,

    /// Keep dialing for new servers after the announced server count is reached.
    #[arg(long, help_heading = "Servers", value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    sync_forever: bool,

    /// /readyz answers 200 only while every counted server is connected, not one of them
    /// as upstream's: one control-plane node down then makes every agent NotReady.
    #[arg(long, help_heading = "Servers", value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    readiness_requires_all_servers: bool,

    /// After the first SIGTERM or SIGINT (which drains: DRAIN to every server, no new server
    /// connections), exit once no proxied connection is open, or after this long at most.
    /// 0 keeps upstream's behaviour: a draining agent keeps serving, also new dials when
    /// every agent drains, until a second signal.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "0s", value_parser = go_duration)]
    drain_timeout: Duration,

    /// Accepted for compatibility, no effect: upstream polls each connection's state at this
    /// interval; a tether agent notices a broken server stream as it happens.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "1s", value_parser = go_duration)]
    probe_interval: Duration,

    /// Interval of keepalive PINGs to upstream (Go) servers, which punish PINGs more often
    /// than every 30s; 0 disables them. tether pings at most every
    /// --upstream-server-ping-interval.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "1h0m0s", value_parser = go_duration)]
    keepalive_time: Duration,

    /// Longest interval between PINGs to an upstream (Go) server, so that a dead one is found
    /// in under a minute rather than after --keepalive-time. Go servers send GOAWAY to clients
    /// that ping more often than every 30s, so keep it above that.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "35s", value_parser = go_duration)]
    upstream_server_ping_interval: Duration,

    /// Interval of keepalive PINGs to tether servers.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "5s", value_parser = go_duration)]
    server_ping_interval: Duration,

    /// Drop a tether server connection whose PING goes unanswered this long; 0 disables
    /// PINGs to tether servers.
    #[arg(long, help_heading = "Servers", value_name = "DURATION", default_value = "10s", value_parser = go_duration)]
    server_ping_timeout: Duration,

    /// Deadline for dialing a destination (upstream's fixed 5s).
    #[arg(long, help_heading = "Destinations", value_name = "DURATION", default_value = "5s", value_parser = go_duration)]
    dial_timeout: Duration,

    /// Destination policy file: allow/deny rules by CIDR, port and DNS name, checked on
    /// every resolved address after the built-in rules; unmatched addresses are denied.
    /// Reloaded when its content changes (and at SIGHUP): new dials follow it, open connections
    /// it denies are closed; a broken new version keeps the old rules. Empty: no file.
    #[arg(
        long,
        help_heading = "Destinations",
        value_name = "FILE",
        default_value = ""
    )]
    destination_policy: String,

    /// How often the destination policy file is read for changes; SIGHUP reads it at once.
    #[arg(long, help_heading = "Destinations", value_name = "DURATION", default_value = "500ms", value_parser = go_duration)]
    destination_policy_reload_interval: Duration,

    /// Allow the agent node's loopback (127.0.0.0/8, ::1, 0.0.0.0, ::) as a destination.
    /// On for compatibility with tests that dial loopback targets; set to false in
    /// production when nodes run loopback-only services (etcd, kubelet healthz).
    #[arg(long, help_heading = "Destinations", value_name = "BOOL", default_value = "true", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    allow_loopback_destinations: bool,

    /// Allow link-local destinations (169.254.0.0/16, fe80::/10) and fd00:ec2::254, where
    /// cloud metadata services live.
    #[arg(long, help_heading = "Destinations", value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    allow_link_local_destinations: bool,

    /// Dials in progress at once; more wait within their --dial-timeout.
    #[arg(
        long,
        help_heading = "Destinations",
        value_name = "N",
        default_value_t = 256
    )]
    max_concurrent_dials: usize,

    /// DNS lookups in progress at once (each holds a thread until the resolver answers).
    #[arg(
        long,
        help_heading = "Destinations",
        value_name = "N",
        default_value_t = 32
    )]
    max_concurrent_dns_lookups: usize,

    /// Host of /healthz, /readyz and /metrics; empty means all interfaces.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "HOST",
        default_value = ""
    )]
    health_server_host: String,

    /// Port of /healthz, /readyz and /metrics; 0 picks a free port.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "PORT",
        default_value_t = 8093
    )]
    health_server_port: u16,

    /// Bind address of the admin port; empty means all interfaces.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "HOST",
        default_value = "127.0.0.1"
    )]
    admin_bind_address: String,

    /// Admin port: /debug/connections and /debug/agents (`tether connections`, `agents`,
    /// `top`), pprof with --enable-profiling; /metrics redirects to the health port. 0 picks
    /// a free port.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "PORT",
        default_value_t = 8094
    )]
    admin_server_port: u16,

    #[command(flatten)]
    flow: FlowArgs,

    #[command(flatten)]
    pub(crate) leases: LeaseArgs,

    #[command(flatten)]
    pub(crate) upstream_only: UpstreamOnlyArgs,

    #[command(flatten)]
    kube: KubeconfigArgs,

    /// Size of upstream's per-connection channels; tether's per-connection flow control
    /// (--connection-window, --legacy-connection-buffer) replaces them. Must be > 0.
    #[arg(long, help_heading = NO_EFFECT, value_name = "N", default_value_t = DEFAULT_XFR_CHANNEL_SIZE)]
    xfr_channel_size: i64,

    /// Warn before pushing to a full channel (tether has none).
    #[arg(long, help_heading = NO_EFFECT, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    warn_on_channel_limit: bool,

    #[command(flatten)]
    pub(crate) klog: KlogArgs,
}

impl AgentArgs {
    /// The Lease counter's settings, when --count-server-leases is on.
    pub(crate) fn lease_settings(&self) -> anyhow::Result<Option<AgentLeases>> {
        self.leases.settings(self.kube.kubeconfig()?)
    }

    /// When the agent's /readyz answers 200.
    pub(crate) fn readiness(&self) -> tether_agent::Readiness {
        if self.readiness_requires_all_servers {
            tether_agent::Readiness::EveryServer
        } else {
            tether_agent::Readiness::AnyServer
        }
    }

    /// Validates the flags and builds the agent's configuration, loading every TLS file.
    /// Flags that tether accepts but ignores are reported in one warning.
    pub(crate) fn into_config(self) -> anyhow::Result<Config> {
        if self.proxy_server_port == 0 {
            bail!("--proxy-server-port must be greater than 0");
        }
        if self.xfr_channel_size <= 0 {
            bail!(
                "--xfr-channel-size must be greater than 0, got {}",
                self.xfr_channel_size
            );
        }
        self.upstream_only.validate()?;
        let control_plane = self.control_plane()?;
        if self.sync_interval > self.sync_interval_cap {
            bail!(
                "--sync-interval ({}) must not exceed --sync-interval-cap ({})",
                go(self.sync_interval),
                go(self.sync_interval_cap)
            );
        }
        if self.upstream_server_ping_interval < Duration::from_secs(30) {
            bail!(
                "--upstream-server-ping-interval must be at least 30s: Go servers close connections that ping more often"
            );
        }
        if self.server_ping_interval.is_zero() {
            bail!(
                "--server-ping-interval must be greater than 0 (--server-ping-timeout=0 disables PINGs)"
            );
        }
        let counts_leases = self.leases.settings(self.kube.kubeconfig()?)?.is_some();
        if self.max_concurrent_dials == 0 || self.max_concurrent_dns_lookups == 0 {
            bail!("--max-concurrent-dials and --max-concurrent-dns-lookups must be greater than 0");
        }
        if self.destination_policy_reload_interval.is_zero() {
            bail!("--destination-policy-reload-interval must be greater than 0");
        }
        Identifiers::parse_strict(&self.agent_identifiers)
            .map_err(|e| anyhow::anyhow!("--agent-identifiers: {e}"))?;
        let labels = Labels::parse_strict(&self.agent_labels)
            .map_err(|e| anyhow::anyhow!("--agent-labels: {e}"))?;
        let token_path = (!self.service_account_token_path.is_empty())
            .then(|| PathBuf::from(&self.service_account_token_path));
        if let Some(path) = &token_path {
            std::fs::metadata(path).with_context(|| {
                format!("--service-account-token-path: checking {}", path.display())
            })?;
        }
        let websocket_path = self.websocket_path()?;
        let discovery = self.discovery(counts_leases)?;
        let tls = self.tls()?;
        let tls_reload = self.tls_reload()?;
        let egress = self.egress()?;
        let ignored = self.ignored();
        if !ignored.is_empty() {
            tracing::warn!(
                "ignoring flags that have no effect here: {}",
                ignored.join(" ")
            );
        }

        Ok(Config {
            server_host: self.proxy_server_host,
            server_port: self.proxy_server_port,
            discovery,
            server_connections: std::num::NonZeroUsize::new(self.agent_server_connections),
            websocket_path,
            egress,
            tls,
            tls_reload,
            agent_id: id_or_random(self.agent_id),
            identifiers: self.agent_identifiers,
            labels,
            health_addr: listen_addr(
                "--health-server-host",
                &self.health_server_host,
                self.health_server_port,
            )?,
            admin_addr: listen_addr(
                "--admin-bind-address",
                &self.admin_bind_address,
                self.admin_server_port,
            )?,
            sync_interval: self.sync_interval,
            sync_interval_cap: self.sync_interval_cap,
            sync_forever: self.sync_forever,
            keepalive: (!self.server_ping_timeout.is_zero()).then_some(Keepalive {
                interval: self.server_ping_interval,
                timeout: self.server_ping_timeout,
            }),
            legacy_keepalive: (!self.keepalive_time.is_zero()).then_some(Keepalive {
                interval: self.keepalive_time.min(self.upstream_server_ping_interval),
                timeout: GRPC_KEEPALIVE_TIMEOUT,
            }),
            dial_timeout: self.dial_timeout,
            destinations: DestinationConfig {
                policy_file: (!self.destination_policy.is_empty())
                    .then(|| PathBuf::from(&self.destination_policy)),
                reload_interval: self.destination_policy_reload_interval,
                allow_loopback: self.allow_loopback_destinations,
                allow_link_local: self.allow_link_local_destinations,
                max_dials: self.max_concurrent_dials,
                max_lookups: self.max_concurrent_dns_lookups,
            },
            flow: self.flow.to_config()?,
            token_path,
            lease_counting: None,
            audit_log: tether_observe::audit::AuditTarget::from_flag(&self.audit_log_path),
            control_plane,
            resume_window: self.flow.resume_window,
            drain_timeout: (!self.drain_timeout.is_zero()).then_some(self.drain_timeout),
        })
    }

    /// `--websocket-path`, when `--transport=websocket`.
    fn websocket_path(&self) -> anyhow::Result<Option<String>> {
        let path = &self.websocket_path;
        if self.transport != Transport::Websocket {
            if path != "/" {
                bail!("--websocket-path needs --transport=websocket");
            }
            return Ok(None);
        }
        if !path.starts_with('/') || !path.bytes().all(|b| b.is_ascii_graphic()) {
            bail!("--websocket-path must be a request path: '/' then visible ASCII, got {path:?}");
        }
        Ok(Some(path.clone()))
    }

    /// `--server-discovery`, `--server-discovery-name`, `--server-discovery-interval` and
    /// `--proxy-server-addresses`; `counts_leases` is `--count-server-leases`, validated.
    fn discovery(&self, counts_leases: bool) -> anyhow::Result<Discovery> {
        if !self.server_discovery_name.is_empty() && self.server_discovery != ServerDiscovery::Dns {
            bail!(
                "--server-discovery-name is the name --server-discovery=dns looks up: it needs --server-discovery=dns"
            );
        }
        let discovery = if !self.proxy_server_addresses.is_empty() {
            if self.server_discovery != ServerDiscovery::Balancer {
                bail!("--proxy-server-addresses replaces --server-discovery: give one of them");
            }
            Discovery::List(super::common::address_list(
                "--proxy-server-addresses",
                &self.proxy_server_addresses,
                self.proxy_server_port,
                "the servers' name goes in --proxy-server-host",
            )?)
        } else {
            match self.server_discovery {
                ServerDiscovery::Balancer => Discovery::Balancer,
                ServerDiscovery::Dns => {
                    if self.server_discovery_interval < Duration::from_millis(100) {
                        bail!(
                            "--server-discovery-interval must be at least 100ms, got {}",
                            go(self.server_discovery_interval)
                        );
                    }
                    let name = match self.server_discovery_name.as_str() {
                        "" => self.proxy_server_host.clone(),
                        name => name.to_owned(),
                    };
                    Discovery::Dns {
                        name,
                        interval: self.server_discovery_interval,
                    }
                }
                ServerDiscovery::Leases => {
                    if !counts_leases {
                        bail!(
                            "--server-discovery=leases reads the servers' Leases: it needs --count-server-leases (and servers with --lease-agent-address)"
                        );
                    }
                    Discovery::Leases
                }
            }
        };
        if discovery != Discovery::Balancer && self.sync_forever {
            bail!(
                "--sync-forever keeps dialing a balancer for more servers; with --server-discovery or --proxy-server-addresses every server is dialed directly: drop --sync-forever"
            );
        }
        if self.agent_server_connections > 0 && self.sync_forever {
            bail!(
                "--sync-forever keeps dialing for more servers, --agent-server-connections={} holds that many only: give one of them",
                self.agent_server_connections
            );
        }
        Ok(discovery)
    }

    /// `--control-plane-listen` and `--control-plane-endpoint`.
    fn control_plane(&self) -> anyhow::Result<Option<tether_agent::ControlPlaneConfig>> {
        if self.control_plane_listen.is_empty() {
            if !self.control_plane_endpoint.is_empty() {
                bail!("--control-plane-endpoint needs --control-plane-listen");
            }
            if self.control_plane_max_connections != DEFAULT_CONTROL_PLANE_MAX_CONNECTIONS {
                bail!("--control-plane-max-connections needs --control-plane-listen");
            }
            if self.control_plane_protocol != "tcp" {
                bail!("--control-plane-protocol needs --control-plane-listen");
            }
            return Ok(None);
        }
        let listen = self
            .control_plane_listen
            .parse()
            .map_err(|e| anyhow::anyhow!("--control-plane-listen: {e}"))?;
        if !self.control_plane_endpoint.is_empty() {
            tether_server::check_host_port(&self.control_plane_endpoint)
                .map_err(|e| anyhow::anyhow!("--control-plane-endpoint: {e}"))?;
        }
        Ok(Some(tether_agent::ControlPlaneConfig {
            listen,
            endpoint: self.control_plane_endpoint.clone(),
            max_connections: self.control_plane_max_connections as usize,
            protocol: match self.control_plane_protocol.as_str() {
                "http-connect" => tether_agent::ControlPlaneProtocol::HttpConnect,
                _ => tether_agent::ControlPlaneProtocol::Tcp,
            },
        }))
    }

    /// `--https-proxy`, else the environment: directly or through a proxy to the servers.
    fn egress(&self) -> anyhow::Result<Egress> {
        let setting = ProxySetting::parse(&self.https_proxy)
            .map_err(|e| anyhow::anyhow!("--https-proxy: {e}"))?;
        let route = egress_proxy::route(
            &setting,
            &ProxyEnvironment::from_process(),
            &self.proxy_server_host,
            self.proxy_server_port,
        )?;
        let Some(url) = route.proxy else {
            if !self.https_proxy_ca_cert.is_empty() {
                tracing::warn!(why = %route.why, "--https-proxy-ca-cert has no effect: the agent connects to the servers directly");
            }
            tracing::debug!(why = %route.why, "connecting to the proxy servers directly");
            return Ok(Egress::Direct);
        };
        let tls = match url.scheme {
            ProxyScheme::Http => {
                if !self.https_proxy_ca_cert.is_empty() {
                    tracing::warn!(proxy = %url, "--https-proxy-ca-cert has no effect: the proxy is http://");
                }
                None
            }
            ProxyScheme::Https if self.https_proxy_ca_cert.is_empty() => bail!(
                "--https-proxy-ca-cert is required for the https:// proxy {url} (from {}): the CA \
                 bundle that verifies the proxy's certificate (system roots are not used)",
                route.why
            ),
            ProxyScheme::Https => Some(
                tether_tls::client_config(
                    Path::new(&self.https_proxy_ca_cert),
                    None,
                    Vec::new(),
                    &TlsOptions::default(),
                )
                .context("--https-proxy-ca-cert")?,
            ),
        };
        tracing::info!(proxy = %url, from = %route.why, "connecting to the proxy servers through an HTTP proxy");
        let proxy = EgressProxy::new(url, tls).map_err(anyhow::Error::msg)?;
        Ok(Egress::Proxy(Arc::new(proxy)))
    }

    /// `--tls-reload`: the same config, rebuilt when its files change.
    fn tls_reload(
        &self,
    ) -> anyhow::Result<Option<Arc<tether_tls::Reloading<rustls::ClientConfig>>>> {
        if !self.tls_reload {
            return Ok(None);
        }
        let mut files = vec![PathBuf::from(&self.ca_cert)];
        if !self.agent_cert.is_empty() {
            files.extend([
                PathBuf::from(&self.agent_cert),
                PathBuf::from(&self.agent_key),
            ]);
        }
        let this = self.clone();
        let reloading = tether_tls::Reloading::new(files, move || {
            // A TlsError as is: it names the file, and says when a certificate that is not
            // valid yet is worth trying again.
            this.tls().map_err(|e| {
                e.downcast::<tether_tls::TlsError>().unwrap_or_else(|e| {
                    tether_tls::TlsError::Rustls {
                        what: "reloading --ca-cert/--agent-cert/--agent-key",
                        error: rustls::Error::General(format!("{e:#}")),
                    }
                })
            })
        })?;
        Ok(Some(Arc::new(reloading)))
    }

    fn tls(&self) -> anyhow::Result<Arc<rustls::ClientConfig>> {
        check_pair(
            "--agent-key",
            &self.agent_key,
            "--agent-cert",
            &self.agent_cert,
        )?;
        check_pair(
            "--agent-cert",
            &self.agent_cert,
            "--agent-key",
            &self.agent_key,
        )?;
        if self.ca_cert.is_empty() {
            bail!("--ca-cert is required (the CA bundle that verifies the proxy server)");
        }
        let identity = (!self.agent_cert.is_empty())
            .then(|| (Path::new(&self.agent_cert), Path::new(&self.agent_key)));
        tether_tls::client_config(
            Path::new(&self.ca_cert),
            identity,
            alpn(&self.alpn_proto, self.transport),
            &TlsOptions::default(),
        )
        .context("--ca-cert/--agent-cert/--agent-key")
    }

    /// Accepted flags set to values that would matter upstream but do nothing here.
    fn ignored(&self) -> Vec<String> {
        let mut ignored = Vec::new();
        self.upstream_only.ignored(&mut ignored);
        ignored_unless(&mut ignored, "without --count-server-leases", |found| {
            self.leases.ignored(&self.kube, found)
        });
        non_default(
            &mut ignored,
            "--xfr-channel-size",
            self.xfr_channel_size,
            DEFAULT_XFR_CHANNEL_SIZE,
        );
        non_default(
            &mut ignored,
            "--warn-on-channel-limit",
            self.warn_on_channel_limit,
            false,
        );
        ignored.extend(self.klog.ignored());
        ignored
    }
}

/// `--server-discovery`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum ServerDiscovery {
    /// One address, normally a load balancer in front of every server.
    Balancer,
    /// Every address a name resolves to.
    Dns,
    /// The agent addresses in the servers' Leases.
    Leases,
}

/// `--transport`: which links the agent offers its servers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Transport {
    /// The native link and gRPC; the server chooses.
    Auto,
    /// gRPC over HTTP/2 only.
    Grpc,
    /// The native link in WebSocket messages, over HTTP/1.1.
    Websocket,
}

/// ALPN ids to offer: `--alpn-proto`'s extra ids, then `h2` as grpc-go appends it, with
/// the native link's id just before `h2` unless `--transport=grpc`; with
/// `--transport=websocket`, the extra ids then `http/1.1` alone. A TLS router that routes on
/// the extra ids sees them first, as with upstream's agent.
///
/// Values are comma lists, as pflag's string slices. The literal `[]` is what pflag prints
/// for an empty slice, and upstream's test runner passes it back (`--alpn-proto=[]`); Go
/// would offer an ALPN id "[]", which no server expects, so it means "none" here.
fn alpn(values: &[String], transport: Transport) -> Vec<Vec<u8>> {
    let native = tether_proto::link::ALPN;
    let mut ids: Vec<Vec<u8>> = values
        .iter()
        .flat_map(|value| value.split(','))
        .filter(|id| !id.is_empty() && *id != "[]" && id.as_bytes() != native)
        .map(|id| id.as_bytes().to_vec())
        .collect();
    if transport == Transport::Websocket {
        ids.retain(|id| id != b"h2" && id != b"http/1.1");
        ids.push(b"http/1.1".to_vec());
        return ids;
    }
    if !ids.iter().any(|id| id == b"h2") {
        ids.push(b"h2".to_vec());
    }
    if transport == Transport::Auto {
        let h2 = ids.iter().position(|id| id == b"h2").expect("pushed above");
        ids.insert(h2, native.to_vec());
    }
    ids
}

/// A duration as Go prints it, for messages that quote flag values.
fn go(d: Duration) -> String {
    tether_observe::duration::format_go_duration(d)
}

#[cfg(test)]
mod tests;
