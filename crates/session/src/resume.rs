//! Resumable sessions: the packet numbering, acknowledgements and replay log that let a
//! session outlive the transport (the gRPC stream) it runs on.
//!
//! Every packet a resumable session writes, except [`Packet::ResumeAck`], is numbered from 1
//! in write order, across all the transports the session ran on. Each end counts the
//! numbered packets it received and tells the peer with RESUME_ACK at the front of a write
//! batch (and soon after a burst of received packets), so the peer can forget them. What
//! was written but not acknowledged stays in the log. When a new transport takes over, each
//! end states how many of the peer's packets it received in total; the peer drops those from
//! its log and writes the rest again, in order, before anything new. Nothing is lost and
//! nothing is delivered twice, dials and closes included.
//!
//! The log is bounded by the credit windows: a receiver acknowledges a packet (at the
//! front of its next batch) before it can grant credit for the bytes in it, so a
//! connection's logged DATA is at most its window, as its outbox share is.

use std::collections::VecDeque;

use tether_proto::Packet;

/// Acknowledge after this many received packets even when nothing else is to be written.
const ACK_EVERY_PACKETS: u64 = 64;
/// Acknowledge after this many received payload bytes even when nothing else is written.
const ACK_EVERY_BYTES: usize = 256 * 1024;

/// A resume the log cannot serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResumeError {
    /// The peer says it received packets this end never sent, or fewer than it already
    /// acknowledged: the two ends do not share this session's history.
    OutOfRange {
        peer_received: u64,
        acked: u64,
        sent: u64,
    },
    /// The session is not resumable, or already ended.
    NotResumable,
}

impl std::fmt::Display for ResumeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::OutOfRange {
                peer_received,
                acked,
                sent,
            } => write!(
                f,
                "peer resumes after packet {peer_received}, outside the {acked}..={sent} this end can replay"
            ),
            Self::NotResumable => f.write_str("the session cannot be resumed"),
        }
    }
}

impl std::error::Error for ResumeError {}

/// What a resume writes again.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Replayed {
    pub packets: u64,
    /// DATA payload bytes among them.
    pub bytes: u64,
}

/// One end's numbering, acknowledgements and log.
#[derive(Debug, Default)]
pub(crate) struct Replay {
    /// Numbered packets written so far (queued for the transport counts as written).
    sent: u64,
    /// The peer acknowledged packets `1..=acked`.
    acked: u64,
    /// Packets `acked + 1 ..= sent`, in order.
    log: VecDeque<Packet>,
    /// DATA payload bytes in `log`.
    log_bytes: usize,
    /// The last `unsent` packets of `log` are to be written (again) before anything new.
    unsent: usize,
    /// Numbered packets received from the peer.
    received: u64,
    /// The `received` last told to the peer.
    ack_sent: u64,
    /// Payload bytes received since `ack_sent`.
    bytes_since_ack: usize,
}

impl Replay {
    /// The count to resume with: how many of the peer's packets this end received.
    pub(crate) fn received(&self) -> u64 {
        self.received
    }

    /// DATA payload bytes kept for replay.
    pub(crate) fn log_bytes(&self) -> usize {
        self.log_bytes
    }

    pub(crate) fn log_len(&self) -> usize {
        self.log.len()
    }

    /// A numbered packet with `data_len` payload bytes arrived from the peer; true when an
    /// acknowledgement is due now.
    pub(crate) fn on_received(&mut self, data_len: usize) -> bool {
        self.received += 1;
        self.bytes_since_ack += data_len;
        self.ack_due()
    }

    /// Whether an acknowledgement or a replay waits for the writer.
    pub(crate) fn has_work(&self) -> bool {
        self.unsent > 0 || self.ack_due()
    }

    fn ack_due(&self) -> bool {
        self.received - self.ack_sent >= ACK_EVERY_PACKETS
            || self.bytes_since_ack >= ACK_EVERY_BYTES
    }

    /// The acknowledgement to put at the front of the next batch, if anything new arrived.
    pub(crate) fn take_ack(&mut self) -> Option<Packet> {
        if self.received == self.ack_sent {
            return None;
        }
        self.ack_sent = self.received;
        self.bytes_since_ack = 0;
        Some(Packet::ResumeAck {
            received: self.received,
        })
    }

