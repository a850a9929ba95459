//! Bulk throughput of one connection, each direction, and the CPU the system spends on it.

use std::time::Duration;
use tokio::time::Instant;

use anyhow::bail;

use super::Profile;
use crate::systems::Running;
use crate::target;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Client → target (the sink).
    Upload,
    /// Target (the source) → client.
    Download,
}

impl Direction {
    pub fn name(&self) -> &'static str {
        match self {
            Direction::Upload => "upload",
            Direction::Download => "download",
        }
    }
}

/// What one measured transfer gave.
#[derive(Clone, Copy, Debug)]
pub struct BulkResult {
    pub mib_s: f64,
    /// Server + agent CPU seconds per GiB moved; `None` for direct TCP.
    pub cpu_s_per_gib: Option<f64>,
}

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;

async fn transfer(
    r: &Running,
    p: &Profile,
    dir: Direction,
    len: u64,
    deadline: Instant,
) -> anyhow::Result<Duration> {
    let mut s = r.dialer.dial_timeout(p.dial_timeout).await?;
    match dir {
        Direction::Upload => target::upload(&mut s, len, deadline).await,
        Direction::Download => {
            let (got, took) = target::download(&mut s, len, deadline).await?;
            if got < len {
                bail!("download got {got} of {len} bytes before the deadline");
            }
            Ok(took)
        }
    }
}

/// A warm-up transfer sizes the measured one to about `bulk_secs`; the measured one runs on
/// a fresh connection, timed from its first byte to its last (the sink's count for uploads).
pub async fn run(r: &Running, p: &Profile, dir: Direction) -> anyhow::Result<BulkResult> {
    let generous = |secs: f64| Instant::now() + Duration::from_secs_f64(secs * 5.0 + 20.0);
    let warm = transfer(r, p, dir, p.bulk_warmup, generous(1.0)).await?;
    let rate = p.bulk_warmup as f64 / warm.as_secs_f64().max(1e-6);
    // Multiples of 1 MiB, at least the warm-up, at most 64 GiB.
    let len = ((rate * p.bulk_secs / MIB).ceil() as u64).clamp(p.bulk_warmup >> 20, 64 << 10) << 20;

    let cpu0 = r.cpu_seconds();
    let took = transfer(r, p, dir, len, generous(p.bulk_secs)).await?;
    let cpu1 = r.cpu_seconds();
    let secs = took.as_secs_f64().max(1e-6);
    Ok(BulkResult {
        mib_s: len as f64 / MIB / secs,
        cpu_s_per_gib: cpu0.zip(cpu1).map(|(a, b)| (b - a) / (len as f64 / GIB)),
    })
}
