//! Connection churn: dial, one 64-byte echo, close, as fast as `concurrency` workers can.
//! Also run across many fake agents by [`fanin`](super::fanin).

use std::sync::Arc;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use super::Profile;
use crate::stats::{quantile, sorted};
use crate::systems::Running;
use crate::target;

#[derive(Clone, Debug)]
pub struct ChurnResult {
    pub conns_per_s: f64,
    /// Connections that completed (dial, echo, close).
    pub succeeded: usize,
    pub dial_p50_us: f64,
    pub dial_p99_us: f64,
    /// Server + agent CPU per connection; `None` for direct TCP.
    pub cpu_us_per_conn: Option<f64>,
    pub errors: Vec<String>,
}

/// Dial latency is the time until the dial call returns a usable connection: the `200` for
/// HTTP CONNECT, the DIAL_RSP for gRPC, the TCP handshake for direct and SSH (whose channel
/// to the far side opens during the echo).
pub async fn run(r: &Running, p: &Profile, concurrency: usize) -> ChurnResult {
    let deadline = Instant::now() + Duration::from_secs_f64(p.churn_secs);
    let dials = Arc::new(Mutex::new(Vec::new()));
    let errors = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let cpu0 = r.cpu_seconds();
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let dialer = r.dialer.clone();
        let dials = dials.clone();
        let errors = errors.clone();
        let dial_timeout = p.dial_timeout;
        workers.spawn(async move {
            let msg = [0x17u8; 64];
            let mut mine = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let once = async {
                    let mut s = dialer.dial_timeout(dial_timeout).await?;
                    let dial = t.elapsed();
                    tokio::time::timeout(Duration::from_secs(5), target::echo_start(&mut s, &msg))
                        .await
                        .map_err(|_| anyhow::anyhow!("no echo within 5 s"))??;
                    drop(s);
                    anyhow::Ok(dial)
                };
                match once.await {
                    Ok(dial) => mine.push(dial.as_secs_f64() * 1e6),
                    Err(e) => {
                        errors.lock().expect("lock").push(format!("{e:#}"));
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
            dials.lock().expect("lock").extend(mine);
        });
    }
    while workers.join_next().await.is_some() {}
    let elapsed = start.elapsed().as_secs_f64();
    let cpu1 = r.cpu_seconds();
    let mut dials = std::mem::take(&mut *dials.lock().expect("lock"));
    let errors = std::mem::take(&mut *errors.lock().expect("lock"));
    let n = dials.len();
    let v = sorted(&mut dials);
    ChurnResult {
        conns_per_s: n as f64 / elapsed,
        succeeded: n,
        dial_p50_us: quantile(v, 0.5),
        dial_p99_us: quantile(v, 0.99),
        cpu_us_per_conn: cpu0
            .zip(cpu1)
            .filter(|_| n > 0)
            .map(|(a, b)| (b - a) * 1e6 / n as f64),
        errors,
    }
}
