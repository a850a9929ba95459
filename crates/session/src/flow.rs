//! Flow-control settings and their negotiation: pure numbers, no queues.

use std::time::Duration;

use tether_proto::metadata::TETHER_FLOW;

/// Accounting cost of one queued chunk at least: tiny chunks still cost a queue slot.
const MIN_CHUNK_COST: usize = 64;

/// What a chunk of `len` payload bytes costs against windows and queue limits. Sender and
/// receiver charge alike, so a sender that respects its window never overruns the
/// receiver's queue, however small its chunks.
pub fn chunk_cost(len: usize) -> usize {
    len.max(MIN_CHUNK_COST)
}

/// The smallest window tether accepts from a peer. Below it the credit batching (a grant per
/// quarter window) could starve a sender that reads 64 KiB at a time.
pub const MIN_WINDOW: u32 = 128 * 1024;

/// Flow-control settings of one end.
#[derive(Clone, Copy, Debug)]
pub struct FlowConfig {
    /// Credit this end grants per connection to a tether peer, in bytes.
    pub window: u32,
    /// Inbound bytes a connection may queue when the peer sends without credit (upstream).
    pub legacy_buffer: usize,
    /// Bytes a connection may have handed to the stream writer but not yet written, when the
    /// peer grants no credit. Bounds the writer's queue per connection.
    pub local_window: u32,
    /// With a peer that grants no credit, how long the stream reader waits for a full
    /// connection to make progress before closing it (see [`Inbound::wait_for_room`]).
    pub legacy_stall: Duration,
}

impl Default for FlowConfig {
    fn default() -> Self {
        Self {
            window: 1024 * 1024,
            legacy_buffer: 8 * 1024 * 1024,
            local_window: 1024 * 1024,
            legacy_stall: Duration::from_secs(2),
        }
    }
}

impl FlowConfig {
    /// The metadata entry announcing credit flow control with our window.
    pub fn announce(&self) -> (&'static str, String) {
        (TETHER_FLOW, self.window.to_string())
    }

    /// Reads the peer's `tether-flow` value and settles how this stream runs.
    pub fn negotiate(&self, peer_value: Option<&str>) -> Flow {
        match peer_value.and_then(|v| v.trim().parse::<u32>().ok()) {
            Some(peer_window) if peer_window >= MIN_WINDOW => Flow::Credit {
                peer_window,
                our_window: self.window,
            },
            _ => Flow::Legacy {
                buffer: self.legacy_buffer,
                local_window: self.local_window,
                stall: self.legacy_stall,
            },
        }
    }
}

/// How one stream's connections are flow-controlled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Both ends speak tether: end-to-end credit per connection.
    Credit { peer_window: u32, our_window: u32 },
    /// The peer is upstream Konnectivity: no credit on the wire.
    Legacy {
        buffer: usize,
        local_window: u32,
        stall: Duration,
    },
}

impl Flow {
    pub fn is_credit(self) -> bool {
        matches!(self, Self::Credit { .. })
    }

    /// Bytes a new connection may queue inbound before the peer is over its limit.
    pub fn inbound_limit(self) -> usize {
        match self {
            // The peer may send `our_window` before hearing back; allow the chunk overhead.
            Self::Credit { our_window, .. } => our_window as usize * 2,
            Self::Legacy { buffer, .. } => buffer,
        }
    }

    /// The send window a new connection starts with.
    pub fn initial_send_window(self) -> u32 {
        match self {
            Self::Credit { peer_window, .. } => peer_window,
            Self::Legacy { local_window, .. } => local_window,
        }
    }

    /// With a tether peer: grant credit back once this many bytes were consumed.
    pub fn grant_threshold(self) -> Option<u32> {
        match self {
            Self::Credit { our_window, .. } => Some(our_window / 4),
            Self::Legacy { .. } => None,
        }
    }

    /// With a legacy peer: how long a full connection may go without progress.
    pub fn stall(self) -> Option<Duration> {
        match self {
            Self::Credit { .. } => None,
            Self::Legacy { stall, .. } => Some(stall),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        let cfg = FlowConfig::default();
        assert!(cfg.negotiate(Some("1048576")).is_credit());
        assert!(!cfg.negotiate(None).is_credit());
        assert!(
            !cfg.negotiate(Some("1024")).is_credit(),
            "too small a window"
        );
        assert!(!cfg.negotiate(Some("lots")).is_credit());
        let credit = cfg.negotiate(Some("262144"));
        assert_eq!(credit.initial_send_window(), 262_144);
        assert_eq!(credit.inbound_limit(), cfg.window as usize * 2);
        assert_eq!(credit.grant_threshold(), Some(cfg.window / 4));
    }

    #[test]
    fn tiny_chunks_cost_a_minimum() {
        assert_eq!(chunk_cost(1), MIN_CHUNK_COST);
        assert_eq!(chunk_cost(100_000), 100_000);
    }
}
