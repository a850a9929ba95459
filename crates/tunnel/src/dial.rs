//! A dial through the peer, from the dialer's request to a [`Tunnel`] or an error (server:
//! forward dials; agent: reverse dials), and the answerer's handle on a dial it was asked for.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use tether_proto::{DialId, Forward};
use tether_session::{Abandoned, DialError};

use crate::conn::Tunnel;
use crate::link::{Link, Waiter};

/// A dial awaiting the peer's answer. Dropping it before the answer abandons the dial:
/// DIAL_CLS if still pending, a close if the agent had already connected.
#[derive(Debug)]
pub struct PendingDial {
    link: Arc<Link>,
    random: DialId,
    done: bool,
}

impl Link {
    /// Sends the dial request through this stream (DIAL_REQ from the server,
    /// REVERSE_DIAL_REQ from the agent). The deadline is the table's dial timeout.
    pub fn dial(
        self: &Arc<Self>,
        random: DialId,
        protocol: String,
        address: String,
    ) -> Result<PendingDial, DialError> {
        self.open(random, protocol, address, None)
    }

    /// Sends PEER_DIAL_REQ on a peer link: a dial through the agent `forward` names.
    pub fn dial_forwarded(
        self: &Arc<Self>,
        random: DialId,
        protocol: String,
        address: String,
        forward: Forward,
    ) -> Result<PendingDial, DialError> {
        self.open(random, protocol, address, Some(Box::new(forward)))
    }

    fn open(
        self: &Arc<Self>,
        random: DialId,
        protocol: String,
        address: String,
        forward: Option<Box<Forward>>,
    ) -> Result<PendingDial, DialError> {
        self.update(|s, now| s.open_dial(now, random, protocol, address, forward))?;
        Ok(PendingDial {
            link: self.clone(),
            random,
            done: false,
        })
    }
}

impl PendingDial {
    /// Waits for the peer's answer or the dial deadline. Cancel-safe: dropping the future
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

/// The answerer's handle on a dial the peer asked for (agent: forward; server: reverse).
/// Whatever happens to its dialing task, the dial ends:
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

    /// The destination answered: the dial response goes out and the connection is the caller's.
    /// `None` if the dial is no longer wanted (drop the socket).
    pub fn accept(mut self) -> Option<Tunnel> {
        self.answered = true;
        let random = self.random;
        let id = self.link.update(|s, now| s.dial_succeeded(now, random))?;
        Some(Tunnel::new(self.link.clone(), id))
    }

    /// The dial failed: the dial response carries `error`.
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
                let text = match shared.session.role() {
                    tether_session::Role::Agent => "dial abandoned by the agent",
                    tether_session::Role::Server => "dial abandoned by the server",
                };
                shared.session.dial_failed(random, text.into());
            }
        });
    }
}
