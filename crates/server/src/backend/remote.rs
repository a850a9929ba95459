//! An agent a peer server holds (server peering): what selection on this server reads about
//! it, and the peer link its dials go through.
//!
//! The holder announces each agent once it joins and again when it changes (PEER_AGENTS);
//! this server keeps its own load and dial record for it, counting what it sent through
//! the peer, as it does for its own agents.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tether_observe::time::monotonic_now;

use tether_policy::Cidr;
use tether_proto::{DialId, Identifiers, Labels, pb};
use tether_tunnel::Link;

use super::health::{Health, TenantLoad};
use super::registry::Backend;
use super::selection::Candidate;
use crate::audit::Audit;
use crate::request::Requests;

/// How long selection passes a route over once its holder said it no longer holds the
/// agent: well beyond the holder's announcement that it left (gathered for 50 ms), short
/// enough that a route whose leaving and return the holder announced as no change at all
/// comes back on its own.
const WITHDRAWN_FOR: Duration = Duration::from_secs(1);

/// Remote agents' stream IDs start here, above any this server gives its own streams, so an
/// agent that also holds a stream to this server is dialed locally first.
pub(crate) const REMOTE_STREAM_BASE: u64 = 1 << 62;

/// A peer link as the dials through it see it.
#[derive(Debug)]
pub(crate) struct ViaPeer {
    /// The peer server that holds the agents.
    pub(crate) server_id: Arc<str>,
    pub(crate) link: Arc<Link>,
    /// Who asked for each dial, for the audit records.
    pub(crate) requests: Arc<Requests>,
    /// The agent each dial in flight or open connection went to, by dial ID: the link's
    /// hooks charge its load and record its outcomes.
    routes: Mutex<HashMap<DialId, RouteEntry>>,
}

/// One dial through a peer link, from its request to its connection's end.
#[derive(Debug)]
pub(crate) struct RouteEntry {
    pub(crate) agent: Arc<RemoteAgent>,
    /// Its connection opened, and counts in the agent's load until it ends.
    pub(crate) opened: bool,
    /// Its connection's end was handled before its answer (another task delivered the
    /// events): the answer then settles the dial without counting the connection.
    pub(crate) ended: bool,
}

impl RouteEntry {
    pub(crate) fn new(agent: Arc<RemoteAgent>) -> Self {
        Self {
            agent,
            opened: false,
            ended: false,
        }
    }
}

impl ViaPeer {
    pub(crate) fn new(server_id: Arc<str>, link: Arc<Link>, requests: Arc<Requests>) -> Self {
        Self {
            server_id,
            link,
            requests,
            routes: Mutex::default(),
        }
    }

    pub(crate) fn routes(&self) -> MutexGuard<'_, HashMap<DialId, RouteEntry>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits, at most `bound`, until the link's hooks are done with `dial_id`: a settled
    /// dial reaches its caller before they run, and its ID may only be sent again after.
    /// Whether they were done.
    pub(crate) async fn settled(&self, dial_id: DialId, bound: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + bound;
        while self.routes().contains_key(&dial_id) || self.requests.contains(dial_id) {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        true
    }
}

/// An agent held by a peer server, reached over the peer link.
#[derive(Debug)]
pub(crate) struct RemoteAgent {
    pub(crate) agent_id: String,
    pub(crate) stream_id: u64,
    /// The tenant whose registry holds it on this server.
    pub(crate) tenant: Arc<str>,
    pub(crate) identifiers: Identifiers,
    labels: Labels,
    cidrs: Vec<Cidr>,
    pub(crate) version: Option<String>,
    draining: AtomicBool,
    /// Until when selection passes it over, in nanoseconds after `since` (0: it is not):
    /// its holder refused a dial for it as an agent it no longer holds. An atomic, since
    /// selection reads it for every candidate of every dial.
    withdrawn_until: AtomicU64,
    /// Its load and dial record as this server sees it: the dials it sent through the peer.
    pub(crate) health: Arc<Health>,
    pub(crate) via: Arc<ViaPeer>,
    /// Its tenant's audit records, when the audit log is on.
    pub(crate) audit: Option<Arc<Audit>>,
    /// When the peer announced it.
    pub(crate) since: Instant,
}

impl RemoteAgent {
    /// The agent as announced, in `tenant`, whose totals `load` holds.
    pub(crate) fn new(
        announced: &pb::PeerAgent,
        stream_id: u64,
        tenant: Arc<str>,
        load: Arc<TenantLoad>,
        via: Arc<ViaPeer>,
        audit: Option<Arc<Audit>>,
    ) -> Self {
        let identifiers = Identifiers {
            hosts: announced.hosts.clone(),
            ipv4: announced.ipv4.clone(),
            ipv6: announced.ipv6.clone(),
            cidrs: announced.cidrs.clone(),
            default_route: announced.default_route,
        };
        let cidrs = identifiers
            .cidrs
            .iter()
            .chain(&identifiers.ipv4)
            .chain(&identifiers.ipv6)
            .filter_map(|text| Cidr::parse(text).ok())
            .collect();
        let label = |value: &str| (!value.is_empty()).then(|| value.to_owned());
        Self {
            agent_id: announced.agent_id.clone(),
            stream_id,
            tenant,
            identifiers,
            labels: Labels {
                zone: label(&announced.zone),
                region: label(&announced.region),
            },
            cidrs,
            version: label(&announced.version),
            draining: AtomicBool::new(announced.draining),
            withdrawn_until: AtomicU64::new(0),
            health: Arc::new(Health::new(load)),
            via,
            audit,
            since: monotonic_now(),
        }
    }

