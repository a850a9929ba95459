//! What a resume costs: a 64-byte ping-pong through a tether system whose agent reaches the
//! server through a relay that cuts every connection on demand. The round trip that spans
//! a cut (the agent noticing, reconnecting, both ends replaying) is the pause a client sees.

use std::time::Duration;
use tokio::time::Instant;

use super::Profile;
use super::pingpong::MSG;
use crate::stats::{quantile, sorted};
use crate::systems::Running;
use crate::target;

/// Normal rounds between two cuts: the stream settles before the next one.
const ROUNDS_BETWEEN: usize = 50;

/// The pauses over the cuts, in ms: p50 and max.
pub async fn run(r: &Running, p: &Profile) -> anyhow::Result<[f64; 2]> {
    let mut s = r.dialer.dial_timeout(p.dial_timeout).await?;
    let msg = [0x42u8; MSG];
    let mut back = [0u8; MSG];
    target::echo_start(&mut s, &msg).await?;
    let resumes_before = resumes(r).await;
    let mut pauses = Vec::with_capacity(p.resume_cuts);
    for _ in 0..p.resume_cuts {
        for _ in 0..ROUNDS_BETWEEN {
            round(&mut s, &msg, &mut back).await?;
        }
        r.cut()?;
        let t = Instant::now();
        round(&mut s, &msg, &mut back).await?;
        pauses.push(t.elapsed().as_secs_f64() * 1e3);
        // The next cut only once the server counted this resume (else the round above may
        // have slipped through before the cut reached the agent).
        let deadline = Instant::now() + Duration::from_secs(10);
        while resumes(r).await < resumes_before + pauses.len() as f64 {
            anyhow::ensure!(
                Instant::now() < deadline,
                "the server did not resume the agent's stream after cut {}",
                pauses.len()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    let v = sorted(&mut pauses);
    Ok([quantile(v, 0.5), v[v.len() - 1]])
}

async fn resumes(r: &Running) -> f64 {
    r.server_metric("tether_server_resumes_total")
        .await
        .unwrap_or(0.0)
}

async fn round(s: &mut target::BoxStream, msg: &[u8], back: &mut [u8]) -> anyhow::Result<()> {
    tokio::time::timeout(Duration::from_secs(35), target::echo_round(s, msg, back))
        .await
        .map_err(|_| anyhow::anyhow!("no echo within 35 s (the resume window is 30 s)"))?
}
