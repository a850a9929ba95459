//! `tether server`: upstream `proxy-server`'s flags, mapped onto [`tether_server::Config`].
//!
//! Every upstream flag is accepted with upstream's default. Validation follows upstream's
//! `ProxyRunOptions.Validate`, except that port 0 is allowed (a free port) for tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{ArgAction, Args};
use tether_grpc::Keepalive;
use tether_server::{Config, FrontendListen, Mode, Strategy};
use tether_tls::TlsOptions;

use super::common::{
    FlowArgs, GRPC_KEEPALIVE_TIMEOUT, NO_EFFECT, UpstreamOnlyArgs, check_listen_port, check_pair,
    go_bool, go_duration, id_or_random, ignored_unless, listen_addr, non_default,
};
use super::klog::KlogArgs;
use control_plane::{ControlPlane, ControlPlaneArgs};
use kube_client::KubeClientArgs;
pub(crate) use launch::ServerLaunch;
use lease::LeaseArgs;
pub(crate) use lease::ServerLeases;
use peer::PeerArgs;
use routing::RoutingArgs;
use security::SecurityArgs;
use token_auth::TokenAuthArgs;

mod control_plane;
mod kube_client;
mod launch;
mod lease;
mod peer;
mod reload;
mod routing;
mod security;
mod token_auth;

/// What `--backend-dial-timeout=0` means in tether: the Go client's own 30 s backstop, so
/// that no pending dial outlives every client that could still want it.
const DIAL_BACKSTOP: Duration = Duration::from_secs(30);
const DEFAULT_XFR_CHANNEL_SIZE: i64 = 10;

#[derive(Args, Clone, Debug)]
#[command(args_override_self = true)]
pub(crate) struct ServerArgs {
    /// Frontend protocol: 'grpc' or 'http-connect'.
    #[arg(long, help_heading = "Frontend", default_value = "grpc")]
    mode: String,

