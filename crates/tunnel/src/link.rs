//! One lock around one stream's [`Session`], and the wakers of everyone waiting on it.
//!
//! quinn's `ConnectionRef` is the model: every task that touches the stream (its reader,
//! its writer, each connection's relay, each dialer) takes the same lock for a few map
//! operations and never across an `.await`. The table's [`Event`]s are turned into
//! wake-ups under the lock; the wakers themselves, and the hooks, run after it is released.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tether_proto::{ConnectId, DialId, Packet};
use tether_session::{Event, Flow, Outgoing, Role, Session, SessionConfig};
use tokio::sync::Notify;

use crate::transport::TransportError;

/// Which way a packet went, for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Received from the peer.
    In,
    /// Sent to the peer.
    Out,
}

/// What the server or the agent does with a stream's events: metrics, spawning dials.
/// Called without the lock held, so a hook may call back into the [`Link`].
pub trait Hooks: Send + Sync + 'static {
    /// Every event that is not only a wake-up.
    fn on_event(&self, link: &Arc<Link>, event: Event);
    /// The inbound bytes queued on the stream changed.
    fn on_queued(&self, _bytes: usize) {}
    fn on_packet(&self, _direction: Direction, _packet: &Packet) {}
    /// A packet from the peer could not be decoded; the stream goes on.
    fn on_bad_packet(&self, _error: &TransportError) {}
    /// The stream failed reading (`In`) or writing (`Out`).
    fn on_stream_error(&self, _direction: Direction, _error: &TransportError) {}
}

#[derive(Debug, Default)]
struct Wakers {
    read: HashMap<ConnectId, Waker>,
    write: HashMap<ConnectId, Waker>,
    dial: HashMap<DialId, Waker>,
    writer: Option<Waker>,
}

#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) session: Session,
    wakers: Wakers,
    queued_seen: usize,
}

/// A stream's table and its waiters. Shared by every task of the stream.
pub struct Link {
    shared: Mutex<Shared>,
    hooks: Box<dyn Hooks>,
    flow: Flow,
    role: Role,
    /// Wakes the stream's reader: a parked packet was settled, or a deadline moved.
    pub(crate) reader: Notify,
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("role", &self.role)
            .field("flow", &self.flow)
            .finish_non_exhaustive()
    }
}

/// Where a waker goes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Waiter {
    Read(ConnectId),
    Write(ConnectId),
    Dial(DialId),
    Writer,
}

impl Link {
    pub fn new(config: SessionConfig, hooks: impl Hooks) -> Arc<Self> {
        Arc::new(Self {
            shared: Mutex::new(Shared {
                session: Session::new(config),
                wakers: Wakers::default(),
                queued_seen: 0,
            }),
            hooks: Box::new(hooks),
            flow: config.flow,
            role: config.role,
            reader: Notify::new(),
        })
    }

    pub fn flow(&self) -> Flow {
        self.flow
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub(crate) fn hooks(&self) -> &dyn Hooks {
        &*self.hooks
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        // Every critical section leaves the table consistent, so a panic elsewhere while the
        // lock was held does not make it unusable.
        self.shared.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the table under its lock, for introspection: no event, no wake-up, and nothing
    /// on the data path pays for it unless someone asks.
    pub fn inspect<R>(&self, f: impl FnOnce(&Session) -> R) -> R {
        f(&self.lock().session)
    }

    /// Runs `f` on the table at the current time, then wakes whoever its events concern.
    pub fn update<R>(self: &Arc<Self>, f: impl FnOnce(&mut Session, Instant) -> R) -> R {
        self.update_shared(|shared, now| f(&mut shared.session, now))
    }

    /// As [`update`](Self::update); `f` may also register a waker (see [`Shared::wait`]).
    pub(crate) fn update_shared<R>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut Shared, Instant) -> R,
    ) -> R {
        // tokio's clock, not the system's: a paused-time test moves the table's deadlines.
        let now = tether_observe::time::monotonic_now();
        let mut wake = Vec::new();
        let mut deliver = Vec::new();
        let (result, queued) = {
            let mut shared = self.lock();
            let result = f(&mut shared, now);
            shared.dispatch(&mut wake, &mut deliver, &self.reader);
            let queued = shared.session.queued_bytes();
            let changed = queued != shared.queued_seen;
            shared.queued_seen = queued;
            (result, changed.then_some(queued))
        };
        for waker in wake {
            waker.wake();
        }
        for event in deliver {
            self.hooks.on_event(self, event);
        }
        if let Some(bytes) = queued {
            self.hooks.on_queued(bytes);
        }
        result
    }

