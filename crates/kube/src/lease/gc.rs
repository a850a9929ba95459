//! Deleting expired server Leases (upstream's `GarbageCollectionController`): every
//! interval, list the Leases with this server's labels and delete each expired one, on
//! condition that it is still the version that was read, so that a Lease renewed meanwhile
//! survives.

use std::time::Duration;
use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use super::api::Leases;
use super::metrics::GcMetrics;
use super::validity::is_valid;

/// Runs until `stop`: one pass at once, then one every `interval`.
pub async fn run(
    leases: Leases,
    selector: String,
    interval: Duration,
    metrics: GcMetrics,
    stop: CancellationToken,
) {
    let collecting = async {
        loop {
            collect(&leases, &selector, &metrics).await;
            tokio::time::sleep(interval).await;
        }
    };
    tokio::select! {
        () = stop.cancelled() => {}
        () = collecting => {}
    }
}

async fn collect(leases: &Leases, selector: &str, metrics: &GcMetrics) {
    let started = Instant::now();
    let listed = leases.list(selector, false).await;
    metrics.list(&listed, started.elapsed());
    let all = match listed {
        Ok(all) => all,
        Err(e) => {
            tracing::warn!(error = %e, "could not list Leases to garbage-collect");
            return;
        }
    };
    let now = tether_observe::time::wall_clock();
    for lease in all.iter().filter(|l| !is_valid(l, now)) {
        let Some(name) = lease.metadata.name.as_deref() else {
            continue;
        };
        let started = Instant::now();
        let deleted = leases
            .delete(name, lease.metadata.resource_version.as_deref())
            .await;
        metrics.delete(&deleted, started.elapsed());
        match deleted {
            Ok(()) => tracing::info!(lease = name, "deleted an expired server Lease"),
            Err(e) if e.is_not_found() => {
                tracing::debug!(lease = name, "expired Lease already deleted")
            }
            Err(e) if e.is_conflict() => {
                tracing::debug!(lease = name, "expired Lease was renewed meanwhile; kept")
            }
            Err(e) => {
                tracing::warn!(lease = name, error = %e, "could not delete an expired server Lease")
            }
        }
    }
}
