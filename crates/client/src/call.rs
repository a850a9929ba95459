//! One `Proxy` call, driven by its own task: the dial, then the relay.
//!
//! The dial runs in the task rather than in the caller's future so that a caller who gives
//! up (a timeout, or dropping the future) still gets its dial cancelled with DIAL_CLS.

use tether_grpc::{PacketReceiver, PacketSender};
use tether_proto::{ConnectId, DialId, Packet};
use tokio::sync::oneshot;

use crate::call_end::end;
use crate::error::NO_AGENT;
use crate::{ClientError, DialError, TunnelStream, relay, tunnel};

/// What the caller waiting for the dial receives.
pub(crate) type DialResult = Result<TunnelStream, DialError>;

/// Dials `address` on a freshly opened call and, once connected, relays until the tunnel
/// ends. Ends with the call in every case.
pub(crate) async fn run(
    mut tx: PacketSender,
    mut rx: PacketReceiver,
    address: String,
    mut result: oneshot::Sender<DialResult>,
) {
    let random = DialId::random();
    match dial(&mut tx, &mut rx, address, random, &mut result).await {
        Dialed::Connected(connect_id) => {
            let (stream, task_side) = tunnel::pair(connect_id);
            // A caller that left meanwhile drops the stream, which closes the tunnel.
            let _ = result.send(Ok(stream));
            relay::run(tx, rx, connect_id, task_side).await;
        }
        Dialed::Failed(error) => {
            let _ = result.send(Err(error));
            end(tx, rx, None).await;
        }
        Dialed::Abandoned => {
            tracing::debug!(%random, "dial abandoned by the caller, sending DIAL_CLS");
            end(tx, rx, Some(Packet::CloseDial { random })).await;
        }
    }
}

/// How the dial phase ended.
enum Dialed {
    Connected(ConnectId),
    Failed(DialError),
    /// The caller stopped waiting.
    Abandoned,
}

/// Sends DIAL_REQ and waits for its answer, or for the caller to give up.
async fn dial(
    tx: &mut PacketSender,
    rx: &mut PacketReceiver,
    address: String,
    random: DialId,
    result: &mut oneshot::Sender<DialResult>,
) -> Dialed {
    let request = Packet::DialRequest {
        protocol: "tcp".to_owned(),
        address,
        random,
    };
    // Sending waits for HTTP/2 capacity, so the caller may give up meanwhile too.
    let sent = tokio::select! {
        () = result.closed() => return Dialed::Abandoned,
        sent = tx.send(&request) => sent,
    };
    if let Err(e) = sent {
        return Dialed::Failed(e.into());
    }
    loop {
        let next = tokio::select! {
            () = result.closed() => return Dialed::Abandoned,
            next = rx.next() => next,
        };
        match next {
            Some(Ok(Packet::DialResponse { random: r, result })) if r == random => {
                return match result {
                    Ok(connect_id) => Dialed::Connected(connect_id),
                    Err(message) if message == NO_AGENT => Dialed::Failed(DialError::NoAgent),
                    Err(message) => Dialed::Failed(DialError::Endpoint { message }),
                };
            }
            Some(Ok(Packet::CloseDial { random: r })) if r == random => {
                return Dialed::Failed(DialError::DialClosed);
            }
            // Nothing else concerns a pending dial (upstream's client ignores it too).
            Some(Ok(packet)) => {
                tracing::debug!(
                    packet = packet.type_name(),
                    "ignoring a packet while dialing"
                );
            }
            Some(Err(e)) if e.is_bad_packet() => {
                tracing::debug!(error = %e, "ignoring a malformed packet while dialing");
            }
            Some(Err(e)) => return Dialed::Failed(e.into()),
            None => {
                let closed =
                    ClientError::Closed("the stream ended before the dial response".into());
                return Dialed::Failed(closed.into());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dial_ids_are_non_negative_and_vary() {
        let ids: std::collections::HashSet<i64> = (0..1000).map(|_| DialId::random().0).collect();
        assert!(ids.iter().all(|id| *id >= 0));
        assert_eq!(ids.len(), 1000);
    }
}
