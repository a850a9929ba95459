//! `tether`: a drop-in replacement for Konnectivity's `proxy-server` and `proxy-agent`.
//!
//! This file only dispatches and sets exit codes, as upstream's binaries do: 0 after a
//! normal stop, 1 for a start-up error (a bad flag value, an unreadable certificate, a port
//! in use) or a server's second signal, 2 for command-line syntax (clap).
#![forbid(unsafe_code)]

mod build_info;
mod cli;
mod dial;
#[cfg(test)]
mod docs;
mod fd_limit;
mod introspect;
mod leases;
mod logging;
mod permission;
mod quickstart;
mod signals;
mod validate;

use std::process::ExitCode;

use tether_observe::metrics::Registry;

use crate::cli::agent::AgentLeases;
use crate::cli::{Cli, Command};
use crate::leases::LeaseTasks;
use crate::signals::Signals;

fn main() -> ExitCode {
    let argv: Vec<_> = std::env::args_os().collect();
    let cli = Cli::from_argv(argv.iter().cloned()).unwrap_or_else(|e| e.exit());
    if let Err(e) = logging::init(cli.command.klog()) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    if cli.command.klog().is_some() {
        logging::log_start(&argv);
    }
    if matches!(cli.command, Command::Server(_) | Command::Agent(_)) {
        fd_limit::raise();
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: starting the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(cli.command));
    // Every task has ended with `run` (or is cancelled here after a forced stop). Only a
    // DNS lookup on the blocking pool can outlive it; it gets a short bound, not a wait.
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    result.unwrap_or_else(|e| {
        eprintln!("error: {:#}", permission::explain(e));
        ExitCode::FAILURE
    })
}

/// The metrics every process starts with, before its server or agent adds its own; the
/// generated metrics reference (docs.rs) starts from here too.
fn registry(long_running: bool) -> Registry {
    let registry = Registry::new();
    registry.register_process_metrics();
    if long_running {
        build_info::register(&registry);
    }
    registry
}

async fn run(command: Command) -> anyhow::Result<ExitCode> {
    let long_running = matches!(command, Command::Server(_) | Command::Agent(_));
    let registry = registry(long_running);
    // Both long-running roles give freed heap back after load; the task ends with them.
    let allocator_upkeep = tokio_util::sync::CancellationToken::new();
    if long_running {
        tokio::spawn(tether_profiling::trim::run(allocator_upkeep.clone()));
    }
    let _stop_upkeep = allocator_upkeep.drop_guard();
    match command {
        Command::Server(args) => {
            let profiling = args.upstream_only.enable_profiling;
            server(args.into_launch()?, registry, profiling).await
        }
        Command::Agent(args) => {
            let leases = args.lease_settings()?;
            let profiling = args.upstream_only.enable_profiling;
            let readiness = args.readiness();
            agent(args.into_config()?, leases, readiness, registry, profiling).await
        }
        Command::Dial(args) => dial::run(args).await,
        Command::Quickstart(args) => quickstart::run(args).await,
        Command::Connections(args) => introspect::connections(args).await,
        Command::Agents(args) => introspect::agents(args).await,
        Command::Top(args) => introspect::top(args).await,
        Command::Validate(args) => Ok(validate::run(&args)),
    }
}

async fn server(
    launch: cli::server::ServerLaunch,
    registry: Registry,
    profiling: bool,
) -> anyhow::Result<ExitCode> {
    let signals = Signals::install()?;
    let (config, leases) = launch.start(&registry).await?;
    let server_id = config.server_id.clone();
    let mut server = tether_server::Server::bind(config, registry.clone()).await?;
    if profiling {
        server = server.with_admin_routes(tether_profiling::handler());
    }
    let leases =
        leases.map(|(kube, settings)| LeaseTasks::server(&kube, &settings, &server_id, &registry));
    let served = async {
        server.run(signals.first.clone()).await;
        // As upstream: the Lease goes once the server stopped serving.
        if let Some(leases) = leases {
            leases.stop().await;
        }
    };
    tokio::select! {
        () = served => Ok(ExitCode::SUCCESS),
        // Upstream's server exits at once, with status 1, on a second signal.
        () = signals.second.cancelled() => Ok(ExitCode::FAILURE),
    }
}

async fn agent(
    mut config: tether_agent::Config,
    leases: Option<AgentLeases>,
    readiness: tether_agent::Readiness,
    registry: Registry,
    profiling: bool,
) -> anyhow::Result<ExitCode> {
    let signals = Signals::install()?;
    let leases = match leases {
        Some(settings) => {
            let (tasks, counting) = LeaseTasks::agent(&settings, &registry).await?;
            config.lease_counting = Some(counting);
            Some(tasks)
        }
        None => None,
    };
    let mut agent = tether_agent::Agent::bind(config, registry)
        .await?
        .with_readiness(readiness);
    if profiling {
        agent = agent.with_admin_routes(tether_profiling::handler());
    }
    agent.run(signals.first, signals.second).await;
    if let Some(leases) = leases {
        leases.stop().await;
    }
    Ok(ExitCode::SUCCESS)
}