    /// The next logged packet to write again after a resume.
    pub(crate) fn next_unsent(&mut self) -> Option<Packet> {
        if self.unsent == 0 {
            return None;
        }
        let packet = self.log[self.log.len() - self.unsent].clone();
        self.unsent -= 1;
        Some(packet)
    }

    /// A new packet goes to the writer: it gets the next number and stays until acknowledged.
    pub(crate) fn record(&mut self, packet: &Packet) {
        debug_assert_eq!(self.unsent, 0, "new packets are written after the replay");
        self.sent += 1;
        self.log_bytes += data_len(packet);
        self.log.push_back(packet.clone());
    }

    /// The peer acknowledged `received` packets. False if it claims more than was written
    /// (or than it may have seen) or fewer than before: it is broken.
    pub(crate) fn on_ack(&mut self, received: u64) -> bool {
        let written = self.sent - self.unsent as u64;
        if received < self.acked || received > written {
            return false;
        }
        self.forget_through(received);
        true
    }

    /// Whether a peer that received `peer_received` packets can be served from this log.
    pub(crate) fn can_resume(&self, peer_received: u64) -> Result<(), ResumeError> {
        if peer_received < self.acked || peer_received > self.sent {
            return Err(ResumeError::OutOfRange {
                peer_received,
                acked: self.acked,
                sent: self.sent,
            });
        }
        Ok(())
    }

    /// A new transport: the peer received `peer_received` packets; everything after is
    /// written again. This end's own count is acknowledged by the handshake itself.
    pub(crate) fn resume(&mut self, peer_received: u64) -> Result<Replayed, ResumeError> {
        self.can_resume(peer_received)?;
        self.forget_through(peer_received);
        self.unsent = self.log.len();
        self.ack_sent = self.received;
        self.bytes_since_ack = 0;
        Ok(Replayed {
            packets: self.log.len() as u64,
            bytes: self.log_bytes as u64,
        })
    }

    /// Forgets everything: the session ended.
    pub(crate) fn clear(&mut self) {
        self.log.clear();
        self.log_bytes = 0;
        self.unsent = 0;
    }

    fn forget_through(&mut self, received: u64) {
        while self.acked < received {
            let Some(packet) = self.log.pop_front() else {
                break;
            };
            self.log_bytes -= data_len(&packet);
            self.acked += 1;
        }
        self.unsent = self.unsent.min(self.log.len());
    }
}

/// DATA payload bytes of a packet; none for any other.
pub(crate) fn data_len(packet: &Packet) -> usize {
    match packet {
        Packet::Data { data, .. } => data.len(),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use tether_proto::ConnectId;

    use super::*;

    fn data(n: usize) -> Packet {
        Packet::Data {
            connect_id: ConnectId(1),
            data: Bytes::from(vec![7; n]),
        }
    }

    #[test]
    fn acknowledged_packets_leave_the_log_and_the_rest_is_replayed_in_order() {
        let mut r = Replay::default();
        for n in 1..=5 {
            r.record(&data(n));
        }
        assert_eq!(r.log_bytes(), 15);
        assert!(r.on_ack(2));
        assert_eq!((r.log_len(), r.log_bytes()), (3, 12));
        assert!(!r.on_ack(1), "an acknowledgement never goes back");
        assert!(!r.on_ack(6), "nor beyond what was written");
        let replayed = r.resume(3).unwrap();
        assert_eq!(
            replayed,
            Replayed {
                packets: 2,
                bytes: 9
            }
        );
        assert_eq!(r.next_unsent(), Some(data(4)));
        assert_eq!(r.next_unsent(), Some(data(5)));
        assert_eq!(r.next_unsent(), None);
        assert_eq!(
            r.resume(1),
            Err(ResumeError::OutOfRange {
                peer_received: 1,
                acked: 3,
                sent: 5
            })
        );
    }

    #[test]
    fn an_acknowledgement_is_due_after_a_burst_and_carries_the_count() {
        let mut r = Replay::default();
        assert_eq!(r.take_ack(), None);
        let due = (0..ACK_EVERY_PACKETS).map(|_| r.on_received(1)).last();
        assert_eq!(due, Some(true));
        assert!(r.has_work());
        assert_eq!(r.take_ack(), Some(Packet::ResumeAck { received: 64 }));
        assert!(!r.has_work());
        assert!(r.on_received(ACK_EVERY_BYTES));
    }
}
