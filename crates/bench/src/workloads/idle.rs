//! Many concurrent idle tunnelled connections: RSS of server and agents per connection, and
//! whether it comes back down once they are closed. The scale workload runs it with several
//! agents and targets, so that no process holds more sockets than its file limit allows.

use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use tokio::sync::Semaphore;

use super::Profile;
use crate::progress::{Progress, Ticker};
use crate::systems::{Dialer, Running};
use crate::target::{self, BoxStream};

#[derive(Clone, Copy, Debug)]
pub struct IdleResult {
    pub server_kib: f64,
    pub agent_kib: f64,
    pub open: usize,
    /// Server + agent RSS after every connection closed ÷ before they opened.
    pub rss_after_ratio: f64,
}

/// Opens `n` connections, taking `dialers` in turn (each connection proven with a 1-byte
/// echo), waits for RSS to settle, and divides the growth of the server and of the agents
/// together by the count. Every connection is checked again (one echo each) after the
/// sample, then all are closed and RSS sampled once more.
pub async fn run(
    r: &Running,
    dialers: &[Dialer],
    n: usize,
    p: &Profile,
    progress: &Progress,
) -> anyhow::Result<IdleResult> {
    tokio::time::sleep(p.settle).await;
    let (s0, a0) = (r.server_rss().unwrap_or(0), r.agent_rss().unwrap_or(0));
    let gate = Arc::new(Semaphore::new(p.open_concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    for dialer in dialers.iter().cycle().take(n) {
        let permit = gate.clone().acquire_owned().await?;
        let dialer = dialer.clone();
        let timeout = p.dial_timeout;
        tasks.spawn(async move {
            let mut s = dialer.dial_timeout(timeout).await?;
            tokio::time::timeout(Duration::from_secs(10), target::echo_start(&mut s, b"i"))
                .await
                .map_err(|_| anyhow::anyhow!("no echo within 10 s"))??;
            drop(permit);
            anyhow::Ok(s)
        });
    }
    let mut conns: Vec<BoxStream> = Vec::with_capacity(n);
    let mut first_error = None;
    let mut errors = 0usize;
    let mut ticker = Ticker::new(Duration::from_secs(3));
    while let Some(joined) = tasks.join_next().await {
        match joined? {
            Ok(s) => conns.push(s),
            Err(e) => {
                errors += 1;
                first_error.get_or_insert(e);
            }
        }
        if ticker.due() {
            progress.note(&format!("{} of {n} connections open", conns.len()));
        }
    }
    if let Some(e) = first_error {
        bail!("{errors} of {n} connections failed; first: {e:#}");
    }
    tokio::time::sleep(p.settle).await;
    let (s1, a1) = (r.server_rss().unwrap_or(0), r.agent_rss().unwrap_or(0));
    // Still alive, all of them.
    let mut back = [0u8; 1];
    for (i, s) in conns.iter_mut().enumerate() {
        tokio::time::timeout(
            Duration::from_secs(10),
            target::echo_round(s, b"j", &mut back),
        )
        .await
        .map_err(|_| anyhow::anyhow!("connection {i} no longer echoes"))??;
    }
    drop(conns);
    tokio::time::sleep(p.after_load).await;
    let (s2, a2) = (r.server_rss().unwrap_or(0), r.agent_rss().unwrap_or(0));
    let per = |before: u64, after: u64| (after as f64 - before as f64) / 1024.0 / n as f64;
    Ok(IdleResult {
        server_kib: per(s0, s1),
        agent_kib: per(a0, a1),
        open: n,
        rss_after_ratio: (s2 + a2) as f64 / (s0 + a0).max(1) as f64,
    })
}
