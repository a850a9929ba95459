//! The one writer of a multiplexed stream.
//!
//! Every connection hands its packets to [`Outbound`]; a single task drains the queue into
//! the stream, coalescing whatever is waiting into one HTTP/2 write. The queue is unbounded in
//! slots but bounded in bytes: DATA only enters after its connection took send window, and
//! control packets are a handful per connection.

use std::sync::Arc;

use tether_grpc::{GrpcError, PacketSender, Status};
use tether_proto::Packet;
use tokio::sync::mpsc;

use crate::flow::SendWindow;

/// Largest batch the writer encodes before flushing.
const BATCH_BYTES: usize = 256 * 1024;

#[derive(Debug)]
struct Item {
    packet: Packet,
    /// Window to give back once the packet is written (peers without credit).
    release: Option<(Arc<SendWindow>, u32)>,
}

/// Handle for queueing packets on a stream. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Outbound {
    tx: mpsc::UnboundedSender<Item>,
}

/// The stream's writer is gone; the stream is closing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamClosed;

impl Outbound {
    /// A queue and the receiver [`run_writer`] drains.
    pub fn new() -> (Self, OutboundQueue) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, OutboundQueue { rx })
    }

    /// Queues a packet. Never waits.
    pub fn send(&self, packet: Packet) -> Result<(), StreamClosed> {
        self.tx
            .send(Item {
                packet,
                release: None,
            })
            .map_err(|_| StreamClosed)
    }

    /// Queues a DATA packet whose `len` bytes of local window return to `window` once written.
    pub fn send_releasing(
        &self,
        packet: Packet,
        window: Arc<SendWindow>,
        len: u32,
    ) -> Result<(), StreamClosed> {
        self.tx
            .send(Item {
                packet,
                release: Some((window, len)),
            })
            .map_err(|_| StreamClosed)
    }

    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }
}

/// Receiving end of [`Outbound`], consumed by [`run_writer`].
#[derive(Debug)]
pub struct OutboundQueue {
    rx: mpsc::UnboundedReceiver<Item>,
}

/// Writes queued packets to `sender` until every [`Outbound`] handle is dropped (then the
/// call is finished with `status`) or the stream fails. `observe` sees each packet written.
pub async fn run_writer(
    mut queue: OutboundQueue,
    mut sender: PacketSender,
    status: Status,
    mut observe: impl FnMut(&Packet),
) -> Result<(), GrpcError> {
    let mut releases = Vec::new();
    while let Some(first) = queue.rx.recv().await {
        let mut next = Some(first);
        while let Some(item) = next.take() {
            sender.buffer(&item.packet);
            observe(&item.packet);
            releases.extend(item.release);
            if sender.buffered() < BATCH_BYTES {
                next = queue.rx.try_recv().ok();
            }
        }
        sender.flush().await?;
        for (window, len) in releases.drain(..) {
            window.release(len);
        }
    }
    sender.finish(&status)
}
