//! What a server tells its peers about its own agents: a full list when a link opens, then
//! only what changed, in PEER_AGENTS packets of at most [`MAX_PEER_AGENTS`] names each.

use std::collections::BTreeMap;

use tether_proto::{MAX_PEER_AGENTS, PeerAgents, pb};

use crate::backend::registry::Backend;
use crate::backend::route::Route;
use crate::running::Running;

/// This server's own agents as a peer sees them, by agent ID: the stream that takes new
/// dials (its first), under the tenant that admitted it. An ID held in two tenants is
/// announced once, from the first tenant in the table's order.
pub(crate) type Announced = BTreeMap<String, pb::PeerAgent>;

/// Every agent this server holds now.
pub(crate) fn local_agents(running: &Running) -> Announced {
    let mut agents = Announced::new();
    for tenant in running.tenants.all() {
        let registry = tenant.registry();
        for session in registry.streams().filter_map(Route::local) {
            if agents.contains_key(&session.agent_id) {
                continue;
            }
            let Some(first) = registry
                .first_local(&session.agent_id)
                .and_then(Route::local)
            else {
                continue;
            };
            let ids = &first.identifiers;
            let labels = &first.labels;
            agents.insert(
                first.agent_id.clone(),
                pb::PeerAgent {
                    agent_id: first.agent_id.clone(),
                    tenant: tenant.name.to_string(),
                    hosts: ids.hosts.clone(),
                    ipv4: ids.ipv4.clone(),
                    ipv6: ids.ipv6.clone(),
                    cidrs: ids.cidrs.clone(),
                    default_route: ids.default_route,
                    zone: labels.zone.clone().unwrap_or_default(),
                    region: labels.region.clone().unwrap_or_default(),
                    draining: Backend::is_draining(first),
                    version: first.version.clone().unwrap_or_default(),
                },
            );
        }
    }
    agents
}

/// What a peer that knows `before` must hear to know `now`.
pub(crate) fn changes(before: &Announced, now: &Announced) -> Vec<PeerAgents> {
    let up = now
        .iter()
        .filter(|(id, agent)| before.get(*id) != Some(agent))
        .map(|(_, agent)| agent.clone());
    let down = before.keys().filter(|id| !now.contains_key(*id)).cloned();
    let mut packets = Vec::new();
    let mut packet = PeerAgents::default();
    let mut push = |packet: &mut PeerAgents| {
        if packet.up.len() + packet.down.len() == MAX_PEER_AGENTS {
            packets.push(std::mem::take(packet));
        }
    };
    for agent in up {
        packet.up.push(agent);
        push(&mut packet);
    }
    for id in down {
        packet.down.push(id);
        push(&mut packet);
    }
    if packet.up.len() + packet.down.len() > 0 {
        packets.push(packet);
    }
    packets
}

#[cfg(test)]
mod tests {
    use super::*;

    fn agent(id: &str, draining: bool) -> pb::PeerAgent {
        pb::PeerAgent {
            agent_id: id.into(),
            draining,
            ..Default::default()
        }
    }

    fn set(agents: &[pb::PeerAgent]) -> Announced {
        agents
            .iter()
            .map(|a| (a.agent_id.clone(), a.clone()))
            .collect()
    }

    #[test]
    fn only_what_changed_is_sent() {
        let before = set(&[agent("a", false), agent("b", false), agent("c", false)]);
        let now = set(&[agent("a", false), agent("b", true), agent("d", false)]);
        let sent = changes(&before, &now);
        assert_eq!(sent.len(), 1);
        let ids = |agents: &[pb::PeerAgent]| -> Vec<String> {
            agents.iter().map(|a| a.agent_id.clone()).collect()
        };
        assert_eq!(ids(&sent[0].up), ["b", "d"]);
        assert_eq!(sent[0].down, ["c"]);
        assert!(changes(&now, &now).is_empty());
    }

    #[test]
    fn a_large_fleet_goes_in_packets_of_bounded_size() {
        let many: Vec<pb::PeerAgent> = (0..2500).map(|i| agent(&format!("n{i}"), false)).collect();
        let sent = changes(&Announced::new(), &set(&many));
        assert_eq!(
            sent.iter().map(|p| p.up.len()).collect::<Vec<_>>(),
            [MAX_PEER_AGENTS, MAX_PEER_AGENTS, 2500 - 2 * MAX_PEER_AGENTS]
        );
        let gone = changes(&set(&many), &Announced::new());
        assert_eq!(gone.iter().map(|p| p.down.len()).sum::<usize>(), 2500);
        assert!(gone.iter().all(|p| p.down.len() <= MAX_PEER_AGENTS));
    }
}
