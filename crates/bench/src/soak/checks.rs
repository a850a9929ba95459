//! The soak's invariants on the healed fleet: every process back at its baseline, each one's
//! counters agreeing with themselves (opened = closed + open), the routing file in place in
//! force everywhere, and no log line of a panic or of an error the schedule does not explain.

use std::path::Path;
use std::time::Duration;

use tokio::time::Instant;

use super::agents::Agent;
use super::faults::CONFIG_INFO;
use super::leases::Leases;
use super::schedule::{Fault, FaultKind};
use crate::procs;
use crate::systems::{Counts, Fleet, http_get, metric_sum, server_id};

/// Agent streams and connections a server holds: back to the baseline once healed.
const AGENT_OPEN: &str = "konnectivity_network_proxy_agent_open_endpoint_connections";
/// An agent's endpoint connections opened (its dial latencies, observed once per connection
/// dialed) and closed (their lifetimes).
const AGENT_OPENED: &str = "konnectivity_network_proxy_agent_dial_duration_seconds_count";
const AGENT_CLOSED: &str =
    "konnectivity_network_proxy_agent_endpoint_connection_duration_seconds_count";
/// A server's tunnelled connections opened and closed.
const SERVER_OPENED: &str = "tether_server_connections_opened_total";
const SERVER_CLOSED: &str = "konnectivity_network_proxy_server_connection_duration_seconds_count";
/// File descriptors a process may hold beyond its baseline once the fleet is healed (log
/// files reopened, a timer's descriptor): more is a leak.
const FD_SLACK: usize = 8;
/// How long the healed fleet may take to return to its baseline.
pub const SETTLE: Duration = Duration::from_secs(30);
/// Error-level log lines a fault explains, by the fault: (kind, text in the line).
const EXPLAINED_ERRORS: [(FaultKind, &str); 1] =
    [(FaultKind::BadReload, "configuration reload refused")];
/// Unexplained error lines listed in the report; beyond them they are only counted.
const LISTED_ERRORS: usize = 20;

/// The fleet's file descriptors at the start, every fault healed.
#[derive(Debug)]
pub struct Baseline {
    pub servers: Vec<usize>,
    /// The most any agent held.
    pub agents: usize,
}

impl Baseline {
    pub fn take(fleet: &Fleet, agents: &[Agent]) -> Baseline {
        Baseline {
            servers: fleet
                .members
                .iter()
                .map(|m| m.pid().and_then(procs::fd_count).unwrap_or(0))
                .collect(),
            agents: agents.iter().filter_map(Agent::fds).max().unwrap_or(0),
        }
    }
}

