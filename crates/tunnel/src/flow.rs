//! Per-connection flow control.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tether_proto::metadata::TETHER_FLOW;
use tokio::sync::{Notify, Semaphore, mpsc};

/// Accounting cost of one queued chunk at least: tiny chunks still cost a queue slot.
const MIN_CHUNK_COST: usize = 64;

/// Takes the bytes just read into `buf`. A small chunk is copied out, so that while it waits
/// in queues it does not keep the whole (typically 64 KiB) read allocation alive; a large one
/// is split off without a copy.
pub fn take_read(buf: &mut BytesMut) -> Bytes {
    const COPY_BELOW: usize = 16 * 1024;
    if buf.len() < COPY_BELOW {
        let chunk = Bytes::copy_from_slice(buf);
        buf.clear();
        chunk
    } else {
        buf.split().freeze()
    }
}

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

    /// A new connection's pair of inbound queue and send window.
    pub fn new_connection(self) -> (Inbound, InboundQueue, Arc<SendWindow>) {
        self.new_observed_connection(None)
    }

    /// As [`new_connection`](Self::new_connection), reporting every change of the bytes
    /// queued on the connection to `observer` (e.g. a per-agent gauge). What is still queued
    /// when the connection's queue is dropped is reported as taken.
    pub fn new_observed_connection(
        self,
        observer: Option<QueueObserver>,
    ) -> (Inbound, InboundQueue, Arc<SendWindow>) {
        let (limit, window, stall) = match self {
            // The peer may send `our_window` before hearing back; allow the chunk overhead.
            Self::Credit {
                peer_window,
                our_window,
            } => (our_window as usize * 2, peer_window, None),
            Self::Legacy {
                buffer,
                local_window,
                stall,
            } => (buffer, local_window, Some(stall)),
        };
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(Queued {
            observer,
            ..Queued::default()
        });
        let window = Arc::new(SendWindow::new(window));
        (
            Inbound {
                tx,
                queued: queued.clone(),
                limit,
                stall,
                window: window.clone(),
            },
            InboundQueue {
                rx,
                queued,
                grant_threshold: match self {
                    Self::Credit { our_window, .. } => Some(our_window / 4),
                    Self::Legacy { .. } => None,
                },
                ungranted: 0,
            },
            window,
        )
    }
}

/// What the stream reader delivers to a connection's owner.
#[derive(Debug, PartialEq, Eq)]
pub enum ConnEvent {
    Data(Bytes),
    /// The far end closed; `Some` carries the error for an abnormal close.
    Closed(Option<String>),
}

/// A connection's inbound queue is full; the data is handed back.
#[derive(Debug)]
pub struct Full(pub Bytes);

/// A connection's inbound queue overflowed: the peer sent past its credit, or (legacy peer)
/// the connection's reader made no progress for the stall period while its queue was full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    pub limit: usize,
}

impl std::fmt::Display for Overflow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "connection buffer of {} bytes exceeded", self.limit)
    }
}

impl std::error::Error for Overflow {}

/// Receives every change, in bytes, of what a connection has queued.
pub type QueueObserver = Arc<dyn Fn(i64) + Send + Sync>;

/// Bytes queued on one connection, and a signal each time the owner takes some.
#[derive(Default)]
struct Queued {
    bytes: AtomicUsize,
    taken: Notify,
    observer: Option<QueueObserver>,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued")
            .field("bytes", &self.bytes)
            .finish_non_exhaustive()
    }
}

impl Queued {
    fn observe(&self, delta: usize, added: bool) {
        if let Some(observer) = &self.observer {
            let delta = i64::try_from(delta).unwrap_or(i64::MAX);
            observer(if added { delta } else { -delta });
        }
    }
}

/// The stream reader's handle on one connection: pushing never waits.
#[derive(Clone, Debug)]
pub struct Inbound {
    tx: mpsc::UnboundedSender<ConnEvent>,
    queued: Arc<Queued>,
    limit: usize,
    /// `Some` for peers without credit: how long a full queue may go without progress.
    stall: Option<Duration>,
    window: Arc<SendWindow>,
}