    /// Serve the frontend on this Unix socket (no TLS; the socket is mode 0770). Empty means
    /// TCP with mutual TLS.
    #[arg(
        long,
        help_heading = "Frontend",
        value_name = "PATH",
        default_value = ""
    )]
    uds_name: String,

    /// Remove an existing file at --uds-name before listening.
    #[arg(long, help_heading = "Frontend", value_name = "BOOL", default_value = "true", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    delete_existing_uds_file: bool,

    /// Frontend TCP port: 1024-49151, or 0 for a free port; must be 0 with --uds-name.
    #[arg(
        long,
        help_heading = "Frontend",
        value_name = "PORT",
        default_value_t = 8090
    )]
    server_port: u16,

    /// Frontend bind address; empty means all interfaces.
    #[arg(
        long,
        help_heading = "Frontend",
        value_name = "HOST",
        default_value = ""
    )]
    server_bind_address: String,

    /// Frontend TLS certificate (PEM); required for TCP, refused with --uds-name.
    #[arg(
        long,
        help_heading = "Frontend",
        value_name = "PATH",
        default_value = ""
    )]
    server_cert: String,

    /// Frontend TLS private key (PEM); required for TCP, refused with --uds-name.
    #[arg(
        long,
        help_heading = "Frontend",
        value_name = "PATH",
        default_value = ""
    )]
    server_key: String,

    /// CA bundle that verifies frontend clients (kube-apiserver); required for TCP, since
    /// the TCP frontend always uses mutual TLS.
    #[arg(
        long,
        help_heading = "Frontend",
        value_name = "PATH",
        default_value = ""
    )]
    server_ca_cert: String,

    /// Interval of HTTP/2 keepalive PINGs to gRPC frontend clients; 0 disables them.
    #[arg(long, help_heading = "Frontend", value_name = "DURATION", default_value = "1h0m0s", value_parser = go_duration)]
    frontend_keepalive_time: Duration,

    /// Port for agent connections: 1024-49151, or 0 for a free port.
    #[arg(
        long,
        help_heading = "Agents",
        value_name = "PORT",
        default_value_t = 8091
    )]
    agent_port: u16,

    /// Bind address for agent connections; empty means all interfaces.
    #[arg(long, help_heading = "Agents", value_name = "HOST", default_value = "")]
    agent_bind_address: String,

    /// TLS certificate (PEM) of the agent listener; required.
    #[arg(long, help_heading = "Agents", value_name = "PATH", default_value = "")]
    cluster_cert: String,

    /// TLS private key (PEM) of the agent listener; required.
    #[arg(long, help_heading = "Agents", value_name = "PATH", default_value = "")]
    cluster_key: String,

    /// CA bundle that verifies agents' client certificates. Required, unless
    /// --allow-unauthenticated-agents.
    #[arg(long, help_heading = "Agents", value_name = "PATH", default_value = "")]
    cluster_ca_cert: String,

    /// Upper bound on the interval of keepalive PINGs to agents (see --agent-ping-interval).
    #[arg(long, help_heading = "Agents", value_name = "DURATION", default_value = "1h0m0s", value_parser = go_duration)]
    keepalive_time: Duration,

    /// How often to PING each agent connection (at most every --keepalive-time), so that a
    /// vanished agent is noticed and no longer picked for dials.
    #[arg(long, help_heading = "Agents", value_name = "DURATION", default_value = "5s", value_parser = go_duration)]
    agent_ping_interval: Duration,

    /// Drop an agent connection whose PING goes unanswered this long; 0 disables PINGs.
    #[arg(long, help_heading = "Agents", value_name = "DURATION", default_value = "10s", value_parser = go_duration)]
    agent_ping_timeout: Duration,

    /// End an agent stream that carries connections or dials, and them with it, when its
    /// agent sends nothing at all for this long (its node is gone, or the network to it is
    /// cut): no --resume-window on top. While a stream is busy its agent is PINGed every
    /// second, so a live one is heard several times within it. 0 waits for
    /// --agent-ping-timeout and then the resume window instead.
    #[arg(long, help_heading = "Agents", value_name = "DURATION", default_value = "4s", value_parser = go_duration)]
    dead_agent_timeout: Duration,

    /// This server's ID, sent to agents. Default: $PROXY_SERVER_ID, else a random UUID.
    #[arg(
        long,
        help_heading = "Agents",
        env = "PROXY_SERVER_ID",
        value_name = "ID"
    )]
    server_id: Option<String>,

    /// Number of proxy server instances agents should connect to (more than 1 for HA).
    #[arg(long, help_heading = "Agents", value_name = "N", default_value_t = 1)]
    server_count: u32,

    /// How to pick an agent for a dial, in order: comma list of default, destHost,
    /// defaultRoute, and tether's topology, destCIDR, leastLoaded.
    #[arg(
        long,
        help_heading = "Agents",
        value_name = "LIST",
        default_value = "default"
    )]
    proxy_strategies: String,

    /// How long a dial may wait for the agent's answer. 0 means tether's backstop, 30s (the
    /// Go client's own), so that no pending dial lives forever.
    #[arg(long, help_heading = "Agents", value_name = "DURATION", default_value = "0s", value_parser = go_duration)]
    backend_dial_timeout: Duration,

    /// Port for /healthz, /readyz and /metrics: 1024-49151, or 0 for a free port.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "PORT",
        default_value_t = 8092
    )]
    health_port: u16,

    /// Bind address of the health port; empty means all interfaces.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "HOST",
        default_value = ""
    )]
    health_bind_address: String,

    /// Port for the admin endpoint: /metrics, /debug/connections and /debug/agents (`tether
    /// connections`, `agents`, `top`), and pprof with --enable-profiling. 1024-49151, or 0
    /// for a free port.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "PORT",
        default_value_t = 8095
    )]
    admin_port: u16,

    /// Bind address of the admin port; empty means all interfaces.
    #[arg(
        long,
        help_heading = "Endpoints",
        value_name = "HOST",
        default_value = "127.0.0.1"
    )]
    admin_bind_address: String,

    /// Comma list of Go names of the TLS 1.2 cipher suites to allow (no effect on TLS 1.3);
    /// empty allows rustls' defaults.
    #[arg(long, help_heading = "TLS", value_name = "LIST", action = ArgAction::Append)]
    cipher_suites: Vec<String>,

    /// Minimum TLS version: VersionTLS12 or VersionTLS13 (VersionTLS10/11 mean 1.2, with a
    /// warning). Empty means VersionTLS12.
    #[arg(long, help_heading = "TLS", value_name = "VERSION", default_value = "")]
    tls_min_version: String,

    /// On shutdown, how long live connections may continue; 0 ends them at once.
    #[arg(long, help_heading = "Shutdown", value_name = "DURATION", default_value = "0s", value_parser = go_duration)]
    graceful_shutdown_timeout: Duration,

    #[command(flatten)]
    flow: FlowArgs,

    // Boxed: the hardening flags would make `ServerArgs` much the largest command.
    #[command(flatten)]
    security: Box<SecurityArgs>,

    #[command(flatten)]
    token_auth: TokenAuthArgs,

    #[command(flatten)]
    routing: RoutingArgs,

    #[command(flatten)]
    control_plane: ControlPlaneArgs,

    #[command(flatten)]
    kube: KubeClientArgs,

    #[command(flatten)]
    pub(crate) leases: LeaseArgs,

    #[command(flatten)]
    peer: PeerArgs,

    #[command(flatten)]
    pub(crate) upstream_only: UpstreamOnlyArgs,

    /// Size of upstream's per-stream channels; tether's per-connection flow control
    /// (--connection-window, --legacy-connection-buffer) replaces them. Must be > 0.
    #[arg(long, help_heading = NO_EFFECT, value_name = "N", default_value_t = DEFAULT_XFR_CHANNEL_SIZE)]
    xfr_channel_size: i64,

    /// Deprecated upstream, and a no-op there too.
    #[arg(long, hide = true, value_name = "BOOL", default_value = "true", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    warn_on_channel_limit: bool,

    #[command(flatten)]
    pub(crate) klog: KlogArgs,
}

