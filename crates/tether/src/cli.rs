//! The command line: `tether <subcommand> [flags]`.
//!
//! Flags are spelled as upstream's Go binaries spell them (pflag): `--name=value` or
//! `--name value`, booleans as `--flag` or `--flag=false`, durations as `1h0m0s`, and klog's
//! flags with `_` or `-` alike. [`Cli::from_argv`] turns such an argv into one clap parses.

pub(crate) mod agent;
mod common;
pub(crate) mod dial;
pub(crate) mod introspect;
pub(crate) mod klog;
mod kube;
pub(crate) mod quickstart;
pub(crate) mod server;
#[cfg(test)]
mod testutil;
pub(crate) mod validate;

use std::ffi::OsString;
use std::path::Path;

use clap::{Parser, Subcommand};

/// A drop-in replacement for Konnectivity's proxy-server and proxy-agent.
#[derive(Debug, Parser)]
// `--version` on every subcommand too, so that `proxy-agent --version` and
// `proxy-server --version` answer as `tether --version` does.
#[command(name = "tether", version = crate::build_info::LONG_VERSION, propagate_version = true)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run a proxy server (upstream's proxy-server): frontends for kube-apiserver, a listener
    /// for agents.
    Server(server::ServerArgs),
    /// Run a proxy agent (upstream's proxy-agent): tunnels to the servers, dialing
    /// destinations for them.
    Agent(agent::AgentArgs),
    /// Open one tunnelled connection through a proxy server on stdin/stdout, like `nc`.
    ///
    /// After end of input the tunnel stays open until the far side closes it: Konnectivity
    /// has no half-close, and closing would cut off the answer (as `nc` without `-N`). Bound
    /// a one-shot request with `timeout`, or ask for one the destination closes (HTTP/1.0).
    Dial(dial::DialArgs),
    /// Start a server, an agent and a demo backend on loopback, and tunnel through them.
    Quickstart(quickstart::QuickstartArgs),
    /// List the live and pending connections of a server or agent (its admin endpoint).
    Connections(introspect::ConnectionsArgs),
    /// List a server's agent streams (or an agent's server streams) with load and health.
    Agents(introspect::AgentsArgs),
    /// Connections sorted by throughput between two snapshots.
    Top(introspect::TopArgs),
    /// Check kube-apiserver's EgressSelectorConfiguration, a routing file or a destination
    /// policy before a rollout, as their readers check them at start-up.
    Validate(validate::ValidateArgs),
}

impl Command {
    /// klog flags, for the commands that stand in for upstream's binaries.
    pub(crate) fn klog(&self) -> Option<&klog::KlogArgs> {
        match self {
            Self::Server(args) => Some(&args.klog),
            Self::Agent(args) => Some(&args.klog),
            Self::Dial(_)
            | Self::Quickstart(_)
            | Self::Connections(_)
            | Self::Agents(_)
            | Self::Top(_)
            | Self::Validate(_) => None,
        }
    }
}

impl Cli {
    /// Parses the process's arguments after [`normalize`]: clap's error (or help) on failure.
    pub(crate) fn from_argv(argv: impl IntoIterator<Item = OsString>) -> Result<Self, clap::Error> {
        Self::try_parse_from(normalize(argv))
    }
}

/// Names under which the binary stands in for upstream's, and the subcommand each means.
const UPSTREAM_NAMES: [(&str, &str); 2] = [("proxy-server", "server"), ("proxy-agent", "agent")];

/// Rewrites argv into what clap parses:
/// - invoked as `proxy-server` or `proxy-agent` (a symlink or a renamed copy), it becomes
///   `tether server …` or `tether agent …`, so upstream manifests and test runners work
///   unchanged;
/// - `_` in long flag names becomes `-`, as upstream does for klog's flags (`--log_file`).
///   Values are left alone, and nothing after `--` is touched.
fn normalize(argv: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut argv = argv.into_iter();
    let argv0 = argv.next().unwrap_or_else(|| "tether".into());
    let invoked_as = Path::new(&argv0).file_name().and_then(|name| name.to_str());
    let mut out = match UPSTREAM_NAMES
        .iter()
        .find(|(name, _)| Some(*name) == invoked_as)
    {
        Some((_, subcommand)) => vec!["tether".into(), (*subcommand).into()],
        None => vec![argv0],
    };
    let mut flags = true;
    for arg in argv {
        match arg.to_str() {
            Some("--") => {
                flags = false;
                out.push(arg);
            }
            Some(s) if flags && s.starts_with("--") => {
                let (name, value) = s.split_at(s.find('=').unwrap_or(s.len()));
                out.push(format!("{}{value}", name.replace('_', "-")).into());
            }
            _ => out.push(arg),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(argv: &[&str]) -> Vec<String> {
        normalize(argv.iter().map(OsString::from))
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn underscores_in_flag_names_only() {
        assert_eq!(
            args(&[
                "tether",
                "agent",
                "--log_file=/var/log/a_b.log",
                "--log_dir",
                "/x_y",
                "-v=4",
                "--",
                "--a_b"
            ]),
            [
                "tether",
                "agent",
                "--log-file=/var/log/a_b.log",
                "--log-dir",
                "/x_y",
                "-v=4",
                "--",
                "--a_b"
            ]
        );
    }

    #[test]
    fn upstream_binary_names_select_the_subcommand() {
        assert_eq!(
            args(&["/usr/bin/proxy-agent", "--v=2"]),
            ["tether", "agent", "--v=2"]
        );
        assert_eq!(args(&["proxy-server"]), ["tether", "server"]);
        assert_eq!(args(&["./tether", "server"]), ["./tether", "server"]);
    }

    #[test]
    fn klog_flags_parse_in_every_go_form() {
        for argv in [
            &["tether", "agent", "-v=7"][..],
            &["tether", "agent", "-v", "7"],
            &["tether", "agent", "--v=7"],
            &["tether", "agent", "--v", "7"],
        ] {
            let cli = Cli::from_argv(argv.iter().map(OsString::from)).unwrap();
            assert_eq!(cli.command.klog().unwrap().v, 7, "{argv:?}");
        }
        let cli = Cli::from_argv(
            [
                "tether",
                "server",
                "--logtostderr=false",
                "--log_file=/tmp/x_y",
                "--alsologtostderr",
            ]
            .map(OsString::from),
        )
        .unwrap();
        let klog = cli.command.klog().unwrap();
        assert!(!klog.logtostderr && klog.alsologtostderr);
        assert_eq!(klog.log_file, "/tmp/x_y");
    }

    #[test]
    fn help_renders() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }
}
