//! Which agent gets a dial: upstream's proxy strategies and tether's, without I/O.
//!
//! One index per configured strategy, asked in the configured order; an index that has no
//! candidate passes the dial on to the next one. Within an index, draining agents are used
//! only when nothing else is left (upstream's rule), and agents ejected for failing dials
//! only before those. tether's strategies (`topology`, `destCIDR`, `leastLoaded`) choose
//! among every agent's first stream with the pure functions of `selection`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tether_proto::Identifiers;

use super::selection::{self, Candidate, SelectionConfig, Strategy};
use crate::request::RequestContext;

/// What the registry needs to know about a connected agent stream.
pub(crate) trait Backend: Clone {
    fn agent_id(&self) -> &str;
    /// Distinguishes several streams of the same agent ID.
    fn stream_id(&self) -> u64;
    fn is_draining(&self) -> bool;
    /// The agent announced a tether version; upstream's agents do not.
    fn is_tether(&self) -> bool;
    /// The stream is this server's own, not an agent a peer server holds.
    fn is_local(&self) -> bool {
        true
    }
    /// What selection reads about this stream now: labels, CIDRs, load and health.
    fn candidate(&self, now: Instant) -> Candidate<'_>;
    /// Records that this stream got dial number `seq` (the tie-breaker of least-loaded).
    fn mark_picked(&self, seq: u64);
}

/// The outcome of a selection.
#[derive(Debug)]
pub(crate) struct Selected<B> {
    pub(crate) backend: B,
    /// The strategy that found it.
    pub(crate) strategy: Strategy,
    /// How many streams that strategy chose among.
    pub(crate) candidates: usize,
}

/// One index: key → the streams that advertised it, oldest (lowest stream ID) first. Each
/// stream is indexed under its own identifiers (as upstream), so a later stream of an agent ID
/// never inherits the keys of an earlier one.
#[derive(Debug)]
struct Index<B> {
    strategy: Strategy,
    keys: HashMap<String, Vec<B>>,
}

/// The set of connected agents, indexed per strategy.
#[derive(Debug)]
pub(crate) struct Registry<B> {
    indexes: Vec<Index<B>>,
    /// Streams per agent ID; `[0]` takes new dials, as upstream.
    agents: HashMap<String, Vec<B>>,
    /// Agent IDs with a stream of this server's own, and those of them with a stream from a
    /// tether agent, kept as streams come and go so that the agent gauges cost no walk over
    /// every agent. Agents only peer servers hold are not counted.
    local_agents: usize,
    tether_agents: usize,
    /// Shared by every tenant's registry: an idle tenant must not copy the zone rules.
    config: Arc<SelectionConfig>,
    /// Dials handed out so far.
    picks: u64,
}

impl<B: Backend> Registry<B> {
    pub(crate) fn new(strategies: &[Strategy], config: Arc<SelectionConfig>) -> Self {
        Self {
            indexes: strategies
                .iter()
                .map(|&strategy| Index {
                    strategy,
                    keys: HashMap::new(),
                })
                .collect(),
            agents: HashMap::new(),
            local_agents: 0,
            tether_agents: 0,
            config,
            picks: 0,
        }
    }

    /// Selects with another generation's settings from the next dial on.
    pub(crate) fn set_config(&mut self, config: Arc<SelectionConfig>) {
        self.config = config;
    }

    /// Adds a stream under its own identifiers, in its place by age: a stream queues behind
    /// the older streams under the keys they share, and a resumed stream (which keeps its
    /// stream ID) goes back where it was, not behind the streams that came while it was away.
    pub(crate) fn add(&mut self, backend: B, identifiers: &Identifiers) {
        let id = backend.agent_id().to_owned();
        for index in &mut self.indexes {
            for key in keys_for(index.strategy, &id, identifiers) {
                insert_by_age(index.keys.entry(key).or_default(), backend.clone());
            }
        }
        let streams = self.agents.entry(id).or_default();
        let before = Counted::of(streams);
        insert_by_age(streams, backend);
        Counted::of(streams).update(before, &mut self.local_agents, &mut self.tether_agents);
    }

