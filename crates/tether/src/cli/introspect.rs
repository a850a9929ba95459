//! `tether connections`, `tether agents` and `tether top`: flags.

use std::time::Duration;

use clap::{Args, ValueEnum};
use tether_observe::introspect::Filter;

use super::common::go_duration;

/// How a report is printed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Aligned columns, like `ss`.
    #[default]
    Table,
    /// The admin endpoint's JSON.
    Json,
}

/// Where to ask and how often: shared by the three commands.
#[derive(Args, Clone, Debug)]
pub(crate) struct ViewArgs {
    /// The server's or agent's admin endpoint, `host:port` (server: --admin-bind-address and
    /// --admin-port; agent: --admin-bind-address and --admin-server-port).
    #[arg(long, value_name = "HOST:PORT", default_value = "127.0.0.1:8095")]
    pub(crate) admin_address: String,

    #[arg(long, value_enum, default_value_t = Output::Table)]
    pub(crate) output: Output,

    /// Refresh in place until Ctrl-C (or --count refreshes).
    #[arg(long)]
    pub(crate) watch: bool,

    /// With --watch: stop after this many refreshes.
    #[arg(long, value_name = "N", requires = "watch")]
    pub(crate) count: Option<u64>,

    /// Time between refreshes (and, for top, between the two snapshots compared).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = go_duration)]
    pub(crate) interval: Duration,
}

/// Which connections to list: sent to the endpoint as query parameters.
#[derive(Args, Clone, Debug, Default)]
pub(crate) struct FilterArgs {
    /// Only connections through this agent ID.
    #[arg(long, value_name = "ID")]
    pub(crate) agent: Option<String>,

    /// Only connections to this `host:port`, or to any port of this host.
    #[arg(long, value_name = "HOST[:PORT]")]
    pub(crate) destination: Option<String>,

    /// Only connections whose client identity contains this text (`CN=kube-apiserver`).
    #[arg(long, value_name = "TEXT")]
    pub(crate) client: Option<String>,

    /// Only connections in this state: pending, open, closing or ended.
    #[arg(long, value_name = "STATE", value_parser = ["pending", "open", "closing", "ended"])]
    pub(crate) state: Option<String>,
}

impl FilterArgs {
    pub(crate) fn filter(&self) -> Filter {
        Filter {
            agent: self.agent.clone(),
            destination: self.destination.clone(),
            client: self.client.clone(),
            state: self.state.clone(),
        }
    }
}

#[derive(Args, Debug)]
pub(crate) struct ConnectionsArgs {
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,
}

#[derive(Args, Debug)]
pub(crate) struct AgentsArgs {
    #[command(flatten)]
    pub(crate) view: ViewArgs,
}

#[derive(Args, Debug)]
pub(crate) struct TopArgs {
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    #[command(flatten)]
    pub(crate) filter: FilterArgs,

    /// Show at most this many connections.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub(crate) limit: usize,
}
