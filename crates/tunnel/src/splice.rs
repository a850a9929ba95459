//! Two tunneled connections joined end to end, with no socket between them: a server that
//! holds an agent carries a connection a peer server dialed through it (server peering).
//!
//! Each direction takes a chunk from one connection, sends it on the other within that
//! connection's own window, and only then gives the first its credit back. Backpressure
//! thus crosses the hop connection by connection: a stalled reader at either end stops its
//! own connection on both links and no other.

use tether_session::CloseError;

use crate::conn::{ConnEvent, Tunnel, TunnelDown, TunnelUp};

/// Which end of a splice ended it, and how (`None`: a normal close).
#[derive(Debug, PartialEq, Eq)]
pub enum Spliced {
    /// The dialer of the answered connection closed it, or its stream ended.
    Dialer(Option<CloseError>),
    /// The answerer of the dialed connection closed it, or its stream ended.
    Answerer(Option<CloseError>),
}

/// Carries `answered` (a connection this end answered) through `dialed` (one it dialed for
/// it) until either end closes, then closes the other: the dialed one with CLOSE_REQ, the
/// answered one with CLOSE_RSP carrying the dialed one's error.
pub async fn splice(mut answered: Tunnel, mut dialed: Tunnel) -> Spliced {
    let spliced = {
        let from_dialer = forward(&mut answered.down, &dialed.up);
        let from_answerer = forward(&mut dialed.down, &answered.up);
        tokio::select! {
            closed = from_dialer => Spliced::Dialer(closed),
            closed = from_answerer => Spliced::Answerer(closed),
        }
    };
    match &spliced {
        // Dropping `dialed` asks its answerer to close; `answered`'s dialer asked already.
        Spliced::Dialer(_) => answered.finish(None),
        Spliced::Answerer(error) => answered.finish(error.clone()),
    }
    drop(dialed);
    spliced
}

/// Moves `from`'s data to `to` until `from` closes; returns how it closed.
async fn forward(from: &mut TunnelDown, to: &TunnelUp) -> Option<CloseError> {
    loop {
        match from.recv().await {
            ConnEvent::Data(data) => {
                if to.send(data).await.is_err() {
                    // `to` is closing: the other direction hears its end and ends the splice.
                    std::future::pending::<()>().await;
                }
                from.consumed();
            }
            ConnEvent::Closed(closed) => return closed,
        }
    }
}