    /// Forgets the wakers of a connection whose handle is gone.
    pub(crate) fn forget(&self, waiter: Waiter) {
        self.lock().forget(waiter);
    }

    /// Moves queued packets into `batch`; pending (with the writer's waker kept) when none.
    /// Ready(false) once the stream is closed and nothing is left to write.
    pub(crate) fn poll_transmit(
        self: &Arc<Self>,
        cx: &mut Context<'_>,
        batch: &mut Vec<Outgoing>,
        max_bytes: usize,
    ) -> Poll<bool> {
        self.update_shared(|shared, _| {
            if shared.session.poll_transmit(batch, max_bytes) {
                Poll::Ready(true)
            } else if !shared.session.is_open() {
                Poll::Ready(false)
            } else {
                shared.wait(Waiter::Writer, cx);
                Poll::Pending
            }
        })
    }

    /// Whether the reader must wait, and the next deadline, in one look.
    pub(crate) fn reader_state(&self) -> (bool, Option<Instant>) {
        let shared = self.lock();
        (shared.session.is_parked(), shared.session.next_timeout())
    }

    /// Wakes everyone still waiting: the stream is gone.
    pub(crate) fn wake_all(&self) {
        let wakers = {
            let mut shared = self.lock();
            std::mem::take(&mut shared.wakers)
        };
        let Wakers {
            read,
            write,
            dial,
            writer,
        } = wakers;
        read.into_values()
            .chain(write.into_values())
            .chain(dial.into_values())
            .chain(writer)
            .for_each(Waker::wake);
        self.reader.notify_one();
    }
}

impl Shared {
    /// Drops the waker registered for `waiter`, if any.
    pub(crate) fn forget(&mut self, waiter: Waiter) {
        let w = &mut self.wakers;
        match waiter {
            Waiter::Read(id) => {
                w.read.remove(&id);
            }
            Waiter::Write(id) => {
                w.write.remove(&id);
            }
            Waiter::Dial(random) => {
                w.dial.remove(&random);
            }
            Waiter::Writer => w.writer = None,
        }
    }

    /// Registers `cx`'s waker for `waiter`, keeping the old one when it would wake the same
    /// task (a clone per poll would be wasted).
    pub(crate) fn wait(&mut self, waiter: Waiter, cx: &mut Context<'_>) {
        let w = &mut self.wakers;
        let slot = match waiter {
            Waiter::Read(id) => w.read.entry(id).or_insert_with(|| Waker::noop().clone()),
            Waiter::Write(id) => w.write.entry(id).or_insert_with(|| Waker::noop().clone()),
            Waiter::Dial(random) => w
                .dial
                .entry(random)
                .or_insert_with(|| Waker::noop().clone()),
            Waiter::Writer => w.writer.get_or_insert_with(|| Waker::noop().clone()),
        };
        if !slot.will_wake(cx.waker()) {
            slot.clone_from(cx.waker());
        }
    }

    fn dispatch(&mut self, wake: &mut Vec<Waker>, deliver: &mut Vec<Event>, reader: &Notify) {
        while let Some(event) = self.session.poll_event() {
            let w = &mut self.wakers;
            match event {
                Event::Readable(id) => wake.extend(w.read.remove(&id)),
                Event::Writable(id) => wake.extend(w.write.remove(&id)),
                Event::Transmit => wake.extend(w.writer.take()),
                Event::Unparked | Event::TimerChanged => reader.notify_one(),
                Event::DialSettled { random, .. } | Event::DialCancelled { random, .. } => {
                    wake.extend(w.dial.remove(&random));
                    deliver.push(event);
                }
                other => deliver.push(other),
            }
        }
    }
}
