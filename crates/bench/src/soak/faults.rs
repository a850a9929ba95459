//! Striking the running fleet with the soak's faults and healing them, and checking that a
//! fault did what it says: a changed routing file in force on every tether server, a broken
//! one refused with the one before kept, rotated certificates loaded, a frozen server's
//! Lease expired.

use std::time::Duration;

use rustix::process::Signal;
use tokio::time::Instant;

use super::agents::{Agent, DRAIN_TIMEOUT};
use super::files::{Files, ROUTING_BROKEN, ROUTING_CHANGED, ROUTING_FIRST};
use super::leases::Leases;
use super::schedule::{Aim, Fault, FaultKind, Target};
use crate::systems::{Fleet, metric_sum, server_id};

/// The routing file in force, labelled with its SHA-256.
pub const CONFIG_INFO: &str = "tether_server_config_info";
const CONFIG_RELOADS: &str = "tether_server_config_reloads_total";
const TLS_RELOADS: &str = "tether_server_tls_reloads_total";
/// How long a server may take to act on a changed file, beyond its watcher's period.
const FILE_SEEN_WITHIN: Duration = Duration::from_secs(3);

/// What the faults strike.
pub struct Chaos<'a> {
    pub fleet: &'a mut Fleet,
    pub agents: &'a mut [Agent],
    pub files: &'a mut Files,
    pub leases: Option<&'a Leases>,
    /// Each server's count (by index; 0 for upstream's) of refused reloads, or of
    /// certificate reloads, when a broken file or a rotation was put in place.
    counts_before: Vec<f64>,
}

