//! The established phase of a `Proxy` call: DATA both ways until the tunnel ends.
//!
//! The two directions run concurrently so that a caller who writes without reading (or the
//! reverse) never stalls the other direction. Each applies back-pressure on its own: the
//! upstream half waits for HTTP/2 capacity before taking more chunks from the stream, the
//! downstream half stops reading the call while the stream's inbound channel is full.

use std::pin::pin;
use std::time::Duration;

use tether_grpc::{PacketReceiver, PacketSender};
use tether_proto::{ConnectId, Packet};
use tokio::sync::mpsc;

use crate::call_end;
use crate::tunnel::{Failure, TaskSide};

/// How long to wait for CLOSE_RSP after sending CLOSE_REQ (the Go client's CloseTimeout).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest batch of DATA encoded before writing it to HTTP/2.
const BATCH_BYTES: usize = 256 * 1024;

/// Relays until CLOSE_RSP, a broken call, or a close timeout; then publishes the outcome to
/// the stream and ends the call: cleanly after a normal close, by reset otherwise.
pub(crate) async fn run(
    mut tx: PacketSender,
    mut rx: PacketReceiver,
    connect_id: ConnectId,
    task_side: TaskSide,
) {
    let TaskSide {
        inbound,
        mut outbound,
        closing,
        end,
    } = task_side;
    let outcome = {
        let mut up = pin!(upstream(&mut tx, &mut outbound, connect_id));
        let mut down = pin!(downstream(&mut rx, &inbound, connect_id));
        let relay = async {
            tokio::select! {
                // CLOSE_RSP wins over a send error it caused (the server ends the call after it).
                biased;
                outcome = &mut down => outcome,
                // `Ok` (CLOSE_REQ is out) disables this branch: the select keeps waiting for
                // CLOSE_RSP on `down`, bounded by the deadline below.
                Err(e) = &mut up => {
                    // The call broke; the downstream half reads why, or CLOSE_RSP.
                    let explained = tokio::time::timeout(CLOSE_TIMEOUT, &mut down).await;
                    explained.unwrap_or_else(|_| Err(Failure::stream(&e)))
                }
            }
        };
        // Once the stream is shut down or dropped, the close must complete in time even if
        // the proxy stops reading (then not even CLOSE_REQ gets out) or never answers.
        let deadline = async {
            let _ = closing.await;
            tokio::time::sleep(CLOSE_TIMEOUT).await;
        };
        tokio::select! {
            outcome = relay => outcome,
            () = deadline => Err(Failure::close_timeout()),
        }
    };
    let normal = outcome.is_ok();
    if let Err(failure) = &outcome {
        tracing::debug!(connect.id = %connect_id, %failure, "tunnel ended abnormally");
    }
    // Published before the channels drop, so the stream finds it when they report closed.
    end.set(outcome);
    drop((inbound, outbound));
    if normal {
        call_end::end(tx, rx, None).await;
    } else {
        tx.abort();
    }
}

/// Sends the stream's writes as DATA; CLOSE_REQ once the stream is shut down or dropped.
async fn upstream(
    tx: &mut PacketSender,
    outbound: &mut mpsc::Receiver<bytes::Bytes>,
    connect_id: ConnectId,
) -> Result<(), tether_grpc::GrpcError> {
    while let Some(data) = outbound.recv().await {
        tx.buffer(&Packet::Data { connect_id, data });
        while tx.buffered() < BATCH_BYTES {
            let Ok(data) = outbound.try_recv() else { break };
            tx.buffer(&Packet::Data { connect_id, data });
        }
        tx.flush().await?;
    }
    tx.send(&Packet::CloseRequest { connect_id }).await
}

/// Hands DATA to the stream until CLOSE_RSP; returns how the tunnel ended.
async fn downstream(
    rx: &mut PacketReceiver,
    inbound: &mpsc::Sender<bytes::Bytes>,
    connect_id: ConnectId,
) -> Result<(), Failure> {
    loop {
        match rx.next().await {
            Some(Ok(Packet::Data {
                connect_id: id,
                data,
            })) if id == connect_id => {
                // A dropped stream no longer reads; keep draining until CLOSE_RSP.
                if !data.is_empty() {
                    let _ = inbound.send(data).await;
                }
            }
            Some(Ok(Packet::CloseResponse {
                connect_id: id,
                error,
            })) if id == connect_id => {
                return match error {
                    None => Ok(()),
                    Some(error) => Err(Failure::closed_by_proxy(&error)),
                };
            }
            // Other connections' packets, DRAIN, credit: nothing this tunnel acts on.
            Some(Ok(packet)) => {
                tracing::debug!(
                    packet = packet.type_name(),
                    "ignoring a packet on an established tunnel"
                );
            }
            Some(Err(e)) if e.is_bad_packet() => {
                tracing::debug!(error = %e, "ignoring a malformed packet");
            }
            Some(Err(e)) => return Err(Failure::stream(&e)),
            None => return Err(Failure::ended_without_close()),
        }
    }
}
