//! `tether-bench`: starts each system on loopback (direct TCP, two plain relays in series
//! with and without TLS between them, tether and upstream Konnectivity in four frontend
//! shapes, OpenSSH `-L`/`-R`, rathole), drives the same workloads through each, and writes a
//! Markdown report with SVG charts. See BENCHMARKS.md.
#![forbid(unsafe_code)]
// A binary: `pub` items are the crate's internal interfaces between modules.
#![allow(unreachable_pub)]

mod dashboard;
mod procs;
mod progress;
mod relay;
mod report;
mod results;
mod stats;
mod systems;
mod target;
mod workloads;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::time::Instant;

use anyhow::{Context as _, bail};
use clap::{Parser, Subcommand};

use progress::Progress;
use results::{FleetFigure, FleetMode, Metric, Results, TunnelFigure, TunnelPoint};
use systems::{Binaries, Env, FLEET_SYSTEM, Frontend, Impl, Running, System};
use workloads::{Profile, Workload, bulk::Direction};

#[derive(Parser, Debug)]
#[command(
    name = "tether-bench",
    about = "Benchmark tether against direct TCP, two plain relays in series, upstream Konnectivity, OpenSSH forwarding and rathole, on loopback"
)]
struct Args {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Prove that every system and workload runs, in seconds (the numbers mean nothing).
    #[arg(long)]
    quick: bool,
    /// Runs per figure (default 3; 1 with --quick).
    #[arg(long)]
    runs: Option<usize>,
    /// Where the report, charts and CSV go.
    #[arg(long, default_value = "results")]
    out: PathBuf,
    /// Only these systems (comma-separated names or ids, e.g. `direct,tether-grpc-uds`).
    /// Default: every system, but `tether-peer` (one peer hop between two tether servers)
    /// only in grpc/uds, and `tether-before` only with --before-tether-bin.
    #[arg(long, value_delimiter = ',')]
    systems: Vec<String>,
    /// Only these workloads: idle-rss, bulk, pingpong, churn, hol, fairness, idle-conns,
    /// scale-conns, fanin, resume, tunnel, fleet.
    #[arg(long, value_delimiter = ',')]
    workloads: Vec<String>,
    /// Idle connections to hold open (default 10000; 200 with --quick).
    #[arg(long)]
    idle_conns: Option<usize>,
    /// Idle connections of the scale workload, over several agents (default 50000; 300
    /// with --quick).
    #[arg(long)]
    scale_conns: Option<usize>,
    /// The two fan-in sizes, small and large (default 1000,5000; 20,50 with --quick).
    #[arg(long, value_delimiter = ',')]
    fanin: Vec<usize>,
    /// Fake agents of the fleet workload, on 3 peered tether servers: as a full mesh (a
    /// stream to every server, 3 per agent) and with K=1 (one stream each, round-robin)
    /// (default 10000; 60 with --quick; at least 3). The bench process holds every stream.
    #[arg(long, value_name = "AGENTS")]
    fleet: Option<usize>,
    /// The tunnel workload's sweep: streams held open on its one gRPC connection, one point
    /// each, while short dials run beside them (default 0,200,900,980; 0,40 with --quick).
    /// More held streams than the stream cap leave the rest waiting for a free stream until
    /// their dial deadline (10 s each).
    #[arg(long, value_delimiter = ',')]
    tunnel_held: Vec<usize>,
    /// Workers making short dials beside the held streams (default 64; 16 with --quick).
    #[arg(long)]
    tunnel_concurrency: Option<usize>,
    /// tether's --max-streams-per-frontend-connection in the tunnel workload, one instance
    /// each (default: 1000, the old default, and the built-in default, 4000; 50 with --quick). Upstream
    /// has no such flag and runs once.
    #[arg(long, value_delimiter = ',')]
    tunnel_stream_caps: Vec<u32>,
    /// The tether binary (default: `tether` next to this program).
    #[arg(long)]
    tether_bin: Option<PathBuf>,
    /// An earlier tether binary: adds the `tether-before` systems (every frontend shape), so a
    /// change is measured before and after in one run.
    #[arg(long)]
    before_tether_bin: Option<PathBuf>,
    /// Directory with upstream's `proxy-server` and `proxy-agent` (default: interop/bin).
    #[arg(long)]
    upstream_bin_dir: Option<PathBuf>,
    /// The rathole binary (default: where scripts/bench.sh installs it,
    /// `target/rathole-<version>/bin/rathole` beside this program's profile directory).
    #[arg(long)]
    rathole_bin: Option<PathBuf>,
    /// Keep the scratch directory (logs, configs) instead of deleting it.
    #[arg(long)]
    keep_work: bool,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write the report again from a finished run's directory (its run.txt and results.csv),
    /// with this build's report code, without measuring anything.
    Report {
        /// The run's output directory.
        #[arg(default_value = "results")]
        dir: PathBuf,
    },
    /// Internal: the sink/source/echo target (prints its address, serves until killed).
    Target {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
    },
    /// Internal: one relay of the relay-limit anchors (prints its address, forwards each
    /// connection to --to until killed).
    Relay {
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: String,
        /// Where each connection goes (host:port), dialled when it arrives.
        #[arg(long)]
        to: String,
        /// Mutual TLS towards --to, as a client.
        #[arg(long, requires_all = ["ca", "cert", "key"], conflicts_with = "tls_accept")]
        tls_connect: bool,
        /// Mutual TLS from incoming connections, as a server.
        #[arg(long, requires_all = ["ca", "cert", "key"])]
        tls_accept: bool,
        /// SIGUSR1 closes every connection through the relay (a middlebox cutting flows).
        #[arg(long)]
        cut_on_sigusr1: bool,
        /// CA bundle that verifies the TLS peer.
        #[arg(long)]
        ca: Option<PathBuf>,
        /// This side's certificate (PEM).
        #[arg(long)]
        cert: Option<PathBuf>,
        /// This side's private key (PEM).
        #[arg(long)]
        key: Option<PathBuf>,
    },
    /// Internal: fake agents of the fleet workload, on the native link: connects them, prints
    /// `progress N` lines, then `connected N`, then answers each `count` line on stdin
    /// (keepalive frames, closed streams, answered dials) until stdin ends.
    FleetAgents {
        /// The fleet's agent addresses, in server order.
        #[arg(long, value_delimiter = ',', required = true)]
        servers: Vec<std::net::SocketAddr>,
        /// mesh (every agent to every server) or k1 (each to one, round-robin).
        #[arg(long)]
        mode: String,
        /// The first agent (by index in the fleet) this process holds.
        #[arg(long)]
        from: usize,
        /// One past its last.
        #[arg(long)]
        to: usize,
        /// Part of every agent's ID.
        #[arg(long)]
        run_id: String,
        /// Connects at once at most.
        #[arg(long, default_value_t = 64)]
        concurrency: usize,
        /// CA bundle that verifies the servers.
        #[arg(long)]
        ca: PathBuf,
        /// The agents' certificate (PEM).
        #[arg(long)]
        cert: PathBuf,
        /// Its private key (PEM).
        #[arg(long)]
        key: PathBuf,
    },
    /// Draws a Grafana dashboard's panels as SVG time-series charts: each panel's own queries,
    /// read from the dashboard JSON, over a range of a Prometheus server's data
    /// (scripts/dashboard-snapshot.sh).
    Dashboard {
        /// The Grafana dashboard (JSON).
        #[arg(long)]
        dashboard: PathBuf,
        /// Prometheus's HTTP address (loopback), e.g. 127.0.0.1:9090.
        #[arg(long)]
        prometheus: std::net::SocketAddr,
        /// Start of the range, Unix seconds.
        #[arg(long)]
        start: f64,
        /// End of the range, Unix seconds.
        #[arg(long)]
        end: f64,
        /// Seconds between points.
        #[arg(long, default_value_t = 1.0)]
        step: f64,
        /// Prometheus's scrape interval in seconds (Grafana's `$__rate_interval` uses it).
        #[arg(long, default_value_t = 1.0)]
        scrape_interval: f64,
        /// A line under the title: where the data came from.
        #[arg(long, default_value = "")]
        subtitle: String,
        /// The SVG file to write.
        #[arg(long = "svg")]
        svg: PathBuf,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match args.command {
        // A relay is the smallest forwarder: one thread, no hand-offs between workers.
        Some(Cmd::Relay { .. }) => tokio::runtime::Builder::new_current_thread(),
        _ => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(2);
            b
        }
    }
    .enable_all()
    .build()
    .expect("tokio runtime");
    let result = rt.block_on(async {
        match args.command {
            Some(Cmd::Report { ref dir }) => rewrite_report(dir),
            Some(Cmd::Target { ref listen }) => {
                target::serve(listen).await.map(|()| ExitCode::SUCCESS)
            }
            Some(Cmd::FleetAgents {
                ref servers,
                ref mode,
                from,
                to,
                ref run_id,
                concurrency,
                ref ca,
                ref cert,
                ref key,
            }) => {
                tether_tls::install_default_provider();
                let link = workloads::fanin::Link::Native;
                let spec = async {
                    anyhow::Ok(workloads::fleet::AgentsSpec {
                        servers: servers.clone(),
                        mode: FleetMode::ALL
                            .into_iter()
                            .find(|m| m.name() == mode)
                            .with_context(|| format!("--mode: mesh or k1, not {mode:?}"))?,
                        agents: from..to,
                        run_id: run_id.clone(),
                        concurrency,
                        tls: systems::client_tls(ca, cert, key, link.alpn())?,
                    })
                };
                match spec.await {
                    Ok(spec) => workloads::fleet::serve_agents(spec)
                        .await
                        .map(|()| ExitCode::SUCCESS),
                    Err(e) => Err(e),
                }
            }
            Some(Cmd::Relay {
                ref listen,
                ref to,
                tls_connect,
                tls_accept,
                cut_on_sigusr1,
                ref ca,
                ref cert,
                ref key,
            }) => {
                let files = || relay::TlsFiles {
                    ca: ca.clone().unwrap_or_default(),
                    cert: cert.clone().unwrap_or_default(),
                    key: key.clone().unwrap_or_default(),
                };
                let tls = if tls_connect {
                    relay::Tls::Connect(files())
                } else if tls_accept {
                    relay::Tls::Accept(files())
                } else {
                    relay::Tls::None
                };
                relay::serve(listen, to, tls, cut_on_sigusr1)
                    .await
                    .map(|()| ExitCode::SUCCESS)
            }
            Some(Cmd::Dashboard {
                dashboard: ref file,
                prometheus,
                start,
                end,
                step,
                scrape_interval,
                ref subtitle,
                ref svg,
            }) => dashboard::run(&dashboard::Request {
                dashboard: file.clone(),
                prometheus,
                start,
                end,
                step,
                scrape_interval,
                subtitle: subtitle.clone(),
                out: svg.clone(),
            })
            .await
            .map(|()| ExitCode::SUCCESS),
            None => {
                tokio::select! {
                    r = bench(&args) => r,
                    _ = tokio::signal::ctrl_c() => {
                        eprintln!("tether-bench: interrupted; stopping everything");
                        Ok(ExitCode::from(130))
                    }
                }
            }
        }
    });
    // Dropping the runtime drops every task, and with them every child process.
    rt.shutdown_timeout(Duration::from_secs(5));
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tether-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// One unit of the plan.
#[derive(Clone, Debug)]
enum Task {
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

fn rewrite_report(dir: &Path) -> anyhow::Result<ExitCode> {
    let (results, meta, p) = report::saved::load(dir)?;
    report::write(dir, &results, &meta, &p)?;
    eprintln!(
        "tether-bench: report {} written again",
        dir.join("report.md").display()
    );
    Ok(ExitCode::SUCCESS)
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

async fn bench(args: &Args) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    tether_tls::install_default_provider();
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

    let bins = binaries(args)?;
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
    let workloads: Vec<Workload> = if args.workloads.is_empty() {
        Workload::ALL.to_vec()
    } else {
        args.workloads
            .iter()
            .map(|w| Workload::parse(w).with_context(|| format!("unknown workload {w:?}")))
            .collect::<anyhow::Result<_>>()?
    };

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
    let want_fds = p
        .idle_conns
        .max(p.fanin[1])
        .max(scale_share)
        .max(fleet_streams) as u64
        + 4096;
    let fds = procs::raise_fd_limit(want_fds);
    if fds < want_fds {
        eprintln!(
            "tether-bench: fd limit is {fds} (wanted {want_fds}); many-connection workloads may fail"
        );
    }

    // The fleet runs tether servers only: with a tether system in the run.
    let fleet = workloads.contains(&Workload::Fleet)
        && systems
            .iter()
            .any(|s| matches!(s, System::Konn(Impl::Tether | Impl::TetherPeer, _)));
    check_binaries(&bins, &systems)?;
    for note in &skipped {
        eprintln!("tether-bench: {note}");
    }

    let work = std::env::temp_dir().join(format!("tether-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let _cleanup = Cleanup {
        dir: work.clone(),
        keep: args.keep_work,
    };
    let pki = tether_tls::pki::Pki::generate()?.write_to(&work.join("pki"))?;

    let (mut target_proc, target) = spawn_target(&work.join("target.log")).await?;

    let env = Env {
        dir: work.clone(),
        pki,
        bins,
        target,
        started: Default::default(),
    };

    // The plan: every run visits every system (interleaved, so drift hits all alike), each
    // run starting one system further on: whichever system goes first in a run is measured
    // slower (seen with tether against tether-before swapped), so no system always does.
    let per_instance: Vec<Workload> = [
        Workload::IdleRss,
        Workload::Bulk,
        Workload::PingPong,
        Workload::Churn,
        Workload::Hol,
        Workload::Fairness,
    ]
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
            for &system in &systems {
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
            for &system in &systems {
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
            for &system in &systems {
                // kube-apiserver's reusable tunnel is gRPC over its Unix socket.
                let System::Konn(imp, Frontend::GrpcUds) = system else {
                    continue;
                };
                if imp.has_caps(&env.bins) {
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
    let weight = |t: &Task| match t {
        Task::Instance {
            workloads, system, ..
        } => {
            (if system.has_processes() { 2.0 } else { 0.2 })
                + workloads.iter().map(|w| w.weight(&p)).sum::<f64>()
        }
        Task::IdleConns { .. } => 2.0 + Workload::IdleConns.weight(&p),
        Task::ScaleConns { .. } => 2.0 + Workload::ScaleConns.weight(&p),
        Task::Resume { .. } => 2.0 + Workload::Resume.weight(&p),
        Task::Tunnel { .. } => 2.0 + Workload::Tunnel.weight(&p),
        Task::Fleet { mode, .. } => Workload::fleet_weight(&p, *mode),
        Task::FanIn { agents, large, .. } => {
            1.0 + *agents as f64 / 800.0
                + 4.0 * p.settle.as_secs_f64()
                + if *large {
                    p.idle_cpu_secs
                } else {
                    p.churn_secs
                }
        }
    };
    let total: f64 = tasks.iter().map(weight).sum();
    eprintln!(
        "tether-bench: {} systems, {} run(s), {} steps, about {} (estimate); target {target}; work dir {}",
        systems.len(),
        p.runs,
        tasks.len(),
        progress::clock(total),
        work.display()
    );
    let progress = Progress::new(tasks.len(), total);
    let (busy0, own0) = (procs::machine_busy_seconds(), procs::own_cpu_seconds());
    let load0 = loadavg();
    let mut results = Results::default();
    let mut notes = skipped;

    for task in &tasks {
        target_proc.check_alive()?;
        match task {
            Task::Instance {
                run,
                system,
                workloads,
            } => {
                progress.begin(
                    &format!(
                        "run {run}/{} · {} · start, then {}",
                        p.runs,
                        system.name(),
                        workloads
                            .iter()
                            .map(Workload::name)
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    weight(task),
                );
                run_instance(
                    &env,
                    &p,
                    *run,
                    *system,
                    workloads,
                    &progress,
                    &mut results,
                    &mut notes,
                )
                .await;
            }
            Task::IdleConns { run, system } => {
                progress.begin(
                    &format!(
                        "run {run}/{} · {} · {} idle tunnelled connections",
                        p.runs,
                        system.name(),
                        p.idle_conns
                    ),
                    weight(task),
                );
                let outcome = async {
                    let r = Running::start(&env, *system).await?;
                    let res = tokio::time::timeout(
                        Duration::from_secs(300),
                        workloads::idle::run(
                            &r,
                            std::slice::from_ref(&r.dialer),
                            p.idle_conns,
                            &p,
                            &progress,
                        ),
                    )
                    .await;
                    r.stop().await;
                    res.map_err(|_| anyhow::anyhow!("timed out"))?
                }
                .await;
                let figures = [
                    Metric::ConnServer,
                    Metric::ConnAgent,
                    Metric::ConnTotal,
                    Metric::ConnRssAfter,
                ];
                match outcome {
                    Ok(x) => record_idle(&progress, &mut results, *system, *run, &x, figures),
                    Err(e) => fail(&progress, &mut results, *system, "idle-conns", &e),
                }
            }
            Task::ScaleConns { run, system } => {
                progress.begin(
                    &format!(
                        "run {run}/{} · {} · {} idle tunnelled connections over {} agents",
                        p.runs,
                        system.name(),
                        p.scale_conns,
                        p.scale_agents
                    ),
                    weight(task),
                );
                let figures = [
                    Metric::ScaleServer,
                    Metric::ScaleAgents,
                    Metric::ScaleTotal,
                    Metric::ScaleRssAfter,
                ];
                match scale_conns(&env, &p, *run, *system, &progress).await {
                    Ok(x) => record_idle(&progress, &mut results, *system, *run, &x, figures),
                    Err(e) => fail(&progress, &mut results, *system, "scale-conns", &e),
                }
            }
            Task::Resume { run, system } => {
                progress.begin(
                    &format!(
                        "run {run}/{} · {} · ping-pong across {} cuts of the agent's stream",
                        p.runs,
                        system.name(),
                        p.resume_cuts
                    ),
                    weight(task),
                );
                let outcome = async {
                    let r = Running::start_with_cut_relay(&env, *system).await?;
                    let res = tokio::time::timeout(
                        Duration::from_secs(120),
                        workloads::resume::run(&r, &p),
                    )
                    .await;
                    r.stop().await;
                    res.map_err(|_| anyhow::anyhow!("timed out"))?
                }
                .await;
                match outcome {
                    Ok([p50, max]) => {
                        results.add(*system, Metric::ResumePauseP50, *run, p50);
                        results.add(*system, Metric::ResumePauseMax, *run, max);
                        progress.note(&format!(
                            "resume: the round trip across a cut p50 {p50:.1} ms, max {max:.1} ms"
                        ));
                    }
                    Err(e) => fail(&progress, &mut results, *system, "resume", &e),
                }
            }
            Task::Fleet { run, mode } => {
                progress.begin(
                    &format!(
                        "run {run}/{} · fleet of {} tether servers · {} fake agents, {}",
                        p.runs,
                        workloads::fleet::SERVERS,
                        p.fleet,
                        match mode {
                            FleetMode::Mesh => "each holding every server (full mesh)",
                            FleetMode::K1 => "each holding one server (K=1, round-robin)",
                        }
                    ),
                    weight(task),
                );
                let bound = Duration::from_secs(600);
                let outcome = tokio::time::timeout(
                    bound,
                    workloads::fleet::run(&env, &p, *mode, p.fleet, &progress),
                )
                .await
                .map_err(|_| anyhow::anyhow!("timed out after {bound:?}"))
                .and_then(|x| x);
                let workload = format!("fleet {}", mode.name());
                match outcome {
                    Ok(x) => {
                        record_fleet(&mut results, *run, *mode, &x);
                        progress.note(&x.line(*mode));
                    }
                    Err(e) => fail(&progress, &mut results, FLEET_SYSTEM, &workload, &e),
                }
            }
            Task::Tunnel { run, system, cap } => {
                progress.begin(
                    &format!(
                        "run {run}/{} · {} · {} · held streams {} beside short dials from {} workers",
                        p.runs,
                        system.name(),
                        cap.map_or("no stream cap".to_owned(), |c| format!("stream cap {c}")),
                        p.tunnel_held
                            .iter()
                            .map(usize::to_string)
                            .collect::<Vec<_>>()
                            .join(", "),
                        p.tunnel_concurrency
                    ),
                    weight(task),
                );
                tunnel(&env, &p, *run, *system, *cap, &progress, &mut results).await;
            }
            Task::FanIn {
                run,
                imp,
                agents,
                large,
            } => {
                let system = System::Konn(*imp, Frontend::HttpConnectUds);
                let link = workloads::fanin::Link::of(*imp);
                progress.begin(
                    &format!(
                        "run {run}/{} · {} server · {agents} fake agents on {}",
                        p.runs,
                        imp.name(),
                        link.name()
                    ),
                    weight(task),
                );
                let outcome = async {
                    let tls = systems::konnectivity_agent_tls(&env, link.alpn())?;
                    let r = Running::start_lone_server(&env, *imp).await?;
                    let res = tokio::time::timeout(
                        Duration::from_secs(300),
                        workloads::fanin::run(
                            &r,
                            &p,
                            *agents,
                            link,
                            if *large {
                                workloads::fanin::Extra::IdleCpu
                            } else {
                                workloads::fanin::Extra::SpreadDials
                            },
                            tls,
                            &progress,
                        ),
                    )
                    .await;
                    r.stop().await;
                    res.map_err(|_| anyhow::anyhow!("timed out"))?
                }
                .await;
                match outcome {
                    Ok(x) => {
                        let m = if *large {
                            Metric::AgentLarge
                        } else {
                            Metric::AgentSmall
                        };
                        results.add(system, m, *run, x.kib_per_agent);
                        if let Some(cpu) = x.idle_cpu_ms_per_agent_min {
                            results.add(system, Metric::AgentIdleCpu, *run, cpu);
                        }
                        if *large {
                            results.add(system, Metric::AgentRssAfter, *run, x.rss_after_ratio);
                        }
                        if let Some(d) = &x.dials {
                            let c = &d.churn;
                            results.add(system, Metric::FanInChurnRate, *run, c.conns_per_s);
                            results.add(system, Metric::FanInChurnDialP50, *run, c.dial_p50_us);
                            results.add(system, Metric::FanInChurnDialP99, *run, c.dial_p99_us);
                            if let Some(cpu) = c.cpu_us_per_conn {
                                results.add(system, Metric::FanInChurnCpu, *run, cpu);
                            }
                            results.add(system, Metric::FanInDialSpread, *run, d.max_over_mean());
                            progress.note(&format!(
                                "churn c=64 across {agents} agents: {:.0} conn/s, dial p50 {:.0} µs, p99 {:.0} µs; dials per agent {}–{} (busiest ÷ mean {:.2}, {} answered){}",
                                c.conns_per_s,
                                c.dial_p50_us,
                                c.dial_p99_us,
                                d.min(),
                                d.max(),
                                d.max_over_mean(),
                                d.answered(),
                                if c.errors.is_empty() { String::new() } else { format!(", {} errors", c.errors.len()) }
                            ));
                            for (msg, n) in group(&c.errors) {
                                results.error(system, "fanin churn", format!("{n}× {msg}"));
                            }
                        }
                        progress.note(&format!(
                            "server +{:.1} KiB per agent (server counts {}); idle CPU {} ms per agent per minute; RSS after they left ×{:.2} of before",
                            x.kib_per_agent,
                            x.server_counted.map_or("?".into(), |c| format!("{c}")),
                            x.idle_cpu_ms_per_agent_min.map_or("–".into(), |c| format!("{c:.2}")),
                            x.rss_after_ratio
                        ));
                    }
                    Err(e) => fail(&progress, &mut results, system, "fanin", &e),
                }
            }
        }
    }
    let (busy1, own1) = (procs::machine_busy_seconds(), procs::own_cpu_seconds());
    drop(target_proc);

    let mut machine = machine_info().await;
    let wall = started.elapsed().as_secs_f64();
    if let (Some(b0), Some(b1)) = (busy0, busy1) {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let foreign = ((b1 - b0) - (own1 - own0)).max(0.0);
        let line = format!(
            "other processes on the machine used {:.0}% of its {cpus} CPUs during the run ({:.0} CPU s); load average {} at the start, {} at the end",
            100.0 * foreign / (wall * cpus),
            foreign,
            load0,
            loadavg()
        );
        eprintln!("tether-bench: {line}");
        machine.push_str(&format!(
            "
{line}"
        ));
    }

    let machine = machine;
    let meta = report::Meta {
        command: command_line(),
        date: run_cmd("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
            .await
            .trim()
            .to_owned(),
        machine,
        elapsed_secs: started.elapsed().as_secs_f64(),
        quick: args.quick,
        systems: systems.clone(),
        notes,
    };
    let md = report::write(&args.out, &results, &meta, &p)?;
    let _ = md;
    eprintln!(
        "tether-bench: done in {}; report {}",
        progress::clock(started.elapsed().as_secs_f64()),
        args.out.join("report.md").display()
    );

    // Everything planned must have produced its figures, without errors.
    let missing = missing_figures(&results, &tasks, &p);
    for m in &missing {
        eprintln!("tether-bench: missing figure: {m}");
    }
    if !results.errors.is_empty() {
        eprintln!("tether-bench: {} error(s):", results.errors.len());
        for (s, w, e) in &results.errors {
            eprintln!("  {} · {w}: {e}", s.name());
        }
    }
    Ok(if results.errors.is_empty() && missing.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The tunnel workload: a fresh instance of `system` (whose server allows `cap` streams per
/// frontend connection), every point of the sweep on it in turn, each bounded.
async fn tunnel(
    env: &Env,
    p: &Profile,
    run: usize,
    system: System,
    cap: Option<u32>,
    progress: &Progress,
    results: &mut Results,
) {
    let started = match cap {
        Some(cap) => Running::start_with_stream_cap(env, system, cap).await,
        None => Running::start(env, system).await,
    };
    let mut r = match started {
        Ok(r) => r,
        Err(e) => {
            fail(progress, results, system, "tunnel start", &e);
            return;
        }
    };
    // Held streams beyond the cap wait out their dial deadline, 64 at a time.
    let bound = Duration::from_secs(300);
    for &held in &p.tunnel_held {
        let point = TunnelPoint {
            cap,
            held: held as u32,
        };
        let workload = format!(
            "tunnel cap={} held={held}",
            cap.map_or("none".to_owned(), |c| c.to_string())
        );
        let res = tokio::time::timeout(bound, workloads::tunnel::run(&r, p, held, progress))
            .await
            .map_err(|_| anyhow::anyhow!("timed out after {bound:?}"))
            .and_then(|x| x);
        match res {
            Ok(x) => {
                let c = &x.churn;
                let m = |figure| Metric::Tunnel(point, figure);
                results.add(system, m(TunnelFigure::Rate), run, c.conns_per_s);
                results.add(system, m(TunnelFigure::DialP50), run, c.dial_p50_us);
                results.add(system, m(TunnelFigure::DialP99), run, c.dial_p99_us);
                if let Some(cpu) = c.cpu_us_per_conn {
                    results.add(system, m(TunnelFigure::Cpu), run, cpu);
                }
                results.add(
                    system,
                    m(TunnelFigure::HeldFailed),
                    run,
                    x.held_failed as f64,
                );
                results.add(system, m(TunnelFigure::Errors), run, c.errors.len() as f64);
                if let Some(peak) = x.peak_streams {
                    results.add(system, m(TunnelFigure::PeakStreams), run, peak);
                }
                progress.note(&x.line(cap));
                for (msg, n) in group(&x.held_errors).into_iter().chain(group(&c.errors)) {
                    results.error(system, &workload, format!("{n}× {msg}"));
                }
            }
            Err(e) => fail(progress, results, system, &workload, &e),
        }
        if let Err(e) = r.check_alive() {
            fail(progress, results, system, &workload, &e);
            break;
        }
    }
    r.stop().await;
}

/// Files a fleet result under its mode's figures.
fn record_fleet(
    results: &mut Results,
    run: usize,
    mode: FleetMode,
    x: &workloads::fleet::FleetResult,
) {
    let mut add =
        |figure, value| results.add(FLEET_SYSTEM, Metric::Fleet(mode, figure), run, value);
    add(FleetFigure::Streams, x.streams);
    add(FleetFigure::StreamsPerAgent, x.streams_per_agent());
    add(FleetFigure::PeerRoutes, x.remote_routes);
    add(FleetFigure::ServersRss, x.rss_mib());
    add(FleetFigure::KibPerAgent, x.kib_per_agent());
    add(FleetFigure::ServerPings, x.server_pings());
    add(FleetFigure::AgentPings, x.agent_pings());
    add(FleetFigure::Pings, x.server_pings() + x.agent_pings());
    add(FleetFigure::CpuPerAgent, x.cpu_ms_per_agent_min());
    add(FleetFigure::CpuPct, x.cpu_pct());
    add(FleetFigure::ConnectSecs, x.connect_secs);
    add(FleetFigure::ConnectCpu, x.connect_cpu_secs);
    add(FleetFigure::ConnectRetries, x.retries as f64);
    if let Some(d) = &x.dial {
        add(FleetFigure::HopDialP50, d.hop_p50_us);
        add(FleetFigure::DirectDialP50, d.direct_p50_us);
    }
}

/// Files an idle-connections result under `figures` (server, agents, both, RSS after).
fn record_idle(
    progress: &Progress,
    results: &mut Results,
    system: System,
    run: usize,
    x: &workloads::idle::IdleResult,
    figures: [Metric; 4],
) {
    let [server, agents, total, after] = figures;
    results.add(system, server, run, x.server_kib);
    results.add(system, agents, run, x.agent_kib);
    results.add(system, total, run, x.server_kib + x.agent_kib);
    results.add(system, after, run, x.rss_after_ratio);
    progress.note(&format!(
        "{} open: server {:.1} KiB + agents {:.1} KiB per connection; RSS after they closed ×{:.2} of before",
        x.open, x.server_kib, x.agent_kib, x.rss_after_ratio
    ));
}

/// The target, as its own process: (process, address).
async fn spawn_target(log: &Path) -> anyhow::Result<(procs::Proc, std::net::SocketAddr)> {
    let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
    cmd.args(["target", "--listen", "127.0.0.1:0"]);
    procs::Proc::spawn_listening("target", cmd, log).await
}

/// The scale workload: `p.scale_agents` agents and as many targets of their own, and
/// `p.scale_conns` idle connections spread over them, so that no process holds more than
/// its share of the sockets.
async fn scale_conns(
    env: &Env,
    p: &Profile,
    run: usize,
    system: System,
    progress: &Progress,
) -> anyhow::Result<workloads::idle::IdleResult> {
    let mut targets = Vec::with_capacity(p.scale_agents);
    for i in 0..p.scale_agents {
        let log = env
            .dir
            .join(format!("scale-{run}-{}-target-{i}.log", system.id()));
        targets.push(spawn_target(&log).await?);
    }
    let outcome = async {
        let r = Running::start_scaled(env, system, p.scale_agents).await?;
        // On an error, dropping `r` kills its processes.
        let dialers = targets
            .iter()
            .map(|(_, a)| r.dialer.aimed_at(*a))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let res = tokio::time::timeout(
            Duration::from_secs(600),
            workloads::idle::run(&r, &dialers, p.scale_conns, p, progress),
        )
        .await;
        r.stop().await;
        res.map_err(|_| anyhow::anyhow!("timed out"))?
    }
    .await;
    for (t, _) in targets {
        t.stop().await;
    }
    outcome
}

#[allow(clippy::too_many_arguments)]
async fn run_instance(
    env: &Env,
    p: &Profile,
    run: usize,
    system: System,
    workloads: &[Workload],
    progress: &Progress,
    results: &mut Results,
    notes: &mut Vec<String>,
) {
    let mut r = match Running::start(env, system).await {
        Ok(r) => r,
        Err(e) => {
            fail(progress, results, system, "start", &e);
            return;
        }
    };
    // Generous bound per workload, so nothing can hang the whole benchmark.
    let bound = Duration::from_secs(120);
    for &w in workloads {
        let outcome: anyhow::Result<()> = async {
            match w {
                Workload::IdleRss => {
                    if system.has_processes() {
                        tokio::time::sleep(p.settle).await;
                        let (s, a) = (r.server_rss(), r.agent_rss());
                        let (sa, aa) = (r.server_rss_anon(), r.agent_rss_anon());
                        let mib = |b: u64| b as f64 / (1 << 20) as f64;
                        for (m, v) in [
                            (Metric::IdleRssServer, s),
                            (Metric::IdleRssAgent, a),
                            (Metric::IdleAnonServer, sa),
                            (Metric::IdleAnonAgent, aa),
                        ] {
                            if let Some(v) = v {
                                results.add(system, m, run, mib(v));
                            }
                        }
                        progress.note(&format!(
                            "idle RSS: server {:.1} MiB ({:.1} anonymous), agent {:.1} MiB ({:.1} anonymous)",
                            mib(s.unwrap_or(0)),
                            mib(sa.unwrap_or(0)),
                            mib(a.unwrap_or(0)),
                            mib(aa.unwrap_or(0))
                        ));
                    }
                }
                Workload::Bulk => {
                    for dir in [Direction::Upload, Direction::Download] {
                        let res = tokio::time::timeout(bound, workloads::bulk::run(&r, p, dir)).await;
                        match res.map_err(|_| anyhow::anyhow!("timed out")).and_then(|x| x) {
                            Ok(b) => {
                                let (m, c) = match dir {
                                    Direction::Upload => (Metric::BulkUp, Metric::CpuUp),
                                    Direction::Download => (Metric::BulkDown, Metric::CpuDown),
                                };
                                results.add(system, m, run, b.mib_s);
                                if let Some(cpu) = b.cpu_s_per_gib {
                                    results.add(system, c, run, cpu);
                                }
                                progress.note(&format!(
                                    "bulk {}: {:.0} MiB/s{}",
                                    dir.name(),
                                    b.mib_s,
                                    b.cpu_s_per_gib.map_or(String::new(), |c| format!(", {c:.2} CPU s/GiB"))
                                ));
                            }
                            Err(e) => fail(progress, results, system, &format!("bulk {}", dir.name()), &e),
                        }
                    }
                }
                Workload::PingPong => {
                    let [p50, p99, p999] = tokio::time::timeout(bound, workloads::pingpong::run(&r, p))
                        .await
                        .map_err(|_| anyhow::anyhow!("timed out"))??;
                    results.add(system, Metric::PingP50, run, p50);
                    results.add(system, Metric::PingP99, run, p99);
                    results.add(system, Metric::PingP999, run, p999);
                    progress.note(&format!("ping-pong: p50 {p50:.0} µs, p99 {p99:.0} µs, p99.9 {p999:.0} µs"));
                }
                Workload::Churn => {
                    for c in [1usize, 64] {
                        let x = tokio::time::timeout(bound, workloads::churn::run(&r, p, c))
                            .await
                            .map_err(|_| anyhow::anyhow!("timed out"))?;
                        let (rate, d50, d99) = if c == 1 {
                            (Metric::Churn1Rate, Metric::Churn1DialP50, Metric::Churn1DialP99)
                        } else {
                            (Metric::Churn64Rate, Metric::Churn64DialP50, Metric::Churn64DialP99)
                        };
                        results.add(system, rate, run, x.conns_per_s);
                        results.add(system, d50, run, x.dial_p50_us);
                        results.add(system, d99, run, x.dial_p99_us);
                        if c == 64
                            && let Some(cpu) = x.cpu_us_per_conn
                        {
                            results.add(system, Metric::ChurnCpu, run, cpu);
                        }
                        progress.note(&format!(
                            "churn c={c}: {:.0} conn/s, dial p50 {:.0} µs, p99 {:.0} µs{}",
                            x.conns_per_s,
                            x.dial_p50_us,
                            x.dial_p99_us,
                            if x.errors.is_empty() { String::new() } else { format!(", {} errors", x.errors.len()) }
                        ));
                        for (msg, n) in group(&x.errors) {
                            results.error(system, &format!("churn c={c}"), format!("{n}× {msg}"));
                        }
                    }
                }
                Workload::Hol => {
                    let x = tokio::time::timeout(bound, workloads::hol::run(&r, p))
                        .await
                        .map_err(|_| anyhow::anyhow!("timed out"))??;
                    results.add(system, Metric::HolRatio, run, x.ratio);
                    progress.note(&format!(
                        "head-of-line: alone {:.0} MiB/s, next to a stalled reader {:.0} MiB/s → ratio {:.2}{}",
                        x.alone_mib_s,
                        x.stalled_mib_s,
                        x.ratio,
                        if x.dial_blocked { " (the dial itself was blocked)" } else { "" }
                    ));
                    if x.dial_blocked {
                        notes.push(format!(
                            "{}: head-of-line: the dial next to the stalled connection did not complete within the window (run {run})",
                            system.name()
                        ));
                    }
                }
                Workload::Fairness => {
                    let x = tokio::time::timeout(bound, workloads::fairness::run(&r, p))
                        .await
                        .map_err(|_| anyhow::anyhow!("timed out"))??;
                    results.add(system, Metric::FairP99Ratio, run, x.p99_ratio());
                    results.add(system, Metric::FairBulkRatio, run, x.bulk_ratio());
                    progress.note(&format!(
                        "fairness: ping p50/p99 alone {:.0}/{:.0} µs, next to {} downloads {:.0}/{:.0} µs (p99 ×{:.2}); downloads {:.0} MiB/s alone, {:.0} MiB/s with the ping-pong (×{:.2})",
                        x.ping_alone[0],
                        x.ping_alone[1],
                        workloads::fairness::BULK,
                        x.ping_shared[0],
                        x.ping_shared[1],
                        x.p99_ratio(),
                        x.bulk_alone_mib_s,
                        x.bulk_shared_mib_s,
                        x.bulk_ratio()
                    ));
                }
                Workload::IdleConns
                | Workload::ScaleConns
                | Workload::FanIn
                | Workload::Resume
                | Workload::Tunnel
                | Workload::Fleet => {}
            }
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = outcome {
            fail(progress, results, system, w.name(), &e);
        }
        if let Err(e) = r.check_alive() {
            fail(progress, results, system, w.name(), &e);
            break;
        }
    }
    r.stop().await;
}

fn fail(
    progress: &Progress,
    results: &mut Results,
    system: System,
    workload: &str,
    e: &anyhow::Error,
) {
    progress.note(&format!("ERROR in {workload}: {e:#}"));
    results.error(system, workload, format!("{e:#}"));
}

/// Identical messages counted, in first-seen order.
fn group(errors: &[String]) -> Vec<(String, usize)> {
    let mut order = Vec::new();
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for e in errors {
        let n = counts.entry(e.as_str()).or_insert(0);
        if *n == 0 {
            order.push(e.clone());
        }
        *n += 1;
    }
    order
        .into_iter()
        .map(|e| {
            let n = counts[e.as_str()];
            (e, n)
        })
        .collect()
}

fn missing_figures(results: &Results, tasks: &[Task], p: &Profile) -> Vec<String> {
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

fn binaries(args: &Args) -> anyhow::Result<Binaries> {
    let exe = std::env::current_exe()?;
    let tether = args
        .tether_bin
        .clone()
        .unwrap_or_else(|| exe.with_file_name("tether"));
    let up = args
        .upstream_bin_dir
        .clone()
        .unwrap_or_else(|| repo_root().join("interop/bin"));
    let which = |name: &str, fallback: &str| {
        std::env::var_os("PATH")
            .and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|d| d.join(name))
                    .find(|p| p.exists())
            })
            .unwrap_or_else(|| PathBuf::from(fallback))
    };
    // A build from before the connection caps existed refuses their flags.
    let before_has_caps = match &args.before_tether_bin {
        Some(bin) => std::process::Command::new(bin)
            .args(["server", "--help"])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).contains("--max-streams-per-frontend-connection")
            })
            .with_context(|| format!("running {} server --help", bin.display()))?,
        None => false,
    };
    Ok(Binaries {
        tether,
        tether_before: args.before_tether_bin.clone(),
        before_has_caps,
        upstream_server: up.join("proxy-server"),
        upstream_agent: up.join("proxy-agent"),
        sshd: PathBuf::from("/usr/sbin/sshd"),
        ssh: which("ssh", "/usr/bin/ssh"),
        ssh_keygen: which("ssh-keygen", "/usr/bin/ssh-keygen"),
        rathole: args.rathole_bin.clone().unwrap_or_else(|| {
            // target/<profile>/tether-bench → target/rathole-<version>/bin/rathole
            exe.parent()
                .and_then(Path::parent)
                .unwrap_or(Path::new("."))
                .join(format!("rathole-{}/bin/rathole", systems::RATHOLE_VERSION))
        }),
    })
}

fn check_binaries(b: &Binaries, systems: &[System]) -> anyhow::Result<()> {
    let mut need = Vec::new();
    for s in systems {
        match s {
            System::Konn(Impl::Tether | Impl::TetherH2 | Impl::TetherWs | Impl::TetherPeer, _) => {
                need.push((&b.tether, "cargo build --release -p tether"))
            }
            System::Konn(Impl::TetherBefore, _) => match &b.tether_before {
                Some(path) => need.push((path, "build the earlier commit's tether")),
                None => anyhow::bail!("the tether-before systems need --before-tether-bin"),
            },
            System::Konn(Impl::Upstream, _) => {
                need.push((&b.upstream_server, "interop/build.sh"));
                need.push((&b.upstream_agent, "interop/build.sh"));
            }
            System::SshL | System::SshR => {
                need.push((&b.sshd, "apt-get install -y openssh-server openssh-client"));
                need.push((&b.ssh, "apt-get install -y openssh-client"));
            }
            System::Rathole => need.push((&b.rathole, systems::RATHOLE_INSTALL)),
            System::Direct | System::RelayLimit { .. } => {}
        }
    }
    for (path, how) in need {
        if !path.exists() {
            bail!(
                "{} not found (build or install it: {how}; scripts/bench.sh does all of it)",
                path.display()
            );
        }
    }
    Ok(())
}

struct Cleanup {
    dir: PathBuf,
    keep: bool,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("tether-bench: kept work dir {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

fn command_line() -> String {
    let mut args: Vec<String> = std::env::args().collect();
    if let Some(first) = args.first_mut()
        && let Some(name) = Path::new(first.as_str()).file_name()
    {
        *first = name.to_string_lossy().into_owned();
    }
    args.join(" ")
}

async fn run_cmd(cmd: &str, args: &[&str]) -> String {
    match tokio::process::Command::new(cmd).args(args).output().await {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(_) => String::new(),
    }
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

async fn machine_info() -> String {
    let nproc = run_cmd("nproc", &[]).await;
    let lscpu = run_cmd("lscpu", &[]).await;
    let kernel = run_cmd("uname", &["-srm"]).await;
    let mem = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().next().map(str::to_owned))
        .unwrap_or_default();
    let lscpu_head: Vec<&str> = lscpu.lines().take(10).collect();
    format!(
        "nproc: {}\nkernel: {}\n{}\n{}",
        nproc.trim(),
        kernel.trim(),
        mem,
        lscpu_head.join("\n")
    )
}
