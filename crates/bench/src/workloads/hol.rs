//! Head-of-line isolation: one connection's download throughput while another connection
//! through the same agent has a reader that stopped reading, as a ratio to its throughput
//! alone (1.0: perfectly isolated; 0: blocked).

use std::time::Duration;
use tokio::time::Instant;

use super::Profile;
use crate::systems::Running;
use crate::target;

#[derive(Clone, Copy, Debug)]
pub struct HolResult {
    pub alone_mib_s: f64,
    pub stalled_mib_s: f64,
    pub ratio: f64,
    /// The dial next to the stalled connection did not even complete.
    pub dial_blocked: bool,
}

const HUGE: u64 = 1 << 40;

async fn measure(r: &Running, secs: f64) -> anyhow::Result<(f64, bool)> {
    let window = Duration::from_secs_f64(secs);
    let start = Instant::now();
    // A dial stuck behind the stalled connection is the head-of-line block itself.
    let Ok(dialed) = tokio::time::timeout(window + Duration::from_secs(2), r.dialer.dial()).await
    else {
        return Ok((0.0, true));
    };
    let mut s = dialed?;
    let left = window
        .saturating_sub(start.elapsed())
        .max(Duration::from_millis(50));
    let (got, took) = target::download(&mut s, HUGE, Instant::now() + left).await?;
    Ok((
        got as f64 / (1 << 20) as f64 / took.as_secs_f64().max(1e-6),
        false,
    ))
}

pub async fn run(r: &Running, p: &Profile) -> anyhow::Result<HolResult> {
    let (alone, _) = measure(r, p.hol_secs).await?;
    let mut stalled = r.dialer.dial_timeout(p.dial_timeout).await?;
    target::request_source(&mut stalled, HUGE).await?;
    tokio::time::sleep(Duration::from_secs_f64(p.hol_fill_secs)).await;
    let (next, dial_blocked) = measure(r, p.hol_secs).await?;
    drop(stalled);
    Ok(HolResult {
        alone_mib_s: alone,
        stalled_mib_s: next,
        ratio: if alone > 0.0 { next / alone } else { f64::NAN },
        dial_blocked,
    })
}
