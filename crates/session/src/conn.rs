//! One established connection's state: its inbound queue and its send window, as numbers.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::Bytes;
use tether_proto::DialId;

use crate::flow::{Flow, chunk_cost};
use crate::outcome::CloseError;

/// Who holds the local end of a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// The dialer's end: the peer answered, the dial's owner has not taken it yet.
    Unclaimed,
    Attached,
    /// The local end is gone; the entry stays only while the peer's close is awaited.
    Released,
}

#[derive(Debug)]
pub(crate) struct Conn {
    /// The dial that opened it, and what it dialed: kept for introspection and logs.
    pub(crate) dial_id: DialId,
    pub(crate) address: String,
    pub(crate) owner: Owner,
    /// Dialer: CLOSE_REQ sent, CLOSE_RSP awaited until this deadline.
    pub(crate) closing: Option<Instant>,
    /// Answerer: the dialer asked to close (CLOSE_REQ); the owner answers when done.
    pub(crate) close_requested: bool,
    /// The outcome was reported; nothing may report another.
    pub(crate) ended: bool,
    /// The close to hand the owner once its queued data is taken. `Some(None)`: normal.
    pub(crate) notice: Option<Option<CloseError>>,
    /// The notice was handed over.
    pub(crate) notified: bool,
    pub(crate) inbound: VecDeque<Bytes>,
    /// Cost ([`chunk_cost`]) of what `inbound` holds.
    pub(crate) queued: usize,
    pub(crate) limit: usize,
    /// The owner found nothing to read and waits for [`Event::Readable`](crate::Event).
    pub(crate) read_waiting: bool,
    /// The owner found no window and waits for [`Event::Writable`](crate::Event).
    pub(crate) write_waiting: bool,
    /// Bytes this end may still send: the peer's credit, or (legacy peer) local window.
    pub(crate) window: u64,
    /// Consumed since the last credit grant (tether peers).
    pub(crate) ungranted: u64,
    pub(crate) bytes_from_peer: u64,
    pub(crate) bytes_to_peer: u64,
    pub(crate) opened_at: Instant,
}

impl Conn {
    pub(crate) fn new(
        flow: Flow,
        owner: Owner,
        now: Instant,
        dial_id: DialId,
        address: String,
    ) -> Self {
        Self {
            dial_id,
            address,
            owner,
            closing: None,
            close_requested: false,
            ended: false,
            notice: None,
            notified: false,
            inbound: VecDeque::new(),
            queued: 0,
            limit: flow.inbound_limit(),
            read_waiting: false,
            write_waiting: false,
            window: u64::from(flow.initial_send_window()),
            ungranted: 0,
            bytes_from_peer: 0,
            bytes_to_peer: 0,
            opened_at: now,
        }
    }

    /// Whether `len` more bytes fit. An empty queue always takes one chunk, so a single large
    /// packet cannot wedge a connection.
    pub(crate) fn fits(&self, len: usize) -> bool {
        self.queued == 0 || self.queued + chunk_cost(len) <= self.limit
    }

    pub(crate) fn push(&mut self, data: Bytes) {
        self.queued += chunk_cost(data.len());
        self.bytes_from_peer += data.len() as u64;
        self.inbound.push_back(data);
    }

    pub(crate) fn pop(&mut self) -> Option<Bytes> {
        let data = self.inbound.pop_front()?;
        let cost = chunk_cost(data.len());
        self.queued -= cost;
        self.ungranted += cost as u64;
        Some(data)
    }

    /// Sets the close notice unless one is already pending.
    pub(crate) fn notify(&mut self, error: Option<CloseError>) {
        if self.notice.is_none() && !self.notified {
            self.notice = Some(error);
        }
    }
}
