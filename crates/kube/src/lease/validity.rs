//! When a Lease stops counting, by upstream's rule (`pkg/util/leases.go`): it is valid while
//! its renew time (or, without one, its acquire time) plus its duration is after now. Both
//! servers' garbage collectors and agents' counters use this, so they agree on the instant.

use std::time::{Duration, SystemTime};

use k8s_openapi::api::coordination::v1::Lease;

/// The instant the Lease expires, or `None` if it cannot be valid at all (no renew or
/// acquire time, or no duration: upstream treats the first as expired).
pub fn expiry(lease: &Lease) -> Option<SystemTime> {
    let spec = lease.spec.as_ref()?;
    let last = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?;
    let seconds = u64::try_from(spec.lease_duration_seconds?).unwrap_or(0);
    SystemTime::from(last.0).checked_add(Duration::from_secs(seconds))
}

/// Whether the Lease counts at `now`.
pub fn is_valid(lease: &Lease, now: SystemTime) -> bool {
    expiry(lease).is_some_and(|at| at > now)
}

#[cfg(test)]
pub(crate) mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    pub(crate) fn at(seconds: i64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds as u64)
    }

    /// A Lease held by `holder`, renewed at `renewed` (Unix seconds) for `duration` seconds.
    pub(crate) fn lease(holder: &str, renewed: Option<i64>, duration: Option<i32>) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(crate::lease::lease_name(holder)),
                resource_version: Some("7".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                renew_time: renewed.map(|s| MicroTime(Timestamp::from_second(s).unwrap())),
                lease_duration_seconds: duration,
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn valid_until_renew_time_plus_duration() {
        let l = lease("a", Some(1000), Some(30));
        assert!(is_valid(&l, at(1000)));
        assert!(is_valid(&l, at(1029)));
        // Upstream: renewTime + duration must be *after* now.
        assert!(!is_valid(&l, at(1030)));
        assert!(!is_valid(&l, at(5000)));
    }

    #[test]
    fn acquire_time_stands_in_for_a_missing_renew_time() {
        let mut l = lease("a", None, Some(30));
        assert!(!is_valid(&l, at(1000)), "no time at all is expired");
        l.spec.as_mut().unwrap().acquire_time =
            Some(MicroTime(Timestamp::from_second(1000).unwrap()));
        assert!(is_valid(&l, at(1010)));
        assert!(!is_valid(&l, at(1031)));
    }

    #[test]
    fn leases_without_spec_or_duration_never_count() {
        assert!(!is_valid(&lease("a", Some(1000), None), at(1000)));
        assert!(!is_valid(&lease("a", Some(1000), Some(-5)), at(1000)));
        let mut l = lease("a", Some(1000), Some(30));
        l.spec = None;
        assert!(!is_valid(&l, at(1000)));
    }
}
