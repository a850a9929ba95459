//! Request/response latency over an established connection: 64-byte ping-pong.

use std::time::Duration;
use tokio::time::Instant;

use super::Profile;
use crate::stats::{quantile, sorted};
use crate::systems::Running;
use crate::target;

pub const MSG: usize = 64;

/// p50, p99, p99.9 in µs.
pub async fn run(r: &Running, p: &Profile) -> anyhow::Result<[f64; 3]> {
    let mut s = r.dialer.dial_timeout(p.dial_timeout).await?;
    let msg = [0x42u8; MSG];
    let mut back = [0u8; MSG];
    target::echo_start(&mut s, &msg).await?;
    let limit = Duration::from_secs_f64(p.ping_max_secs);
    for _ in 0..p.ping_warmup {
        round(&mut s, &msg, &mut back).await?;
    }
    let mut rtts = Vec::with_capacity(p.ping_rounds);
    let start = Instant::now();
    while rtts.len() < p.ping_rounds && start.elapsed() < limit {
        let t = Instant::now();
        round(&mut s, &msg, &mut back).await?;
        rtts.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let v = sorted(&mut rtts);
    Ok([quantile(v, 0.5), quantile(v, 0.99), quantile(v, 0.999)])
}

async fn round(s: &mut target::BoxStream, msg: &[u8], back: &mut [u8]) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(5), target::echo_round(s, msg, back))
        .await
        .map_err(|_| anyhow::anyhow!("no echo within 5 s"))?
}
