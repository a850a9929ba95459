//! What a link's reader, writer and keepalive share: the PONG owed to the peer, the PINGs
//! asked for and answered, the connection's signs of life, and the link's end.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tether_conn::{Keepalive, KeepaliveEnd, LastPong, Pinger};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::error::LinkError;

#[derive(Debug)]
pub(crate) struct Control {
    pub(crate) life: Arc<LastPong>,
    /// Wakes the writer: a PONG or a PING waits to be sent.
    pub(crate) writer: Notify,
    /// The opaque of the peer's latest PING, and whether its PONG is owed: two atomics, as
    /// the writer looks at every flush (a PONG for a newer PING answers the older too).
    pong_opaque: AtomicU64,
    pong_owed: AtomicBool,
    /// The latest PING asked for; the writer sends it once.
    ping_asked: AtomicU64,
    /// The latest PING the peer answered.
    answered: AtomicU64,
    pong: Notify,
    /// Cancelled when the link is over: a half (or the unanswered link) was dropped, or the
    /// keepalive gave the peer up.
    pub(crate) ended: CancellationToken,
    /// Set when the keepalive gave the peer up.
    unresponsive: Mutex<Option<Duration>>,
}

impl Control {
    pub(crate) fn new(life: Arc<LastPong>) -> Arc<Self> {
        Arc::new(Self {
            life,
            writer: Notify::new(),
            pong_opaque: AtomicU64::new(0),
            pong_owed: AtomicBool::new(false),
            ping_asked: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            pong: Notify::new(),
            ended: CancellationToken::new(),
            unresponsive: Mutex::new(None),
        })
    }

    /// The peer PINGed: the writer answers.
    pub(crate) fn owe_pong(&self, opaque: u64) {
        self.pong_opaque.store(opaque, Ordering::Relaxed);
        self.pong_owed.store(true, Ordering::Release);
        self.writer.notify_one();
    }

    pub(crate) fn take_pong(&self) -> Option<u64> {
        self.pong_owed
            .swap(false, Ordering::Acquire)
            .then(|| self.pong_opaque.load(Ordering::Relaxed))
    }

    pub(crate) fn ping_asked(&self) -> u64 {
        self.ping_asked.load(Ordering::Acquire)
    }

    /// The peer answered the PING numbered `opaque`.
    pub(crate) fn answered(&self, opaque: u64) {
        self.answered.fetch_max(opaque, Ordering::AcqRel);
        self.pong.notify_waiters();
    }

    /// Why the link was given up, for a half that finds it over.
    pub(crate) fn end_error(&self) -> LinkError {
        match *self.unresponsive.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(timeout) => LinkError::Unresponsive(timeout),
            None => LinkError::PeerGone,
        }
    }
}

/// A link's handle for its owner: its signs of life, its keepalive, its end.
#[derive(Clone, Debug)]
pub struct LinkHandle(pub(crate) Arc<Control>);

impl LinkHandle {
    /// When the peer last answered a PING, and when a byte last came from it.
    pub fn liveness(&self) -> Arc<LastPong> {
        self.0.life.clone()
    }

    /// PINGs the peer as `keepalive` says until the link is over; a PING unanswered within
    /// its timeout gives the link up (both halves then fail with
    /// [`LinkError::Unresponsive`]). Spawn it on a task the owner waits for.
    pub async fn keep_alive(self, keepalive: Keepalive) {
        let control = self.0;
        let pinger = LinkPinger(control.clone());
        tokio::select! {
            end = tether_conn::keep_alive(pinger, keepalive, control.life.clone()) => {
                let timeout = match end {
                    KeepaliveEnd::Unanswered(timeout) => timeout,
                    KeepaliveEnd::Failed(never) => match never {},
                };
                *control.unresponsive.lock().unwrap_or_else(|e| e.into_inner()) = Some(timeout);
                control.ended.cancel();
            }
            () = control.ended.cancelled() => {}
        }
    }

    /// Resolves once the link is over.
    pub async fn ended(&self) {
        self.0.ended.cancelled().await;
    }
}

struct LinkPinger(Arc<Control>);

impl Pinger for LinkPinger {
    /// A PING cannot fail to be asked for; only its answer can fail to come.
    type Error = std::convert::Infallible;

    async fn ping(&mut self) -> Result<(), Self::Error> {
        let control = &self.0;
        let number = control.ping_asked.fetch_add(1, Ordering::AcqRel) + 1;
        control.writer.notify_one();
        loop {
            let pong = control.pong.notified();
            let mut pong = std::pin::pin!(pong);
            pong.as_mut().enable();
            if control.answered.load(Ordering::Acquire) >= number {
                return Ok(());
            }
            pong.await;
        }
    }
}
