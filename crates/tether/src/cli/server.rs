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
    DEFAULT_LEASE_LABEL, FlowArgs, GRPC_KEEPALIVE_TIMEOUT, NO_EFFECT, UpstreamOnlyArgs,
    check_listen_port, check_pair, go_bool, go_duration, id_or_random, listen_addr, non_default,
};
use super::klog::KlogArgs;
use security::SecurityArgs;

mod reload;
mod security;

/// What `--backend-dial-timeout=0` means in tether: the Go client's own 30 s backstop, so
/// that no pending dial outlives every client that could still want it.
const DIAL_BACKSTOP: Duration = Duration::from_secs(30);
const DEFAULT_XFR_CHANNEL_SIZE: i64 = 10;

const NOT_IMPLEMENTED: &str = "Not implemented by tether (must keep their defaults)";

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
    /// defaultRoute.
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

    /// Port for the admin endpoint (/metrics): 1024-49151, or 0 for a free port.
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

    /// Agent token authentication: expected ServiceAccount namespace.
    #[arg(long, help_heading = NOT_IMPLEMENTED, value_name = "NAMESPACE", default_value = "")]
    agent_namespace: String,

    /// Agent token authentication: expected ServiceAccount name.
    #[arg(long, help_heading = NOT_IMPLEMENTED, value_name = "NAME", default_value = "")]
    agent_service_account: String,

    /// Agent token authentication: expected token audience.
    #[arg(long, help_heading = NOT_IMPLEMENTED, value_name = "AUDIENCE", default_value = "")]
    authentication_audience: String,

    /// Publish and garbage-collect proxy server Leases.
    #[arg(long, help_heading = NOT_IMPLEMENTED, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    enable_lease_controller: bool,

    #[command(flatten)]
    pub(crate) upstream_only: UpstreamOnlyArgs,

    /// Kubernetes client QPS.
    #[arg(long, help_heading = NO_EFFECT, value_name = "QPS", default_value_t = 0.0)]
    kubeconfig_qps: f32,

    /// Kubernetes client burst.
    #[arg(long, help_heading = NO_EFFECT, value_name = "N", default_value_t = 0)]
    kubeconfig_burst: i64,

    /// Labels of proxy server Leases.
    #[arg(long, help_heading = NO_EFFECT, value_name = "LABELS", default_value = DEFAULT_LEASE_LABEL)]
    lease_label: String,

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
    /// Validates the flags and builds the server's configuration, loading every TLS file.
    /// Flags that tether accepts but ignores are reported in one warning.
    pub(crate) fn into_config(self) -> anyhow::Result<Config> {
        self.refuse_unimplemented()?;
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
        let strategies = Strategy::parse_list(&self.proxy_strategies)
            .map_err(|e| anyhow::anyhow!("--proxy-strategies: {e}"))?;
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
        let frontend = self.frontend(mode, &tls)?;
        let agent_tls = self.agent_tls(&tls)?;
        let limits = self.security.limits()?;
        let tls_reload = self.tls_reload(mode, &tls, self.security.tls_reload_interval())?;
        let ignored = self.ignored();
        if !ignored.is_empty() {
            tracing::warn!(
                "ignoring flags that have no effect in tether: {}",
                ignored.join(" ")
            );
        }

        Ok(Config {
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
            server_id: id_or_random(self.server_id),
            server_count: self.server_count,
            strategies,
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
            match_agent_identity_to_certificate: self
                .security
                .match_agent_identity_to_certificate(),
            tls_reload,
            audit_log: self.security.audit_log(),
        })
    }

    /// Fails on features tether does not implement, rather than silently running without
    /// them: an operator relying on token authentication must not get an open agent port.
    fn refuse_unimplemented(&self) -> anyhow::Result<()> {
        for (flag, value) in [
            ("--agent-namespace", &self.agent_namespace),
            ("--agent-service-account", &self.agent_service_account),
            ("--authentication-audience", &self.authentication_audience),
        ] {
            if !value.is_empty() {
                bail!(
                    "{flag}: agent ServiceAccount token authentication is not implemented by \
                     tether; authenticate agents with client certificates (--cluster-ca-cert)"
                );
            }
        }
        if self.enable_lease_controller {
            bail!(
                "--enable-lease-controller: server Leases are not implemented by tether; \
                 set --server-count instead"
            );
        }
        Ok(())
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

    fn agent_tls(&self, tls: &TlsOptions) -> anyhow::Result<Arc<rustls::ServerConfig>> {
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
            .check_agent_authentication(&self.cluster_ca_cert)?;
        let ca = (!self.cluster_ca_cert.is_empty()).then(|| Path::new(&self.cluster_ca_cert));
        if ca.is_none() {
            tracing::warn!(
                "--allow-unauthenticated-agents: any client reaching the agent port may register as an agent"
            );
        }
        tether_tls::server_config(
            Path::new(&self.cluster_cert),
            Path::new(&self.cluster_key),
            ca,
            &[b"h2"],
            tls,
        )
        .context("--cluster-cert/--cluster-key/--cluster-ca-cert")
    }

    /// Accepted flags set to values that would matter upstream but do nothing here.
    fn ignored(&self) -> Vec<String> {
        let mut ignored = Vec::new();
        self.upstream_only.ignored(&mut ignored);
        non_default(&mut ignored, "--kubeconfig-qps", self.kubeconfig_qps, 0.0);
        non_default(&mut ignored, "--kubeconfig-burst", self.kubeconfig_burst, 0);
        non_default(
            &mut ignored,
            "--lease-label",
            self.lease_label.as_str(),
            DEFAULT_LEASE_LABEL,
        );
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
