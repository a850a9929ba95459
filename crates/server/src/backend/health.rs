//! The load and dial record of each agent stream, and the totals of its tenant: counters the
//! agent stream updates, selection reads without the stream's lock, and tenant limits are
//! checked against. Below both the registry and the tenant table, so neither needs the other.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tether_observe::time::monotonic_now;

use super::outlier::{EjectionConfig, Outlier, Verdict};

/// Bytes queued toward frontends that weigh as much as one connection in the load figure.
const QUEUED_BYTES_PER_LOAD_UNIT: u64 = 64 * 1024;

/// An agent stream's load and dial record, read by selection without the stream's lock.
#[derive(Debug)]
pub(crate) struct Health {
    pending: AtomicU64,
    open: AtomicU64,
    queued: AtomicU64,
    last_picked: AtomicU64,
    outlier: Mutex<Outlier>,
    /// The tenant's totals, which its limits are checked against.
    tenant: Arc<TenantLoad>,
    /// Woken when a dial starts: the stream's silence watch begins (see `liveness`).
    busy: tokio::sync::Notify,
}

impl Health {
    pub(super) fn new(tenant: Arc<TenantLoad>) -> Self {
        Self {
            pending: AtomicU64::new(0),
            open: AtomicU64::new(0),
            queued: AtomicU64::new(0),
            last_picked: AtomicU64::new(0),
            outlier: Mutex::default(),
            tenant,
            busy: tokio::sync::Notify::new(),
        }
    }

    pub(crate) fn dial_started(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
        self.busy.notify_waiters();
    }

    /// The stream has dials in flight or open connections: something waits on its agent.
    pub(crate) fn is_busy(&self) -> bool {
        self.pending.load(Ordering::Relaxed) > 0 || self.open.load(Ordering::Relaxed) > 0
    }

    /// Returns once the stream is busy.
    pub(crate) async fn wait_busy(&self) {
        loop {
            let started = self.busy.notified();
            let mut started = std::pin::pin!(started);
            started.as_mut().enable();
            if self.is_busy() {
                return;
            }
            started.await;
        }
    }

    /// Ends a dial's pending state, the agent's and the tenant's (reserved in `Hub::dial`).
    pub(crate) fn dial_finished(&self) {
        self.tenant.release_pending();
        // Never below zero, whatever the order of a racing abandon and answer.
        let _ = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// A connection of the stream opened: it counts for the agent and for its tenant.
    pub(crate) fn connection_opened(&self) {
        self.open.fetch_add(1, Ordering::Relaxed);
        self.tenant.open.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn connection_ended(&self) {
        for open in [&self.open, &self.tenant.open] {
            let _ = open.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
        }
    }

    /// The bytes the stream holds queued toward frontends now.
    pub(super) fn set_queued(&self, bytes: usize) {
        self.queued
            .store(u64::try_from(bytes).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// What selection reads about a stream with these keys and this health now.
    pub(crate) fn candidate<'a>(
        &self,
        agent_id: &'a str,
        labels: &'a tether_proto::Labels,
        cidrs: &'a [tether_policy::Cidr],
        draining: bool,
        now: Instant,
    ) -> super::selection::Candidate<'a> {
        super::selection::Candidate {
            agent_id,
            zone: labels.zone.as_deref(),
            region: labels.region.as_deref(),
            cidrs,
            load: self.load(),
            last_picked: self.last_picked(),
            ejected: self.is_ejected(now),
            draining,
        }
    }

    /// Whether this record charges `load`: a tenant removed and added back has a new one.
    pub(crate) fn charges(&self, load: &Arc<TenantLoad>) -> bool {
        Arc::ptr_eq(&self.tenant, load)
    }

    /// Dials in flight and open connections, for introspection.
    pub(crate) fn counts(&self) -> (u64, u64) {
        (
            self.pending.load(Ordering::Relaxed),
            self.open.load(Ordering::Relaxed),
        )
    }

    pub(super) fn load(&self) -> u64 {
        self.pending.load(Ordering::Relaxed)
            + self.open.load(Ordering::Relaxed)
            + self.queued.load(Ordering::Relaxed) / QUEUED_BYTES_PER_LOAD_UNIT
    }

    /// The number of the last dial selection gave this stream (0: never).
    pub(super) fn last_picked(&self) -> u64 {
        self.last_picked.load(Ordering::Relaxed)
    }

    pub(super) fn mark_picked(&self, seq: u64) {
        self.last_picked.store(seq, Ordering::Relaxed);
    }

    pub(super) fn is_ejected(&self, now: Instant) -> bool {
        self.outlier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_ejected(now)
    }

    pub(super) fn record(&self, config: &EjectionConfig, ok: bool) -> Verdict {
        self.outlier
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .record(config, monotonic_now(), ok)
    }
}

/// Counters every agent stream of a tenant updates.
#[derive(Debug, Default)]
pub(crate) struct TenantLoad {
    pub(crate) pending: AtomicU64,
    pub(crate) open: AtomicU64,
}

impl TenantLoad {
    /// A dial tried again on another route takes back the pending place its first attempt
    /// gave up when it settled (the tenant's caps admitted the dial once).
    pub(crate) fn reserve_again(&self) {
        self.pending.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn release_pending(&self) {
        let _ = self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}