impl ServerArgs {
    /// [`into_launch`](Self::into_launch)'s configuration alone, for flag tests.
    #[cfg(test)]
    pub(crate) fn into_config(self) -> anyhow::Result<Config> {
        self.into_launch().map(|launch| launch.config)
    }

    /// Validates the flags and builds the server's configuration, loading every TLS file,
    /// plus what needs the Kubernetes API. Flags that tether accepts but ignores are
    /// reported in one warning.
    pub(crate) fn into_launch(self) -> anyhow::Result<ServerLaunch> {
        let token_auth = self.token_auth.validate(&self.cluster_ca_cert)?;
        let routing = self.routing.routing()?;
        let account = token_auth.as_ref().map(|t| t.account.clone());
        routing::check_service_accounts(&routing, account.as_ref())?;
        let mut leases = self.leases.settings(self.agent_port, self.peer.port())?;
        let control_plane = self.control_plane.endpoints()?;
        let kube =
            (token_auth.is_some() || leases.is_some() || control_plane == ControlPlane::Kubeconfig)
                .then(|| self.kube.options())
                .transpose()?;
        let mode: Mode = self
            .mode
            .parse()
            .map_err(|e| anyhow::anyhow!("--mode: {e}"))?;
        self.upstream_only.validate()?;
        if self.xfr_channel_size <= 0 {
            bail!(
                "--xfr-channel-size must be greater than 0, got {}",
                self.xfr_channel_size
            );
        }
        if self.server_count == 0 {
            bail!("--server-count must be at least 1");
        }
        if self.agent_ping_interval.is_zero() {
            bail!(
                "--agent-ping-interval must be greater than 0 (--agent-ping-timeout=0 disables PINGs)"
            );
        }
        if self.agent_ping_timeout.is_zero() && !self.dead_agent_timeout.is_zero() {
            bail!(
                "--dead-agent-timeout needs PINGs to agents, which --agent-ping-timeout=0 turns \
                 off: without them a live agent with an idle connection sends nothing and would be \
                 taken for dead. Set --dead-agent-timeout=0 as well, or keep PINGs on"
            );
        }
        let strategies = Strategy::parse_list(&self.proxy_strategies)
            .map_err(|e| anyhow::anyhow!("--proxy-strategies: {e}"))?;
        routing::check_zones(&routing, &strategies, &self.proxy_strategies)?;
        for (flag, port) in [
            ("--agent-port", self.agent_port),
            ("--health-port", self.health_port),
            ("--admin-port", self.admin_port),
        ] {
            check_listen_port(flag, port)?;
        }

        let (tls, warning) =
            TlsOptions::from_go_flags(&self.tls_min_version, &self.cipher_suites.join(","))
                .context("--tls-min-version/--cipher-suites")?;
        if let Some(warning) = warning {
            tracing::warn!("{warning}");
        }
        let peering = self.peer.peering(
            &tls,
            leases.as_ref().is_some_and(|l| l.peer_address.is_some()),
        )?;
        if let (Some(leases), Some(peering)) = (&mut leases, &peering) {
            leases.peers = peering.from_leases.clone();
        }
        let frontend = self.frontend(mode, &tls)?;
        let agent_tls = self.agent_tls(&tls, token_auth.is_some())?;
        let limits = tether_server::Limits {
            max_reverse_connections_per_stream: self.control_plane.max_connections_per_stream()?,
            ..self.security.limits()?
        };
        let agent_identity_binding = self.security.identity_binding(
            &self.cluster_ca_cert,
            token_auth.is_some(),
            token_auth.as_ref().and_then(|t| t.match_host_to_node),
        )?;
        let tls_reload = self.tls_reload(mode, &tls, self.security.tls_reload_interval())?;
        let server_id = id_or_random(self.server_id.clone());
        if self.leases.enabled() {
            tether_kube::lease::check_server_id(&server_id).map_err(|e| {
                anyhow::anyhow!("--server-id (with --enable-lease-controller): {e}")
            })?;
        }
        let ignored = self.ignored(kube.is_some());
        if !ignored.is_empty() {
            tracing::warn!(
                "ignoring flags that have no effect here: {}",
                ignored.join(" ")
            );
        }

        let config = Config {
            mode,
            frontend,
            agent_addr: listen_addr(
                "--agent-bind-address",
                &self.agent_bind_address,
                self.agent_port,
            )?,
            agent_tls,
            health_addr: listen_addr(
                "--health-bind-address",
                &self.health_bind_address,
                self.health_port,
            )?,
            admin_addr: listen_addr(
                "--admin-bind-address",
                &self.admin_bind_address,
                self.admin_port,
            )?,
            server_id,
            server_count: self.server_count,
            strategies,
            routing,
            routing_reload: None,
            dial_timeout: if self.backend_dial_timeout.is_zero() {
                DIAL_BACKSTOP
            } else {
                self.backend_dial_timeout
            },
            graceful_shutdown_timeout: self.graceful_shutdown_timeout,
            flow: self.flow.to_config()?,
            agent_keepalive: (!self.agent_ping_timeout.is_zero()).then(|| Keepalive {
                // Upstream's --keepalive-time=0 means grpc-go's default, not "never".
                interval: match self.keepalive_time {
                    Duration::ZERO => self.agent_ping_interval,
                    limit => self.agent_ping_interval.min(limit),
                },
                timeout: self.agent_ping_timeout,
            }),
            frontend_keepalive: (!self.frontend_keepalive_time.is_zero()).then_some(Keepalive {
                interval: self.frontend_keepalive_time,
                timeout: GRPC_KEEPALIVE_TIMEOUT,
            }),
            limits,
            agent_identity_binding,
            tls_reload,
            audit_log: self.security.audit_log(),
            // Needs the Kubernetes client, which ServerLaunch::start builds.
            agent_token_auth: None,
            control_plane: match &control_plane {
                ControlPlane::Listed(list) => Some(list.clone()),
                ControlPlane::Kubeconfig | ControlPlane::Off => None,
            },
            resume_window: self.flow.resume_window,
            dead_agent_timeout: (!self.dead_agent_timeout.is_zero())
                .then_some(self.dead_agent_timeout),
            peering: peering.map(|p| p.config),
        };
        let routing_file = self.routing.path().map(|path| routing::RoutingFile {
            path: path.to_owned(),
            checks: routing::RoutingChecks {
                account,
                strategies: config.strategies.clone(),
                strategies_flag: self.proxy_strategies.clone(),
                server: Box::new(config.clone()),
            },
        });
        Ok(ServerLaunch {
            config,
            routing_file,
            kube,
            token_auth,
            leases,
            control_plane_from_kubeconfig: control_plane == ControlPlane::Kubeconfig,
        })
    }

