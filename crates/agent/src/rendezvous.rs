//! Which of the servers an agent holds streams to when it holds only some of them
//! (`--agent-server-connections=K`, for fleets whose servers peer): rendezvous hashing of
//! the agent's ID with each server's address. Every agent ranks the servers its own way, so
//! the fleet's agents spread evenly over them; a server that joins or leaves moves only the
//! agents that rank it among their first K.
//!
//! Pure: the connection set asks it, and does the connecting.

use std::collections::BTreeSet;
use std::net::SocketAddr;

/// The `k` addresses of `servers` this agent should hold: the best-ranked ones that are
/// not `passed_over` (they failed their last attempt), then, if too few are left, the
/// best-ranked of those.
pub(crate) fn wanted(
    agent_id: &str,
    servers: &BTreeSet<SocketAddr>,
    k: usize,
    passed_over: impl Fn(&SocketAddr) -> bool,
) -> BTreeSet<SocketAddr> {
    let ranked = ranked(agent_id, servers);
    let (usable, failing): (Vec<SocketAddr>, Vec<SocketAddr>) =
        ranked.into_iter().partition(|server| !passed_over(server));
    usable.into_iter().chain(failing).take(k).collect()
}

/// `servers`, best-ranked first for `agent_id`.
fn ranked(agent_id: &str, servers: &BTreeSet<SocketAddr>) -> Vec<SocketAddr> {
    let mut ranked: Vec<(u64, SocketAddr)> = servers
        .iter()
        .map(|server| (weight(agent_id, server), *server))
        .collect();
    ranked.sort_unstable_by(|a, b| b.cmp(a));
    ranked.into_iter().map(|(_, server)| server).collect()
}

/// The agent's weight for a server: FNV-1a over both names, finished with splitmix64's
/// mix. Fixed here, not the standard library's hasher, so that agents of every release
/// rank alike.
fn weight(agent_id: &str, server: &SocketAddr) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let server = server.to_string();
    for byte in agent_id.bytes().chain([0]).chain(server.bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash = (hash ^ (hash >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    hash = (hash ^ (hash >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    hash ^ (hash >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn servers(n: u8) -> BTreeSet<SocketAddr> {
        (1..=n)
            .map(|i| SocketAddr::from(([198, 18, 0, i], 8091)))
            .collect()
    }

    #[test]
    fn agents_spread_evenly_over_the_servers() {
        let fleet = servers(3);
        let mut held: HashMap<SocketAddr, usize> = HashMap::new();
        for agent in 0..3000 {
            for server in wanted(&format!("node-{agent}"), &fleet, 1, |_| false) {
                *held.entry(server).or_default() += 1;
            }
        }
        // 1,000 each expected; the bounds are over six standard deviations wide.
        for server in &fleet {
            let n = held.get(server).copied().unwrap_or(0);
            assert!(
                (850..=1150).contains(&n),
                "{server}: {n} of 3,000: {held:?}"
            );
        }
    }

    #[test]
    fn a_server_joining_moves_only_the_agents_that_rank_it_first() {
        let (before, after) = (servers(3), servers(4));
        let mut moved = 0;
        for agent in 0..2000 {
            let id = format!("node-{agent}");
            let was = wanted(&id, &before, 1, |_| false);
            let now = wanted(&id, &after, 1, |_| false);
            if was != now {
                moved += 1;
                assert_eq!(
                    now.into_iter().next(),
                    after.difference(&before).next().copied(),
                    "an agent moved, but not to the new server"
                );
            }
        }
        // A quarter expected.
        assert!((350..=650).contains(&moved), "{moved} of 2,000 moved");
    }

    #[test]
    fn a_failing_server_is_passed_over_while_others_are_left() {
        let fleet = servers(3);
        let first = wanted("node-1", &fleet, 1, |_| false);
        let down = *first.iter().next().unwrap();
        let instead = wanted("node-1", &fleet, 1, |s| *s == down);
        assert_eq!(instead.len(), 1);
        assert!(!instead.contains(&down));
        // All failing: the best-ranked are still wanted (they are retried).
        assert_eq!(wanted("node-1", &fleet, 1, |_| true), first);
        // K above the fleet's size: every server.
        assert_eq!(wanted("node-1", &fleet, 5, |_| false), fleet);
        assert_eq!(wanted("node-1", &fleet, 2, |_| false).len(), 2);
    }
}
