//! Running the plan's steps: each starts what it measures, runs its workloads within a
//! bound, files the figures (or the error) in the results, and stops everything it started.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::plan::{self, Task};
use crate::procs;
use crate::progress::Progress;
use crate::results::{FleetFigure, Metric, Results, TunnelFigure, TunnelPoint};
use crate::systems::{self, Env, FLEET_SYSTEM, Frontend, Impl, Running, System};
use crate::workloads::FleetMode;
use crate::workloads::{self, Profile, Workload, bulk::Direction};

/// Runs one step of the plan, filing what it measured (or why it could not) in `results`;
/// `notes` gathers remarks for the report.
pub async fn run(
    task: &Task,
    env: &Env,
    p: &Profile,
    progress: &Progress,
    results: &mut Results,
    notes: &mut Vec<String>,
) {
    progress.begin(&plan::describe(task, p), plan::weight(task, p));
    match task {
        Task::Instance {
            run,
            system,
            workloads,
        } => {
            run_instance(env, p, *run, *system, workloads, progress, results, notes).await;
        }
        Task::IdleConns { run, system } => {
            let outcome = async {
                let r = Running::start(env, *system).await?;
                let res = tokio::time::timeout(
                    Duration::from_secs(300),
                    workloads::idle::run(
                        &r,
                        std::slice::from_ref(&r.dialer),
                        p.idle_conns,
                        p,
                        progress,
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
                Ok(x) => record_idle(progress, results, *system, *run, &x, figures),
                Err(e) => fail(progress, results, *system, "idle-conns", &e),
            }
        }
        Task::ScaleConns { run, system } => {
            let figures = [
                Metric::ScaleServer,
                Metric::ScaleAgents,
                Metric::ScaleTotal,
                Metric::ScaleRssAfter,
            ];
            match scale_conns(env, p, *run, *system, progress).await {
                Ok(x) => record_idle(progress, results, *system, *run, &x, figures),
                Err(e) => fail(progress, results, *system, "scale-conns", &e),
            }
        }
        Task::Resume { run, system } => {
            let outcome = async {
                let r = Running::start_with_cut_relay(env, *system).await?;
                let res =
                    tokio::time::timeout(Duration::from_secs(120), workloads::resume::run(&r, p))
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
                Err(e) => fail(progress, results, *system, "resume", &e),
            }
        }
        Task::Fleet { run, mode } => {
            let bound = Duration::from_secs(600);
            let outcome = tokio::time::timeout(
                bound,
                workloads::fleet::run(env, p, *mode, p.fleet, progress),
            )
            .await
            .map_err(|_| anyhow::anyhow!("timed out after {bound:?}"))
            .and_then(|x| x);
            let workload = format!("fleet {}", mode.name());
            match outcome {
                Ok(x) => {
                    record_fleet(results, *run, *mode, &x);
                    progress.note(&x.line(*mode));
                }
                Err(e) => fail(progress, results, FLEET_SYSTEM, &workload, &e),
            }
        }
        Task::Tunnel { run, system, cap } => {
            tunnel(env, p, *run, *system, *cap, progress, results).await;
        }
        Task::FanIn {
            run,
            imp,
            agents,
            large,
        } => {
            fanin(env, p, *run, *imp, *agents, *large, progress, results).await;
        }
    }
}

/// The fan-in workload: a lone server of `imp` with `agents` fake agents; the small size
/// also spreads dials over them, the large one measures their idle CPU.
#[allow(clippy::too_many_arguments)]
async fn fanin(
    env: &Env,
    p: &Profile,
    run: usize,
    imp: Impl,
    agents: usize,
    large: bool,
    progress: &Progress,
    results: &mut Results,
) {
    let system = System::Konn(imp, Frontend::HttpConnectUds);
    let link = workloads::fanin::Link::of(imp);
    let outcome = async {
        let tls = systems::konnectivity_agent_tls(env, link.alpn())?;
        let r = Running::start_lone_server(env, imp).await?;
        let res = tokio::time::timeout(
            Duration::from_secs(300),
            workloads::fanin::run(
                &r,
                p,
                agents,
                link,
                if large {
                    workloads::fanin::Extra::IdleCpu
                } else {
                    workloads::fanin::Extra::SpreadDials
                },
                tls,
                progress,
            ),
        )
        .await;
        r.stop().await;
        res.map_err(|_| anyhow::anyhow!("timed out"))?
    }
    .await;
    match outcome {
        Ok(x) => {
            let m = if large {
                Metric::AgentLarge
            } else {
                Metric::AgentSmall
            };
            results.add(system, m, run, x.kib_per_agent);
            if let Some(cpu) = x.idle_cpu_ms_per_agent_min {
                results.add(system, Metric::AgentIdleCpu, run, cpu);
            }
            if large {
                results.add(system, Metric::AgentRssAfter, run, x.rss_after_ratio);
            }
            if let Some(d) = &x.dials {
                let c = &d.churn;
                results.add(system, Metric::FanInChurnRate, run, c.conns_per_s);
                results.add(system, Metric::FanInChurnDialP50, run, c.dial_p50_us);
                results.add(system, Metric::FanInChurnDialP99, run, c.dial_p99_us);
                if let Some(cpu) = c.cpu_us_per_conn {
                    results.add(system, Metric::FanInChurnCpu, run, cpu);
                }
                results.add(system, Metric::FanInDialSpread, run, d.max_over_mean());
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
        Err(e) => fail(progress, results, system, "fanin", &e),
    }
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
pub async fn spawn_target(log: &Path) -> anyhow::Result<(procs::Proc, std::net::SocketAddr)> {
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