    /// Removes every stream this server holds of `agent_id` (its owner changed: they are
    /// ending); routes through peers stay.
    pub(crate) fn remove_agent(&mut self, agent_id: &str) {
        let streams: Vec<u64> = self
            .agents
            .get(agent_id)
            .map(|streams| {
                streams
                    .iter()
                    .filter(|b| b.is_local())
                    .map(Backend::stream_id)
                    .collect()
            })
            .unwrap_or_default();
        for stream_id in streams {
            self.remove(agent_id, stream_id);
        }
    }

    /// Removes one stream (matched by agent and stream ID) from every key it was indexed under.
    pub(crate) fn remove(&mut self, agent_id: &str, stream_id: u64) {
        let Some(streams) = self.agents.get_mut(agent_id) else {
            return;
        };
        let before = Counted::of(streams);
        streams.retain(|b| b.stream_id() != stream_id);
        Counted::of(streams).update(before, &mut self.local_agents, &mut self.tether_agents);
        if streams.is_empty() {
            self.agents.remove(agent_id);
        }
        let same = |b: &B| b.agent_id() == agent_id && b.stream_id() == stream_id;
        for index in &mut self.indexes {
            index.keys.retain(|_, streams| {
                streams.retain(|b| !same(b));
                !streams.is_empty()
            });
        }
    }

    /// Picks a stream for `request`'s dial, trying each strategy in order.
    pub(crate) fn select(&mut self, request: &RequestContext, now: Instant) -> Option<Selected<B>> {
        let host = host_of(&request.address);
        let affinity_key = self
            .config
            .client_affinity
            .then(|| request.peer.principal().to_string());
        let selected = self.indexes.iter().find_map(|index| {
            // The chosen stream and how many the strategy chose among.
            let (backend, candidates) = match index.strategy {
                // Streams that advertised the host, oldest (by stream ID) first.
                Strategy::DestHost => {
                    let streams = index.keys.get(host)?;
                    (first_preferring_active(streams, now)?, streams.len())
                }
                Strategy::Topology | Strategy::DestCidr | Strategy::LeastLoaded => {
                    let streams: Vec<&B> = self.agents.values().filter_map(|s| s.first()).collect();
                    let snapshot: Vec<Candidate<'_>> =
                        streams.iter().map(|b| b.candidate(now)).collect();
                    let request = selection::Request {
                        host,
                        affinity_key: affinity_key.as_deref(),
                        zone_rules: &self.config.zone_rules,
                    };
                    let set = selection::candidate_set(index.strategy, &snapshot, &request)?;
                    let chosen =
                        selection::pick(&snapshot, &set, request.affinity_key, &mut random_below)?;
                    (streams[chosen].clone(), set.len())
                }
                Strategy::Default | Strategy::DefaultRoute => {
                    // One candidate per agent ID (its oldest stream), from a random start in
                    // the table's order, as upstream: spreads load without bookkeeping. The
                    // walk stops at the first usable stream, so a dial costs a step per agent
                    // skipped, not a sort of every agent ID (35 % of the server's CPU at
                    // 1,000 agents, BENCHMARKS.md).
                    let count = index.keys.len();
                    if count == 0 {
                        return None;
                    }
                    let start = random_below(count);
                    let from_start = index.keys.values().skip(start);
                    let wrapped = index.keys.values().take(start);
                    let oldest = from_start.chain(wrapped).filter_map(|s| s.first());
                    (first_preferring_active(oldest, now)?, count)
                }
            };
            Some(Selected {
                backend,
                strategy: index.strategy,
                candidates,
            })
        });
        if let Some(selected) = &selected {
            self.picks += 1;
            selected.backend.mark_picked(self.picks);
        }
        selected
    }

    /// Readiness, as upstream: the first strategy's index has an agent.
    pub(crate) fn is_ready(&self) -> bool {
        self.indexes.first().is_some_and(|i| !i.keys.is_empty())
    }

