//! Suspending a resumable stream when its transport breaks, and resuming it on another:
//! the [`Link`] side of [`tether_session::Session::suspend`] and
//! [`resume`](tether_session::Session::resume), the metrics both ends keep, and the
//! `tether-resume-from` header.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tether_observe::metrics::{Counter, CounterVec, Gauge, Histogram, Registry};
use tether_session::{Replayed, ResumeError};

use crate::link::Link;

/// At most this many sessions are asked for in one `tether-resume-from`.
pub const MAX_RESUME_FROM: usize = 8;

/// Pause buckets: a resume on loopback takes milliseconds; one across a real network
/// blip takes up to the resume window.
const PAUSE_BUCKETS: [f64; 10] = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0, 30.0];

/// Why a suspended stream was not resumed: the `reason` label.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeFailure {
    /// `--resume-window` passed without a new transport.
    WindowExpired,
    /// The peer no longer knows the session (the server restarted, or was replaced).
    Unknown,
    /// The peer's count of received packets does not fit this end's log.
    BadSequence,
    /// This end is stopping.
    Stopping,
    /// The peer sent nothing for the dead-agent timeout while it had connections or dials
    /// (server side: its node is gone, or the network to it is cut).
    PeerSilent,
}

impl ResumeFailure {
    pub fn label(self) -> &'static str {
        match self {
            Self::WindowExpired => "window_expired",
            Self::Unknown => "unknown_session",
            Self::BadSequence => "bad_sequence",
            Self::Stopping => "stopping",
            Self::PeerSilent => "peer_silent",
        }
    }
}

/// Resume metrics, named `tether_server_*` or `tether_agent_*`.
#[derive(Debug)]
pub struct ResumeMetrics {
    /// Connections on suspended streams.
    pub suspended_connections: Arc<Gauge>,
    /// What suspended streams keep to write again: DATA payload bytes of their replay logs.
    suspended_replay_bytes: Arc<Gauge>,
    resumes: Arc<Counter>,
    replayed_bytes: Arc<Counter>,
    replayed_packets: Arc<Counter>,
    failures: Arc<CounterVec>,
    pause: Arc<Histogram>,
}

impl ResumeMetrics {
    /// `side` is `server` or `agent`.
    pub fn register(registry: &Registry, side: &str) -> Self {
        let name = |n: &str| format!("tether_{side}_{n}");
        Self {
            suspended_connections: registry.gauge(
                &name("suspended_connections"),
                "Connections on agent streams whose transport broke, waiting to resume.",
            ),
            suspended_replay_bytes: registry.gauge(
                &name("suspended_replay_bytes"),
                "DATA payload bytes suspended agent streams keep to write again after a resume.",
            ),
            resumes: registry.counter(
                &name("resumes_total"),
                "Suspended agent streams resumed on a new transport.",
            ),
            replayed_bytes: registry.counter(
                &name("resume_replayed_bytes_total"),
                "DATA payload bytes written again after a resume (lost with the old transport).",
            ),
            replayed_packets: registry.counter(
                &name("resume_replayed_packets_total"),
                "Packets written again after a resume.",
            ),
            failures: registry.counter_vec(
                &name("resume_failures_total"),
                "Suspended agent streams that ended without resuming, by reason.",
                &["reason"],
            ),
            pause: registry.histogram(
                &name("resume_pause_seconds"),
                "Time from a transport break to the resumed stream, in seconds.",
                &PAUSE_BUCKETS,
            ),
        }
    }

    pub fn resumed(&self, replayed: Replayed, pause: Duration) {
        self.resumes.inc();
        self.replayed_bytes.add(replayed.bytes);
        self.replayed_packets.add(replayed.packets);
        self.pause.observe_duration(pause);
    }

    pub fn failed(&self, why: ResumeFailure) {
        self.failures.with(&[why.label()]).inc();
    }
}

/// A suspended stream: counted while it waits, uncounted however it ends.
#[derive(Debug)]
pub struct Suspension {
    pub since: Instant,
    connections: i64,
    replay_bytes: i64,
    connections_gauge: Arc<Gauge>,
    replay_gauge: Arc<Gauge>,
}

