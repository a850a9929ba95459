//! `tether-bench soak`: a fleet of tether servers (peered) and agents under client traffic
//! while a seeded schedule of faults kills, freezes and cuts the agents; afterwards every
//! fault is healed and the fleet must come back to where it started. The run fails on any
//! breach: a client operation that hung or lost bytes without an error, a gauge or file
//! descriptor count that does not return to its baseline, a panic in any log.
//!
//! The seed, the schedule and each fault's time are in the report, so a failure can be
//! replayed with `--seed`.

mod agents;
mod relay;
mod schedule;
mod traffic;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::procs;
use crate::systems::{Env, Fleet, http_get, metric_sum};
use agents::Agent;
use schedule::{Fault, FaultKind};

/// Agent streams and connections a server holds: back to the baseline once healed.
const AGENT_OPEN: &str = "konnectivity_network_proxy_agent_open_endpoint_connections";
/// File descriptors a process may hold beyond its baseline once the fleet is healed (log
/// files reopened, a timer's descriptor): more is a leak.
const FD_SLACK: usize = 8;
/// How long the healed fleet may take to return to its baseline.
const SETTLE: Duration = Duration::from_secs(30);
/// The average gap between faults.
const FAULT_GAP: Duration = Duration::from_secs(3);
/// How often the servers' memory is sampled.
const RSS_EVERY: Duration = Duration::from_secs(5);

/// What a soak run does.
#[derive(Clone, Debug)]
pub struct Options {
    pub seed: u64,
    pub duration: Duration,
    pub servers: usize,
    pub agents: usize,
    pub churners: usize,
    pub out: PathBuf,
}

