//! How many servers an agent should hold streams to, counted from a list of Leases.

use std::collections::BTreeSet;
use std::time::SystemTime;

use k8s_openapi::api::coordination::v1::Lease;

use super::validity::is_valid;

/// The valid Leases of one list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseCount {
    /// Valid Leases, at least 1 (upstream's floor: no valid Lease still means one server).
    pub count: usize,
    /// Their holder identities: the server IDs that count. An agent keeps streams to these
    /// and lets go of others once it has more streams than the count.
    pub holders: BTreeSet<String>,
}

/// Counts the valid Leases among `leases` (already filtered by the label selector).
pub fn count_valid(leases: &[Lease], now: SystemTime) -> LeaseCount {
    let valid: Vec<&Lease> = leases.iter().filter(|l| is_valid(l, now)).collect();
    LeaseCount {
        count: valid.len().max(1),
        holders: valid
            .iter()
            .filter_map(|l| l.spec.as_ref()?.holder_identity.clone())
            .collect(),
    }
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
    fn a_valid_lease_without_holder_still_counts() {
        let mut l = lease("a", Some(1000), Some(30));
        l.spec.as_mut().unwrap().holder_identity = None;
        let c = count_valid(&[l, lease("b", Some(1000), Some(30))], at(1001));
        assert_eq!(c.count, 2);
        assert_eq!(c.holders, ["b".to_owned()].into());
    }
}