impl Drop for Suspension {
    fn drop(&mut self) {
        self.connections_gauge.add(-self.connections);
        self.replay_gauge.add(-self.replay_bytes);
    }
}

impl Link {
    /// The transport broke: a resumable stream keeps its dials and connections for
    /// `window` (their owners see a pause). `None` if the stream is not resumable.
    pub fn suspend(
        self: &Arc<Self>,
        window: Duration,
        metrics: &ResumeMetrics,
    ) -> Option<Suspension> {
        let (connections, replay_bytes, since) = self.update(|s, now| {
            s.suspend(now, window)
                .then(|| (s.connection_count() as i64, s.replay_log().0 as i64, now))
        })?;
        metrics.suspended_connections.add(connections);
        metrics.suspended_replay_bytes.add(replay_bytes);
        Some(Suspension {
            since,
            connections,
            replay_bytes,
            connections_gauge: metrics.suspended_connections.clone(),
            replay_gauge: metrics.suspended_replay_bytes.clone(),
        })
    }

    /// How many of the peer's packets this end received: what it resumes with.
    pub fn resume_point(&self) -> Option<u64> {
        self.inspect(tether_session::Session::resume_point)
    }

    /// Continues the suspended stream on a new transport whose peer received
    /// `peer_received` of this end's packets.
    pub fn resume(
        self: &Arc<Self>,
        peer_received: u64,
        suspension: Suspension,
        metrics: &ResumeMetrics,
    ) -> Result<Replayed, ResumeError> {
        let replayed = self.update(|s, _| s.resume(peer_received))?;
        metrics.resumed(replayed, suspension.since.elapsed());
        Ok(replayed)
    }

    /// Waits while suspended for `next` (a new transport), firing the table's deadlines
    /// meanwhile, dial and close ones as well as the resume window. `None` once the table
    /// closed: the window passed.
    pub async fn wait_resumed<T>(self: &Arc<Self>, next: impl Future<Output = T>) -> Option<T> {
        let mut next = std::pin::pin!(next);
        loop {
            let at = self.inspect(|s| s.is_open().then(|| s.next_timeout()))?;
            let deadline = async {
                match at {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                item = &mut next => return Some(item),
                () = deadline => self.update(|s, now| s.handle_timeout(now)),
            }
        }
    }
}

/// Formats `tether-resume-from`: `token:received` pairs.
pub fn format_resume_from(sessions: &[(String, u64)]) -> String {
    sessions
        .iter()
        .take(MAX_RESUME_FROM)
        .map(|(token, received)| format!("{token}:{received}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Whether `token` has the form of a session token a server hands out (`tether-resume`).
pub fn is_resume_token(token: &str) -> bool {
    token.len() == 32 && token.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Parses `tether-resume-from`; `None` if it is malformed or names too many sessions.
pub fn parse_resume_from(value: &str) -> Option<Vec<(String, u64)>> {
    let pairs: Vec<(String, u64)> = value
        .split(',')
        .map(|pair| {
            let (token, received) = pair.trim().split_once(':')?;
            Some((
                is_resume_token(token).then(|| token.to_owned())?,
                received.parse().ok()?,
            ))
        })
        .collect::<Option<_>>()?;
    (pairs.len() <= MAX_RESUME_FROM).then_some(pairs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_from_round_trips_and_rejects_junk() {
        let token = "0123456789abcdef0123456789abcdef".to_owned();
        let sessions = vec![(token.clone(), 7), (token.clone(), 0)];
        let header = format_resume_from(&sessions);
        assert_eq!(parse_resume_from(&header), Some(sessions));
        for junk in [
            "",
            "x:1",
            &format!("{token}:-1"),
            &token.clone(),
            &format!("{token}:1,"),
        ] {
            assert_eq!(parse_resume_from(junk), None, "{junk:?}");
        }
        let many = vec![format!("{token}:1"); MAX_RESUME_FROM + 1].join(",");
        assert_eq!(parse_resume_from(&many), None);
    }
}