    fn frontend(&self, mode: Mode, tls: &TlsOptions) -> anyhow::Result<FrontendListen> {
        if !self.uds_name.is_empty() {
            if self.server_port != 0 {
                bail!(
                    "--server-port must be 0 with --uds-name, got {}",
                    self.server_port
                );
            }
            for (flag, value) in [
                ("--server-cert", &self.server_cert),
                ("--server-key", &self.server_key),
                ("--server-ca-cert", &self.server_ca_cert),
            ] {
                if !value.is_empty() {
                    bail!("{flag} must not be set with --uds-name (the Unix socket has no TLS)");
                }
            }
            return Ok(FrontendListen::Unix {
                path: PathBuf::from(&self.uds_name),
                delete_existing: self.delete_existing_uds_file,
            });
        }
        check_pair(
            "--server-key",
            &self.server_key,
            "--server-cert",
            &self.server_cert,
        )?;
        check_pair(
            "--server-cert",
            &self.server_cert,
            "--server-key",
            &self.server_key,
        )?;
        for (flag, value) in [
            ("--server-cert", &self.server_cert),
            ("--server-key", &self.server_key),
            ("--server-ca-cert", &self.server_ca_cert),
        ] {
            if value.is_empty() {
                bail!("{flag} is required for a TCP frontend (mutual TLS), or set --uds-name");
            }
        }
        check_listen_port("--server-port", self.server_port)?;
        let alpn: &[u8] = match mode {
            Mode::Grpc => b"h2",
            // Upstream empties TLSNextProto: HTTP CONNECT is HTTP/1.1 only.
            Mode::HttpConnect => b"http/1.1",
        };
        let config = tether_tls::server_config(
            Path::new(&self.server_cert),
            Path::new(&self.server_key),
            Some(Path::new(&self.server_ca_cert)),
            &[alpn],
            tls,
        )
        .context("--server-cert/--server-key/--server-ca-cert")?;
        Ok(FrontendListen::Tls {
            addr: listen_addr(
                "--server-bind-address",
                &self.server_bind_address,
                self.server_port,
            )?,
            tls: config,
        })
    }

