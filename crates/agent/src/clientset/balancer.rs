//! Upstream's way to reach every server: dial one address, normally a load balancer in
//! front of them all, until as many distinct server IDs are held as the servers announce or
//! their Leases count.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::{ClientSet, DUPLICATES_PER_SERVER, jitter, lease_changed, sleep};

impl ClientSet {
    /// The sync loop: runs until `stop`. A new Lease reading, or a stream that broke or
    /// ended, wakes it at once.
    pub(super) async fn run_balancer(
        self: &Arc<Self>,
        tasks: &TaskTracker,
        drain: CancellationToken,
        stop: &CancellationToken,
    ) {
        let mut changes = self.changes.subscribe();
        let mut backoff = self.config.sync_interval;
        let mut duplicates = 0;
        let mut last_target = 0;
        let mut lease_updates = self
            .config
            .lease_counting
            .as_ref()
            .map(|c| c.leases.clone());
        loop {
            changes.mark_unchanged();
            self.dismiss_surplus();
            let target = self.target();
            self.metrics.known_server_count.set(target as i64);
            if target != last_target {
                // A server joined or left: look for it at full pace again.
                last_target = target;
                duplicates = 0;
                backoff = self.config.sync_interval;
            }
            let satisfied = self.satisfied();
            let wait = if self.is_draining() {
                Duration::MAX
            } else if !self.config.sync_forever && satisfied {
                duplicates = 0;
                self.config.sync_interval
            } else {
                match self.connect_once(tasks, None).await {
                    Ok(connected) => {
                        if self.add(connected, None, tasks, stop) {
                            backoff = self.config.sync_interval;
                            duplicates = 0;
                            Duration::ZERO
                        } else if satisfied || duplicates < DUPLICATES_PER_SERVER * target {
                            // Within the budget, or `--sync-forever` with every server
                            // connected: upstream's pace.
                            duplicates += 1;
                            jitter(self.config.sync_interval)
                        } else {
                            let wait = jitter(backoff);
                            backoff = backoff.mul_f64(1.5).min(self.config.sync_interval_cap);
                            wait
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, server = %self.address(), "cannot connect to proxy server");
                        let wait = jitter(backoff);
                        backoff = backoff.mul_f64(1.5).min(self.config.sync_interval_cap);
                        wait
                    }
                }
            };
            tokio::select! {
                () = stop.cancelled() => break,
                () = drain.cancelled(), if !self.is_draining() => self.start_draining(),
                changed = lease_changed(&mut lease_updates) => {
                    if changed.is_err() {
                        lease_updates = None;
                    }
                }
                _ = changes.changed() => backoff = self.config.sync_interval,
                () = sleep(wait) => {}
            }
        }
    }
}
