//! The proxy strategies and tether's agent selection, as a pure function of a snapshot of
//! the candidates and the request: no clock, no locks, no randomness of its own (the caller
//! passes the dice). The registry, which holds the agents, asks it; this module knows
//! nothing of agent streams or the routing file, so both can build on it.
//!
//! Every tether strategy narrows the candidates to a set (the destination's zone, the agents
//! whose CIDRs cover the address, or everyone) and then picks one in that set:
//! - healthy, non-draining agents first; ejected ones only when nothing else is left, and
//!   draining ones after those (upstream's rule for draining);
//! - with client affinity, the highest rendezvous hash of (client, agent), so a client keeps
//!   its agent while that agent stays, and only its clients move when it leaves;
//! - otherwise the power of two choices on the load figure: two agents at random, the less
//!   loaded wins, and on a tie the one picked longer ago (which keeps idle fleets balanced).

use std::net::IpAddr;
use std::str::FromStr;

use tether_policy::Cidr;

/// A `--proxy-strategies` entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// Any agent, chosen at random.
    Default,
    /// The agent whose `host`, `ipv4` or `ipv6` identifier equals the destination host.
    DestHost,
    /// Any agent that advertised `default-route=true`, chosen at random.
    DefaultRoute,
    /// tether: an agent in the destination's zone (from the routing file's CIDR rules, or
    /// the zone of the agents whose CIDRs cover it), else in its region; least loaded.
    Topology,
    /// tether: the agents whose `cidr`/`ipv4`/`ipv6` identifiers cover the destination
    /// address with the longest prefix; least loaded among them.
    DestCidr,
    /// tether: any agent, by the power of two choices on its load.
    LeastLoaded,
}

impl Strategy {
    /// Upstream's spelling, also the `proxy_strategy` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::DestHost => "destHost",
            Self::DefaultRoute => "defaultRoute",
            Self::Topology => "topology",
            Self::DestCidr => "destCIDR",
            Self::LeastLoaded => "leastLoaded",
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
            "topology" => Ok(Self::Topology),
            "destCIDR" => Ok(Self::DestCidr),
            "leastLoaded" => Ok(Self::LeastLoaded),
            other => Err(format!(
                "unknown proxy strategy {other:?} (expected default, destHost, defaultRoute, \
                 or tether's topology, destCIDR, leastLoaded)"
            )),
        }
    }
}

/// The routing file's settings for tether's strategies, shared by every tenant's registry.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct SelectionConfig {
    /// CIDR → zone rules; the longest matching prefix wins.
    pub(crate) zone_rules: Vec<ZoneRule>,
    /// Keep each client (by its proven identity) on one agent while that agent stays.
    pub(crate) client_affinity: bool,
}

/// What selection knows about one agent stream at the moment of a dial.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Candidate<'a> {
    pub(crate) agent_id: &'a str,
    pub(crate) zone: Option<&'a str>,
    pub(crate) region: Option<&'a str>,
    /// The agent's `cidr` identifiers plus its `ipv4`/`ipv6` ones as single-address blocks.
    pub(crate) cidrs: &'a [Cidr],
    /// Pending dials + open connections + queued bytes in 64 KiB units.
    pub(crate) load: u64,
    /// Sequence number of the last dial this stream was given (0: never).
    pub(crate) last_picked: u64,
    pub(crate) ejected: bool,
    pub(crate) draining: bool,
}

/// A destination block's place in the topology (server configuration).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ZoneRule {
    pub cidr: Cidr,
    pub zone: String,
    pub region: Option<String>,
}

/// Where a destination is: the longest matching server rule, else the zone of the agents
/// whose CIDRs cover it most specifically.
fn destination_zone<'a>(
    ip: IpAddr,
    rules: &'a [ZoneRule],
    candidates: &[Candidate<'a>],
) -> Option<(&'a str, Option<&'a str>)> {
    if let Some(rule) = rules
        .iter()
        .filter(|r| r.cidr.contains(ip))
        .max_by_key(|r| r.cidr.prefix_len())
    {
        return Some((rule.zone.as_str(), rule.region.as_deref()));
    }
    let covering = most_specific(ip, candidates);
    covering
        .iter()
        .find_map(|&i| candidates[i].zone.map(|z| (z, candidates[i].region)))
}

