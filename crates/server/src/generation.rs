//! The configuration generation in force: 1 for the routing file as read at start, one more
//! per reload applied while running (`tether_reload::Loaded::generation`). Audit records carry
//! it, so that a connection can be traced to the configuration that admitted it.
//!
//! A shared counter, read with one atomic load per dial; whoever applies a reload
//! [`set`](ConfigGeneration::set)s it right after the new configuration is in place.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A cheap handle on the generation in force; clones share it.
#[derive(Clone, Debug)]
pub(crate) struct ConfigGeneration(Arc<AtomicU64>);

impl Default for ConfigGeneration {
    /// Generation 1: the configuration read at start.
    fn default() -> Self {
        Self(Arc::new(AtomicU64::new(1)))
    }
}

impl ConfigGeneration {
    /// The generation in force now.
    pub(crate) fn get(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Publishes `generation` once its configuration is in force (the live reload of the
    /// routing file calls this with `Loaded::generation`).
    #[cfg_attr(
        not(test),
        expect(dead_code, reason = "the routing file's live reload will call it")
    )]
    pub(crate) fn set(&self, generation: u64) {
        self.0.store(generation, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_at_one_and_clones_share_it() {
        let generation = ConfigGeneration::default();
        let reader = generation.clone();
        assert_eq!(reader.get(), 1);
        generation.set(2);
        assert_eq!(reader.get(), 2);
    }
}
