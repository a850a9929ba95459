//! The server's live peer links, both ways (server peering): what introspection lists and
//! the peer gauges count. A leaf, so that the hub can hold it and the peer module fill it
//! without a cycle between them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;
use tether_observe::time::monotonic_now;

use tether_observe::introspect::PeerView;
use tether_observe::metrics::{Gauge, GaugeVec, Registry};
use tether_tunnel::Link;

use crate::backend::remote::ViaPeer;

/// Which way a link's dials go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Direction {
    /// The peer offers its agents: this server's dials go out over the link.
    In,
    /// This server offers its agents: the peer's dials come in over the link.
    Out,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Self::In => "in",
            Self::Out => "out",
        }
    }
}

/// One live link.
#[derive(Debug)]
struct Entry {
    direction: Direction,
    peer_id: String,
    address: String,
    since: Instant,
    link: Arc<Link>,
    /// `In`: the link as this server's dials through it see it.
    via: Option<Arc<ViaPeer>>,
    /// The agents announced over the link (by the peer for `In`, by this server for `Out`).
    agents: Arc<AtomicUsize>,
}

/// Every live peer link of the server.
#[derive(Debug)]
pub(crate) struct PeerLinks {
    links: Mutex<HashMap<u64, Entry>>,
    next: AtomicU64,
    gauge: Arc<GaugeVec>,
    /// Agents peers hold that this server can dial, summed over its inbound links.
    remote_agents: Arc<Gauge>,
}

/// A link's place in the table, given up when dropped.
#[derive(Debug)]
pub(crate) struct Registered {
    links: Arc<PeerLinks>,
    key: u64,
    /// The link's announced agents, kept current by its owner.
    pub(crate) agents: Arc<AtomicUsize>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        let removed = self.links.lock().remove(&self.key);
        if let Some(entry) = removed {
            self.links.gauge.with(&[entry.direction.label()]).dec();
        }
        self.links.refresh_remote_agents();
    }
}

impl PeerLinks {
    pub(crate) fn register(metrics: &Registry) -> Self {
        Self {
            links: Mutex::default(),
            next: AtomicU64::new(0),
            gauge: metrics.gauge_vec(
                "tether_server_peer_links",
                "Links to peer servers (server peering), by direction: in, the peer offers its agents; out, this server offers its own.",
                &["direction"],
            ),
            remote_agents: metrics.gauge(
                "tether_server_peer_agents",
                "Agents that peer servers hold and announced to this server: dialed through them.",
            ),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Entry>> {
        self.links.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Lists `link` until the returned handle is dropped.
    pub(crate) fn add(
        self: &Arc<Self>,
        direction: Direction,
        peer_id: &str,
        address: String,
        link: Arc<Link>,
        via: Option<Arc<ViaPeer>>,
    ) -> Registered {
        let key = self.next.fetch_add(1, Ordering::Relaxed);
        let agents = Arc::new(AtomicUsize::new(0));
        self.lock().insert(
            key,
            Entry {
                direction,
                peer_id: peer_id.to_owned(),
                address,
                since: monotonic_now(),
                link,
                via,
                agents: agents.clone(),
            },
        );
        self.gauge.with(&[direction.label()]).inc();
        Registered {
            links: self.clone(),
            key,
            agents,
        }
    }

    /// Sets the remote agents gauge from the inbound links' counts.
    pub(crate) fn refresh_remote_agents(&self) {
        let total: usize = self
            .lock()
            .values()
            .filter(|e| e.direction == Direction::In)
            .map(|e| e.agents.load(Ordering::Relaxed))
            .sum();
        self.remote_agents
            .set(i64::try_from(total).unwrap_or(i64::MAX));
    }

    /// The inbound links, for `/debug/connections`.
    pub(crate) fn inbound(&self) -> Vec<Arc<ViaPeer>> {
        self.lock().values().filter_map(|e| e.via.clone()).collect()
    }

    /// The links now, for `/debug/agents`.
    pub(crate) fn views(&self) -> Vec<PeerView> {
        let now = monotonic_now();
        let links: Vec<(Direction, String, String, Instant, Arc<Link>, usize)> = self
            .lock()
            .values()
            .map(|e| {
                (
                    e.direction,
                    e.peer_id.clone(),
                    e.address.clone(),
                    e.since,
                    e.link.clone(),
                    e.agents.load(Ordering::Relaxed),
                )
            })
            .collect();
        let mut views: Vec<PeerView> = links
            .into_iter()
            .map(|(direction, peer_id, address, since, link, agents)| {
                let (pending, connections) =
                    link.inspect(|t| (t.pending_dial_count(), t.connection_count()));
                PeerView {
                    peer_server_id: peer_id,
                    direction: direction.label().to_owned(),
                    address,
                    age_seconds: now.saturating_duration_since(since).as_secs_f64(),
                    agents: agents as u64,
                    pending_dials: pending as u64,
                    connections: connections as u64,
                }
            })
            .collect();
        views.sort_by(|a, b| {
            (&a.peer_server_id, &a.direction).cmp(&(&b.peer_server_id, &b.direction))
        });
        views
    }
}
