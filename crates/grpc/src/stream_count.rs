//! How many streams a connection carries: it is idle while none is live.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::time::Instant;

/// Counts a connection's live streams; the connection is idle while the count is zero.
#[derive(Debug)]
pub(crate) struct StreamGuard {
    streams: Arc<StreamCount>,
}

#[derive(Debug)]
pub(crate) struct StreamCount {
    live: AtomicUsize,
    /// When the count last dropped to zero.
    idle_since: std::sync::Mutex<Instant>,
}

impl StreamCount {
    /// A connection's count, idle from now.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            live: AtomicUsize::new(0),
            idle_since: std::sync::Mutex::new(Instant::now()),
        })
    }

    pub(crate) fn guard(self: &Arc<Self>) -> StreamGuard {
        self.live.fetch_add(1, Ordering::AcqRel);
        StreamGuard {
            streams: self.clone(),
        }
    }

    /// When the connection became idle, or `None` while a stream is live.
    pub(crate) fn idle_since(&self) -> Option<Instant> {
        let since = *self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        (self.live.load(Ordering::Acquire) == 0).then_some(since)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        if self.streams.live.fetch_sub(1, Ordering::AcqRel) == 1 {
            *self
                .streams
                .idle_since
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}
