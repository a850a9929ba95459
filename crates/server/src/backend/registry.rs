//! Which agent gets a dial: upstream's proxy strategies, without I/O.
//!
//! One index per configured strategy, asked in the configured order; an index that has no
//! candidate passes the dial on to the next one. Within an index, draining agents are used
//! only when nothing else is left (upstream's rule).

use std::collections::HashMap;
use std::str::FromStr;

use tether_proto::Identifiers;

use crate::request::RequestContext;

/// A `--proxy-strategies` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Any agent, chosen at random.
    Default,
    /// The agent whose `host`, `ipv4` or `ipv6` identifier equals the destination host.
    DestHost,
    /// Any agent that advertised `default-route=true`, chosen at random.
    DefaultRoute,
}

impl Strategy {
    /// Upstream's spelling, also the `proxy_strategy` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::DestHost => "destHost",
            Self::DefaultRoute => "defaultRoute",
        }
    }

    /// Parses the comma-separated flag value; empty or unknown entries are errors.
    pub fn parse_list(value: &str) -> Result<Vec<Self>, String> {
        let list: Vec<Self> = value
            .split(',')
            .map(|s| s.trim().parse())
            .collect::<Result<_, _>>()?;
        if list.is_empty() {
            return Err("--proxy-strategies must not be empty".into());
        }
        Ok(list)
    }
}

impl FromStr for Strategy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Self::Default),
            "destHost" => Ok(Self::DestHost),
            "defaultRoute" => Ok(Self::DefaultRoute),
            other => Err(format!(
                "unknown proxy strategy {other:?} (expected default, destHost or defaultRoute)"
            )),
        }
    }
}

/// What the registry needs to know about a connected agent stream.
pub(crate) trait Backend: Clone {
    fn agent_id(&self) -> &str;
    /// Distinguishes several streams of the same agent ID.
    fn stream_id(&self) -> u64;
    fn is_draining(&self) -> bool;
}

/// One index: key → the streams that advertised it, in arrival order. Each stream is indexed
/// under its own identifiers (as upstream), so a later stream of an agent ID never inherits
/// the keys of an earlier one.
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
}

impl<B: Backend> Registry<B> {
    pub(crate) fn new(strategies: &[Strategy]) -> Self {
        Self {
            indexes: strategies
                .iter()
                .map(|&strategy| Index {
                    strategy,
                    keys: HashMap::new(),
                })
                .collect(),
            agents: HashMap::new(),
        }
    }

    /// Adds a stream under its own identifiers. A second stream of a known agent ID queues
    /// behind the first under the keys they share.
    pub(crate) fn add(&mut self, backend: B, identifiers: &Identifiers) {
        let id = backend.agent_id().to_owned();
        for index in &mut self.indexes {
            for key in keys_for(index.strategy, &id, identifiers) {
                index.keys.entry(key).or_default().push(backend.clone());
            }
        }
        self.agents.entry(id).or_default().push(backend);
    }

    /// Removes one stream (matched by agent and stream ID) from every key it was indexed under.
    pub(crate) fn remove(&mut self, agent_id: &str, stream_id: u64) {
        let Some(streams) = self.agents.get_mut(agent_id) else {
            return;
        };
        streams.retain(|b| b.stream_id() != stream_id);
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
    pub(crate) fn select(&self, request: &RequestContext) -> Option<B> {
        let host = host_of(&request.address);
        self.indexes.iter().find_map(|index| {
            let candidates: Vec<&B> = match index.strategy {
                // Streams that advertised the host, oldest first.
                Strategy::DestHost => index.keys.get(host)?.iter().collect(),
                Strategy::Default | Strategy::DefaultRoute => {
                    // One candidate per agent ID (its oldest stream), from a random start,
                    // as upstream: spreads load without bookkeeping.
                    let mut keys: Vec<&String> = index.keys.keys().collect();
                    if keys.is_empty() {
                        return None;
                    }
                    keys.sort_unstable();
                    let start = random_below(keys.len());
                    keys.rotate_left(start);
                    keys.iter()
                        .filter_map(|k| index.keys.get(*k).and_then(|s| s.first()))
                        .collect()
                }
            };
            first_preferring_active(candidates)
        })
    }

    /// Readiness, as upstream: the first strategy's index has an agent.
    pub(crate) fn is_ready(&self) -> bool {
        self.indexes.first().is_some_and(|i| !i.keys.is_empty())
    }

    /// Keys per strategy, for `ready_backends{proxy_strategy}`.
    pub(crate) fn key_counts(&self) -> impl Iterator<Item = (Strategy, usize)> + '_ {
        self.indexes.iter().map(|i| (i.strategy, i.keys.len()))
    }

    /// Whether any stream of `agent_id` is connected.
    pub(crate) fn contains(&self, agent_id: &str) -> bool {
        self.agents.contains_key(agent_id)
    }

