//! Agent fan-in: many agents on one server. A light fake agent speaks the real agent
//! protocol on the link the system's own agents use: tether's native link for `tether`, the
//! WebSocket link for `tether-ws`, gRPC (HTTP/2, `AgentService.Connect`) for `tether-h2`,
//! `tether-before` and upstream; so the tether systems show the server's memory per agent on
//! each link. It answers the
//! dials the server sends it (echoing their data itself, so that the figures are the
//! server's), and otherwise idles. The server's RSS growth per agent is the figure; with the
//! smaller count also churn through the server with its dials spread over every agent; with
//! the larger count the server's CPU per idle agent, and whether its RSS comes back down
//! once every agent has left.

mod fake_agent;
mod frames;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::sync::Semaphore;

use super::Profile;
use super::churn::{self, ChurnResult};
use crate::progress::{Progress, Ticker};
use crate::systems::Running;
pub use fake_agent::{FakeAgent, Link, Options};
pub use frames::{PingCount, Pings};

#[derive(Clone, Debug)]
pub struct FanInResult {
    pub kib_per_agent: f64,
    /// What the server's `ready_backend_connections` gauge said, if it has one.
    pub server_counted: Option<usize>,
    /// Server CPU ms per agent per minute while all of them idle (when sampled).
    pub idle_cpu_ms_per_agent_min: Option<f64>,
    /// Server RSS after every agent left ÷ before they came.
    pub rss_after_ratio: f64,
    /// Churn through the server while every agent is connected (when asked for).
    pub dials: Option<SpreadDials>,
}

/// Churn whose dials the server spread over the fake agents.
#[derive(Clone, Debug)]
pub struct SpreadDials {
    /// Its CPU figure is the server's alone: the agents are this process.
    pub churn: ChurnResult,
    /// Dials each agent answered.
    pub per_agent: Vec<u64>,
}

impl SpreadDials {
    /// Every agent's answered dials together (at least the churn's successful ones).
    pub fn answered(&self) -> u64 {
        self.per_agent.iter().sum()
    }

    pub fn min(&self) -> u64 {
        self.per_agent.iter().copied().min().unwrap_or(0)
    }

    pub fn max(&self) -> u64 {
        self.per_agent.iter().copied().max().unwrap_or(0)
    }

    /// The most dials one agent answered ÷ the mean over all agents.
    pub fn max_over_mean(&self) -> f64 {
        let mean = self.answered() as f64 / self.per_agent.len().max(1) as f64;
        self.max() as f64 / mean.max(f64::MIN_POSITIVE)
    }
}

/// Dials each agent answered so far.
fn dials_per_agent(agents: &[FakeAgent]) -> Vec<u64> {
    agents.iter().map(FakeAgent::dials).collect()
}

/// Churns at concurrency 64 through the server, whose dials land on the fake agents.
async fn churn_across(
    r: &Running,
    p: &Profile,
    connected: &[FakeAgent],
    progress: &Progress,
) -> anyhow::Result<SpreadDials> {
    let before: u64 = dials_per_agent(connected).iter().sum();
    if before != 0 {
        bail!("the server sent {before} dials before any client dialled");
    }
    progress.note(&format!(
        "churn at concurrency 64 across {} agents",
        connected.len()
    ));
    let churn = churn::run(r, p, 64).await;
    let spread = SpreadDials {
        churn,
        per_agent: dials_per_agent(connected),
    };
    let (answered, succeeded) = (spread.answered(), spread.churn.succeeded as u64);
    if answered < succeeded {
        bail!("the agents answered {answered} dials, the clients completed {succeeded}");
    }
    Ok(spread)
}

/// Fails if the server closed any fake agent's stream.
fn still_connected(agents: &[FakeAgent], when: &str) -> anyhow::Result<()> {
    let gone = agents.iter().filter(|a| a.is_gone()).count();
    if gone > 0 {
        bail!("the server closed {gone} fake agents' streams {when}");
    }
    Ok(())
}

