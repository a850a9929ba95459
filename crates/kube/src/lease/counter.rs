//! An agent's view of the server Leases: the Leases matching the selector, listed every
//! poll interval and counted. Upstream's agent keeps an informer (list, then watch, resync
//! 10 s) and counts from its cache; a list served from the API server's watch cache
//! (`resourceVersion=0`) gives the same count without holding a watch per agent.

use std::time::Duration;
use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use super::api::Leases;
use super::count::{LeaseCount, count_valid};
use super::metrics::CounterMetrics;

/// Lists and counts until `stop`, calling `publish` after every successful list. A failed
/// list publishes nothing, so the last count stays in force (as upstream's fallback count).
pub async fn run(
    leases: Leases,
    selector: String,
    poll_interval: Duration,
    metrics: CounterMetrics,
    mut publish: impl FnMut(LeaseCount) + Send,
    stop: CancellationToken,
) {
    let polling = async {
        let mut last: Option<LeaseCount> = None;
        loop {
            let started = Instant::now();
            let listed = leases.list(&selector, true).await;
            metrics.list(&listed, started.elapsed());
            match listed {
                Ok(all) => {
                    let count = count_valid(&all, tether_observe::time::wall_clock());
                    if last.as_ref() != Some(&count) {
                        tracing::info!(count = count.count, holders = %count.holders.iter().map(String::as_str).collect::<Vec<_>>().join(","), "server Leases counted");
                    }
                    publish(count.clone());
                    last = Some(count);
                }
                Err(e) => {
                    let kept = last.as_ref().map(|c| c.count);
                    if e.status().is_some_and(|(code, _)| code == 400) {
                        // The API server parses the selector; upstream's agent refuses a bad
                        // one at start-up, which tether cannot do without asking.
                        tracing::error!(error = %e, %selector, kept, "the API server refuses --lease-label-selector; keeping the last count");
                    } else {
                        tracing::warn!(error = %e, kept, "could not list server Leases; keeping the last count");
                    }
                }
            }
            tokio::time::sleep(super::jitter(poll_interval, 0.1)).await;
        }
    };
    tokio::select! {
        () = stop.cancelled() => {}
        () = polling => {}
    }
}