impl Inbound {
    /// Queues received data, or hands it back when the queue is full. The queue is bounded
    /// by bytes, not slots: tiny chunks are charged a minimum, so a flood of 1-byte packets is
    /// bounded too.
    pub fn push(&self, data: Bytes) -> Result<(), Full> {
        let cost = chunk_cost(data.len());
        let before = self.queued.bytes.fetch_add(cost, Ordering::AcqRel);
        // An empty queue always takes one chunk, so a single large packet cannot wedge it.
        if before > 0 && before + cost > self.limit {
            self.queued.bytes.fetch_sub(cost, Ordering::AcqRel);
            return Err(Full(data));
        }
        self.queued.observe(cost, true);
        // A closed receiver means the owner already went away; the data has nowhere to go
        // (and the queue's drop already settled the accounting).
        if let Err(mpsc::error::SendError(_)) = self.tx.send(ConnEvent::Data(data)) {
            self.queued.bytes.fetch_sub(cost, Ordering::AcqRel);
            self.queued.observe(cost, false);
        }
        Ok(())
    }

    /// After [`Full`]: waits until `len` more bytes fit. A tether peer that overran its
    /// credit broke the protocol and gets [`Overflow`] at once. An upstream peer cannot be
    /// slowed down per connection, so the stream reader waits here (the whole stream pauses,
    /// as upstream's does) while the connection's owner makes progress; after `stall` without
    /// progress the connection is given up with [`Overflow`], and the stream moves on.
    pub async fn wait_for_room(&self, len: usize) -> Result<(), Overflow> {
        let overflow = Overflow { limit: self.limit };
        let Some(stall) = self.stall else {
            return Err(overflow);
        };
        let cost = chunk_cost(len);
        loop {
            let taken = self.queued.taken.notified();
            let queued = self.queued.bytes.load(Ordering::Acquire);
            if queued == 0 || queued + cost <= self.limit {
                return Ok(());
            }
            if self.tx.is_closed() {
                return Err(overflow);
            }
            if tokio::time::timeout(stall, taken).await.is_err() {
                return Err(overflow);
            }
        }
    }

    /// Tells the owner the far end closed, and wakes anyone waiting for send credit.
    pub fn close(&self, error: Option<String>) {
        let _ = self.tx.send(ConnEvent::Closed(error));
        self.window.close();
    }

    /// Adds credit the peer granted.
    pub fn grant(&self, bytes: u32) {
        self.window.release(bytes);
    }

    /// Bytes queued and not yet taken by the owner.
    pub fn queued(&self) -> usize {
        self.queued.bytes.load(Ordering::Acquire)
    }
}

/// The connection owner's side of the inbound queue.
#[derive(Debug)]
pub struct InboundQueue {
    rx: mpsc::UnboundedReceiver<ConnEvent>,
    queued: Arc<Queued>,
    /// `Some(n)`: grant credit back in batches of at least n bytes (tether peer).
    grant_threshold: Option<u32>,
    ungranted: u32,
}

impl InboundQueue {
    /// Next event; `None` if the stream reader dropped the connection without a close event
    /// (the caller treats that as an abnormal close). Cancel-safe.
    pub async fn recv(&mut self) -> Option<ConnEvent> {
        let event = self.rx.recv().await?;
        self.taken(&event);
        Some(event)
    }

    /// Takes an event if one is ready, without waiting.
    pub fn try_recv(&mut self) -> Option<ConnEvent> {
        let event = self.rx.try_recv().ok()?;
        self.taken(&event);
        Some(event)
    }

    fn taken(&mut self, event: &ConnEvent) {
        if let ConnEvent::Data(data) = event {
            let cost = chunk_cost(data.len());
            self.queued.bytes.fetch_sub(cost, Ordering::AcqRel);
            self.queued.observe(cost, false);
            self.queued.taken.notify_waiters();
            if self.grant_threshold.is_some() {
                self.ungranted = self
                    .ungranted
                    .saturating_add(u32::try_from(cost).unwrap_or(u32::MAX));
            }
        }
    }

