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
            moved = from_dialer => match moved {
                Moved::FromClosed(closed) => Spliced::Dialer(closed),
                // The dialed connection is closing: its answerer ended it.
                Moved::ToClosed => Spliced::Answerer(None),
            },
            moved = from_answerer => match moved {
                Moved::FromClosed(closed) => Spliced::Answerer(closed),
                Moved::ToClosed => Spliced::Dialer(None),
            },
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

/// How one direction of a splice ended.
enum Moved {
    /// The connection it reads closed (`None`: normally).
    FromClosed(Option<CloseError>),
    /// The connection it writes is closing and takes no more: the splice ends, whatever
    /// the other direction is waiting for (it may be waiting on a window that never opens).
    ToClosed,
}

/// Moves `from`'s data to `to` until either closes.
async fn forward(from: &mut TunnelDown, to: &TunnelUp) -> Moved {
    loop {
        match from.recv().await {
            ConnEvent::Data(data) => {
                if to.send(data).await.is_err() {
                    return Moved::ToClosed;
                }
                from.consumed();
            }
            ConnEvent::Closed(closed) => return Moved::FromClosed(closed),
        }
    }
}
