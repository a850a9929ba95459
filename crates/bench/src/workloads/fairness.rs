//! Fair sharing of one agent stream: a 64-byte ping-pong's latency while 8 bulk downloads
//! go through the same agent, against the ping-pong alone, and the downloads' aggregate
//! throughput with and without the ping-pong.

use std::time::Duration;
use tokio::time::Instant;

use super::Profile;
use super::pingpong::MSG;
use crate::stats::{quantile, sorted};
use crate::systems::Running;
use crate::target;

/// Bulk downloads sharing the agent with the ping-pong.
pub const BULK: usize = 8;
const HUGE: u64 = 1 << 40;

#[derive(Clone, Copy, Debug)]
pub struct FairnessResult {
    /// p50, p99 in µs.
    pub ping_alone: [f64; 2],
    pub ping_shared: [f64; 2],
    pub bulk_alone_mib_s: f64,
    pub bulk_shared_mib_s: f64,
}

impl FairnessResult {
    /// Shared p99 ÷ alone p99 (goal ≤ 2).
    pub fn p99_ratio(&self) -> f64 {
        self.ping_shared[1] / self.ping_alone[1]
    }

    /// Bulk aggregate with the ping-pong ÷ without it (goal ≥ 0.9).
    pub fn bulk_ratio(&self) -> f64 {
        self.bulk_shared_mib_s / self.bulk_alone_mib_s
    }
}

async fn pings(r: &Running, p: &Profile, window: Duration) -> anyhow::Result<[f64; 2]> {
    let mut s = r.dialer.dial_timeout(p.dial_timeout).await?;
    let msg = [0x42u8; MSG];
    let mut back = [0u8; MSG];
    target::echo_start(&mut s, &msg).await?;
    for _ in 0..p.ping_warmup {
        round(&mut s, &msg, &mut back).await?;
    }
    let mut rtts = Vec::with_capacity(p.ping_rounds);
    let start = Instant::now();
    while start.elapsed() < window {
        let t = Instant::now();
        round(&mut s, &msg, &mut back).await?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let v = sorted(&mut rtts);
    Ok([quantile(v, 0.5), quantile(v, 0.99)])
}

async fn round(s: &mut target::BoxStream, msg: &[u8], back: &mut [u8]) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(5), target::echo_round(s, msg, back))
        .await
        .map_err(|_| anyhow::anyhow!("no echo within 5 s"))?
}

/// Starts the downloads; each runs until `deadline` and reports its bytes.
async fn bulk(
    r: &Running,
    p: &Profile,
    deadline: Instant,
) -> anyhow::Result<tokio::task::JoinSet<anyhow::Result<u64>>> {
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..BULK {
        let mut s = r.dialer.dial_timeout(p.dial_timeout).await?;
        set.spawn(async move { Ok(target::download(&mut s, HUGE, deadline).await?.0) });
    }
    Ok(set)
}

async fn total(mut set: tokio::task::JoinSet<anyhow::Result<u64>>) -> anyhow::Result<u64> {
    let mut sum = 0;
    while let Some(done) = set.join_next().await {
        sum += done??;
    }
    Ok(sum)
}

fn mib_s(bytes: u64, took: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / took.as_secs_f64().max(1e-6)
}

pub async fn run(r: &Running, p: &Profile) -> anyhow::Result<FairnessResult> {
    let window = Duration::from_secs_f64(p.hol_secs * 2.0);
    let ping_alone = pings(r, p, window).await?;

    let start = Instant::now();
    let set = bulk(r, p, start + window).await?;
    let bulk_alone_mib_s = mib_s(total(set).await?, start.elapsed());

    let start = Instant::now();
    let set = bulk(r, p, start + window).await?;
    let ping_shared = pings(r, p, window).await?;
    let bulk_shared_mib_s = mib_s(total(set).await?, start.elapsed());
    Ok(FairnessResult {
        ping_alone,
        ping_shared,
        bulk_alone_mib_s,
        bulk_shared_mib_s,
    })
}
