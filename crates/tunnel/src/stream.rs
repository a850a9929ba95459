//! Driving one stream: its reader hands packets to the table, its writer drains the table's
//! outbox into HTTP/2, and deadlines fire on the reader's timer.

use std::future::poll_fn;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use tether_grpc::{GrpcError, PacketReceiver, PacketSender};
use tether_session::Role;

use crate::link::{Direction, Link, Waiter};

/// Largest batch the writer encodes before flushing.
const BATCH_BYTES: usize = 256 * 1024;

impl Link {
    /// Runs the stream until the peer ends it, it fails, the peer breaks the protocol, or
    /// `stop` resolves. Then every dial and connection on it ends with an error (the table's
    /// [`close_stream`](tether_session::Session::close_stream)). Returns why it ended.
    pub async fn drive(
        self: &Arc<Self>,
        mut receiver: PacketReceiver,
        sender: PacketSender,
        stop: impl Future<Output = String>,
    ) -> String {
        let mut writer = tokio::spawn(write(self.clone(), sender));
        let mut stop = pin!(stop);
        let sleep = tokio::time::sleep(Duration::ZERO);
        let mut sleep = pin!(sleep);
        let peer = match self.role() {
            Role::Server => "agent",
            Role::Agent => "server",
        };
        let (mut parked, mut next) = self.reader_state();
        let mut armed = None;
        let reason = loop {
            if next != armed {
                armed = next;
                if let Some(at) = next {
                    sleep.as_mut().reset(at.into());
                }
            }
            tokio::select! {
                () = &mut sleep, if armed.is_some() => {
                    self.update(|s, now| s.handle_timeout(now));
                    armed = None;
                    (parked, next) = self.reader_state();
                }
                () = self.reader.notified() => (parked, next) = self.reader_state(),
                packet = receiver.next(), if !parked => match packet {
                    Some(Ok(packet)) => {
                        self.hooks().on_packet(Direction::In, &packet);
                        let handled = self.update(|s, now| {
                            s.handle_packet(now, packet).map(|()| (s.is_parked(), s.next_timeout()))
                        });
                        match handled {
                            Ok(state) => (parked, next) = state,
                            Err(violation) => break format!("protocol violation: {violation}"),
                        }
                    }
                    Some(Err(e)) if e.is_bad_packet() => self.hooks().on_bad_packet(&e),
                    Some(Err(e)) => {
                        self.hooks().on_stream_error(Direction::In, &e);
                        break format!("{peer} stream failed: {e}");
                    }
                    None => break format!("{peer} closed the stream"),
                },
                result = &mut writer => break match result {
                    Ok(Err(e)) => {
                        self.hooks().on_stream_error(Direction::Out, &e);
                        format!("writing to {peer} failed: {e}")
                    }
                    _ => "stream writer ended".to_owned(),
                },
                reason = &mut stop => break reason,
            }
        };
        self.close(&reason);
        writer.abort();
        let _ = writer.await;
        reason
    }

    /// Ends every dial and connection of the stream with `reason`, and wakes their owners.
    pub fn close(self: &Arc<Self>, reason: &str) {
        self.update(|s, now| s.close_stream(now, reason));
        self.forget(Waiter::Writer);
        self.wake_all();
    }
}

/// The stream's one writer: coalesces whatever is queued into one HTTP/2 write.
async fn write(link: Arc<Link>, mut sender: PacketSender) -> Result<(), GrpcError> {
    let mut batch = Vec::new();
    let mut releases = Vec::new();
    while poll_fn(|cx| link.poll_transmit(cx, &mut batch, BATCH_BYTES)).await {
        for item in batch.drain(..) {
            sender.buffer(&item.packet);
            link.hooks().on_packet(Direction::Out, &item.packet);
            releases.extend(item.release);
        }
        sender.flush().await?;
        if !releases.is_empty() {
            link.update(|s, _| {
                for (id, cost) in releases.drain(..) {
                    s.transmitted(id, cost);
                }
            });
        }
    }
    Ok(())
}