    /// Call after writing what was received to its destination: the credit to grant the
    /// peer now, once at least a batch (a quarter window) was taken. Tether peers only.
    #[must_use]
    pub fn grant_due(&mut self) -> Option<u32> {
        let threshold = self.grant_threshold?;
        (self.ungranted >= threshold).then(|| std::mem::take(&mut self.ungranted))
    }
}

impl Drop for InboundQueue {
    /// Whatever is still queued is released with the queue.
    fn drop(&mut self) {
        self.rx.close();
        while let Ok(event) = self.rx.try_recv() {
            self.taken(&event);
        }
    }
}

/// Bytes a connection may still send. Waiting here stalls this connection only.
#[derive(Debug)]
pub struct SendWindow {
    permits: Semaphore,
}

impl SendWindow {
    fn new(initial: u32) -> Self {
        Self {
            permits: Semaphore::new(initial as usize),
        }
    }

    /// Waits until a chunk of `len` bytes may be sent and takes its [`chunk_cost`], which it
    /// returns. `Err` once the connection closed. Callers send chunks no larger than
    /// [`MIN_WINDOW`] / 2, so a grant always suffices. Cancel-safe: nothing is taken unless
    /// it returns `Ok`.
    pub async fn acquire(&self, len: usize) -> Result<u32, WindowClosed> {
        let cost = u32::try_from(chunk_cost(len)).map_err(|_| WindowClosed)?;
        self.permits
            .acquire_many(cost)
            .await
            .map(|permit| permit.forget())
            .map_err(|_| WindowClosed)?;
        Ok(cost)
    }

    /// Returns `n` bytes of window (a peer's credit, or bytes the writer flushed).
    pub fn release(&self, n: u32) {
        // Cap far below Semaphore::MAX_PERMITS so a misbehaving peer cannot make it panic.
        let room = (u32::MAX as usize).saturating_sub(self.permits.available_permits());
        self.permits.add_permits((n as usize).min(room));
    }

    /// Wakes waiters with an error; the connection is gone.
    pub fn close(&self) {
        self.permits.close();
    }

    pub fn is_closed(&self) -> bool {
        self.permits.is_closed()
    }
}

/// The connection closed while waiting for send window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowClosed;

impl std::fmt::Display for WindowClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection closed")
    }
}

impl std::error::Error for WindowClosed {}

#[cfg(test)]
mod tests {
    use super::*;

    fn credit() -> Flow {
        FlowConfig::default().negotiate(Some("262144"))
    }

