//! A server's own Lease: created, renewed every renew interval, deleted on shutdown. The
//! same calls in the same order as upstream's (component-helpers' lease controller): renew
//! from the last written version; on failure, get (or create) and renew that; up to five
//! renewals a round, fetching the current version after a conflict.

use std::time::Duration;
use tokio::time::Instant;

use k8s_openapi::api::coordination::v1::Lease;
use tokio_util::sync::CancellationToken;

use super::api::{ApiError, CALL_TIMEOUT, Leases};
use super::record::LeaseIdentity;

/// Renewals tried in a row before waiting for the next round (upstream's
/// `maxUpdateRetries`).
const MAX_UPDATE_RETRIES: usize = 5;
/// Longest pause between attempts to get or create the Lease (upstream's `maxBackoff`).
const MAX_BACKOFF: Duration = Duration::from_secs(7);

/// Keeps the Lease renewed until `stop`, then deletes it (bounded by [`CALL_TIMEOUT`]).
pub async fn run(
    leases: Leases,
    identity: LeaseIdentity,
    renew_interval: Duration,
    stop: CancellationToken,
) {
    tracing::info!(lease = %identity.name, namespace = %identity.namespace, "publishing this server's Lease");
    let renewing = async {
        let mut latest: Option<Lease> = None;
        loop {
            latest = sync(&leases, &identity, latest, renew_interval).await;
            tokio::time::sleep(super::jitter(renew_interval, 0.04)).await;
        }
    };
    tokio::select! {
        () = stop.cancelled() => {}
        () = renewing => {}
    }
    match leases.delete(&identity.name, None).await {
        Ok(()) => tracing::info!(lease = %identity.name, "deleted this server's Lease"),
        Err(e) if e.is_not_found() => {}
        Err(e) => {
            tracing::warn!(lease = %identity.name, error = %e, "could not delete this server's Lease; it expires by itself")
        }
    }
}

/// One round: returns the Lease as last written (or read), to renew from next time.
async fn sync(
    leases: &Leases,
    identity: &LeaseIdentity,
    latest: Option<Lease>,
    renew_interval: Duration,
) -> Option<Lease> {
    if let Some(latest) = latest {
        match renew(leases, identity, latest, renew_interval).await {
            Ok(lease) => return Some(lease),
            Err(e) => {
                tracing::info!(error = %e, "renewing the Lease from its last version failed; reading it again")
            }
        }
    }
    let (lease, created) = ensure(leases, identity, renew_interval).await?;
    if created {
        return Some(lease);
    }
    match renew(leases, identity, lease.clone(), renew_interval).await {
        Ok(lease) => Some(lease),
        Err(e) => {
            tracing::warn!(error = %e, retry_in = ?renew_interval, "could not renew this server's Lease");
            Some(lease)
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("failed {MAX_UPDATE_RETRIES} attempts to update the Lease, last: {0}")]
struct RenewFailed(ApiError);

async fn renew(
    leases: &Leases,
    identity: &LeaseIdentity,
    mut base: Lease,
    renew_interval: Duration,
) -> Result<Lease, RenewFailed> {
    let mut last = None;
    for _ in 0..MAX_UPDATE_RETRIES {
        match leases
            .update(&identity.renewed(&base, tether_observe::time::wall_clock()))
            .await
        {
            Ok(lease) => return Ok(lease),
            Err(e) => {
                if e.is_conflict()
                    && let Some((current, _)) = ensure(leases, identity, renew_interval).await
                {
                    base = current;
                }
                last = Some(e);
            }
        }
    }
    Err(RenewFailed(last.unwrap_or(ApiError::Timeout(CALL_TIMEOUT))))
}

/// The current Lease, created if missing (true when this call created it). Retries with a
/// growing pause for at most one renew interval; `None` if it did not succeed by then.
async fn ensure(
    leases: &Leases,
    identity: &LeaseIdentity,
    within: Duration,
) -> Option<(Lease, bool)> {
    let deadline = Instant::now() + within;
    let mut pause = Duration::from_millis(100);
    loop {
        let attempt = match leases.get(&identity.name).await {
            Ok(lease) => Ok((lease, false)),
            Err(e) if e.is_not_found() => leases
                .create(&identity.fresh(tether_observe::time::wall_clock()))
                .await
                .map(|lease| (lease, true)),
            Err(e) => Err(e),
        };
        let error = match attempt {
            Ok(found) => return Some(found),
            Err(e) => e,
        };
        pause = (pause * 2).min(MAX_BACKOFF);
        if Instant::now() + pause >= deadline {
            tracing::warn!(error = %error, "could not read or create this server's Lease; trying again next round");
            return None;
        }
        tracing::warn!(error = %error, retry_in = ?pause, "could not read or create this server's Lease");
        tokio::time::sleep(pause).await;
    }
}
