//! Server role: a dial through the peer, from DIAL_REQ to a [`Tunnel`] or an error.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use tether_proto::DialId;
use tether_session::{Abandoned, DialError};

use crate::conn::Tunnel;
use crate::link::{Link, Waiter};

/// A dial awaiting the agent's answer. Dropping it before the answer abandons the dial:
/// DIAL_CLS if still pending, a close if the agent had already connected.
#[derive(Debug)]
pub struct PendingDial {
    link: Arc<Link>,
    random: DialId,
    done: bool,
}

impl Link {
    /// Sends DIAL_REQ through this stream. The deadline is the table's dial timeout.
    pub fn dial(
        self: &Arc<Self>,
        random: DialId,
        protocol: String,
        address: String,
    ) -> Result<PendingDial, DialError> {
        self.update(|s, now| s.open_dial(now, random, protocol, address))?;
        Ok(PendingDial {
            link: self.clone(),
            random,
            done: false,
        })
    }
}

impl PendingDial {
    /// Waits for the agent's answer or the dial deadline. Cancel-safe: dropping the future
    /// leaves the dial pending until this handle is dropped or [`abandon`](Self::abandon)ed.
    pub async fn answer(&mut self) -> Result<Tunnel, DialError> {
        let random = self.random;
        let result = poll_fn(|cx| {
            self.link
                .update_shared(|shared, _| match shared.session.take_dial(random) {
                    Some(result) => Poll::Ready(result),
                    None => {
                        shared.wait(Waiter::Dial(random), cx);
                        Poll::Pending
                    }
                })
        })
        .await;
        self.done = true;
        result.map(|id| Tunnel::new(self.link.clone(), id))
    }

    /// Gives the dial up, saying how far it had got.
    pub fn abandon(mut self) -> Abandoned {
        self.done = true;
        self.abandon_now()
    }

    fn abandon_now(&self) -> Abandoned {
        let random = self.random;
        self.link.update_shared(|shared, now| {
            shared.forget(Waiter::Dial(random));
            shared.session.abandon_dial(now, random)
        })
    }
}

impl Drop for PendingDial {
    fn drop(&mut self) {
        if !self.done {
            self.abandon_now();
        }
    }
}

/// Agent role: a dial the server asked for. Whatever happens to the dialer, the dial ends:
/// dropped without an answer, it is reported as failed.
#[derive(Debug)]
pub struct IncomingDial {
    link: Arc<Link>,
    random: DialId,
    answered: bool,
}

impl Link {
    /// The handle of a dial announced by [`Event::DialRequested`](tether_session::Event).
    pub fn incoming_dial(self: &Arc<Self>, random: DialId) -> IncomingDial {
        IncomingDial {
            link: self.clone(),
            random,
            answered: false,
        }
    }
}

impl IncomingDial {
    pub fn random(&self) -> DialId {
        self.random
    }

    /// Resolves once the dial is no longer wanted: the server cancelled it, its deadline
    /// passed (the table already answered), or the stream ended.
    pub async fn abandoned(&self) {
        let random = self.random;
        poll_fn(|cx| {
            self.link.update_shared(|shared, _| {
                if shared.session.dial_wanted(random) {
                    shared.wait(Waiter::Dial(random), cx);
                    Poll::Pending
                } else {
                    Poll::Ready(())
                }
            })
        })
        .await;
    }

    /// The destination answered: DIAL_RSP goes out and the connection is the caller's.
    /// `None` if the dial is no longer wanted (drop the socket).
    pub fn accept(mut self) -> Option<Tunnel> {
        self.answered = true;
        let random = self.random;
        let id = self.link.update(|s, now| s.dial_succeeded(now, random))?;
        Some(Tunnel::new(self.link.clone(), id))
    }

    /// The dial failed: DIAL_RSP carries `error`.
    pub fn fail(mut self, error: String) {
        self.answered = true;
        let random = self.random;
        self.link.update(|s, _| s.dial_failed(random, error));
    }
}

impl Drop for IncomingDial {
    fn drop(&mut self) {
        let (random, answered) = (self.random, self.answered);
        self.link.update_shared(|shared, _| {
            shared.forget(Waiter::Dial(random));
            if !answered {
                shared
                    .session
                    .dial_failed(random, "dial abandoned by the agent".into());
            }
        });
    }
}
