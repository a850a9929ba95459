//! How many servers the agent holds streams to. Servers announce a count in every stream's
//! `servercount` header; with `--count-server-leases` the count of valid server Leases
//! replaces it (`--server-count-source=default`) or raises it (`max`), as upstream's
//! `aggregateServerCounter` combines them. Leases also name the servers that count, so an
//! agent holding more streams than the count knows which ones to let go.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// `--server-count-source`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CountSource {
    /// The Lease count alone.
    Default,
    /// The larger of the Lease count and the last announced count.
    Max,
}

/// One reading of the valid server Leases.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerLeases {
    /// At least 1.
    pub count: usize,
    /// Holder identities of the valid Leases: the server IDs that count.
    pub holders: BTreeSet<String>,
    /// The agent addresses the valid Leases publish (`--server-discovery=leases`).
    pub addresses: BTreeSet<std::net::SocketAddr>,
    /// Holders of valid Leases that publish no readable agent address, with what their
    /// annotation held instead (`None`: no annotation).
    pub without_address: std::collections::BTreeMap<String, Option<String>>,
}

#[cfg(test)]
impl ServerLeases {
    /// A reading of `count` valid Leases held by `holders`, for tests.
    pub(crate) fn of(count: usize, holders: &[&str]) -> Self {
        Self {
            count,
            holders: holders.iter().map(|h| (*h).to_owned()).collect(),
            ..Self::default()
        }
    }
}

/// Counting servers by Lease: the source setting and the latest reading, `None` until the
/// first list succeeded (until then the announced count is used, so an agent that cannot
/// reach the Kubernetes API still connects, rather than waiting as upstream's does).
#[derive(Clone, Debug)]
pub struct LeaseCounting {
    pub source: CountSource,
    pub leases: watch::Receiver<Option<ServerLeases>>,
}

/// The number of servers to hold streams to.
pub(crate) fn target(
    source: Option<CountSource>,
    leases: Option<&ServerLeases>,
    announced: usize,
) -> usize {
    let announced = announced.max(1);
    match (source, leases) {
        (None, _) | (Some(_), None) => announced,
        (Some(CountSource::Default), Some(leases)) => leases.count.max(1),
        (Some(CountSource::Max), Some(leases)) => leases.count.max(announced),
    }
}

/// Whether the agent holds every stream it should: at least `target` of them and, when
/// Leases are known, one to every server holding a valid Lease ("connected to every counted
/// server", what readiness reports).
pub(crate) fn satisfied<'a>(
    connected: impl IntoIterator<Item = &'a str>,
    target: usize,
    leases: Option<&ServerLeases>,
) -> bool {
    let connected: BTreeSet<&str> = connected.into_iter().collect();
    connected.len() >= target
        && leases.is_none_or(|l| l.holders.iter().all(|h| connected.contains(h.as_str())))
}

/// The connected servers to let go of: beyond `target`, those whose Lease no longer counts.
/// A server with a valid Lease is never chosen, so a short-lived disagreement between the
/// count and the streams costs no live connection.
pub(crate) fn surplus<'a>(
    connected: impl IntoIterator<Item = &'a str>,
    target: usize,
    leases: &ServerLeases,
) -> Vec<String> {
    let connected: Vec<&str> = connected.into_iter().collect();
    let excess = connected.len().saturating_sub(target);
    connected
        .into_iter()
        .filter(|id| !leases.holders.contains(*id))
        .take(excess)
        .map(str::to_owned)
        .collect()
}

/// How long a connected server must have lacked a valid Lease before the agent lets go of
/// it: upstream's renewal interval, so that a server whose renewal was merely late (an API
/// server outage longer than the Lease duration expires every Lease at once) is kept.
pub(crate) const UNCOUNTED_GRACE: Duration = Duration::from_secs(15);

/// Since when each surplus server has gone without a valid Lease.
#[derive(Debug, Default)]
pub(crate) struct Uncounted {
    since: HashMap<String, Instant>,
}

