//! tether's own hardening flags of `tether server`: agent authentication, identity binding,
//! deadlines and caps. None exists upstream; each default is the safe choice, and those an
//! upstream deployment may trip over fail with an error naming the flag that restores the old
//! behaviour: agents without client certificates at start-up, and agents whose credential
//! does not prove the identifiers they claim (one certificate shared by all nodes) when they
//! connect.

use std::time::Duration;

use anyhow::bail;
use clap::{ArgAction, Args};
use tether_server::{IdentityBinding, Limits};

use crate::cli::common::{go_bool, go_duration};

const HEADING: &str = "Security (tether)";

fn parse_binding(value: &str) -> Result<IdentityBinding, String> {
    value.parse()
}

#[derive(Args, Clone, Debug)]
pub(crate) struct SecurityArgs {
    /// Accept agents without a client certificate when --cluster-ca-cert is unset. Anyone who
    /// can reach the agent port can then register as an agent and receive dials: lab use only.
    #[arg(long, help_heading = HEADING, value_name = "BOOL", default_value = "false", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    pub(crate) allow_unauthenticated_agents: bool,

    /// Which of an agent's claims its credential must prove. identifiers (default): every
    /// host=, ipv4= and ipv6= identifier (what destHost routes by) is a CN or DNS SAN / an IP
    /// SAN of the agent's client certificate or, with token authentication, the node the
    /// token is bound to / an address of that Node (read from the Kubernetes API: the server
    /// needs `get` on nodes); otherwise the stream is refused PERMISSION_DENIED. all: the
    /// agent ID too. off: any agent credential may claim any node and receive its dials
    /// (upstream's behaviour, for agents that share one certificate); warned at start-up.
    #[arg(long, help_heading = HEADING, value_name = "identifiers|all|off", value_parser = parse_binding)]
    agent_identity_binding: Option<IdentityBinding>,

    /// Deprecated: --agent-identity-binding=all (true) or =off (false).
    #[arg(long, help_heading = HEADING, value_name = "BOOL", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    match_agent_identity_to_certificate: Option<bool>,

    /// Write JSON lines to this file: one when a tunneled connection opens and one when it
    /// ends, and one per refused or failed dial (appended; `-` is standard output, as
    /// kube-apiserver's flag). Empty: off.
    #[arg(long, help_heading = HEADING, value_name = "PATH", default_value = "")]
    audit_log_path: String,

    /// Deadline from TCP accept through TLS, the HTTP/2 preface and the client's first
    /// SETTINGS, on every listener; a connection that misses it is closed.
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "10s", value_parser = go_duration)]
    connection_setup_timeout: Duration,

    /// Close (GOAWAY) an HTTP/2 connection that has carried no stream for this long; 0 never.
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "1h0m0s", value_parser = go_duration)]
    idle_connection_timeout: Duration,

    /// Open connections on the frontend listener; further ones are closed at accept.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 20_000)]
    max_frontend_connections: usize,

    /// Open connections from one IP address on a TCP frontend; 0 means no per-address cap
    /// (the usual client, kube-apiserver, is one address).
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 0)]
    max_frontend_connections_per_address: usize,

    /// Open connections on the agent listener; further ones are closed at accept. The
    /// default holds every agent --max-agents allows, each with a second connection while it
    /// reconnects, at about 45 KiB each: size the server's memory for it (see SECURITY.md).
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 40_000)]
    max_agent_connections: usize,

    /// Connections from one IP address on the agent listener that have no admitted agent
    /// stream yet (in TLS, or with credentials still being checked); further ones are closed
    /// at accept. Admitted agents do not count, so any number of them may share one address
    /// (NAT, a load balancer's SNAT). 0 means no cap.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 100)]
    max_agent_connections_per_address: usize,

    /// Concurrent streams (tunnels) per frontend HTTP/2 connection.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = tether_grpc::DEFAULT_FRONTEND_STREAMS)]
    max_streams_per_frontend_connection: u32,

    /// How often the listeners' certificate, key and CA files are checked for changes; new
    /// handshakes use changed files, live connections are kept. 0 disables reloading.
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "10s", value_parser = go_duration)]
    tls_reload_interval: Duration,

    /// Distinct agent IDs connected at once per tenant; further agents of that tenant are
    /// refused (RESOURCE_EXHAUSTED). Bounds each tenant's agent table (28-49 KiB per
    /// agent), so one tenant's credentials cannot fill another's; the default takes the
    /// largest clusters (15,000 nodes). --max-agent-connections bounds the server as a whole.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 20_000)]
    max_agents: usize,

    /// Open connections on the health port, and as many on the admin port; further ones are
    /// closed at accept, so idle ones cannot use up the descriptors agents and dials need.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = tether_observe::http::DEFAULT_MAX_CONNECTIONS)]
    max_health_connections: usize,
}

