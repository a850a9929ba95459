//! The writer's queue: deficit round robin in bytes across connections.
//!
//! One bulk transfer must not make an interactive session wait behind its whole window.
//! Packets of a connection (DATA, CLOSE_REQ, CLOSE_RSP) queue per connection, in order;
//! everything else (dials, their answers, DIAL_CLS, DRAIN, CREDIT) is small and goes first,
//! in order. Each turn a connection may send up to `QUANTUM` bytes more than it has used;
//! a connection that empties its queue leaves the rotation with its deficit reset.
//!
//! Moving control packets ahead of earlier DATA is safe: a DIAL_RSP only ever precedes the
//! DATA of the connection it opens, and a CREDIT refers to the other direction's data.

use std::collections::{HashMap, VecDeque};

use tether_proto::{ConnectId, Packet};

use crate::outgoing::Outgoing;

/// Bytes a connection may send per turn: one full DATA chunk, so any packet fits a turn.
pub(crate) const QUANTUM: usize = 64 * 1024 + PACKET_OVERHEAD;
/// What a packet costs beyond its payload (the same figure the batch limit counts).
pub(crate) const PACKET_OVERHEAD: usize = 16;

#[derive(Debug)]
struct Backlog {
    queue: VecDeque<Outgoing>,
    deficit: usize,
}

/// Emptied per-connection queues kept for the next burst, so an interactive connection,
/// which empties its queue after every message, does not allocate one per message.
const SPARE_QUEUES: usize = 64;
/// A spare queue larger than this is dropped rather than kept (a bulk burst's backlog).
const SPARE_CAPACITY: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct FairQueue {
    control: VecDeque<Outgoing>,
    backlogs: HashMap<ConnectId, Backlog>,
    spare: Vec<VecDeque<Outgoing>>,
    /// Connections with queued packets, in turn order; the front one is being served.
    rotation: VecDeque<ConnectId>,
    /// The front connection already received its quantum for this turn.
    in_turn: bool,
    len: usize,
}

/// What a packet costs the writer's byte budget.
pub(crate) fn cost(packet: &Packet) -> usize {
    match packet {
        Packet::Data { data, .. } => data.len() + PACKET_OVERHEAD,
        _ => PACKET_OVERHEAD,
    }
}

/// The connection whose order a packet must keep, if any.
fn flow_of(packet: &Packet) -> Option<ConnectId> {
    match packet {
        Packet::Data { connect_id, .. }
        | Packet::CloseRequest { connect_id }
        | Packet::CloseResponse { connect_id, .. } => Some(*connect_id),
        _ => None,
    }
}

impl FairQueue {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn push(&mut self, item: Outgoing) {
        self.len += 1;
        let Some(id) = flow_of(&item.packet) else {
            self.control.push_back(item);
            return;
        };
        let spare = &mut self.spare;
        let backlog = self.backlogs.entry(id).or_insert_with(|| Backlog {
            queue: spare.pop().unwrap_or_default(),
            deficit: 0,
        });
        if backlog.queue.is_empty() {
            self.rotation.push_back(id);
        }
        backlog.queue.push_back(item);
    }

    /// The next packet to write.
    pub(crate) fn pop(&mut self) -> Option<Outgoing> {
        if let Some(item) = self.control.pop_front() {
            self.len -= 1;
            return Some(item);
        }
        loop {
            let id = *self.rotation.front()?;
            let backlog = self.backlogs.get_mut(&id)?;
            if !self.in_turn {
                backlog.deficit += QUANTUM;
                self.in_turn = true;
            }
            let head = cost(&backlog.queue.front()?.packet);
            if head > backlog.deficit {
                // Its turn is over; it keeps the unused deficit for the next one.
                self.rotation.rotate_left(1);
                self.in_turn = false;
                continue;
            }
            backlog.deficit -= head;
            let item = backlog.queue.pop_front();
            if backlog.queue.is_empty() {
                if let Some(Backlog { queue, .. }) = self.backlogs.remove(&id)
                    && self.spare.len() < SPARE_QUEUES
                    && queue.capacity() <= SPARE_CAPACITY
                {
                    self.spare.push(queue);
                }
                self.rotation.pop_front();
                self.in_turn = false;
            }
            self.len -= 1;
            return item;
        }
    }

