//! `tether-bench soak`: a fleet of tether servers (peered; gRPC and HTTP CONNECT frontends)
//! and agents (on the three agent links) under client traffic while a seeded schedule of
//! faults kills, freezes, drains and cuts the agents, kills and freezes the servers (past
//! their Leases' duration, with `--leases`), changes and breaks their routing file and
//! rotates the certificates; afterwards every fault is healed and the fleet must come back to
//! where it started. Variants run it against upstream's servers and agents, or a mix. The
//! run fails on any breach: a client operation that hung or lost bytes without an error, a
//! gauge, counter or file descriptor count that does not return to its baseline, a panic or
//! an unexplained error in any log.
//!
//! The seed, the schedule and each fault's time are in the report, so a failure can be
//! replayed with `--seed`.

mod agents;
mod checks;
mod faults;
mod files;
mod leases;
mod memory;
mod relay;
mod schedule;
mod traffic;

use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::systems::{Env, Fleet, Frontend, Setup, flag};
use agents::Agent;
use checks::Baseline;
use faults::Chaos;
use files::Files;
use leases::Leases;
use memory::Memory;
use schedule::{Fault, FaultKind};

/// The average gap between faults.
const FAULT_GAP: Duration = Duration::from_secs(3);
/// How often the processes' memory is sampled.
const RSS_EVERY: Duration = Duration::from_secs(5);

/// What a soak run does.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub duration: Duration,
    pub servers: usize,
    pub agents: usize,
    pub churners: usize,
    /// The same schedule against upstream's proxy-server and proxy-agent, for reference.
    pub upstream: bool,
    /// A mixed fleet: how many of the agents, and of the servers, are upstream's.
    pub upstream_agents: usize,
    pub upstream_servers: usize,
    /// Servers publish Leases in a real kube-apiserver and tether's agents count them; the
    /// schedule adds Lease expiries.
    pub leases: bool,
    pub out: PathBuf,
}