    fn agent_tls(
        &self,
        tls: &TlsOptions,
        token_auth: bool,
    ) -> anyhow::Result<Arc<rustls::ServerConfig>> {
        check_pair(
            "--cluster-key",
            &self.cluster_key,
            "--cluster-cert",
            &self.cluster_cert,
        )?;
        check_pair(
            "--cluster-cert",
            &self.cluster_cert,
            "--cluster-key",
            &self.cluster_key,
        )?;
        if self.cluster_cert.is_empty() {
            bail!("--cluster-cert and --cluster-key are required (TLS of the agent listener)");
        }
        self.security
            .check_agent_authentication(&self.cluster_ca_cert, token_auth)?;
        let ca = (!self.cluster_ca_cert.is_empty()).then(|| Path::new(&self.cluster_ca_cert));
        if ca.is_none() && !token_auth {
            tracing::warn!(
                "--allow-unauthenticated-agents: any client reaching the agent port may register as an agent"
            );
        }
        tether_tls::server_config(
            Path::new(&self.cluster_cert),
            Path::new(&self.cluster_key),
            ca,
            &tether_server::AGENT_ALPN,
            tls,
        )
        .context("--cluster-cert/--cluster-key/--cluster-ca-cert")
    }

    /// Accepted flags set to values that would matter upstream but do nothing here.
    fn ignored(&self, kube_client: bool) -> Vec<String> {
        let mut ignored = Vec::new();
        self.upstream_only.ignored(&mut ignored);
        if !kube_client {
            ignored_unless(
                &mut ignored,
                "without token auth, Leases or --control-plane-endpoints=kubeconfig",
                |found| self.kube.ignored(found),
            );
        }
        ignored_unless(&mut ignored, "without --enable-lease-controller", |found| {
            self.leases.ignored(found)
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
            true,
        );
        ignored.extend(self.klog.ignored());
        ignored
    }
}

#[cfg(test)]
mod tests;
