//! Ending a `Proxy` call cleanly, whichever phase it ends in: a dial that failed or was
//! abandoned (`call`), or a tunnel that closed normally (`relay`). Its own module so that
//! the dial phase, which hands over to the relay, and the relay do not use each other.

use std::time::Duration;

use tether_grpc::{PacketReceiver, PacketSender, Status};
use tether_proto::Packet;

/// How long to wait for the server to end a call after we ended ours.
const LINGER: Duration = Duration::from_secs(10);

/// Sends `last`, ends our side of the call, then waits for the server to end its side; all
/// within [`LINGER`], so a stuck server cannot keep the task alive.
///
/// Dropping a call the server has not ended makes h2 reset the stream, and a reset discards
/// packets still queued for sending, such as a final DIAL_CLS. Upstream servers also expect
/// the client to end the call after their last packet.
pub(crate) async fn end(mut tx: PacketSender, mut rx: PacketReceiver, last: Option<Packet>) {
    let _ = tokio::time::timeout(LINGER, async {
        if let Some(packet) = last
            && tx.send(&packet).await.is_err()
        {
            return;
        }
        if tx.finish(&Status::ok()).is_err() {
            return;
        }
        loop {
            match rx.next().await {
                None => return,
                Some(Err(e)) if !e.is_bad_packet() => return,
                Some(_) => {}
            }
        }
    })
    .await;
}
