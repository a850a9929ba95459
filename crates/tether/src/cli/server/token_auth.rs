//! Agent ServiceAccount token authentication flags: upstream's `--agent-namespace`,
//! `--agent-service-account` and `--authentication-audience` (with upstream's validation),
//! and tether's TokenReview cache.

use std::time::Duration;

use anyhow::bail;
use clap::{ArgAction, Args};
use tether_kube::token_review::{AddressLimit, AgentServiceAccount, CacheLimits};

use crate::cli::common::{go_bool, go_duration};

const HEADING: &str = "Agent token authentication";

#[derive(Args, Clone, Debug)]
pub(crate) struct TokenAuthArgs {
    /// Authenticate agents by ServiceAccount token (TokenReview): the namespace of the
    /// agents' ServiceAccount. Any of the three flags enables token authentication, which
    /// then needs all three, and replaces --cluster-ca-cert.
    /// '*' (tether) admits any namespace: the --routing-config tenant table's
    /// sa:NAMESPACE[:NAME] agent identities then decide, refusing every agent they don't map.
    #[arg(long, help_heading = HEADING, value_name = "NAMESPACE", default_value = "")]
    agent_namespace: String,

    /// The name of the agents' ServiceAccount; '*' (tether) admits any name, as for
    /// --agent-namespace.
    #[arg(long, help_heading = HEADING, value_name = "NAME", default_value = "")]
    agent_service_account: String,

    /// The audience agents' tokens must be issued for (e.g. system:konnectivity-server).
    #[arg(long, help_heading = HEADING, value_name = "AUDIENCE", default_value = "")]
    authentication_audience: String,

    /// Deprecated: --agent-identity-binding=identifiers (true) or =off (false).
    #[arg(long, help_heading = HEADING, value_name = "BOOL", value_parser = go_bool, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true")]
    match_agent_host_to_token_node: Option<bool>,

    /// How long an admitted token is admitted again without a TokenReview (never past the
    /// token's expiry); 0 reviews every connection, as upstream does.
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "2m0s", value_parser = go_duration)]
    token_review_cache_ttl: Duration,

    /// How long a refused token is refused again without a TokenReview.
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "10s", value_parser = go_duration)]
    token_review_negative_cache_ttl: Duration,

    /// After --token-review-cache-ttl, how much longer an admitted token is still admitted
    /// while the Kubernetes API server cannot answer (never past the token's expiry).
    #[arg(long, help_heading = HEADING, value_name = "DURATION", default_value = "1h0m0s", value_parser = go_duration)]
    token_review_stale_ttl: Duration,

    /// Most tokens whose review result is cached.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = 10_000)]
    token_review_cache_size: usize,

    /// Refused tokens per second that agents from one address (IPv4, or IPv6 /64) may
    /// cause TokenReviews for, within --kubeconfig-qps, so that one address sending bad
    /// tokens cannot use up the reviews every agent needs; a negative value removes this
    /// limit. Tokens that admit an agent cost their address nothing: agents behind one
    /// address (NAT) are paced by --kubeconfig-qps alone.
    #[arg(long, help_heading = HEADING, value_name = "QPS", default_value_t = AddressLimit::default().qps, allow_negative_numbers = true)]
    token_review_qps_per_address: f32,

    /// Refused tokens one address may cause reviews for at once above
    /// --token-review-qps-per-address, and TokenReviews in flight at once per address.
    #[arg(long, help_heading = HEADING, value_name = "N", default_value_t = AddressLimit::default().burst)]
    token_review_burst_per_address: u32,
}

/// Validated token authentication settings.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct TokenAuth {
    pub(crate) account: AgentServiceAccount,
    pub(crate) cache: CacheLimits,
    pub(crate) per_address: AddressLimit,
    /// The deprecated `--match-agent-host-to-token-node`, when given.
    pub(crate) match_host_to_node: Option<bool>,
}

impl TokenAuthArgs {
    /// Upstream's validation: any of the three flags enables token authentication; all
    /// three are then required, and --cluster-ca-cert is refused. `None` when disabled.
    pub(crate) fn validate(&self, cluster_ca_cert: &str) -> anyhow::Result<Option<TokenAuth>> {
        let flags = [
            ("--agent-namespace", &self.agent_namespace),
            ("--agent-service-account", &self.agent_service_account),
            ("--authentication-audience", &self.authentication_audience),
        ];
        if flags.iter().all(|(_, value)| value.is_empty()) {
            return Ok(None);
        }
        if !cluster_ca_cert.is_empty() {
            bail!("--cluster-ca-cert can not be used when agent authentication is enabled");
        }
        if let Some((flag, _)) = flags.iter().find(|(_, value)| value.is_empty()) {
            bail!("{flag} cannot be empty when agent authentication is enabled");
        }
        if !self.token_review_qps_per_address.is_finite() {
            bail!(
                "--token-review-qps-per-address={} is not a number",
                self.token_review_qps_per_address
            );
        }
        Ok(Some(TokenAuth {
            account: AgentServiceAccount {
                namespace: self.agent_namespace.clone(),
                name: self.agent_service_account.clone(),
                audience: self.authentication_audience.clone(),
            },
            cache: CacheLimits {
                ttl: self.token_review_cache_ttl,
                negative_ttl: self.token_review_negative_cache_ttl,
                stale_ttl: self.token_review_stale_ttl,
                max_entries: self.token_review_cache_size,
            },
            per_address: AddressLimit {
                qps: self.token_review_qps_per_address,
                burst: self.token_review_burst_per_address,
            },
            match_host_to_node: self.match_agent_host_to_token_node,
        }))
    }
}