    /// Whether a new announcement changes what selection indexes (anything but draining).
    pub(crate) fn same_keys(&self, announced: &pb::PeerAgent) -> bool {
        self.identifiers.hosts == announced.hosts
            && self.identifiers.ipv4 == announced.ipv4
            && self.identifiers.ipv6 == announced.ipv6
            && self.identifiers.cidrs == announced.cidrs
            && self.identifiers.default_route == announced.default_route
            && self.labels.zone.as_deref().unwrap_or("") == announced.zone
            && self.labels.region.as_deref().unwrap_or("") == announced.region
            && self.version.as_deref().unwrap_or("") == announced.version
    }

    /// The holder announced the agent again, unchanged but for `draining`: a withdrawal
    /// ends with it.
    pub(crate) fn announced_again(&self, draining: bool) {
        self.draining.store(draining, Ordering::Release);
        self.withdrawn_until.store(0, Ordering::Relaxed);
    }

    /// The holder refused a dial as for an agent it no longer holds: selection passes the
    /// route over for [`WITHDRAWN_FOR`], or until the holder announces the agent again.
    pub(crate) fn withdraw(&self, now: Instant) {
        let until = self.nanos_since_announced(now + WITHDRAWN_FOR);
        self.withdrawn_until.store(until, Ordering::Relaxed);
    }

    fn is_withdrawn(&self, now: Instant) -> bool {
        let until = self.withdrawn_until.load(Ordering::Relaxed);
        until != 0 && self.nanos_since_announced(now) < until
    }

    fn nanos_since_announced(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.since).as_nanos()).unwrap_or(u64::MAX)
    }
}

impl Backend for Arc<RemoteAgent> {
    fn agent_id(&self) -> &str {
        &self.agent_id
    }
    fn stream_id(&self) -> u64 {
        self.stream_id
    }
    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
    fn is_tether(&self) -> bool {
        self.version.is_some()
    }
    fn is_local(&self) -> bool {
        false
    }
    fn candidate(&self, now: Instant) -> Candidate<'_> {
        let mut candidate = self.health.candidate(
            &self.agent_id,
            &self.labels,
            &self.cidrs,
            self.is_draining(),
            now,
        );
        // Passed over like an ejected agent: still chosen when nothing better is left.
        candidate.ejected |= self.is_withdrawn(now);
        candidate
    }
    fn mark_picked(&self, seq: u64) {
        self.health.mark_picked(seq);
    }
}

#[cfg(test)]
mod tests {
    use tether_tunnel::{Event, FlowConfig, Hooks, Limits, Role, SessionConfig};

    use super::*;

    struct Quiet;

    impl Hooks for Quiet {
        fn on_event(&self, _: &Arc<Link>, _: Event) {}
    }

    fn remote() -> RemoteAgent {
        let link = Link::new(
            SessionConfig {
                role: Role::Server,
                flow: FlowConfig::default().negotiate(None),
                dial_timeout: Duration::from_secs(30),
                close_timeout: Duration::from_secs(30),
                limits: Limits::default(),
                resumable: false,
                peering: true,
            },
            Quiet,
        );
        let via = Arc::new(ViaPeer::new("peer".into(), link, Arc::default()));
        let announced = pb::PeerAgent {
            agent_id: "node-1".into(),
            tenant: "default".into(),
            ..Default::default()
        };
        RemoteAgent::new(
            &announced,
            REMOTE_STREAM_BASE,
            "default".into(),
            Arc::default(),
            via,
            None,
        )
    }

    #[test]
    fn a_withdrawn_route_is_passed_over_until_announced_again_or_for_a_second() {
        let agent = Arc::new(remote());
        let now = monotonic_now();
        assert!(!agent.candidate(now).ejected);
        agent.withdraw(now);
        assert!(agent.candidate(now).ejected);
        assert!(agent.candidate(now + WITHDRAWN_FOR / 2).ejected);
        assert!(
            !agent.candidate(now + WITHDRAWN_FOR).ejected,
            "its time is up"
        );
        agent.withdraw(now);
        agent.announced_again(false);
        assert!(!agent.candidate(now).ejected, "announced again");
    }
}
