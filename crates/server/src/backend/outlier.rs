//! Outlier ejection for agent streams, in the style of Envoy's consecutive-failure detector:
//! an agent whose dials keep failing is skipped for a while, longer each time it relapses.
//!
//! Plain data driven by the caller's clock. An ejected agent is still chosen when nothing
//! better is left (see `selection`), so ejection never turns a degraded fleet into no fleet.

use std::time::{Duration, Instant};

/// When an agent is ejected and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EjectionConfig {
    /// Consecutive failed dials that eject an agent; 0 disables ejection.
    pub consecutive_failures: u32,
    /// The first ejection's length; the n-th lasts n times this, up to `max_ejection`.
    pub base_ejection: Duration,
    pub max_ejection: Duration,
}

impl Default for EjectionConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(300),
        }
    }
}

/// One agent stream's dial record.
#[derive(Clone, Debug, Default)]
pub(crate) struct Outlier {
    failures: u32,
    /// Ejections since the last success, which lengthen the next one.
    ejections: u32,
    until: Option<Instant>,
}

/// What a recorded dial changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    Unchanged,
    Ejected(Duration),
    /// A dial succeeded on an agent that had been ejected before.
    Recovered,
}

impl Outlier {
    pub(crate) fn is_ejected(&self, now: Instant) -> bool {
        self.until.is_some_and(|until| now < until)
    }

    pub(crate) fn record(&mut self, config: &EjectionConfig, now: Instant, ok: bool) -> Verdict {
        if ok {
            let was = self.ejections > 0;
            *self = Self::default();
            return if was {
                Verdict::Recovered
            } else {
                Verdict::Unchanged
            };
        }
        self.failures = self.failures.saturating_add(1);
        if config.consecutive_failures == 0
            || self.failures < config.consecutive_failures
            || self.is_ejected(now)
        {
            return Verdict::Unchanged;
        }
        self.ejections = self.ejections.saturating_add(1);
        self.failures = 0;
        let length = config
            .base_ejection
            .saturating_mul(self.ejections)
            .min(config.max_ejection);
        self.until = Some(now + length);
        Verdict::Ejected(length)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_observe::time::monotonic_now;

    #[test]
    fn ejects_after_consecutive_failures_longer_each_time_and_recovers() {
        let config = EjectionConfig {
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(10),
            max_ejection: Duration::from_secs(25),
        };
        let t0 = monotonic_now();
        let mut o = Outlier::default();
        assert_eq!(o.record(&config, t0, false), Verdict::Unchanged);
        assert_eq!(
            o.record(&config, t0, true),
            Verdict::Unchanged,
            "a success resets"
        );
        for _ in 0..2 {
            assert_eq!(o.record(&config, t0, false), Verdict::Unchanged);
        }
        assert_eq!(
            o.record(&config, t0, false),
            Verdict::Ejected(Duration::from_secs(10))
        );
        assert!(o.is_ejected(t0 + Duration::from_secs(9)));
        assert!(!o.is_ejected(t0 + Duration::from_secs(10)));
        // Relapse after the ejection: twice as long, then capped.
        let t1 = t0 + Duration::from_secs(11);
        for _ in 0..2 {
            o.record(&config, t1, false);
        }
        assert_eq!(
            o.record(&config, t1, false),
            Verdict::Ejected(Duration::from_secs(20))
        );
        let t2 = t1 + Duration::from_secs(21);
        for _ in 0..2 {
            o.record(&config, t2, false);
        }
        assert_eq!(
            o.record(&config, t2, false),
            Verdict::Ejected(Duration::from_secs(25))
        );
        assert_eq!(o.record(&config, t2, true), Verdict::Recovered);
        assert!(!o.is_ejected(t2));
    }

    #[test]
    fn zero_threshold_never_ejects() {
        let config = EjectionConfig {
            consecutive_failures: 0,
            ..EjectionConfig::default()
        };
        let mut o = Outlier::default();
        let now = monotonic_now();
        for _ in 0..100 {
            assert_eq!(o.record(&config, now, false), Verdict::Unchanged);
        }
        assert!(!o.is_ejected(now));
    }
}