/// Waits until every server and agent is back at its baseline (no pending dial, no
/// connection, every agent held, file descriptors within [`FD_SLACK`], counters that agree,
/// `routing_sha256` in force, with `leases` every server's Lease valid); what is not by
/// [`SETTLE`] is a breach. Upstream's servers have neither a routing file nor a count of
/// connections opened: on them only the rest is checked.
pub async fn settle(
    fleet: &Fleet,
    agents: &[Agent],
    baseline: &Baseline,
    routing_sha256: &str,
    leases: Option<&Leases>,
    breaches: &mut Vec<String>,
) {
    let deadline = Instant::now() + SETTLE;
    loop {
        let mut off = Vec::new();
        if let Some(leases) = leases {
            let mut all: Vec<String> = (0..fleet.members.len()).map(server_id).collect();
            all.sort_unstable();
            match leases.valid_holders().await {
                Ok(valid) if valid == all => {}
                Ok(valid) => off.push(format!("valid Leases {valid:?}, not {all:?}")),
                Err(e) => off.push(format!("the Leases could not be listed: {e:#}")),
            }
        }
        for (n, member) in fleet.members.iter().enumerate() {
            off.extend(server_off(fleet, n, agents.len(), routing_sha256).await);
            let fds = member.pid().and_then(procs::fd_count).unwrap_or(usize::MAX);
            if fds > baseline.servers[n] + FD_SLACK {
                off.push(format!(
                    "server {}: {fds} fds, {} at the start",
                    n + 1,
                    baseline.servers[n]
                ));
            }
        }
        for agent in agents {
            off.extend(agent_off(agent).await);
            let fds = agent.fds().unwrap_or(usize::MAX);
            if fds > baseline.agents + FD_SLACK {
                off.push(format!(
                    "{}: {fds} fds, agents had ≤ {} at the start",
                    agent.id, baseline.agents
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

/// What is off on server `n` (tether's own checks only on a tether server).
async fn server_off(fleet: &Fleet, n: usize, agents: usize, routing_sha256: &str) -> Vec<String> {
    let body = match fleet.metrics(n).await {
        Ok(body) => body,
        Err(e) => return vec![format!("server {}: no metrics: {e:#}", n + 1)],
    };
    let c = Counts::of(&body);
    let mut off = Vec::new();
    for (what, is, want) in [
        ("pending dials", c.pending_dials, 0.0),
        ("established connections", c.established, 0.0),
        ("agents held", c.agents, agents as f64),
    ] {
        if is != want {
            off.push(format!("server {}: {what} {is}, not {want}", n + 1));
        }
    }
    if fleet.members[n].upstream {
        return off;
    }
    let get = |name| metric_sum(&body, name, "").unwrap_or(-1.0);
    let (opened, closed) = (get(SERVER_OPENED), get(SERVER_CLOSED));
    if opened != closed + c.established {
        off.push(format!(
            "server {}: {opened} connections opened, {closed} closed and {} open",
            n + 1,
            c.established
        ));
    }
    let label = format!("sha256=\"{routing_sha256}\"");
    if metric_sum(&body, CONFIG_INFO, &label) != Some(1.0) {
        off.push(format!(
            "server {}: the routing file in place is not the one in force",
            n + 1
        ));
    }
    off
}

/// What is off on `agent`; its counters only if it is tether's (upstream's agent counts no
/// closed connections).
async fn agent_off(agent: &Agent) -> Vec<String> {
    let body = http_get(agent.health, "/metrics")
        .await
        .map(|r| r.1)
        .unwrap_or_default();
    let get = |name| metric_sum(&body, name, "").unwrap_or(-1.0);
    let (open, opened, closed) = (get(AGENT_OPEN), get(AGENT_OPENED), get(AGENT_CLOSED));
    let mut off = Vec::new();
    if open != 0.0 {
        off.push(format!("{}: {AGENT_OPEN} is {open}", agent.id));
    }
    if !agent.upstream && opened != closed + open {
        off.push(format!(
            "{}: {opened} connections opened, {closed} closed and {open} open",
            agent.id
        ));
    }
    off
}

/// Every log in `dirs` read for a panic, and for an error-level line (klog's `E`) that no
/// fault of `faults` explains: each is a breach. Upstream's processes (their logs are
/// `upstream`) log an error for every stream that breaks: their error lines are counted,
/// and the count returned, but not held to this.
pub fn scan_logs(
    dirs: &[&Path],
    faults: &[Fault],
    upstream: &[&Path],
    breaches: &mut Vec<String>,
) -> usize {
    let explained: Vec<&str> = EXPLAINED_ERRORS
        .iter()
        .filter(|(kind, _)| faults.iter().any(|f| f.kind == *kind))
        .map(|(_, text)| *text)
        .collect();
    let (mut unexplained, mut upstream_errors) = (0usize, 0usize);
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            breaches.push(format!("the logs in {} could not be read", dir.display()));
            continue;
        };
        for path in entries.filter_map(|e| e.ok().map(|e| e.path())) {
            if path.extension().is_none_or(|e| e != "log") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            // Rust's panic message, and Go's.
            if text.contains("panicked at") || text.lines().any(|l| l.starts_with("panic: ")) {
                breaches.push(format!("a panic in {}", path.display()));
            }
            if upstream.contains(&path.as_path()) {
                upstream_errors += text.lines().filter(|l| is_error(l)).count();
                continue;
            }
            for line in text.lines().filter(|l| is_error(l)) {
                if explained.iter().any(|e| line.contains(e)) {
                    continue;
                }
                if unexplained < LISTED_ERRORS {
                    breaches.push(format!(
                        "an unexplained error in {}: {line}",
                        path.display()
                    ));
                }
                unexplained += 1;
            }
        }
    }
    if unexplained > LISTED_ERRORS {
        breaches.push(format!(
            "{} more unexplained error lines, not listed",
            unexplained - LISTED_ERRORS
        ));
    }
    upstream_errors
}

/// A klog error line: `E` and the date (`E1206 07:56:23.570107 …`).
fn is_error(line: &str) -> bool {
    line.as_bytes()
        .get(..5)
        .is_some_and(|head| head[0] == b'E' && head[1..].iter().all(u8::is_ascii_digit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_line_is_klogs_e_and_a_date() {
        assert!(is_error(
            "E1206 07:56:23.570107   15112 reload.rs:74] \"configuration reload refused\""
        ));
        assert!(!is_error(
            "I1206 07:56:23.570107   15112 logging.rs:74] \"E1206\""
        ));
        assert!(!is_error("Error: something"));
        assert!(!is_error("E12"));
    }
}
