//! A token-bucket rate limit (as a generic cell rate algorithm: one timestamp, no refill task),
//! matching client-go's QPS/burst limiter in what it allows; and the same limit kept per key
//! (a source address) in a bounded table.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The limit was reached and waiting for it would exceed the caller's deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("client-side rate limit reached (--kubeconfig-qps/--kubeconfig-burst)")]
pub struct Throttled;

#[derive(Debug)]
pub(crate) struct RateLimiter {
    /// `None`: no limit.
    rate: Option<Rate>,
    /// When the bucket would be empty again if no more requests came.
    theoretical_arrival: Mutex<Option<Instant>>,
}

#[derive(Clone, Copy, Debug)]
struct Rate {
    /// Time one request uses up: 1/QPS.
    interval: Duration,
    /// How far ahead of the rate requests may run: (burst - 1) intervals.
    tolerance: Duration,
}

impl Rate {
    fn new(qps: f32, burst: u32) -> Self {
        let interval = Duration::from_secs_f64(1.0 / f64::from(qps.max(f32::MIN_POSITIVE)));
        Self {
            interval,
            tolerance: interval.saturating_mul(burst.max(1) - 1),
        }
    }

    /// Reserves a slot against the bucket whose theoretical arrival time is `tat`: the instant
    /// the request may start, at `now` or later, unless that is after `deadline` (then `tat`
    /// is left as it was).
    fn reserve(
        self,
        tat: &mut Option<Instant>,
        now: Instant,
        deadline: Instant,
    ) -> Result<Instant, Throttled> {
        let arrival = tat.map_or(now, |t| t.max(now));
        let start = arrival
            .checked_sub(self.tolerance)
            .map_or(now, |t| t.max(now));
        if start > deadline {
            return Err(Throttled);
        }
        *tat = Some(arrival + self.interval);
        Ok(start)
    }
}

impl RateLimiter {
    pub(crate) fn new(qps: f32, burst: u32) -> Self {
        Self {
            rate: Some(Rate::new(qps, burst)),
            theoretical_arrival: Mutex::new(None),
        }
    }

    pub(crate) fn unlimited() -> Self {
        Self {
            rate: None,
            theoretical_arrival: Mutex::new(None),
        }
    }

    /// Reserves a slot: the instant the request may start, at `now` or later, unless that
    /// is after `deadline`.
    pub(crate) fn reserve(&self, now: Instant, deadline: Instant) -> Result<Instant, Throttled> {
        let Some(rate) = self.rate else {
            return Ok(now);
        };
        let mut tat = self
            .theoretical_arrival
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        rate.reserve(&mut tat, now, deadline)
    }
}

/// One [`RateLimiter`] per key, in a table of at most `max_keys` entries. A key whose bucket
/// has refilled holds nothing worth keeping and is dropped when room is needed; when every
/// entry is still in use, the one closest to refilled goes (it loses at most part of a burst).
#[derive(Debug)]
pub(crate) struct KeyedRateLimiter<K> {
    rate: Rate,
    max_keys: usize,
    /// Each key's theoretical arrival time.
    buckets: Mutex<HashMap<K, Instant>>,
}

impl<K: Hash + Eq + Copy> KeyedRateLimiter<K> {
    pub(crate) fn new(qps: f32, burst: u32, max_keys: usize) -> Self {
        Self {
            rate: Rate::new(qps, burst),
            max_keys: max_keys.max(1),
            buckets: Mutex::default(),
        }
    }

    /// As [`RateLimiter::reserve`], against `key`'s own bucket.
    pub(crate) fn reserve(
        &self,
        key: K,
        now: Instant,
        deadline: Instant,
    ) -> Result<Instant, Throttled> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if buckets.len() >= self.max_keys && !buckets.contains_key(&key) {
            buckets.retain(|_, tat| *tat > now);
            if buckets.len() >= self.max_keys
                && let Some(soonest) = buckets.iter().min_by_key(|(_, tat)| **tat).map(|(k, _)| *k)
            {
                buckets.remove(&soonest);
            }
        }
        let mut tat = buckets.get(&key).copied();
        let start = self.rate.reserve(&mut tat, now, deadline)?;
        if let Some(tat) = tat {
            buckets.insert(key, tat);
        }
        Ok(start)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn burst_then_rate() {
        let limiter = RateLimiter::new(5.0, 10);
        let now = Instant::now();
        let far = now + Duration::from_secs(3600);
        // The burst starts at once.
        for _ in 0..10 {
            assert_eq!(limiter.reserve(now, far), Ok(now));
        }
        // Then one request per 200 ms.
        let eleventh = limiter.reserve(now, far).unwrap();
        let twelfth = limiter.reserve(now, far).unwrap();
        assert_eq!(eleventh - now, Duration::from_millis(200));
        assert_eq!(twelfth - now, Duration::from_millis(400));
        // A caller that cannot wait that long is refused and uses nothing up.
        assert_eq!(
            limiter.reserve(now, now + Duration::from_millis(100)),
            Err(Throttled)
        );
        assert_eq!(
            limiter.reserve(now, far).unwrap() - now,
            Duration::from_millis(600)
        );
        // After a quiet period the burst is available again.
        let later = now + Duration::from_secs(10);
        assert_eq!(limiter.reserve(later, later), Ok(later));
    }

    #[test]
    fn each_key_has_its_own_bucket() {
        let limiter = KeyedRateLimiter::new(2.0, 3, 100);
        let now = Instant::now();
        for _ in 0..3 {
            assert_eq!(limiter.reserve('a', now, now), Ok(now));
        }
        assert_eq!(limiter.reserve('a', now, now), Err(Throttled));
        // Another key is not affected by the first one's use.
        assert_eq!(limiter.reserve('b', now, now), Ok(now));
        assert_eq!(
            limiter.reserve('a', now, now + Duration::from_secs(1)),
            Ok(now + Duration::from_millis(500))
        );
    }

    #[test]
    fn the_table_is_bounded_and_keeps_busy_keys() {
        let limiter = KeyedRateLimiter::new(1.0, 2, 3);
        let now = Instant::now();
        // 'busy' has used its burst and a slot beyond; the others one slot, refilled a
        // second later.
        let far = now + Duration::from_secs(10);
        for _ in 0..3 {
            limiter.reserve("busy", now, far).unwrap();
        }
        limiter.reserve("x", now, now).unwrap();
        limiter.reserve("y", now, now).unwrap();
        assert_eq!(limiter.len(), 3);
        let later = now + Duration::from_millis(1_500);
        limiter.reserve("z", later, later).unwrap();
        assert_eq!(limiter.len(), 2, "refilled keys are dropped for room");
        assert_eq!(
            limiter.reserve("busy", later, later),
            Err(Throttled),
            "a key still limited keeps its bucket"
        );
        // With every entry in use, the one closest to refilled goes.
        for key in ["p", "q", "r", "s"] {
            limiter.reserve(key, later, later).unwrap();
            assert!(limiter.len() <= 3);
        }
    }

    #[test]
    fn unlimited_never_waits() {
        let limiter = RateLimiter::unlimited();
        let now = Instant::now();
        for _ in 0..1000 {
            assert_eq!(limiter.reserve(now, now), Ok(now));
        }
    }
}
