//! A tenant's bytes/s: one token bucket shared by all of the tenant's connections, counting
//! both directions, at the tenant's own limit, its share of the server's bandwidth
//! ([`crate::bandwidth`]), or the lower of the two.
//!
//! A connection over the limit waits before it forwards what it just read, so it reads no
//! more from its client socket, and returns no credit to its agent: back-pressure, never a
//! dropped byte. The bucket may go into debt by one chunk per connection and the wait pays
//! the debt back, so the tenant's aggregate keeps to the rate however many connections
//! share it. A tenant with neither a limit nor a share has no bucket: its data path only
//! tests an `Option`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tether_observe::metrics::Counter;

use crate::bandwidth::Bandwidth;

/// The least a bucket holds when full: one relay chunk, so a small rate still moves whole
/// chunks without waiting on each.
const MIN_BURST: f64 = 64.0 * 1024.0;
/// A full bucket is this long at the rate: a short burst, so the rate holds over any
/// second.
const BURST: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub(crate) struct ByteRate {
    /// The tenant's own limit (`limits.bytes_per_second`); infinite without one.
    limit: f64,
    share: Option<TenantShare>,
    bucket: Mutex<Bucket>,
    /// Times a connection waited for the bucket.
    waits: Arc<Counter>,
}

/// A tenant's place in the server's [`Bandwidth`].
#[derive(Debug)]
pub(crate) struct TenantShare {
    pub(crate) bandwidth: Arc<Bandwidth>,
    pub(crate) index: usize,
}

#[derive(Debug)]
struct Bucket {
    /// Negative while in debt.
    tokens: f64,
    at: Instant,
}

impl ByteRate {
    /// A bucket at `limit` bytes/s, at the tenant's `share`, or at the lower of the two; `None`
    /// when there is neither.
    pub(crate) fn new(
        limit: Option<u64>,
        share: Option<TenantShare>,
        waits: Arc<Counter>,
    ) -> Option<Self> {
        if limit.is_none() && share.is_none() {
            return None;
        }
        let limit = limit.map_or(f64::INFINITY, |l| l as f64);
        let now = Instant::now();
        let rate = Self::rate_of(limit, share.as_ref(), 0, now);
        Some(Self {
            limit,
            share,
            bucket: Mutex::new(Bucket {
                tokens: burst(rate),
                at: now,
            }),
            waits,
        })
    }

    /// Charges `bytes` just moved and waits until the bucket is out of debt.
    pub(crate) async fn take(&self, bytes: usize) {
        let wait = self.charge(bytes, Instant::now());
        if !wait.is_zero() {
            self.waits.inc();
            if let Some(share) = &self.share {
                share.bandwidth.waits(share.index, Instant::now() + wait);
            }
            tokio::time::sleep(wait).await;
        }
    }

    fn rate_of(limit: f64, share: Option<&TenantShare>, bytes: usize, now: Instant) -> f64 {
        match share {
            Some(s) => s.bandwidth.moved(s.index, bytes, now).min(limit),
            None => limit,
        }
    }

    /// Charges `bytes` at `now`; how long until the bucket is out of debt.
    fn charge(&self, bytes: usize, now: Instant) -> Duration {
        let per_second = Self::rate_of(self.limit, self.share.as_ref(), bytes, now);
        let mut bucket = self.bucket.lock().unwrap_or_else(|e| e.into_inner());
        if now > bucket.at {
            let refill = (now - bucket.at).as_secs_f64() * per_second;
            bucket.tokens = (bucket.tokens + refill).min(burst(per_second));
            bucket.at = now;
        }
        bucket.tokens -= bytes as f64;
        if bucket.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-bucket.tokens / per_second)
        }
    }
}

/// A full bucket at `per_second`.
fn burst(per_second: f64) -> f64 {
    (per_second * BURST.as_secs_f64()).max(MIN_BURST)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn debt_is_paid_back_at_the_rate_and_the_burst_is_capped() {
        let rate = ByteRate::new(Some(MIB as u64), None, Arc::default()).unwrap();
        let t0 = Instant::now();
        let burst = (MIB as f64 / 10.0) as usize;
        assert_eq!(rate.charge(burst, t0), Duration::ZERO, "a full bucket");
        let wait = rate.charge(MIB, t0);
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-6, "{wait:?}");
        // Two connections in debt together wait for both chunks.
        let wait = rate.charge(MIB, t0);
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-6, "{wait:?}");
        // Ten idle seconds refill only the burst.
        let later = t0 + Duration::from_secs(12);
        assert_eq!(rate.charge(burst, later), Duration::ZERO);
        let wait = rate.charge(MIB / 2, later);
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        // An earlier instant (a caller that read the clock before another) refills nothing.
        let wait = rate.charge(0, t0);
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
    }

    #[test]
    fn a_small_rate_still_bursts_one_chunk() {
        let rate = ByteRate::new(Some(1000), None, Arc::default()).unwrap();
        assert_eq!(rate.charge(64 * 1024, Instant::now()), Duration::ZERO);
    }
}