/// Indexes of the candidates whose CIDRs contain `ip` with the longest prefix.
fn most_specific(ip: IpAddr, candidates: &[Candidate<'_>]) -> Vec<usize> {
    let best = |c: &Candidate<'_>| {
        c.cidrs
            .iter()
            .filter(|cidr| cidr.contains(ip))
            .map(Cidr::prefix_len)
            .max()
    };
    let Some(longest) = candidates.iter().filter_map(best).max() else {
        return Vec::new();
    };
    (0..candidates.len())
        .filter(|&i| best(&candidates[i]) == Some(longest))
        .collect()
}

/// The inputs of one selection besides the candidates.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    /// The destination's host, as dialled.
    pub(crate) host: &'a str,
    /// The client's stable identity, when affinity is on.
    pub(crate) affinity_key: Option<&'a str>,
    pub(crate) zone_rules: &'a [ZoneRule],
}

/// The set a tether strategy considers for `request`, or `None` to pass the dial on.
pub(crate) fn candidate_set(
    strategy: Strategy,
    candidates: &[Candidate<'_>],
    request: &Request<'_>,
) -> Option<Vec<usize>> {
    let ip = || parse_ip(request.host);
    let set: Vec<usize> = match strategy {
        Strategy::LeastLoaded => (0..candidates.len()).collect(),
        Strategy::DestCidr => most_specific(ip()?, candidates),
        Strategy::Topology => {
            let (zone, region) = destination_zone(ip()?, request.zone_rules, candidates)?;
            let in_zone: Vec<usize> = (0..candidates.len())
                .filter(|&i| candidates[i].zone == Some(zone))
                .collect();
            // The zone has no usable agent: the same region is the next best thing.
            if in_zone.iter().any(|&i| usable(&candidates[i])) {
                in_zone
            } else {
                let region = region?;
                (0..candidates.len())
                    .filter(|&i| candidates[i].region == Some(region))
                    .collect()
            }
        }
        Strategy::Default | Strategy::DestHost | Strategy::DefaultRoute => return None,
    };
    (!set.is_empty()).then_some(set)
}

/// Neither ejected nor draining.
fn usable(c: &Candidate<'_>) -> bool {
    !c.ejected && !c.draining
}

/// Picks one of `set` (indexes into `candidates`, not empty). `dice(n)` returns a uniform
/// number below `n`.
pub(crate) fn pick(
    candidates: &[Candidate<'_>],
    set: &[usize],
    affinity_key: Option<&str>,
    dice: &mut impl FnMut(usize) -> usize,
) -> Option<usize> {
    // Best tier first: usable, then ejected but not draining, then draining.
    let tier = |c: &Candidate<'_>| match (c.draining, c.ejected) {
        (false, false) => 0,
        (false, true) => 1,
        (true, _) => 2,
    };
    let best_tier = set.iter().map(|&i| tier(&candidates[i])).min()?;
    let tier_set: Vec<usize> = set
        .iter()
        .copied()
        .filter(|&i| tier(&candidates[i]) == best_tier)
        .collect();
    if let Some(key) = affinity_key {
        return tier_set
            .iter()
            .copied()
            .max_by_key(|&i| rendezvous(key, candidates[i].agent_id));
    }
    let n = tier_set.len();
    let a = dice(n);
    if n == 1 {
        return Some(tier_set[a]);
    }
    // A second, distinct position: one of the other n - 1.
    let mut b = dice(n - 1);
    if b >= a {
        b += 1;
    }
    let (first, second) = (tier_set[a], tier_set[b]);
    let rank = |i: usize| (candidates[i].load, candidates[i].last_picked);
    Some(if rank(second) < rank(first) {
        second
    } else {
        first
    })
}

/// Highest-random-weight hashing: a fixed, well-mixed 64-bit hash of (client, agent).
fn rendezvous(client: &str, agent: &str) -> u64 {
    // FNV-1a over both strings with a separator, then a splitmix64 finaliser; stable across
    // processes and restarts (std's hasher is randomly keyed), which affinity needs.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in client.bytes().chain([0xff]).chain(agent.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// An IP literal host (`10.0.0.1`, `fd00::1`); names have no place in the topology.
fn parse_ip(host: &str) -> Option<IpAddr> {
    host.parse().ok()
}

#[cfg(test)]
mod tests;
