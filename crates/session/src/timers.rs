//! Deadlines as data: a min-heap of (deadline, what it is for), with lazy deletion.
//!
//! Entries are never removed when the thing they time out ends early; the table checks,
//! when one fires, whether it still applies. That keeps arming a deadline O(log n) and
//! resolving a dial or close free. Stale entries live until their deadline at most.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;

use tether_proto::{ConnectId, DialId};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    Dial(DialId),
    Close(ConnectId),
    Stall(ConnectId),
    /// The suspended session's resume window.
    Resume,
}

#[derive(Debug, Default)]
pub(crate) struct Timers {
    heap: BinaryHeap<Reverse<(Instant, Timer)>>,
}

impl Timers {
    /// Arms `timer`; true if it is now the earliest deadline (the driver must re-arm).
    pub(crate) fn arm(&mut self, at: Instant, timer: Timer) -> bool {
        let earliest = self.next().is_none_or(|next| at < next);
        self.heap.push(Reverse((at, timer)));
        earliest
    }

    pub(crate) fn next(&self) -> Option<Instant> {
        self.heap.peek().map(|Reverse((at, _))| *at)
    }

    /// The next timer due at `now`, if any.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<(Instant, Timer)> {
        if self.next()? > now {
            return None;
        }
        self.heap.pop().map(|Reverse(entry)| entry)
    }

    pub(crate) fn clear(&mut self) {
        self.heap.clear();
    }
}
