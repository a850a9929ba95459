//! Rate limiting for warnings a peer can trigger at will.

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

/// Lets one warning through per `interval` and counts what it held back, so that a peer
/// sending a stream of bad requests cannot flood the log.
#[derive(Debug)]
pub(crate) struct WarnLimit {
    interval: Duration,
    state: Mutex<(Option<Instant>, u64)>,
}

impl WarnLimit {
    pub(crate) const fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Mutex::new((None, 0)),
        }
    }

    /// `Some(suppressed since the last one)` when this warning may be logged.
    pub(crate) fn allow(&self) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        match state.0 {
            Some(last) if now.duration_since(last) < self.interval => {
                state.1 += 1;
                None
            }
            _ => {
                let suppressed = std::mem::take(&mut state.1);
                state.0 = Some(now);
                Some(suppressed)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_interval_then_reports_the_suppressed() {
        let limit = WarnLimit::new(Duration::from_millis(50));
        assert_eq!(limit.allow(), Some(0));
        assert_eq!(limit.allow(), None);
        assert_eq!(limit.allow(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(limit.allow(), Some(2));
    }
}
