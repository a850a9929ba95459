//! tether's routing flag of `tether server`: the routing file (topology, affinity, ejection,
//! tenants, destination policies).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};
use clap::Args;
use tether_kube::token_review::{ANY, AgentServiceAccount};
use tether_observe::metrics::Registry;
use tether_reload::{ReloadMetrics, Reloader};
use tether_server::routing::Identity;
use tether_server::{RoutingConfig, Strategy};

const HEADING: &str = "Routing (tether)";

#[derive(Args, Clone, Debug)]
pub(crate) struct RoutingArgs {
    /// YAML file with CIDR→zone rules for the topology strategy, client affinity, outlier
    /// ejection, tenants and per-client destination policies (see docs/src/reference/routing-file.md
    /// in the book). Without `destinations` in it the server checks no destination, as upstream
    /// (agents still apply theirs). Read and validated at start-up; errors name the file and
    /// the entry or line. Watched while the server runs (read every 500 ms and on SIGHUP): a
    /// changed file that passes the same checks is applied without a restart, one that fails
    /// them is refused and logged, and the file in force stays.
    #[arg(long, help_heading = HEADING, value_name = "PATH")]
    routing_config: Option<PathBuf>,
}

impl RoutingArgs {
    pub(crate) fn path(&self) -> Option<&Path> {
        self.routing_config.as_deref()
    }

