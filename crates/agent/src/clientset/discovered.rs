//! One stream to each discovered server address, or with `--agent-server-connections=K`
//! to the K that rendezvous hashing picks for this agent. Every address has its own keeper
//! task that connects when the address is wanted and holds no live stream, and otherwise
//! waits: one address that cannot be reached delays none of the others, and there is no
//! duplicate to retry. With K, an address that cannot be reached is passed over for
//! another for a while, and once a better-ranked one is held again the stream beyond K is
//! let go of.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tether_observe::time::monotonic_now;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ClientSet, jitter};
use crate::discovery::Endpoints;

/// Resolves at `until`; never without one.
async fn sleep_until(until: Option<Instant>) {
    match until {
        Some(until) => tokio::time::sleep_until(until.into()).await,
        None => std::future::pending().await,
    }
}

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
        // Kept open here: a discovery that publishes once (a list) must not end the loop.
        let (publish, mut found) = watch::channel(Endpoints::new());
        let discovery = tokio::spawn(crate::discovery::keep_current(
            self.config.discovery.clone(),
            self.config.server_port,
            self.config
                .lease_counting
                .as_ref()
                .map(|c| c.leases.clone()),
            publish.clone(),
            stop.clone(),
        ));
        let mut keepers: HashMap<SocketAddr, CancellationToken> = HashMap::new();
        loop {
            let endpoints = found.borrow_and_update().clone();
            self.servers().set.discovered(endpoints.clone());
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
                () = drain.cancelled(), if !self.is_draining() => self.start_draining(),
                // Its sender lives in this function: it never closes.
                _ = found.changed() => {}
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
            let now = monotonic_now();
            let waiting = {
                let servers = self.servers();
                (!servers.set.should_connect(endpoint, now))
                    .then(|| servers.set.passed_over_until(endpoint, now))
            };
            if let Some(until) = waiting {
                // Held, not wanted, or draining: wait until a stream breaks or ends, or
                // until this address is no longer passed over.
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
                    self.servers().set.reached(endpoint);
                    backoff = self.config.sync_interval;
                    if self.add(connected, Some(endpoint), &tasks, &stop) {
                        self.let_go_of_unwanted();
                        continue;
                    }
                    // A duplicate is now an alias: nothing new held. Its server may be one
                    // being let go of (through another address), which the alias does not
                    // hold: wait for a change before dialing it again, not at once.
                    changes.mark_unchanged();
                    tokio::select! {
                        () = keeper.cancelled() => return,
                        _ = changes.changed() => {}
                        () = tokio::time::sleep(jitter(backoff)) => {}
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, server = %endpoint, "cannot connect to proxy server");
                    // With K, another server takes its place for a while.
                    if self.servers().set.pass_over(endpoint, monotonic_now()) {
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
        let mut servers = self.servers();
        for id in servers.set.let_go_of(endpoint) {
            tracing::info!(server.id = %id, server = %endpoint, "letting go of a server that discovery no longer finds");
            servers.dismiss(&id);
        }
    }

    /// With K, lets go of streams to addresses no longer wanted once every wanted one is
    /// held: a better-ranked server is back, or rendezvous moved this agent (drain, then
    /// close, as for a server whose Lease expired).
    fn let_go_of_unwanted(&self) {
        let mut servers = self.servers();
        for (id, endpoint) in servers.set.let_go_of_unwanted(monotonic_now()) {
            tracing::info!(server.id = %id, server = %endpoint, "letting go of a server beyond --agent-server-connections: a better-ranked one is held");
            servers.dismiss(&id);
        }
    }
}
