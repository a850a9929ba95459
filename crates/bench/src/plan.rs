//! What a run does: the profile its flags set, the systems and workloads it covers, and
//! its steps in order, each with the weight the progress estimate gives it; afterwards, which
//! figures the plan promised and the results lack.

use anyhow::{Context as _, bail};

use crate::cli::Args;
use crate::results::{FleetFigure, Metric, Results, TunnelFigure, TunnelPoint};
use crate::systems::{Binaries, FLEET_SYSTEM, Frontend, Impl, System};
use crate::workloads::FleetMode;
use crate::workloads::{self, Profile, Workload};

/// One unit of the plan.
#[derive(Clone, Debug)]
pub enum Task {
    /// Start a system, run these workloads on it, stop it.
    Instance {
        run: usize,
        system: System,
        workloads: Vec<Workload>,
    },
    /// A fresh system holding many idle connections.
    IdleConns { run: usize, system: System },
    /// A fresh system with several agents and targets, holding even more idle connections.
    ScaleConns { run: usize, system: System },
    /// A fresh server with many fake agents.
    FanIn {
        run: usize,
        imp: Impl,
        agents: usize,
        large: bool,
    },
    /// A fresh tether system whose agent link is cut again and again.
    Resume { run: usize, system: System },
    /// A fresh gRPC/UDS system whose one frontend connection holds streams while short
    /// dials run beside them; `cap`: tether's stream cap per frontend connection (`None`
    /// for a server without the flag).
    Tunnel {
        run: usize,
        system: System,
        cap: Option<u32>,
    },
    /// A fresh fleet of peered tether servers with fake agents held in `mode`.
    Fleet { run: usize, mode: FleetMode },
}

/// The profile: full or `--quick`, with the sizes the flags override.
pub fn profile(args: &Args) -> anyhow::Result<Profile> {
    let mut p = if args.quick {
        Profile::quick()
    } else {
        Profile::full()
    };
    if let Some(r) = args.runs {
        p.runs = r.max(1);
    }
    if let Some(n) = args.idle_conns {
        p.idle_conns = n.max(1);
    }
    if let Some(n) = args.scale_conns {
        p.scale_conns = n.max(1);
    }
    if let Some(n) = args.fleet {
        p.fleet = n.max(workloads::fleet::SERVERS);
    }
    match args.fanin[..] {
        [] => {}
        [small, large] => p.fanin = [small.max(1), large.max(1)],
        _ => bail!("--fanin takes two sizes, SMALL,LARGE (e.g. 1000,10000)"),
    }
    if !args.tunnel_held.is_empty() {
        p.tunnel_held = args.tunnel_held.clone();
        p.tunnel_held.sort_unstable();
        p.tunnel_held.dedup();
    }
    if let Some(n) = args.tunnel_concurrency {
        p.tunnel_concurrency = n.max(1);
    }
    if !args.tunnel_stream_caps.is_empty() {
        if args.tunnel_stream_caps.contains(&0) {
            bail!("--tunnel-stream-caps: a cap is at least 1");
        }
        p.tunnel_caps = args.tunnel_stream_caps.clone();
        p.tunnel_caps.sort_unstable();
        p.tunnel_caps.dedup();
    }
    Ok(p)
}