/// Runs the soak in `env`; the report goes to `out/soak.md`.
pub async fn run(env: &Env, o: &Options) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(
        o.agents >= 1 && o.servers >= 1,
        "at least one server and one agent"
    );
    let dir = env.dir.join("soak");
    std::fs::create_dir_all(&dir)?;
    let fleet = Fleet::start(env, o.servers).await?;
    let mut agents = Vec::with_capacity(o.agents);
    for n in 0..o.agents {
        agents.push(Agent::start(env, &fleet, n, &dir).await?);
    }
    let all = o.agents as f64;
    fleet
        .wait_until(SETTLE, "every agent held", |_, c| c.agents == all)
        .await?;
    let server_fds: Vec<usize> = fleet
        .members
        .iter()
        .map(|m| procs::fd_count(m.proc.pid).unwrap_or(0))
        .collect();
    let agent_fds = agents.iter().filter_map(Agent::fds).max().unwrap_or(0);
    eprintln!(
        "tether-bench soak: seed {}, {} servers, {} agents, {:?}; baseline fds: servers {server_fds:?}, agents ≤ {agent_fds}",
        o.seed, o.servers, o.agents, o.duration
    );

    let target = env.target.to_string();
    let mut dialers = Vec::with_capacity(o.servers);
    for n in 0..o.servers {
        dialers.push(fleet.dialer(n, &target).await?);
    }
    let ledger: traffic::Shared = Arc::default();
    let stop = CancellationToken::new();
    let started = Instant::now();
    let mut clients = traffic::start(&dialers, o.churners, &ledger, &stop);

    let faults = schedule::draw(o.seed, o.agents, FAULT_GAP, o.duration);
    let mut log = String::new();
    let mut breaches = Vec::new();
    let (rss, ()) = tokio::join!(sample_rss(&fleet, started + o.duration), async {
        inject(&faults, &mut agents, started, &mut log, &mut breaches).await;
        tokio::time::sleep_until(started + o.duration).await;
    });

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
    drop(dialers);
    let elapsed = started.elapsed();

    // Healed: every fault has ended; the fleet must return to its baseline.
    settle(&fleet, &agents, &server_fds, agent_fds, &mut breaches).await;
    for entry in std::fs::read_dir(&dir)?.chain(std::fs::read_dir(&fleet.dir)?) {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log")
            && std::fs::read_to_string(&path).is_ok_and(|t| t.contains("panicked at"))
        {
            breaches.push(format!("a panic in {}", path.display()));
        }
    }
    let ledger = std::mem::take(&mut *ledger.lock().unwrap_or_else(|e| e.into_inner()));
    breaches.extend(ledger.breaches.iter().cloned());
    if ledger.unlisted_breaches > 0 {
        breaches.push(format!(
            "{} more breaches by the clients, not listed",
            ledger.unlisted_breaches
        ));
    }

    let report = report(o, elapsed, &faults, &log, &ledger, &rss, &breaches);
    std::fs::create_dir_all(&o.out)?;
    let path = o.out.join("soak.md");
    std::fs::write(&path, &report)?;
    eprintln!("{report}");
    eprintln!("tether-bench soak: report {}", path.display());
    for agent in &mut agents {
        agent.kill().await;
    }
    Ok(if breaches.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Applies every fault at its time and heals it `hold` later, in time order; each line of
/// `log` says when it was due and how long it took (a restart: until the agent is ready). An agent that does not come back is a breach.
async fn inject(
    faults: &[Fault],
    agents: &mut [Agent],
    started: Instant,
    log: &mut String,
    breaches: &mut Vec<String>,
) {
    // (when, the fault, whether this is its healing)
    let mut events: Vec<(Duration, &Fault, bool)> = faults
        .iter()
        .flat_map(|f| [(f.at, f, false), (f.at + f.hold, f, true)])
        .collect();
    events.sort_by_key(|(at, _, heal)| (*at, !*heal));
    for (at, fault, heal) in events {
        tokio::time::sleep_until(started + at).await;
        let agent = &mut agents[fault.agent];
        match (fault.kind, heal) {
            (FaultKind::Kill, false) => agent.kill().await,
            (FaultKind::Kill, true) => {
                if let Err(e) = agent.launch().await {
                    breaches.push(format!("{} did not come back: {e:#}", agent.id));
                }
            }
            (FaultKind::Freeze, frozen) => agent.freeze(!frozen),
            (FaultKind::Cut, false) => agent.cut(fault.hold),
            (FaultKind::Cut, true) => {}
        }
        let _ = writeln!(
            log,
            "| {:.1} | {} | {} | {} | {:.1} |",
            at.as_secs_f64(),
            if heal { "healed" } else { fault.kind.name() },
            agent.id,
            if heal {
                String::new()
            } else {
                format!("{:.1} s", fault.hold.as_secs_f64())
            },
            // A restart waits until the agent holds every server again.
            started.elapsed().saturating_sub(at).as_secs_f64()
        );
    }
}

/// The servers' RSS together, every [`RSS_EVERY`] until `until`: (seconds, MiB).
async fn sample_rss(fleet: &Fleet, until: Instant) -> Vec<(f64, f64)> {
    let started = Instant::now();
    let mut samples = Vec::new();
    loop {
        samples.push((
            started.elapsed().as_secs_f64(),
            fleet.rss() as f64 / (1 << 20) as f64,
        ));
        if Instant::now() + RSS_EVERY > until {
            return samples;
        }
        tokio::time::sleep(RSS_EVERY).await;
    }
}

/// Waits until every server and agent is back at its baseline (no pending dial, no
/// connection, every agent held, file descriptors within [`FD_SLACK`]); what is not by
/// [`SETTLE`] is a breach.
async fn settle(
    fleet: &Fleet,
    agents: &[Agent],
    server_fds: &[usize],
    agent_fds: usize,
    breaches: &mut Vec<String>,
) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut off = Vec::new();
        for (n, member) in fleet.members.iter().enumerate() {
            match fleet.counts(n).await {
                Ok(c) => {
                    for (what, is, want) in [
                        ("pending dials", c.pending_dials, 0.0),
                        ("established connections", c.established, 0.0),
                        ("agents held", c.agents, agents.len() as f64),
                    ] {
                        if is != want {
                            off.push(format!("server {}: {what} {is}, not {want}", n + 1));
                        }
                    }
                }
                Err(e) => off.push(format!("server {}: no metrics: {e:#}", n + 1)),
            }
            let fds = procs::fd_count(member.proc.pid).unwrap_or(usize::MAX);
            if fds > server_fds[n] + FD_SLACK {
                off.push(format!(
                    "server {}: {fds} fds, {} at the start",
                    n + 1,
                    server_fds[n]
                ));
            }
        }
        for agent in agents {
            let body = http_get(agent.health, "/metrics")
                .await
                .map(|r| r.1)
                .unwrap_or_default();
            let open = metric_sum(&body, AGENT_OPEN, "").unwrap_or(-1.0);
            if open != 0.0 {
                off.push(format!("{}: {AGENT_OPEN} is {open}", agent.id));
            }
            let fds = agent.fds().unwrap_or(usize::MAX);
            if fds > agent_fds + FD_SLACK {
                off.push(format!(
                    "{}: {fds} fds, agents had ≤ {agent_fds} at the start",
                    agent.id
                ));
            }
        }
        if off.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            breaches.extend(
                off.into_iter()
                    .map(|o| format!("not back after {SETTLE:?}: {o}")),
            );
            return;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The least-squares slope of `samples` (seconds, MiB), in MiB per minute.
fn slope(samples: &[(f64, f64)]) -> Option<f64> {
    let n = samples.len() as f64;
    if samples.len() < 3 {
        return None;
    }
    let (sx, sy) = samples
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = samples.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    (den > 0.0).then(|| num / den * 60.0)
}

fn report(
    o: &Options,
    elapsed: Duration,
    faults: &[Fault],
    log: &str,
    ledger: &traffic::Ledger,
    rss: &[(f64, f64)],
    breaches: &[String],
) -> String {
    let mut r = String::new();
    let _ = writeln!(r, "# Soak: seed {}\n", o.seed);
    let _ = writeln!(
        r,
        "{} tether servers (peered), {} agents (each through relays of its own), {} churn clients and one long-lived stream per server, for {:.0} s. Replay: `tether-bench soak --seed {} --duration {} --agents {} --servers {} --churners {}`.\n",
        o.servers,
        o.agents,
        o.churners,
        elapsed.as_secs_f64(),
        o.seed,
        o.duration.as_secs(),
        o.agents,
        o.servers,
        o.churners
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
    for (what, n) in &ledger.errors {
        let _ = writeln!(r, "  - {n}× {what}");
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
    let _ = writeln!(
        r,
        "- servers' RSS: {} samples, {:.1} → {:.1} MiB, slope {}",
        rss.len(),
        rss.first().map_or(0.0, |s| s.1),
        rss.last().map_or(0.0, |s| s.1),
        slope(rss).map_or("–".to_owned(), |s| format!("{s:+.2} MiB/min"))
    );
    let _ = writeln!(
        r,
        "\n| t (s) | fault | agent | hold | done after (s) |\n|---:|---|---|---|---:|"
    );
    r.push_str(log);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slope_of_a_line_is_its_rise_per_minute() {
        let line: Vec<(f64, f64)> = (0..10)
            .map(|i| (i as f64 * 5.0, 100.0 + i as f64))
            .collect();
        let s = slope(&line).unwrap();
        assert!((s - 12.0).abs() < 1e-9, "{s}");
        let flat: Vec<(f64, f64)> = (0..10).map(|i| (i as f64, 7.0)).collect();
        assert_eq!(slope(&flat), Some(0.0));
        assert_eq!(slope(&flat[..2]), None);
    }
}