/// Runs the soak in `env`; the report goes to `out/soak.md`.
pub async fn run(env: &Env, o: &Options) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        o.agents >= 1 && o.servers >= 1,
        "at least one server and one agent"
    );
    let dir = env.dir.join("soak");
    let mut files = Files::create(&dir.join("files"))?;
    let leases = match o.leases {
        true => Some(Leases::start().await?),
        false => None,
    };
    let setup = fleet_setup(env, o, &files, leases.as_ref());
    let mut fleet = Fleet::start(env, &setup).await?;
    // Heap figures for the memory samples (memory.rs), and the Lease flags.
    let mut agent_flags = vec![OsString::from("--enable-profiling")];
    agent_flags.extend(leases.as_ref().map(Leases::agent_flags).unwrap_or_default());
    let mut agents = Vec::with_capacity(o.agents);
    for n in 0..o.agents {
        // A mixed fleet's upstream agents are its last ones.
        let upstream = o.upstream || n >= o.agents - o.upstream_agents.min(o.agents);
        let spec = (n, upstream, agent_flags.as_slice());
        agents.push(Agent::start(env, &files.paths, &fleet, spec, &dir).await?);
    }
    let all = o.agents as f64;
    fleet
        .wait_until(checks::SETTLE, "every agent held", |_, c| c.agents == all)
        .await?;
    let baseline = Baseline::take(&fleet, &agents);
    eprintln!(
        "tether-bench soak: seed {}, {} servers, {} agents, {:?}; baseline fds: servers {:?}, agents ≤ {}",
        o.seed, o.servers, o.agents, o.duration, baseline.servers, baseline.agents
    );

    let target = env.target.to_string();
    let entries: Vec<Arc<traffic::Entry>> = fleet
        .members
        .iter()
        .enumerate()
        .map(|(n, m)| Arc::new(traffic::Entry::new(m, n, o.upstream, &target)))
        .collect();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let ledger = traffic::Shared::new(started);
    let control_planes: Vec<traffic::ControlPlane> = agents
        .iter()
        .filter_map(|a| {
            a.control_plane.map(|port| traffic::ControlPlane {
                port,
                kills: a.kills.clone(),
            })
        })
        .collect();
    let mut clients = traffic::start(&entries, &control_planes, o.churners, &ledger, &stop);

    let plan = schedule::Plan {
        agents: o.agents,
        servers: o.servers,
        gap: FAULT_GAP,
        until: o.duration,
        leases: o.leases,
    };
    let faults = schedule::draw(o.seed, plan);
    let mut log = String::new();
    let mut breaches = Vec::new();
    let rss_before = fleet.rss();
    let mut memory = Memory::default();
    let mut chaos = Chaos::new(&mut fleet, &mut agents, &mut files, leases.as_ref());
    inject(
        &faults,
        &mut chaos,
        started,
        o.duration,
        &mut log,
        &mut breaches,
        &mut memory,
    )
    .await;

    stop.cancel();
    let stopped = tokio::time::timeout(traffic::OP_DEADLINE + Duration::from_secs(5), async {
        while clients.join_next().await.is_some() {}
    })
    .await;
    if stopped.is_err() {
        breaches.push("the clients did not stop within their deadline".to_owned());
        // Stragglers would hold tunnels open and fail the checks below as well.
        clients.abort_all();
    }
    drop(entries);
    let elapsed = started.elapsed();

    // Healed: every fault has ended; the fleet must return to its baseline.
    checks::settle(
        &fleet,
        &agents,
        &baseline,
        &files.routing_sha256(),
        leases.as_ref(),
        &mut breaches,
    )
    .await;
    let mut upstream_logs: Vec<&std::path::Path> = agents
        .iter()
        .filter(|a| a.upstream)
        .map(Agent::log)
        .collect();
    upstream_logs.extend(fleet.members.iter().filter(|m| m.upstream).map(|m| m.log()));
    let upstream_errors =
        checks::scan_logs(&[&dir, &fleet.dir], &faults, &upstream_logs, &mut breaches);
    let rss = (rss_before, fleet.rss(), memory);
    let ledger = ledger.take();
    breaches.extend(ledger.breaches.iter().cloned());
    if ledger.unlisted_breaches > 0 {
        breaches.push(format!(
            "{} more breaches by the clients, not listed",
            ledger.unlisted_breaches
        ));
    }

    let report = report(
        o,
        elapsed,
        &faults,
        &log,
        &ledger,
        &rss,
        (&breaches, upstream_errors),
    );
    std::fs::create_dir_all(&o.out)?;
    let path = o.out.join("soak.md");
    std::fs::write(&path, &report)?;
    std::fs::write(o.out.join("memory.csv"), rss.2.csv())?;
    eprintln!("{report}");
    eprintln!("tether-bench soak: report {}", path.display());
    for agent in &mut agents {
        agent.kill().await;
    }
    fleet.stop().await;
    Ok(if breaches.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// How the soak's servers start: every second one serves HTTP CONNECT, the others gRPC, all
/// on the soak's files, with reverse dials to the echo target and, with `leases`, Leases.
fn fleet_setup(env: &Env, o: &Options, files: &Files, leases: Option<&Leases>) -> Setup {
    let mut extra_flags = vec![
        flag("routing-config", &files.routing_path),
        "--tls-reload-interval=1s".into(),
        // The agents' reverse dials reach the echo target as a control-plane endpoint.
        flag("control-plane-endpoints", env.target.to_string()),
        // Its heap figures for the memory samples (memory.rs).
        "--enable-profiling".into(),
    ];
    extra_flags.extend(leases.map(Leases::server_flags).unwrap_or_default());
    Setup {
        // HTTP CONNECT over TCP and mutual TLS: over a Unix socket, a tunnel cut short reads
        // as a clean end (no reset on a Unix socket), so no client could tell lost bytes from
        // a close.
        frontends: (0..o.servers)
            .map(|n| match n % 2 {
                0 => Frontend::GrpcUds,
                _ => Frontend::HttpConnectTls,
            })
            .collect(),
        extra_flags,
        pki: files.paths.clone(),
        upstream: if o.upstream {
            o.servers
        } else {
            o.upstream_servers
        },
    }
}

/// Strikes every fault at its time and heals it `hold` later, in time order, until `until`
/// after `started`, sampling the processes' memory every [`RSS_EVERY`] meanwhile; each line of
/// `log` says when a fault was due and how long it took (a restart: until the process is
/// ready). What a fault's strike or heal reports is a breach.
async fn inject(
    faults: &[Fault],
    chaos: &mut Chaos<'_>,
    started: Instant,
    until: Duration,
    log: &mut String,
    breaches: &mut Vec<String>,
    memory: &mut Memory,
) {
    // (when, the fault, whether this is its healing)
    let mut events: Vec<(Duration, &Fault, bool)> = faults
        .iter()
        .flat_map(|f| [(f.at, f, false), (f.at + f.hold, f, true)])
        .collect();
    events.sort_by_key(|(at, _, heal)| (*at, !*heal));
    let mut events = events.into_iter().peekable();
    let mut next_sample = Duration::ZERO;
    loop {
        let sample_first =
            next_sample < until && events.peek().is_none_or(|(at, _, _)| next_sample < *at);
        if sample_first {
            tokio::time::sleep_until(started + next_sample).await;
            memory.sample(chaos.fleet, chaos.agents, next_sample).await;
            next_sample += RSS_EVERY;
            continue;
        }
        let Some((at, fault, heal)) = events.next() else {
            break;
        };
        tokio::time::sleep_until(started + at).await;
        let target = chaos.name(fault.target);
        if !chaos.applies(fault.kind) {
            if !heal {
                let _ = writeln!(
                    log,
                    "| {:.1} | {} | {target} | – | not applicable |",
                    at.as_secs_f64(),
                    fault.kind.name()
                );
            }
            continue;
        }
        let done = if heal {
            chaos.heal(fault).await
        } else {
            chaos.strike(fault).await
        };
        if let Err(breach) = done {
            breaches.push(format!(
                "{:.1} s, {}: {breach}",
                at.as_secs_f64(),
                fault.kind.name()
            ));
        }
        let _ = writeln!(
            log,
            "| {:.1} | {} | {target} | {} | {:.1} |",
            at.as_secs_f64(),
            if heal { "healed" } else { fault.kind.name() },
            if heal {
                String::new()
            } else {
                format!("{:.1} s", fault.hold.as_secs_f64())
            },
            // A restart waits until the process is ready again.
            started.elapsed().saturating_sub(at).as_secs_f64()
        );
    }
    tokio::time::sleep_until(started + until).await;
}

/// The command that runs `o` again.
fn replay(o: &Options) -> String {
    let mut command = format!(
        "tether-bench soak --seed {} --duration {} --agents {} --servers {} --churners {}",
        o.seed,
        o.duration.as_secs(),
        o.agents,
        o.servers,
        o.churners
    );
    if o.upstream {
        command.push_str(" --upstream");
    }
    for (flag, n) in [
        ("upstream-agents", o.upstream_agents),
        ("upstream-servers", o.upstream_servers),
    ] {
        if n > 0 {
            let _ = write!(command, " --{flag} {n}");
        }
    }
    if o.leases {
        command.push_str(" --leases");
    }
    command
}

fn report(
    o: &Options,
    elapsed: Duration,
    faults: &[Fault],
    log: &str,
    ledger: &traffic::Ledger,
    (rss_before, rss_after, memory): &(u64, u64, Memory),
    (breaches, upstream_errors): (&[String], usize),
) -> String {
    let mut r = String::new();
    let (system, fleet, reverse) = if o.upstream {
        (
            "upstream".to_owned(),
            "upstream proxy-servers (not peered",
            "; no reverse dials (upstream has none)",
        )
    } else if o.upstream_agents + o.upstream_servers > 0 {
        (
            format!(
                "a mixed fleet, {} of its servers and {} of its agents upstream's",
                o.upstream_servers, o.upstream_agents
            ),
            "servers (tether's peered",
            ", reverse dials through tether's agents",
        )
    } else {
        (
            "tether".to_owned(),
            "tether servers (peered",
            ", reverse dials",
        )
    };
    let _ = writeln!(r, "# Soak of {system}: seed {}\n", o.seed);
    let _ = writeln!(
        r,
        "{} {fleet}; gRPC and HTTP CONNECT frontends in turn){}, {} agents (each through relays of its own), {} churn clients, one long-lived stream per server, bulk transfers, stalled readers{reverse}, for {:.0} s. Replay: `{}`.\n",
        o.servers,
        if o.leases {
            " publishing Leases in a real kube-apiserver, which tether's agents count"
        } else {
            ""
        },
        o.agents,
        o.churners,
        elapsed.as_secs_f64(),
        replay(o),
    );
    let _ = writeln!(
        r,
        "## Result: {}\n",
        if breaches.is_empty() {
            "every invariant held"
        } else {
            "BREACHED"
        }
    );
    for b in breaches {
        let _ = writeln!(r, "- {b}");
    }
    if ledger.upstream_breach_count > 0 {
        let _ = writeln!(
            r,
            "\nThrough upstream's servers, {} breaches: upstream's, not held against this run:\n",
            ledger.upstream_breach_count
        );
        for b in &ledger.upstream_breaches {
            let _ = writeln!(r, "- {b}");
        }
    }
    if upstream_errors > 0 {
        let _ = writeln!(
            r,
            "\nUpstream's processes logged {upstream_errors} error lines (not held to the error-line invariant: upstream logs one for every stream that breaks)."
        );
    }
    let _ = writeln!(r, "\n## Client operations\n");
    let _ = writeln!(
        r,
        "- {} operations: {} succeeded, {} ended with an explicit error",
        ledger.operations(),
        ledger.ok,
        ledger.operations() - ledger.ok
    );
    let _ = writeln!(
        r,
        "- the longest an operation took to end with an error: {:.2} s",
        ledger.worst_error.as_secs_f64()
    );
    for (what, e) in &ledger.errors {
        let when = if e.count == 1 {
            format!("at {:.1} s", e.first.as_secs_f64())
        } else {
            format!("{:.1}–{:.1} s", e.first.as_secs_f64(), e.last.as_secs_f64())
        };
        let _ = writeln!(r, "  - {}× ({when}) {what}", e.count);
    }
    let _ = writeln!(r, "\n## Faults\n");
    for kind in FaultKind::ALL {
        let _ = writeln!(
            r,
            "- {}: {}",
            kind.name(),
            faults.iter().filter(|f| f.kind == kind).count()
        );
    }
    let mib = |b: &u64| *b as f64 / (1 << 20) as f64;
    let _ = writeln!(
        r,
        "- servers' RSS together: {:.1} MiB at the start, {:.1} MiB after the run",
        mib(rss_before),
        mib(rss_after),
    );
    for line in memory.report(o.duration) {
        let _ = writeln!(r, "- {line}");
    }
    let _ = writeln!(
        r,
        "\n| t (s) | fault | target | hold | done after (s) |\n|---:|---|---|---|---:|"
    );
    r.push_str(log);
    r
}
