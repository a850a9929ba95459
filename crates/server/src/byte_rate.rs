//! A tenant's bytes/s: one token bucket shared by all of the tenant's connections, counting
//! both directions, at the tenant's own limit, its share of the server's bandwidth
//! ([`crate::bandwidth`]), or the lower of the two.
//!
//! A connection over the limit waits before it forwards what it just read, so it reads no
//! more from its client socket, and returns no credit to its agent: back-pressure, never a
//! dropped byte. The bucket may go into debt by one chunk per connection and the wait pays
//! the debt back, so the tenant's aggregate keeps to the rate however many connections
//! share it. A tenant with neither a limit nor a share has an idle bucket: its data path
//! loads one flag. Every tenant has one bucket for its life, whatever the routing file's
//! generations say: a reload sets its rate ([`ByteRate::configure`]), and the tenant's live
//! connections, which share the bucket, follow it from their next chunk.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;

use tether_observe::metrics::Counter;
use tether_tunnel::Pace;

use crate::bandwidth::Bandwidth;

/// The least a bucket holds when full: one relay chunk, so a small rate still moves whole
/// chunks without waiting on each.
const MIN_BURST: f64 = 64.0 * 1024.0;
/// A full bucket is this long at the rate: a short burst, so the rate holds over any
/// second.
const BURST: Duration = Duration::from_millis(100);

#[derive(Debug)]
pub(crate) struct ByteRate {
    /// Whether there is a limit or a share:
    active: AtomicBool,
    state: Mutex<State>,
    /// Times a connection waited for the bucket.
    waits: Arc<Counter>,
}

/// What the bucket runs at, set by each configuration generation, and its level.
#[derive(Debug)]
struct State {
    /// The tenant's own limit (`limits.bytes_per_second`); infinite without one.
    limit: f64,
    share: Option<TenantShare>,
    bucket: Bucket,
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
    /// A bucket at `limit` bytes/s, at the tenant's `share`, or at the lower of the two;
    /// idle (charging costs one atomic load) when there is neither.
    pub(crate) fn new(limit: Option<u64>, share: Option<TenantShare>, waits: Arc<Counter>) -> Self {
        let now = Instant::now();
        let this = Self {
            active: AtomicBool::new(false),
            state: Mutex::new(State {
                limit: f64::INFINITY,
                share: None,
                bucket: Bucket {
                    tokens: MIN_BURST,
                    at: now,
                },
            }),
            waits,
        };
        this.configure(limit, share);
        this
    }

    /// Sets the limit and the share of a new configuration generation: the tenant's live
    /// connections follow it from their next chunk. The bucket keeps its level (capped at the
    /// new burst), so a lowered rate cannot be escaped by a full bucket.
    pub(crate) fn configure(&self, limit: Option<u64>, share: Option<TenantShare>) {
        let active = limit.is_some() || share.is_some();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.limit = limit.map_or(f64::INFINITY, |l| l as f64);
        state.share = share;
        let now = Instant::now();
        let rate = Self::rate_of(state.limit, state.share.as_ref(), 0, now);
        if !self.active.load(Ordering::Relaxed) && active {
            // From idle: a full bucket, as a new tenant's.
            state.bucket = Bucket {
                tokens: burst(rate),
                at: now,
            };
        } else {
            state.bucket.tokens = state.bucket.tokens.min(burst(rate));
        }
        self.active.store(active, Ordering::Relaxed);
    }

