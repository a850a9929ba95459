use std::collections::HashMap;

use super::*;

fn cidrs(list: &[&str]) -> Vec<Cidr> {
    list.iter().map(|c| Cidr::parse(c).unwrap()).collect()
}

fn agent<'a>(id: &'a str, zone: &'a str, region: &'a str, cidrs: &'a [Cidr]) -> Candidate<'a> {
    Candidate {
        agent_id: id,
        zone: Some(zone),
        region: Some(region),
        cidrs,
        load: 0,
        last_picked: 0,
        ejected: false,
        draining: false,
    }
}

fn request<'a>(host: &'a str, rules: &'a [ZoneRule]) -> Request<'a> {
    Request {
        host,
        affinity_key: None,
        zone_rules: rules,
    }
}

fn rule(cidr: &str, zone: &str, region: &str) -> ZoneRule {
    ZoneRule {
        cidr: Cidr::parse(cidr).unwrap(),
        zone: zone.into(),
        region: Some(region.into()),
    }
}

/// A deterministic dice for tests: a small xorshift.
fn dice(seed: u64) -> impl FnMut(usize) -> usize {
    let mut x = seed | 1;
    move |n| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    }
}

#[test]
fn topology_uses_the_longest_rule_then_the_region_then_passes() {
    let none: Vec<Cidr> = vec![];
    let rules = [
        rule("10.0.0.0/8", "a", "r1"),
        rule("10.2.0.0/16", "b", "r1"),
        rule("10.3.0.0/16", "c", "r2"),
    ];
    let mut fleet = vec![
        agent("a1", "a", "r1", &none),
        agent("b1", "b", "r1", &none),
        agent("b2", "b", "r1", &none),
    ];
    let set = |fleet: &[Candidate<'_>], host| {
        candidate_set(Strategy::Topology, fleet, &request(host, &rules))
    };
    assert_eq!(
        set(&fleet, "10.2.3.4"),
        Some(vec![1, 2]),
        "longest prefix: zone b"
    );
    assert_eq!(set(&fleet, "10.9.0.1"), Some(vec![0]));
    // Zone b's agents are all ejected: the region r1 is the fallback.
    fleet[1].ejected = true;
    fleet[2].draining = true;
    assert_eq!(set(&fleet, "10.2.3.4"), Some(vec![0, 1, 2]));
    // Zone c (region r2) has no agent at all, names have no zone: pass on.
    assert_eq!(set(&fleet, "10.3.0.1"), None);
    assert_eq!(set(&fleet, "node-1"), None);
    assert_eq!(set(&fleet, "192.168.0.1"), None);
}

#[test]
fn topology_without_rules_takes_the_zone_of_the_covering_agent() {
    let a = cidrs(&["10.1.0.0/16"]);
    let b = cidrs(&["10.1.2.0/24"]);
    let none: Vec<Cidr> = vec![];
    let fleet = [
        agent("a1", "a", "r", &a),
        agent("b1", "b", "r", &b),
        agent("b2", "b", "r", &none),
    ];
    assert_eq!(
        candidate_set(Strategy::Topology, &fleet, &request("10.1.2.9", &[])),
        Some(vec![1, 2]),
        "b1's /24 is more specific, so zone b, and every agent in it"
    );
    assert_eq!(
        candidate_set(Strategy::Topology, &fleet, &request("10.1.9.9", &[])),
        Some(vec![0])
    );
}

