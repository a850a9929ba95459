//! A connection's signs of life, whatever its transport: when its keepalive PING was last
//! answered, when it last read a byte, and the loop that PINGs it.

use std::future::Future;
use std::time::Duration;

/// Liveness probing by PING: every `interval`, and the connection is given up when no PONG
/// arrives within `timeout`.
#[derive(Clone, Copy, Debug)]
pub struct Keepalive {
    pub interval: Duration,
    pub timeout: Duration,
}

/// How often a watched connection is PINGed (see [`LastPong::watch`]), whatever its
/// keepalive interval: a live peer is then heard at least this often.
pub const WATCHED_PING_INTERVAL: Duration = Duration::from_secs(1);

/// How often a watched connection's reads are polled while a PING waits for its PONG, so
/// that a read finding nothing records the silence within this (see [`LastPong::quiet`]).
pub const WATCHED_READ_POLL: Duration = Duration::from_millis(250);

/// A connection's signs of life: when its keepalive PING was last answered (read by
/// introspection, `/debug/agents`), when it last read a byte from the peer (server side), and
/// whether its owner watches it closely, which PINGs it every [`WATCHED_PING_INTERVAL`].
#[derive(Debug)]
pub struct LastPong {
    pong: std::sync::Mutex<Option<std::time::Instant>>,
    opened: std::time::Instant,
    /// When the connection last read a byte, in milliseconds after `opened`.
    heard_ms: std::sync::atomic::AtomicU64,
    /// When a read last found nothing to read, in milliseconds after `opened`.
    quiet_ms: std::sync::atomic::AtomicU64,
    watched: std::sync::atomic::AtomicBool,
    /// Wakes the keepalive loop when watching starts, for a PING at once.
    wake: tokio::sync::Notify,
}

impl Default for LastPong {
    fn default() -> Self {
        Self {
            pong: std::sync::Mutex::default(),
            opened: tokio::time::Instant::now().into_std(),
            heard_ms: std::sync::atomic::AtomicU64::new(0),
            quiet_ms: std::sync::atomic::AtomicU64::new(0),
            watched: std::sync::atomic::AtomicBool::new(false),
            wake: tokio::sync::Notify::new(),
        }
    }
}

impl LastPong {
    pub fn get(&self) -> Option<std::time::Instant> {
        *self.pong.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set(&self, at: std::time::Instant) {
        *self.pong.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// When the connection last read a byte from its peer (when it opened, before any);
    /// only server connections record it.
    pub fn heard(&self) -> std::time::Instant {
        let ms = self.heard_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.opened + Duration::from_millis(ms)
    }

    /// When a read last found nothing to read (when it opened, before any): the moment up
    /// to which the peer is known to have been silent since [`heard`](Self::heard).
    pub fn quiet(&self) -> std::time::Instant {
        let ms = self.quiet_ms.load(std::sync::atomic::Ordering::Relaxed);
        self.opened + Duration::from_millis(ms)
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    pub(crate) fn heard_now(&self) {
        self.heard_ms
            .store(self.elapsed_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn quiet_now(&self) {
        self.quiet_ms
            .store(self.elapsed_ms(), std::sync::atomic::Ordering::Relaxed);
    }

    /// Watches the connection closely (PINGs every [`WATCHED_PING_INTERVAL`], the first at
    /// once) or stops. Needs keepalive configured on the connection.
    pub fn watch(&self, on: bool) {
        let was = self.watched.swap(on, std::sync::atomic::Ordering::Relaxed);
        if on && !was {
            self.wake.notify_one();
        }
    }

    /// Whether the connection is watched closely (see [`watch`](Self::watch)).
    pub fn is_watched(&self) -> bool {
        self.watched.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn ping_interval(&self, keepalive: &Keepalive) -> Duration {
        if self.is_watched() {
            keepalive.interval.min(WATCHED_PING_INTERVAL)
        } else {
            keepalive.interval
        }
    }
}

/// The [`LastPong`] of whichever connection a stream runs on now: a resumable agent stream
/// moves to a new connection when it resumes.
#[derive(Debug)]
pub struct CurrentPong(std::sync::Mutex<std::sync::Arc<LastPong>>);

impl CurrentPong {
    pub fn new(last_pong: std::sync::Arc<LastPong>) -> Self {
        Self(std::sync::Mutex::new(last_pong))
    }

    /// When the current connection's keepalive PING was last answered.
    pub fn get(&self) -> Option<std::time::Instant> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).get()
    }

    /// When the current connection last read a byte from the peer.
    pub fn heard(&self) -> std::time::Instant {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).heard()
    }

    /// When a read on the current connection last found nothing to read.
    pub fn quiet(&self) -> std::time::Instant {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).quiet()
    }

    /// Watches the current connection closely, or stops (see [`LastPong::watch`]).
    pub fn watch(&self, on: bool) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).watch(on);
    }

    /// The stream moved to another connection.
    pub fn replace(&self, last_pong: std::sync::Arc<LastPong>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = last_pong;
    }
}

/// One transport's PING: [`ping`](Pinger::ping) sends one and resolves when its PONG arrives.
pub trait Pinger {
    type Error;
    fn ping(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send + '_;
}

/// Why [`keep_alive`] gave the connection up.
#[derive(Debug)]
pub enum KeepaliveEnd<E> {
    /// The transport could not PING.
    Failed(E),
    /// A PING went unanswered for the keepalive's timeout.
    Unanswered(Duration),
}

/// Drives pings on `pinger` until one goes unanswered; used by both ends of every transport.
/// While the connection is watched, this future also wakes every [`WATCHED_READ_POLL`] as it
/// waits for a PONG: a task that reads in the same task then polls its reads again, and a
/// read that finds nothing records the peer's silence (see [`LastPong::quiet`]). No packet
/// is sent for it.
pub async fn keep_alive<P: Pinger>(
    mut pinger: P,
    keepalive: Keepalive,
    last_pong: std::sync::Arc<LastPong>,
) -> KeepaliveEnd<P::Error> {
    loop {
        tokio::select! {
            () = tokio::time::sleep(last_pong.ping_interval(&keepalive)) => {}
            () = last_pong.wake.notified() => {}
        }
        let pong = pinger.ping();
        let mut pong = std::pin::pin!(pong);
        let deadline = tokio::time::Instant::now() + keepalive.timeout;
        let answered = loop {
            let tick = if last_pong.is_watched() {
                WATCHED_READ_POLL
            } else {
                keepalive.timeout
            };
            tokio::select! {
                answered = &mut pong => break Some(answered),
                () = tokio::time::sleep_until(deadline) => break None,
                () = tokio::time::sleep(tick) => {}
            }
        };
        match answered {
            Some(Ok(())) => last_pong.set(tokio::time::Instant::now().into_std()),
            Some(Err(e)) => return KeepaliveEnd::Failed(e),
            None => return KeepaliveEnd::Unanswered(keepalive.timeout),
        }
    }
}