    /// Charges `bytes` just moved and waits until the bucket is out of debt.
    pub(crate) async fn take(&self, bytes: usize) {
        let wait = self.debit(bytes);
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    fn rate_of(limit: f64, share: Option<&TenantShare>, bytes: usize, now: Instant) -> f64 {
        match share {
            Some(s) => s.bandwidth.moved(s.index, bytes, now).min(limit),
            None => limit,
        }
    }

    /// Charges `bytes` at `now`; how long until the bucket is out of debt, and the share to
    /// tell about the wait.
    fn charge(&self, bytes: usize, now: Instant) -> (Duration, Option<(Arc<Bandwidth>, usize)>) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let per_second = Self::rate_of(state.limit, state.share.as_ref(), bytes, now);
        let bucket = &mut state.bucket;
        if now > bucket.at {
            let refill = (now - bucket.at).as_secs_f64() * per_second;
            bucket.tokens = (bucket.tokens + refill).min(burst(per_second));
            bucket.at = now;
        }
        bucket.tokens -= bytes as f64;
        if bucket.tokens >= 0.0 || per_second.is_infinite() {
            return (Duration::ZERO, None);
        }
        let wait = Duration::from_secs_f64(-bucket.tokens / per_second);
        // Only a wait is told to the share: the chunks that pass take no reference.
        let share = state.share.as_ref().map(|s| (s.bandwidth.clone(), s.index));
        (wait, share)
    }
}

/// A full bucket at `per_second`.
fn burst(per_second: f64) -> f64 {
    (per_second * BURST.as_secs_f64()).max(MIN_BURST)
}

impl Pace for ByteRate {
    /// Charges `bytes` just moved; how long until the bucket is out of debt (counted as a
    /// wait, and told to the tenant's bandwidth share, when not zero).
    fn debit(&self, bytes: usize) -> Duration {
        if !self.active.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
        let (wait, share) = self.charge(bytes, Instant::now());
        if !wait.is_zero() {
            self.waits.inc();
            if let Some((bandwidth, index)) = share {
                bandwidth.waits(index, Instant::now() + wait);
            }
        }
        wait
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    #[test]
    fn debt_is_paid_back_at_the_rate_and_the_burst_is_capped() {
        let rate = ByteRate::new(Some(MIB as u64), None, Arc::default());
        let t0 = Instant::now();
        let burst = (MIB as f64 / 10.0) as usize;
        assert_eq!(rate.charge(burst, t0).0, Duration::ZERO, "a full bucket");
        let wait = rate.charge(MIB, t0).0;
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-6, "{wait:?}");
        // Two connections in debt together wait for both chunks.
        let wait = rate.charge(MIB, t0).0;
        assert!((wait.as_secs_f64() - 2.0).abs() < 1e-6, "{wait:?}");
        // Ten idle seconds refill only the burst.
        let later = t0 + Duration::from_secs(12);
        assert_eq!(rate.charge(burst, later).0, Duration::ZERO);
        let wait = rate.charge(MIB / 2, later).0;
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
        // An earlier instant (a caller that read the clock before another) refills nothing.
        let wait = rate.charge(0, t0).0;
        assert!((wait.as_secs_f64() - 0.5).abs() < 1e-6, "{wait:?}");
    }

    #[test]
    fn a_small_rate_still_bursts_one_chunk() {
        let rate = ByteRate::new(Some(1000), None, Arc::default());
        assert_eq!(rate.charge(64 * 1024, Instant::now()).0, Duration::ZERO);
    }

    #[test]
    fn a_new_rate_applies_to_the_next_chunk() {
        let rate = ByteRate::new(None, None, Arc::default());
        assert!(!rate.active.load(Ordering::Relaxed), "idle without a limit");
        rate.configure(Some(MIB as u64), None);
        let t0 = Instant::now() + Duration::from_secs(1);
        let burst = (MIB as f64 / 10.0) as usize;
        assert_eq!(rate.charge(burst, t0).0, Duration::ZERO, "a full bucket");
        // Lowered: the debt is paid back at the new rate.
        rate.configure(Some(MIB as u64 / 2), None);
        let wait = rate.charge(MIB / 2, t0).0;
        assert!((wait.as_secs_f64() - 1.0).abs() < 1e-3, "{wait:?}");
        rate.configure(None, None);
        assert!(!rate.active.load(Ordering::Relaxed), "idle again");
    }
}