#[test]
fn dest_cidr_is_longest_prefix_and_handles_ipv6_forms() {
    let wide = cidrs(&["10.0.0.0/8", "fd00::/16"]);
    let narrow = cidrs(&["10.1.0.0/16", "fd00:1::/32"]);
    let single = cidrs(&["::1"]);
    let fleet = [
        agent("w", "a", "r", &wide),
        agent("n", "b", "r", &narrow),
        agent("s", "c", "r", &single),
    ];
    let set = |host| candidate_set(Strategy::DestCidr, &fleet, &request(host, &[]));
    assert_eq!(set("10.1.2.3"), Some(vec![1]));
    assert_eq!(set("10.9.2.3"), Some(vec![0]));
    assert_eq!(set("fd00:1::5"), Some(vec![1]));
    assert_eq!(set("fd00:2::5"), Some(vec![0]));
    assert_eq!(set("0:0::0:1"), Some(vec![2]), "any spelling of ::1");
    assert_eq!(set("::ffff:10.1.0.1"), Some(vec![1]), "IPv4-mapped");
    assert_eq!(set("11.0.0.1"), None);
    assert_eq!(set("localhost"), None);
}

#[test]
fn pick_prefers_usable_then_ejected_then_draining() {
    let none: Vec<Cidr> = vec![];
    let mut fleet = vec![
        agent("x", "a", "r", &none),
        agent("y", "a", "r", &none),
        agent("z", "a", "r", &none),
    ];
    fleet[0].draining = true;
    fleet[1].ejected = true;
    let mut d = dice(7);
    for _ in 0..50 {
        assert_eq!(pick(&fleet, &[0, 1, 2], None, &mut d), Some(2));
    }
    fleet[2].draining = true;
    for _ in 0..50 {
        assert_eq!(
            pick(&fleet, &[0, 1, 2], None, &mut d),
            Some(1),
            "ejected before draining"
        );
    }
    fleet[1].draining = true;
    assert!(
        pick(&fleet, &[0, 1, 2], None, &mut d).is_some(),
        "all draining: still served"
    );
    assert_eq!(pick(&fleet, &[], None, &mut d), None);
}

#[test]
fn two_choices_avoid_the_loaded_and_break_ties_by_recency() {
    let none: Vec<Cidr> = vec![];
    let mut fleet: Vec<Candidate<'_>> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| agent(id, "z", "r", &none))
        .collect();
    fleet[0].load = 100;
    let mut d = dice(3);
    let set: Vec<usize> = (0..4).collect();
    for _ in 0..200 {
        assert_ne!(
            pick(&fleet, &set, None, &mut d),
            Some(0),
            "the loaded one never wins a pair"
        );
    }
    // Equal loads: simulate dials that finish at once; the tie-break spreads them evenly.
    fleet[0].load = 0;
    let mut counts = [0u32; 4];
    for seq in 1..=1000 {
        let i = pick(&fleet, &set, None, &mut d).unwrap();
        counts[i] += 1;
        fleet[i].last_picked = seq;
    }
    for c in counts {
        assert!((225..=275).contains(&c), "{counts:?}");
    }
}

#[test]
fn affinity_is_stable_and_moves_only_the_clients_of_a_departed_agent() {
    let none: Vec<Cidr> = vec![];
    let ids = ["a", "b", "c", "d", "e"];
    let fleet: Vec<Candidate<'_>> = ids.iter().map(|id| agent(id, "z", "r", &none)).collect();
    let all: Vec<usize> = (0..fleet.len()).collect();
    let mut d = dice(1);
    let clients: Vec<String> = (0..200).map(|n| format!("client-{n}")).collect();
    let before: HashMap<&str, usize> = clients
        .iter()
        .map(|c| (c.as_str(), pick(&fleet, &all, Some(c), &mut d).unwrap()))
        .collect();
    for c in &clients {
        assert_eq!(
            pick(&fleet, &all, Some(c), &mut d),
            Some(before[c.as_str()])
        );
    }
    let used: std::collections::HashSet<usize> = before.values().copied().collect();
    assert_eq!(used.len(), 5, "200 clients use every agent");
    // Agent 2 leaves (index 2 is no longer in the set): only its clients move.
    let without: Vec<usize> = all.iter().copied().filter(|&i| i != 2).collect();
    for c in &clients {
        let now = pick(&fleet, &without, Some(c), &mut d).unwrap();
        if before[c.as_str()] != 2 {
            assert_eq!(
                now,
                before[c.as_str()],
                "{c} moved although its agent stayed"
            );
        }
    }
}