impl<'a> Chaos<'a> {
    pub fn new(
        fleet: &'a mut Fleet,
        agents: &'a mut [Agent],
        files: &'a mut Files,
        leases: Option<&'a Leases>,
    ) -> Chaos<'a> {
        Chaos {
            fleet,
            agents,
            files,
            leases,
            counts_before: Vec::new(),
        }
    }

    /// Whether `kind` applies to this fleet: the faults on the files only where a tether
    /// server reads them (upstream's have neither a routing file nor certificate reloads).
    pub fn applies(&self, kind: FaultKind) -> bool {
        kind.aim() != Aim::Fleet || self.tether_servers().next().is_some()
    }

    /// The tether servers of the fleet, with their index.
    fn tether_servers(&self) -> impl Iterator<Item = (usize, &crate::systems::Member)> {
        self.fleet
            .members
            .iter()
            .enumerate()
            .filter(|(_, m)| !m.upstream)
    }

    /// What `target` is, for the report.
    pub fn name(&self, target: Target) -> String {
        match target {
            Target::Agent(n) => self.agents[n].id.clone(),
            Target::Server(n) => format!("server {}", n + 1),
            Target::Fleet => "every server".to_owned(),
        }
    }

    /// Applies `fault`; an `Err` is a breach.
    pub async fn strike(&mut self, fault: &Fault) -> Result<(), String> {
        match (fault.kind, fault.target) {
            (FaultKind::Kill, Target::Agent(n)) => self.agents[n].kill().await,
            (FaultKind::Freeze, Target::Agent(n)) => self.agents[n].freeze(true),
            (FaultKind::Cut, Target::Agent(n)) => self.agents[n].cut(fault.hold),
            (FaultKind::Drain, Target::Agent(n)) => self.agents[n].drain(),
            (FaultKind::ServerKill, Target::Server(n)) => self.fleet.members[n].kill().await,
            (FaultKind::ServerFreeze | FaultKind::LeaseExpiry, Target::Server(n)) => {
                self.signal_server(n, Signal::STOP);
            }
            (FaultKind::Reload, Target::Fleet) => self.put_routing(ROUTING_CHANGED)?,
            (FaultKind::BadReload, Target::Fleet) => {
                self.counts_before = self.each_count(CONFIG_RELOADS, "refused").await?;
                self.put_routing(ROUTING_BROKEN)?;
            }
            (FaultKind::Rotate, Target::Fleet) => {
                self.counts_before = self.each_count(TLS_RELOADS, "reloaded").await?;
                self.files
                    .rotate()
                    .map_err(|e| format!("rotating the certificates: {e:#}"))?;
            }
            other => return Err(format!("no such fault: {other:?}")),
        }
        Ok(())
    }

    /// Ends `fault`; an `Err` is a breach.
    pub async fn heal(&mut self, fault: &Fault) -> Result<(), String> {
        match (fault.kind, fault.target) {
            (FaultKind::Kill, Target::Agent(n)) => self.launch_agent(n).await?,
            (FaultKind::Freeze, Target::Agent(n)) => self.agents[n].freeze(false),
            (FaultKind::Cut, Target::Agent(_)) => {}
            (FaultKind::Drain, Target::Agent(n)) => {
                // Upstream's agent has no --drain-timeout: a drained one serves on until
                // killed, by design, so it is not waited for.
                let within = match self.agents[n].upstream {
                    true => Duration::ZERO,
                    false => DRAIN_TIMEOUT + Duration::from_secs(5),
                };
                let exited = self.agents[n].drained_within(within).await;
                // Started again either way, so that one breach does not become many.
                self.launch_agent(n).await?;
                if !exited && !self.agents[n].upstream {
                    return Err(format!(
                        "{} did not exit within {within:?} of its drain (--drain-timeout={}s)",
                        self.agents[n].id,
                        DRAIN_TIMEOUT.as_secs()
                    ));
                }
            }
            (FaultKind::ServerKill, Target::Server(n)) => {
                self.fleet.members[n]
                    .launch()
                    .await
                    .map_err(|e| format!("server {} did not come back: {e:#}", n + 1))?;
            }
            (FaultKind::ServerFreeze, Target::Server(n)) => self.signal_server(n, Signal::CONT),
            (FaultKind::LeaseExpiry, Target::Server(n)) => {
                let expired = match self.leases {
                    Some(leases) => {
                        let id = server_id(n);
                        leases
                            .wait_for(FILE_SEEN_WITHIN, |valid| !valid.contains(&id))
                            .await
                    }
                    None => Ok(()),
                };
                self.signal_server(n, Signal::CONT);
                expired.map_err(|valid| {
                    format!(
                        "server {}'s Lease was still valid after {:.1} s frozen (valid: {valid:?})",
                        n + 1,
                        fault.hold.as_secs_f64()
                    )
                })?;
            }
            (FaultKind::Reload, Target::Fleet) => {
                let in_force = self.wait_in_force(ROUTING_CHANGED).await;
                self.put_routing(ROUTING_FIRST)?;
                in_force?;
            }
            (FaultKind::BadReload, Target::Fleet) => {
                let refused = self.wait_counted(CONFIG_RELOADS, "refused").await;
                let kept = self.wait_in_force(ROUTING_FIRST).await;
                self.put_routing(ROUTING_FIRST)?;
                refused.map_err(|e| format!("the broken routing file: {e}"))?;
                kept.map_err(|e| format!("after the broken routing file: {e}"))?;
            }
            (FaultKind::Rotate, Target::Fleet) => self
                .wait_counted(TLS_RELOADS, "reloaded")
                .await
                .map_err(|e| format!("the rotated certificates: {e}"))?,
            other => return Err(format!("no such fault: {other:?}")),
        }
        Ok(())
    }

    async fn launch_agent(&mut self, n: usize) -> Result<(), String> {
        let agent = &mut self.agents[n];
        agent
            .launch()
            .await
            .map_err(|e| format!("{} did not come back: {e:#}", agent.id))
    }

    fn signal_server(&self, n: usize, signal: Signal) {
        if let Some(proc) = &self.fleet.members[n].proc {
            proc.signal(signal);
        }
    }

    fn put_routing(&mut self, text: &'static str) -> Result<(), String> {
        self.files
            .set_routing(text)
            .map_err(|e| format!("writing the routing file: {e:#}"))
    }

    /// Each server's count of `name` `value` now, by index ([`count_of`]; 0 for upstream's).
    async fn each_count(&self, name: &str, value: &str) -> Result<Vec<f64>, String> {
        let mut counts = vec![0.0; self.fleet.members.len()];
        for (n, _) in self.tether_servers() {
            let metrics = self.fleet.metrics(n).await;
            let metrics = metrics.map_err(|e| format!("reading {name}: {e:#}"))?;
            counts[n] = count_of(&metrics, name, value);
        }
        Ok(counts)
    }

    /// Waits until every tether server counts more of `name` `value` than when the fault
    /// began.
    async fn wait_counted(&self, name: &str, value: &str) -> Result<(), String> {
        self.wait_for_each(|n, metrics| count_of(metrics, name, value) > self.counts_before[n])
            .await
            .map_err(|behind| {
                format!("servers {behind:?} did not count a {value} {name} within {FILE_SEEN_WITHIN:?} more")
            })
    }

    /// Waits until every tether server has `text` in force as its routing file.
    async fn wait_in_force(&self, text: &str) -> Result<(), String> {
        let label = format!("sha256=\"{}\"", tether_reload::sha256_hex(text.as_bytes()));
        self.wait_for_each(|_, metrics| metric_sum(metrics, CONFIG_INFO, &label) == Some(1.0))
            .await
            .map_err(|behind| {
                let first = text.lines().next().unwrap_or_default();
                format!("servers {behind:?} did not have the routing file `{first}` in force")
            })
    }

    /// Polls every tether server's metrics until `done(index, metrics)` holds for each, at
    /// most [`FILE_SEEN_WITHIN`]; past it, the numbers of the servers still behind.
    async fn wait_for_each(&self, done: impl Fn(usize, &str) -> bool) -> Result<(), Vec<usize>> {
        let deadline = Instant::now() + FILE_SEEN_WITHIN;
        loop {
            let mut behind = Vec::new();
            for (n, _) in self.tether_servers() {
                let metrics = self.fleet.metrics(n).await.unwrap_or_default();
                if !done(n, &metrics) {
                    behind.push(n + 1);
                }
            }
            if behind.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(behind);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `name`'s count of `value`, by its `result` or its `outcome` label, in a server's metrics.
fn count_of(metrics: &str, name: &str, value: &str) -> f64 {
    let result = metric_sum(metrics, name, &format!("result=\"{value}\""));
    let outcome = metric_sum(metrics, name, &format!("outcome=\"{value}\""));
    result.or(outcome).unwrap_or(0.0)
}
