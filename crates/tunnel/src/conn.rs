//! A local owner's handle on one connection of a stream, in two halves that can be driven
//! concurrently: [`TunnelUp`] toward the peer, [`TunnelDown`] from it.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::Poll;

use bytes::Bytes;
use tether_proto::ConnectId;
use tether_session::{CloseError, Recv, SendError};
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::link::{Link, Waiter};
use crate::socket::MAX_CHUNK;

/// What the peer sent on a connection.
#[derive(Debug, PartialEq, Eq)]
pub enum ConnEvent {
    Data(Bytes),
    /// The connection ended; `None` for a normal close. Nothing follows.
    Closed(Option<CloseError>),
}

/// The connection is closing or gone; nothing more can be sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("connection closed")]
pub struct Closed;

/// One established connection. Dropping it releases the connection: the dialer asks the
/// answerer to close, the answerer tells the dialer it closed with an error. An answerer's
/// relay that ends on purpose calls [`finish`](Self::finish) instead.
#[derive(Debug)]
pub struct Tunnel {
    pub up: TunnelUp,
    pub down: TunnelDown,
    finished: bool,
}

/// Owner → peer half.
#[derive(Debug)]
pub struct TunnelUp {
    link: Arc<Link>,
    id: ConnectId,
}

/// Peer → owner half.
#[derive(Debug)]
pub struct TunnelDown {
    link: Arc<Link>,
    id: ConnectId,
}

impl Tunnel {
    /// The handle of a connection the table already registered for this owner.
    pub(crate) fn new(link: Arc<Link>, id: ConnectId) -> Self {
        Self {
            up: TunnelUp {
                link: link.clone(),
                id,
            },
            down: TunnelDown { link, id },
            finished: false,
        }
    }

    pub fn connect_id(&self) -> ConnectId {
        self.up.id
    }

    /// Answerer: the relay ended; reports `error` (`None`: a normal close) in CLOSE_RSP.
    pub fn finish(mut self, error: Option<CloseError>) {
        self.finished = true;
        let id = self.up.id;
        self.up.link.update(|s, now| s.finish(now, id, error));
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        let (id, finished) = (self.up.id, self.finished);
        // One lock for the whole goodbye: wakers forgotten and the connection released.
        self.up.link.update_shared(|shared, now| {
            shared.forget(Waiter::Read(id));
            shared.forget(Waiter::Write(id));
            if !finished {
                shared.session.release(now, id);
            }
        });
    }
}

impl TunnelUp {
    /// Sends data to the peer in chunks of at most [`MAX_CHUNK`], waiting for this
    /// connection's window only.
    pub async fn send(&self, mut data: Bytes) -> Result<(), Closed> {
        while !data.is_empty() {
            let mut chunk = Some(data.split_to(data.len().min(MAX_CHUNK)));
            poll_fn(|cx| {
                self.link.update_shared(|shared, _| {
                    let Some(c) = chunk.take() else {
                        return Poll::Ready(Ok(()));
                    };
                    match shared.session.send_data(self.id, c) {
                        Ok(()) => Poll::Ready(Ok(())),
                        Err(SendError::Closed) => Poll::Ready(Err(Closed)),
                        Err(SendError::Blocked(c)) => {
                            chunk = Some(c);
                            shared.wait(Waiter::Write(self.id), cx);
                            Poll::Pending
                        }
                    }
                })
            })
            .await?;
        }
        Ok(())
    }

    /// Dialer: asks the answerer to close; its CLOSE_RSP (or the close deadline) arrives as
    /// [`ConnEvent::Closed`]. Idempotent.
    pub fn close_request(&self) {
        let id = self.id;
        self.link.update(|s, now| s.close(now, id));
    }
}

impl TunnelDown {
    /// The next event from the peer. Cancel-safe.
    pub async fn recv(&mut self) -> ConnEvent {
        poll_fn(|cx| {
            self.link
                .update_shared(|shared, now| match shared.session.recv(now, self.id) {
                    Recv::Data(data) => Poll::Ready(ConnEvent::Data(data)),
                    Recv::Closed(error) => Poll::Ready(ConnEvent::Closed(error)),
                    Recv::Empty => {
                        shared.wait(Waiter::Read(self.id), cx);
                        Poll::Pending
                    }
                })
        })
        .await
    }

    /// The next event, flushing `wr` first when none is waiting. A writer that buffers
    /// (TLS keeps the records its socket did not take) then holds nothing back while the
    /// connection waits for more. Cancel-safe.
    pub async fn recv_flushed<W: AsyncWrite + Unpin>(
        &mut self,
        wr: &mut W,
    ) -> std::io::Result<ConnEvent> {
        if let Some(event) = self.try_recv() {
            return Ok(event);
        }
        wr.flush().await?;
        Ok(self.recv().await)
    }

    /// An event if one is waiting.
    pub fn try_recv(&mut self) -> Option<ConnEvent> {
        let id = self.id;
        self.link.update(|s, now| match s.recv(now, id) {
            Recv::Data(data) => Some(ConnEvent::Data(data)),
            Recv::Closed(error) => Some(ConnEvent::Closed(error)),
            Recv::Empty => None,
        })
    }

    /// Call after writing what was received to its destination: returns credit to a
    /// tether peer once a batch was consumed.
    pub fn consumed(&mut self) {
        let id = self.id;
        self.link.update(|s, _| s.consumed(id));
    }
}