impl Uncounted {
    /// Records this reading's surplus servers and returns those uncounted for at least
    /// [`UNCOUNTED_GRACE`]; a server no longer in the surplus starts over.
    pub(crate) fn due(&mut self, surplus: Vec<String>, now: Instant) -> Vec<String> {
        self.since.retain(|id, _| surplus.contains(id));
        surplus
            .into_iter()
            .filter(|id| {
                now.duration_since(*self.since.entry(id.clone()).or_insert(now)) >= UNCOUNTED_GRACE
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tether_observe::time::monotonic_now;

    #[test]
    fn announced_count_without_leases_or_before_the_first_list() {
        assert_eq!(target(None, None, 3), 3);
        assert_eq!(target(None, Some(&ServerLeases::of(5, &[])), 3), 3);
        assert_eq!(target(Some(CountSource::Default), None, 2), 2);
        assert_eq!(target(None, None, 0), 1, "0 counts as 1, as upstream");
    }

    #[test]
    fn lease_count_replaces_or_raises_the_announced_one() {
        let four = ServerLeases::of(4, &[]);
        assert_eq!(target(Some(CountSource::Default), Some(&four), 1), 4);
        assert_eq!(
            target(
                Some(CountSource::Default),
                Some(&ServerLeases::of(2, &[])),
                3
            ),
            2
        );
        assert_eq!(
            target(Some(CountSource::Max), Some(&ServerLeases::of(2, &[])), 3),
            3
        );
        assert_eq!(target(Some(CountSource::Max), Some(&four), 3), 4);
        assert_eq!(
            target(
                Some(CountSource::Default),
                Some(&ServerLeases::of(0, &[])),
                3
            ),
            1
        );
    }

    #[test]
    fn lets_go_only_of_servers_without_a_valid_lease() {
        let l = ServerLeases::of(2, &["a", "b"]);
        assert_eq!(surplus(["a", "b", "c"], 2, &l), ["c"]);
        assert!(surplus(["a", "b"], 2, &l).is_empty());
        // More streams than the count, but every one has a valid Lease: keep them all.
        assert!(surplus(["a", "b"], 1, &l).is_empty());
        // Two gone at once; only as many as the excess are dropped.
        assert_eq!(
            surplus(["a", "c", "d"], 2, &ServerLeases::of(2, &["a", "b"])),
            ["c"]
        );
        assert_eq!(
            surplus(["c", "d", "a"], 1, &ServerLeases::of(1, &["a"])),
            ["c", "d"]
        );
    }

    #[test]
    fn servers_are_let_go_of_only_after_the_grace() {
        let t0 = monotonic_now();
        let mut u = Uncounted::default();
        assert!(u.due(vec!["c".into()], t0).is_empty());
        assert!(
            u.due(vec!["c".into(), "d".into()], t0 + Duration::from_secs(10))
                .is_empty()
        );
        assert_eq!(
            u.due(vec!["c".into(), "d".into()], t0 + UNCOUNTED_GRACE),
            ["c"]
        );
        // "d" counted again for one reading: its clock restarts.
        assert_eq!(u.due(vec!["c".into()], t0 + Duration::from_secs(26)), ["c"]);
        assert!(
            u.due(vec!["d".into()], t0 + Duration::from_secs(27))
                .is_empty()
        );
        assert_eq!(u.due(vec!["d".into()], t0 + Duration::from_secs(42)), ["d"]);
    }

    #[test]
    fn satisfied_means_every_counted_server() {
        assert!(satisfied(["a", "b"], 2, None));
        assert!(!satisfied(["a"], 2, None));
        let l = ServerLeases::of(2, &["a", "b"]);
        assert!(satisfied(["a", "b"], 2, Some(&l)));
        // Two streams, but one to a server whose Lease expired and none to "b".
        assert!(!satisfied(["a", "c"], 2, Some(&l)));
        assert!(satisfied(["a", "b", "c"], 2, Some(&l)));
        // `max`: the announced count asks for more servers than hold Leases.
        assert!(!satisfied(["a", "b"], 3, Some(&l)));
    }
}