/// The systems to run (every one, less those this machine lacks, or those named), and a
/// note for each left out.
pub fn systems(args: &Args, bins: &Binaries) -> anyhow::Result<(Vec<System>, Vec<String>)> {
    let mut skipped = Vec::new();
    let systems: Vec<System> = if args.systems.is_empty() {
        let mut all = System::all();
        if bins.tether_before.is_none() {
            all.retain(|s| !matches!(s, System::Konn(Impl::TetherBefore, _)));
        }
        // One peer hop in kube-apiserver's default shape only: the other shapes add rows to
        // every table and minutes to the run; name them with --systems.
        all.retain(|s| !matches!(s, System::Konn(Impl::TetherPeer, f) if *f != Frontend::GrpcUds));
        // CI's quick run does not build rathole; a full run, or one naming it, needs it.
        if args.quick && !bins.rathole.exists() {
            all.retain(|s| *s != System::Rathole);
            skipped.push(format!(
                "rathole skipped: {} is not built (scripts/bench.sh without --quick installs it)",
                bins.rathole.display()
            ));
        }
        all
    } else {
        args.systems
            .iter()
            .map(|s| {
                System::parse(s).with_context(|| {
                    format!(
                        "unknown system {s:?}; known: {}",
                        System::all()
                            .iter()
                            .map(System::id)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
            })
            .collect::<anyhow::Result<_>>()?
    };
    Ok((systems, skipped))
}

/// The workloads to run: every one, or those named.
pub fn workloads(args: &Args) -> anyhow::Result<Vec<Workload>> {
    let workloads: Vec<Workload> = if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        args.workloads
            .iter()
            .map(|w| Workload::parse(w).with_context(|| format!("unknown workload {w:?}")))
            .collect::<anyhow::Result<_>>()?
    };
    Ok(workloads)
}

/// The open-file limit the run needs.
pub fn wanted_fds(p: &Profile, workloads: &[Workload]) -> u64 {
    // Our process holds the client side of every idle connection (or fake agent), the
    // target their far side; children inherit the limit. In the scale workload each agent
    // and each target holds its share of the connections, and in the fleet each process of
    // fake agents its share of the streams.
    let scale_share = p.scale_conns.div_ceil(p.scale_agents);
    let fleet_streams = if workloads.contains(&Workload::Fleet) {
        let per_process = workloads::fleet::agent_processes(p.fleet);
        (workloads::fleet::SERVERS * p.fleet).div_ceil(per_process)
    } else {
        0
    };
    p.idle_conns
        .max(p.fanin[1])
        .max(scale_share)
        .max(fleet_streams) as u64
        + 4096
}

/// The steps of the run, in order.
pub fn tasks(
    p: &Profile,
    systems: &[System],
    workloads: &[Workload],
    bins: &Binaries,
) -> Vec<Task> {
    // The fleet runs tether servers only: with a tether system in the run.
    let fleet = workloads.contains(&Workload::Fleet)
        && systems
            .iter()
            .any(|s| matches!(s, System::Konn(Impl::Tether | Impl::TetherPeer, _)));
    // The plan: every run visits every system (interleaved, so drift hits all alike), each
    // run starting one system further on: whichever system goes first in a run is measured
    // slower (seen with tether against tether-before swapped), so no system always does.
    let per_instance: Vec<Workload> = Workload::PER_INSTANCE
        .into_iter()
        .filter(|w| workloads.contains(w))
        .collect();
    let mut tasks = Vec::new();
    for run in 1..=p.runs {
        if !per_instance.is_empty() {
            let first = (run - 1) % systems.len().max(1);
            for &system in systems[first..].iter().chain(&systems[..first]) {
                tasks.push(Task::Instance {
                    run,
                    system,
                    workloads: per_instance.clone(),
                });
            }
        }
    }
    for run in 1..=p.runs {
        if workloads.contains(&Workload::IdleConns) {
            for &system in systems {
                if matches!(
                    system,
                    // sshd's per-event loop walks every channel: 10,000 take minutes to open.
                    System::Konn(_, Frontend::HttpConnectUds | Frontend::GrpcUds)
                ) {
                    tasks.push(Task::IdleConns { run, system });
                }
            }
        }
        if workloads.contains(&Workload::ScaleConns) {
            for &system in systems {
                // One gRPC connection carries every tunnel, so the client and the server
                // hold a handful of sockets; HTTP CONNECT would need one per tunnel on both.
                if matches!(system, System::Konn(_, Frontend::GrpcUds)) {
                    tasks.push(Task::ScaleConns { run, system });
                }
            }
        }
        if workloads.contains(&Workload::Resume) {
            // A tether-only extension: the agent link is the same whatever the frontend,
            // so kube-apiserver's default shape (gRPC on a Unix socket) stands for all.
            let system = System::Konn(Impl::Tether, Frontend::GrpcUds);
            if systems.contains(&system) {
                tasks.push(Task::Resume { run, system });
            }
        }
        if workloads.contains(&Workload::Tunnel) {
            for &system in systems {
                // kube-apiserver's reusable tunnel is gRPC over its Unix socket.
                let System::Konn(imp, Frontend::GrpcUds) = system else {
                    continue;
                };
                if imp.has_caps(bins) {
                    for &cap in &p.tunnel_caps {
                        tasks.push(Task::Tunnel {
                            run,
                            system,
                            cap: Some(cap),
                        });
                    }
                } else {
                    tasks.push(Task::Tunnel {
                        run,
                        system,
                        cap: None,
                    });
                }
            }
        }
        if fleet {
            // Each run starts with the other mode than the last, so that neither always
            // goes first.
            let mut modes = FleetMode::ALL;
            if run % 2 == 0 {
                modes.reverse();
            }
            for mode in modes {
                tasks.push(Task::Fleet { run, mode });
            }
        }
        if workloads.contains(&Workload::FanIn) {
            // Not tether-peer: a lone server with fake agents has no peer hop to measure.
            for imp in [
                Impl::Tether,
                Impl::TetherH2,
                Impl::TetherWs,
                Impl::TetherBefore,
                Impl::Upstream,
            ] {
                if systems
                    .iter()
                    .any(|s| matches!(s, System::Konn(i, _) if *i == imp))
                {
                    tasks.push(Task::FanIn {
                        run,
                        imp,
                        agents: p.fanin[0],
                        large: false,
                    });
                    tasks.push(Task::FanIn {
                        run,
                        imp,
                        agents: p.fanin[1],
                        large: true,
                    });
                }
            }
        }
    }
    tasks
}

/// A step's expected share of the run, in seconds, for the progress estimate.
pub fn weight(task: &Task, p: &Profile) -> f64 {
    match task {
        Task::Instance {
            workloads, system, ..
        } => {
            (if system.has_processes() { 2.0 } else { 0.2 })
                + workloads.iter().map(|w| w.weight(p)).sum::<f64>()
        }
        Task::IdleConns { .. } => 2.0 + Workload::IdleConns.weight(p),
        Task::ScaleConns { .. } => 2.0 + Workload::ScaleConns.weight(p),
        Task::Resume { .. } => 2.0 + Workload::Resume.weight(p),
        Task::Tunnel { .. } => 2.0 + Workload::Tunnel.weight(p),
        Task::Fleet { mode, .. } => Workload::fleet_weight(p, *mode),
        Task::FanIn { agents, large, .. } => {
            1.0 + *agents as f64 / 800.0
                + 4.0 * p.settle.as_secs_f64()
                + if *large {
                    p.idle_cpu_secs
                } else {
                    p.churn_secs
                }
        }
    }
}

/// The line the progress display shows while `task` runs.
pub fn describe(task: &Task, p: &Profile) -> String {
    let runs = p.runs;
    match task {
        Task::Instance {
            run,
            system,
            workloads,
        } => format!(
            "run {run}/{runs} · {} · start, then {}",
            system.name(),
            workloads
                .iter()
                .map(Workload::name)
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Task::IdleConns { run, system } => format!(
            "run {run}/{runs} · {} · {} idle tunnelled connections",
            system.name(),
            p.idle_conns
        ),
        Task::ScaleConns { run, system } => format!(
            "run {run}/{runs} · {} · {} idle tunnelled connections over {} agents",
            system.name(),
            p.scale_conns,
            p.scale_agents
        ),
        Task::Resume { run, system } => format!(
            "run {run}/{runs} · {} · ping-pong across {} cuts of the agent's stream",
            system.name(),
            p.resume_cuts
        ),
        Task::Fleet { run, mode } => format!(
            "run {run}/{runs} · fleet of {} tether servers · {} fake agents, {}",
            workloads::fleet::SERVERS,
            p.fleet,
            match mode {
                FleetMode::Mesh => "each holding every server (full mesh)",
                FleetMode::K1 => "each holding one server (K=1, round-robin)",
            }
        ),
        Task::Tunnel { run, system, cap } => format!(
            "run {run}/{runs} · {} · {} · held streams {} beside short dials from {} workers",
            system.name(),
            cap.map_or("no stream cap".to_owned(), |c| format!("stream cap {c}")),
            p.tunnel_held
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            p.tunnel_concurrency
        ),
        Task::FanIn {
            run, imp, agents, ..
        } => format!(
            "run {run}/{runs} · {} server · {agents} fake agents on {}",
            imp.name(),
            workloads::fanin::Link::of(*imp).name()
        ),
    }
}

/// The figures the plan's steps promised that the results lack.
pub fn missing_figures(results: &Results, tasks: &[Task], p: &Profile) -> Vec<String> {
    let mut missing = Vec::new();
    for t in tasks {
        let (system, metrics): (System, Vec<Metric>) = match t {
            Task::Instance {
                system, workloads, ..
            } => {
                let mut m = Vec::new();
                for w in workloads {
                    match w {
                        Workload::IdleRss if system.has_processes() => {
                            m.extend([Metric::IdleRssServer, Metric::IdleRssAgent])
                        }
                        Workload::Bulk => {
                            m.extend([Metric::BulkUp, Metric::BulkDown]);
                            if system.has_processes() {
                                m.extend([Metric::CpuUp, Metric::CpuDown]);
                            }
                        }
                        Workload::PingPong => {
                            m.extend([Metric::PingP50, Metric::PingP99, Metric::PingP999])
                        }
                        Workload::Churn => m.extend([Metric::Churn1Rate, Metric::Churn64Rate]),
                        Workload::Hol => m.push(Metric::HolRatio),
                        Workload::Fairness => {
                            m.extend([Metric::FairP99Ratio, Metric::FairBulkRatio])
                        }
                        _ => {}
                    }
                }
                (*system, m)
            }
            Task::IdleConns { system, .. } => (*system, vec![Metric::ConnTotal]),
            Task::ScaleConns { system, .. } => (*system, vec![Metric::ScaleTotal]),
            Task::Resume { system, .. } => (*system, vec![Metric::ResumePauseP50]),
            Task::Tunnel { system, cap, .. } => (
                *system,
                p.tunnel_held
                    .iter()
                    .map(|&held| {
                        Metric::Tunnel(
                            TunnelPoint {
                                cap: *cap,
                                held: held as u32,
                            },
                            TunnelFigure::Rate,
                        )
                    })
                    .collect(),
            ),
            Task::Fleet { mode, .. } => {
                let mut m = vec![Metric::Fleet(*mode, FleetFigure::Streams)];
                if *mode == FleetMode::K1 {
                    m.push(Metric::Fleet(*mode, FleetFigure::HopDialP50));
                }
                (FLEET_SYSTEM, m)
            }
            Task::FanIn { imp, large, .. } => (
                System::Konn(*imp, Frontend::HttpConnectUds),
                if *large {
                    vec![Metric::AgentLarge]
                } else {
                    vec![Metric::AgentSmall, Metric::FanInChurnRate]
                },
            ),
        };
        for m in metrics {
            if results.values(system, m).is_empty() {
                missing.push(format!("{} · {}", system.name(), m.key()));
            }
        }
    }
    missing.sort();
    missing.dedup();
    missing
}