impl SecurityArgs {
    /// Agent authentication is never silently off: without --cluster-ca-cert or token
    /// authentication the server refuses to start unless the operator asked for
    /// unauthenticated agents by name.
    pub(crate) fn check_agent_authentication(
        &self,
        cluster_ca_cert: &str,
        token_auth: bool,
    ) -> anyhow::Result<()> {
        if token_auth && self.allow_unauthenticated_agents {
            bail!(
                "--allow-unauthenticated-agents contradicts agent token authentication \
                 (--agent-namespace, --agent-service-account, --authentication-audience); drop one of them"
            );
        }
        if cluster_ca_cert.is_empty() && !token_auth && !self.allow_unauthenticated_agents {
            bail!(
                "--cluster-ca-cert is not set, so agents would not be authenticated: anyone \
                 reaching the agent port could register as an agent and receive dials. Set \
                 --cluster-ca-cert to the CA of the agents' client certificates, or \
                 authenticate them by ServiceAccount token (--agent-namespace, \
                 --agent-service-account, --authentication-audience), or pass \
                 --allow-unauthenticated-agents for lab use"
            );
        }
        if !cluster_ca_cert.is_empty() && self.allow_unauthenticated_agents {
            bail!(
                "--allow-unauthenticated-agents contradicts --cluster-ca-cert (agents present \
                 client certificates); drop one of them"
            );
        }
        Ok(())
    }

    /// `--agent-identity-binding`, or what the deprecated flags it replaces ask for
    /// (`token_node_flag` is `--match-agent-host-to-token-node`, read only with token
    /// authentication). Warns at start-up when agents' claims go unchecked.
    pub(crate) fn identity_binding(
        &self,
        cluster_ca_cert: &str,
        token_auth: bool,
        token_node_flag: Option<bool>,
    ) -> anyhow::Result<IdentityBinding> {
        let certificate_flag = self.match_agent_identity_to_certificate;
        if token_auth && certificate_flag.is_some() {
            bail!(
                "--match-agent-identity-to-certificate needs --cluster-ca-cert; with token \
                 authentication use --agent-identity-binding"
            );
        }
        let deprecated = match (certificate_flag, token_node_flag) {
            (Some(on), _) => Some((
                "--match-agent-identity-to-certificate",
                on,
                IdentityBinding::All,
            )),
            (None, Some(on)) => Some((
                "--match-agent-host-to-token-node",
                on,
                IdentityBinding::Identifiers,
            )),
            (None, None) => None,
        };
        let binding = match (self.agent_identity_binding, deprecated) {
            (Some(_), Some((flag, _, _))) => {
                bail!("{flag} is replaced by --agent-identity-binding; drop one of them")
            }
            (Some(binding), None) => binding,
            (None, Some((flag, on, binding))) => {
                let binding = if on { binding } else { IdentityBinding::Off };
                tracing::warn!(
                    "{flag} is deprecated and will be removed: use --agent-identity-binding={binding}"
                );
                binding
            }
            (None, None) => IdentityBinding::default(),
        };
        let credentials = token_auth || !cluster_ca_cert.is_empty();
        match binding {
            IdentityBinding::All if !credentials => bail!(
                "--agent-identity-binding=all (--match-agent-identity-to-certificate) needs \
                 --cluster-ca-cert or agent token authentication: unauthenticated agents prove \
                 no agent ID"
            ),
            IdentityBinding::Off => tracing::warn!(
                "--agent-identity-binding=off: agents' host=/ipv4=/ipv6= identifiers and IDs \
                 are not checked against their credentials, so any agent credential can claim \
                 any node and receive the dials meant for it (kubelet exec and logs)"
            ),
            IdentityBinding::Identifiers if !credentials => tracing::warn!(
                "agents are not authenticated (--allow-unauthenticated-agents), so they prove no \
                 host=/ipv4=/ipv6= identifier: streams that claim one are refused; \
                 --agent-identity-binding=off routes by self-declared identifiers"
            ),
            IdentityBinding::Identifiers | IdentityBinding::All => {}
        }
        Ok(binding)
    }

    pub(crate) fn audit_log(&self) -> Option<tether_observe::audit::AuditTarget> {
        tether_observe::audit::AuditTarget::from_flag(&self.audit_log_path)
    }

    pub(crate) fn tls_reload_interval(&self) -> Duration {
        self.tls_reload_interval
    }

    pub(crate) fn limits(&self) -> anyhow::Result<Limits> {
        if self.connection_setup_timeout.is_zero() {
            bail!("--connection-setup-timeout must be greater than 0");
        }
        for (flag, value) in [
            ("--max-frontend-connections", self.max_frontend_connections),
            ("--max-agent-connections", self.max_agent_connections),
            ("--max-agents", self.max_agents),
            ("--max-health-connections", self.max_health_connections),
            (
                "--max-streams-per-frontend-connection",
                self.max_streams_per_frontend_connection as usize,
            ),
        ] {
            if value == 0 {
                bail!("{flag} must be at least 1");
            }
        }
        Ok(Limits {
            setup_timeout: self.connection_setup_timeout,
            idle_connection_timeout: (!self.idle_connection_timeout.is_zero())
                .then_some(self.idle_connection_timeout),
            max_frontend_connections: self.max_frontend_connections,
            max_agent_connections: self.max_agent_connections,
            max_agent_connections_per_address: self.max_agent_connections_per_address,
            max_frontend_connections_per_address: self.max_frontend_connections_per_address,
            max_streams_per_frontend_connection: self.max_streams_per_frontend_connection,
            max_agents: self.max_agents,
            max_http_connections: self.max_health_connections,
            ..Limits::default()
        })
    }
}
