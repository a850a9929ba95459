//! A listener-wide budget for the bytes of large messages still being received.
//!
//! A stream's receive window lets its peer send a whole message (up to 4 MiB) before the
//! receiver can decode anything, and a message's bytes stay held until it completes. Peers
//! that start large messages and never finish them therefore hold up to a message per stream
//! for as long as they like. Real messages are small (a DATA packet carries at most 64 KiB
//! from tether, 32 KiB from upstream's agent), so each stream may hold
//! [`FREE_PARTIAL_BYTES`] of an incomplete message on its own, and only the bytes beyond come
//! from this budget, shared by every stream of the listener. A stream whose message cannot
//! get them ends with RESOURCE_EXHAUSTED; streams that send ordinary packets never touch it.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// What one stream may hold of an incomplete message without drawing on the budget.
pub const FREE_PARTIAL_BYTES: usize = 256 * 1024;

/// Bytes of incomplete large messages that all streams sharing it may hold at once.
pub struct PartialMessageBudget {
    limit: usize,
    held: AtomicUsize,
    on_refusal: Box<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for PartialMessageBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartialMessageBudget")
            .field("limit", &self.limit)
            .field("held", &self.held())
            .finish_non_exhaustive()
    }
}

impl PartialMessageBudget {
    /// A budget of `limit` bytes; `on_refusal` runs each time a stream is ended for want of it
    /// (to count it).
    pub fn new(limit: usize, on_refusal: impl Fn() + Send + Sync + 'static) -> Arc<Self> {
        Arc::new(Self {
            limit,
            held: AtomicUsize::new(0),
            on_refusal: Box::new(on_refusal),
        })
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes drawn now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    fn take(&self, bytes: usize) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(bytes).filter(|&total| total <= self.limit)
            })
            .is_ok()
    }

    fn give(&self, bytes: usize) {
        self.held.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// What one stream has drawn from a budget; given back as its message completes, or when the
/// stream ends.
#[derive(Debug)]
pub struct Draw {
    budget: Arc<PartialMessageBudget>,
    drawn: usize,
}

/// The budget could not cover a stream's incomplete message.
#[derive(Debug)]
pub struct Exhausted {
    pub held: usize,
    pub limit: usize,
}

impl Draw {
    pub fn new(budget: Arc<PartialMessageBudget>) -> Self {
        Self { budget, drawn: 0 }
    }

    /// Adjusts the draw to a stream holding `partial` bytes of an incomplete message.
    pub fn hold(&mut self, partial: usize) -> Result<(), Exhausted> {
        let want = partial.saturating_sub(FREE_PARTIAL_BYTES);
        if want > self.drawn {
            if !self.budget.take(want - self.drawn) {
                (self.budget.on_refusal)();
                return Err(Exhausted {
                    held: partial,
                    limit: self.budget.limit,
                });
            }
        } else if want < self.drawn {
            self.budget.give(self.drawn - want);
        }
        self.drawn = want;
        Ok(())
    }
}

impl Drop for Draw {
    fn drop(&mut self) {
        self.budget.give(self.drawn);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicU64;

    use super::*;

    #[test]
    fn small_messages_draw_nothing_and_large_ones_share_the_budget() {
        let refusals = Arc::new(AtomicU64::new(0));
        let counted = refusals.clone();
        let budget = PartialMessageBudget::new(1 << 20, move || {
            counted.fetch_add(1, Ordering::Relaxed);
        });
        let mut a = Draw::new(budget.clone());
        let mut b = Draw::new(budget.clone());
        a.hold(FREE_PARTIAL_BYTES).unwrap();
        assert_eq!(budget.held(), 0);
        a.hold(FREE_PARTIAL_BYTES + 700_000).unwrap();
        assert_eq!(budget.held(), 700_000);
        let refused = b.hold(FREE_PARTIAL_BYTES + 400_000).unwrap_err();
        assert_eq!(refused.limit, 1 << 20);
        assert_eq!(refusals.load(Ordering::Relaxed), 1);
        assert_eq!(budget.held(), 700_000, "a refusal draws nothing");
        // a's message completed: its bytes go back, and b's fits.
        a.hold(0).unwrap();
        b.hold(FREE_PARTIAL_BYTES + 400_000).unwrap();
        assert_eq!(budget.held(), 400_000);
        drop(b);
        assert_eq!(budget.held(), 0, "an ended stream gives back what it drew");
    }
}
