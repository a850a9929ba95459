//! Randomness without a dependency, for dial IDs, jitter and tie-breaks (never secrets).
//!
//! Each std `RandomState` gets distinct keys (random per thread, then counted up), so
//! hashing nothing with a fresh one yields a new pseudo-random value.

use std::hash::{BuildHasher, Hasher};

use crate::packet::DialId;

pub fn random_u64() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
}

impl DialId {
    /// A non-negative dial ID, like the Go client's `rand.Int63`.
    pub fn random() -> Self {
        Self((random_u64() >> 1) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_differ_and_dial_ids_are_non_negative() {
        let ids: std::collections::HashSet<i64> = (0..100).map(|_| DialId::random().0).collect();
        assert!(ids.len() > 95, "{} distinct of 100", ids.len());
        assert!(ids.iter().all(|&id| id >= 0));
    }

    #[test]
    fn type_names_follow_type_indices() {
        let packets = [
            crate::packet::Packet::Drain,
            crate::packet::Packet::CloseDial { random: DialId(1) },
            crate::packet::Packet::Credit {
                connect_id: crate::packet::ConnectId(1),
                bytes: 1,
            },
            crate::packet::Packet::ReverseCloseDial { random: DialId(1) },
            crate::packet::Packet::ResumeAck { received: 1 },
        ];
        for p in packets {
            assert_eq!(
                crate::packet::Packet::TYPE_NAMES[p.type_index()],
                p.type_name()
            );
        }
    }
}