    /// Keys per strategy, for `ready_backends{proxy_strategy}`.
    pub(crate) fn key_counts(&self) -> impl Iterator<Item = (Strategy, usize)> + '_ {
        self.indexes.iter().map(|i| (i.strategy, i.keys.len()))
    }

    /// Whether this stream of `agent_id` is in the registry.
    pub(crate) fn has_stream(&self, agent_id: &str, stream_id: u64) -> bool {
        self.agents
            .get(agent_id)
            .is_some_and(|streams| streams.iter().any(|b| b.stream_id() == stream_id))
    }

    /// Whether any stream of `agent_id` is connected.
    #[cfg(test)]
    pub(crate) fn contains(&self, agent_id: &str) -> bool {
        self.agents.contains_key(agent_id)
    }

    /// Distinct agent IDs connected to this server.
    pub(crate) fn agent_count(&self) -> usize {
        self.local_agents
    }

    /// The first of this server's own streams of `agent_id`, the one that takes new dials.
    pub(crate) fn first_local(&self, agent_id: &str) -> Option<&B> {
        self.agents.get(agent_id)?.iter().find(|b| b.is_local())
    }

    /// Distinct agent IDs connected to this server of which a tether agent holds a stream.
    pub(crate) fn tether_agent_count(&self) -> usize {
        self.tether_agents
    }

    /// Every connected stream, for introspection.
    pub(crate) fn streams(&self) -> impl Iterator<Item = &B> + '_ {
        self.agents.values().flatten()
    }
}

/// Whether an agent ID's streams count among this server's agents, and its tether agents.
#[derive(Clone, Copy)]
struct Counted {
    local: bool,
    tether: bool,
}

impl Counted {
    fn of<B: Backend>(streams: &[B]) -> Self {
        let mut local = streams.iter().filter(|b| b.is_local());
        Self {
            local: streams.iter().any(B::is_local),
            tether: local.any(B::is_tether),
        }
    }

    /// Moves the counts by the change from `before` to `self`.
    fn update(self, before: Self, local: &mut usize, tether: &mut usize) {
        for (now, was, count) in [
            (self.local, before.local, local),
            (self.tether, before.tether, tether),
        ] {
            match (was, now) {
                (false, true) => *count += 1,
                (true, false) => *count -= 1,
                _ => {}
            }
        }
    }
}

/// Inserts `backend` among `streams` (kept in stream-ID order) after every older stream.
fn insert_by_age<B: Backend>(streams: &mut Vec<B>, backend: B) {
    let at = streams.partition_point(|b| b.stream_id() < backend.stream_id());
    streams.insert(at, backend);
}

/// The first usable candidate, else the first ejected one, else the first draining one.
fn first_preferring_active<'a, B: Backend + 'a>(
    candidates: impl IntoIterator<Item = &'a B>,
    now: Instant,
) -> Option<B> {
    let mut ejected = None;
    let mut draining = None;
    for candidate in candidates {
        if candidate.is_draining() {
            draining.get_or_insert(candidate);
        } else if candidate.candidate(now).ejected {
            ejected.get_or_insert(candidate);
        } else {
            return Some(candidate.clone());
        }
    }
    ejected.or(draining).cloned()
}

fn keys_for(strategy: Strategy, agent_id: &str, ids: &Identifiers) -> Vec<String> {
    match strategy {
        // tether's strategies read the agents' first streams, not an index; the key count
        // (`ready_backends`) is then the agent count.
        Strategy::Default | Strategy::Topology | Strategy::DestCidr | Strategy::LeastLoaded => {
            vec![agent_id.to_owned()]
        }
        Strategy::DefaultRoute if ids.default_route => vec![agent_id.to_owned()],
        Strategy::DefaultRoute => vec![],
        Strategy::DestHost => ids
            .hosts
            .iter()
            .chain(&ids.ipv4)
            .chain(&ids.ipv6)
            .cloned()
            .collect(),
    }
}

/// The host part of a dial address: `host:port`, `[v6]:port`, or a bare IPv6 address.
pub(crate) fn host_of(address: &str) -> &str {
    if let Some(rest) = address.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match address.rsplit_once(':') {
        Some((host, _)) if !host.contains(':') => host,
        Some(_) => address, // bare IPv6 without port
        None => address,
    }
}