    /// Distinct connected agent IDs.
    pub(crate) fn agent_count(&self) -> usize {
        self.agents.len()
    }

    /// Every connected stream, for introspection.
    pub(crate) fn streams(&self) -> impl Iterator<Item = &B> + '_ {
        self.agents.values().flatten()
    }
}

fn first_preferring_active<'a, B: Backend + 'a>(
    candidates: impl IntoIterator<Item = &'a B>,
) -> Option<B> {
    let mut fallback = None;
    for candidate in candidates {
        if !candidate.is_draining() {
            return Some(candidate.clone());
        }
        fallback.get_or_insert_with(|| candidate.clone());
    }
    fallback
}

fn keys_for(strategy: Strategy, agent_id: &str, ids: &Identifiers) -> Vec<String> {
    match strategy {
        Strategy::Default => vec![agent_id.to_owned()],
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

    use super::*;

    #[derive(Clone, Debug)]
    struct Fake {
        id: &'static str,
        stream: u64,
        draining: Rc<Cell<bool>>,
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
    }

    fn fake(id: &'static str, stream: u64) -> Fake {
        Fake {
            id,
            stream,
            draining: Rc::default(),
        }
    }

    fn ids(query: &str) -> Identifiers {
        Identifiers::parse(query).unwrap()
    }

    #[test]
    fn default_prefers_non_draining_and_falls_back_to_draining() {
        let mut r = Registry::new(&[Strategy::Default]);
        let a = fake("a", 1);
        let b = fake("b", 2);
        r.add(a.clone(), &ids(""));
        r.add(b.clone(), &ids(""));
        a.draining.set(true);
        for _ in 0..50 {
            assert_eq!(
                r.select(&RequestContext::to("10.0.0.1:80")).unwrap().id,
                "b"
            );
        }
        b.draining.set(true);
        assert!(
            r.select(&RequestContext::to("10.0.0.1:80")).is_some(),
            "all draining: still served"
        );
        r.remove("a", 1);
        r.remove("b", 2);
        assert!(r.select(&RequestContext::to("10.0.0.1:80")).is_none());
        assert!(!r.is_ready());
    }

    #[test]
    fn dest_host_matches_exactly_then_falls_through_in_order() {
        let mut r = Registry::new(&[
            Strategy::DestHost,
            Strategy::DefaultRoute,
            Strategy::Default,
        ]);
        r.add(fake("node1", 1), &ids("host=node1&ipv4=10.0.0.1"));
        r.add(fake("gw", 2), &ids("default-route=true"));
        r.add(fake("plain", 3), &ids(""));
        assert_eq!(
            r.select(&RequestContext::to("10.0.0.1:10250")).unwrap().id,
            "node1"
        );
        assert_eq!(
            r.select(&RequestContext::to("node1:10250")).unwrap().id,
            "node1"
        );
        for _ in 0..20 {
            assert_eq!(
                r.select(&RequestContext::to("10.9.9.9:80")).unwrap().id,
                "gw",
                "defaultRoute before default"
            );
        }
        r.remove("gw", 2);
        let picked = r.select(&RequestContext::to("10.9.9.9:80")).unwrap().id;
        assert!(picked == "plain" || picked == "node1");
        assert!(r.is_ready(), "destHost index has node1");
    }

    #[test]
    fn readiness_follows_the_first_strategy() {
        let mut r = Registry::new(&[Strategy::DestHost, Strategy::Default]);
        r.add(fake("plain", 1), &ids(""));
        assert!(!r.is_ready(), "no agent advertises a host");
        assert!(r.select(&RequestContext::to("x:1")).is_some());
    }

    #[test]
    fn second_stream_of_an_agent_waits_behind_the_first() {
        let mut r = Registry::new(&[Strategy::Default]);
        r.add(fake("a", 1), &ids(""));
        r.add(fake("a", 2), &ids(""));
        assert_eq!(r.select(&RequestContext::to("x:1")).unwrap().stream, 1);
        r.remove("a", 1);
        assert_eq!(r.select(&RequestContext::to("x:1")).unwrap().stream, 2);
        assert_eq!(r.agent_count(), 1);
    }

    #[test]
    fn each_stream_is_indexed_under_its_own_identifiers() {
        let mut r = Registry::new(&[Strategy::DestHost]);
        r.add(fake("a", 1), &ids("host=old-name"));
        r.add(fake("a", 2), &ids("host=new-name"));
        // Before per-stream indexing the second stream inherited old-name and had no new-name.
        assert_eq!(
            r.select(&RequestContext::to("new-name:1")).unwrap().stream,
            2
        );
        assert_eq!(
            r.select(&RequestContext::to("old-name:1")).unwrap().stream,
            1
        );
        r.remove("a", 1);
        assert!(
            r.select(&RequestContext::to("old-name:1")).is_none(),
            "old-name left with its stream"
        );
        assert_eq!(
            r.select(&RequestContext::to("new-name:1")).unwrap().stream,
            2
        );
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