    pub(crate) fn clear(&mut self) {
        *self = Self::default();
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;
    use tether_proto::DialId;

    use super::*;

    fn outgoing(packet: Packet) -> Outgoing {
        Outgoing {
            packet,
            release: None,
            reply: false,
        }
    }

    fn data(id: i64, len: usize) -> Outgoing {
        outgoing(Packet::Data {
            connect_id: ConnectId(id),
            data: Bytes::from(vec![0u8; len]),
        })
    }

    fn control(n: i64) -> Outgoing {
        outgoing(Packet::CloseDial { random: DialId(n) })
    }

    /// A queued item: (connection or control, payload length).
    fn item() -> impl Strategy<Value = (Option<i64>, usize)> {
        (
            prop_oneof![Just(None), (1i64..6).prop_map(Some)],
            0usize..70_000,
        )
    }

    #[test]
    fn emptied_queues_are_reused_up_to_a_bound() {
        let mut q = FairQueue::default();
        q.push(data(1, 64));
        q.pop().unwrap();
        assert_eq!(q.spare.len(), 1);
        q.push(data(2, 64));
        assert!(q.spare.is_empty(), "the next burst takes the spare queue");
        q.pop().unwrap();
        for id in 0..2 * SPARE_QUEUES as i64 {
            q.push(data(id, 1));
        }
        while q.pop().is_some() {}
        assert_eq!(q.spare.len(), SPARE_QUEUES);
        q.spare.clear();
        for _ in 0..2 * SPARE_CAPACITY {
            q.push(data(7, 1));
        }
        while q.pop().is_some() {}
        assert!(q.spare.is_empty(), "a bulk burst's large queue is not kept");
    }

    proptest! {
        /// Everything pushed comes out exactly once, in order per connection and among
        /// control packets, and control never waits behind connection data.
        #[test]
        fn lossless_ordered_and_control_first(
            script in proptest::collection::vec((item(), 0usize..3), 1..200)
        ) {
            let mut q = FairQueue::default();
            let mut pushed = 0usize;
            let mut popped = Vec::new();
            for (n, ((flow, len), pops)) in script.into_iter().enumerate() {
                let mut item = match flow {
                    Some(id) => data(id, len),
                    None => control(n as i64),
                };
                // Tag each packet with its push number (the field is only carried along).
                item.release = Some((ConnectId(n as i64), 0));
                q.push(item);
                pushed += 1;
                for _ in 0..pops {
                    let had_control = !q.control.is_empty();
                    if let Some(out) = q.pop() {
                        prop_assert_eq!(had_control, flow_of(&out.packet).is_none());
                        popped.push(out);
                    }
                }
            }
            while let Some(out) = q.pop() {
                popped.push(out);
            }
            prop_assert_eq!(popped.len(), pushed);
            prop_assert_eq!(q.len(), 0);
            let mut last: HashMap<Option<ConnectId>, i64> = HashMap::new();
            for out in &popped {
                let (flow, n) = (flow_of(&out.packet), out.release.unwrap().0.0);
                if let Some(prev) = last.insert(flow, n) {
                    prop_assert!(prev < n, "{flow:?}: {prev} before {n}");
                }
            }
        }

        /// Backlogged connections share bytes evenly whatever their packet sizes: at every
        /// point, no two have been served more than a quantum plus a packet apart.
        #[test]
        fn backlogged_connections_get_equal_bytes(
            sizes in proptest::collection::vec(1usize..65_536, 2..6),
            rounds in 1usize..40,
        ) {
            let mut q = FairQueue::default();
            for (i, size) in sizes.iter().enumerate() {
                for _ in 0..(rounds * 64 * 1024 / size + 2) {
                    q.push(data(i as i64, *size));
                }
            }
            let mut served = vec![0usize; sizes.len()];
            let bound = QUANTUM + 64 * 1024 + PACKET_OVERHEAD;
            for _ in 0..rounds * sizes.len() {
                let Some(out) = q.pop() else { break };
                let Packet::Data { connect_id, data } = &out.packet else { unreachable!() };
                served[connect_id.0 as usize] += data.len() + PACKET_OVERHEAD;
                // Only while every connection is still backlogged.
                if (0..sizes.len()).all(|i| q.backlogs.contains_key(&ConnectId(i as i64))) {
                    let (lo, hi) = (served.iter().min().unwrap(), served.iter().max().unwrap());
                    prop_assert!(hi - lo <= bound, "{served:?}");
                }
            }
        }
    }

    #[test]
    fn a_small_packet_waits_for_at_most_one_turn_of_each_bulk_connection() {
        let mut q = FairQueue::default();
        for bulk in 1..=8 {
            for _ in 0..16 {
                q.push(data(bulk, 64 * 1024));
            }
        }
        q.push(data(100, 64));
        let mut ahead = 0;
        loop {
            let out = q.pop().unwrap();
            if let Packet::Data {
                connect_id: ConnectId(100),
                ..
            } = out.packet
            {
                break;
            }
            ahead += cost(&out.packet);
        }
        // FIFO would put 8 MiB ahead of it; DRR at most one quantum per bulk connection.
        assert!(ahead <= 8 * QUANTUM, "{ahead} bytes ahead");
    }
}
