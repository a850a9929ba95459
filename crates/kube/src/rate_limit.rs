//! A token-bucket rate limit (as a generic cell rate algorithm: one timestamp, no refill task),
//! matching client-go's QPS/burst limiter in what it allows.

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
pub(crate) struct Rate {
    /// Time one request uses up: 1/QPS.
    interval: Duration,
    /// How far ahead of the rate requests may run: (burst - 1) intervals.
    tolerance: Duration,
}

impl Rate {
    pub(crate) fn new(qps: f32, burst: u32) -> Self {
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
        let start = self.earliest(*tat, now);
        if start > deadline {
            return Err(Throttled);
        }
        self.charge(tat, now);
        Ok(start)
    }

    /// When a request could start against the bucket `tat`, without using it up.
    pub(crate) fn earliest(self, tat: Option<Instant>, now: Instant) -> Instant {
        let arrival = tat.map_or(now, |t| t.max(now));
        arrival
            .checked_sub(self.tolerance)
            .map_or(now, |t| t.max(now))
    }

    /// Uses up one request's share of the bucket `tat`.
    pub(crate) fn charge(self, tat: &mut Option<Instant>, now: Instant) {
        let arrival = tat.map_or(now, |t| t.max(now));
        *tat = Some(arrival + self.interval);
    }

    /// Whether the bucket `tat` is full again at `now` (it holds nothing worth keeping).
    pub(crate) fn refilled(self, tat: Option<Instant>, now: Instant) -> bool {
        tat.is_none_or(|t| t <= now)
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
    fn unlimited_never_waits() {
        let limiter = RateLimiter::unlimited();
        let now = Instant::now();
        for _ in 0..1000 {
            assert_eq!(limiter.reserve(now, now), Ok(now));
        }
    }
}