    pub(crate) fn routing(&self) -> anyhow::Result<RoutingConfig> {
        let Some(path) = &self.routing_config else {
            return Ok(RoutingConfig::default());
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--routing-config: reading {}", path.display()))?;
        RoutingConfig::from_yaml(&text)
            .map_err(|e| anyhow::anyhow!("--routing-config {}: {e}", path.display()))
    }
}

/// Refuses zones without the topology strategy, which alone reads them.
pub(crate) fn check_zones(
    routing: &RoutingConfig,
    strategies: &[Strategy],
    flag: &str,
) -> anyhow::Result<()> {
    if !routing.zone_rules.is_empty() && !strategies.contains(&Strategy::Topology) {
        bail!(
            "--routing-config has zones, which only the topology strategy reads, and \
             --proxy-strategies={flag} has none: add it (for example \
             --proxy-strategies=topology,default) or remove the zones"
        );
    }
    Ok(())
}

/// The checks a routing file passes against the rest of the command line, at start-up and
/// at every reload alike.
#[derive(Debug)]
pub(crate) struct RoutingChecks {
    pub(crate) account: Option<AgentServiceAccount>,
    pub(crate) strategies: Vec<Strategy>,
    /// `--proxy-strategies` as given, for messages.
    pub(crate) strategies_flag: String,
    /// The server's listeners, which tenants' own frontends must not overlap.
    pub(crate) server: Box<tether_server::Config>,
}

impl RoutingChecks {
    /// Parses `bytes` as a routing file and runs every start-up check on it; the error names
    /// the file, and the line or entry.
    pub(crate) fn parse(&self, path: &Path, bytes: &[u8]) -> Result<RoutingConfig, String> {
        let at = format!("--routing-config {}", path.display());
        let text = std::str::from_utf8(bytes).map_err(|e| format!("{at}: not UTF-8: {e}"))?;
        let routing = RoutingConfig::from_yaml(text).map_err(|e| format!("{at}: {e}"))?;
        check_service_accounts(&routing, self.account.as_ref()).map_err(|e| format!("{e:#}"))?;
        check_zones(&routing, &self.strategies, &self.strategies_flag)
            .map_err(|e| format!("{e:#}"))?;
        self.server
            .check_routing(&routing)
            .map_err(|e| format!("{at}: {e}"))?;
        Ok(routing)
    }
}

/// `--routing-config` and what it is checked against, to watch while the server runs.
#[derive(Debug)]
pub(crate) struct RoutingFile {
    pub(crate) path: PathBuf,
    pub(crate) checks: RoutingChecks,
}

impl RoutingFile {
    /// Reads the file as generation 1 and registers the reload metrics
    /// (`tether_server_config_*`).
    pub(crate) fn watch(self, registry: &Registry) -> anyhow::Result<Reloader<RoutingConfig>> {
        let checks = self.checks;
        Reloader::load(
            self.path,
            Box::new(move |path, bytes| checks.parse(path, bytes)),
            ReloadMetrics::register(registry, "tether_server"),
        )
        .map_err(|e| anyhow::anyhow!(e))
    }
}

/// Checks that token authentication and the tenant table agree: `*` in
/// `--agent-namespace`/`--agent-service-account` needs a tenant table (which refuses every
/// agent it does not map), and every `sa:` agent identity needs token authentication that
/// can admit it.
pub(crate) fn check_service_accounts(
    routing: &RoutingConfig,
    account: Option<&AgentServiceAccount>,
) -> anyhow::Result<()> {
    if let Some(account) = account
        && (account.namespace == ANY || account.name == ANY)
        && routing.tenants.is_empty()
    {
        bail!(
            "--agent-namespace='*' or --agent-service-account='*' admits any ServiceAccount's \
             token: it needs a --routing-config tenant table, whose sa: agent identities decide"
        );
    }
    for (n, tenant) in routing.tenants.iter().enumerate() {
        for identity in &tenant.agents {
            let Identity::ServiceAccount { namespace, name } = identity else {
                continue;
            };
            let at = format!("--routing-config: tenants[{n}] ({:?}): agents", tenant.name);
            let Some(account) = account else {
                bail!(
                    "{at}: sa:{namespace} needs agent token authentication \
                     (--agent-namespace, --agent-service-account, --authentication-audience)"
                );
            };
            if account.namespace != ANY && account.namespace != *namespace {
                bail!(
                    "{at}: --agent-namespace={} refuses every token from namespace {namespace}; \
                     --agent-namespace='*' lets the tenant table decide",
                    account.namespace
                );
            }
            if let Some(name) = name
                && account.name != ANY
                && account.name != *name
            {
                bail!(
                    "{at}: --agent-service-account={} refuses every token of ServiceAccount \
                     {name}; --agent-service-account='*' lets the tenant table decide",
                    account.name
                );
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_account_tenants_need_matching_token_authentication() {
        let routing = |agents: &str| {
            RoutingConfig::from_yaml(&format!(
                "tenants:\n  - {{name: a, clients: [\"cert:api.a\"], agents: [{agents}]}}\n"
            ))
            .unwrap()
        };
        let account = |namespace: &str, name: &str| AgentServiceAccount {
            namespace: namespace.into(),
            name: name.into(),
            audience: "system:konnectivity-server".into(),
        };
        let check = |agents: &str, acc: Option<AgentServiceAccount>| {
            check_service_accounts(&routing(agents), acc.as_ref()).map_err(|e| e.to_string())
        };
        check("\"sa:ns-a\"", Some(account("*", "*"))).unwrap();
        check("\"sa:ns-a:agent\"", Some(account("ns-a", "agent"))).unwrap();
        check("\"sa:ns-a\"", Some(account("ns-a", "agent"))).unwrap();
        check("\"cert:agent.a\"", None).unwrap();
        for (agents, acc, expected) in [
            ("\"sa:ns-a\"", None, "needs agent token authentication"),
            (
                "\"sa:ns-a\"",
                Some(account("kube-system", "*")),
                "--agent-namespace=kube-system refuses every token from namespace ns-a",
            ),
            (
                "\"sa:ns-a:agent\"",
                Some(account("*", "konnectivity-agent")),
                "--agent-service-account=konnectivity-agent refuses",
            ),
        ] {
            let err = check(agents, acc).unwrap_err();
            assert!(err.contains(expected), "{err}");
            assert!(err.contains("tenants[0] (\"a\")"), "{err}");
        }
        let err = check_service_accounts(&RoutingConfig::default(), Some(&account("*", "agent")))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("needs a --routing-config tenant table"),
            "{err}"
        );
    }
}