/// How long the server may take to forget every agent once they all left.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a fan-in run measures besides the server's RSS per agent.
#[derive(Clone, Copy, Debug)]
pub enum Extra {
    /// Churn through the server while every agent is connected.
    SpreadDials,
    /// The server's CPU for `p.idle_cpu_secs` while every agent idles, and its RSS after
    /// they all left.
    IdleCpu,
}

/// Connects `agents` fake agents on `link`, whose ALPN id `tls` offers, samples the server,
/// measures `extra`, and disconnects them.
pub async fn run(
    r: &Running,
    p: &Profile,
    agents: usize,
    link: Link,
    extra: Extra,
    tls: Arc<rustls::ClientConfig>,
    progress: &Progress,
) -> anyhow::Result<FanInResult> {
    let port = r.agent_port.context("no agent port")?;
    tokio::time::sleep(p.settle).await;
    let before = r.server_rss().unwrap_or(0);
    let gate = Arc::new(Semaphore::new(p.open_concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..agents {
        let permit = gate.clone().acquire_owned().await?;
        let tls = tls.clone();
        tasks.spawn(async move {
            let id = format!("fake-{i}-{}", uuid::Uuid::new_v4());
            let agent = tokio::time::timeout(
                Duration::from_secs(20),
                FakeAgent::connect(link, port, tls, id),
            )
            .await
            .map_err(|_| anyhow::anyhow!("Connect timed out"))?;
            drop(permit);
            agent
        });
    }
    let mut connected = Vec::with_capacity(agents);
    let mut first_error = None;
    let mut errors = 0usize;
    let mut ticker = Ticker::new(Duration::from_secs(3));
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            Ok(a) => connected.push(a),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
        if ticker.due() {
            progress.note(&format!("{} of {agents} agents connected", connected.len()));
        }
    }
    if let Some(e) = first_error {
        bail!("{errors} of {agents} fake agents failed; first: {e:#}");
    }
    tokio::time::sleep(p.settle).await;
    let after = r.server_rss().unwrap_or(0);
    let counted = r.agents_counted().await;
    if let Some(c) = counted
        && c < agents
    {
        bail!("the server counts {c} ready backends, {agents} agents connected");
    }
    still_connected(&connected, "once all had connected")?;
    let dials = match extra {
        Extra::SpreadDials => Some(churn_across(r, p, &connected, progress).await?),
        Extra::IdleCpu => None,
    };
    let idle_cpu_ms_per_agent_min = match (extra, r.server_cpu_seconds()) {
        (Extra::IdleCpu, Some(cpu0)) => {
            progress.note(&format!(
                "sampling the server's CPU for {} s with {agents} idle agents",
                p.idle_cpu_secs
            ));
            tokio::time::sleep(Duration::from_secs_f64(p.idle_cpu_secs)).await;
            let cpu = r.server_cpu_seconds().context("server CPU")? - cpu0;
            Some(cpu * 1000.0 / agents as f64 * 60.0 / p.idle_cpu_secs)
        }
        _ => None,
    };
    // The server PINGs each agent every few seconds and drops one that does not answer.
    still_connected(&connected, "while they were measured")?;
    drop(connected);
    // Every stream ends and the server forgets each agent; then what it keeps is the figure,
    // measured with every agent gone, not still closing.
    if counted.is_some() {
        r.wait_for_agents(|c| c == 0, "none", LEAVE_TIMEOUT).await?;
    }
    tokio::time::sleep(p.after_load).await;
    let left = r.server_rss().unwrap_or(0);
    Ok(FanInResult {
        kib_per_agent: (after as f64 - before as f64) / 1024.0 / agents as f64,
        server_counted: counted,
        idle_cpu_ms_per_agent_min,
        rss_after_ratio: left as f64 / before.max(1) as f64,
        dials,
    })
}
