//! The Lease a server writes: what upstream's component-helpers controller puts in it, so
//! that upstream agents and garbage collectors read tether's Leases exactly as their own.
//! Only name, namespace, labels, `holderIdentity`, `leaseDurationSeconds` and `renewTime`
//! are set (no acquire time, no owner references), and the labels are re-applied on every
//! write. tether adds annotations when asked, the server's agent address
//! ([`AGENT_ADDRESS_ANNOTATION`]) and its peer address ([`PEER_ADDRESS_ANNOTATION`]),
//! which upstream's agents ignore.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;

use super::labels::LeaseLabels;

/// Where agents reach the Lease holder's agent port, for agents that discover servers by
/// Lease (`--server-discovery=leases`).
pub const AGENT_ADDRESS_ANNOTATION: &str = "tether.dev/agent-address";

/// Where the fleet's other servers reach the Lease holder's peer port (server peering).
pub const PEER_ADDRESS_ANNOTATION: &str = "tether.dev/peer-address";

/// Whose Lease this is, and how it is written.
#[derive(Clone, Debug)]
pub struct LeaseIdentity {
    /// `konnectivity-proxy-server-<serverID>`.
    pub name: String,
    pub namespace: String,
    /// The server ID: agents match it to the `serverid` their streams announce.
    pub holder: String,
    pub duration: Duration,
    pub labels: LeaseLabels,
    /// `--lease-agent-address`: written as [`AGENT_ADDRESS_ANNOTATION`] on every write.
    pub agent_address: Option<String>,
    /// `--lease-peer-address`: written as [`PEER_ADDRESS_ANNOTATION`] on every write.
    pub peer_address: Option<String>,
}

impl LeaseIdentity {
    /// The Lease to create when none exists.
    pub fn fresh(&self, now: SystemTime) -> Lease {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                namespace: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.holder.clone()),
                ..LeaseSpec::default()
            }),
        };
        self.renewed(&lease, now)
    }

    /// `base` renewed at `now`: its resourceVersion is kept, so the update fails with a
    /// conflict if someone else changed it meanwhile.
    pub fn renewed(&self, base: &Lease, now: SystemTime) -> Lease {
        let mut lease = base.clone();
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        spec.lease_duration_seconds =
            Some(i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX));
        spec.renew_time = Some(MicroTime(
            Timestamp::try_from(now).unwrap_or(Timestamp::UNIX_EPOCH),
        ));
        lease.metadata.labels = Some(self.labels.map().clone());
        for (annotation, address) in [
            (AGENT_ADDRESS_ANNOTATION, &self.agent_address),
            (PEER_ADDRESS_ANNOTATION, &self.peer_address),
        ] {
            if let Some(address) = address {
                lease
                    .metadata
                    .annotations
                    .get_or_insert_with(Default::default)
                    .insert(annotation.to_owned(), address.clone());
            }
        }
        lease
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::validity::tests::at;
    use crate::lease::validity::{expiry, is_valid};

    fn identity() -> LeaseIdentity {
        LeaseIdentity {
            name: crate::lease::lease_name("srv-1"),
            namespace: "kube-system".into(),
            holder: "srv-1".into(),
            duration: Duration::from_secs(30),
            labels: "k8s-app=konnectivity-server".parse().unwrap(),
            agent_address: None,
            peer_address: None,
        }
    }

    #[test]
    fn a_fresh_lease_has_upstreams_fields_only() {
        let lease = identity().fresh(at(1000));
        let json = serde_json::to_value(&lease).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {
                    "name": "konnectivity-proxy-server-srv-1",
                    "namespace": "kube-system",
                    "labels": {"k8s-app": "konnectivity-server"},
                },
                "spec": {
                    "holderIdentity": "srv-1",
                    "leaseDurationSeconds": 30,
                    "renewTime": "1970-01-01T00:16:40.000000Z",
                },
            })
        );
        assert_eq!(expiry(&lease), Some(at(1030)));
    }

    #[test]
    fn the_agent_address_is_an_annotation_written_on_every_renewal() {
        let identity = LeaseIdentity {
            agent_address: Some("10.0.0.7:8091".into()),
            peer_address: Some("10.0.0.7:8093".into()),
            ..identity()
        };
        let address = |lease: &Lease| {
            lease
                .metadata
                .annotations
                .as_ref()?
                .get(AGENT_ADDRESS_ANNOTATION)
                .cloned()
        };
        let fresh = identity.fresh(at(1000));
        assert_eq!(address(&fresh).as_deref(), Some("10.0.0.7:8091"));
        assert_eq!(
            fresh.metadata.annotations.as_ref().unwrap()[PEER_ADDRESS_ANNOTATION],
            "10.0.0.7:8093"
        );
        let mut changed = fresh.clone();
        changed.metadata.annotations =
            Some([(AGENT_ADDRESS_ANNOTATION.to_owned(), "x".to_owned())].into());
        assert_eq!(
            address(&identity.renewed(&changed, at(1015))).as_deref(),
            Some("10.0.0.7:8091")
        );
    }

    #[test]
    fn renewing_keeps_version_and_holder_and_reapplies_labels() {
        let mut base = identity().fresh(at(1000));
        base.metadata.resource_version = Some("42".into());
        base.metadata.labels = Some([("other".to_owned(), "x".to_owned())].into());
        base.spec.as_mut().unwrap().holder_identity = Some("previous".into());
        let renewed = identity().renewed(&base, at(1015));
        assert_eq!(renewed.metadata.resource_version.as_deref(), Some("42"));
        assert_eq!(
            renewed.spec.as_ref().unwrap().holder_identity.as_deref(),
            Some("previous")
        );
        assert_eq!(
            renewed.metadata.labels.as_ref(),
            Some(identity().labels.map())
        );
        assert!(is_valid(&renewed, at(1044)));
        assert!(!is_valid(&renewed, at(1045)));
    }
}
