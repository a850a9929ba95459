//! tether's routing flag of `tether server`: the routing file (topology, affinity, ejection,
//! tenants, destination policies).

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use tether_server::RoutingConfig;

const HEADING: &str = "Routing (tether)";

#[derive(Args, Clone, Debug)]
pub(crate) struct RoutingArgs {
    /// YAML file with CIDR→zone rules for the topology strategy, client affinity, outlier
    /// ejection, tenants and per-client destination policies (see the README's "Routing"
    /// section). Without `destinations` in it the server checks no destination, as upstream
    /// (agents still apply theirs). Read and validated at start-up; errors name the file and
    /// the entry or line.
    #[arg(long, help_heading = HEADING, value_name = "PATH")]
    routing_config: Option<PathBuf>,
}

impl RoutingArgs {
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