    fn legacy(buffer: usize) -> Flow {
        Flow::Legacy {
            buffer,
            local_window: 1 << 20,
            stall: Duration::from_millis(200),
        }
    }

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
    }

    #[tokio::test]
    async fn inbound_is_bounded_by_bytes_and_never_waits() {
        let (inbound, mut queue, _) = legacy(1000).new_connection();
        inbound.push(Bytes::from(vec![0; 600])).unwrap();
        assert!(inbound.push(Bytes::from(vec![0; 600])).is_err());
        // Tiny chunks are charged a minimum, so a flood of 1-byte packets is bounded too.
        for _ in 0..6 {
            inbound.push(Bytes::from_static(b"x")).unwrap();
        }
        assert!(inbound.push(Bytes::from_static(b"x")).is_err());
        assert_eq!(
            queue.recv().await,
            Some(ConnEvent::Data(Bytes::from(vec![0; 600])))
        );
        inbound.push(Bytes::from(vec![0; 500])).unwrap();
        assert_eq!(queue.grant_due(), None, "legacy peers get no credit");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_legacy_queue_waits_for_progress_then_gives_up() {
        let (inbound, mut queue, _) = legacy(1000).new_connection();
        inbound.push(Bytes::from(vec![0; 900])).unwrap();
        let Err(Full(data)) = inbound.push(Bytes::from(vec![1; 900])) else {
            panic!("queue should be full");
        };
        // The owner takes the first chunk a little later: room appears, no overflow.
        let taker = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(150)).await;
            queue.recv().await;
            queue
        });
        inbound.wait_for_room(data.len()).await.unwrap();
        inbound.push(data).unwrap();
        let _queue = taker.await.unwrap();
        // Nobody reads any more: after the stall period the connection is given up.
        let Err(Full(data)) = inbound.push(Bytes::from(vec![2; 900])) else {
            panic!("queue should be full");
        };
        assert!(inbound.wait_for_room(data.len()).await.is_err());
    }

    #[tokio::test]
    async fn credit_peers_that_overrun_are_cut_off_at_once() {
        let (inbound, _queue, _) = credit().new_connection();
        let limit = FlowConfig::default().window as usize * 2;
        inbound.push(Bytes::from(vec![0; limit])).unwrap();
        let Err(Full(data)) = inbound.push(Bytes::from(vec![0; 10])) else {
            panic!("queue should be full");
        };
        assert!(inbound.wait_for_room(data.len()).await.is_err());
    }

    #[tokio::test]
    async fn the_observer_sees_queued_bytes_come_and_go() {
        let total = Arc::new(std::sync::atomic::AtomicI64::new(0));
        let seen = total.clone();
        let observer: QueueObserver = Arc::new(move |delta| {
            seen.fetch_add(delta, Ordering::Relaxed);
        });
        let (inbound, mut queue, _) = legacy(1 << 20).new_observed_connection(Some(observer));
        inbound.push(Bytes::from(vec![0; 1000])).unwrap();
        inbound.push(Bytes::from(vec![0; 3000])).unwrap();
        assert_eq!(total.load(Ordering::Relaxed), 4000);
        queue.recv().await;
        assert_eq!(total.load(Ordering::Relaxed), 3000);
        drop(queue);
        assert_eq!(
            total.load(Ordering::Relaxed),
            0,
            "dropping the queue releases the rest"
        );
        inbound.push(Bytes::from(vec![0; 500])).unwrap();
        assert_eq!(
            total.load(Ordering::Relaxed),
            0,
            "data for a dropped queue is not counted"
        );
    }

    #[tokio::test]
    async fn credit_is_granted_in_quarter_window_batches() {
        let (inbound, mut queue, _) = credit().new_connection();
        let quarter = FlowConfig::default().window as usize / 4;
        inbound.push(Bytes::from(vec![0; quarter - 100])).unwrap();
        queue.recv().await;
        assert_eq!(queue.grant_due(), None);
        inbound.push(Bytes::from(vec![0; 100])).unwrap();
        queue.recv().await;
        assert_eq!(queue.grant_due(), Some(quarter as u32));
        assert_eq!(queue.grant_due(), None);
    }

    #[tokio::test]
    async fn a_sender_within_its_window_never_overruns_the_receiver_even_with_tiny_chunks() {
        // Both ends negotiated; the sender's window is the receiver's `our_window`.
        let flow = credit();
        let (inbound, _queue, _) = flow.new_connection();
        let (_, _, window) = FlowConfig::default()
            .negotiate(Some("1048576"))
            .new_connection();
        // One-byte chunks until the window is spent: each costs the same on both sides.
        let mut sent = 0;
        while tokio::time::timeout(Duration::from_millis(10), window.acquire(1))
            .await
            .is_ok()
        {
            inbound
                .push(Bytes::from_static(b"x"))
                .expect("within credit, never full");
            sent += 1;
        }
        assert_eq!(sent, 1_048_576 / MIN_CHUNK_COST);
    }

    #[tokio::test]
    async fn send_window_blocks_one_connection_until_credit_arrives() {
        let (inbound, _queue, window) = credit().new_connection();
        assert_eq!(window.acquire(262_144).await, Ok(262_144));
        let waiting = tokio::spawn({
            let window = window.clone();
            async move { window.acquire(10).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        inbound.grant(10);
        inbound.grant(54);
        assert_eq!(
            waiting.await.unwrap(),
            Ok(64),
            "a tiny chunk costs the minimum"
        );
        // Closing wakes waiters with an error.
        let waiting = tokio::spawn({
            let window = window.clone();
            async move { window.acquire(10).await }
        });
        inbound.close(None);
        assert_eq!(waiting.await.unwrap(), Err(WindowClosed));
        // An absurd grant cannot overflow the semaphore.
        window.release(u32::MAX);
    }
}
