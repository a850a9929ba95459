//! One stream to each discovered server address, or with `--agent-server-connections=K`
//! to the K that rendezvous hashing picks for this agent. Every address has its own keeper
//! task that connects when the address is wanted and holds no live stream, and otherwise
//! waits: one address that cannot be reached delays none of the others, and there is no
//! duplicate to retry. With K, an address that cannot be reached is passed over for
//! another for a while, and once a better-ranked one is held again the stream beyond K is
//! let go of.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::{Duration, Instant};
use tether_observe::time::monotonic_now;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ClientSet, Held, jitter};

/// With `--agent-server-connections`, how long a server that could not be reached is
/// passed over for the next one in this agent's ranking before it is wanted again.
const PASS_OVER: Duration = Duration::from_secs(30);

/// Resolves at `until`; never without one.
async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until.into()).await,
        None => std::future::pending().await,
    }
}
use crate::discovery::Endpoints;

impl ClientSet {
    /// Runs discovery and a keeper per address until `stop`. An address that discovery no
    /// longer finds has its keeper stopped and its stream let go of, as a server whose
    /// Lease expired.
    pub(super) async fn run_discovered(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        drain: CancellationToken,
        stop: &CancellationToken,
    ) {
        let discovery = tokio::spawn(crate::discovery::keep_current(
            self.config.discovery.clone(),
            self.config.server_port,
            self.config
                .lease_counting
                .as_ref()
                .map(|c| c.leases.clone()),
            self.endpoints.clone(),
            stop.clone(),
        ));
        let mut found = self.endpoints.subscribe();
        let mut keepers: HashMap<SocketAddr, CancellationToken> = HashMap::new();
        loop {
            let endpoints = found.borrow_and_update().clone();
            keepers.retain(|endpoint, keeper| {
                let kept = endpoints.contains(endpoint);
                if !kept {
                    keeper.cancel();
                    self.let_go_of(*endpoint);
                }
                kept
            });
            for endpoint in &endpoints {
                keepers.entry(*endpoint).or_insert_with(|| {
                    let keeper = stop.child_token();
                    tasks.spawn(self.clone().keep(
                        *endpoint,
                        tasks.clone(),
                        keeper.clone(),
                        stop.clone(),
                    ));
                    keeper
                });
            }
            self.metrics.known_server_count.set(self.target() as i64);
            tokio::select! {
                () = stop.cancelled() => break,
                () = drain.cancelled(), if !self.draining.load(Ordering::Acquire) => self.start_draining(),
                changed = found.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        discovery.abort();
    }

    /// Holds one stream to `endpoint` until `keeper` is cancelled; the stream itself lives
    /// until `stop`, or until it is let go of.
    async fn keep(
        self: Arc<Self>,
        endpoint: SocketAddr,
        tasks: TaskTracker,
        keeper: CancellationToken,
        stop: CancellationToken,
    ) {
        let mut changes = self.changes.subscribe();
        let mut backoff = self.config.sync_interval;
        loop {
            changes.mark_unchanged();
            if self.draining.load(Ordering::Acquire)
                || self.every_endpoint_held_among(&self.sessions(), [endpoint])
                || !self.is_wanted(endpoint)
            {
                // Held, not wanted, or draining: wait until a stream breaks or ends, or
                // until this address is no longer passed over.
                let until = self.passed_over_until(endpoint);
                tokio::select! {
                    () = keeper.cancelled() => return,
                    _ = changes.changed() => continue,
                    () = sleep_until(until) => {
                        self.note_change();
                        continue;
                    }
                }
            }
            let attempt = tokio::select! {
                () = keeper.cancelled() => return,
                attempt = self.connect_once(&tasks, Some(endpoint)) => attempt,
            };
            match attempt {
                Ok(connected) => {
                    self.passed_over().remove(&endpoint);
                    // A duplicate is now an alias: nothing to retry, and nothing new held.
                    if self.add(connected, Some(endpoint), &tasks, &stop) {
                        self.let_go_of_unwanted();
                    }
                    backoff = self.config.sync_interval;
                }
                Err(e) => {
                    tracing::warn!(error = %e, server = %endpoint, "cannot connect to proxy server");
                    if self.config.server_connections.is_some() {
                        // Another server takes its place among the K for a while.
                        self.passed_over()
                            .insert(endpoint, monotonic_now() + PASS_OVER);
                        self.note_change();
                    }
                    tokio::select! {
                        () = keeper.cancelled() => return,
                        () = tokio::time::sleep(jitter(backoff)) => {}
                    }
                    backoff = backoff.mul_f64(1.5).min(self.config.sync_interval_cap);
                }
            }
        }
    }

    /// Lets go of the stream opened to `endpoint`, which discovery no longer finds.
    fn let_go_of(&self, endpoint: SocketAddr) {
        self.aliases().remove(&endpoint);
        for held in self.sessions().values() {
            if held.endpoint == Some(endpoint) && !held.dismiss.is_cancelled() {
                tracing::info!(server.id = %held.session.server_id, server = %endpoint, "letting go of a server that discovery no longer finds");
                held.dismiss.cancel();
            }
        }
    }

    /// Whether every wanted address holds a live stream, its own or (an alias) that of the
    /// server it turned out to be.
    pub(super) fn every_endpoint_held(&self, sessions: &HashMap<String, Held>) -> bool {
        let wanted = self.wanted();
        !wanted.is_empty() && self.every_endpoint_held_among(sessions, wanted)
    }

    /// The discovered addresses to hold streams to: every one, or the K rendezvous hashing
    /// ranks first for this agent among those not passed over.
    fn wanted(&self) -> Endpoints {
        let endpoints = self.endpoints.borrow().clone();
        let Some(k) = self.config.server_connections else {
            return endpoints;
        };
        let now = monotonic_now();
        let passed_over = self.passed_over();
        crate::rendezvous::wanted(&self.config.agent_id, &endpoints, k.get(), |endpoint| {
            passed_over.get(endpoint).is_some_and(|until| *until > now)
        })
    }

    fn is_wanted(&self, endpoint: SocketAddr) -> bool {
        self.wanted().contains(&endpoint)
    }

    /// When `endpoint` stops being passed over; never when it is not.
    fn passed_over_until(&self, endpoint: SocketAddr) -> Option<Instant> {
        self.passed_over()
            .get(&endpoint)
            .copied()
            .filter(|until| *until > monotonic_now())
    }

    fn passed_over(&self) -> MutexGuard<'_, HashMap<SocketAddr, Instant>> {
        self.passed_over.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// With K, lets go of streams to addresses no longer wanted once every wanted one is
    /// held: a better-ranked server is back, or rendezvous moved this agent (drain, then
    /// close, as for a server whose Lease expired).
    fn let_go_of_unwanted(&self) {
        if self.config.server_connections.is_none() {
            return;
        }
        let wanted = self.wanted();
        let sessions = self.sessions();
        if !self.every_endpoint_held_among(&sessions, wanted.iter().copied()) {
            return;
        }
        // A server a wanted address turned out to be (its other address) stays.
        let aliased: Vec<String> = {
            let aliases = self.aliases();
            wanted
                .iter()
                .filter_map(|w| aliases.get(w).cloned())
                .collect()
        };
        for (id, held) in sessions.iter() {
            if let Some(endpoint) = held.endpoint
                && !wanted.contains(&endpoint)
                && !aliased.contains(id)
                && !held.dismiss.is_cancelled()
            {
                tracing::info!(server.id = %held.session.server_id, server = %endpoint, "letting go of a server beyond --agent-server-connections: a better-ranked one is held");
                held.dismiss.cancel();
            }
        }
    }

    /// An alias counts as held while its server's stream is suspended too: only the
    /// stream's own address resumes it, and a fresh stream through the alias would end it.
    fn every_endpoint_held_among(
        &self,
        sessions: &HashMap<String, Held>,
        endpoints: impl IntoIterator<Item = SocketAddr>,
    ) -> bool {
        let aliases = self.aliases();
        endpoints.into_iter().all(|endpoint| {
            sessions
                .values()
                .any(|held| held.endpoint == Some(endpoint) && held.is_live())
                || aliases
                    .get(&endpoint)
                    .and_then(|id| sessions.get(id))
                    .is_some_and(|held| !held.dismiss.is_cancelled())
        })
    }

    /// The servers to hold streams to: one per wanted address, less the addresses that
    /// turned out to be another's server.
    pub(super) fn discovered_target(&self) -> usize {
        let endpoints: Endpoints = self.wanted();
        let sessions = self.sessions();
        let aliases = self.aliases();
        endpoints
            .iter()
            .filter(|endpoint| {
                aliases
                    .get(endpoint)
                    .and_then(|id| sessions.get(id))
                    .is_none_or(|held| held.endpoint == Some(**endpoint))
            })
            .count()
            .max(1)
    }
}
