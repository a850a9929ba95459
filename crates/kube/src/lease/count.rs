//! How many servers an agent should hold streams to, counted from a list of Leases.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::SystemTime;

use k8s_openapi::api::coordination::v1::Lease;

use super::record::{AGENT_ADDRESS_ANNOTATION, PEER_ADDRESS_ANNOTATION};
use super::validity::is_valid;

/// The valid Leases of one list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseCount {
    /// Valid Leases, at least 1 (upstream's floor: no valid Lease still means one server).
    pub count: usize,
    /// Their holder identities: the server IDs that count. An agent keeps streams to these
    /// and lets go of others once it has more streams than the count.
    pub holders: BTreeSet<String>,
    /// The agent addresses the valid Leases' holders published, by holder.
    pub addresses: BTreeMap<String, SocketAddr>,
    /// Holders of valid Leases without a readable agent address (upstream servers, or
    /// tether servers without `--lease-agent-address`), with what the annotation held.
    pub without_address: BTreeMap<String, Option<String>>,
    /// The peer addresses the valid Leases' holders published (server peering), by holder.
    pub peer_addresses: BTreeMap<String, SocketAddr>,
}

/// Counts the valid Leases among `leases` (already filtered by the label selector).
pub fn count_valid(leases: &[Lease], now: SystemTime) -> LeaseCount {
    let valid: Vec<&Lease> = leases.iter().filter(|l| is_valid(l, now)).collect();
    let mut count = LeaseCount {
        count: valid.len().max(1),
        ..LeaseCount::default()
    };
    for lease in valid {
        let Some(holder) = lease.spec.as_ref().and_then(|s| s.holder_identity.clone()) else {
            continue;
        };
        let annotation = |key: &str| lease.metadata.annotations.as_ref()?.get(key);
        if let Some(peer) = annotation(PEER_ADDRESS_ANNOTATION).and_then(|a| a.parse().ok()) {
            count.peer_addresses.insert(holder.clone(), peer);
        }
        let published = annotation(AGENT_ADDRESS_ANNOTATION);
        match published.and_then(|a| a.parse::<SocketAddr>().ok()) {
            Some(address) => {
                count.addresses.insert(holder.clone(), address);
            }
            None => {
                count
                    .without_address
                    .insert(holder.clone(), published.cloned());
            }
        }
        count.holders.insert(holder);
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::validity::tests::{at, lease};

    #[test]
    fn counts_valid_leases_with_a_floor_of_one() {
        let leases = [
            lease("a", Some(1000), Some(30)),
            lease("b", Some(990), Some(30)),
            lease("c", Some(900), Some(30)),
            lease("d", None, Some(30)),
        ];
        let c = count_valid(&leases, at(1010));
        assert_eq!(c.count, 2);
        assert_eq!(c.holders, ["a".to_owned(), "b".to_owned()].into());
        assert_eq!(count_valid(&leases, at(1025)).count, 1);
        let none = count_valid(&leases, at(2000));
        assert_eq!((none.count, none.holders.len()), (1, 0));
        assert_eq!(count_valid(&[], at(0)).count, 1);
    }

    #[test]
    fn published_agent_addresses_are_read_from_valid_leases_only() {
        let with = |name, at_secs, address: &str| {
            let mut l = lease(name, Some(at_secs), Some(30));
            l.metadata.annotations =
                Some([(AGENT_ADDRESS_ANNOTATION.to_owned(), address.to_owned())].into());
            l
        };
        let leases = [
            with("a", 1000, "10.0.0.1:8091"),
            with("b", 1000, "[fd00::2]:8091"),
            with("c", 1000, "konnectivity:8091"),
            lease("d", Some(1000), Some(30)),
            with("e", 900, "10.0.0.5:8091"),
        ];
        let c = count_valid(&leases, at(1010));
        assert_eq!(c.count, 4);
        let want: BTreeMap<String, SocketAddr> = [
            ("a".to_owned(), "10.0.0.1:8091".parse().unwrap()),
            ("b".to_owned(), "[fd00::2]:8091".parse().unwrap()),
        ]
        .into();
        assert_eq!(c.addresses, want);
        let unreadable: BTreeMap<String, Option<String>> = [
            ("c".to_owned(), Some("konnectivity:8091".to_owned())),
            ("d".to_owned(), None),
        ]
        .into();
        assert_eq!(c.without_address, unreadable);
    }

    #[test]
    fn published_peer_addresses_are_read_from_valid_leases_only() {
        let with = |name, at_secs, peer: &str| {
            let mut l = lease(name, Some(at_secs), Some(30));
            l.metadata.annotations =
                Some([(PEER_ADDRESS_ANNOTATION.to_owned(), peer.to_owned())].into());
            l
        };
        let leases = [
            with("a", 1000, "10.0.0.1:8093"),
            with("b", 1000, "peers:8093"),
            with("c", 900, "10.0.0.3:8093"),
        ];
        let c = count_valid(&leases, at(1010));
        let want: BTreeMap<String, SocketAddr> =
            [("a".to_owned(), "10.0.0.1:8093".parse().unwrap())].into();
        assert_eq!(c.peer_addresses, want);
        // A peer address is not an agent address.
        assert!(c.addresses.is_empty());
    }

    #[test]
    fn a_valid_lease_without_holder_still_counts() {
        let mut l = lease("a", Some(1000), Some(30));
        l.spec.as_mut().unwrap().holder_identity = None;
        let c = count_valid(&[l, lease("b", Some(1000), Some(30))], at(1001));
        assert_eq!(c.count, 2);
        assert_eq!(c.holders, ["b".to_owned()].into());
    }
}