/// A uniformly distributed index below `n` (n > 0) from std's randomly keyed hasher.
fn random_below(n: usize) -> usize {
    (tether_proto::random_u64() % n as u64) as usize
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use tether_observe::time::monotonic_now;

    use super::*;

    #[derive(Clone, Debug)]
    struct Fake {
        id: &'static str,
        stream: u64,
        draining: Rc<Cell<bool>>,
        tether: bool,
    }

    impl Backend for Fake {
        fn agent_id(&self) -> &str {
            self.id
        }
        fn stream_id(&self) -> u64 {
            self.stream
        }
        fn is_draining(&self) -> bool {
            self.draining.get()
        }
        fn is_tether(&self) -> bool {
            self.tether
        }
        fn candidate(&self, _now: Instant) -> Candidate<'_> {
            Candidate {
                agent_id: self.id,
                zone: None,
                region: None,
                cidrs: &[],
                load: 0,
                last_picked: 0,
                ejected: false,
                draining: self.draining.get(),
            }
        }
        fn mark_picked(&self, _seq: u64) {}
    }

    fn sel(r: &mut Registry<Fake>, address: &str) -> Option<Fake> {
        r.select(&RequestContext::to(address), monotonic_now())
            .map(|s| s.backend)
    }

    fn fake(id: &'static str, stream: u64) -> Fake {
        Fake {
            id,
            stream,
            draining: Rc::default(),
            tether: false,
        }
    }

    #[test]
    fn tether_agents_are_counted_by_agent_id_as_streams_come_and_go() {
        let mut r = Registry::new(&[Strategy::Default], Arc::default());
        let tether = |id, stream| Fake {
            tether: true,
            ..fake(id, stream)
        };
        r.add(fake("upstream", 1), &ids(""));
        r.add(tether("t", 2), &ids(""));
        r.add(tether("t", 3), &ids(""));
        assert_eq!((r.agent_count(), r.tether_agent_count()), (2, 1));
        r.remove("t", 2);
        assert_eq!(r.tether_agent_count(), 1, "one of its streams is left");
        // The same ID from an upstream agent too: still a tether agent while its stream is.
        r.add(fake("t", 4), &ids(""));
        r.remove("t", 3);
        assert_eq!((r.agent_count(), r.tether_agent_count()), (2, 0));
        r.add(tether("t", 5), &ids(""));
        r.remove_agent("t");
        r.remove("upstream", 1);
        assert_eq!((r.agent_count(), r.tether_agent_count()), (0, 0));
    }

    fn ids(query: &str) -> Identifiers {
        Identifiers::parse(query).unwrap()
    }

    #[test]
    fn default_prefers_non_draining_and_falls_back_to_draining() {
        let mut r = Registry::new(&[Strategy::Default], Arc::default());
        let a = fake("a", 1);
        let b = fake("b", 2);
        r.add(a.clone(), &ids(""));
        r.add(b.clone(), &ids(""));
        a.draining.set(true);
        for _ in 0..50 {
            assert_eq!(sel(&mut r, "10.0.0.1:80").unwrap().id, "b");
        }
        b.draining.set(true);
        assert!(
            sel(&mut r, "10.0.0.1:80").is_some(),
            "all draining: still served"
        );
        r.remove("a", 1);
        r.remove("b", 2);
        assert!(sel(&mut r, "10.0.0.1:80").is_none());
        assert!(!r.is_ready());
    }

    #[test]
    fn default_spreads_dials_over_every_agent() {
        let mut r = Registry::new(&[Strategy::Default], Arc::default());
        let agents = ["a", "b", "c", "d"];
        for (i, id) in agents.into_iter().enumerate() {
            r.add(fake(id, i as u64), &ids(""));
        }
        let mut counts = HashMap::new();
        for _ in 0..4_000 {
            let picked = sel(&mut r, "10.0.0.1:80").unwrap();
            *counts.entry(picked.id).or_insert(0) += 1;
        }
        // 1,000 each expected; the bounds are eleven standard deviations wide.
        for id in agents {
            let n = counts.get(id).copied().unwrap_or(0);
            assert!(
                (700..=1_300).contains(&n),
                "{id} got {n} of 4,000: {counts:?}"
            );
        }
    }

    #[test]
    fn dest_host_matches_exactly_then_falls_through_in_order() {
        let mut r = Registry::new(
            &[
                Strategy::DestHost,
                Strategy::DefaultRoute,
                Strategy::Default,
            ],
            Arc::default(),
        );
        r.add(fake("node1", 1), &ids("host=node1&ipv4=10.0.0.1"));
        r.add(fake("gw", 2), &ids("default-route=true"));
        r.add(fake("plain", 3), &ids(""));
        assert_eq!(sel(&mut r, "10.0.0.1:10250").unwrap().id, "node1");
        assert_eq!(sel(&mut r, "node1:10250").unwrap().id, "node1");
        for _ in 0..20 {
            assert_eq!(
                sel(&mut r, "10.9.9.9:80").unwrap().id,
                "gw",
                "defaultRoute before default"
            );
        }
        r.remove("gw", 2);
        let picked = sel(&mut r, "10.9.9.9:80").unwrap().id;
        assert!(picked == "plain" || picked == "node1");
        assert!(r.is_ready(), "destHost index has node1");
    }

    #[test]
    fn readiness_follows_the_first_strategy() {
        let mut r = Registry::new(&[Strategy::DestHost, Strategy::Default], Arc::default());
        r.add(fake("plain", 1), &ids(""));
        assert!(!r.is_ready(), "no agent advertises a host");
        assert!(sel(&mut r, "x:1").is_some());
    }

    #[test]
    fn second_stream_of_an_agent_waits_behind_the_first() {
        let mut r = Registry::new(&[Strategy::Default], Arc::default());
        r.add(fake("a", 1), &ids(""));
        r.add(fake("a", 2), &ids(""));
        assert_eq!(sel(&mut r, "x:1").unwrap().stream, 1);
        r.remove("a", 1);
        assert_eq!(sel(&mut r, "x:1").unwrap().stream, 2);
        assert_eq!(r.agent_count(), 1);
    }

    #[test]
    fn a_stream_that_comes_back_takes_its_place_by_age() {
        let mut r = Registry::new(&[Strategy::DestHost, Strategy::Default], Arc::default());
        let real = fake("node-1", 1);
        r.add(real.clone(), &ids("ipv4=10.0.0.1"));
        r.add(fake("other", 2), &ids("ipv4=10.0.0.1"));
        r.add(fake("node-1", 3), &ids(""));
        assert_eq!(sel(&mut r, "10.0.0.1:10250").unwrap().id, "node-1");
        // A blip: the real node's stream is suspended and resumed (same stream ID).
        r.remove("node-1", 1);
        assert_eq!(sel(&mut r, "10.0.0.1:10250").unwrap().id, "other");
        r.add(real, &ids("ipv4=10.0.0.1"));
        for _ in 0..5 {
            assert_eq!(
                sel(&mut r, "10.0.0.1:10250").unwrap().stream,
                1,
                "the resumed stream is the oldest again"
            );
        }
        // Also among one agent's own streams.
        assert_eq!(
            r.streams()
                .filter(|b| b.id == "node-1")
                .map(|b| b.stream)
                .collect::<Vec<_>>(),
            [1, 3]
        );
        r.remove_agent("node-1");
        assert!(!r.contains("node-1"));
        assert_eq!(sel(&mut r, "10.0.0.1:10250").unwrap().id, "other");
    }

    #[test]
    fn each_stream_is_indexed_under_its_own_identifiers() {
        let mut r = Registry::new(&[Strategy::DestHost], Arc::default());
        r.add(fake("a", 1), &ids("host=old-name"));
        r.add(fake("a", 2), &ids("host=new-name"));
        // Before per-stream indexing the second stream inherited old-name and had no new-name.
        assert_eq!(sel(&mut r, "new-name:1").unwrap().stream, 2);
        assert_eq!(sel(&mut r, "old-name:1").unwrap().stream, 1);
        r.remove("a", 1);
        assert!(
            sel(&mut r, "old-name:1").is_none(),
            "old-name left with its stream"
        );
        assert_eq!(sel(&mut r, "new-name:1").unwrap().stream, 2);
        r.remove("a", 2);
        assert!(!r.is_ready());
    }

    #[test]
    fn host_parsing() {
        assert_eq!(host_of("10.0.0.1:80"), "10.0.0.1");
        assert_eq!(host_of("[fd00::1]:443"), "fd00::1");
        assert_eq!(host_of("fd00::1"), "fd00::1");
        assert_eq!(host_of("node-a"), "node-a");
    }
}
